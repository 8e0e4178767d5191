//! Frame decoding and colour conversion, the way LeRobot's CPU path does it.
//!
//! LeRobot decodes with torchcodec on FFmpeg. For every frame torchcodec converts the decoded
//! picture to packed RGB with libswscale when the width is a multiple of 32
//! (`sws_getContext(w, h, fmt, w, h, RGB24, SWS_BILINEAR)`, then `sws_setColorspaceDetails`
//! with the coefficients of the frame's colour space on both sides and the ranges swscale chose
//! itself), and through a filter graph `scale=W:H:sws_flags=bilinear` into an `rgb24` sink
//! otherwise. [`RgbConverter`] does exactly the same calls on the same FFmpeg, so the bytes are
//! identical, not merely close.
//!
//! A [`StreamDecoder`] is opened once per stream from the codec facts ingest recorded (codec,
//! extradata, size, colour description, as `avcodec_parameters_to_context` would set them) and
//! reused for every GOP: decode the packets from the keyframe on, drain, flush.

use std::mem::MaybeUninit;

use ffmpeg_next::{self as ffmpeg, ffi};
use lake_schemas::CodecParams;
use lake_schemas::picture;

use crate::{
    Error, Result, codec_context, frame_damage,
    pixels::{YuvToRgb, yuv420p_bytes},
    strict,
};
use turbojpeg_sys as tj;

/// The codec facts a decoder is opened from (a row of the `streams` table).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StreamConfig {
    /// Stream id in the dataset version.
    pub stream: u32,
    /// Camera key.
    pub camera: String,
    /// `video` (mp4 packets) or `image` (PNG/JPEG inside the parquet).
    pub kind: String,
    /// What the decoder is opened from.
    pub params: CodecParams,
    /// Frames come out as YUV 4:2:0 planes (Y, U, V, packed) that convert to RGB this way,
    /// instead of as RGB (`None`).
    pub yuv: Option<YuvToRgb>,
}

/// A decoded frame as packed RGB24 (HWC) bytes, or as YUV 4:2:0 planes for a stream whose
/// [`StreamConfig::yuv`] asks for them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RgbFrame {
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
    /// `height * width * 3` bytes (RGB), or [`yuv420p_bytes`] (planes).
    pub data: Vec<u8>,
}

fn ff(what: &str) -> impl FnOnce(ffmpeg::Error) -> Error + '_ {
    move |e| Error::Decode(format!("{what}: {e}"))
}

/// A decoder for one stream, reused across GOPs.
pub struct StreamDecoder {
    engine: Engine,
    /// The stream this decoder was opened for.
    pub stream: u32,
    /// Picture size in pixels.
    pixels: u64,
}

/// What decodes a stream: the library LeRobot's reader decodes it with.
enum Engine {
    /// Videos, and pictures other than JPEG: FFmpeg, then torchcodec's conversion to RGB.
    Ffmpeg(FfmpegDecoder),
    /// JPEG pictures: libjpeg-turbo, as PIL decodes them.
    Jpeg(JpegDecoder),
}

// SAFETY: the decoders and converter own their FFmpeg contexts and TurboJPEG handle exclusively
// and are only used through `&mut self`; both libraries' contexts may move between threads.
unsafe impl Send for StreamDecoder {}

impl std::fmt::Debug for StreamDecoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamDecoder").field("stream", &self.stream).finish_non_exhaustive()
    }
}

impl StreamDecoder {
    /// Opens a single-threaded decoder for the stream (lake runs many decoders in parallel):
    /// libjpeg-turbo for JPEG pictures (the decoder PIL uses, so the pixels are LeRobot's), FFmpeg
    /// for videos and other pictures.
    ///
    /// # Errors
    /// When FFmpeg has no decoder for the codec or cannot open it.
    pub fn open(config: &StreamConfig) -> Result<Self> {
        let engine = if config.kind == "image" && config.params.codec == "mjpeg" {
            Engine::Jpeg(JpegDecoder::new(&config.params))
        } else {
            Engine::Ffmpeg(FfmpegDecoder::open(config)?)
        };
        let pixels = u64::from(config.params.width) * u64::from(config.params.height);
        Ok(Self { engine, stream: config.stream, pixels })
    }

    /// About the memory this decoder holds between GOPs (after a flush): its context and the
    /// picture buffers its pool keeps. Measured with FFmpeg's libdav1d decoder, single-threaded:
    /// 1.6 MB at 640x480, 0.5 MB at 128x96. A JPEG picture's decompressor lives only while the
    /// picture decodes.
    pub fn idle_bytes(&self) -> u64 {
        match self.engine {
            Engine::Ffmpeg(_) => (448 << 10) + 4 * self.pixels,
            Engine::Jpeg(_) => 0,
        }
    }

    /// Decodes `packets` (`(pts, dts, keyframe flag, bytes)` in decode order, starting at a
    /// keyframe) and returns the frames whose pts is in `wanted`, as RGB (as YUV planes for a
    /// stream whose [`StreamConfig::yuv`] asks for them), in the order of `wanted`.
    ///
    /// Video decoders are drained and flushed after every GOP, ready for the next. Image
    /// decoders put out each picture as soon as they get it (of JPEG pictures, only the wanted
    /// ones are decoded). The keyframe flag matters: FFmpeg's PNG decoder adds the previous
    /// picture to a packet without it.
    ///
    /// # Errors
    /// When the decoder rejects a packet, or a wanted frame does not come out.
    pub fn decode(&mut self, packets: &[(i64, i64, bool, &[u8])], wanted: &[i64]) -> Result<Vec<RgbFrame>> {
        match &mut self.engine {
            Engine::Ffmpeg(d) => d.decode(packets, wanted),
            Engine::Jpeg(d) => wanted.iter().map(|&pts| d.decode(pts, picture(packets, pts)?)).collect(),
        }
    }

    /// [`StreamDecoder::decode`] into place: the frame whose pts is `wanted[i]` is written as RGB
    /// (or YUV planes) into `outs[i]`, which must be exactly its size (`height * width * 3`
    /// bytes, or [`yuv420p_bytes`]). Every
    /// `outs[i]` is written when this returns `Ok`.
    ///
    /// # Errors
    /// As [`StreamDecoder::decode`], and when a frame is not the size of its place.
    pub fn decode_into(&mut self, packets: &[(i64, i64, bool, &[u8])], wanted: &[i64], outs: &mut [&mut [MaybeUninit<u8>]]) -> Result<()> {
        assert_eq!(wanted.len(), outs.len(), "a place for every wanted frame");
        match &mut self.engine {
            Engine::Ffmpeg(d) => d.decode_into(packets, wanted, outs),
            Engine::Jpeg(d) => {
                for (&pts, out) in wanted.iter().zip(outs.iter_mut()) {
                    d.decode_into(pts, picture(packets, pts)?, out)?;
                }
                Ok(())
            }
        }
    }

