//! The pixel formats samples carry camera frames in, and the conversion of planar YUV 4:2:0 to
//! RGB that a trainer runs on its own device.
//!
//! By default frames are packed RGB24, converted on the loader's CPU exactly as LeRobot's reader
//! converts them. With `FrameFormat::Yuv420p` a video camera whose frames are 8-bit 4:2:0
//! travels as the decoder's planes instead (Y, then U, then V, each packed: 1.5 bytes a pixel
//! against 3), and the trainer converts them where its model runs, usually the GPU. The
//! conversion is fixed-point arithmetic with six integers per camera ([`YuvToRgb`], in the
//! camera column's metadata) that reproduces, byte for byte, libswscale's conversion on x86-64
//! (the SIMD path torchcodec, and so LeRobot, runs there), so RGB made from the planes equals the
//! RGB the loader would have sent:
//!
//! ```text
//! y  = ((8·Y − y_offset) · y_gain) >> 16        u = 8·U − 1024        v = 8·V − 1024
//! R  = clamp(y + ((v · v_to_r) >> 16))
//! G  = clamp(y + ((u · u_to_g) >> 16) + ((v · v_to_g) >> 16))
//! B  = clamp(y + ((u · u_to_b) >> 16))
//! ```
//!
//! with `>>` an arithmetic (flooring) shift, `clamp` to 0..=255, and U and V of pixel `(x, y)`
//! at `(x / 2, y / 2)` of their planes (each chroma sample shared by a 2×2 block, not
//! interpolated).

use ffmpeg_next::ffi;
use serde::{Deserialize, Serialize};

/// Field metadata key on camera columns: `rgb24`, or `yuv420p` for planes to convert.
pub const PIXEL_FORMAT: &str = "pixel_format";
/// Field metadata key on `yuv420p` camera columns: the [`YuvToRgb`] integers, as JSON.
pub const YUV_TO_RGB: &str = "yuv_to_rgb";

/// Bytes of a `width` × `height` frame in planar YUV 4:2:0 (chroma planes of half the size,
/// rounded up).
pub fn yuv420p_bytes(width: u32, height: u32) -> usize {
    let (w, h) = (width as usize, height as usize);
    w * h + 2 * w.div_ceil(2) * h.div_ceil(2)
}

/// A yuv420p picture, 4096 × 4096, that holds every (Y, U, V) triple once, for checking a
/// conversion exhaustively: each 2 × 2 block holds one (U, V) pair, 64 blocks a pair with four
/// luma values each. Returns its width, height and bytes.
pub fn every_yuv_triple() -> (u32, u32, Vec<u8>) {
    let (w, h) = (4096_u32, 4096_u32);
    let mut yuv = vec![0_u8; yuv420p_bytes(w, h)];
    let (luma, chroma) = yuv.split_at_mut((w * h) as usize);
    let (u, v) = chroma.split_at_mut(chroma.len() / 2);
    let cw = (w / 2) as usize;
    for block in 0..cw * (h / 2) as usize {
        let (by, bx) = (block / cw, block % cw);
        let (pair, lumas) = (block / 64, (block % 64) * 4);
        (u[block], v[block]) = ((pair % 256) as u8, (pair / 256) as u8);
        for k in 0..4 {
            luma[(2 * by + k / 2) * w as usize + 2 * bx + k % 2] = (lumas + k) as u8;
        }
    }
    (w, h, yuv)
}

/// The fixed-point YUV → RGB conversion of one colour matrix and range, as libswscale sets it up
/// for its x86-64 SIMD converter (see the module documentation for the arithmetic).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct YuvToRgb {
    /// Subtracted from 8·Y: 128 for limited range, 0 for full range.
    pub y_offset: i32,
    /// Luma gain (8192 is 1.0 for full range).
    pub y_gain: i32,
    /// V's share of red.
    pub v_to_r: i32,
    /// U's share of green (negative).
    pub u_to_g: i32,
    /// V's share of green (negative).
    pub v_to_g: i32,
    /// U's share of blue.
    pub u_to_b: i32,
}

/// libswscale's YUV → RGB coefficients for FFmpeg colour space `colorspace` (`AVColorSpace`;
/// unknown values take its default, BT.601) and a range, as `sws_setColorspaceDetails` derives them
/// at default brightness, contrast and saturation, in 16.16 fixed point before any bit depth's
/// scaling: the 8-bit ([`YuvToRgb`]) and 10-bit conversions both start here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SwsCoefficients {
    /// Luma gain: 1.0 for full range, 255/219 for limited.
    pub cy: i64,
    /// Luma black level: 0 for full range, 16 for limited.
    pub oy: i64,
    /// V's share of red.
    pub crv: i64,
    /// U's share of blue.
    pub cbu: i64,
    /// U's share of green (negative).
    pub cgu: i64,
    /// V's share of green (negative).
    pub cgv: i64,
}

