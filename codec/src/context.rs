//! FFmpeg's setup as every part of lake shares it: one initialisation, decoders opened from a
//! stream's recorded parameters, and the damage checks.

use std::ffi::CString;

use ffmpeg_next::{self as ffmpeg, ffi};
use lake_schemas::CodecParams;

use crate::{Error, Result};

/// Initialises FFmpeg once, with its own logging silenced: lake reports errors itself, naming
/// the file, episode and frame. Set `LAKE_FFMPEG_LOG=1` to see FFmpeg's messages.
pub fn init_ffmpeg() {
    static INIT: std::sync::Once = std::sync::Once::new();
    INIT.call_once(|| {
        let _ = ffmpeg::init();
        let level = if std::env::var_os("LAKE_FFMPEG_LOG").is_some() { ffmpeg::log::Level::Info } else { ffmpeg::log::Level::Quiet };
        ffmpeg::log::set_level(level);
    });
}

/// The value FFmpeg's table `lookup` gives `name` (a colour range, space, …), if it knows it.
pub fn from_name(name: Option<&str>, lookup: unsafe extern "C" fn(*const std::ffi::c_char) -> std::ffi::c_int) -> Option<i32> {
    let name = CString::new(name?).ok()?;
    // SAFETY: a lookup of a NUL-terminated name in a static table.
    let value = unsafe { lookup(name.as_ptr()) };
    (value >= 0).then_some(value)
}

/// A decoder context for a stream ingest recorded as `params`, not opened yet.
///
/// # Errors
/// When FFmpeg does not know the codec or has no decoder for it.
pub fn codec_context(params: &CodecParams) -> Result<ffmpeg::codec::Context> {
    init_ffmpeg();
    let name = CString::new(params.codec.as_str()).map_err(|_| Error::Open(format!("codec name {:?}", params.codec)))?;
    // SAFETY: lookups in FFmpeg's static tables, then setup of a context we own before it is
    // opened; extradata is copied into an FFmpeg allocation with the padding decoders
    // expect, and the context frees it.
    unsafe {
        let desc = ffi::avcodec_descriptor_get_by_name(name.as_ptr());
        if desc.is_null() {
            return Err(Error::Open(format!("FFmpeg does not know the codec `{}`", params.codec)));
        }
        let codec = ffi::avcodec_find_decoder((*desc).id);
        if codec.is_null() {
            return Err(Error::Open(format!("this FFmpeg has no decoder for `{}`", params.codec)));
        }
        let mut ctx = ffmpeg::codec::Context::new_with_codec(ffmpeg::Codec::wrap(codec));
        let raw = ctx.as_mut_ptr();
        (*raw).width = params.width as i32;
        (*raw).height = params.height as i32;
        if let Some(fmt) = params.pix_fmt.as_deref().and_then(|n| CString::new(n).ok()) {
            (*raw).pix_fmt = ffi::av_get_pix_fmt(fmt.as_ptr());
        }
        if let Some(v) = from_name(params.color_range.as_deref(), ffi::av_color_range_from_name) {
            (*raw).color_range = std::mem::transmute::<i32, ffi::AVColorRange>(v);
        }
        if let Some(v) = from_name(params.color_space.as_deref(), ffi::av_color_space_from_name) {
            (*raw).colorspace = std::mem::transmute::<i32, ffi::AVColorSpace>(v);
        }
        if let Some(v) = from_name(params.color_primaries.as_deref(), ffi::av_color_primaries_from_name) {
            (*raw).color_primaries = std::mem::transmute::<i32, ffi::AVColorPrimaries>(v);
        }
        if let Some(v) = from_name(params.color_trc.as_deref(), ffi::av_color_transfer_from_name) {
            (*raw).color_trc = std::mem::transmute::<i32, ffi::AVColorTransferCharacteristic>(v);
        }
        if let Some(v) = from_name(params.chroma_location.as_deref(), ffi::av_chroma_location_from_name) {
            (*raw).chroma_sample_location = std::mem::transmute::<i32, ffi::AVChromaLocation>(v);
        }
        if let Some(extra) = params.extradata.as_deref().filter(|e| !e.is_empty()) {
            let pad = ffi::AV_INPUT_BUFFER_PADDING_SIZE as usize;
            let buf = ffi::av_mallocz(extra.len() + pad).cast::<u8>();
            if buf.is_null() {
                return Err(Error::Open("out of memory for extradata".into()));
            }
            std::ptr::copy_nonoverlapping(extra.as_ptr(), buf, extra.len());
            (*raw).extradata = buf;
            (*raw).extradata_size = extra.len() as i32;
        }
        Ok(ctx)
    }
}

/// Sets a context, before it is opened, to refuse damaged input: FFmpeg's error recognition
/// stops at the first error it detects (`err_recognition` with explode) instead of going on.
/// Damage it goes on past is concealed as before, and the frame says so in its flags
/// ([`frame_damage`]): such frames are failed, never served. (Error concealment itself stays
/// on: FFmpeg's H.264 decoder counts a frame's decoded slices through it, and without it marks
/// every frame as having slices it could not decode.) Frames of undamaged streams decode to
/// the same bytes either way.
pub fn strict(ctx: &mut ffmpeg::codec::Context) {
    // SAFETY: a context we own, not opened yet; a plain integer field.
    unsafe { (*ctx.as_mut_ptr()).err_recognition |= ffi::AV_EF_EXPLODE };
}

/// What a decoded frame says of damage its decoder met (`decode_error_flags`, or the corrupt
/// flag), in words; `None` for a frame decoded whole.
pub fn frame_damage(frame: &ffmpeg::frame::Video) -> Option<String> {
    // SAFETY: a frame the decoder filled; both fields are plain integers.
    let (errors, flags) = unsafe { ((*frame.as_ptr()).decode_error_flags, (*frame.as_ptr()).flags) };
    let mut why = Vec::new();
    if errors & ffi::FF_DECODE_ERROR_INVALID_BITSTREAM != 0 {
        why.push("its bitstream is invalid");
    }
    if errors & ffi::FF_DECODE_ERROR_MISSING_REFERENCE != 0 {
        why.push("a frame it refers to is missing");
    }
    if errors & ffi::FF_DECODE_ERROR_CONCEALMENT_ACTIVE != 0 {
        why.push("part of it had to be concealed");
    }
    if errors & ffi::FF_DECODE_ERROR_DECODE_SLICES != 0 {
        why.push("some of its slices could not be decoded");
    }
    if why.is_empty() && flags & ffi::AV_FRAME_FLAG_CORRUPT != 0 {
        why.push("the decoder marked it corrupt");
    }
    (!why.is_empty()).then(|| format!("the frame is damaged: {}", why.join(", ")))
}

/// A packet holding a copy of `data`, with its presentation and decode times (in its stream's
/// time base) and, for a keyframe as the container marks it, the key flag.
pub(crate) fn packet(data: &[u8], pts: i64, dts: i64, keyframe: bool) -> ffmpeg::Packet {
    let mut p = ffmpeg::Packet::copy(data);
    p.set_pts(Some(pts));
    p.set_dts(Some(dts));
    if keyframe {
        p.set_flags(ffmpeg::packet::Flags::KEY);
    }
    p
}