    /// Sequential decoding of a whole stream: feeds one packet (in decode order) and returns
    /// the frames that came out, as `(pts, RGB)`. Call [`StreamDecoder::finish`] at the end.
    ///
    /// # Errors
    /// When the decoder rejects the packet or fails to decode.
    pub fn feed(&mut self, pts: i64, dts: i64, key: bool, data: &[u8]) -> Result<Vec<(i64, RgbFrame)>> {
        match &mut self.engine {
            Engine::Ffmpeg(d) => d.feed(pts, dts, key, data),
            Engine::Jpeg(d) => Ok(vec![(pts, d.decode(pts, data)?)]),
        }
    }

    /// Ends a sequential decode: drains the frames still inside the decoder and makes it ready
    /// for another stream position.
    ///
    /// # Errors
    /// When FFmpeg fails to drain.
    pub fn finish(&mut self) -> Result<Vec<(i64, RgbFrame)>> {
        match &mut self.engine {
            Engine::Ffmpeg(d) => d.finish(),
            Engine::Jpeg(_) => Ok(Vec::new()),
        }
    }
}

/// The packet of the picture with presentation time `pts` (pictures are packets of their own).
fn picture<'a>(packets: &[(i64, i64, bool, &'a [u8])], pts: i64) -> Result<&'a [u8]> {
    packets.iter().find(|p| p.0 == pts).map(|p| p.3).ok_or_else(|| Error::Decode(format!("no picture with pts {pts} among the packets")))
}

/// A stream FFmpeg decodes, with the conversion to RGB torchcodec makes after it.
struct FfmpegDecoder {
    decoder: ffmpeg::decoder::Video,
    converter: Option<RgbConverter>,
    /// Frames are copied out as planes that convert to RGB this way, instead of converted.
    yuv: Option<YuvToRgb>,
    /// Encoded images: every packet is a picture of its own and comes out at once.
    intra_only: bool,
    /// The colour description the opened decoder had (the stream's), as `(primaries, transfer,
    /// colour space, range)`, and its pixel format (-1 when the stream records none).
    opened_colour: (i32, i32, i32, i32),
    opened_format: i32,
    /// What the decoder was opened from, to open it again.
    config: Box<StreamConfig>,
}

impl FfmpegDecoder {
    fn open(config: &StreamConfig) -> Result<Self> {
        let mut ctx = codec_context(&config.params)?;
        // SAFETY: a context we own, not opened yet.
        unsafe { (*ctx.as_mut_ptr()).thread_count = 1 };
        // Damage fails the frame instead of being concealed (see `receive_all`).
        strict(&mut ctx);
        let decoder = ctx.decoder().video().map_err(ff("opening the decoder"))?;
        let (opened_colour, opened_format) = Self::colour_of(&decoder);
        let intra_only = config.kind == "image";
        Ok(Self { decoder, converter: None, yuv: config.yuv, intra_only, opened_colour, opened_format, config: Box::new(config.clone()) })
    }

    /// The colour description and pixel format `decoder`'s context holds now.
    fn colour_of(decoder: &ffmpeg::decoder::Video) -> ((i32, i32, i32, i32), i32) {
        // SAFETY: the decoder's context, open.
        unsafe {
            let c = decoder.as_ptr();
            (((*c).color_primaries as i32, (*c).color_trc as i32, (*c).colorspace as i32, (*c).color_range as i32), (*c).pix_fmt as i32)
        }
    }

    /// Whether the decoder's colour description or pixel format is no longer one that converts
    /// to RGB as the one it was opened with (see [`reset`](Self::reset)): another matrix or
    /// range for libswscale (an unspecified colour space is BT.601 to it, an unspecified range
    /// limited), or another pixel format.
    fn drifted(&self) -> bool {
        let (colour, format) = Self::colour_of(&self.decoder);
        let converts = |(_, _, space, range): (i32, i32, i32, i32)| {
            // SAFETY: libswscale's table row for a colour space (its default row for one it
            // does not know), four integers.
            let matrix = unsafe { *ffi::sws_getCoefficients(space).cast::<[i32; 4]>() };
            (matrix, range == ffi::AVColorRange::AVCOL_RANGE_JPEG as i32)
        };
        converts(colour) != converts(self.opened_colour) || (self.opened_format >= 0 && format >= 0 && format != self.opened_format)
    }

    /// Makes the decoder ready for a run of packets from another keyframe, as a freshly opened
    /// one would be: its frames dropped, and its colour description the stream's again.
    /// FFmpeg's H.264 decoder takes the colour description from the last sequence header that
    /// had one and keeps it when a later one has none, and a flush keeps it: a reused decoder
    /// that had decoded a part of a stream that says BT.709 would give the frames of a part
    /// that says nothing as BT.709, where a fresh decoder gives them as the stream's. (The pixel
    /// format it chose for a full-range part, yuvj420p, it keeps too: a decoder that drifted
    /// so is opened again.)
    fn reset(&mut self) -> Result<()> {
        self.decoder.flush();
        if !self.drifted() {
            return Ok(());
        }
        let (_, format) = Self::colour_of(&self.decoder);
        if self.opened_format >= 0 && format >= 0 && format != self.opened_format {
            *self = Self::open(&self.config.clone())?;
            return Ok(());
        }
        let (primaries, transfer, space, range) = self.opened_colour;
        // SAFETY: the decoder's context, open and idle (flushed); the values are the ones it
        // had when opened, so valid values of each enum.
        unsafe {
            let c = self.decoder.as_mut_ptr();
            (*c).color_primaries = std::mem::transmute::<i32, ffi::AVColorPrimaries>(primaries);
            (*c).color_trc = std::mem::transmute::<i32, ffi::AVColorTransferCharacteristic>(transfer);
            (*c).colorspace = std::mem::transmute::<i32, ffi::AVColorSpace>(space);
            (*c).color_range = std::mem::transmute::<i32, ffi::AVColorRange>(range);
        }
        Ok(())
    }

