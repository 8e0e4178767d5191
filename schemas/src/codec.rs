//! The codec facts a camera stream is decoded from.

/// What a decoder of one camera stream is opened from, named as FFmpeg names them in
/// `AVCodecParameters`. Ingest reads these from the container (trusting it over `info.json`)
/// and stores them as columns of the `streams` table; the loader reads them back and opens its
/// decoder as `avcodec_parameters_to_context` would.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CodecParams {
    /// FFmpeg's codec name (`av1`, `h264`, `hevc`, `mpeg4`, …; `png`/`jpeg` for images).
    pub codec: String,
    /// Codec extradata (`avcC`, `hvcC`, `av1C`, …).
    pub extradata: Option<Vec<u8>>,
    /// Coded width.
    pub width: u32,
    /// Coded height.
    pub height: u32,
    /// Pixel format name (`yuv420p`, …).
    pub pix_fmt: Option<String>,
    /// Colour range name (`tv`, `pc`).
    pub color_range: Option<String>,
    /// Colour matrix name (`bt709`, …).
    pub color_space: Option<String>,
    /// Colour primaries name.
    pub color_primaries: Option<String>,
    /// Transfer characteristic name.
    pub color_trc: Option<String>,
    /// Chroma sample location name.
    pub chroma_location: Option<String>,
}