impl SwsCoefficients {
    /// The coefficients of colour space `colorspace` at full (JPEG) range or limited range.
    pub fn new(colorspace: i32, full: bool) -> Self {
        // SAFETY: a lookup in a static table of four ints; libswscale maps any value it does not
        // know to its default.
        let inv = unsafe { std::slice::from_raw_parts(ffi::sws_getCoefficients(colorspace), 4) };
        let (mut crv, mut cbu, mut cgu, mut cgv) = (i64::from(inv[0]), i64::from(inv[1]), -i64::from(inv[2]), -i64::from(inv[3]));
        let (cy, oy) = if full {
            // Truncating division, as C's.
            for c in [&mut crv, &mut cbu, &mut cgu, &mut cgv] {
                *c = *c * 224 / 255;
            }
            (1 << 16, 0)
        } else {
            ((1 << 16) * 255 / 219, 16 << 16)
        };
        Self { cy, oy, crv, cbu, cgu, cgv }
    }
}

impl YuvToRgb {
    /// The conversion libswscale makes for frames of FFmpeg colour space `colorspace`
    /// (`AVColorSpace`; unknown values take its default, BT.601) and range (`full`: JPEG range,
    /// as for `yuvj420p`; otherwise limited), with default brightness, contrast and saturation.
    pub fn for_colorspace(colorspace: i32, full: bool) -> Self {
        let SwsCoefficients { cy, oy, crv, cbu, cgu, cgv } = SwsCoefficients::new(colorspace, full);
        let to16 = |c: i64| ((c + 32768) >> 16).clamp(-32768, 32767) as i32;
        Self {
            y_offset: to16(oy << 3),
            y_gain: to16(cy << 13),
            v_to_r: to16(crv << 13),
            u_to_g: to16(cgu << 13),
            v_to_g: to16(cgv << 13),
            u_to_b: to16(cbu << 13),
        }
    }

    /// The conversion of a stream's frames from the facts ingest recorded (FFmpeg's pixel format
    /// and colour space names), when they are 8-bit 4:2:0 (`yuv420p`, or `yuvj420p` for full
    /// range) that libswscale converts with this arithmetic: a height that is even (otherwise it
    /// takes its general scaler), a width that is a multiple of 32 (otherwise LeRobot's reader
    /// converts through a filter graph), and a libswscale that runs it (`reproduces_libswscale`).
    pub fn for_stream(pix_fmt: Option<&str>, color_space: Option<&str>, width: u32, height: u32) -> Option<Self> {
        if !width.is_multiple_of(32) || !height.is_multiple_of(2) || width == 0 || height == 0 || !reproduces_libswscale() {
            return None;
        }
        let full = match pix_fmt? {
            "yuv420p" => false,
            "yuvj420p" => true,
            _ => return None,
        };
        let colorspace = crate::from_name(color_space, ffi::av_color_space_from_name).unwrap_or(2);
        Some(Self::for_colorspace(colorspace, full))
    }

    /// Converts a `width` × `height` frame of packed planes (`yuv`, [`yuv420p_bytes`] long) to
    /// packed RGB24 in `rgb` (`width * height * 3` bytes): the CPU twin of what a trainer runs on
    /// its device.
    ///
    /// # Panics
    /// When the buffers are not those sizes.
    pub fn convert(&self, yuv: &[u8], width: u32, height: u32, rgb: &mut [u8]) {
        let (w, h) = (width as usize, height as usize);
        let cw = w.div_ceil(2);
        assert_eq!(yuv.len(), yuv420p_bytes(width, height), "a {w}x{h} frame's planes");
        assert_eq!(rgb.len(), w * h * 3, "a {w}x{h} frame's RGB");
        let (luma, chroma) = yuv.split_at(w * h);
        let (u_plane, v_plane) = chroma.split_at(chroma.len() / 2);
        for (y, (out, luma)) in rgb.chunks_exact_mut(w * 3).zip(luma.chunks_exact(w)).enumerate() {
            let (u_row, v_row) = (&u_plane[(y / 2) * cw..][..cw], &v_plane[(y / 2) * cw..][..cw]);
            for (x, (px, &l)) in out.chunks_exact_mut(3).zip(luma).enumerate() {
                let (u, v) = (8 * i32::from(u_row[x / 2]) - 1024, 8 * i32::from(v_row[x / 2]) - 1024);
                let yy = ((8 * i32::from(l) - self.y_offset) * self.y_gain) >> 16;
                px[0] = (yy + ((v * self.v_to_r) >> 16)).clamp(0, 255) as u8;
                px[1] = (yy + ((u * self.u_to_g) >> 16) + ((v * self.v_to_g) >> 16)).clamp(0, 255) as u8;
                px[2] = (yy + ((u * self.u_to_b) >> 16)).clamp(0, 255) as u8;
            }
        }
    }
}

