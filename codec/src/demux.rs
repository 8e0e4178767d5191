//! Demuxing camera videos with FFmpeg, without decoding: stream facts from the container and
//! every packet in decode order, with keyframes taken from the bitstream and each packet's unit
//! framing checked.

use std::{
    ffi::CStr,
    io::{Read, Seek},
    os::raw::c_char,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
};

use ffmpeg_next::{self as ffmpeg, ffi};
use lake_schemas::CodecParams;

use crate::{Error, Result, init_ffmpeg};

/// Stream facts read from the container.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamFacts {
    /// What a decoder is opened from: codec, extradata, size, pixel format, colour.
    pub params: CodecParams,
    /// Codec profile name, when known.
    pub profile: Option<String>,
    /// Time base of pts/dts.
    pub time_base: (i32, i32),
    /// Average frame rate, when known.
    pub avg_frame_rate: Option<f64>,
    /// Number of frames the container index lists (0 when unknown).
    pub nb_frames: u64,
    /// Stream duration in seconds, when known.
    pub duration_s: Option<f64>,
}

/// One compressed packet, in decode order.
#[derive(Debug, Clone, PartialEq)]
pub struct DemuxedPacket {
    /// Presentation timestamp, in the stream's time base.
    pub pts: i64,
    /// Decode timestamp.
    pub dts: i64,
    /// Duration.
    pub duration: i64,
    /// Whether the bitstream says decoding can start here.
    pub keyframe: bool,
    /// Whether the container marks the packet as a keyframe.
    pub container_keyframe: bool,
    /// The compressed bytes.
    pub data: Vec<u8>,
    /// Why the packet's bytes cannot be the codec's (its framing is broken), when they cannot.
    pub damaged: Option<String>,
}

/// How a codec frames the units inside a packet, as far as ingest checks it without decoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    /// H.264 or HEVC in MP4 (`avcC`/`hvcC`): NAL units, each after a big-endian length of
    /// this many bytes.
    LengthPrefixed(usize),
    /// AV1: OBUs, each with a header and (but for the last) a LEB128 size.
    Obu,
    /// Not checked.
    Unchecked,
}

impl Framing {
    fn of(params: &CodecParams) -> Self {
        let extradata = params.extradata.as_deref().unwrap_or_default();
        match params.codec.as_str() {
            // avcC: version 1; the length size minus one in the low bits of byte 4.
            "h264" if extradata.len() > 4 && extradata[0] == 1 => Self::LengthPrefixed(usize::from(extradata[4] & 3) + 1),
            // hvcC: version 1; the length size minus one in the low bits of byte 21.
            "hevc" if extradata.len() > 21 && extradata[0] == 1 => Self::LengthPrefixed(usize::from(extradata[21] & 3) + 1),
            "av1" => Self::Obu,
            _ => Self::Unchecked,
        }
    }

    /// Why `data` is not a whole sequence of units, or `None` when it is.
    fn damage(self, data: &[u8]) -> Option<String> {
        let mut at = 0usize;
        match self {
            Self::Unchecked => None,
            Self::LengthPrefixed(size) => {
                while at < data.len() {
                    let Some(prefix) = data.get(at..at + size) else {
                        return Some(format!("its last NAL unit's length is cut off at byte {at} of {}", data.len()));
                    };
                    let n = prefix.iter().fold(0usize, |n, b| (n << 8) | usize::from(*b));
                    at += size;
                    if n == 0 {
                        return Some(format!("a NAL unit of length 0 at byte {}", at - size));
                    }
                    if data.len() - at < n {
                        return Some(format!("a NAL unit of {n} bytes at byte {} runs past the packet's {} bytes", at - size, data.len()));
                    }
                    if data[at] & 0x80 != 0 {
                        return Some(format!("the NAL unit at byte {} has its forbidden bit set", at - size));
                    }
                    at += n;
                }
                None
            }
            Self::Obu => {
                while at < data.len() {
                    let header = data[at];
                    let (kind, extension, has_size) = ((header >> 3) & 0xf, header & 4 != 0, header & 2 != 0);
                    if header & 0x80 != 0 || kind == 0 || (9..=14).contains(&kind) {
                        return Some(format!("byte {at} is not an OBU header (type {kind}, forbidden bit {})", header >> 7));
                    }
                    let mut next = at + 1 + usize::from(extension);
                    if !has_size {
                        return (next > data.len()).then(|| format!("the OBU at byte {at} is cut off"));
                    }
                    let mut size = 0usize;
                    for i in 0..8 {
                        let Some(&b) = data.get(next) else { return Some(format!("the OBU at byte {at} has its size cut off")) };
                        next += 1;
                        size |= usize::from(b & 0x7f) << (7 * i);
                        if b & 0x80 == 0 {
                            break;
                        }
                    }
                    if data.len() - next.min(data.len()) < size {
                        return Some(format!("an OBU of {size} bytes at byte {at} runs past the packet's {} bytes", data.len()));
                    }
                    at = next + size;
                }
                None
            }
        }
    }
}

