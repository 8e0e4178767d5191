//! With the `torch` feature:
//! - compiles `csrc/autocast.cpp` against the libtorch that tch links (torch-sys tells where it
//!   is), for bfloat16 mixed precision on the CPU and on CUDA;
//! - compiles `csrc/random.cpp` against the same libtorch, for normal values from a generator of
//!   their own (LeRobot's `GaussianNoise`);
//! - compiles `csrc/c10d.cpp` against the same libtorch, for ranks started by torchrun: its
//!   Gloo part (cfg `lake_gloo`) where Gloo's headers are found, in `GLOO_INCLUDE_DIR` or
//!   `/usr/include` (Debian's libgloo-dev; libtorch holds Gloo itself, compiled);
//! - keeps `libtorch.so` (and through it `libtorch_cuda.so`) in this package's binaries and
//!   tests: the linker's `--as-needed` drops it otherwise, since no symbol is used from it
//!   directly, and CUDA is then silently unavailable (tch-rs #980). Link arguments do not reach
//!   other packages' binaries; those get CUDA from `act::cuda_is_available`, which loads
//!   `libtorch_cuda.so` at run time.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo::rustc-check-cfg=cfg(lake_gloo)");
    if std::env::var_os("CARGO_FEATURE_TORCH").is_none() {
        return;
    }
    #[cfg(feature = "torch")]
    shims();
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        println!("cargo:rustc-link-arg=-Wl,--no-as-needed");
        println!("cargo:rustc-link-arg=-ltorch");
    }
}

/// The C++ shims, built as torch-sys builds tch's own C++ (C++17, the libtorch's C++ ABI).
#[cfg(feature = "torch")]
fn shims() {
    println!("cargo:rerun-if-changed=csrc/autocast.cpp");
    println!("cargo:rerun-if-changed=csrc/c10d.cpp");
    println!("cargo:rerun-if-changed=csrc/random.cpp");
    println!("cargo:rerun-if-env-changed=GLOO_INCLUDE_DIR");
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
    let mut build = cc::Build::new();
    build
        .cpp(true)
        .pic(true)
        .warnings(false)
        .include(&include)
        // torch/types.h, which the c10d headers reach through the distributed autograd ones.
        .include(include.join("torch/csrc/api/include"))
        .flag("-std=c++17")
        .flag(format!("-D_GLIBCXX_USE_CXX11_ABI={abi}"))
        .flag("-DGLOG_USE_GLOG_EXPORT")
        .file("csrc/autocast.cpp")
        .file("csrc/c10d.cpp")
        .file("csrc/random.cpp");
    let gloo = std::env::var_os("GLOO_INCLUDE_DIR").map_or_else(|| std::path::PathBuf::from("/usr/include"), std::path::PathBuf::from);
    if gloo.join("gloo/config.h").is_file() {
        // The compiler searches /usr/include already; naming it again breaks libstdc++'s
        // `#include_next`.
        if gloo != std::path::Path::new("/usr/include") {
            build.include(&gloo);
        }
        build.define("USE_C10D_GLOO", None);
        println!("cargo:rustc-cfg=lake_gloo");
    } else {
        println!(
            "cargo:warning=no Gloo headers at {}: ranks started by torchrun cannot meet on the CPU in this build (install libgloo-dev)",
            gloo.display()
        );
    }
    build.compile("lake_torch_shims");
}
