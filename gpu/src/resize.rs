//! RGB24 frames resized as lake's frame tables resize them: the two CUDA kernels and their CPU
//! twin.
//!
//! A frame table at another size is made by libswscale's area averaging from RGB24 to RGB24
//! (`lake_codec::RgbResizer`). That is not a plain box average: libswscale takes the pixels
//! through its YUV pipeline. Here, with every integer libswscale uses:
//!
//! 1. **Input.** Each pixel becomes 14-bit BT.601 limited-range luma, `(ry·R + gy·G + by·B +
//!    0x80100) >> 9`. Chroma is made the same way from each pixel, or, when the frame shrinks to
//!    half its width or less, from the sum of each pair of pixels, `(… + 0x800200) >> 10`.
//! 2. **Rows** (the first kernel, one thread per source row and output column): each plane is
//!    filtered along the row with 14-bit coefficients, `min((Σ c·s) >> 13, 32767)`, into 15-bit
//!    samples.
//! 3. **Columns** (the second kernel, one thread per output pixel): the rows are filtered with
//!    12-bit coefficients, `(r + Σ c·s) >> 10` with chroma less `128 << 19`, where the rounder `r`
//!    is 512, or 0 on an output row whose filter has two taps summing to 4096 (libswscale's
//!    two-tap path).
//! 4. **Output.** `Y' = (Y − 8192)·y_gain + (1 << 21)`, `R = Y' + V·v_to_r`,
//!    `G = Y' + V·v_to_g + U·u_to_g`, `B = Y' + U·u_to_b` in 32-bit wrapping arithmetic, each
//!    clamped to `[0, 2³⁰)` and shifted right by 22: the [`YuvToRgb`] of libswscale's default
//!    colour space, BT.601 limited range. The bytes are then stored as the [`Target`] asks.
//!
//! The filters ([`AreaFilter`]) are libswscale's for its area flag, built on the host: a box of
//! the output pixel's width in the source for shrinking, a two-tap linear one for enlarging, one
//! tap where the size stays, with near-zero edge taps dropped, taps aligned as the x86 and Arm
//! builds align them, the borders folded in, and each output's coefficients normalised with the
//! rounding error carried from tap to tap. How this was read and measured:
//! `docs/decisions/0028-gpu-resize-as-the-frame-tables.md`.

use lake_codec::YuvToRgb;

use crate::colour::{Target, store};

/// The most taps a filter may have: libswscale's limit, past which it scales in two steps.
const MAX_TAPS: usize = 256;

/// The share of a filter below which an edge tap is dropped (libswscale's
/// `SWS_MAX_REDUCE_CUTOFF`).
const REDUCE_CUTOFF: f64 = 0.002;

/// One dimension's filter: output `i` is `Σₖ coefficients[i·taps + k] · input[positions[i] + k]`,
/// the coefficients summing to the filter's one (`1 << 14` along rows, `1 << 12` down columns).
/// A tap past the input's end has a zero coefficient.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AreaFilter {
    /// The first input each output reads.
    pub positions: Vec<i32>,
    /// Taps an output.
    pub taps: usize,
    /// `taps` coefficients an output.
    pub coefficients: Vec<i16>,
}

/// `a / b` rounded half away from zero, as libswscale's `ROUNDED_DIV` (C's truncating division).
fn rounded_div(a: i64, b: i64) -> i64 {
    if a >= 0 { (a + (b >> 1)) / b } else { (a - (b >> 1)) / b }
}

/// The source step per output, in 16.16 fixed point, rounded to nearest.
fn step(src: u32, dst: u32) -> i64 {
    ((i64::from(src) << 16) + i64::from(dst >> 1)) / i64::from(dst)
}