    fn decode(&mut self, packets: &[(i64, i64, bool, &[u8])], wanted: &[i64]) -> Result<Vec<RgbFrame>> {
        let mut found: Vec<Option<RgbFrame>> = vec![None; wanted.len()];
        self.decode_each(packets, wanted, |this, i, frame| {
            found[i] = Some(this.convert(frame)?);
            Ok(())
        })?;
        Ok(found.into_iter().map(|f| f.expect("every wanted frame came out")).collect())
    }

    fn decode_into(&mut self, packets: &[(i64, i64, bool, &[u8])], wanted: &[i64], outs: &mut [&mut [MaybeUninit<u8>]]) -> Result<()> {
        self.decode_each(packets, wanted, |this, i, frame| this.convert_into(frame, outs[i]))
    }

    /// Decodes `packets` and hands each frame whose pts is in `wanted` to `put` once, with its
    /// position in `wanted`.
    fn decode_each(
        &mut self,
        packets: &[(i64, i64, bool, &[u8])],
        wanted: &[i64],
        mut put: impl FnMut(&mut Self, usize, &ffmpeg::frame::Video) -> Result<()>,
    ) -> Result<()> {
        let mut done = vec![false; wanted.len()];
        let mut frame = ffmpeg::frame::Video::empty();
        let mut drain = |this: &mut Self, frame: &mut ffmpeg::frame::Video| {
            this.receive_all(frame, |this, frame, pts| {
                for (i, w) in wanted.iter().enumerate() {
                    if *w == pts && !done[i] {
                        put(this, i, frame)?;
                        done[i] = true;
                    }
                }
                Ok(())
            })
        };
        let result = (|| {
            for (pts, dts, key, data) in packets {
                let p = crate::context::packet(data, *pts, *dts, *key);
                self.decoder.send_packet(&p).map_err(|e| Error::Decode(format!("packet pts {pts}: {e}")))?;
                drain(self, &mut frame)?;
            }
            if self.intra_only {
                return Ok(());
            }
            self.decoder.send_eof().map_err(ff("end of stream"))?;
            drain(self, &mut frame)
        })();
        if !self.intra_only {
            self.reset()?;
        }
        result?;
        match done.iter().position(|d| !d) {
            Some(i) => Err(Error::Decode(format!("the frame with pts {} did not come out of the decoder", wanted[i]))),
            None => Ok(()),
        }
    }

    /// Hands every frame the decoder has ready to `each` (with its pts).
    fn receive_all(
        &mut self,
        frame: &mut ffmpeg::frame::Video,
        mut each: impl FnMut(&mut Self, &ffmpeg::frame::Video, i64) -> Result<()>,
    ) -> Result<()> {
        loop {
            match self.decoder.receive_frame(frame) {
                Ok(()) => {
                    let pts = frame.pts().or_else(|| frame.timestamp());
                    // A damaged frame, wanted or one others refer to, is never served.
                    if let Some(why) = frame_damage(frame) {
                        return Err(Error::Decode(match pts {
                            Some(pts) => format!("the frame with pts {pts} ({why})"),
                            None => why,
                        }));
                    }
                    if let Some(pts) = pts {
                        each(self, frame, pts)?;
                    }
                }
                Err(ffmpeg::Error::Other { errno }) if errno == ffmpeg::util::error::EAGAIN => return Ok(()),
                Err(ffmpeg::Error::Eof) => return Ok(()),
                Err(e) => return Err(Error::Decode(format!("decoding: {e}"))),
            }
        }
    }

    fn feed(&mut self, pts: i64, dts: i64, key: bool, data: &[u8]) -> Result<Vec<(i64, RgbFrame)>> {
        // A keyframe begins its GOP as a freshly opened decoder would (see `reset`): a decoder
        // that drifted gives back the frames it holds first.
        let mut out = if key && !self.intra_only && self.drifted() { self.finish()? } else { Vec::new() };
        let p = crate::context::packet(data, pts, dts, key);
        self.decoder.send_packet(&p).map_err(|e| Error::Decode(format!("packet pts {pts}: {e}")))?;
        let mut frame = ffmpeg::frame::Video::empty();
        self.receive_all(&mut frame, |this, frame, pts| {
            out.push((pts, this.convert(frame)?));
            Ok(())
        })?;
        Ok(out)
    }

    fn finish(&mut self) -> Result<Vec<(i64, RgbFrame)>> {
        let mut out = Vec::new();
        if !self.intra_only {
            self.decoder.send_eof().map_err(ff("end of stream"))?;
            let mut frame = ffmpeg::frame::Video::empty();
            self.receive_all(&mut frame, |this, frame, pts| {
                out.push((pts, this.convert(frame)?));
                Ok(())
            })?;
            self.reset()?;
        }
        Ok(out)
    }

    fn converter(&mut self, frame: &ffmpeg::frame::Video) -> Result<&mut RgbConverter> {
        let key = ConverterKey::of(frame);
        if self.converter.as_ref().is_none_or(|c| c.key != key) {
            self.converter = Some(RgbConverter::new(key)?);
        }
        Ok(self.converter.as_mut().expect("converter just set"))
    }

    /// The stream's recorded colour space, and whether its range is full.
    fn recorded(&self) -> (i32, bool) {
        let full = self.opened_colour.3 == ffi::AVColorRange::AVCOL_RANGE_JPEG as i32
            || self.opened_format == ffi::AVPixelFormat::AV_PIX_FMT_YUVJ420P as i32;
        (self.opened_colour.2, full)
    }

    fn convert(&mut self, frame: &ffmpeg::frame::Video) -> Result<RgbFrame> {
        if let Some(yuv) = self.yuv {
            let (w, h) = (frame.width(), frame.height());
            let mut data = Vec::with_capacity(yuv420p_bytes(w, h));
            copy_planes(frame, yuv, self.recorded(), &mut data.spare_capacity_mut()[..yuv420p_bytes(w, h)])?;
            // SAFETY: `copy_planes` wrote every byte.
            unsafe { data.set_len(yuv420p_bytes(w, h)) };
            return Ok(RgbFrame { width: w, height: h, data });
        }
        self.converter(frame)?.convert(frame)
    }

