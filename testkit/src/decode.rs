//! A reference decoder: every frame of a file in order, and single frames rebuilt from packet
//! rows, hashed over their raw planes so the two can be compared exactly.

use std::path::Path;

use lake_codec::ffmpeg::{self, ffi};

/// BLAKE3 of a decoded picture's planes (tightly packed, as `av_image_copy_to_buffer` lays
/// them out).
pub type FrameHash = [u8; 32];

fn hash_frame(frame: &ffmpeg::frame::Video) -> FrameHash {
    // SAFETY: the frame is a valid decoded picture; the buffer is sized by FFmpeg for it.
    unsafe {
        let f = frame.as_ptr();
        let format: ffi::AVPixelFormat = std::mem::transmute((*f).format);
        let size = ffi::av_image_get_buffer_size(format, (*f).width, (*f).height, 1);
        assert!(size > 0, "unknown picture layout");
        let mut buf = vec![0u8; size as usize];
        let n = ffi::av_image_copy_to_buffer(
            buf.as_mut_ptr(),
            size,
            (*f).data.as_ptr() as *const *const u8,
            (*f).linesize.as_ptr(),
            format,
            (*f).width,
            (*f).height,
            1,
        );
        assert!(n == size, "copying the picture failed");
        *blake3::hash(&buf).as_bytes()
    }
}

fn drain(decoder: &mut ffmpeg::decoder::Video, out: &mut Vec<(i64, FrameHash)>) {
    let mut frame = ffmpeg::frame::Video::empty();
    while decoder.receive_frame(&mut frame).is_ok() {
        let pts = frame.pts().or(frame.timestamp()).expect("decoded frames carry a pts");
        out.push((pts, hash_frame(&frame)));
    }
}

/// Decodes every frame of the first video stream of `path` in order, handing each (with its
/// pts) to `each` as it comes out of the decoder.
///
/// # Panics
/// When the file cannot be opened or decoded.
fn for_each_frame(path: &Path, mut each: impl FnMut(i64, &ffmpeg::frame::Video)) {
    lake_codec::init_ffmpeg();
    let mut input = ffmpeg::format::input(path).unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    let stream = input.streams().best(ffmpeg::media::Type::Video).expect("video stream");
    let index = stream.index();
    let ctx = ffmpeg::codec::Context::from_parameters(stream.parameters()).expect("decoder context");
    let mut decoder = ctx.decoder().video().expect("video decoder");
    let mut frame = ffmpeg::frame::Video::empty();
    let mut drain = |decoder: &mut ffmpeg::decoder::Video| {
        while decoder.receive_frame(&mut frame).is_ok() {
            each(frame.pts().or(frame.timestamp()).expect("decoded frames carry a pts"), &frame);
        }
    };
    for (s, packet) in input.packets() {
        if s.index() == index {
            decoder.send_packet(&packet).unwrap_or_else(|e| panic!("decode {}: {e}", path.display()));
            drain(&mut decoder);
        }
    }
    decoder.send_eof().expect("eof");
    drain(&mut decoder);
}

/// Decodes every frame of the first video stream of `path`, in presentation order of output:
/// `(pts, hash)` per frame.
///
/// # Panics
/// When the file cannot be opened or decoded.
pub fn sequential_frames(path: &Path) -> Vec<(i64, FrameHash)> {
    let mut out = Vec::new();
    for_each_frame(path, |pts, frame| out.push((pts, hash_frame(frame))));
    out
}

/// Decodes every frame of the first video stream of `path` in order and converts each to RGB
/// the way the loader does (in the frame's own colour space, where a stream changes it):
/// `(pts, RGB24 bytes)` per frame, in output order.
///
/// # Panics
/// When the file cannot be opened or decoded.
pub fn sequential_rgb(path: &Path) -> Vec<(i64, Vec<u8>)> {
    let mut converter: Option<lake_codec::RgbConverter> = None;
    let mut out = Vec::new();
    for_each_frame(path, |pts, frame| {
        if converter.as_ref().is_none_or(|c| !c.converts(frame)) {
            converter = Some(lake_codec::RgbConverter::for_frame(frame).expect("converter"));
        }
        let conv = converter.as_mut().expect("made");
        out.push((pts, conv.convert(frame).expect("convert").data));
    });
    out
}

/// Rebuilds single frames from packet rows, the way a loader does: a decoder made from the
/// stored codec facts, fed the packets from the keyframe to the frame, then drained.
pub struct PacketDecoder {
    decoder: ffmpeg::decoder::Video,
}

impl PacketDecoder {
    /// A decoder for `codec` (FFmpeg's codec name) with the stream's extradata.
    ///
    /// # Panics
    /// When FFmpeg has no decoder for the codec.
    pub fn new(codec: &str, extradata: Option<&[u8]>, width: u32, height: u32) -> Self {
        let params = lake_schemas::CodecParams {
            codec: codec.into(),
            extradata: extradata.map(<[u8]>::to_vec),
            width,
            height,
            ..lake_schemas::CodecParams::default()
        };
        let ctx = lake_codec::codec_context(&params).unwrap_or_else(|e| panic!("a decoder for {codec}: {e}"));
        Self { decoder: ctx.decoder().video().expect("open decoder") }
    }

    /// Decodes `packets` (`(pts, dts, bytes)` in decode order, starting at a keyframe) and
    /// returns the hash of the frame whose pts is `want`, if it came out.
    pub fn decode(&mut self, packets: &[(i64, i64, &[u8])], want: i64) -> Option<FrameHash> {
        let mut out = Vec::new();
        for (pts, dts, data) in packets {
            let mut p = ffmpeg::Packet::copy(data);
            p.set_pts(Some(*pts));
            p.set_dts(Some(*dts));
            if self.decoder.send_packet(&p).is_err() {
                return None;
            }
            drain(&mut self.decoder, &mut out);
        }
        let _ = self.decoder.send_eof();
        drain(&mut self.decoder, &mut out);
        self.decoder.flush();
        out.into_iter().find(|(pts, _)| *pts == want).map(|(_, h)| h)
    }
}
