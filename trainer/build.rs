//! With the `torch` feature, keeps `libtorch.so` (and through it `libtorch_cuda.so`) in this
//! package's binaries and tests: the linker's `--as-needed` drops it otherwise, since no symbol
//! is used from it directly, and CUDA is then silently unavailable (tch-rs #980). Link
//! arguments do not reach other packages' binaries; those get CUDA from
//! `act::cuda_is_available`, which loads `libtorch_cuda.so` at run time.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    if std::env::var_os("CARGO_FEATURE_TORCH").is_some() && std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        println!("cargo:rustc-link-arg=-Wl,--no-as-needed");
        println!("cargo:rustc-link-arg=-ltorch");
    }
}