    fn convert_into(&mut self, frame: &ffmpeg::frame::Video, out: &mut [MaybeUninit<u8>]) -> Result<()> {
        match self.yuv {
            Some(yuv) => copy_planes(frame, yuv, self.recorded(), out),
            None => self.converter(frame)?.convert_into(frame, out),
        }
    }
}

/// Copies a decoded 4:2:0 frame's planes into `out` (Y, U, V, each packed), after checking
/// that its pixel format and colour space convert to RGB as `yuv` says, the promise the sample's
/// schema made from the stream's recorded facts (`recorded`: its colour space, and whether its
/// range is full).
fn copy_planes(frame: &ffmpeg::frame::Video, yuv: YuvToRgb, recorded: (i32, bool), out: &mut [MaybeUninit<u8>]) -> Result<()> {
    let key = ConverterKey::of(frame);
    let format = |f: i32| {
        // SAFETY: FFmpeg's name of a pixel format value, or null.
        let name = unsafe { ffi::av_get_pix_fmt_name(std::mem::transmute::<i32, ffi::AVPixelFormat>(f)) };
        if name.is_null() {
            format!("pixel format {f}")
        } else {
            // SAFETY: a NUL-terminated static string.
            unsafe { std::ffi::CStr::from_ptr(name) }.to_string_lossy().into_owned()
        }
    };
    let full = match key.format {
        f if f == ffi::AVPixelFormat::AV_PIX_FMT_YUV420P as i32 => false,
        f if f == ffi::AVPixelFormat::AV_PIX_FMT_YUVJ420P as i32 => true,
        other => {
            return Err(Error::Decode(format!(
                "the frame decodes as {}, not as the 8-bit 4:2:0 the stream records; yuv420p frames cannot be served from it, ask for rgb24",
                format(other)
            )));
        }
    };
    if YuvToRgb::for_colorspace(key.colorspace, full) != yuv {
        let name = |space: i32, full: bool| {
            // SAFETY: FFmpeg's name of a colour space value, or null.
            let name = unsafe { ffi::av_color_space_name(std::mem::transmute::<i32, ffi::AVColorSpace>(space)) };
            let range = if full { "full" } else { "limited" };
            if name.is_null() {
                format!("colour space {space}, {range} range")
            } else {
                // SAFETY: a NUL-terminated static string.
                format!("colour space {}, {range} range", unsafe { std::ffi::CStr::from_ptr(name) }.to_string_lossy())
            }
        };
        return Err(Error::Decode(format!(
            "the frame decodes in {}, which converts to RGB otherwise than what ingest recorded for the stream ({}); yuv420p \
             frames cannot be served from it, ask for rgb24",
            name(key.colorspace, full),
            name(recorded.0, recorded.1)
        )));
    }
    let (w, h) = (key.width as usize, key.height as usize);
    if out.len() != yuv420p_bytes(key.width as u32, key.height as u32) {
        return Err(Error::Decode(format!("a {w}x{h} frame where {} bytes of YUV planes were expected", out.len())));
    }
    let (cw, ch) = (w.div_ceil(2), h.div_ceil(2));
    let (luma, chroma) = out.split_at_mut(w * h);
    let (u, v) = chroma.split_at_mut(cw * ch);
    copy_rows(frame.data(0), frame.stride(0), luma, w, h);
    copy_rows(frame.data(1), frame.stride(1), u, cw, ch);
    copy_rows(frame.data(2), frame.stride(2), v, cw, ch);
    Ok(())
}

/// JPEG pictures of `image` features, decoded the way LeRobot reads them. LeRobot's parquet
/// reader (Hugging Face `datasets`) opens pictures with PIL, and PIL decodes JPEG with
/// libjpeg-turbo's defaults: the accurate integer IDCT, "fancy" (smooth) chroma upsampling and
/// libjpeg's own YCbCr to RGB arithmetic. FFmpeg's JPEG decoder and swscale round differently
/// (up to 29 levels apart on 4:2:0 pictures), so lake calls libjpeg-turbo through TurboJPEG with
/// no flags, which makes the same choices; the bytes are PIL's, also across libjpeg-turbo 2.1
/// (Debian's) and 3.x (PIL's wheels). Greyscale pictures come out as three equal channels.
///
/// Hugging Face `datasets` turns a picture upright by its EXIF orientation
/// (`ImageOps.exif_transpose`) before LeRobot sees it, and so does lake: the stream's size is
/// the size shown.
///
/// As PIL opens every picture afresh, each picture gets a decompressor of its own: libjpeg keeps
/// a picture's Huffman and quantisation tables for the next one, which would decode a picture
/// without tables (as cameras' MJPEG frames are) with its predecessor's, and a failure would
/// leave the next picture a decompressor half way through a header.
struct JpegDecoder {
    /// The stream's picture size (ingest checked that every picture has it).
    size: (usize, usize),
}

/// A TurboJPEG decompressor, for one picture.
struct TurboJpeg(tj::tjhandle);

impl Drop for TurboJpeg {
    fn drop(&mut self) {
        // SAFETY: the handle came from tjInitDecompress and is destroyed once, here.
        unsafe { tj::tjDestroy(self.0) };
    }
}

/// The beginnings of libjpeg's warnings (`JWRN_*`): a picture that only drew these is whole, and
/// PIL takes it. A truncated file ("Premature end of JPEG file") is not among them: PIL refuses
/// it, and so does lake (ingest already refuses pictures that do not end with their end marker).
const LIBJPEG_WARNINGS: [&str; 6] = [
    "Corrupt JPEG data: ",
    "Unknown Adobe color transform code",
    "Inconsistent progression sequence",
    "Warning: unknown JFIF revision",
    "Invalid SOS parameters for sequential JPEG",
    "Application transferred too many scanlines",
];

impl JpegDecoder {
    fn new(params: &CodecParams) -> Self {
        Self { size: (params.width as usize, params.height as usize) }
    }

    fn decode(&mut self, pts: i64, data: &[u8]) -> Result<RgbFrame> {
        let (w, h) = self.size;
        let mut frame = vec![0u8; w * h * 3];
        self.decompress(pts, data, &mut frame)?;
        Ok(RgbFrame { width: w as u32, height: h as u32, data: frame })
    }

