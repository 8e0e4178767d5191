//! YUV 4:2:0 → RGB for a batch of frames: the CUDA kernel and its CPU twin.
//!
//! Each output pixel is one thread (one loop turn in the twin). For pixel `(x, y)` of frame `f`
//! in an 8-bit layout (`Yuv420p`, `Nv12`), with a [`YuvToRgb`]:
//!
//! ```text
//! L = luma(x, y)   U, V = chroma(x / 2, y / 2)
//! y' = ((8·L − y_offset) · y_gain) >> 16   u = 8·U − 1024   v = 8·V − 1024
//! R = clamp(y' + ((v · v_to_r) >> 16))
//! G = clamp(y' + ((u · u_to_g) >> 16) + ((v · v_to_g) >> 16))
//! B = clamp(y' + ((u · u_to_b) >> 16))
//! ```
//!
//! and in a 10-bit layout (`Yuv420p10`, `P010`), with a [`YuvToRgb10`], the arithmetic its
//! documentation gives (luma and chroma rounded to 8 bits, chroma from one row or the mean of
//! two, libswscale's table formulas). Then RGB24 stores `R, G, B` at `((f·h + y)·w + x)·3`;
//! Float32Chw stores `X = (C / 255 − mean[c]) / std[c]` in float32 at `((f·3 + c)·h + y)·w + x`,
//! and Bf16Chw stores `X` rounded to bfloat16 ([`bf16_bits`]) at the same index, as 16-bit
//! little-endian words.
//!
//! Both arithmetics equal libswscale's conversion to RGB24 as lake's loader runs it: the 8-bit
//! one on every YUV triple, the 10-bit one where [`YuvToRgb10`] says.

use lake_codec::YuvToRgb;

mod ten_bit;

