//! What NVDEC, the GPU's video decode engine, can decode: `cuvidGetDecoderCaps` of the driver's
//! `libnvcuvid.so.1`, loaded at run time, asked per codec and bit depth. Whether a stream decodes
//! on NVDEC is the device's answer for its codec, bit depth and size, never a table of GPUs
//! (Hopper's H100 and H200, for one, have no AV1 engine).

use std::sync::OnceLock;

use crate::{Error, Gpu, Result};

/// The codecs lake asks NVDEC about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Codec {
    /// H.264 / AVC.
    H264,
    /// H.265 / HEVC.
    Hevc,
    /// AV1 (LeRobot's default).
    Av1,
}

impl Codec {
    /// Every codec asked about, in the order `lake gpu` lists them.
    pub const ALL: [Codec; 3] = [Codec::H264, Codec::Hevc, Codec::Av1];

    /// FFmpeg's name of the codec, as the lake's streams table records it.
    pub fn ffmpeg_name(self) -> &'static str {
        match self {
            Codec::H264 => "h264",
            Codec::Hevc => "hevc",
            Codec::Av1 => "av1",
        }
    }

    /// The codec of FFmpeg's name, if NVDEC is asked about it.
    pub fn from_ffmpeg_name(name: &str) -> Option<Codec> {
        Codec::ALL.into_iter().find(|c| c.ffmpeg_name() == name)
    }

    /// `cudaVideoCodec` (`dynlink_cuviddec.h`).
    fn cuvid(self) -> i32 {
        match self {
            Codec::H264 => 4,
            Codec::Hevc => 8,
            Codec::Av1 => 11,
        }
    }
}

/// `CUVIDDECODECAPS`, as `dynlink_cuviddec.h` (Debian's libffmpeg-nvenc-dev, MIT) lays it out.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
struct RawCaps {
    codec: i32,
    chroma_format: i32,
    bit_depth_minus_8: u32,
    reserved1: [u32; 3],
    is_supported: u8,
    engines: u8,
    output_format_mask: u16,
    max_width: u32,
    max_height: u32,
    max_macroblocks: u32,
    min_width: u16,
    min_height: u16,
    histogram_supported: u8,
    histogram_counter_bits: u8,
    histogram_bins: u16,
    reserved3: [u32; 10],
}

/// `cudaVideoChromaFormat_420`.
const CHROMA_420: i32 = 1;

/// What one GPU's NVDEC decodes of a codec at a bit depth, 4:2:0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecoderCaps {
    /// The codec asked about.
    pub codec: Codec,
    /// Bits per sample asked about (8, 10).
    pub bit_depth: u32,
    /// Whether the device decodes it at all.
    pub supported: bool,
    /// NVDEC engines that decode it.
    pub engines: u8,
    /// Largest coded size, in pixels.
    pub max_width: u32,
    /// Largest coded size, in pixels.
    pub max_height: u32,
    /// Largest `width * height / 256`.
    pub max_macroblocks: u32,
    /// Smallest coded size, in pixels.
    pub min_width: u16,
    /// Smallest coded size, in pixels.
    pub min_height: u16,
    /// The surface formats it writes, a bit per `cudaVideoSurfaceFormat` (bit 0: NV12, bit 1:
    /// P016).
    pub output_formats: u16,
}

impl DecoderCaps {
    /// Whether a stream of `width` × `height` coded pixels decodes here, or why not.
    pub fn fits(&self, width: u32, height: u32) -> std::result::Result<(), String> {
        let what = format!("{} {}-bit", self.codec.ffmpeg_name(), self.bit_depth);
        if !self.supported {
            return Err(format!("this GPU's NVDEC does not decode {what}"));
        }
        if width > self.max_width || height > self.max_height {
            return Err(format!("{width}x{height} is larger than the {}x{} NVDEC decodes {what} at", self.max_width, self.max_height));
        }
        if width < u32::from(self.min_width) || height < u32::from(self.min_height) {
            return Err(format!("{width}x{height} is smaller than the {}x{} NVDEC decodes {what} at", self.min_width, self.min_height));
        }
        let macroblocks = u64::from(width.div_ceil(16)) * u64::from(height.div_ceil(16));
        if macroblocks > u64::from(self.max_macroblocks) {
            return Err(format!(
                "{width}x{height} is {macroblocks} macroblocks, over the {} NVDEC decodes {what} with",
                self.max_macroblocks
            ));
        }
        Ok(())
    }

    fn from_raw(codec: Codec, bit_depth: u32, raw: &RawCaps) -> Self {
        DecoderCaps {
            codec,
            bit_depth,
            supported: raw.is_supported != 0,
            engines: raw.engines,
            max_width: raw.max_width,
            max_height: raw.max_height,
            max_macroblocks: raw.max_macroblocks,
            min_width: raw.min_width,
            min_height: raw.min_height,
            output_formats: raw.output_format_mask,
        }
    }
}