/// A libswscale context that converts `width` × `height` frames of pixel format `format` to
/// RGB24 as LeRobot's reader sets one up: bilinear, colour space `colorspace`'s coefficients on
/// both sides, the source range `full` (`None`: the one libswscale chose for the format), and
/// libswscale's own choice for the rest. Null when libswscale cannot convert the format; the
/// caller frees a context with `sws_freeContext`.
pub fn rgb24_context(format: ffi::AVPixelFormat, width: i32, height: i32, colorspace: i32, full: Option<bool>) -> *mut ffi::SwsContext {
    crate::init_ffmpeg();
    let rgb24 = ffi::AVPixelFormat::AV_PIX_FMT_RGB24;
    let null = (std::ptr::null_mut(), std::ptr::null_mut(), std::ptr::null());
    // SAFETY: FFmpeg calls with valid arguments on a context made here, freed here on failure.
    unsafe {
        let ctx = ffi::sws_getContext(width, height, format, width, height, rgb24, ffi::SWS_BILINEAR, null.0, null.1, null.2);
        if ctx.is_null() {
            return ctx;
        }
        let (mut inv_table, mut table) = (std::ptr::null_mut(), std::ptr::null_mut());
        let (mut src_range, mut dst_range, mut brightness, mut contrast, mut saturation) = (0, 0, 0, 0, 0);
        let details = (&mut inv_table, &mut src_range, &mut table, &mut dst_range);
        let set =
            ffi::sws_getColorspaceDetails(ctx, details.0, details.1, details.2, details.3, &mut brightness, &mut contrast, &mut saturation)
                >= 0
                && {
                    let coefficients = ffi::sws_getCoefficients(colorspace);
                    let range = full.map_or(src_range, i32::from);
                    ffi::sws_setColorspaceDetails(ctx, coefficients, range, coefficients, dst_range, brightness, contrast, saturation) >= 0
                };
        if !set {
            ffi::sws_freeContext(ctx);
            return std::ptr::null_mut();
        }
        ctx
    }
}

/// libswscale's RGB24 of one `w` × `h` 4:2:0 frame of pixel format `format` (`planes`: Y, U and
/// V, each row `sample_bytes` × its width), set up by [`rgb24_context`] with range `full`: the
/// reference lake's own conversions must equal. None when libswscale cannot convert the format.
///
/// # Panics
/// When the planes are shorter than the frame.
pub fn swscale_rgb24(
    format: ffi::AVPixelFormat,
    planes: [&[u8]; 3],
    sample_bytes: u32,
    w: u32,
    h: u32,
    colorspace: i32,
    full: bool,
) -> Option<Vec<u8>> {
    let (cw, ch) = (w.div_ceil(2), h.div_ceil(2));
    let needed = [w * h, cw * ch, cw * ch].map(|samples| (samples * sample_bytes) as usize);
    assert!(planes.iter().zip(needed).all(|(plane, n)| plane.len() >= n), "planes too short for a {w}x{h} frame");
    let ctx = rgb24_context(format, w as i32, h as i32, colorspace, Some(full));
    if ctx.is_null() {
        return None;
    }
    let mut out = vec![0_u8; (w * h * 3) as usize];
    let src = [planes[0].as_ptr(), planes[1].as_ptr(), planes[2].as_ptr(), std::ptr::null()];
    let src_stride = [w * sample_bytes, cw * sample_bytes, cw * sample_bytes, 0].map(|s| s as i32);
    let dst = [out.as_mut_ptr(), std::ptr::null_mut(), std::ptr::null_mut(), std::ptr::null_mut()];
    let dst_stride = [(w * 3) as i32, 0, 0, 0];
    // SAFETY: the planes hold the frame (checked above) and `out` its RGB24; the context is ours.
    unsafe {
        ffi::sws_scale(ctx, src.as_ptr(), src_stride.as_ptr(), 0, h as i32, dst.as_ptr(), dst_stride.as_ptr());
        ffi::sws_freeContext(ctx);
    }
    Some(out)
}

/// libswscale's RGB24 of packed `yuv420p` planes (`yuv`, a `w` × `h` frame).
fn swscale_rgb(yuv: &[u8], w: u32, h: u32, cs: i32, full: bool) -> Vec<u8> {
    let luma = (w * h) as usize;
    let chroma = (w.div_ceil(2) * h.div_ceil(2)) as usize;
    let planes = [&yuv[..luma], &yuv[luma..luma + chroma], &yuv[luma + chroma..]];
    swscale_rgb24(ffi::AVPixelFormat::AV_PIX_FMT_YUV420P, planes, 1, w, h, cs, full).unwrap_or_default()
}

