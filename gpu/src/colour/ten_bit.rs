//! libswscale's conversion of 10-bit 4:2:0 to RGB24, as the integers the kernel runs.

use lake_codec::SwsCoefficients;

/// The conversion of 10-bit 4:2:0 frames (`yuv420p10le`, or NVDEC's P010 surfaces of the same
/// samples) to RGB24 that libswscale makes for one colour matrix and range. For pixel `(x, y)` of
/// an `h`-row frame, with 10-bit samples:
///
/// ```text
/// y' = y − 1 where y = h − 1 is odd, else y      a = max((y' − 1) >> 1, 0)      b = y' >> 1
/// Y8 = (L(x, y) + 2) >> 2
/// U8 = min((U(x / 2, a) + U(x / 2, b) + 4) >> 3, 255)      V8 likewise
/// r = ((V8 · v_to_r) >> 16) − (v_to_r >> 9)
/// g = ((U8 · u_to_g) >> 16) − (u_to_g >> 9) + ((V8 · v_to_g) >> 16) − (v_to_g >> 9)
/// b = ((U8 · u_to_b) >> 16) − (u_to_b >> 9)
/// C = clamp(((Y8 + c) · y_gain + y_base) >> 16)      for C, c = R, r; G, g; B, b
/// ```
///
/// with `>>` flooring and `clamp` to 0..=255. libswscale has no direct converter for these
/// frames: it scales them, keeping samples as 15-bit intermediates (`32·sample`) that its RGB24
/// output rounds to 8 bits (`Y8`). Its bilinear filter puts chroma row `y / 2 − 1/4` under
/// row `y`; the output takes row `a` alone where the second row's weight is under a half and the
/// mean of rows `a` and `b` otherwise (`U8`; `a = b` gives `(U + 2) >> 2`), and the last row,
/// clamped at the edge, takes the row above's chroma. The last three lines are its lookup tables
/// for 24-bit RGB written out.
///
/// This equals libswscale 5.1's `sws_scale` from `yuv420p10le` to `rgb24` at the same size with
/// `SWS_BILINEAR`, set up as lake's `RgbConverter` sets it up (which leaves every 10-bit format at
/// limited range), on every frame of even width and even height other than 4 and 6 for every
/// sample value 0..=1023; other sizes take other libswscale code and differ. The measurements are
/// in docs/decisions/0026-ten-bit-yuv-to-rgb.md.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct YuvToRgb10 {
    /// Luma gain, 16.16 (65536 for full range).
    pub y_gain: i32,
    /// Added to the gained luma before the last shift: the range's black level, the table's
    /// start and the rounding.
    pub y_base: i32,
    /// V's share of red, in luma steps, 16.16.
    pub v_to_r: i32,
    /// U's share of green (negative).
    pub u_to_g: i32,
    /// V's share of green (negative).
    pub v_to_g: i32,
    /// U's share of blue.
    pub u_to_b: i32,
}

impl YuvToRgb10 {
    /// The conversion libswscale makes for frames of FFmpeg colour space `colorspace`
    /// (`AVColorSpace`; unknown values take its default, BT.601) and range (`full`; lake's
    /// loader converts every 10-bit format as limited), with default brightness, contrast and
    /// saturation.
    pub fn for_colorspace(colorspace: i32, full: bool) -> Self {
        let SwsCoefficients { cy, oy, crv, cbu, cgu, cgv } = SwsCoefficients::new(colorspace, full);
        // Where the table's luma 0 lies, in steps.
        let start: i64 = if full { 384 } else { 326 };
        let per_luma = |c: i64| ((c * (1 << 16) + 0x8000) / cy) as i32;
        Self {
            y_gain: cy as i32,
            y_base: (start * cy - (384 << 16) - oy + 0x8000) as i32,
            v_to_r: per_luma(crv),
            u_to_g: per_luma(cgu),
            v_to_g: per_luma(cgv),
            u_to_b: per_luma(cbu),
        }
    }
}

#[cfg(test)]
mod tests {
    use lake_codec::ffmpeg::ffi;

    use super::*;
    use crate::colour::{Geometry, Layout, Target, convert_on_cpu};

    /// libswscale's RGB24 of a `yuv420p10le` frame (`planes`: Y, U, V samples, packed), set up as
    /// lake's `RgbConverter` sets it up (which leaves `yuv420p10le` at limited range).
    fn swscale_rgb(planes: &[u16], w: u32, h: u32, colorspace: i32, full: bool) -> Vec<u8> {
        let bytes: Vec<u8> = planes.iter().flat_map(|s| s.to_le_bytes()).collect();
        let luma = 2 * (w * h) as usize;
        let chroma = 2 * (w.div_ceil(2) * h.div_ceil(2)) as usize;
        let planes = [&bytes[..luma], &bytes[luma..luma + chroma], &bytes[luma + chroma..]];
        lake_codec::swscale_rgb24(ffi::AVPixelFormat::AV_PIX_FMT_YUV420P10LE, planes, 2, w, h, colorspace, full)
            .expect("libswscale converts yuv420p10le")
    }

