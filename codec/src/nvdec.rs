//! Decoding on the GPU's NVDEC engine through FFmpeg's CUDA hwaccel.
//!
//! The decoder is FFmpeg's own (`h264`, `hevc`, `av1`) with a CUDA device attached: FFmpeg parses
//! the packets, orders B-frames and manages references exactly as on the CPU path, and hands
//! the slice data to NVDEC. Frames stay in GPU memory as NV12 surfaces (a luma plane, then the
//! interleaved chroma plane, at a pitch) of FFmpeg's frame pool, for lake-gpu's colour kernel to
//! turn into RGB in the trainer's tensor. The device is opened on CUDA's primary context, the one
//! libtorch's runtime uses, so the kernel and the surfaces share a context and the legacy default
//! stream that orders FFmpeg's copies out of NVDEC before the kernel's reads. See
//! `docs/decisions/0023-nvdec-through-ffmpeg.md`.
//!
//! Everything here needs a CUDA driver and an FFmpeg built with NVDEC; without either,
//! [`NvdecDecoder::open`] says which is missing and the caller decodes on the CPU.

use std::{
    collections::HashMap,
    ffi::CString,
    sync::{Arc, Mutex, OnceLock},
};

use ffmpeg_next::{self as ffmpeg, ffi};

use crate::{Error, Result, StreamConfig, codec_context, frame_damage, strict};

/// FFmpeg's CUDA device on one GPU (an `AVHWDeviceContext` reference), shared by the decoders of
/// that GPU.
struct CudaDevice(*mut ffi::AVBufferRef);

// SAFETY: FFmpeg's device contexts are reference counted with atomics and may be shared between
// threads; this handle is only read (to take another reference) and released once.
unsafe impl Send for CudaDevice {}
// SAFETY: as above.
unsafe impl Sync for CudaDevice {}

impl Drop for CudaDevice {
    fn drop(&mut self) {
        // SAFETY: the reference this handle owns.
        unsafe { ffi::av_buffer_unref(&mut self.0) };
    }
}

/// FFmpeg's error code in words.
fn av_error(code: i32) -> String {
    ffmpeg::Error::from(code).to_string()
}

/// The CUDA device of GPU `ordinal`, opened once per process on the primary context.
fn cuda_device(ordinal: usize) -> Result<Arc<CudaDevice>> {
    static DEVICES: OnceLock<Mutex<HashMap<usize, Arc<CudaDevice>>>> = OnceLock::new();
    let mut devices = DEVICES.get_or_init(Mutex::default).lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(device) = devices.get(&ordinal) {
        return Ok(device.clone());
    }
    crate::init_ffmpeg();
    let name = CString::new(ordinal.to_string()).expect("digits");
    let (key, one) = (CString::new("primary_ctx").expect("text"), CString::new("1").expect("text"));
    let mut options: *mut ffi::AVDictionary = std::ptr::null_mut();
    let mut device: *mut ffi::AVBufferRef = std::ptr::null_mut();
    // SAFETY: FFmpeg allocates the dictionary and the device context; both pointers start null,
    // and the dictionary is freed here whatever the outcome.
    let status = unsafe {
        ffi::av_dict_set(&mut options, key.as_ptr(), one.as_ptr(), 0);
        let status = ffi::av_hwdevice_ctx_create(&mut device, ffi::AVHWDeviceType::AV_HWDEVICE_TYPE_CUDA, name.as_ptr(), options, 0);
        ffi::av_dict_free(&mut options);
        status
    };
    if status < 0 || device.is_null() {
        return Err(Error::Open(format!("NVDEC: FFmpeg cannot open CUDA device {ordinal}: {}", av_error(status))));
    }
    let device = Arc::new(CudaDevice(device));
    devices.insert(ordinal, device.clone());
    Ok(device)
}

