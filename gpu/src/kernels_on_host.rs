//! The CUDA kernels' own source, compiled for this CPU and run thread by thread against their
//! CPU twins: a machine without a GPU still runs the code the GPU would run.
//!
//! The source is what NVRTC compiles, after a prelude that defines CUDA's few built-ins it uses
//! as plain C++ (`blockIdx`, `blockDim` and `threadIdx` as thread-local globals the runner sets
//! before each thread, the qualifiers as nothing, `__float_as_uint` as a bit copy, `min` as `std::min`). The
//! C++ compiler (`$CXX`, else `c++`) builds it with `-ffp-contract=off`, so that, as with
//! `--fmad=false` on the GPU, no multiply and add are fused. What this does not check is the
//! device itself: its memory, its launches, and NVRTC's code generation.

use std::ffi::c_void;
use std::process::Command;
use std::sync::OnceLock;

use libloading::Library;

use crate::colour::{Geometry, Layout, Matrix, Target, YuvToRgb10, convert_on_cpu};
use crate::resize::{Resize, resize_on_cpu};

const PRELUDE: &str = r#"
#include <algorithm>
#include <cstring>
struct lake_dim3 { unsigned int x, y, z; };
static thread_local lake_dim3 blockIdx, blockDim, threadIdx;
#define __device__
#define __global__
#define __forceinline__ inline
static inline unsigned int __float_as_uint(float f) { unsigned int u; std::memcpy(&u, &f, sizeof u); return u; }
using std::min;
"#;

const RUNNER: &str = r#"
extern "C" void lake_host_thread(unsigned int block, unsigned int thread, unsigned int size) {
    blockIdx.x = block;
    threadIdx.x = thread;
    blockDim.x = size;
}
"#;

/// Threads a block, as the launches have.
const BLOCK: u64 = 256;

/// The kernels built for this CPU, once per test process.
fn kernels() -> &'static Library {
    static LIBRARY: OnceLock<Library> = OnceLock::new();
    LIBRARY.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("lake-kernels-on-host-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a temporary directory");
        let source = dir.join("kernels.cpp");
        std::fs::write(&source, [PRELUDE, crate::colour::KERNELS, crate::resize::KERNELS, RUNNER].concat()).expect("write");
        let library = dir.join("libkernels.so");
        let compiler = std::env::var("CXX").unwrap_or_else(|_| "c++".to_owned());
        let built = Command::new(&compiler)
            .args(["-std=c++17", "-O1", "-ffp-contract=off", "-fPIC", "-shared", "-Wall", "-Werror", "-o"])
            .arg(&library)
            .arg(&source)
            .output()
            .unwrap_or_else(|e| panic!("the kernels are built for this CPU with a C++ compiler ({compiler}; set CXX): {e}"));
        assert!(built.status.success(), "{compiler} refused the kernels:\n{}", String::from_utf8_lossy(&built.stderr));
        // SAFETY: the library was just built from the kernels' source and the prelude; loading
        // it runs no initialisers of its own.
        let loaded = unsafe { Library::new(&library) }.expect("load the kernels");
        let _ = std::fs::remove_dir_all(&dir);
        loaded
    })
}

/// Runs `threads` threads (whole blocks, as a launch does) of the kernel `call` calls.
fn launch(threads: u64, mut call: impl FnMut()) {
    // SAFETY: the runner's symbol, with the signature its source declares.
    let set = unsafe { kernels().get::<unsafe extern "C" fn(u32, u32, u32)>(b"lake_host_thread") }.expect("runner");
    for i in 0..threads.div_ceil(BLOCK) * BLOCK {
        // SAFETY: sets three globals of the library.
        unsafe { set((i / BLOCK) as u32, (i % BLOCK) as u32, BLOCK as u32) };
        call();
    }
}

type ColourKernel = unsafe extern "C" fn(
    *const u64,
    i32,
    i32,
    i32,
    i32,
    i32,
    u64,
    i32,
    i32,
    i32,
    i32,
    i32,
    i32,
    i32,
    *mut c_void,
    f32,
    f32,
    f32,
    f32,
    f32,
    f32,
);

