//! Re-encoding a camera's frames into a stream built for random access (a training proxy):
//! H.264 (libx264) or HEVC (libx265), every GOP closed and exactly `gop` frames long, no
//! B-frames (decode order is presentation order), parameter sets repeated at every keyframe
//! (any keyframe starts a decoder), BT.601 limited-range 4:2:0.

use ffmpeg_next::{self as ffmpeg, ffi};
use lake_schemas::CodecParams;

use crate::{Error, Result};

/// The codecs a proxy is encoded with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProxyCodec {
    /// H.264 through libx264: NVDEC decodes it on every NVIDIA GPU.
    H264,
    /// HEVC through libx265: smaller at the same quality, NVDEC since Maxwell (2nd generation).
    Hevc,
}

impl ProxyCodec {
    /// FFmpeg's name of the codec (`h264`, `hevc`), as streams record it.
    pub fn name(self) -> &'static str {
        match self {
            Self::H264 => "h264",
            Self::Hevc => "hevc",
        }
    }

    fn encoder(self) -> &'static str {
        match self {
            Self::H264 => "libx264",
            Self::Hevc => "libx265",
        }
    }
}

impl std::fmt::Display for ProxyCodec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for ProxyCodec {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "h264" => Ok(Self::H264),
            "hevc" | "h265" => Ok(Self::Hevc),
            other => Err(format!("unknown proxy codec `{other}` (known: h264, hevc)")),
        }
    }
}

/// How a proxy is encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ProxySettings {
    /// The codec.
    pub codec: ProxyCodec,
    /// Frames per GOP: a keyframe every `gop` frames, none elsewhere.
    pub gop: u32,
    /// The encoder's constant rate factor (lower: closer to the recorded frames, larger).
    pub crf: u8,
}

/// A packet of a proxy stream (decode order is presentation order: `dts == pts`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EncodedPacket {
    /// Presentation (and decode) timestamp: the pts of the frame it encodes.
    pub pts: i64,
    /// Whether it starts a GOP (an IDR picture with its parameter sets).
    pub keyframe: bool,
    /// The bitstream (Annex B).
    pub data: Vec<u8>,
}

/// An encoder of one camera stream's RGB frames, in presentation order.
pub struct ProxyEncoder {
    encoder: ffmpeg::encoder::Video,
    scaler: ffmpeg::software::scaling::Context,
    rgb: ffmpeg::frame::Video,
    yuv: ffmpeg::frame::Video,
    width: u32,
    height: u32,
    /// The presentation times of the frames sent, by the frame number the encoder sees (it
    /// counts frames at the stream's rate, whatever the container's timestamps).
    sent: std::collections::VecDeque<i64>,
    /// The frame number of `sent[0]`.
    first_sent: i64,
}

// SAFETY: the encoder and scaler own their FFmpeg contexts exclusively and are only used through
// `&mut self`; FFmpeg's contexts may move between threads.
unsafe impl Send for ProxyEncoder {}

impl std::fmt::Debug for ProxyEncoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProxyEncoder").field("width", &self.width).field("height", &self.height).finish_non_exhaustive()
    }
}

fn open_err(what: &str) -> impl FnOnce(ffmpeg::Error) -> Error + '_ {
    move |e| Error::Open(format!("{what}: {e}"))
}