/// Whether this FFmpeg's decoder of `codec` (FFmpeg's name) can decode through a CUDA device,
/// or why not.
///
/// # Errors
/// [`Error::Open`] naming what is missing: the codec, or an NVDEC hwaccel for it in this
/// FFmpeg's build.
pub fn nvdec_in_ffmpeg(codec: &str) -> Result<()> {
    crate::init_ffmpeg();
    let name = CString::new(codec).map_err(|_| Error::Open(format!("codec name {codec:?}")))?;
    // SAFETY: lookups in FFmpeg's static tables; the configs it returns are static too.
    unsafe {
        let desc = ffi::avcodec_descriptor_get_by_name(name.as_ptr());
        let decoder = if desc.is_null() { std::ptr::null() } else { ffi::avcodec_find_decoder((*desc).id) };
        if decoder.is_null() {
            return Err(Error::Open(format!("this FFmpeg has no decoder for `{codec}`")));
        }
        for i in 0.. {
            let config = ffi::avcodec_get_hw_config(decoder, i);
            if config.is_null() {
                break;
            }
            let by_device = (*config).methods & ffi::AV_CODEC_HW_CONFIG_METHOD_HW_DEVICE_CTX as i32 != 0;
            if by_device && (*config).device_type == ffi::AVHWDeviceType::AV_HWDEVICE_TYPE_CUDA {
                return Ok(());
            }
        }
    }
    Err(Error::Open(format!("this FFmpeg decodes `{codec}` without NVDEC (it was built without nvdec, or has no NVDEC for the codec)")))
}

/// Asks for CUDA frames when the decoder offers them; otherwise takes its first (software)
/// format, and [`NvdecDecoder::decode`] reports the stream as not decoded on NVDEC.
unsafe extern "C" fn cuda_format(_: *mut ffi::AVCodecContext, offered: *const ffi::AVPixelFormat) -> ffi::AVPixelFormat {
    let mut at = offered;
    // SAFETY: FFmpeg's list, ended by AV_PIX_FMT_NONE.
    unsafe {
        while *at != ffi::AVPixelFormat::AV_PIX_FMT_NONE {
            if *at == ffi::AVPixelFormat::AV_PIX_FMT_CUDA {
                return *at;
            }
            at = at.add(1);
        }
        *offered
    }
}

/// A decoded frame in GPU memory: an NV12 surface of FFmpeg's CUDA frame pool, held (not
/// reused) until this is dropped.
pub struct DeviceFrame {
    /// Keeps the surface out of the pool.
    frame: ffmpeg::frame::Video,
    /// Presentation timestamp.
    pub pts: i64,
    /// Device address of the luma plane.
    pub luma: u64,
    /// Bytes from the luma plane to the interleaved chroma plane.
    pub chroma_offset: u64,
    /// Bytes from one row to the next, in both planes.
    pub pitch: u32,
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
}

// SAFETY: the frame is a reference to a pooled GPU surface; FFmpeg's reference counts are
// atomic and nothing here touches the surface's memory from the CPU.
unsafe impl Send for DeviceFrame {}

impl std::fmt::Debug for DeviceFrame {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceFrame")
            .field("pts", &self.pts)
            .field("width", &self.width)
            .field("height", &self.height)
            .field("pitch", &self.pitch)
            .finish_non_exhaustive()
    }
}