pub use ten_bit::YuvToRgb10;

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
    /// `yuv420p10le` frames: the planes of [`Layout::Yuv420p`] with each sample a 16-bit
    /// little-endian word whose low 10 bits are the value (the high 6 are ignored).
    Yuv420p10,
    /// NVDEC's P010 surfaces (and its P016 surfaces of a 10-bit stream): the rows of
    /// [`Layout::Nv12`] with each sample a 16-bit little-endian word whose high 10 bits are the
    /// value (the low 6 are ignored).
    P010 {
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
            Layout::Yuv420p10 => 2 * lake_codec::yuv420p_bytes(width, height),
            Layout::Nv12 { pitch, uv_offset } | Layout::P010 { pitch, uv_offset } => {
                uv_offset as usize + (h.div_ceil(2) - 1) * pitch as usize + self.sample_bytes() * 2 * w.div_ceil(2)
            }
        }
    }

    /// Bytes a sample: 1 for the 8-bit layouts, 2 for the 10-bit ones.
    pub fn sample_bytes(self) -> usize {
        match self {
            Layout::Yuv420p | Layout::Nv12 { .. } => 1,
            Layout::Yuv420p10 | Layout::P010 { .. } => 2,
        }
    }

    /// The kernel's number for the layout, with its pitch and chroma offset (0 where packed).
    pub(crate) fn code(self, width: u32) -> (i32, u32, u64) {
        match self {
            Layout::Yuv420p => (0, width, 0),
            Layout::Nv12 { pitch, uv_offset } => (1, pitch, uv_offset),
            Layout::Yuv420p10 => (2, 2 * width, 0),
            Layout::P010 { pitch, uv_offset } => (3, pitch, uv_offset),
        }
    }

    fn check(self, width: u32, height: u32) -> crate::Result<()> {
        if width == 0 || height == 0 {
            return Err(crate::Error::Layout(format!("a {width}x{height} frame has no pixels")));
        }
        if let Layout::Nv12 { pitch, uv_offset } | Layout::P010 { pitch, uv_offset } = self {
            let row = self.sample_bytes() * 2 * (width as usize).div_ceil(2);
            if (pitch as usize) < row || pitch > i32::MAX as u32 {
                return Err(crate::Error::Layout(format!(
                    "a {self:?} pitch of {pitch} bytes does not fit a {width}-pixel row of {row} bytes"
                )));
            }
            if uv_offset < u64::from(pitch) * u64::from(height) {
                return Err(crate::Error::Layout(format!(
                    "{self:?} chroma at byte {uv_offset} overlaps the luma plane of {height} rows of {pitch} bytes"
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

/// The integers of a conversion: a [`YuvToRgb`] for the 8-bit layouts, a [`YuvToRgb10`] for the
/// 10-bit ones. Functions taking `&M` with `M: Into<Matrix>` take a reference to either, or to
/// a `Matrix`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Matrix {
    /// For [`Layout::Yuv420p`] and [`Layout::Nv12`].
    Bit8(YuvToRgb),
    /// For [`Layout::Yuv420p10`] and [`Layout::P010`].
    Bit10(YuvToRgb10),
}

impl From<YuvToRgb> for Matrix {
    fn from(m: YuvToRgb) -> Self {
        Matrix::Bit8(m)
    }
}

impl From<YuvToRgb10> for Matrix {
    fn from(m: YuvToRgb10) -> Self {
        Matrix::Bit10(m)
    }
}

impl From<&YuvToRgb> for Matrix {
    fn from(m: &YuvToRgb) -> Self {
        Matrix::Bit8(*m)
    }
}

impl From<&YuvToRgb10> for Matrix {
    fn from(m: &YuvToRgb10) -> Self {
        Matrix::Bit10(*m)
    }
}

impl Matrix {
    /// The kernel's six integers for frames of `layout`, in its parameter order.
    ///
    /// # Errors
    /// [`crate::Error::Layout`] when the matrix is not of the layout's bit depth.
    pub(crate) fn for_layout(self, layout: Layout) -> crate::Result<[i32; 6]> {
        match (self, layout.sample_bytes()) {
            (Matrix::Bit8(m), 1) => Ok([m.y_offset, m.y_gain, m.v_to_r, m.u_to_g, m.v_to_g, m.u_to_b]),
            (Matrix::Bit10(m), 2) => Ok([m.y_base, m.y_gain, m.v_to_r, m.u_to_g, m.v_to_g, m.u_to_b]),
            (m, _) => Err(crate::Error::Layout(format!("{layout:?} frames cannot be converted with {m:?}"))),
        }
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
    /// bfloat16 `[frames, 3, h, w]`, each a little-endian 16-bit word: Float32Chw's value
    /// rounded to the nearest bfloat16, ties to even, as CUDA's `__float2bfloat16_rn` rounds
    /// (NaN becomes `0x7FFF`); see [`bf16_bits`].
    Bf16Chw {
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
            Target::Bf16Chw { .. } => pixels * 3 * 2,
        }
    }

    /// The kernel's number for the target, with its mean and std.
    pub(crate) fn code(self) -> (i32, [f32; 3], [f32; 3]) {
        match self {
            Target::Rgb24 => (0, [0.0; 3], [1.0; 3]),
            Target::Float32Chw { mean, std } => (1, mean, std),
            Target::Bf16Chw { mean, std } => (2, mean, std),
        }
    }
}

/// `x` rounded to bfloat16, as its bits: to nearest, ties to even, on the float's bits (add
/// `0x7FFF` plus the bit that will be the lowest kept, drop the low 16), which is IEEE rounding
/// for every finite value and infinity; every NaN becomes `0x7FFF`, CUDA's canonical NaN. The
/// kernel's `lake_bf16` does the same operations.
pub fn bf16_bits(x: f32) -> u16 {
    let b = x.to_bits();
    if b & 0x7FFF_FFFF > 0x7F80_0000 {
        return 0x7FFF;
    }
    (b.wrapping_add(0x7FFF + ((b >> 16) & 1)) >> 16) as u16
}

/// The kernel, compiled by NVRTC at run time. Its operations and their order are the twin's
/// ([`convert_on_cpu`]); integer `>>` of a negative value is arithmetic in CUDA as in Rust.
/// Samples are read a byte at a time, so no frame, pitch or offset needs any alignment.
pub(crate) const KERNELS: &str = r#"
__device__ __forceinline__ int lake_clamp255(int v) { return v < 0 ? 0 : (v > 255 ? 255 : v); }

__device__ __forceinline__ int lake_u16(const unsigned char* p) { return p[0] | (p[1] << 8); }

__device__ __forceinline__ unsigned short lake_bf16(float x) {
    unsigned int b = __float_as_uint(x);
    if ((b & 0x7fffffffu) > 0x7f800000u) return (unsigned short)0x7fffu;
    return (unsigned short)((b + (0x7fffu + ((b >> 16) & 1u))) >> 16);
}

// Thread `i` of a launch over `count` frames of `width` × `height` pixels, one a thread: false
// past the last; else its frame `f`, its pixel `p` in the frame, at column `x` of row `y`.
__device__ __forceinline__ bool lake_pixel(int width, int height, int count, long long* f, long long* p, int* x, int* y)
{
    long long plane = (long long)width * height;
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= plane * count) return false;
    *f = i / plane;
    *p = i - *f * plane;
    *y = (int)(*p / width);
    *x = (int)(*p - (long long)*y * width);
    return true;
}

// Pixel `p` of frame `f` (of `plane` pixels) with bytes `r, g, b`, stored as `target` asks.
__device__ __forceinline__ void lake_store(
    int target, void* out, int r, int g, int b, long long f, long long p, long long plane,
    float mean0, float mean1, float mean2, float std0, float std1, float std2)
{
    if (target == 0) {
        unsigned char* o = (unsigned char*)out + (f * plane + p) * 3;
        o[0] = (unsigned char)r;
        o[1] = (unsigned char)g;
        o[2] = (unsigned char)b;
    } else {
        float xr = ((float)r / 255.0f - mean0) / std0;
        float xg = ((float)g / 255.0f - mean1) / std1;
        float xb = ((float)b / 255.0f - mean2) / std2;
        long long at = f * 3 * plane + p;
        if (target == 1) {
            float* o = (float*)out + at;
            o[0] = xr;
            o[plane] = xg;
            o[2 * plane] = xb;
        } else {
            unsigned short* o = (unsigned short*)out + at;
            o[0] = lake_bf16(xr);
            o[plane] = lake_bf16(xg);
            o[2 * plane] = lake_bf16(xb);
        }
    }
}

extern "C" __global__ void lake_yuv_to_rgb(
    const unsigned long long* frames, int count, int width, int height,
    int layout, int pitch, unsigned long long uv_offset,
    int y_term, int y_gain, int v_to_r, int u_to_g, int v_to_g, int u_to_b,
    int target, void* out,
    float mean0, float mean1, float mean2, float std0, float std1, float std2)
{
    long long f, p;
    int x, y;
    if (!lake_pixel(width, height, count, &f, &p, &x, &y)) return;
    long long plane = (long long)width * height;
    const unsigned char* src = (const unsigned char*)frames[f];
    long long cw = (width + 1) / 2, ch = (height + 1) / 2;
    int r, g, b;
    if (layout < 2) {
        int l, u, v;
        if (layout == 1) {
            l = src[(long long)y * pitch + x];
            const unsigned char* uv = src + uv_offset + (long long)(y / 2) * pitch + (x / 2) * 2;
            u = uv[0];
            v = uv[1];
        } else {
            long long c = (long long)(y / 2) * cw + x / 2;
            l = src[p];
            u = src[plane + c];
            v = src[plane + cw * ch + c];
        }
        int uu = 8 * u - 1024;
        int vv = 8 * v - 1024;
        int yy = ((8 * l - y_term) * y_gain) >> 16;
        r = lake_clamp255(yy + ((vv * v_to_r) >> 16));
        g = lake_clamp255(yy + ((uu * u_to_g) >> 16) + ((vv * v_to_g) >> 16));
        b = lake_clamp255(yy + ((uu * u_to_b) >> 16));
    } else {
        int yr = (y == height - 1 && (y & 1)) ? y - 1 : y;
        int ca = (yr - 1) >> 1;
        if (ca < 0) ca = 0;
        int cb = yr >> 1;
        int l, ua, va, ub, vb;
        if (layout == 3) {
            l = lake_u16(src + (long long)y * pitch + 2 * x) >> 6;
            const unsigned char* a = src + uv_offset + (long long)ca * pitch + (x / 2) * 4;
            const unsigned char* bb = src + uv_offset + (long long)cb * pitch + (x / 2) * 4;
            ua = lake_u16(a) >> 6;
            va = lake_u16(a + 2) >> 6;
            ub = lake_u16(bb) >> 6;
            vb = lake_u16(bb + 2) >> 6;
        } else {
            long long a = ca * cw + x / 2, bb = cb * cw + x / 2;
            l = lake_u16(src + 2 * p) & 1023;
            ua = lake_u16(src + 2 * (plane + a)) & 1023;
            ub = lake_u16(src + 2 * (plane + bb)) & 1023;
            va = lake_u16(src + 2 * (plane + cw * ch + a)) & 1023;
            vb = lake_u16(src + 2 * (plane + cw * ch + bb)) & 1023;
        }
        int l8 = (l + 2) >> 2;
        int u8 = (ua + ub + 4) >> 3;
        int v8 = (va + vb + 4) >> 3;
        if (u8 > 255) u8 = 255;
        if (v8 > 255) v8 = 255;
        int dr = ((v8 * v_to_r) >> 16) - (v_to_r >> 9);
        int dg = ((u8 * u_to_g) >> 16) - (u_to_g >> 9) + ((v8 * v_to_g) >> 16) - (v_to_g >> 9);
        int db = ((u8 * u_to_b) >> 16) - (u_to_b >> 9);
        r = lake_clamp255(((l8 + dr) * y_gain + y_term) >> 16);
        g = lake_clamp255(((l8 + dg) * y_gain + y_term) >> 16);
        b = lake_clamp255(((l8 + db) * y_gain + y_term) >> 16);
    }
    lake_store(target, out, r, g, b, f, p, plane, mean0, mean1, mean2, std0, std1, std2);
}
"#;

/// The kernel's entry point.
pub(crate) const ENTRY: &str = "lake_yuv_to_rgb";

/// A little-endian 16-bit sample at byte `at`.
fn sample16(src: &[u8], at: i64) -> i32 {
    i32::from(u16::from_le_bytes([src[at as usize], src[at as usize + 1]]))
}

/// The CPU twin of the kernel, and its specification: converts `frames` (each as `geometry`
/// says) into `out` as `target` asks, with `matrix` (of the layout's bit depth), with the
/// kernel's operations in the kernel's order, one loop turn per thread.
///
/// # Errors
/// [`crate::Error::Layout`] when a frame is shorter than its layout needs, `out` is not
/// [`Target::bytes`] long, or the matrix is not of the layout's bit depth.
pub fn convert_on_cpu<M: Into<Matrix> + Copy>(
    frames: &[&[u8]],
    geometry: Geometry,
    matrix: &M,
    target: Target,
    out: &mut [u8],
) -> crate::Result<()> {
    geometry.check()?;
    let Geometry { width, height, layout } = geometry;
    let [y_term, y_gain, v_to_r, u_to_g, v_to_g, u_to_b] = (*matrix).into().for_layout(layout)?;
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
    let (code, pitch, uv_offset) = layout.code(width);
    let (pitch, uv_offset) = (i64::from(pitch), uv_offset as i64);
    let (w, h) = (i64::from(width), i64::from(height));
    let plane = w * h;
    let (cw, ch) = ((w + 1) / 2, (h + 1) / 2);
    for i in 0..plane * frames.len() as i64 {
        let f = i / plane;
        let p = i - f * plane;
        let y = p / w;
        let x = p - y * w;
        let src = frames[f as usize];
        let (r, g, b);
        if code < 2 {
            let (l, u, v) = if code == 1 {
                let uv = (uv_offset + (y / 2) * pitch + (x / 2) * 2) as usize;
                (src[(y * pitch + x) as usize], src[uv], src[uv + 1])
            } else {
                let c = (y / 2) * cw + x / 2;
                (src[p as usize], src[(plane + c) as usize], src[(plane + cw * ch + c) as usize])
            };
            let uu = 8 * i32::from(u) - 1024;
            let vv = 8 * i32::from(v) - 1024;
            let yy = ((8 * i32::from(l) - y_term) * y_gain) >> 16;
            r = (yy + ((vv * v_to_r) >> 16)).clamp(0, 255);
            g = (yy + ((uu * u_to_g) >> 16) + ((vv * v_to_g) >> 16)).clamp(0, 255);
            b = (yy + ((uu * u_to_b) >> 16)).clamp(0, 255);
        } else {
            let yr = if y == h - 1 && y & 1 == 1 { y - 1 } else { y };
            let ca = ((yr - 1) >> 1).max(0);
            let cb = yr >> 1;
            let (l, ua, va, ub, vb) = if code == 3 {
                let a = uv_offset + ca * pitch + (x / 2) * 4;
                let bb = uv_offset + cb * pitch + (x / 2) * 4;
                let l = sample16(src, y * pitch + 2 * x) >> 6;
                (l, sample16(src, a) >> 6, sample16(src, a + 2) >> 6, sample16(src, bb) >> 6, sample16(src, bb + 2) >> 6)
            } else {
                let (a, bb) = (ca * cw + x / 2, cb * cw + x / 2);
                let l = sample16(src, 2 * p) & 1023;
                let ua = sample16(src, 2 * (plane + a)) & 1023;
                let ub = sample16(src, 2 * (plane + bb)) & 1023;
                let va = sample16(src, 2 * (plane + cw * ch + a)) & 1023;
                let vb = sample16(src, 2 * (plane + cw * ch + bb)) & 1023;
                (l, ua, va, ub, vb)
            };
            let l8 = (l + 2) >> 2;
            let u8 = ((ua + ub + 4) >> 3).min(255);
            let v8 = ((va + vb + 4) >> 3).min(255);
            let dr = ((v8 * v_to_r) >> 16) - (v_to_r >> 9);
            let dg = ((u8 * u_to_g) >> 16) - (u_to_g >> 9) + ((v8 * v_to_g) >> 16) - (v_to_g >> 9);
            let db = ((u8 * u_to_b) >> 16) - (u_to_b >> 9);
            r = (((l8 + dr) * y_gain + y_term) >> 16).clamp(0, 255);
            g = (((l8 + dg) * y_gain + y_term) >> 16).clamp(0, 255);
            b = (((l8 + db) * y_gain + y_term) >> 16).clamp(0, 255);
        }
        store(target, out, [r, g, b], f, p, plane);
    }
    Ok(())
}

/// Pixel `p` of frame `f` (of `plane` pixels) with bytes `rgb`, stored in `out` as `target`
/// asks: the kernels' `lake_store`.
pub(crate) fn store(target: Target, out: &mut [u8], rgb: [i32; 3], f: i64, p: i64, plane: i64) {
    match target {
        Target::Rgb24 => {
            let o = ((f * plane + p) * 3) as usize;
            out[o..o + 3].copy_from_slice(&rgb.map(|c| c as u8));
        }
        Target::Float32Chw { mean, std } | Target::Bf16Chw { mean, std } => {
            for (c, value) in rgb.into_iter().enumerate() {
                let at = ((f * 3 + c as i64) * plane + p) as usize;
                let x = (value as f32 / 255.0 - mean[c]) / std[c];
                if let Target::Float32Chw { .. } = target {
                    out[at * 4..at * 4 + 4].copy_from_slice(&x.to_ne_bytes());
                } else {
                    out[at * 2..at * 2 + 2].copy_from_slice(&bf16_bits(x).to_le_bytes());
                }
            }
        }
    }
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
        // Every (Y, U, V) once, for two matrices and both ranges.
        let (w, h, yuv) = lake_codec::every_yuv_triple();
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

    /// The bfloat16 of `x` as CUDA's `__float2bfloat16_rn` makes it: `half`'s rounding for
    /// every number, CUDA's canonical NaN for every NaN.
    fn reference_bf16(x: f32) -> u16 {
        if x.is_nan() { 0x7FFF } else { half::bf16::from_f32(x).to_bits() }
    }

    #[test]
    fn bf16_rounds_to_nearest_even_on_ties_and_edges() {
        let mut bits: Vec<u32> = (0..=u32::MAX).step_by(65_537).collect();
        for high in (0..=0xFFFF_u32).step_by(3) {
            // Ties (both parities of the kept bit), one below and one above each tie, and the
            // lowest and highest low halves.
            for low in [0x8000, 0x7FFF, 0x8001, 0x0000, 0xFFFF] {
                bits.push(high << 16 | low);
            }
        }
        let edges = [0x7F7F_8000_u32, 0x7F7F_7FFF, 0x7F7F_FFFF, 0x7F80_0000, 0xFF80_0000, 0x0000_8000, 0x0001_8000, 0x8000_0000];
        bits.extend(edges);
        for b in bits {
            let x = f32::from_bits(b);
            assert_eq!(bf16_bits(x), reference_bf16(x), "{b:#010x}");
        }
        assert_eq!(bf16_bits(f32::from_bits(0x3F80_8000)), 0x3F80, "a tie with an even kept bit stays");
        assert_eq!(bf16_bits(f32::from_bits(0x3F81_8000)), 0x3F82, "a tie with an odd kept bit goes up");
        assert_eq!(bf16_bits(f32::from_bits(0x7F7F_8000)), 0x7F80, "the tie above the largest bfloat16 is infinity");
        assert_eq!(bf16_bits(f32::from_bits(0xFFC0_0001)), 0x7FFF, "every NaN is CUDA's");
        assert_eq!(bf16_bits(f32::from_bits(0x7F80_0001)), 0x7FFF, "signalling NaNs too");
    }

    #[test]
    fn bf16_planes_are_the_float_planes_rounded() {
        let (w, h) = (34_u32, 12_u32);
        let frames: Vec<Vec<u8>> = (0..2).map(|k| noise(lake_codec::yuv420p_bytes(w, h), 3 + k)).collect();
        let refs: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
        // ImageNet's statistics; then a zero std, whose 0 / 0 and x / 0 give NaN and infinities.
        for (mean, std) in [([0.485_f32, 0.456, 0.406], [0.229_f32, 0.224, 0.225]), ([0.0, 0.5, 1.0], [0.0, 1.0, 0.0])] {
            let float = Target::Float32Chw { mean, std };
            let mut floats = vec![0_u8; float.bytes(2, w, h)];
            convert_on_cpu(&refs, planes(w, h), &bt601(), float, &mut floats).expect("float32");
            let bf16 = Target::Bf16Chw { mean, std };
            let mut words = vec![0_u8; bf16.bytes(2, w, h)];
            convert_on_cpu(&refs, planes(w, h), &bt601(), bf16, &mut words).expect("bf16");
            assert_eq!(words.len() * 2, floats.len());
            let mut nan = false;
            for (k, (word, float)) in words.chunks_exact(2).zip(floats.chunks_exact(4)).enumerate() {
                let x = f32::from_ne_bytes(float.try_into().expect("4 bytes"));
                nan |= x.is_nan();
                assert_eq!(u16::from_le_bytes([word[0], word[1]]), reference_bf16(x), "value {k}: {x}");
            }
            assert_eq!(nan, std.contains(&0.0), "{mean:?} / {std:?}");
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
