//! What this machine's GPU side can do, and checks of the colour and resize kernels on a real
//! device against their CPU twins (`lake gpu` prints them).

use std::time::Instant;

use cudarc::driver::DevicePtr as _;
use lake_codec::YuvToRgb;

use crate::colour::{Geometry, Layout, Matrix, Target, YuvToRgb10, convert_on_cpu};
use crate::resize::{Resize, resize_on_cpu};
use crate::{Gpu, Result};

/// The libraries and devices found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probe {
    /// Number of CUDA devices, or why there are none (no driver library, the driver refused).
    pub devices: std::result::Result<usize, String>,
    /// NVRTC's version, when its library loads.
    pub nvrtc: Option<(i32, i32)>,
    /// NCCL's version code (e.g. 22809 for 2.28.9), or why it does not load.
    pub nccl: std::result::Result<i32, String>,
    /// Whether NVDEC's library (`libnvcuvid.so.1`, which the driver installs) loads.
    pub nvdec: bool,
}

/// Looks for the driver, NVRTC, NCCL and NVDEC without touching a device beyond counting them.
pub fn probe() -> Probe {
    // SAFETY: each probe only tries to load a library; the calls after it use it.
    let devices = if unsafe { cudarc::driver::sys::is_culib_present() } {
        cudarc::driver::CudaContext::device_count()
            .map(|n| usize::try_from(n).unwrap_or(0))
            .map_err(|e| format!("the CUDA driver refused: {e}"))
    } else {
        Err("no CUDA driver library (libcuda.so)".to_owned())
    };
    let nccl = crate::nccl::library().map(crate::nccl::Nccl::version);
    // SAFETY: loading a library runs its initialisers; the driver's NVDEC library has no others.
    let nvdec = unsafe { libloading::Library::new("libnvcuvid.so.1") }.is_ok();
    Probe { devices, nvrtc: crate::nvrtc_version(), nccl, nvdec }
}

/// The colour kernel on a device against its twin, and its speed.
#[derive(Debug, Clone, PartialEq)]
pub struct ColourCheck {
    /// Frames a batch.
    pub frames: usize,
    /// Their size.
    pub width: u32,
    /// Their size.
    pub height: u32,
    /// Whether the device's RGB24 equals the twin's, byte for byte.
    pub rgb24_equal: bool,
    /// Whether the device's normalised float32 equals the twin's, bit for bit.
    pub float32_equal: bool,
    /// Whether the device's normalised bfloat16 equals the twin's, bit for bit.
    pub bf16_equal: bool,
    /// Whether the device's RGB24 of P010 surfaces (BT.709, limited range) equals the twin's.
    pub p010_equal: bool,
    /// Milliseconds a batch takes on the device (RGB24, the mean of the timed launches).
    pub ms_per_batch: f64,
}

/// Converts a batch of `frames` frames of `width` × `height` (fixed noise, every frame its own)
/// on `gpu` and with the twin, compares them, and times `repeats` launches of the RGB24 batch:
/// 8-bit planes with `matrix` as RGB24, ImageNet-normalised float32 and bfloat16, and the same
/// noise as P010 surfaces (a pitch wider than the row) with BT.709 limited range as RGB24.
///
/// # Errors
/// [`crate::Error::Driver`] when the device fails, [`crate::Error::Layout`] for a size without
/// pixels.
pub fn colour_check(gpu: &Gpu, frames: usize, width: u32, height: u32, matrix: &YuvToRgb, repeats: u32) -> Result<ColourCheck> {
    let planes = Geometry { width, height, layout: Layout::Yuv420p };
    let pitch = 4 * width.div_ceil(2) + 64;
    let uv_offset = u64::from(pitch) * u64::from(height);
    let p010 = Geometry { layout: Layout::P010 { pitch, uv_offset }, ..planes };
    let (mean, std) = ([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]);
    let runs: [(Geometry, Matrix, Target); 4] = [
        (planes, (*matrix).into(), Target::Rgb24),
        (planes, (*matrix).into(), Target::Float32Chw { mean, std }),
        (planes, (*matrix).into(), Target::Bf16Chw { mean, std }),
        (p010, YuvToRgb10::for_colorspace(1, false).into(), Target::Rgb24),
    ];
    let stream = gpu.stream();
    let mut equal = [false; 4];
    let mut ms_per_batch = 0.0;
    for (k, (geometry, matrix, target)) in runs.into_iter().enumerate() {
        let frame_bytes = geometry.frame_bytes();
        let host: Vec<u8> = (0..(frame_bytes * frames) as u64).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        let refs: Vec<&[u8]> = host.chunks_exact(frame_bytes).collect();
        let on_device = stream.clone_htod(&host)?;
        let (base, _read) = on_device.device_ptr(stream);
        let addresses: Vec<u64> = (0..frames).map(|f| base + (f * frame_bytes) as u64).collect();
        let bytes = target.bytes(frames, width, height);
        let out = stream.alloc_zeros::<u8>(bytes)?;
        let (out_ptr, _write) = out.device_ptr(stream);
        // SAFETY: the frames and the output are allocations of this GPU of the sizes the
        // geometry and target need, alive until after the synchronisation below.
        unsafe { gpu.convert(&addresses, geometry, &matrix, target, out_ptr) }?;
        gpu.synchronize()?;
        let device = stream.clone_dtoh(&out)?;
        let mut twin = vec![0_u8; bytes];
        convert_on_cpu(&refs, geometry, &matrix, target, &mut twin)?;
        equal[k] = device == twin;
        if k == 0 {
            let began = Instant::now();
            for _ in 0..repeats {
                // SAFETY: as above.
                unsafe { gpu.convert(&addresses, geometry, &matrix, target, out_ptr) }?;
            }
            gpu.synchronize()?;
            ms_per_batch = began.elapsed().as_secs_f64() * 1e3 / f64::from(repeats.max(1));
        }
    }
    let [rgb24_equal, float32_equal, bf16_equal, p010_equal] = equal;
    Ok(ColourCheck { frames, width, height, rgb24_equal, float32_equal, bf16_equal, p010_equal, ms_per_batch })
}