impl DeviceFrame {
    /// The surface of a frame NVDEC decoded, or why it is not one lake's kernel reads.
    fn of(frame: &ffmpeg::frame::Video, pts: i64) -> std::result::Result<Self, String> {
        // SAFETY: a frame the decoder filled; a CUDA frame's planes are device addresses and its
        // frames context an AVHWFramesContext.
        unsafe {
            let raw = frame.as_ptr();
            if (*raw).format != ffi::AVPixelFormat::AV_PIX_FMT_CUDA as i32 {
                let name = ffi::av_get_pix_fmt_name(std::mem::transmute::<i32, ffi::AVPixelFormat>((*raw).format));
                let name = if name.is_null() { "unknown".into() } else { std::ffi::CStr::from_ptr(name).to_string_lossy() };
                return Err(format!("FFmpeg decoded the stream in software ({name}): NVDEC refused it"));
            }
            let frames = (*raw).hw_frames_ctx;
            if frames.is_null() {
                return Err("a CUDA frame without its frames context".into());
            }
            let sw = (*(*frames).data.cast::<ffi::AVHWFramesContext>()).sw_format;
            if sw != ffi::AVPixelFormat::AV_PIX_FMT_NV12 {
                let name = ffi::av_get_pix_fmt_name(sw);
                let name = if name.is_null() { "unknown".into() } else { std::ffi::CStr::from_ptr(name).to_string_lossy() };
                return Err(format!("NVDEC gives {name} surfaces; lake's kernel reads 8-bit NV12"));
            }
            let (luma, chroma) = ((*raw).data[0] as u64, (*raw).data[1] as u64);
            let (pitch, chroma_pitch) = ((*raw).linesize[0], (*raw).linesize[1]);
            if chroma < luma || pitch != chroma_pitch || pitch <= 0 {
                return Err(format!("an NV12 surface of another layout (luma pitch {pitch}, chroma pitch {chroma_pitch})"));
            }
            Ok(DeviceFrame {
                frame: frame.clone(),
                pts,
                luma,
                chroma_offset: chroma - luma,
                pitch: pitch as u32,
                width: frame.width(),
                height: frame.height(),
            })
        }
    }

    /// The frame's FFmpeg reference (its colour description, for one).
    pub fn frame(&self) -> &ffmpeg::frame::Video {
        &self.frame
    }
}

/// A decoder of one stream on one GPU's NVDEC, reused across GOPs.
pub struct NvdecDecoder {
    decoder: ffmpeg::decoder::Video,
    _device: Arc<CudaDevice>,
    /// The stream this decoder was opened for.
    pub stream: u32,
}

// SAFETY: the decoder owns its FFmpeg context and is only used through `&mut self`; FFmpeg's
// contexts may move between threads.
unsafe impl Send for NvdecDecoder {}

impl std::fmt::Debug for NvdecDecoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvdecDecoder").field("stream", &self.stream).finish_non_exhaustive()
    }
}

impl NvdecDecoder {
    /// Opens a decoder for the video stream `config` on GPU `ordinal`'s NVDEC.
    ///
    /// # Errors
    /// [`Error::Open`] saying why the stream cannot decode there: not a video, no NVDEC in this
    /// FFmpeg for the codec, no CUDA driver or device.
    pub fn open(config: &StreamConfig, ordinal: usize) -> Result<Self> {
        if config.kind != "video" {
            return Err(Error::Open(format!("NVDEC decodes videos; stream {} holds {} pictures", config.stream, config.params.codec)));
        }
        nvdec_in_ffmpeg(&config.params.codec)?;
        let device = cuda_device(ordinal)?;
        let mut ctx = codec_context(&config.params)?;
        // SAFETY: a context we own, not opened yet: the device reference is the context's to
        // release, and the callback is a plain function.
        unsafe {
            let raw = ctx.as_mut_ptr();
            (*raw).thread_count = 1;
            (*raw).hw_device_ctx = ffi::av_buffer_ref(device.0);
            if (*raw).hw_device_ctx.is_null() {
                return Err(Error::Open("NVDEC: out of memory for the device reference".into()));
            }
            (*raw).get_format = Some(cuda_format);
        }
        strict(&mut ctx);
        let decoder = ctx.decoder().video().map_err(|e| Error::Open(format!("NVDEC: opening the {} decoder: {e}", config.params.codec)))?;
        Ok(Self { decoder, _device: device, stream: config.stream })
    }