    /// Decodes the picture into `out`, which must be exactly its `height * width * 3` bytes; all
    /// of them are written when this returns `Ok`.
    fn decode_into(&mut self, pts: i64, data: &[u8], out: &mut [MaybeUninit<u8>]) -> Result<()> {
        // Zeroed first: every byte is initialised whatever libjpeg writes.
        out.fill(MaybeUninit::new(0));
        // SAFETY: every byte was just initialised; `u8` and `MaybeUninit<u8>` share a layout.
        let out = unsafe { &mut *(std::ptr::from_mut(out) as *mut [u8]) };
        self.decompress(pts, data, out)
    }

    /// Decodes a picture into `out` (the stream's size, as shown: its EXIF orientation applied,
    /// as LeRobot's reader applies it).
    fn decompress(&mut self, pts: i64, data: &[u8], out: &mut [u8]) -> Result<()> {
        let header = picture::jpeg_header(data).map_err(|why| Error::Decode(format!("JPEG picture pts {pts}: {why}")))?;
        if let Some(why) = header.unsupported() {
            return Err(Error::Decode(format!("JPEG picture pts {pts}: {why}")));
        }
        let (sw, sh) = header.shown_size();
        let (w, h) = self.size;
        if (sw as usize, sh as usize) != (w, h) {
            return Err(Error::Decode(format!("JPEG picture pts {pts} is {sw}x{sh}, where this stream's pictures are {w}x{h}")));
        }
        if out.len() != w * h * 3 {
            return Err(Error::Decode(format!("a {w}x{h} picture where {} bytes of RGB were expected", out.len())));
        }
        let stored = (header.width as usize, header.height as usize);
        if header.orientation == 1 {
            return turbojpeg_rgb(pts, data, stored, out);
        }
        let mut upright = vec![0u8; out.len()];
        turbojpeg_rgb(pts, data, stored, &mut upright)?;
        orient(&upright, stored, header.orientation, out);
        Ok(())
    }
}

/// Decodes a JPEG picture of `(w, h)` (as stored) into `out`, `h` rows of `w * 3` bytes, with a
/// decompressor of its own.
pub(crate) fn turbojpeg_rgb(pts: i64, data: &[u8], (w, h): (usize, usize), out: &mut [u8]) -> Result<()> {
    assert_eq!(out.len(), w * h * 3, "room for the picture");
    // SAFETY: a plain constructor; null means failure.
    let handle = TurboJpeg(unsafe { tj::tjInitDecompress() });
    if handle.0.is_null() {
        return Err(Error::Decode("libjpeg-turbo could not make a decompressor".into()));
    }
    // SAFETY: `out` holds h rows of w * 3 bytes (asserted above), the size the picture decodes to
    // at scale 1 (its header says so); `data` is read within its length.
    let rc = unsafe {
        tj::tjDecompress2(
            handle.0,
            data.as_ptr(),
            data.len() as std::ffi::c_ulong,
            out.as_mut_ptr(),
            w as std::ffi::c_int,
            (w * 3) as std::ffi::c_int,
            h as std::ffi::c_int,
            tj::TJPF_TJPF_RGB as std::ffi::c_int,
            0,
        )
    };
    if rc == 0 {
        return Ok(());
    }
    // SAFETY: queries of a valid handle; the message is copied before the handle goes.
    let (warned, message) = unsafe {
        let code = tj::tjGetErrorCode(handle.0);
        (
            code == tj::TJERR_TJERR_WARNING as std::ffi::c_int,
            std::ffi::CStr::from_ptr(tj::tjGetErrorStr2(handle.0)).to_string_lossy().into_owned(),
        )
    };
    // TurboJPEG says "warning" for a call that warned at all, also when an error followed;
    // its message is then the error's (libjpeg keeps the first warning's text otherwise).
    if warned && LIBJPEG_WARNINGS.iter().any(|w| message.starts_with(w)) {
        return Ok(());
    }
    Err(Error::Decode(format!("JPEG picture pts {pts}: {message}")))
}

/// Turns an RGB picture stored `(w, h)` upright by its EXIF orientation, as PIL's
/// `ImageOps.exif_transpose` does: 2 mirrored, 3 half a turn, 4 flipped, 5 transposed, 6 a
/// quarter turn clockwise, 7 transversed, 8 a quarter turn anticlockwise (5 to 8 swap width and
/// height).
fn orient(src: &[u8], (w, h): (usize, usize), orientation: u8, out: &mut [u8]) {
    // Where the source pixel of output (y, x) is, per orientation (chosen once, not per pixel).
    let source: fn(usize, usize, usize, usize) -> (usize, usize) = match orientation {
        2 => |y, x, w, _| (y, w - 1 - x),
        3 => |y, x, w, h| (h - 1 - y, w - 1 - x),
        4 => |y, x, _, h| (h - 1 - y, x),
        5 => |y, x, _, _| (x, y),
        6 => |y, x, _, h| (h - 1 - x, y),
        7 => |y, x, w, h| (h - 1 - x, w - 1 - y),
        8 => |y, x, w, _| (x, w - 1 - y),
        _ => |y, x, _, _| (y, x),
    };
    let width = if orientation >= 5 { h } else { w };
    for (y, row) in out.chunks_exact_mut(width * 3).enumerate() {
        for (x, pixel) in row.chunks_exact_mut(3).enumerate() {
            let (sy, sx) = source(y, x, w, h);
            let at = (sy * w + sx) * 3;
            pixel.copy_from_slice(&src[at..at + 3]);
        }
    }
}

/// What a converter was built for; a change (mid-stream resize) builds a new one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ConverterKey {
    width: i32,
    height: i32,
    format: i32,
    colorspace: i32,
    sar: (i32, i32),
}

impl ConverterKey {
    fn of(frame: &ffmpeg::frame::Video) -> Self {
        // SAFETY: reads of plain fields of a valid frame.
        unsafe {
            let f = frame.as_ptr();
            Self {
                width: (*f).width,
                height: (*f).height,
                format: (*f).format,
                colorspace: (*f).colorspace as i32,
                sar: ((*f).sample_aspect_ratio.num, (*f).sample_aspect_ratio.den),
            }
        }
    }
}

/// Converts decoded frames to packed RGB24 exactly as torchcodec's CPU device does.
pub struct RgbConverter {
    key: ConverterKey,
    how: Conversion,
}

enum Conversion {
    /// A frame that is RGB24 already (decoded PNGs): copied row by row.
    Copy,
    Swscale(*mut ffi::SwsContext),
    Graph(Box<ffmpeg::filter::Graph>),
}