impl ProxyEncoder {
    /// A single-threaded encoder (proxies encode many streams in parallel) of `width` ×
    /// `height` frames shown `fps` times a second.
    ///
    /// # Errors
    /// When this FFmpeg lacks the encoder (a build with decoders only), the size is odd (4:2:0
    /// halves both), or the encoder refuses the settings.
    pub fn open(settings: ProxySettings, width: u32, height: u32, fps: u32) -> Result<Self> {
        crate::init_ffmpeg();
        let name = settings.codec.encoder();
        let codec = ffmpeg::encoder::find_by_name(name).ok_or_else(|| {
            Error::Open(format!("this FFmpeg has no {name} encoder, which a {} proxy needs (a build with decoders only?)", settings.codec))
        })?;
        if width == 0 || height == 0 || !width.is_multiple_of(2) || !height.is_multiple_of(2) {
            return Err(Error::Open(format!("a {width}x{height} camera: a proxy's 4:2:0 frames need an even width and height")));
        }
        if settings.gop == 0 {
            return Err(Error::Open("a GOP of 0 frames".into()));
        }
        let mut encoder = ffmpeg::codec::Context::new_with_codec(codec).encoder().video().map_err(open_err(name))?;
        encoder.set_width(width);
        encoder.set_height(height);
        encoder.set_format(ffmpeg::format::Pixel::YUV420P);
        encoder.set_time_base(ffmpeg::Rational::new(1, fps.max(1) as i32));
        encoder.set_frame_rate(Some(ffmpeg::Rational::new(fps.max(1) as i32, 1)));
        encoder.set_gop(settings.gop);
        encoder.set_max_b_frames(0);
        encoder.set_colorspace(ffmpeg::color::Space::SMPTE170M);
        encoder.set_color_range(ffmpeg::color::Range::MPEG);
        // SAFETY: plain fields of the context this encoder owns, set before it is opened.
        unsafe {
            let ctx = encoder.as_mut_ptr();
            (*ctx).color_primaries = ffi::AVColorPrimaries::AVCOL_PRI_SMPTE170M;
            (*ctx).color_trc = ffi::AVColorTransferCharacteristic::AVCOL_TRC_SMPTE170M;
            (*ctx).keyint_min = settings.gop as i32;
            (*ctx).thread_count = 1;
        }
        let mut options = ffmpeg::Dictionary::new();
        options.set("crf", &settings.crf.to_string());
        options.set("preset", "medium");
        // No lookahead: a frame's packet comes out when the frame goes in.
        options.set("tune", "zerolatency");
        let gop = settings.gop;
        match settings.codec {
            ProxyCodec::H264 => options.set("x264-params", &format!("keyint={gop}:min-keyint={gop}:scenecut=0:open-gop=0:bframes=0")),
            ProxyCodec::Hevc => options.set(
                "x265-params",
                &format!("keyint={gop}:min-keyint={gop}:scenecut=0:open-gop=0:bframes=0:repeat-headers=1:frame-threads=1:log-level=error"),
            ),
        }
        let encoder = encoder.open_as_with(codec, options).map_err(open_err(name))?;
        let scaler = ffmpeg::software::scaling::Context::get(
            ffmpeg::format::Pixel::RGB24,
            width,
            height,
            ffmpeg::format::Pixel::YUV420P,
            width,
            height,
            ffmpeg::software::scaling::Flags::BILINEAR | ffmpeg::software::scaling::Flags::ACCURATE_RND,
        )
        .map_err(open_err("swscale RGB to YUV 4:2:0"))?;
        let rgb = ffmpeg::frame::Video::new(ffmpeg::format::Pixel::RGB24, width, height);
        let yuv = ffmpeg::frame::Video::new(ffmpeg::format::Pixel::YUV420P, width, height);
        Ok(Self { encoder, scaler, rgb, yuv, width, height, sent: Default::default(), first_sent: 0 })
    }

    /// The parameters a decoder of this proxy's packets is opened from.
    pub fn params(codec: ProxyCodec, width: u32, height: u32) -> CodecParams {
        CodecParams {
            codec: codec.name().into(),
            extradata: None,
            width,
            height,
            pix_fmt: Some("yuv420p".into()),
            color_range: Some("tv".into()),
            color_space: Some("smpte170m".into()),
            color_primaries: Some("smpte170m".into()),
            color_trc: Some("smpte170m".into()),
            chroma_location: Some("left".into()),
        }
    }

    /// Encodes the frame with presentation time `pts` (packed RGB24, `width * height * 3`
    /// bytes); returns the packets that came out.
    ///
    /// # Errors
    /// When the frame is not of the encoder's size or the encoder fails.
    pub fn encode(&mut self, pts: i64, rgb: &[u8]) -> Result<Vec<EncodedPacket>> {
        let row = self.width as usize * 3;
        if rgb.len() != row * self.height as usize {
            return Err(Error::Decode(format!("a frame of {} bytes, not {}x{} RGB", rgb.len(), self.width, self.height)));
        }
        let stride = self.rgb.stride(0);
        let plane = self.rgb.data_mut(0);
        for (y, src) in rgb.chunks_exact(row).enumerate() {
            plane[y * stride..y * stride + row].copy_from_slice(src);
        }
        self.scaler.run(&self.rgb, &mut self.yuv).map_err(|e| Error::Decode(format!("RGB to YUV 4:2:0: {e}")))?;
        if self.sent.back().is_some_and(|&last| pts <= last) {
            return Err(Error::Decode(format!(
                "a frame with pts {pts} after one with pts {}: frames go in presentation order",
                self.sent[self.sent.len() - 1]
            )));
        }
        self.yuv.set_pts(Some(self.first_sent + self.sent.len() as i64));
        self.sent.push_back(pts);
        self.encoder.send_frame(&self.yuv).map_err(|e| Error::Decode(format!("encoding the frame with pts {pts}: {e}")))?;
        self.drain()
    }

    /// Ends the stream: the packets still inside the encoder.
    ///
    /// # Errors
    /// When the encoder fails.
    pub fn finish(&mut self) -> Result<Vec<EncodedPacket>> {
        self.encoder.send_eof().map_err(|e| Error::Decode(format!("ending the stream: {e}")))?;
        self.drain()
    }