impl AreaFilter {
    /// The area filter from `src` inputs to `dst` outputs, with coefficients summing to `one`
    /// and taps a multiple of `align` (1 stays 1 where `align` is 2).
    ///
    /// # Errors
    /// [`crate::Error::Layout`] for an empty side or a shrink that needs 256 taps or more.
    pub fn new(src: u32, dst: u32, one: i64, align: usize) -> crate::Result<AreaFilter> {
        if src == 0 || dst == 0 {
            return Err(crate::Error::Layout(format!("a resize from {src} to {dst} pixels")));
        }
        let (n, inc) = (dst as usize, step(src, dst));
        let fone: i64 = 1 << (54 - (src / dst).checked_ilog2().unwrap_or(0).min(8));
        let mut positions = vec![0_i64; n];
        let (mut taps, mut raw);
        if (inc - 0x10000).abs() < 10 {
            taps = 1;
            raw = vec![fone; n];
            for (i, p) in positions.iter_mut().enumerate() {
                *p = i as i64;
            }
        } else if inc <= 1 << 16 {
            // Enlarging: linear between the two nearest inputs, centres aligned.
            taps = 2;
            raw = vec![0; 2 * n];
            let mut at = (inc >> 1) - 0x8000;
            for i in 0..n {
                let first = at >> 16;
                positions[i] = first;
                for j in 0..2 {
                    let distance = ((first + j as i64) * (1 << 16) - at).abs();
                    raw[2 * i + j] = (fone - distance * (fone >> 16)).max(0);
                }
                at += inc;
            }
        } else {
            // Shrinking: each output covers `inc` inputs, the edges in part.
            taps = (1 + src.div_ceil(dst)).min(src.saturating_sub(2)).max(1) as usize;
            raw = vec![0; taps * n];
            let mut at = inc - 0x10000;
            for i in 0..n {
                let first = (at - (taps as i64 - 2) * (1 << 16)) / (1 << 17);
                positions[i] = first;
                for j in 0..taps {
                    let distance = ((((first + j as i64) * (1 << 17)) - at).abs() << 13) * i64::from(dst) / i64::from(src);
                    let edge = (distance - (1 << 29)) * inc;
                    let coverage = if edge < -(1 << 45) {
                        1 << 46
                    } else if edge < 1 << 45 {
                        (1 << 45) - edge
                    } else {
                        0
                    };
                    raw[i * taps + j] = coverage * (fone >> 46);
                }
                at += 2 * inc;
            }
        }

        // Drop near-zero taps: on the left by moving the window right, on the right by counting.
        let cutoff = REDUCE_CUTOFF * fone as f64;
        let mut needed = 0;
        for i in (0..n).rev() {
            let row = &mut raw[i * taps..(i + 1) * taps];
            let mut dropped = 0_i64;
            for _ in 0..taps {
                dropped += row[0].abs();
                if dropped as f64 > cutoff || (i + 1 < n && positions[i] >= positions[i + 1]) {
                    break;
                }
                row.rotate_left(1);
                row[taps - 1] = 0;
                positions[i] += 1;
            }
            let (mut kept, mut tail) = (taps, 0_i64);
            for j in (1..taps).rev() {
                tail += row[j].abs();
                if tail as f64 > cutoff {
                    break;
                }
                kept -= 1;
            }
            needed = needed.max(kept);
        }
        let align = if needed == 1 && align == 2 { 1 } else { align };
        let aligned = needed.div_ceil(align) * align;
        if aligned >= MAX_TAPS {
            return Err(crate::Error::Layout(format!(
                "a resize from {src} to {dst} pixels needs {aligned} taps an output; at most {} are made in one step",
                MAX_TAPS - 1
            )));
        }
        let mut filter: Vec<i64> =
            (0..n * aligned).map(|k| if k % aligned < taps { raw[k / aligned * taps + k % aligned] } else { 0 }).collect();
        taps = aligned;

        // Fold the taps that fall outside the input onto its first and last pixels.
        let src = i64::from(src);
        for (i, position) in positions.iter_mut().enumerate() {
            let row = &mut filter[i * taps..(i + 1) * taps];
            if *position < 0 {
                for j in 1..taps {
                    let left = (j as i64 + *position).max(0) as usize;
                    row[left] += row[j];
                    row[j] = 0;
                }
                *position = 0;
            }
            if *position + taps as i64 > src {
                let shift = *position + (taps as i64 - src).min(0);
                let mut past = 0;
                for j in (0..taps).rev() {
                    if *position + j as i64 >= src {
                        past += row[j];
                        row[j] = 0;
                    }
                }
                for j in (0..taps).rev() {
                    row[j] = if (j as i64) < shift { 0 } else { row[j - shift as usize] };
                }
                *position -= shift;
                row[(src - 1 - *position) as usize] += past;
            }
        }

        // Normalise to `one`, carrying each tap's rounding error to the next.
        let mut coefficients = Vec::with_capacity(n * taps);
        for row in filter.chunks_exact(taps) {
            let sum = match (row.iter().sum::<i64>() + one / 2) / one {
                0 => 1,
                s => s,
            };
            let mut error = 0;
            for &c in row {
                let v = c + error;
                let q = rounded_div(v, sum);
                coefficients.push(q as i16);
                error = v - q * sum;
            }
        }
        Ok(AreaFilter { positions: positions.into_iter().map(|p| p as i32).collect(), taps, coefficients })
    }