    /// The twin's RGB24 of the same frame in lake's `Yuv420p10` layout.
    fn twin_rgb(planes: &[u16], w: u32, h: u32, matrix: YuvToRgb10) -> Vec<u8> {
        let bytes: Vec<u8> = planes.iter().flat_map(|s| s.to_le_bytes()).collect();
        let mut out = vec![0_u8; Target::Rgb24.bytes(1, w, h)];
        convert_on_cpu(&[&bytes], Geometry { width: w, height: h, layout: Layout::Yuv420p10 }, &matrix, Target::Rgb24, &mut out)
            .expect("convert");
        out
    }

    /// 10-bit samples (0..=1023) that are a fixed hash of their position.
    fn noise10(len: usize, salt: u32) -> Vec<u16> {
        (0..len as u32).map(|i| (i.wrapping_add(salt).wrapping_mul(2_654_435_761) >> 13) as u16 & 1023).collect()
    }

    /// Where two RGB24 frames differ: (bytes that differ, the largest difference per channel).
    fn differences(a: &[u8], b: &[u8]) -> (usize, [u8; 3]) {
        let mut max = [0_u8; 3];
        let mut count = 0;
        for (k, (x, y)) in a.iter().zip(b).enumerate() {
            if x != y {
                count += 1;
                max[k % 3] = max[k % 3].max(x.abs_diff(*y));
            }
        }
        (count, max)
    }

    #[test]
    fn the_integers_are_libswscales_table_integers() {
        // (colour space, full range) → (y_gain, y_base, v_to_r, u_to_g, v_to_g, u_to_b), from
        // libswscale 5.1's ff_yuv2rgb_c_init_tables.
        let cases = [
            ((5, false), (76309, -1_304_898, 89830, -22049, -45756, 113_537)),
            ((1, false), (76309, -1_304_898, 100_902, -12001, -29993, 118_894)),
            ((9, false), (76309, -1_304_898, 94482, -10543, -36607, 120_547)),
            ((1, true), (65536, 32768, 103_206, -12275, -30678, 121_608)),
            ((5, true), (65536, 32768, 91881, -22552, -46800, 116_129)),
        ];
        for ((cs, full), want) in cases {
            let m = YuvToRgb10::for_colorspace(cs, full);
            assert_eq!((m.y_gain, m.y_base, m.v_to_r, m.u_to_g, m.v_to_g, m.u_to_b), want, "colour space {cs}, full {full}");
        }
    }

    #[test]
    fn every_sample_converts_as_libswscale() {
        // A 2048 × 2048 frame whose chroma holds every (U, V) pair of 10-bit samples once (U
        // along a row, V down the rows) and whose luma runs through every value 4096 times, at
        // an offset per row so each value meets many chroma pairs.
        let (w, h) = (2048_u32, 2048_u32);
        let (wu, hu) = (w as usize, h as usize);
        let mut planes = vec![0_u16; wu * hu + 2 * (wu / 2) * (hu / 2)];
        let (luma, chroma) = planes.split_at_mut(wu * hu);
        for (k, l) in luma.iter_mut().enumerate() {
            *l = ((k % wu + 37 * (k / wu)) % 1024) as u16;
        }
        let (u, v) = chroma.split_at_mut(chroma.len() / 2);
        for (k, (u, v)) in u.iter_mut().zip(v.iter_mut()).enumerate() {
            (*u, *v) = ((k % 1024) as u16, (k / 1024) as u16);
        }
        for (cs, full) in [(5, false), (1, false), (9, false), (1, true)] {
            let theirs = swscale_rgb(&planes, w, h, cs, full);
            let ours = twin_rgb(&planes, w, h, YuvToRgb10::for_colorspace(cs, full));
            assert_eq!(differences(&ours, &theirs), (0, [0; 3]), "colour space {cs}, full {full}");
        }
    }

    #[test]
    fn frames_of_even_sizes_convert_as_libswscale() {
        let sizes = [(640_u32, 480_u32), (64, 8), (64, 2), (96, 10), (32, 64), (2, 2), (50, 20), (62, 16), (4096, 12)];
        for (k, (w, h)) in sizes.into_iter().enumerate() {
            let planes = noise10(lake_codec::yuv420p_bytes(w, h), k as u32);
            for (cs, full) in [(5, false), (1, false)] {
                let theirs = swscale_rgb(&planes, w, h, cs, full);
                let ours = twin_rgb(&planes, w, h, YuvToRgb10::for_colorspace(cs, full));
                assert_eq!(differences(&ours, &theirs), (0, [0; 3]), "{w}x{h}, colour space {cs}");
            }
        }
    }

