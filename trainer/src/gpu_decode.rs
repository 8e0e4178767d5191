//! Packet batches decoded on the trainer's GPU (`lake train --decode gpu`): each camera's GOPs
//! decode on NVDEC where the stream allows (FFmpeg's CUDA hwaccel, frames left in GPU memory as
//! NV12 surfaces), and on the CPU into YUV planes copied to the GPU where it does not (a codec
//! NVDEC lacks here, such as AV1 on Hopper, or a size out of its range: said once per stream).
//! The CPU's GOPs of a batch decode in parallel, one per core at a time, while the GPU converts.
//! lake-gpu's kernel turns both into RGB with libswscale's arithmetic, so the batch holds the
//! frames the loader would have sent, and the frames never travel as RGB. Frames a run wants at
//! another size are resized on the GPU too, to the bytes of a frame table of that size.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, OnceLock},
};

use arrow::array::RecordBatch;
use lake_codec::nvdec::{DeviceFrame, NvdecDecoder};
use lake_gpu::{
    Gpu,
    colour::{Geometry, Layout, Target},
    resize::Resize,
};
use lake_loader::{PacketBatchDecoder, PacketCamera, ShippedGop, YuvToRgb, yuv420p_bytes};
use tch::{Device, Kind, Tensor};

use crate::{Error, Result};

/// The decoders of one GPU, by stream: NVDEC's, or the reason NVDEC does not decode the stream
/// (its GOPs then decode on the CPU).
pub struct GpuDecoders {
    gpu: Arc<Gpu>,
    nvdec: Mutex<HashMap<String, std::result::Result<NvdecDecoder, String>>>,
    /// The CPU's decoders, by stream, and its threads (one per core).
    cpu: PacketBatchDecoder,
    /// Resizes by their sizes, `[from width, from height, to width, to height]`.
    resizes: Mutex<HashMap<[u32; 4], KernelResize>>,
}

/// A resize the kernels make, or why they cannot (the frames are then resized on the CPU).
type KernelResize = std::result::Result<Arc<Resize>, String>;

impl std::fmt::Debug for GpuDecoders {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuDecoders").field("gpu", &self.gpu.ordinal()).finish_non_exhaustive()
    }
}

impl GpuDecoders {
    /// The decoders of `gpu`, one set per device in a process.
    ///
    /// # Errors
    /// [`Error::Data`] when the CPU's decode threads cannot be started.
    pub fn of(gpu: &Arc<Gpu>) -> Result<Arc<GpuDecoders>> {
        static ALL: OnceLock<Mutex<HashMap<usize, Arc<GpuDecoders>>>> = OnceLock::new();
        let mut all = ALL.get_or_init(Mutex::default).lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(made) = all.get(&gpu.ordinal()) {
            return Ok(made.clone());
        }
        let cpu = PacketBatchDecoder::new(lake_loader::FrameFormat::Yuv420p, 0).map_err(|e| Error::Data(e.to_string()))?;
        let made = Arc::new(GpuDecoders { gpu: gpu.clone(), nvdec: Mutex::default(), cpu, resizes: Mutex::default() });
        all.insert(gpu.ordinal(), made.clone());
        Ok(made)
    }