    /// Decodes `packets` (`(pts, dts, keyframe flag, bytes)` in decode order, from a keyframe)
    /// and returns the frames whose pts is in `wanted`, in that order, as GPU surfaces. The
    /// decoder is drained and flushed, ready for the next GOP.
    ///
    /// # Errors
    /// [`Error::Decode`] when a packet is refused, a frame is damaged or does not come out, or
    /// the stream was not decoded on NVDEC (FFmpeg fell back to software).
    pub fn decode(&mut self, packets: &[(i64, i64, bool, &[u8])], wanted: &[i64]) -> Result<Vec<DeviceFrame>> {
        let mut found: Vec<Option<DeviceFrame>> = (0..wanted.len()).map(|_| None).collect();
        let result = (|| {
            let mut frame = ffmpeg::frame::Video::empty();
            for (pts, dts, key, data) in packets {
                let p = crate::context::packet(data, *pts, *dts, *key);
                self.decoder.send_packet(&p).map_err(|e| Error::Decode(format!("NVDEC: packet pts {pts}: {e}")))?;
                self.receive(&mut frame, wanted, &mut found)?;
            }
            self.decoder.send_eof().map_err(|e| Error::Decode(format!("NVDEC: end of stream: {e}")))?;
            self.receive(&mut frame, wanted, &mut found)
        })();
        self.decoder.flush();
        result?;
        found
            .into_iter()
            .zip(wanted)
            .map(|(f, pts)| f.ok_or_else(|| Error::Decode(format!("NVDEC: the frame with pts {pts} did not come out of the decoder"))))
            .collect()
    }

    /// Takes every frame the decoder has ready, keeping the wanted ones.
    fn receive(&mut self, frame: &mut ffmpeg::frame::Video, wanted: &[i64], found: &mut [Option<DeviceFrame>]) -> Result<()> {
        loop {
            match self.decoder.receive_frame(frame) {
                Ok(()) => {
                    let Some(pts) = frame.pts().or_else(|| frame.timestamp()) else { continue };
                    if let Some(why) = frame_damage(frame) {
                        return Err(Error::Decode(format!("NVDEC: the frame with pts {pts} ({why})")));
                    }
                    for (slot, _) in wanted.iter().enumerate().filter(|(_, w)| **w == pts) {
                        if found[slot].is_none() {
                            found[slot] = Some(DeviceFrame::of(frame, pts).map_err(|why| Error::Decode(format!("NVDEC: {why}")))?);
                        }
                    }
                }
                Err(ffmpeg::Error::Other { errno }) if errno == ffmpeg::util::error::EAGAIN => return Ok(()),
                Err(ffmpeg::Error::Eof) => return Ok(()),
                Err(e) => return Err(Error::Decode(format!("NVDEC: decoding: {e}"))),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use lake_schemas::CodecParams;

    use super::*;

    fn config(codec: &str, kind: &str) -> StreamConfig {
        StreamConfig {
            stream: 3,
            camera: "observation.images.front".into(),
            kind: kind.into(),
            params: CodecParams { codec: codec.into(), width: 640, height: 480, pix_fmt: Some("yuv420p".into()), ..Default::default() },
            yuv: None,
        }
    }

    /// On a machine without a CUDA driver, or with an FFmpeg without NVDEC, opening says which
    /// is missing, and pictures are refused before either is asked.
    #[test]
    fn nvdec_says_why_a_stream_does_not_decode_here() {
        let said = NvdecDecoder::open(&config("mjpeg", "image"), 0).expect_err("pictures").to_string();
        assert!(said.contains("NVDEC decodes videos; stream 3 holds mjpeg pictures"), "{said}");
        let said = NvdecDecoder::open(&config("nothing-like-it", "video"), 0).expect_err("unknown codec").to_string();
        assert!(said.contains("this FFmpeg has no decoder for `nothing-like-it`"), "{said}");
        for codec in ["h264", "hevc", "av1"] {
            match NvdecDecoder::open(&config(codec, "video"), 0) {
                Ok(_) => {} // a machine with a GPU and an FFmpeg with NVDEC
                Err(e) => {
                    let said = e.to_string();
                    let why = ["without NVDEC", "cannot open CUDA device 0"];
                    assert!(why.iter().any(|w| said.contains(w)), "{codec}: {said}");
                }
            }
        }
    }
}