    /// Whether output `i` takes libswscale's two-tap path down columns: two taps summing to
    /// 4096, the second at most 4096. Its sums then have no rounder.
    fn two_tap(&self, i: usize) -> bool {
        if self.taps != 2 {
            return false;
        }
        let (a, b) = (i32::from(self.coefficients[2 * i]), i32::from(self.coefficients[2 * i + 1]));
        a + b == 4096 && (b as u32) <= 4096
    }
}

/// BT.601 limited-range RGB → YUV factors at 15 fractional bits, as libswscale rounds them for
/// its default colour space: luma `[ry, gy, by]`, then U's and V's.
fn rgb_to_yuv() -> [i32; 9] {
    let luma = |k: f64| (k * 219.0 / 255.0 * 32768.0 + 0.5) as i32;
    let chroma = |k: f64| (k * 224.0 / 255.0 * 32768.0 + 0.5) as i32;
    [luma(0.299), luma(0.587), luma(0.114), -chroma(0.169), -chroma(0.331), chroma(0.5), chroma(0.5), -chroma(0.419), -chroma(0.081)]
}

/// A resize of RGB24 frames from one size to another, as the frame tables resize them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resize {
    from: (u32, u32),
    to: (u32, u32),
    /// Whether chroma is made from pairs of pixels (the frame shrinks to half its width or less).
    pairs: bool,
    luma: AreaFilter,
    chroma: AreaFilter,
    columns: AreaFilter,
    /// [`rgb_to_yuv`]'s nine factors, then the output's luma offset and gain and its four
    /// chroma factors: the kernels' `params`.
    params: [i32; 15],
}

impl Resize {
    /// The resize of `(width, height)` frames to `to`.
    ///
    /// # Errors
    /// [`crate::Error::Layout`] for the same size (libswscale copies such frames, and so
    /// should the caller), an empty size, a shrink past 255 source pixels an output pixel, or an
    /// odd width shrunk to half or less (libswscale's pairs of pixels then read one past each
    /// row, which no twin can repeat).
    pub fn new(from: (u32, u32), to: (u32, u32)) -> crate::Result<Resize> {
        if from == to {
            return Err(crate::Error::Layout(format!("{}x{} frames are already that size: they are copied, not resized", to.0, to.1)));
        }
        let pairs = to.0 <= from.0 >> 1;
        if pairs && from.0 % 2 == 1 {
            return Err(crate::Error::Layout(format!(
                "{}x{} frames resized to {}x{}: an odd width halved or more is resized on the CPU only",
                from.0, from.1, to.0, to.1
            )));
        }
        let chroma_width = if pairs { from.0.div_ceil(2) } else { from.0 };
        let luma = AreaFilter::new(from.0, to.0, 1 << 14, 4)?;
        let chroma = AreaFilter::new(chroma_width, to.0, 1 << 14, 4)?;
        let columns = AreaFilter::new(from.1, to.1, 1 << 12, 2)?;
        // libswscale's default colour space (SWS_CS_DEFAULT), limited range both ways.
        let m = YuvToRgb::for_colorspace(5, false);
        let mut params = [0; 15];
        params[..9].copy_from_slice(&rgb_to_yuv());
        // Luma's black level, 16, at the columns' 9 fractional bits.
        params[9..].copy_from_slice(&[16 << 9, m.y_gain, m.v_to_r, m.u_to_g, m.v_to_g, m.u_to_b]);
        Ok(Resize { from, to, pairs, luma, chroma, columns, params })
    }