    /// Packet camera `name` of `batch` (frames of `width` × `height`) as RGB24 frames
    /// `[slots, h, w, 3]` on this GPU, slot by slot (sample-major), converted with `matrix`, at
    /// `size` (`(w, h)`): the recorded size, or each decoded frame resized once ([`resize`](Self::resize)).
    ///
    /// # Errors
    /// [`Error::Batch`] for a malformed packet camera or frames of another size; the decoders'
    /// and the device's errors.
    pub fn camera(&self, batch: &RecordBatch, name: &str, width: u32, height: u32, matrix: &YuvToRgb, size: (u32, u32)) -> Result<Tensor> {
        let bad = |m: String| Error::Batch(format!("camera `{name}`: {m}"));
        let camera = PacketCamera::of(batch, name).map_err(|e| Error::Batch(e.to_string()))?;
        let gops = camera.gops().map_err(|e| Error::Batch(e.to_string()))?;
        let device = Device::Cuda(self.gpu.ordinal());
        let count: usize = gops.iter().map(|g| g.frames.len()).sum();
        let mut frames = Tensor::f_empty([count as i64, i64::from(height), i64::from(width), 3], (Kind::Uint8, device))?;
        // Frame numbers of the NVDEC surfaces and of the CPU's planes.
        let (mut surfaces, mut on_surfaces) = (Vec::<DeviceFrame>::new(), Vec::<i64>::new());
        // The GOPs NVDEC does not decode, with their frames' numbers.
        let (mut on_cpu, mut in_planes) = (Vec::<ShippedGop<'_>>::new(), Vec::<i64>::new());
        let mut next = 0_i64;
        for gop in &gops {
            let numbers = next..next + gop.frames.len() as i64;
            next = numbers.end;
            match self.on_nvdec(gop.stream, &gop.packets, &gop.wanted(), name)? {
                Some(decoded) => {
                    if let Some(f) = decoded.iter().find(|f| (f.width, f.height) != (width, height)) {
                        return Err(bad(format!("NVDEC gave a {}x{} frame; the camera's are {width}x{height}", f.width, f.height)));
                    }
                    surfaces.extend(decoded);
                    on_surfaces.extend(numbers);
                }
                None => {
                    on_cpu.push(gop.clone());
                    in_planes.extend(numbers);
                }
            }
        }
        let plane_bytes = yuv420p_bytes(width, height);
        let mut planes = Vec::<u8>::with_capacity(in_planes.len() * plane_bytes);
        for frame in self.cpu.decode_gops(&on_cpu, name, Some(*matrix)).map_err(|e| Error::Batch(e.to_string()))?.iter().flatten() {
            if frame.len() != plane_bytes {
                return Err(bad(format!(
                    "a frame of {} bytes of planes; the camera's {width}x{height} frames have {plane_bytes}",
                    frame.len()
                )));
            }
            planes.extend_from_slice(frame);
        }
        let converted = |e: lake_gpu::Error| bad(e.to_string());
        // The surfaces, a launch per layout, each into its frames' places.
        let mut layouts: Vec<(u32, u64)> = surfaces.iter().map(|s| (s.pitch, s.chroma_offset)).collect();
        layouts.sort_unstable();
        layouts.dedup();
        for (pitch, uv_offset) in layouts {
            let members: Vec<usize> =
                (0..surfaces.len()).filter(|&i| (surfaces[i].pitch, surfaces[i].chroma_offset) == (pitch, uv_offset)).collect();
            let addresses: Vec<u64> = members.iter().map(|&i| surfaces[i].luma).collect();
            let geometry = Geometry { width, height, layout: Layout::Nv12 { pitch, uv_offset } };
            let rgb = Tensor::f_empty([members.len() as i64, i64::from(height), i64::from(width), 3], (Kind::Uint8, device))?;
            // SAFETY: the surfaces are NV12 frames of this geometry on this GPU, held until the
            // synchronisation below; `rgb` holds their RGB24 frames.
            unsafe { self.gpu.convert(&addresses, geometry, matrix, Target::Rgb24, rgb.data_ptr() as u64) }.map_err(converted)?;
            let places = Tensor::from_slice(&members.iter().map(|&i| on_surfaces[i]).collect::<Vec<_>>()).to_device(device);
            drop(frames.f_index_copy_(0, &places, &rgb)?);
        }
        // The CPU's planes, copied over once and converted in one launch.
        if !in_planes.is_empty() {
            let on_device = Tensor::from_slice(&planes).f_to_device(device)?;
            let base = on_device.data_ptr() as u64;
            let addresses: Vec<u64> = (0..in_planes.len() as u64).map(|i| base + i * plane_bytes as u64).collect();
            let geometry = Geometry { width, height, layout: Layout::Yuv420p };
            let rgb = Tensor::f_empty([in_planes.len() as i64, i64::from(height), i64::from(width), 3], (Kind::Uint8, device))?;
            // SAFETY: `on_device` holds the planes of every frame, `rgb` their RGB24 frames; both
            // live until the kernel has run (libtorch's caching allocator reuses their memory
            // only for work queued after it on this stream).
            unsafe { self.gpu.convert(&addresses, geometry, matrix, Target::Rgb24, rgb.data_ptr() as u64) }.map_err(converted)?;
            drop(frames.f_index_copy_(0, &Tensor::from_slice(&in_planes).to_device(device), &rgb)?);
        }
        // The surfaces go back to FFmpeg's pool only once the kernel has read them.
        self.gpu.synchronize().map_err(converted)?;
        drop(surfaces);
        if size != (width, height) {
            frames = self.resize(&frames, size).map_err(|e| bad(e.to_string()))?;
        }
        let slots: Vec<i64> = camera.numbers().iter().map(|&n| i64::from(n)).collect();
        if let Some(past) = slots.iter().find(|&&n| n >= count as i64) {
            return Err(bad(format!("frame {past} of a batch whose GOPs give {count}")));
        }
        Ok(frames.f_index_select(0, &Tensor::from_slice(&slots).to_device(device))?)
    }

    /// RGB24 frames `[n, h, w, 3]` on this GPU resized to `(width, height)` as the frame tables
    /// resize them, as a new tensor `[n, height, width, 3]` on the GPU: by lake-gpu's kernels,
    /// or, for the sizes they cannot repeat (an odd width halved; said once per size), by
    /// libswscale on the CPU.
    ///
    /// # Errors
    /// [`Error::Batch`] for frames of another shape or sizes libswscale refuses; the device's
    /// errors.
    pub fn resize(&self, frames: &Tensor, (width, height): (u32, u32)) -> Result<Tensor> {
        let [n, h, w, 3] = frames.size()[..] else {
            return Err(Error::Batch(format!("frames of shape {:?} to resize, not [n, h, w, 3]", frames.size())));
        };
        let from = (w as u32, h as u32);
        let device = Device::Cuda(self.gpu.ordinal());
        let resize = self
            .resizes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .entry([from.0, from.1, width, height])
            .or_insert_with(|| {
                Resize::new(from, (width, height)).map(Arc::new).map_err(|e| {
                    tracing::warn!("{}x{} frames are resized to {width}x{height} on the CPU: {e}", from.0, from.1);
                    e.to_string()
                })
            })
            .clone();
        let out = Tensor::f_empty([n, i64::from(height), i64::from(width), 3], (Kind::Uint8, device))?;
        let Ok(resize) = resize else {
            let host = Vec::<u8>::try_from(frames.f_to_device(Device::Cpu)?.flatten(0, -1)).map_err(Error::Torch)?;
            let mut resizer = lake_codec::RgbResizer::new(from, (width, height)).map_err(|e| Error::Batch(e.to_string()))?;
            let mut resized = Vec::with_capacity(out.numel());
            for frame in host.chunks_exact((w * h * 3) as usize) {
                resized.extend(resizer.resize(frame).map_err(|e| Error::Batch(e.to_string()))?);
            }
            return Ok(Tensor::from_slice(&resized).f_to_device(device)?.reshape(out.size()));
        };
        let frames = frames.f_contiguous()?;
        let base = frames.data_ptr() as u64;
        let addresses: Vec<u64> = (0..n as u64).map(|i| base + i * (w * h * 3) as u64).collect();
        // SAFETY: `frames` holds `n` contiguous RGB24 frames of the resize's source size on this
        // GPU and `out` their resized frames; both live until the kernels have run (libtorch's
        // caching allocator reuses their memory only for work queued after them on this stream).
        unsafe { self.gpu.resize(&addresses, &resize, Target::Rgb24, out.data_ptr() as u64) }.map_err(|e| Error::Batch(e.to_string()))?;
        Ok(out)
    }

    /// The GOP's frames decoded on NVDEC, or `None` when NVDEC does not decode its stream (said
    /// once per stream, with the reason).
    fn on_nvdec(
        &self,
        stream: &str,
        packets: &[(i64, i64, bool, &[u8])],
        wanted: &[i64],
        camera: &str,
    ) -> Result<Option<Vec<DeviceFrame>>> {
        let mut nvdec = self.nvdec.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let decoder = nvdec.entry(stream.to_string()).or_insert_with(|| {
            let config: lake_codec::StreamConfig =
                serde_json::from_str(stream).map_err(|e| format!("a GOP's stream is not a stream configuration: {e}"))?;
            NvdecDecoder::open(&config, self.gpu.ordinal()).map_err(|e| {
                tracing::warn!("camera {camera}: stream {} decodes on the CPU: {e}", config.stream);
                e.to_string()
            })
        });
        let Ok(nvdec_decoder) = decoder else { return Ok(None) };
        match nvdec_decoder.decode(packets, wanted) {
            Ok(frames) => Ok(Some(frames)),
            // A stream FFmpeg decoded in software, or whose surfaces lake's kernel does not
            // read, goes to the CPU from now on; damage fails there, naming the frame.
            Err(e) => {
                tracing::warn!("camera {camera}: a stream decodes on the CPU from now on: {e}");
                *decoder = Err(e.to_string());
                Ok(None)
            }
        }
    }
}