impl Drop for RgbConverter {
    fn drop(&mut self) {
        if let Conversion::Swscale(ctx) = self.how {
            // SAFETY: the context was made by sws_getContext and is freed once, here.
            unsafe { ffi::sws_freeContext(ctx) };
        }
    }
}

impl RgbConverter {
    /// A converter for frames like `frame` (size, pixel format, colour space).
    ///
    /// # Errors
    /// When swscale or libavfilter cannot convert that pixel format.
    pub fn for_frame(frame: &ffmpeg::frame::Video) -> Result<Self> {
        Self::new(ConverterKey::of(frame))
    }

    fn new(key: ConverterKey) -> Result<Self> {
        let rgb24 = ffi::AVPixelFormat::AV_PIX_FMT_RGB24 as i32;
        if key.format == rgb24 {
            return Ok(Self { key, how: Conversion::Copy });
        }
        if key.width % 32 == 0 { Self::swscale(key) } else { Self::graph(key) }
    }

    fn swscale(key: ConverterKey) -> Result<Self> {
        // SAFETY: `ConverterKey::format` holds an `AVPixelFormat` value read from a frame.
        let format = unsafe { std::mem::transmute::<i32, ffi::AVPixelFormat>(key.format) };
        let ctx = crate::pixels::rgb24_context(format, key.width, key.height, key.colorspace, None);
        if ctx.is_null() {
            return Err(Error::Decode(format!("swscale cannot convert pixel format {} to rgb24", key.format)));
        }
        Ok(Self { key, how: Conversion::Swscale(ctx) })
    }

    fn graph(key: ConverterKey) -> Result<Self> {
        let mut graph = ffmpeg::filter::Graph::new();
        let (sar_num, sar_den) = if key.sar.1 == 0 { (0, 1) } else { key.sar };
        let args = format!("video_size={}x{}:pix_fmt={}:time_base=1/1:pixel_aspect={sar_num}/{sar_den}", key.width, key.height, key.format);
        let buffer = ffmpeg::filter::find("buffer").ok_or_else(|| Error::Decode("libavfilter has no `buffer` filter".into()))?;
        let sink = ffmpeg::filter::find("buffersink").ok_or_else(|| Error::Decode("libavfilter has no `buffersink` filter".into()))?;
        graph.add(&buffer, "in", &args).map_err(ff("filter graph source"))?;
        graph.add(&sink, "out", "").map_err(ff("filter graph sink"))?;
        graph.get("out").expect("sink just added").set_pixel_format(ffmpeg::format::Pixel::RGB24);
        let spec = format!("scale={}:{}:sws_flags=bilinear", key.width, key.height);
        graph.output("in", 0).and_then(|p| p.input("out", 0)).and_then(|p| p.parse(&spec)).map_err(ff("filter graph"))?;
        graph.validate().map_err(ff("filter graph"))?;
        Ok(Self { key, how: Conversion::Graph(Box::new(graph)) })
    }

    /// Whether this converter is the one for `frame` (its size, pixel format and colour
    /// description).
    #[must_use]
    pub fn converts(&self, frame: &ffmpeg::frame::Video) -> bool {
        self.key == ConverterKey::of(frame)
    }

    /// Converts `frame` (of the size and format this converter was made for) to RGB24.
    ///
    /// # Errors
    /// When FFmpeg fails.
    pub fn convert(&mut self, frame: &ffmpeg::frame::Video) -> Result<RgbFrame> {
        let (w, h) = (self.key.width as usize, self.key.height as usize);
        // Every byte is written by `convert_into`, so the frame is not zeroed first.
        let mut data = Vec::with_capacity(w * h * 3);
        self.convert_into(frame, &mut data.spare_capacity_mut()[..w * h * 3])?;
        // SAFETY: `convert_into` wrote all `w * h * 3` bytes.
        unsafe { data.set_len(w * h * 3) };
        Ok(RgbFrame { width: w as u32, height: h as u32, data })
    }

    /// Converts `frame` to RGB24 into `out`, which must hold exactly its `height * width * 3`
    /// bytes; all of them are written when this returns `Ok`.
    ///
    /// # Errors
    /// When `out` is not the frame's size, or FFmpeg fails.
    pub fn convert_into(&mut self, frame: &ffmpeg::frame::Video, out: &mut [MaybeUninit<u8>]) -> Result<()> {
        let (w, h) = (self.key.width as usize, self.key.height as usize);
        if out.len() != w * h * 3 {
            return Err(Error::Decode(format!("a {w}x{h} frame where {} bytes of RGB were expected", out.len())));
        }
        match &mut self.how {
            Conversion::Copy => copy_rows(frame.data(0), frame.stride(0), out, w * 3, h),
            Conversion::Swscale(ctx) => {
                let dst = [out.as_mut_ptr().cast::<u8>(), std::ptr::null_mut(), std::ptr::null_mut(), std::ptr::null_mut()];
                let dst_stride = [(w * 3) as i32, 0, 0, 0];
                // SAFETY: the source planes and strides come from a decoded frame of the size
                // and format the context was made for; the destination holds h rows of w*3.
                let rows = unsafe {
                    let f = frame.as_ptr();
                    ffi::sws_scale(*ctx, (*f).data.as_ptr().cast(), (*f).linesize.as_ptr(), 0, h as i32, dst.as_ptr(), dst_stride.as_ptr())
                };
                if rows != h as i32 {
                    return Err(Error::Decode(format!("swscale produced {rows} rows of {h}")));
                }
            }
            Conversion::Graph(graph) => {
                graph.get("in").expect("source").source().add(frame).map_err(ff("filter graph input"))?;
                let mut converted = ffmpeg::frame::Video::empty();
                graph.get("out").expect("sink").sink().frame(&mut converted).map_err(ff("filter graph output"))?;
                copy_rows(converted.data(0), converted.stride(0), out, w * 3, h);
            }
        }
        Ok(())
    }
}

/// Resizes packed RGB24 frames with swscale's area averaging (each output pixel the mean of the
/// input pixels it covers; bilinear when enlarging), for frame tables stored at another size.
pub struct RgbResizer {
    ctx: *mut ffi::SwsContext,
    from: (u32, u32),
    to: (u32, u32),
}

impl Drop for RgbResizer {
    fn drop(&mut self) {
        // SAFETY: the context was made by sws_getContext and is freed once, here.
        unsafe { ffi::sws_freeContext(self.ctx) };
    }
}