    #[test]
    fn heights_four_and_six_and_odd_sizes_are_where_libswscale_differs() {
        // The sizes the documentation excludes: libswscale takes other code for them.
        for (w, h) in [(64_u32, 4_u32), (64, 6), (64, 15), (63, 16)] {
            let planes = noise10(lake_codec::yuv420p_bytes(w, h), w + h);
            let theirs = swscale_rgb(&planes, w, h, 5, false);
            let ours = twin_rgb(&planes, w, h, YuvToRgb10::for_colorspace(5, false));
            assert_ne!(differences(&ours, &theirs).0, 0, "{w}x{h}");
        }
    }

    /// The same frame as P010 with `pitch` bytes a row, the chroma `gap` rows below the luma,
    /// and `junk` in each word's low 6 bits.
    fn as_p010(planes: &[u16], w: u32, h: u32, pitch: u32, gap: u32, junk: u16) -> (Vec<u8>, Layout) {
        let (wu, hu, pu) = (w as usize, h as usize, pitch as usize);
        let (cw, ch) = (wu.div_ceil(2), hu.div_ceil(2));
        let uv_offset = (hu + gap as usize) * pu;
        let mut out = vec![0xEE; uv_offset + ch * pu];
        let mut put = |at: usize, s: u16| out[at..at + 2].copy_from_slice(&((s << 6) | (junk & 63)).to_le_bytes());
        for y in 0..hu {
            for x in 0..wu {
                put(y * pu + 2 * x, planes[y * wu + x]);
            }
        }
        let (u, v) = planes[wu * hu..].split_at(cw * ch);
        for cy in 0..ch {
            for cx in 0..cw {
                put(uv_offset + cy * pu + 4 * cx, u[cy * cw + cx]);
                put(uv_offset + cy * pu + 4 * cx + 2, v[cy * cw + cx]);
            }
        }
        (out, Layout::P010 { pitch, uv_offset: uv_offset as u64 })
    }

    #[test]
    fn p010_surfaces_convert_as_the_planes_do() {
        // Odd sizes, a pitch wider than the row, chroma rows that do not follow the luma's, bits
        // outside the 10 in every word, and every target.
        let matrix = YuvToRgb10::for_colorspace(1, false);
        let targets = [
            Target::Rgb24,
            Target::Float32Chw { mean: [0.485, 0.456, 0.406], std: [0.229, 0.224, 0.225] },
            Target::Bf16Chw { mean: [0.485, 0.456, 0.406], std: [0.229, 0.224, 0.225] },
        ];
        for (w, h) in [(33_u32, 17_u32), (64, 48), (1, 1), (3, 2), (2, 3)] {
            let planes = noise10(lake_codec::yuv420p_bytes(w, h), w * h);
            let (p010, layout) = as_p010(&planes, w, h, 4 * w.div_ceil(2) + 6, 3, 0x2A);
            assert!(p010.len() >= layout.frame_bytes(w, h));
            // The planes with junk in each word's high 6 bits.
            let words: Vec<u8> = planes.iter().flat_map(|s| (s | 0xA800).to_le_bytes()).collect();
            for target in targets {
                let mut from_planes = vec![0_u8; target.bytes(1, w, h)];
                let mut from_p010 = from_planes.clone();
                let geometry = Geometry { width: w, height: h, layout: Layout::Yuv420p10 };
                convert_on_cpu(&[&words], geometry, &matrix, target, &mut from_planes).expect("planes");
                convert_on_cpu(&[&p010], Geometry { layout, ..geometry }, &matrix, target, &mut from_p010).expect("p010");
                assert_eq!(from_p010, from_planes, "{w}x{h} {target:?}");
            }
        }
    }

    #[test]
    fn a_matrix_of_the_other_depth_is_refused() {
        let (w, h) = (8_u32, 4_u32);
        let frame = vec![0_u8; Layout::Yuv420p10.frame_bytes(w, h)];
        let mut out = vec![0_u8; Target::Rgb24.bytes(1, w, h)];
        let ten = Geometry { width: w, height: h, layout: Layout::Yuv420p10 };
        let eight = Geometry { layout: Layout::Yuv420p, ..ten };
        let refused = convert_on_cpu(&[&frame], ten, &lake_codec::YuvToRgb::for_colorspace(5, false), Target::Rgb24, &mut out);
        assert!(refused.expect_err("8-bit matrix").to_string().contains("cannot be converted with Bit8"));
        let refused = convert_on_cpu(&[&frame], eight, &YuvToRgb10::for_colorspace(5, false), Target::Rgb24, &mut out);
        assert!(refused.expect_err("10-bit matrix").to_string().contains("cannot be converted with Bit10"));
        let narrow = Geometry { layout: Layout::P010 { pitch: 14, uv_offset: 64 }, ..ten };
        let refused = convert_on_cpu(&[&frame], narrow, &YuvToRgb10::for_colorspace(5, false), Target::Rgb24, &mut out);
        assert!(refused.expect_err("narrow pitch").to_string().contains("does not fit"));
    }
}