type GetDecoderCaps = unsafe extern "C" fn(*mut RawCaps) -> i32;

/// The driver's NVDEC library and its caps query, loaded once.
fn library() -> std::result::Result<&'static (libloading::Library, GetDecoderCaps), String> {
    static LIBRARY: OnceLock<std::result::Result<(libloading::Library, GetDecoderCaps), String>> = OnceLock::new();
    LIBRARY
        .get_or_init(|| {
            // SAFETY: loading the driver's NVDEC library runs no initialiser beyond its own; the
            // symbol has the signature `dynlink_cuviddec.h` declares.
            unsafe {
                let library =
                    libloading::Library::new("libnvcuvid.so.1").map_err(|e| format!("no NVDEC library: {}", crate::loader_error(&e)))?;
                let query = *library
                    .get::<GetDecoderCaps>(b"cuvidGetDecoderCaps\0")
                    .map_err(|e| format!("libnvcuvid.so.1: {}", crate::loader_error(&e)))?;
                Ok((library, query))
            }
        })
        .as_ref()
        .map_err(Clone::clone)
}

impl Gpu {
    /// What this GPU's NVDEC decodes of `codec` at `bit_depth` (4:2:0).
    ///
    /// # Errors
    /// [`Error::Unavailable`] without the NVDEC library; [`Error::Driver`] when the query fails.
    pub fn decoder_caps(&self, codec: Codec, bit_depth: u32) -> Result<DecoderCaps> {
        let (_, query) = library().map_err(Error::Unavailable)?;
        self.context.bind_to_thread()?;
        let mut raw = RawCaps { codec: codec.cuvid(), chroma_format: CHROMA_420, bit_depth_minus_8: bit_depth - 8, ..RawCaps::default() };
        // SAFETY: `raw` is a `CUVIDDECODECAPS` with its inputs set and the rest zero; the
        // device's context is current on this thread, as the query needs.
        let status = unsafe { query(&mut raw) };
        if status != 0 {
            return Err(Error::Driver(format!(
                "cuvidGetDecoderCaps({} {bit_depth}-bit) failed with CUresult {status}",
                codec.ffmpeg_name()
            )));
        }
        Ok(DecoderCaps::from_raw(codec, bit_depth, &raw))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_caps_struct_is_laid_out_as_the_header_declares() {
        // Three enums and a bit depth with three reserved words, four bytes of flags and mask,
        // three limits, two 16-bit minimums, four bytes of histogram facts, ten reserved words.
        assert_eq!(std::mem::size_of::<RawCaps>(), 24 + 4 + 12 + 4 + 4 + 40);
        assert_eq!(std::mem::offset_of!(RawCaps, is_supported), 24);
        assert_eq!(std::mem::offset_of!(RawCaps, max_width), 28);
        assert_eq!(std::mem::offset_of!(RawCaps, min_width), 40);
        assert_eq!(std::mem::offset_of!(RawCaps, reserved3), 48);
    }

    #[test]
    fn a_stream_fits_within_every_limit_or_is_told_which() {
        // An H100's H.264 caps (max 4096x4096, 65536 macroblocks, min 48x16).
        let raw = RawCaps {
            is_supported: 1,
            engines: 7,
            max_width: 4096,
            max_height: 4096,
            max_macroblocks: 65_536,
            min_width: 48,
            min_height: 16,
            output_format_mask: 1,
            ..RawCaps::default()
        };
        let caps = DecoderCaps::from_raw(Codec::H264, 8, &raw);
        assert_eq!(caps.fits(640, 480), Ok(()));
        assert_eq!(caps.fits(1920, 1080), Ok(()));
        assert_eq!(caps.fits(4096, 4096), Ok(()), "exactly the limit: 256 x 256 macroblocks");
        assert!(caps.fits(4112, 16).unwrap_err().contains("larger than the 4096x4096"));
        assert!(caps.fits(32, 32).unwrap_err().contains("smaller than the 48x16"));
        let fewer = DecoderCaps { max_macroblocks: 8_160, ..caps };
        assert_eq!(fewer.fits(1920, 1088), Ok(()), "exactly the macroblock limit");
        assert!(fewer.fits(1920, 1096).unwrap_err().contains("8280 macroblocks, over the 8160"));
        let none = DecoderCaps::from_raw(Codec::Av1, 8, &RawCaps::default());
        assert_eq!(none.fits(640, 480), Err("this GPU's NVDEC does not decode av1 8-bit".to_owned()));
        assert_eq!(Codec::from_ffmpeg_name("hevc"), Some(Codec::Hevc));
        assert_eq!(Codec::from_ffmpeg_name("mpeg4"), None);
    }
}
