//! With the `torch` feature:
//! - compiles `csrc/autocast.cpp` against the libtorch that tch links (torch-sys tells where it
//!   is), for bfloat16 mixed precision on the CPU and on CUDA;
//! - keeps `libtorch.so` (and through it `libtorch_cuda.so`) in this package's binaries and
//!   tests: the linker's `--as-needed` drops it otherwise, since no symbol is used from it
//!   directly, and CUDA is then silently unavailable (tch-rs #980). Link arguments do not reach
//!   other packages' binaries; those get CUDA from `act::cuda_is_available`, which loads
//!   `libtorch_cuda.so` at run time.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    if std::env::var_os("CARGO_FEATURE_TORCH").is_none() {
        return;
    }
    #[cfg(feature = "torch")]
    autocast();
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        println!("cargo:rustc-link-arg=-Wl,--no-as-needed");
        println!("cargo:rustc-link-arg=-ltorch");
    }
}

/// The autocast shim, built as torch-sys builds tch's own C++ (C++17, the libtorch's C++ ABI).
#[cfg(feature = "torch")]
fn autocast() {
    println!("cargo:rerun-if-changed=csrc/autocast.cpp");
    println!("cargo:rerun-if-env-changed=DEP_TCH_LIBTORCH_LIB");
    let Some(lib) = std::env::var_os("DEP_TCH_LIBTORCH_LIB").map(std::path::PathBuf::from) else {
        panic!("torch-sys did not say where libtorch is (DEP_TCH_LIBTORCH_LIB); see lake-trainer's crate docs for the build environment");
    };
    let include = lib.parent().map(|p| p.join("include")).filter(|p| p.join("ATen").is_dir()).unwrap_or_else(|| {
        panic!("no libtorch headers next to {} (expected ../include/ATen)", lib.display());
    });
    // libtorch's C++ ABI: PyPI's torch 2.11.0 wheels use the C++11 one (tch's build asks the
    // wheel's python; LIBTORCH_CXX11_ABI overrides as it does there).
    let abi = std::env::var("LIBTORCH_CXX11_ABI").unwrap_or_else(|_| "1".to_owned());
    println!("cargo:rerun-if-env-changed=LIBTORCH_CXX11_ABI");
    cc::Build::new()
        .cpp(true)
        .pic(true)
        .warnings(false)
        .include(&include)
        .flag("-std=c++17")
        .flag(format!("-D_GLIBCXX_USE_CXX11_ABI={abi}"))
        .flag("-DGLOG_USE_GLOG_EXPORT")
        .file("csrc/autocast.cpp")
        .compile("lake_autocast");
}
