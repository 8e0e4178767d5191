//! YUV 4:2:0 → RGB for a batch of frames: the CUDA kernel and its CPU twin.
//!
//! Each output pixel is one thread (one loop turn in the twin). For pixel `(x, y)` of frame `f`:
//!
//! ```text
//! L = luma(x, y)   U, V = chroma(x / 2, y / 2)            (layout: Yuv420p or Nv12)
//! y' = ((8·L − y_offset) · y_gain) >> 16   u = 8·U − 1024   v = 8·V − 1024
//! R = clamp(y' + ((v · v_to_r) >> 16))
//! G = clamp(y' + ((u · u_to_g) >> 16) + ((v · v_to_g) >> 16))
//! B = clamp(y' + ((u · u_to_b) >> 16))
//! ```
//!
//! then RGB24 stores `R, G, B` at `((f·h + y)·w + x)·3`, and Float32Chw stores
//! `(C / 255 − mean[c]) / std[c]` in float32 at `((f·3 + c)·h + y)·w + x`.
//! The integers are [`YuvToRgb`]'s, which equal libswscale's conversion on every YUV triple.

use lake_codec::YuvToRgb;

/// How a frame's planes lie in memory, from its base address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// lake's `yuv420p` frames: Y (`w·h` bytes), then U, then V (`⌈w/2⌉·⌈h/2⌉` bytes each),
    /// each packed.
    Yuv420p,
    /// NVDEC's NV12 surfaces: rows of Y `pitch` bytes apart, then, `uv_offset` bytes from the
    /// base, rows of interleaved U and V, `pitch` bytes apart.
    Nv12 {
        /// Bytes from one row to the next, in both planes.
        pitch: u32,
        /// Bytes from the frame's base to its first chroma row.
        uv_offset: u64,
    },
}

impl Layout {
    /// Bytes of one frame of `width` × `height` from its base to the end of its last row.
    pub fn frame_bytes(self, width: u32, height: u32) -> usize {
        let (w, h) = (width as usize, height as usize);
        match self {
            Layout::Yuv420p => lake_codec::yuv420p_bytes(width, height),
            Layout::Nv12 { pitch, uv_offset } => {
                let rows_uv = h.div_ceil(2);
                uv_offset as usize + (rows_uv - 1) * pitch as usize + 2 * w.div_ceil(2)
            }
        }
    }

    fn check(self, width: u32, height: u32) -> crate::Result<()> {
        if width == 0 || height == 0 {
            return Err(crate::Error::Layout(format!("a {width}x{height} frame has no pixels")));
        }
        if let Layout::Nv12 { pitch, uv_offset } = self {
            if (pitch as usize) < 2 * (width as usize).div_ceil(2) {
                return Err(crate::Error::Layout(format!("an NV12 pitch of {pitch} bytes is narrower than a {width}-pixel row")));
            }
            if uv_offset < u64::from(pitch) * u64::from(height) {
                return Err(crate::Error::Layout(format!(
                    "NV12 chroma at byte {uv_offset} overlaps the luma plane of {height} rows of {pitch} bytes"
                )));
            }
        }
        Ok(())
    }
}

/// The frames of a batch: all of one size and layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    /// Pixels a row.
    pub width: u32,
    /// Rows.
    pub height: u32,
    /// Where the planes lie.
    pub layout: Layout,
}

impl Geometry {
    /// Bytes of one frame (see [`Layout::frame_bytes`]).
    pub fn frame_bytes(&self) -> usize {
        self.layout.frame_bytes(self.width, self.height)
    }

    pub(crate) fn check(&self) -> crate::Result<()> {
        self.layout.check(self.width, self.height)
    }
}

/// What the conversion writes, for the whole batch, contiguous.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Target {
    /// uint8 `[frames, h, w, 3]`: the loader's RGB frames.
    Rgb24,
    /// float32 `[frames, 3, h, w]`: `(C / 255 − mean[c]) / std[c]` per channel, as a model's
    /// input after normalisation (mean 0 and std 1 give LeRobot's float frames in [0, 1]).
    Float32Chw {
        /// Subtracted per channel, after the division by 255.
        mean: [f32; 3],
        /// Divides per channel, last.
        std: [f32; 3],
    },
}

impl Target {
    /// Bytes the batch's output takes.
    pub fn bytes(self, frames: usize, width: u32, height: u32) -> usize {
        let pixels = frames * width as usize * height as usize;
        match self {
            Target::Rgb24 => pixels * 3,
            Target::Float32Chw { .. } => pixels * 3 * 4,
        }
    }
}

