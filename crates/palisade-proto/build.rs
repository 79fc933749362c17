//! Compiles the proto with protox (pure Rust), so no system `protoc` is needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/palisade/v1/palisade.proto";
    println!("cargo:rerun-if-changed={proto}");
    let fds = protox::compile([proto], ["proto"])?;
    tonic_prost_build::configure().compile_fds(fds)?;
    Ok(())
}