/// An opened video file: the container, its first video stream and a bitstream parser.
pub struct VideoDemuxer {
    input: ffmpeg::format::context::Input,
    stream_index: usize,
    facts: StreamFacts,
    parser: Option<BitstreamParser>,
    framing: Framing,
    file_size: u64,
    packets_read: u64,
}

impl VideoDemuxer {
    /// Opens `reader`, a file of `file_size` bytes (named `name` in messages and for format
    /// detection). Setting `cancel` stops a read in progress with [`Error::Cancelled`].
    ///
    /// # Errors
    /// When FFmpeg cannot open the container or it has no video stream.
    pub fn open<R: Read + Seek + Send + 'static>(reader: R, file_size: u64, name: &str, cancel: Arc<AtomicBool>) -> Result<Self> {
        init_ffmpeg();
        if file_size == 0 {
            return Err(Error::Demux("the file is empty".into()));
        }
        let io = ffmpeg::format::context::StreamIo::from_read_seek_with_capacity(reader, 1 << 16)
            .map_err(|e| Error::Demux(format!("cannot set up reading: {e}")))?;
        let input = ffmpeg::format::input_from_stream_with_interrupt(io, Some(name), None, move || cancel.load(Ordering::Relaxed))
            .map_err(|e| Error::Demux(format!("FFmpeg cannot open the container ({e}): not an mp4, or truncated before its index")))?;
        let stream =
            input.streams().best(ffmpeg::media::Type::Video).ok_or_else(|| Error::Demux("the container has no video stream".into()))?;
        let stream_index = stream.index();
        // SAFETY: the stream's parameters pointer is valid while `input` lives.
        let facts = unsafe { facts_of(&stream) };
        // SAFETY: as above.
        let parser = unsafe { BitstreamParser::new(stream.parameters().as_ptr()) };
        let framing = Framing::of(&facts.params);
        Ok(Self { input, stream_index, facts, parser, framing, file_size, packets_read: 0 })
    }

    /// The stream's facts.
    pub fn facts(&self) -> &StreamFacts {
        &self.facts
    }

    /// The next packet of the video stream, in decode order, or `None` at the end.
    ///
    /// # Errors
    /// When the container cannot be read any further (truncated or corrupt file).
    pub fn next_packet(&mut self) -> Result<Option<DemuxedPacket>> {
        let mut packet = ffmpeg::Packet::empty();
        loop {
            match packet.read(&mut self.input) {
                Ok(()) => {}
                Err(ffmpeg::Error::Eof) => return Ok(None),
                Err(ffmpeg::Error::Exit) => return Err(Error::Cancelled),
                Err(e) => return Err(Error::Demux(format!("reading packet {} failed: {e}", self.packets_read))),
            }
            if packet.stream() != self.stream_index {
                continue;
            }
            let index = self.packets_read;
            self.packets_read += 1;
            let data = packet.data().unwrap_or_default();
            let pos = packet.position();
            if pos >= 0 && pos as u64 + data.len() as u64 > self.file_size {
                return Err(Error::Demux(format!("packet {index} runs past the end of the file (truncated?)")));
            }
            if packet.is_corrupt() {
                return Err(Error::Demux(format!("packet {index} is incomplete: the file ends or is damaged inside it (truncated?)")));
            }
            let pts = packet.pts().ok_or_else(|| Error::Demux(format!("packet {index} has no presentation timestamp")))?;
            let dts = packet.dts().unwrap_or(pts);
            let container_keyframe = packet.is_key();
            let damaged = self.framing.damage(data);
            let keyframe = match &mut self.parser {
                // A damaged packet's bitstream cannot be trusted to tell.
                Some(parser) if damaged.is_none() => parser.keyframe(data, pts, dts).unwrap_or(container_keyframe),
                _ => container_keyframe,
            };
            return Ok(Some(DemuxedPacket {
                pts,
                dts,
                duration: packet.duration(),
                keyframe,
                container_keyframe,
                data: data.to_vec(),
                damaged,
            }));
        }
    }
}