    /// The frames' size before.
    pub fn from(&self) -> (u32, u32) {
        self.from
    }

    /// The frames' size after.
    pub fn to(&self) -> (u32, u32) {
        self.to
    }

    /// The filters along rows (luma, then chroma) and down columns.
    pub fn filters(&self) -> [&AreaFilter; 3] {
        [&self.luma, &self.chroma, &self.columns]
    }

    /// 16-bit samples of the rows pass for `frames` frames: three planes of source rows by
    /// output columns each.
    pub fn scratch_samples(&self, frames: usize) -> usize {
        frames * 3 * self.from.1 as usize * self.to.0 as usize
    }

    pub(crate) fn params(&self) -> &[i32; 15] {
        &self.params
    }

    pub(crate) fn pairs(&self) -> bool {
        self.pairs
    }
}

/// The resize kernels, compiled after the colour kernel (whose `lake_pixel` and `lake_store`
/// they use). Their operations and order are the twin's ([`resize_on_cpu`]).
pub(crate) const KERNELS: &str = r#"
__device__ __forceinline__ int lake_dot3(const unsigned char* p, const int* k, int r) {
    return k[0] * p[0] + k[1] * p[1] + k[2] * p[2] + r;
}

__device__ __forceinline__ int lake_dot3_pair(const unsigned char* p, const int* k, int r) {
    return k[0] * (p[0] + p[3]) + k[1] * (p[1] + p[4]) + k[2] * (p[2] + p[5]) + r;
}

extern "C" __global__ void lake_area_rows(
    const unsigned long long* frames, int count, int src_w, int src_h, int dst_w, int pairs,
    const int* params,
    const int* luma_at, const short* luma, int luma_taps,
    const int* chroma_at, const short* chroma, int chroma_taps,
    short* rows)
{
    long long f, p;
    int x, row;
    if (!lake_pixel(dst_w, src_h, count, &f, &p, &x, &row)) return;
    const unsigned char* line = (const unsigned char*)frames[f] + (long long)row * src_w * 3;
    int y = 0;
    for (int k = 0; k < luma_taps; k++) {
        int at = luma_at[x] + k;
        if (at >= src_w) continue;
        y += luma[x * luma_taps + k] * (lake_dot3(line + 3 * at, params, 0x80100) >> 9);
    }
    int chroma_w = pairs ? (src_w + 1) / 2 : src_w;
    int u = 0, v = 0;
    for (int k = 0; k < chroma_taps; k++) {
        int at = chroma_at[x] + k;
        if (at >= chroma_w) continue;
        int c = chroma[x * chroma_taps + k];
        if (pairs) {
            u += c * (lake_dot3_pair(line + 6 * at, params + 3, 0x800200) >> 10);
            v += c * (lake_dot3_pair(line + 6 * at, params + 6, 0x800200) >> 10);
        } else {
            u += c * (lake_dot3(line + 3 * at, params + 3, 0x400100) >> 9);
            v += c * (lake_dot3(line + 3 * at, params + 6, 0x400100) >> 9);
        }
    }
    long long plane = (long long)src_h * dst_w;
    short* out = rows + f * 3 * plane + (long long)row * dst_w + x;
    out[0] = (short)min(y >> 13, 32767);
    out[plane] = (short)min(u >> 13, 32767);
    out[2 * plane] = (short)min(v >> 13, 32767);
}

