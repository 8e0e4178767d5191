//! FFmpeg as lake uses it, in one place: ingest demuxes with it and checks frames, the loader
//! decodes and converts with it, export muxes with it, and all of them open decoders the same way.
//!
//! - [`init_ffmpeg`]: FFmpeg initialised once, its own log silenced (lake reports errors itself,
//!   naming file, episode and frame; `LAKE_FFMPEG_LOG=1` shows FFmpeg's messages).
//! - [`codec_context`]: a decoder context from the parameters ingest recorded for a stream
//!   (codec, extradata, size, pixel format, colour), not yet opened; [`strict`] sets one to stop
//!   at damage it detects, and [`frame_damage`] tells what a decoded frame says of damage.
//! - [`VideoDemuxer`]: a container's stream facts and packets in decode order, keyframes told by
//!   the bitstream, each packet's unit framing checked; [`FrameCheck`] decodes every packet once.
//! - [`StreamDecoder`]: a stream's frames decoded and converted to RGB exactly as LeRobot's
//!   reader does (FFmpeg and libswscale for video, libjpeg-turbo for JPEG pictures), or handed
//!   out as YUV 4:2:0 planes with the integers that convert them ([`YuvToRgb`]);
//!   [`RgbResizer`] scales RGB frames for frame tables.
//! - [`Mp4Writer`]: packets written back into an mp4 without re-encoding.
//! - [`ProxyEncoder`]: frames re-encoded into a stream built for random access (a training
//!   proxy: short closed GOPs, no B-frames), with [`psnr`] to say how far it is from them.
//! - [`nvdec`]: the same decoders with the GPU's NVDEC engine behind them (FFmpeg's CUDA
//!   hwaccel), frames left in GPU memory as NV12 surfaces for lake-gpu's kernel.
//!
//! ```
//! use lake_codec::{StreamConfig, StreamDecoder};
//! use lake_schemas::CodecParams;
//! // A decoder for an H.264 camera stream as ingest records one.
//! let params = CodecParams { codec: "h264".into(), width: 64, height: 48, ..CodecParams::default() };
//! let config = StreamConfig { stream: 0, camera: "observation.images.top".into(), kind: "video".into(), params, yuv: None };
//! let decoder = StreamDecoder::open(&config).expect("FFmpeg has an H.264 decoder");
//! assert_eq!(decoder.stream, 0);
//! // The same stream's context, set to refuse damage, as ingest's frame check opens it.
//! let mut context = lake_codec::codec_context(&config.params).expect("a context");
//! lake_codec::strict(&mut context);
//! assert_eq!(context.decoder().video().expect("opens").width(), 64);
//! ```

mod check;
mod context;
mod decode;
mod demux;
mod encode;
mod error;
mod jpeg;
mod mux;
pub mod nvdec;
mod pixels;

pub use ffmpeg_next as ffmpeg;

pub use crate::{
    check::FrameCheck,
    context::{codec_context, frame_damage, from_name, init_ffmpeg, strict},
    decode::{RgbConverter, RgbFrame, RgbResizer, StreamConfig, StreamDecoder},
    demux::{DemuxedPacket, StreamFacts, VideoDemuxer, same_codec},
    encode::{EncodedPacket, ProxyCodec, ProxyEncoder, ProxySettings, psnr, squared_error},
    error::{Error, Result},
    jpeg::jpeg_round_trip,
    mux::{Mp4Writer, packet_times},
    pixels::{
        PIXEL_FORMAT, SwsCoefficients, YUV_TO_RGB, YuvToRgb, every_yuv_triple, reproduces_libswscale, rgb24_context, swscale_rgb24,
        yuv420p_bytes,
    },
};
