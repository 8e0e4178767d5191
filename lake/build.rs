//! With the `torch` feature, gives the `lake` binary a run path to the libtorch it links (torch-sys
//! says where) and to the NVRTC, CUDA and NCCL libraries of the same torch wheel, when that is
//! where libtorch came from. The binary then runs on the machine that built it without
//! `LD_LIBRARY_PATH`; a binary carried elsewhere (a container, the GPU check's archive) finds the
//! libraries it brings through `LD_LIBRARY_PATH`, which the loader searches first
//! (docs/decisions/0030-run-path-to-libtorch.md).

use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=DEP_TCH_LIBTORCH_LIB");
    if std::env::var_os("CARGO_FEATURE_TORCH").is_none() || std::env::var("CARGO_CFG_TARGET_OS").as_deref() != Ok("linux") {
        return;
    }
    let Some(lib) = std::env::var_os("DEP_TCH_LIBTORCH_LIB").map(PathBuf::from) else {
        return;
    };
    let mut dirs = vec![lib.clone()];
    // PyPI's torch: site-packages/torch/lib, beside site-packages/nvidia/<cuda>/lib and
    // site-packages/nvidia/nccl/lib.
    for wheel in ["cu13", "nccl"] {
        let dir = lib.join("../../nvidia").join(wheel).join("lib");
        if dir.is_dir() {
            dirs.push(dir);
        }
    }
    for dir in dirs {
        let dir = dir.canonicalize().unwrap_or(dir);
        println!("cargo:rustc-link-arg-bins=-Wl,-rpath,{}", dir.display());
    }
}