/// Whether this process's libswscale converts 4:2:0 to RGB with the arithmetic [`YuvToRgb`]
/// reproduces (its x86-64 SIMD code), checked once on a test picture. Elsewhere (another
/// architecture, an FFmpeg built without its assembly) the loader's RGB would differ from the
/// planes converted, so cameras stay RGB.
pub fn reproduces_libswscale() -> bool {
    static SAME: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *SAME.get_or_init(|| {
        let same = cfg!(target_arch = "x86_64") && {
            let (w, h) = (64_u32, 16_u32);
            let yuv: Vec<u8> = (0..yuv420p_bytes(w, h) as u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
            [(5, false), (1, true), (9, false)].iter().all(|&(cs, full)| {
                let mut ours = vec![0_u8; (w * h * 3) as usize];
                YuvToRgb::for_colorspace(cs, full).convert(&yuv, w, h, &mut ours);
                ours == swscale_rgb(&yuv, w, h, cs, full)
            })
        };
        if !same {
            tracing::warn!(
                "this machine's libswscale converts YUV to RGB with other rounding than lake reproduces; video frames stay rgb24"
            );
        }
        same
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_integers_are_libswscales_for_each_matrix_and_range() {
        // (colour space, full range) → (y_offset, y_gain, v_to_r, u_to_b, u_to_g, v_to_g), as
        // libswscale 6.7 computes them.
        let cases = [
            ((5, false), (128, 9539, 13075, 16525, -3209, -6660)),
            ((5, true), (0, 8192, 11485, 14516, -2819, -5850)),
            ((1, false), (128, 9539, 14686, 17305, -1747, -4366)),
            ((1, true), (0, 8192, 12901, 15201, -1534, -3835)),
            ((9, false), (128, 9539, 13752, 17545, -1535, -5328)),
            ((4, true), (0, 8192, 11469, 14582, -2719, -5831)),
            ((7, false), (128, 9539, 14697, 17029, -2113, -4445)),
            ((2, false), (128, 9539, 13075, 16525, -3209, -6660)),
            ((8, false), (128, 9539, 13075, 16525, -3209, -6660)),
        ];
        for ((cs, full), want) in cases {
            let c = YuvToRgb::for_colorspace(cs, full);
            assert_eq!((c.y_offset, c.y_gain, c.v_to_r, c.u_to_b, c.u_to_g, c.v_to_g), want, "colour space {cs}, full {full}");
        }
    }

    #[test]
    fn streams_get_a_conversion_only_where_libswscale_uses_this_one() {
        let bt601 = YuvToRgb::for_colorspace(5, false);
        assert_eq!(YuvToRgb::for_stream(Some("yuv420p"), Some("unknown"), 640, 480), Some(bt601));
        assert_eq!(YuvToRgb::for_stream(Some("yuv420p"), None, 128, 96), Some(bt601));
        assert_eq!(YuvToRgb::for_stream(Some("yuvj420p"), Some("bt709"), 640, 480), Some(YuvToRgb::for_colorspace(1, true)));
        assert_eq!(YuvToRgb::for_stream(Some("yuv420p"), Some("bt709"), 424, 240), None, "width not a multiple of 32");
        assert_eq!(YuvToRgb::for_stream(Some("yuv420p"), Some("bt709"), 640, 481), None, "odd height");
        assert_eq!(YuvToRgb::for_stream(Some("yuv444p"), Some("bt709"), 640, 480), None);
        assert_eq!(YuvToRgb::for_stream(Some("yuv420p10le"), Some("bt709"), 640, 480), None);
        assert_eq!(YuvToRgb::for_stream(None, Some("bt709"), 640, 480), None);
    }

    #[test]
    fn conversion_is_libswscales_on_every_colour() {
        // Every (Y, U, V) once, for two matrices and both ranges.
        assert!(reproduces_libswscale(), "this machine's libswscale is the one lake reproduces");
        let (w, h, yuv) = every_yuv_triple();
        for (cs, full) in [(5, false), (1, true)] {
            let mut ours = vec![0_u8; (w * h * 3) as usize];
            YuvToRgb::for_colorspace(cs, full).convert(&yuv, w, h, &mut ours);
            let theirs = swscale_rgb(&yuv, w, h, cs, full);
            let first = ours.iter().zip(&theirs).position(|(a, b)| a != b);
            assert_eq!(first, None, "colour space {cs}, full {full}: first difference at byte {first:?}");
        }
    }
}