__device__ __forceinline__ int lake_clip30(unsigned int c) {
    int v = (int)c;
    return v < 0 ? 0 : (v > 0x3fffffff ? 0x3fffffff : v);
}

extern "C" __global__ void lake_area_columns(
    const short* rows, int count, int src_h, int dst_w, int dst_h,
    const int* params, const int* at, const short* taps_of, int taps,
    int target, void* out,
    float mean0, float mean1, float mean2, float std0, float std1, float std2)
{
    long long f, p;
    int x, y;
    if (!lake_pixel(dst_w, dst_h, count, &f, &p, &x, &y)) return;
    long long plane = (long long)dst_w * dst_h;
    const short* c = taps_of + (long long)y * taps;
    int rounder = (taps == 2 && c[0] + c[1] == 4096 && (unsigned int)c[1] <= 4096u) ? 0 : 512;
    int l = rounder, u = rounder - (128 << 19), v = rounder - (128 << 19);
    long long src_plane = (long long)src_h * dst_w;
    const short* planes = rows + f * 3 * src_plane + x;
    for (int k = 0; k < taps; k++) {
        int row = at[y] + k;
        if (row >= src_h) continue;
        long long s = (long long)row * dst_w;
        l += planes[s] * c[k];
        u += planes[src_plane + s] * c[k];
        v += planes[2 * src_plane + s] * c[k];
    }
    l >>= 10;
    u >>= 10;
    v >>= 10;
    unsigned int yy = (unsigned int)((l - params[9]) * params[10] + (1 << 21));
    int r = lake_clip30(yy + (unsigned int)v * (unsigned int)params[11]) >> 22;
    int g = lake_clip30(yy + (unsigned int)v * (unsigned int)params[13] + (unsigned int)u * (unsigned int)params[12]) >> 22;
    int b = lake_clip30(yy + (unsigned int)u * (unsigned int)params[14]) >> 22;
    lake_store(target, out, r, g, b, f, p, plane, mean0, mean1, mean2, std0, std1, std2);
}
"#;

/// The rows kernel's entry point.
pub(crate) const ROWS_ENTRY: &str = "lake_area_rows";
/// The columns kernel's entry point.
pub(crate) const COLUMNS_ENTRY: &str = "lake_area_columns";

/// `k · (R, G, B) + r` of the pixel at byte `at`.
fn dot3(line: &[u8], at: usize, k: &[i32], r: i32) -> i32 {
    k[0] * i32::from(line[at]) + k[1] * i32::from(line[at + 1]) + k[2] * i32::from(line[at + 2]) + r
}

/// `k · (R, G, B) + r` of the sums of the pixel at byte `at` and the next.
fn dot3_pair(line: &[u8], at: usize, k: &[i32], r: i32) -> i32 {
    let sum = |c: usize| i32::from(line[at + c]) + i32::from(line[at + 3 + c]);
    k[0] * sum(0) + k[1] * sum(1) + k[2] * sum(2) + r
}

/// `c` clamped to `[0, 2³⁰)` as a signed 32-bit value.
fn clip30(c: u32) -> i32 {
    (c as i32).clamp(0, 0x3FFF_FFFF)
}