type RowsKernel = unsafe extern "C" fn(
    *const u64,
    i32,
    i32,
    i32,
    i32,
    i32,
    *const i32,
    *const i32,
    *const i16,
    i32,
    *const i32,
    *const i16,
    i32,
    *mut i16,
);

type ColumnsKernel = unsafe extern "C" fn(
    *const i16,
    i32,
    i32,
    i32,
    i32,
    *const i32,
    *const i32,
    *const i16,
    i32,
    i32,
    *mut c_void,
    f32,
    f32,
    f32,
    f32,
    f32,
    f32,
);

/// The colour kernel run on this CPU, with the arguments `Gpu::convert` gives it.
fn convert_on_host(frames: &[&[u8]], geometry: Geometry, matrix: Matrix, target: Target) -> Vec<u8> {
    let Geometry { width, height, layout } = geometry;
    let [y_term, y_gain, v_to_r, u_to_g, v_to_g, u_to_b] = matrix.for_layout(layout).expect("matrix");
    let table: Vec<u64> = frames.iter().map(|f| f.as_ptr() as u64).collect();
    let mut out = vec![0_u8; target.bytes(frames.len(), width, height)];
    let (code, pitch, uv_offset) = layout.code(width);
    let (kind, mean, std) = target.code();
    // SAFETY: the kernel's symbol, with the signature of its source.
    let kernel = unsafe { kernels().get::<ColourKernel>(b"lake_yuv_to_rgb") }.expect("colour kernel");
    let out_ptr = out.as_mut_ptr().cast::<c_void>();
    launch(u64::from(width) * u64::from(height) * frames.len() as u64, || {
        // SAFETY: the frames hold their layout's bytes and `out` the target's; the kernel reads
        // and writes only those.
        unsafe {
            kernel(
                table.as_ptr(),
                frames.len() as i32,
                width as i32,
                height as i32,
                code,
                pitch as i32,
                uv_offset,
                y_term,
                y_gain,
                v_to_r,
                u_to_g,
                v_to_g,
                u_to_b,
                kind,
                out_ptr,
                mean[0],
                mean[1],
                mean[2],
                std[0],
                std[1],
                std[2],
            )
        }
    });
    out
}

/// The resize kernels run on this CPU, with the arguments `Gpu::resize` gives them.
fn resize_on_host(frames: &[&[u8]], resize: &Resize, target: Target) -> Vec<u8> {
    let ((src_w, src_h), (dst_w, dst_h)) = (resize.from(), resize.to());
    let table: Vec<u64> = frames.iter().map(|f| f.as_ptr() as u64).collect();
    let [luma, chroma, columns] = resize.filters();
    let params = resize.params();
    let mut rows = vec![0_i16; resize.scratch_samples(frames.len())];
    let mut out = vec![0_u8; target.bytes(frames.len(), dst_w, dst_h)];
    let count = frames.len() as i32;
    // SAFETY: the kernels' symbols, with the signatures of their source.
    let (rows_kernel, columns_kernel) = unsafe {
        (
            kernels().get::<RowsKernel>(b"lake_area_rows").expect("rows"),
            kernels().get::<ColumnsKernel>(b"lake_area_columns").expect("columns"),
        )
    };
    let rows_ptr = rows.as_mut_ptr();
    launch(u64::from(src_h) * u64::from(dst_w) * frames.len() as u64, || {
        // SAFETY: whole RGB24 frames of the source size, the filters of the resize, and a
        // scratch buffer of its size; the kernel reads and writes only those.
        unsafe {
            rows_kernel(
                table.as_ptr(),
                count,
                src_w as i32,
                src_h as i32,
                dst_w as i32,
                i32::from(resize.pairs()),
                params.as_ptr(),
                luma.positions.as_ptr(),
                luma.coefficients.as_ptr(),
                luma.taps as i32,
                chroma.positions.as_ptr(),
                chroma.coefficients.as_ptr(),
                chroma.taps as i32,
                rows_ptr,
            )
        }
    });
    let (kind, mean, std) = target.code();
    let out_ptr = out.as_mut_ptr().cast::<c_void>();
    launch(u64::from(dst_h) * u64::from(dst_w) * frames.len() as u64, || {
        // SAFETY: the scratch the rows kernel filled, the column filter, and an output of the
        // target's size; the kernel reads and writes only those.
        unsafe {
            columns_kernel(
                rows.as_ptr(),
                count,
                src_h as i32,
                dst_w as i32,
                dst_h as i32,
                params.as_ptr(),
                columns.positions.as_ptr(),
                columns.coefficients.as_ptr(),
                columns.taps as i32,
                kind,
                out_ptr,
                mean[0],
                mean[1],
                mean[2],
                std[0],
                std[1],
                std[2],
            )
        }
    });
    out
}

