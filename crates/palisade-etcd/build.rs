//! Compiles the etcd API subset with protox (pure Rust): the build needs no
//! system `protoc`, unlike the `etcd-client` crate's.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/etcd_v3_subset.proto";
    println!("cargo:rerun-if-changed={proto}");
    let fds = protox::compile([proto], ["proto"])?;
    tonic_prost_build::configure()
        .build_server(false)
        .compile_fds(fds)?;
    Ok(())
}