/// The rows pass of `frames` into `rows` ([`Resize::scratch_samples`] long): the rows kernel,
/// one loop turn per thread.
fn rows_on_cpu(frames: &[&[u8]], resize: &Resize, rows: &mut [i16]) {
    let ((src_w, src_h), dst_w) = ((resize.from.0 as i64, resize.from.1 as i64), resize.to.0 as i64);
    let (params, pairs) = (&resize.params, resize.pairs);
    let (luma, chroma) = (&resize.luma, &resize.chroma);
    let chroma_w = if pairs { (src_w + 1) / 2 } else { src_w };
    let per_frame = src_h * dst_w;
    for i in 0..per_frame * frames.len() as i64 {
        let f = i / per_frame;
        let p = i - f * per_frame;
        let row = p / dst_w;
        let x = (p - row * dst_w) as usize;
        let line = &frames[f as usize][(row * src_w * 3) as usize..((row + 1) * src_w * 3) as usize];
        let mut y = 0_i32;
        for k in 0..luma.taps {
            let at = i64::from(luma.positions[x]) + k as i64;
            if at >= src_w {
                continue;
            }
            y += i32::from(luma.coefficients[x * luma.taps + k]) * (dot3(line, 3 * at as usize, &params[0..3], 0x80100) >> 9);
        }
        let (mut u, mut v) = (0_i32, 0_i32);
        for k in 0..chroma.taps {
            let at = i64::from(chroma.positions[x]) + k as i64;
            if at >= chroma_w {
                continue;
            }
            let c = i32::from(chroma.coefficients[x * chroma.taps + k]);
            if pairs {
                u += c * (dot3_pair(line, 6 * at as usize, &params[3..6], 0x80_0200) >> 10);
                v += c * (dot3_pair(line, 6 * at as usize, &params[6..9], 0x80_0200) >> 10);
            } else {
                u += c * (dot3(line, 3 * at as usize, &params[3..6], 0x40_0100) >> 9);
                v += c * (dot3(line, 3 * at as usize, &params[6..9], 0x40_0100) >> 9);
            }
        }
        let plane = src_h * dst_w;
        let out = (f * 3 * plane + row * dst_w + x as i64) as usize;
        rows[out] = (y >> 13).min(32767) as i16;
        rows[out + plane as usize] = (u >> 13).min(32767) as i16;
        rows[out + 2 * plane as usize] = (v >> 13).min(32767) as i16;
    }
}