impl RgbResizer {
    /// A resizer of `(width, height)` RGB24 frames to `to`.
    ///
    /// # Errors
    /// When swscale cannot scale between those sizes.
    pub fn new(from: (u32, u32), to: (u32, u32)) -> Result<Self> {
        let rgb24 = ffi::AVPixelFormat::AV_PIX_FMT_RGB24;
        let size = |v: u32| i32::try_from(v).map_err(|_| Error::Decode(format!("a frame size of {v} pixels")));
        // SAFETY: a plain constructor call; a null result is an error.
        let ctx = unsafe {
            ffi::sws_getContext(
                size(from.0)?,
                size(from.1)?,
                rgb24,
                size(to.0)?,
                size(to.1)?,
                rgb24,
                ffi::SWS_AREA,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null(),
            )
        };
        if ctx.is_null() {
            return Err(Error::Decode(format!("swscale cannot resize {}x{} frames to {}x{}", from.0, from.1, to.0, to.1)));
        }
        Ok(Self { ctx, from, to })
    }

    /// `rgb` (a frame of the size this resizer was made for) at the new size.
    ///
    /// # Errors
    /// When `rgb` is not a frame of that size, or swscale fails.
    pub fn resize(&mut self, rgb: &[u8]) -> Result<Vec<u8>> {
        let ((w, h), (tw, th)) = ((self.from.0 as usize, self.from.1 as usize), (self.to.0 as usize, self.to.1 as usize));
        if rgb.len() != w * h * 3 {
            return Err(Error::Decode(format!("a frame of {} bytes, not {w}x{h} RGB", rgb.len())));
        }
        let mut out = Vec::with_capacity(tw * th * 3);
        let dst = [out.spare_capacity_mut().as_mut_ptr().cast::<u8>(), std::ptr::null_mut(), std::ptr::null_mut(), std::ptr::null_mut()];
        let src = [rgb.as_ptr(), std::ptr::null(), std::ptr::null(), std::ptr::null()];
        let (src_stride, dst_stride) = ([(w * 3) as i32, 0, 0, 0], [(tw * 3) as i32, 0, 0, 0]);
        // SAFETY: the source is h rows of w*3 bytes (checked above), the destination has room
        // for th rows of tw*3 bytes, and the context scales exactly these sizes.
        let rows = unsafe { ffi::sws_scale(self.ctx, src.as_ptr(), src_stride.as_ptr(), 0, h as i32, dst.as_ptr(), dst_stride.as_ptr()) };
        if rows != th as i32 {
            return Err(Error::Decode(format!("swscale produced {rows} rows of {th}")));
        }
        // SAFETY: swscale wrote all `th` rows of `tw * 3` bytes.
        unsafe { out.set_len(tw * th * 3) };
        Ok(out)
    }
}