/// The kernel, compiled by NVRTC at run time. Its operations and their order are the twin's
/// ([`convert_on_cpu`]); integer `>>` of a negative value is arithmetic in CUDA as in Rust.
pub(crate) const KERNELS: &str = r#"
__device__ __forceinline__ int lake_clamp255(int v) { return v < 0 ? 0 : (v > 255 ? 255 : v); }

extern "C" __global__ void lake_yuv_to_rgb(
    const unsigned long long* frames, int count, int width, int height,
    int nv12, int pitch, unsigned long long uv_offset,
    int y_offset, int y_gain, int v_to_r, int u_to_g, int v_to_g, int u_to_b,
    int target, void* out,
    float mean0, float mean1, float mean2, float std0, float std1, float std2)
{
    long long plane = (long long)width * height;
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= plane * count) return;
    long long f = i / plane;
    long long p = i - f * plane;
    int y = (int)(p / width);
    int x = (int)(p - (long long)y * width);
    const unsigned char* src = (const unsigned char*)frames[f];
    int l, u, v;
    if (nv12) {
        l = src[(long long)y * pitch + x];
        const unsigned char* uv = src + uv_offset + (long long)(y / 2) * pitch + (x / 2) * 2;
        u = uv[0];
        v = uv[1];
    } else {
        long long cw = (width + 1) / 2, ch = (height + 1) / 2;
        long long c = (long long)(y / 2) * cw + x / 2;
        l = src[p];
        u = src[plane + c];
        v = src[plane + cw * ch + c];
    }
    int uu = 8 * u - 1024;
    int vv = 8 * v - 1024;
    int yy = ((8 * l - y_offset) * y_gain) >> 16;
    int r = lake_clamp255(yy + ((vv * v_to_r) >> 16));
    int g = lake_clamp255(yy + ((uu * u_to_g) >> 16) + ((vv * v_to_g) >> 16));
    int b = lake_clamp255(yy + ((uu * u_to_b) >> 16));
    if (target == 0) {
        unsigned char* o = (unsigned char*)out + i * 3;
        o[0] = (unsigned char)r;
        o[1] = (unsigned char)g;
        o[2] = (unsigned char)b;
    } else {
        float* o = (float*)out + f * 3 * plane + p;
        o[0] = ((float)r / 255.0f - mean0) / std0;
        o[plane] = ((float)g / 255.0f - mean1) / std1;
        o[2 * plane] = ((float)b / 255.0f - mean2) / std2;
    }
}
"#;

/// The kernel's entry point.
pub(crate) const ENTRY: &str = "lake_yuv_to_rgb";