/// The CPU twin of the resize kernels, and their specification: resizes `frames` (RGB24 of
/// [`Resize::from`]'s size) to [`Resize::to`]'s size into `out` as `target` asks, with the
/// kernels' operations in the kernels' order, one loop turn per thread.
///
/// # Errors
/// [`crate::Error::Layout`] when a frame is not of the resize's size or `out` is not
/// [`Target::bytes`] long.
pub fn resize_on_cpu(frames: &[&[u8]], resize: &Resize, target: Target, out: &mut [u8]) -> crate::Result<()> {
    let ((src_w, src_h), (dst_w, dst_h)) = (resize.from, resize.to);
    let need = 3 * src_w as usize * src_h as usize;
    if let Some((f, other)) = frames.iter().enumerate().find(|(_, f)| f.len() != need) {
        return Err(crate::Error::Layout(format!("frame {f} holds {} bytes; a {src_w}x{src_h} RGB24 frame has {need}", other.len())));
    }
    let want = target.bytes(frames.len(), dst_w, dst_h);
    if out.len() != want {
        return Err(crate::Error::Layout(format!("the output holds {} bytes; {} frames need {want}", out.len(), frames.len())));
    }
    let mut rows = vec![0_i16; resize.scratch_samples(frames.len())];
    rows_on_cpu(frames, resize, &mut rows);

    let (src_h, dst_w, dst_h) = (i64::from(src_h), i64::from(dst_w), i64::from(dst_h));
    let (params, columns) = (&resize.params, &resize.columns);
    let plane = dst_w * dst_h;
    let src_plane = src_h * dst_w;
    for i in 0..plane * frames.len() as i64 {
        let f = i / plane;
        let p = i - f * plane;
        let y = (p / dst_w) as usize;
        let x = p - y as i64 * dst_w;
        let taps = &columns.coefficients[y * columns.taps..(y + 1) * columns.taps];
        let rounder = if columns.two_tap(y) { 0 } else { 512 };
        let (mut l, mut u, mut v) = (rounder, rounder - (128 << 19), rounder - (128 << 19));
        let planes = f * 3 * src_plane + x;
        for (k, &c) in taps.iter().enumerate() {
            let row = i64::from(columns.positions[y]) + k as i64;
            if row >= src_h {
                continue;
            }
            let s = (planes + row * dst_w) as usize;
            let c = i32::from(c);
            l += i32::from(rows[s]) * c;
            u += i32::from(rows[s + src_plane as usize]) * c;
            v += i32::from(rows[s + 2 * src_plane as usize]) * c;
        }
        let (l, u, v) = (l >> 10, u >> 10, v >> 10);
        let yy = ((l - params[9]) * params[10] + (1 << 21)) as u32;
        let (u, v) = (u as u32, v as u32);
        let r = clip30(yy.wrapping_add(v.wrapping_mul(params[11] as u32))) >> 22;
        let g = clip30(yy.wrapping_add(v.wrapping_mul(params[13] as u32)).wrapping_add(u.wrapping_mul(params[12] as u32))) >> 22;
        let b = clip30(yy.wrapping_add(u.wrapping_mul(params[14] as u32))) >> 22;
        store(target, out, [r, g, b], f, p, plane);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An RGB24 frame: fixed noise, or a smooth diagonal ramp per channel.
    fn frame((w, h): (u32, u32), salt: u32, smooth: bool) -> Vec<u8> {
        let mut out = Vec::with_capacity((w * h * 3) as usize);
        for y in 0..h {
            for x in 0..w {
                for c in 0..3_u32 {
                    out.push(if smooth {
                        ((x * (c + 1) * 255 / w.max(1) + y * (3 - c) * 255 / h.max(1) + salt) % 256) as u8
                    } else {
                        ((y * w + x) * 3 + c).wrapping_add(salt).wrapping_mul(2_654_435_761).to_be_bytes()[0]
                    });
                }
            }
        }
        out
    }

    fn twin(frames: &[&[u8]], from: (u32, u32), to: (u32, u32)) -> Vec<u8> {
        let resize = Resize::new(from, to).expect("resize");
        let mut out = vec![0_u8; Target::Rgb24.bytes(frames.len(), to.0, to.1)];
        resize_on_cpu(frames, &resize, Target::Rgb24, &mut out).expect("twin");
        out
    }

    #[test]
    fn the_twin_resizes_as_the_frame_tables_resizer_does() {
        // Camera sizes to training sizes, ratios whole and not, shrinking to half the width or
        // less (chroma from pairs) and not, enlarging, one side unchanged, odd heights, and a
        // shrink of 160 pixels into one.
        let sizes = [
            ((640, 480), (64, 48)),
            ((640, 480), (96, 72)),
            ((640, 480), (224, 224)),
            ((320, 240), (160, 120)),
            ((320, 240), (200, 150)),
            ((64, 48), (96, 72)),
            ((64, 48), (64, 24)),
            ((64, 48), (30, 48)),
            ((100, 75), (51, 37)),
            ((30, 17), (7, 5)),
            ((1280, 720), (8, 6)),
            ((34, 20), (33, 41)),
        ];
        // And sizes drawn at random (a fixed sequence), to twice the source in each direction.
        let mut state = 12_345_u64;
        let mut draw = |below: u32| {
            state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            (state >> 33) as u32 % below + 1
        };
        let mut drawn = Vec::new();
        while drawn.len() < 100 {
            let from = (draw(200) + 1, draw(150) + 1);
            let to = (draw(2 * from.0), draw(2 * from.1));
            if Resize::new(from, to).is_ok() {
                drawn.push((from, to));
            }
        }
        for (from, to) in sizes.into_iter().chain(drawn) {
            let frames: Vec<Vec<u8>> = vec![frame(from, 7, false), frame(from, 11, true), vec![255; (from.0 * from.1 * 3) as usize]];
            let refs: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
            let batch = twin(&refs, from, to);
            let mut resizer = lake_codec::RgbResizer::new(from, to).expect("swscale");
            let one = (to.0 * to.1 * 3) as usize;
            for (k, f) in frames.iter().enumerate() {
                let want = resizer.resize(f).expect("swscale resize");
                let got = &batch[k * one..(k + 1) * one];
                let first = got.iter().zip(&want).position(|(a, b)| a != b);
                assert_eq!(first, None, "{from:?} -> {to:?}, frame {k}: first difference at byte {first:?}");
            }
        }
    }

    #[test]
    fn normalised_planes_are_the_resized_frames_divided_channel_by_channel() {
        let (from, to) = ((48, 36), (20, 15));
        let frames = [frame(from, 3, false), frame(from, 5, true)];
        let refs: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
        let rgb = twin(&refs, from, to);
        let (mean, std) = ([0.485_f32, 0.456, 0.406], [0.229_f32, 0.224, 0.225]);
        let target = Target::Float32Chw { mean, std };
        let mut out = vec![0_u8; target.bytes(2, to.0, to.1)];
        resize_on_cpu(&refs, &Resize::new(from, to).expect("resize"), target, &mut out).expect("twin");
        let pixels = (to.0 * to.1) as usize;
        for (k, word) in out.chunks_exact(4).enumerate() {
            let (f, c, p) = (k / (3 * pixels), k / pixels % 3, k % pixels);
            let want = (f32::from(rgb[(f * pixels + p) * 3 + c]) / 255.0 - mean[c]) / std[c];
            assert_eq!(f32::from_ne_bytes(word.try_into().expect("4 bytes")).to_bits(), want.to_bits(), "frame {f} channel {c} pixel {p}");
        }
    }

    #[test]
    fn every_output_takes_its_share_of_inputs_inside_the_frame() {
        for (src, dst, one, align) in
            [(640, 64, 1 << 14, 4), (480, 48, 1 << 12, 2), (48, 72, 1 << 12, 2), (75, 37, 1 << 14, 4), (9, 9, 1 << 12, 2)]
        {
            let f = AreaFilter::new(src, dst, one, align).expect("filter");
            assert_eq!(f.positions.len(), dst as usize);
            assert_eq!(f.coefficients.len(), f.taps * dst as usize);
            for (i, taps) in f.coefficients.chunks_exact(f.taps).enumerate() {
                let sum: i64 = taps.iter().map(|&c| i64::from(c)).sum();
                assert_eq!(sum, one, "{src} -> {dst}: output {i} sums to {sum}");
                let first = f.positions[i];
                assert!(first >= 0 && (first as u32) < src, "{src} -> {dst}: output {i} starts at {first}");
                for (k, &c) in taps.iter().enumerate() {
                    assert!(first as u32 + (k as u32) < src || c == 0, "{src} -> {dst}: output {i} weighs a pixel past the end");
                }
            }
        }
        assert_eq!(AreaFilter::new(9, 9, 1 << 12, 2).expect("filter").taps, 1, "an unchanged side is copied");
        assert_eq!(AreaFilter::new(48, 72, 1 << 12, 2).expect("filter").taps, 2, "enlarging is linear");
    }

    #[test]
    fn sizes_the_kernels_cannot_repeat_are_refused() {
        let odd = Resize::new((33, 20), (16, 10)).expect_err("odd width halved");
        assert!(odd.to_string().contains("odd width"), "{odd}");
        assert!(Resize::new((33, 20), (17, 10)).is_ok(), "an odd width shrunk less than half keeps chroma per pixel");
        assert!(Resize::new((0, 20), (16, 10)).is_err());
        assert!(Resize::new((16, 10), (16, 10)).expect_err("same size").to_string().contains("already that size"));
        assert!(Resize::new((64_000, 20), (16, 10)).is_err(), "4000 pixels into one");
        let resize = Resize::new((8, 4), (4, 2)).expect("resize");
        let mut out = vec![0_u8; Target::Rgb24.bytes(1, 4, 2)];
        let short = resize_on_cpu(&[&[0_u8; 10]], &resize, Target::Rgb24, &mut out).expect_err("short frame");
        assert!(short.to_string().contains("frame 0 holds 10 bytes"), "{short}");
        let rgb = vec![0_u8; 8 * 4 * 3];
        assert!(resize_on_cpu(&[&rgb], &resize, Target::Rgb24, &mut out[1..]).is_err());
    }
}