/// FFmpeg's bitstream parser for the stream's codec, used only to tell keyframes.
struct BitstreamParser {
    parser: *mut ffi::AVCodecParserContext,
    ctx: *mut ffi::AVCodecContext,
    codec: ffi::AVCodecID,
    first: bool,
}

// SAFETY: the parser and context are owned by this value and only used through `&mut self`.
unsafe impl Send for BitstreamParser {}

impl BitstreamParser {
    /// A parser for the codec of `par`, or `None` when FFmpeg has none.
    ///
    /// # Safety
    /// `par` must point to valid codec parameters.
    unsafe fn new(par: *const ffi::AVCodecParameters) -> Option<Self> {
        // SAFETY: caller guarantees `par`; every pointer is checked before use and freed in Drop.
        unsafe {
            let codec = (*par).codec_id;
            let parser = ffi::av_parser_init(codec as i32);
            if parser.is_null() {
                return None;
            }
            let ctx = ffi::avcodec_alloc_context3(std::ptr::null());
            if ctx.is_null() || ffi::avcodec_parameters_to_context(ctx, par) < 0 {
                ffi::av_parser_close(parser);
                if !ctx.is_null() {
                    let mut ctx = ctx;
                    ffi::avcodec_free_context(&mut ctx);
                }
                return None;
            }
            (*parser).flags |= ffi::PARSER_FLAG_COMPLETE_FRAMES;
            Some(Self { parser, ctx, codec, first: true })
        }
    }

    /// Whether the packet starts a random-access point, per the bitstream; `None` when the
    /// parser could not tell.
    fn keyframe(&mut self, data: &[u8], pts: i64, dts: i64) -> Option<bool> {
        if data.is_empty() {
            return None;
        }
        let mut out: *mut u8 = std::ptr::null_mut();
        let mut out_size = 0;
        let pos = if self.first { 0 } else { -1 };
        self.first = false;
        // SAFETY: `data` comes from an FFmpeg packet, which is padded as parsers require; the
        // parser only reads it during this call.
        let consumed = unsafe {
            ffi::av_parser_parse2(self.parser, self.ctx, &mut out, &mut out_size, data.as_ptr(), data.len() as i32, pts, dts, pos)
        };
        if consumed < 0 {
            return None;
        }
        // SAFETY: the parser context is valid for our lifetime.
        let (key, pict) = unsafe { ((*self.parser).key_frame, (*self.parser).pict_type) };
        match key {
            1 => Some(true),
            0 => Some(false),
            // MPEG-4 Part 2's parser reports only the picture type.
            _ if self.codec == ffi::AVCodecID::AV_CODEC_ID_MPEG4 && pict != ffi::AVPictureType::AV_PICTURE_TYPE_NONE as i32 => {
                Some(pict == ffi::AVPictureType::AV_PICTURE_TYPE_I as i32)
            }
            _ => None,
        }
    }
}

impl Drop for BitstreamParser {
    fn drop(&mut self) {
        // SAFETY: both were allocated in `new` and are freed exactly once here.
        unsafe {
            ffi::av_parser_close(self.parser);
            ffi::avcodec_free_context(&mut self.ctx);
        }
    }
}

fn c_name(p: *const c_char) -> Option<String> {
    if p.is_null() {
        None
    } else {
        // SAFETY: FFmpeg's name functions return static NUL-terminated strings.
        Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
    }
}

