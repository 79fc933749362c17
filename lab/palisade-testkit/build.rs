//! Builds Palisade's clock-shift preload (`preload/clockshift.c`) into a shared
//! object and tells the crate where it is (`PALISADE_CLOCKSHIFT_SO`).

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let src = "preload/clockshift.c";
    println!("cargo:rerun-if-changed={src}");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"))
        .join("libpalisade_clockshift.so");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = Command::new(&cc)
        .args(["-shared", "-fPIC", "-O2", "-Wall", "-Werror", "-o"])
        .arg(&out)
        .arg(src)
        .status()
        .unwrap_or_else(|e| panic!("running {cc} to build {src}: {e} (install gcc)"));
    assert!(status.success(), "{cc} failed to build {src}");
    println!("cargo:rustc-env=PALISADE_CLOCKSHIFT_SO={}", out.display());
}