/// The resize kernels on a device against their twin, and their speed.
#[derive(Debug, Clone, PartialEq)]
pub struct ResizeCheck {
    /// Frames a batch.
    pub frames: usize,
    /// Their size before.
    pub from: (u32, u32),
    /// Their size after.
    pub to: (u32, u32),
    /// Whether the device's RGB24 equals the twin's, byte for byte.
    pub rgb24_equal: bool,
    /// Whether the device's normalised float32 equals the twin's, bit for bit.
    pub float32_equal: bool,
    /// Milliseconds a batch takes on the device (RGB24, the mean of the timed launches).
    pub ms_per_batch: f64,
}

/// Resizes a batch of `frames` RGB24 frames (fixed noise, every frame its own) from `from` to
/// `to` on `gpu` and with the twin, as RGB24 and as ImageNet-normalised float32, compares them,
/// and times `repeats` batches of RGB24.
///
/// # Errors
/// [`crate::Error::Layout`] for sizes the kernels do not resize, [`crate::Error::Driver`] when
/// the device fails.
pub fn resize_check(gpu: &Gpu, frames: usize, from: (u32, u32), to: (u32, u32), repeats: u32) -> Result<ResizeCheck> {
    let resize = Resize::new(from, to)?;
    let frame_bytes = Target::Rgb24.bytes(1, from.0, from.1);
    let host: Vec<u8> = (0..(frame_bytes * frames) as u64).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    let refs: Vec<&[u8]> = host.chunks_exact(frame_bytes).collect();
    let stream = gpu.stream();
    let on_device = stream.clone_htod(&host)?;
    let (base, _read) = on_device.device_ptr(stream);
    let addresses: Vec<u64> = (0..frames).map(|f| base + (f * frame_bytes) as u64).collect();
    let (mean, std) = ([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]);
    let mut equal = [false; 2];
    let mut ms_per_batch = 0.0;
    for (k, target) in [Target::Rgb24, Target::Float32Chw { mean, std }].into_iter().enumerate() {
        let bytes = target.bytes(frames, to.0, to.1);
        let out = stream.alloc_zeros::<u8>(bytes)?;
        let (out_ptr, _write) = out.device_ptr(stream);
        // SAFETY: the frames and the output are allocations of this GPU of the sizes the resize
        // and target need, alive until after the synchronisation below.
        unsafe { gpu.resize(&addresses, &resize, target, out_ptr) }?;
        gpu.synchronize()?;
        let device = stream.clone_dtoh(&out)?;
        let mut twin = vec![0_u8; bytes];
        resize_on_cpu(&refs, &resize, target, &mut twin)?;
        equal[k] = device == twin;
        if k == 0 {
            let began = Instant::now();
            for _ in 0..repeats {
                // SAFETY: as above.
                unsafe { gpu.resize(&addresses, &resize, target, out_ptr) }?;
            }
            gpu.synchronize()?;
            ms_per_batch = began.elapsed().as_secs_f64() * 1e3 / f64::from(repeats.max(1));
        }
    }
    let [rgb24_equal, float32_equal] = equal;
    Ok(ResizeCheck { frames, from, to, rgb24_equal, float32_equal, ms_per_batch })
}

/// The RGB24 frames of NV12 `surfaces` (NVDEC's, in this GPU's memory) as lake's kernel makes
/// them, copied to the host: one launch per surface layout, in the order given.
///
/// # Errors
/// [`crate::Error::Driver`] when the device fails.
pub fn surfaces_to_rgb(gpu: &Gpu, surfaces: &[lake_codec::nvdec::DeviceFrame], matrix: &YuvToRgb) -> Result<Vec<Vec<u8>>> {
    let mut out: Vec<Vec<u8>> = vec![Vec::new(); surfaces.len()];
    let mut layouts: Vec<(u32, u32, u32, u64)> = surfaces.iter().map(|s| (s.width, s.height, s.pitch, s.chroma_offset)).collect();
    layouts.sort_unstable();
    layouts.dedup();
    let stream = gpu.stream();
    for (width, height, pitch, uv_offset) in layouts {
        let members: Vec<usize> = (0..surfaces.len())
            .filter(|&i| {
                (surfaces[i].width, surfaces[i].height, surfaces[i].pitch, surfaces[i].chroma_offset) == (width, height, pitch, uv_offset)
            })
            .collect();
        let geometry = Geometry { width, height, layout: Layout::Nv12 { pitch, uv_offset } };
        let addresses: Vec<u64> = members.iter().map(|&i| surfaces[i].luma).collect();
        let frame_bytes = Target::Rgb24.bytes(1, width, height);
        let rgb = stream.alloc_zeros::<u8>(frame_bytes * members.len())?;
        let (rgb_ptr, _write) = rgb.device_ptr(stream);
        // SAFETY: the surfaces are NV12 frames of this geometry in this GPU's memory, held by
        // `surfaces` until after the synchronisation; the output holds every frame's RGB.
        unsafe { gpu.convert(&addresses, geometry, matrix, Target::Rgb24, rgb_ptr) }?;
        gpu.synchronize()?;
        let host = stream.clone_dtoh(&rgb)?;
        for (frame, &i) in host.chunks_exact(frame_bytes).zip(&members) {
            out[i] = frame.to_vec();
        }
    }
    Ok(out)
}