    fn drain(&mut self) -> Result<Vec<EncodedPacket>> {
        let mut out = Vec::new();
        let mut packet = ffmpeg::Packet::empty();
        loop {
            match self.encoder.receive_packet(&mut packet) {
                Ok(()) => {
                    // Without reordering, packets come out in the order frames went in.
                    let number = packet.pts().ok_or_else(|| Error::Decode("the encoder put out a packet without a pts".into()))?;
                    let pts = match self.sent.pop_front() {
                        Some(pts) if number == self.first_sent => pts,
                        _ => return Err(Error::Decode(format!("the encoder put out frame {number} where {} was next", self.first_sent))),
                    };
                    self.first_sent += 1;
                    out.push(EncodedPacket { pts, keyframe: packet.is_key(), data: packet.data().unwrap_or_default().to_vec() });
                }
                Err(ffmpeg::Error::Other { errno: ffi::EAGAIN } | ffmpeg::Error::Eof) => return Ok(out),
                Err(e) => return Err(Error::Decode(format!("encoding: {e}"))),
            }
        }
    }
}

/// Sum of squared differences of two equally long byte buffers (a frame and its proxy).
pub fn squared_error(a: &[u8], b: &[u8]) -> u64 {
    assert_eq!(a.len(), b.len(), "frames of one size");
    a.iter().zip(b).map(|(&x, &y)| u64::from(x.abs_diff(y)).pow(2)).sum()
}

/// Peak signal-to-noise ratio in dB of 8-bit samples whose squared errors sum to `sse` over
/// `samples` samples; `None` when they are equal (no noise).
pub fn psnr(sse: u64, samples: u64) -> Option<f64> {
    (sse > 0 && samples > 0).then(|| 10.0 * (255.0f64 * 255.0 * samples as f64 / sse as f64).log10())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{StreamConfig, StreamDecoder};

    /// Colour bars with a square that moves a pixel a frame.
    fn frame(i: usize, (w, h): (usize, usize)) -> Vec<u8> {
        let mut rgb = vec![0u8; w * h * 3];
        for y in 0..h {
            for x in 0..w {
                let bar = (x * 8 / w) as u8;
                let p = &mut rgb[(y * w + x) * 3..][..3];
                p.copy_from_slice(&[
                    if bar & 1 != 0 { 230 } else { 20 },
                    if bar & 2 != 0 { 210 } else { 30 },
                    if bar & 4 != 0 { 200 } else { 40 },
                ]);
                if (x + w - i % w) % w < 16 && y > 8 && y < 24 {
                    p.copy_from_slice(&[128, 128, 128]);
                }
            }
        }
        rgb
    }

    fn round_trip(codec: ProxyCodec) {
        let (w, h, gop) = (96usize, 64usize, 4u32);
        let mut encoder = ProxyEncoder::open(ProxySettings { codec, gop, crf: 18 }, w as u32, h as u32, 30).expect("opens");
        let mut packets = Vec::new();
        for i in 0..10 {
            // Timestamps as a container keeps them: any increasing values.
            packets.extend(encoder.encode(1000 + 512 * i as i64, &frame(i, (w, h))).expect("encodes"));
        }
        packets.extend(encoder.finish().expect("finishes"));
        let pts: Vec<i64> = packets.iter().map(|p| p.pts).collect();
        assert_eq!(pts, (0..10).map(|i| 1000 + 512 * i).collect::<Vec<_>>(), "one packet per frame, in presentation order");
        let keys: Vec<usize> = packets.iter().enumerate().filter(|(_, p)| p.keyframe).map(|(i, _)| i).collect();
        assert_eq!(keys, [0, 4, 8], "a keyframe every {gop} frames, none elsewhere");
        let config = StreamConfig {
            stream: 0,
            camera: "cam".into(),
            kind: "video".into(),
            params: ProxyEncoder::params(codec, w as u32, h as u32),
            yuv: None,
        };
        // Any keyframe starts a decoder: the second GOP alone decodes.
        let mut decoder = StreamDecoder::open(&config).expect("a decoder");
        let gop2: Vec<(i64, i64, bool, &[u8])> = packets[4..8].iter().map(|p| (p.pts, p.pts, p.keyframe, &p.data[..])).collect();
        let frames = decoder.decode(&gop2, &[pts[6]]).expect("decodes from its own keyframe");
        let sse = squared_error(&frames[0].data, &frame(6, (w, h)));
        let db = psnr(sse, (w * h * 3) as u64).expect("lossy");
        assert!(db > 30.0, "{codec} proxy frame at {db:.1} dB");
    }

    #[test]
    fn an_h264_proxy_has_fixed_gops_no_reordering_and_decodes_from_any_keyframe() {
        round_trip(ProxyCodec::H264);
    }

    #[test]
    fn an_hevc_proxy_has_fixed_gops_no_reordering_and_decodes_from_any_keyframe() {
        round_trip(ProxyCodec::Hevc);
    }

    #[test]
    fn psnr_is_that_of_8_bit_samples_and_none_for_equal_frames() {
        assert_eq!(psnr(0, 100), None);
        assert_eq!(squared_error(&[10, 20], &[13, 16]), 9 + 16);
        // An error of 1 on every sample: 20 log10(255).
        let db = psnr(100, 100).unwrap();
        assert!((db - 48.1308).abs() < 1e-3, "{db}");
        assert!(ProxyEncoder::open(ProxySettings { codec: ProxyCodec::H264, gop: 4, crf: 18 }, 95, 64, 30).is_err(), "odd width");
    }
}