/// # Safety
/// The stream's parameters must be valid.
unsafe fn facts_of(stream: &ffmpeg::Stream<'_>) -> StreamFacts {
    // SAFETY: caller guarantees validity; all name lookups accept any enum value.
    unsafe {
        let par = stream.parameters().as_ptr();
        let p = &*par;
        let tb = stream.time_base();
        let rate = stream.avg_frame_rate();
        let extradata = (!p.extradata.is_null() && p.extradata_size > 0)
            .then(|| std::slice::from_raw_parts(p.extradata, p.extradata_size as usize).to_vec());
        let duration_s = (stream.duration() > 0 && tb.denominator() != 0)
            .then(|| stream.duration() as f64 * f64::from(tb.numerator()) / f64::from(tb.denominator()));
        StreamFacts {
            params: CodecParams {
                codec: c_name(ffi::avcodec_get_name(p.codec_id)).unwrap_or_else(|| "unknown".into()),
                extradata,
                width: p.width.max(0) as u32,
                height: p.height.max(0) as u32,
                pix_fmt: c_name(ffi::av_get_pix_fmt_name(std::mem::transmute::<i32, ffi::AVPixelFormat>(p.format))),
                color_range: c_name(ffi::av_color_range_name(p.color_range)),
                color_space: c_name(ffi::av_color_space_name(p.color_space)),
                color_primaries: c_name(ffi::av_color_primaries_name(p.color_primaries)),
                color_trc: c_name(ffi::av_color_transfer_name(p.color_trc)),
                chroma_location: c_name(ffi::av_chroma_location_name(p.chroma_location)),
            },
            profile: c_name(ffi::avcodec_profile_name(p.codec_id, p.profile)),
            time_base: (tb.numerator(), tb.denominator()),
            avg_frame_rate: (rate.denominator() != 0 && rate.numerator() != 0)
                .then(|| f64::from(rate.numerator()) / f64::from(rate.denominator())),
            nb_frames: stream.frames().max(0) as u64,
            duration_s,
        }
    }
}

/// Whether two codec names mean the same codec (`info.json` uses encoder or codec names).
pub fn same_codec(declared: &str, actual: &str) -> bool {
    fn family(name: &str) -> &str {
        match name.to_ascii_lowercase().as_str() {
            "av1" | "libsvtav1" | "libaom-av1" | "librav1e" | "av01" | "libdav1d" => "av1",
            "h264" | "libx264" | "avc" | "avc1" | "h264_nvenc" | "h264_vaapi" | "h264_qsv" | "h264_videotoolbox" => "h264",
            "hevc" | "h265" | "libx265" | "hvc1" | "hev1" | "hevc_nvenc" | "hevc_vaapi" | "hevc_qsv" | "hevc_videotoolbox" => "hevc",
            "mpeg4" | "mp4v" | "xvid" | "libxvid" => "mpeg4",
            "vp9" | "libvpx-vp9" => "vp9",
            _ => "",
        }
    }
    let (d, a) = (family(declared), family(actual));
    if d.is_empty() || a.is_empty() { declared.eq_ignore_ascii_case(actual) } else { d == a }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codec_families() {
        assert!(same_codec("libsvtav1", "av1"));
        assert!(same_codec("h264", "h264"));
        assert!(!same_codec("h264", "mpeg4"));
        assert!(same_codec("h265", "hevc"));
        assert!(same_codec("weird", "WEIRD"));
    }

    #[test]
    fn broken_unit_framing_is_named_and_sound_framing_passes() {
        let nal = Framing::LengthPrefixed(4);
        assert_eq!(nal.damage(&[0, 0, 0, 2, 0x65, 1, 0, 0, 0, 1, 0x41]), None);
        assert!(nal.damage(&[0, 0, 0, 0, 0x65]).expect("damaged").contains("length 0 at byte 0"));
        assert!(nal.damage(&[0, 0, 0, 9, 0x65, 1]).expect("damaged").contains("runs past the packet's 6 bytes"));
        assert!(nal.damage(&[0, 0, 0, 1, 0xe5]).expect("damaged").contains("forbidden bit"));
        assert!(nal.damage(&[0, 0, 0, 1, 0x65, 0, 0]).expect("damaged").contains("cut off at byte 5"));
        // AV1: a temporal delimiter (type 2, size 0), then a frame OBU (type 6) of 3 bytes, then
        // a last OBU without a size field.
        let obu = Framing::Obu;
        assert_eq!(obu.damage(&[0x12, 0, 0x32, 3, 1, 2, 3, 0x30, 9, 9]), None);
        assert!(obu.damage(&[0x12, 0, 0, 0, 0]).expect("damaged").contains("byte 2 is not an OBU header"));
        assert!(obu.damage(&[0x32, 9, 1]).expect("damaged").contains("runs past"));
        assert_eq!(Framing::Unchecked.damage(&[0; 8]), None);
    }
}