/// Bytes that are a fixed hash of their position.
fn noise(len: usize, salt: u32) -> Vec<u8> {
    (0..len as u32).map(|i| (i.wrapping_add(salt).wrapping_mul(2_654_435_761) >> 13) as u8).collect()
}

/// RGB24, ImageNet-normalised float32, and bfloat16 with a zero std (NaN and infinities).
fn targets() -> [Target; 3] {
    let (mean, std) = ([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]);
    [Target::Rgb24, Target::Float32Chw { mean, std }, Target::Bf16Chw { mean: [0.0, 0.5, 1.0], std: [0.0, 1.0, 0.0] }]
}

#[test]
fn the_colour_kernel_run_on_this_cpu_converts_as_its_twin() {
    let bt601: Matrix = lake_codec::YuvToRgb::for_colorspace(5, false).into();
    let bt709_10: Matrix = YuvToRgb10::for_colorspace(1, false).into();
    for (w, h) in [(33_u32, 17_u32), (64, 48), (3, 2)] {
        let row = 2 * w.div_ceil(2);
        let layouts = [
            (Layout::Yuv420p, bt601),
            (Layout::Nv12 { pitch: row + 13, uv_offset: u64::from(row + 13) * u64::from(h + 3) }, bt601),
            (Layout::Yuv420p10, bt709_10),
            (Layout::P010 { pitch: 2 * row + 10, uv_offset: u64::from(2 * row + 10) * u64::from(h + 1) }, bt709_10),
        ];
        for (layout, matrix) in layouts {
            let geometry = Geometry { width: w, height: h, layout };
            let frames: Vec<Vec<u8>> = (0..2).map(|k| noise(geometry.frame_bytes(), k * 7 + w)).collect();
            let refs: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
            for target in targets() {
                let mut twin = vec![0_u8; target.bytes(2, w, h)];
                convert_on_cpu(&refs, geometry, &matrix, target, &mut twin).expect("twin");
                let kernel = convert_on_host(&refs, geometry, matrix, target);
                let first = kernel.iter().zip(&twin).position(|(a, b)| a != b);
                assert_eq!(first, None, "{w}x{h} {layout:?} {target:?}: first difference at byte {first:?}");
            }
        }
    }
}

#[test]
fn the_resize_kernels_run_on_this_cpu_resize_as_their_twin() {
    let sizes = [
        ((320, 240), (64, 48)),
        ((320, 240), (200, 150)),
        ((64, 48), (96, 72)),
        ((64, 48), (64, 24)),
        ((64, 48), (30, 48)),
        ((100, 75), (51, 37)),
        ((30, 17), (7, 5)),
        ((34, 20), (33, 41)),
    ];
    for (from, to) in sizes {
        let resize = Resize::new(from, to).expect("resize");
        let frames: Vec<Vec<u8>> = (0..2).map(|k| noise((from.0 * from.1 * 3) as usize, k + from.0)).collect();
        let refs: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
        for target in targets() {
            let mut twin = vec![0_u8; target.bytes(2, to.0, to.1)];
            resize_on_cpu(&refs, &resize, target, &mut twin).expect("twin");
            let kernel = resize_on_host(&refs, &resize, target);
            let first = kernel.iter().zip(&twin).position(|(a, b)| a != b);
            assert_eq!(first, None, "{from:?} -> {to:?} {target:?}: first difference at byte {first:?}");
        }
    }
}