fn copy_rows(src: &[u8], stride: usize, dst: &mut [MaybeUninit<u8>], row: usize, rows: usize) {
    for (y, out) in dst.chunks_exact_mut(row).take(rows).enumerate() {
        out.write_copy_of_slice(&src[y * stride..y * stride + row]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `w`x`h` picture of `format` pixels (`channels` bytes each) encoded by libjpeg-turbo.
    fn encode(pixels: &[u8], size: (usize, usize), format: tj::TJPF, subsampling: tj::TJSAMP) -> Vec<u8> {
        crate::jpeg::compress(pixels, size, format, subsampling, 80).expect("compressed")
    }

    fn scene((w, h): (usize, usize), channels: usize) -> Vec<u8> {
        (0..w * h * channels).map(|i| ((i * 7 + i / (w * channels) * 13) % 251) as u8).collect()
    }

    fn jpeg_stream((w, h): (usize, usize)) -> StreamDecoder {
        let params = CodecParams { codec: "mjpeg".into(), width: w as u32, height: h as u32, ..CodecParams::default() };
        let decoder =
            StreamDecoder::open(&StreamConfig { stream: 3, camera: "cam".into(), kind: "image".into(), params, yuv: None }).expect("open");
        assert!(matches!(decoder.engine, Engine::Jpeg(_)), "JPEG pictures are decoded by libjpeg-turbo");
        decoder
    }

    #[test]
    fn jpeg_pictures_come_out_where_they_are_wanted() {
        let size = (37, 21);
        let a = encode(&scene(size, 3), size, tj::TJPF_TJPF_RGB, tj::TJSAMP_TJSAMP_420);
        let b = encode(&scene(size, 3).iter().map(|v| 255 - v).collect::<Vec<_>>(), size, tj::TJPF_TJPF_RGB, tj::TJSAMP_TJSAMP_444);
        let mut d = jpeg_stream(size);
        let packets = [(0, 0, true, a.as_slice()), (1, 1, true, b.as_slice())];
        let frames = d.decode(&packets, &[1, 0, 1]).expect("decode");
        assert_eq!(frames.len(), 3);
        assert!(frames.iter().all(|f| (f.width, f.height, f.data.len()) == (37, 21, 37 * 21 * 3)));
        assert_eq!(frames[0], frames[2]);
        assert_ne!(frames[0], frames[1]);
        // Sequential decoding and decoding into place give the same bytes.
        assert_eq!(d.feed(0, 0, true, &a).expect("feed"), vec![(0, frames[1].clone())]);
        assert!(d.finish().expect("finish").is_empty());
        let mut place = vec![MaybeUninit::new(0u8); 37 * 21 * 3];
        d.decode_into(&packets, &[1], &mut [&mut place]).expect("into");
        assert!(place.iter().zip(&frames[0].data).all(|(p, f)| unsafe { p.assume_init() } == *f));
        // A place of another size, or a picture not among the packets, is an error.
        let mut small = vec![MaybeUninit::new(0u8); 10];
        let e = d.decode_into(&packets, &[0], &mut [&mut small]).expect_err("wrong size");
        assert!(e.to_string().contains("a 37x21 picture where 10 bytes"), "{e}");
        let e = d.decode(&packets, &[2]).expect_err("no such picture");
        assert_eq!(e.to_string(), "no picture with pts 2 among the packets");
        // Greyscale pictures come out as three equal channels.
        let grey = encode(&scene(size, 1), size, tj::TJPF_TJPF_GRAY, tj::TJSAMP_TJSAMP_GRAY);
        let frame = d.decode(&[(5, 5, true, grey.as_slice())], &[5]).expect("grey").remove(0);
        assert!(frame.data.chunks(3).all(|p| p[0] == p[1] && p[1] == p[2]));
    }

    /// `jpeg` with an EXIF segment saying `orientation` right after its start marker.
    fn with_orientation(jpeg: &[u8], orientation: u16) -> Vec<u8> {
        let mut tiff = b"MM\0\x2A\0\0\0\x08\0\x01\x01\x12\0\x03\0\0\0\x01".to_vec();
        tiff.extend_from_slice(&orientation.to_be_bytes());
        tiff.extend_from_slice(&[0, 0, 0, 0, 0, 0]);
        let mut out = jpeg[..2].to_vec();
        out.extend_from_slice(&[0xFF, 0xE1]);
        out.extend_from_slice(&((2 + 6 + tiff.len()) as u16).to_be_bytes());
        out.extend_from_slice(b"Exif\0\0");
        out.extend_from_slice(&tiff);
        out.extend_from_slice(&jpeg[2..]);
        out
    }

    #[test]
    fn exif_orientation_turns_pictures_as_lerobots_reader_does() {
        let (w, h) = (5, 3);
        let jpeg = encode(&scene((w, h), 3), (w, h), tj::TJPF_TJPF_RGB, tj::TJSAMP_TJSAMP_444);
        let upright = jpeg_stream((w, h)).decode(&[(0, 0, true, jpeg.as_slice())], &[0]).expect("plain").remove(0).data;
        let at = |y: usize, x: usize| &upright[(y * w + x) * 3..(y * w + x) * 3 + 3];
        // Orientation 6: a quarter turn clockwise, 3x5 shown; 3: half a turn; 1: as stored.
        let turned = jpeg_stream((h, w)).decode(&[(0, 0, true, with_orientation(&jpeg, 6).as_slice())], &[0]).expect("6").remove(0);
        assert_eq!((turned.width, turned.height), (3, 5));
        for y in 0..w {
            for x in 0..h {
                assert_eq!(&turned.data[(y * h + x) * 3..(y * h + x) * 3 + 3], at(h - 1 - x, y), "({y}, {x})");
            }
        }
        let half = jpeg_stream((w, h)).decode(&[(0, 0, true, with_orientation(&jpeg, 3).as_slice())], &[0]).expect("3").remove(0);
        assert_eq!(&half.data[..3], at(h - 1, w - 1));
        let same = jpeg_stream((w, h)).decode(&[(0, 0, true, with_orientation(&jpeg, 1).as_slice())], &[0]).expect("1").remove(0);
        assert_eq!(same.data, upright);
        // The stream's size is the shown one: a turned picture in a stream of the stored size is
        // another size.
        let e = jpeg_stream((w, h)).decode(&[(2, 2, true, with_orientation(&jpeg, 8).as_slice())], &[2]).expect_err("size");
        assert_eq!(e.to_string(), "JPEG picture pts 2 is 3x5, where this stream's pictures are 5x3");
    }

    #[test]
    fn libjpeg_warnings_keep_the_picture_as_pil_does() {
        let size = (64, 48);
        let clean = encode(&scene(size, 3), size, tj::TJPF_TJPF_RGB, tj::TJSAMP_TJSAMP_420);
        assert_eq!(&clean[clean.len() - 2..], &[0xFF, 0xD9]);
        // Bytes between the last entropy-coded data and the end marker: libjpeg warns
        // ("extraneous bytes before marker") and decodes the picture in full.
        let mut noisy = clean[..clean.len() - 2].to_vec();
        noisy.extend_from_slice(&[0x12, 0x34, 0x56, 0xFF, 0xD9]);
        let mut d = jpeg_stream(size);
        let want = d.decode(&[(0, 0, true, clean.as_slice())], &[0]).expect("clean");
        assert_eq!(d.decode(&[(0, 0, true, noisy.as_slice())], &[0]).expect("warned only"), want);
    }

    #[test]
    fn damaged_and_cmyk_pictures_are_errors_naming_the_picture() {
        let size = (16, 16);
        let mut d = jpeg_stream(size);
        let e = d.decode(&[(7, 7, true, b"\xFF\xD8 not a picture".as_slice())], &[7]).expect_err("garbage");
        assert!(e.to_string().starts_with("JPEG picture pts 7: ") && e.to_string().len() > 24, "{e}");
        let cmyk = encode(&scene(size, 4), size, tj::TJPF_TJPF_CMYK, tj::TJSAMP_TJSAMP_444);
        let e = d.decode(&[(9, 9, true, cmyk.as_slice())], &[9]).expect_err("cmyk");
        assert_eq!(
            e.to_string(),
            "JPEG picture pts 9: the JPEG picture is CMYK: LeRobot reads it as 4 channels, and lake's camera columns are RGB"
        );
        // A warning (bytes before the scan's marker) followed by an error (the scan names a
        // Huffman table no segment defines) is an error, not a picture.
        let good = encode(&scene(size, 3), size, tj::TJPF_TJPF_RGB, tj::TJSAMP_TJSAMP_420);
        let sos = good.windows(2).position(|m| m == [0xFF, 0xDA]).expect("scan header");
        let mut broken = good[..sos].to_vec();
        broken.extend_from_slice(&[0x01, 0x02, 0x03]);
        broken.extend_from_slice(&good[sos..]);
        let first_component = sos + 3 + 4 + 1 + 1;
        assert_eq!(broken[first_component], 0x00, "luma uses tables 0/0");
        broken[first_component] = 0x33;
        let e = d.decode(&[(4, 4, true, broken.as_slice())], &[4]).expect_err("warned, then failed");
        assert!(e.to_string().starts_with("JPEG picture pts 4: ") && e.to_string().contains("Huffman table"), "{e}");
        // A picture of another size than the stream's is refused before anything is made for it.
        let big = encode(&scene((32, 16), 3), (32, 16), tj::TJPF_TJPF_RGB, tj::TJSAMP_TJSAMP_420);
        let e = d.decode(&[(6, 6, true, big.as_slice())], &[6]).expect_err("other size");
        assert_eq!(e.to_string(), "JPEG picture pts 6 is 32x16, where this stream's pictures are 16x16");
        // The decoder is still good for the next picture.
        assert_eq!(d.decode(&[(1, 1, true, good.as_slice())], &[1]).expect("good").len(), 1);
    }
}