/// The CPU twin of the kernel, and its specification: converts `frames` (each as `geometry`
/// says) into `out` as `target` asks, with the kernel's operations in the kernel's order, one
/// loop turn per thread.
///
/// # Errors
/// [`crate::Error::Layout`] when a frame is shorter than its layout needs, or `out` is not
/// [`Target::bytes`] long.
pub fn convert_on_cpu(frames: &[&[u8]], geometry: Geometry, matrix: &YuvToRgb, target: Target, out: &mut [u8]) -> crate::Result<()> {
    geometry.check()?;
    let Geometry { width, height, layout } = geometry;
    let need = geometry.frame_bytes();
    if let Some((f, short)) = frames.iter().enumerate().find(|(_, f)| f.len() < need) {
        return Err(crate::Error::Layout(format!(
            "frame {f} holds {} bytes; a {width}x{height} {layout:?} frame needs {need}",
            short.len()
        )));
    }
    let want = target.bytes(frames.len(), width, height);
    if out.len() != want {
        return Err(crate::Error::Layout(format!("the output holds {} bytes; {} frames need {want}", out.len(), frames.len())));
    }
    let (w, h) = (i64::from(width), i64::from(height));
    let plane = w * h;
    for i in 0..plane * frames.len() as i64 {
        let f = i / plane;
        let p = i - f * plane;
        let y = p / w;
        let x = p - y * w;
        let src = frames[f as usize];
        let (l, u, v) = match layout {
            Layout::Nv12 { pitch, uv_offset } => {
                let l = src[(y * i64::from(pitch) + x) as usize];
                let uv = uv_offset as i64 + (y / 2) * i64::from(pitch) + (x / 2) * 2;
                (l, src[uv as usize], src[uv as usize + 1])
            }
            Layout::Yuv420p => {
                let (cw, ch) = ((w + 1) / 2, (h + 1) / 2);
                let c = (y / 2) * cw + x / 2;
                (src[p as usize], src[(plane + c) as usize], src[(plane + cw * ch + c) as usize])
            }
        };
        let uu = 8 * i32::from(u) - 1024;
        let vv = 8 * i32::from(v) - 1024;
        let yy = ((8 * i32::from(l) - matrix.y_offset) * matrix.y_gain) >> 16;
        let r = (yy + ((vv * matrix.v_to_r) >> 16)).clamp(0, 255);
        let g = (yy + ((uu * matrix.u_to_g) >> 16) + ((vv * matrix.v_to_g) >> 16)).clamp(0, 255);
        let b = (yy + ((uu * matrix.u_to_b) >> 16)).clamp(0, 255);
        match target {
            Target::Rgb24 => {
                let o = i as usize * 3;
                out[o..o + 3].copy_from_slice(&[r as u8, g as u8, b as u8]);
            }
            Target::Float32Chw { mean, std } => {
                for (c, value) in [r, g, b].into_iter().enumerate() {
                    let at = ((f * 3 + c as i64) * plane + p) as usize * 4;
                    let x = (value as f32 / 255.0 - mean[c]) / std[c];
                    out[at..at + 4].copy_from_slice(&x.to_ne_bytes());
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// BT.601 limited range, the conversion most robot cameras' H.264 and AV1 streams get.
    fn bt601() -> YuvToRgb {
        YuvToRgb::for_colorspace(5, false)
    }

    /// A frame whose bytes are a fixed hash of their position.
    fn noise(len: usize, salt: u32) -> Vec<u8> {
        (0..len as u32).map(|i| (i.wrapping_add(salt).wrapping_mul(2_654_435_761) >> 13) as u8).collect()
    }

    fn planes(width: u32, height: u32) -> Geometry {
        Geometry { width, height, layout: Layout::Yuv420p }
    }

    fn rgb24(frames: &[&[u8]], width: u32, height: u32, layout: Layout, matrix: &YuvToRgb) -> Vec<u8> {
        let mut out = vec![0; Target::Rgb24.bytes(frames.len(), width, height)];
        convert_on_cpu(frames, Geometry { width, height, layout }, matrix, Target::Rgb24, &mut out).expect("convert");
        out
    }

    /// The same frame as NV12 with `pitch` bytes a row and the chroma `gap` rows below the luma.
    fn as_nv12(yuv: &[u8], w: u32, h: u32, pitch: u32, gap: u32) -> (Vec<u8>, Layout) {
        let (wu, hu, pu) = (w as usize, h as usize, pitch as usize);
        let (cw, ch) = (wu.div_ceil(2), hu.div_ceil(2));
        let uv_offset = (hu + gap as usize) * pu;
        let mut out = vec![0xEE; uv_offset + ch * pu];
        for y in 0..hu {
            out[y * pu..y * pu + wu].copy_from_slice(&yuv[y * wu..(y + 1) * wu]);
        }
        let (u, v) = yuv[wu * hu..].split_at(cw * ch);
        for cy in 0..ch {
            for cx in 0..cw {
                out[uv_offset + cy * pu + 2 * cx] = u[cy * cw + cx];
                out[uv_offset + cy * pu + 2 * cx + 1] = v[cy * cw + cx];
            }
        }
        (out, Layout::Nv12 { pitch, uv_offset: uv_offset as u64 })
    }

    #[test]
    fn every_yuv_triple_converts_as_the_loaders_conversion() {
        // Every (Y, U, V) once, for two matrices and both ranges: a 4096 × 4096 frame whose 2 × 2
        // blocks each hold one (U, V) pair, 64 blocks per pair with 4 luma values each.
        let (w, h) = (4096_u32, 4096_u32);
        let mut yuv = vec![0_u8; lake_codec::yuv420p_bytes(w, h)];
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
        for matrix in [bt601(), YuvToRgb::for_colorspace(1, true)] {
            let mut loader = vec![0_u8; (w * h * 3) as usize];
            matrix.convert(&yuv, w, h, &mut loader);
            let twin = rgb24(&[&yuv], w, h, Layout::Yuv420p, &matrix);
            let first = twin.iter().zip(&loader).position(|(a, b)| a != b);
            assert_eq!(first, None, "{matrix:?}: first difference at byte {first:?}");
        }
    }

    #[test]
    fn nv12_with_a_wide_pitch_converts_as_the_planes_do() {
        // Odd sizes, a pitch wider than the row and chroma rows that do not follow the luma's.
        for (w, h) in [(33_u32, 17_u32), (64, 48), (1, 1), (3, 2)] {
            let yuv = noise(lake_codec::yuv420p_bytes(w, h), w * h);
            let (nv12, layout) = as_nv12(&yuv, w, h, 2 * w.div_ceil(2) + 13, 3);
            assert!(nv12.len() >= layout.frame_bytes(w, h));
            let planes = rgb24(&[&yuv], w, h, Layout::Yuv420p, &bt601());
            assert_eq!(rgb24(&[&nv12], w, h, layout, &bt601()), planes, "{w}x{h}");
        }
    }

    #[test]
    fn a_batch_converts_frame_by_frame() {
        let (w, h) = (48_u32, 30_u32);
        let frames: Vec<Vec<u8>> = (0..3).map(|k| noise(lake_codec::yuv420p_bytes(w, h), k)).collect();
        let refs: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
        let batch = rgb24(&refs, w, h, Layout::Yuv420p, &bt601());
        for (k, frame) in frames.iter().enumerate() {
            let mut one = vec![0_u8; (w * h * 3) as usize];
            bt601().convert(frame, w, h, &mut one);
            assert_eq!(&batch[k * one.len()..(k + 1) * one.len()], &one[..], "frame {k}");
        }
    }

    #[test]
    fn colour_bars_come_out_as_their_colours() {
        // BT.601 limited-range 100 % bars (Y, U, V) and their RGB.
        let bars: [((u8, u8, u8), [u8; 3]); 8] = [
            ((235, 128, 128), [255, 255, 255]),
            ((210, 16, 146), [255, 255, 0]),
            ((170, 166, 16), [0, 255, 255]),
            ((145, 54, 34), [0, 255, 0]),
            ((106, 202, 222), [255, 0, 255]),
            ((81, 90, 240), [255, 0, 0]),
            ((41, 240, 110), [0, 0, 255]),
            ((16, 128, 128), [0, 0, 0]),
        ];
        let (w, h) = (16_u32, 2_u32);
        let mut yuv = vec![0_u8; lake_codec::yuv420p_bytes(w, h)];
        for (bar, ((y, u, v), _)) in bars.iter().enumerate() {
            for x in 2 * bar..2 * bar + 2 {
                yuv[x] = *y;
                yuv[w as usize + x] = *y;
            }
            yuv[(w * h) as usize + bar] = *u;
            yuv[(w * h) as usize + (w / 2) as usize + bar] = *v;
        }
        let rgb = rgb24(&[&yuv], w, h, Layout::Yuv420p, &bt601());
        for (bar, (_, want)) in bars.iter().enumerate() {
            let got = &rgb[bar * 2 * 3..bar * 2 * 3 + 3];
            for c in 0..3 {
                assert!(got[c].abs_diff(want[c]) <= 2, "bar {bar}: {got:?} against {want:?}");
            }
        }
    }

    #[test]
    fn normalised_planes_are_the_rgb_frames_divided_channel_by_channel() {
        let (w, h) = (10_u32, 6_u32);
        let frames: Vec<Vec<u8>> = (0..2).map(|k| noise(lake_codec::yuv420p_bytes(w, h), 7 + k)).collect();
        let refs: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
        let rgb = rgb24(&refs, w, h, Layout::Yuv420p, &bt601());
        let (mean, std) = ([0.485_f32, 0.456, 0.406], [0.229_f32, 0.224, 0.225]);
        let target = Target::Float32Chw { mean, std };
        let mut out = vec![0_u8; target.bytes(2, w, h)];
        convert_on_cpu(&refs, planes(w, h), &bt601(), target, &mut out).expect("convert");
        let floats: Vec<f32> = out.chunks_exact(4).map(|b| f32::from_ne_bytes(b.try_into().expect("4 bytes"))).collect();
        let (wu, hu) = (w as usize, h as usize);
        for f in 0..2 {
            for c in 0..3 {
                for p in 0..wu * hu {
                    let byte = rgb[(f * wu * hu + p) * 3 + c];
                    let want = (f32::from(byte) / 255.0 - mean[c]) / std[c];
                    assert_eq!(floats[(f * 3 + c) * wu * hu + p].to_bits(), want.to_bits(), "frame {f} channel {c} pixel {p}");
                }
            }
        }
    }

    #[test]
    fn sizes_that_do_not_fit_are_refused() {
        let (w, h) = (8_u32, 4_u32);
        let short = vec![0_u8; 10];
        let mut out = vec![0_u8; Target::Rgb24.bytes(1, w, h)];
        let refused = convert_on_cpu(&[&short], planes(w, h), &bt601(), Target::Rgb24, &mut out);
        assert!(refused.expect_err("short frame").to_string().contains("frame 0 holds 10 bytes"));
        let yuv = vec![0_u8; lake_codec::yuv420p_bytes(w, h)];
        let refused = convert_on_cpu(&[&yuv], planes(w, h), &bt601(), Target::Rgb24, &mut out[1..]);
        assert!(refused.expect_err("short output").to_string().contains("the output holds"));
        let narrow = Geometry { width: w, height: h, layout: Layout::Nv12 { pitch: 6, uv_offset: 64 } };
        assert!(convert_on_cpu(&[&yuv], narrow, &bt601(), Target::Rgb24, &mut out).is_err());
    }
}
