//! JPEG pictures made with libjpeg-turbo: the compression of LeRobot's `JPEGCompression`
//! transform, whose torchvision `encode_jpeg` and `decode_image` are libjpeg's defaults (4:2:0
//! chroma, the accurate integer DCT, smooth chroma upsampling). TurboJPEG's own default DCT for
//! compression is the fast one below quality 96, so the accurate one is asked for.

use turbojpeg_sys as tj;

use crate::{Error, Result, decode::turbojpeg_rgb};

/// A TurboJPEG compressor.
struct Compressor(tj::tjhandle);

impl Drop for Compressor {
    fn drop(&mut self) {
        // SAFETY: the handle came from tjInitCompress and is destroyed once, here.
        unsafe { tj::tjDestroy(self.0) };
    }
}

/// `pixels` (`h` rows of `w` pixels of `format`) as a JPEG picture at `quality` (1 to 100) with
/// `subsampling`.
///
/// # Errors
/// [`Error::Encode`] with libjpeg's message when the picture cannot be compressed.
pub(crate) fn compress(pixels: &[u8], (w, h): (usize, usize), format: tj::TJPF, subsampling: tj::TJSAMP, quality: u8) -> Result<Vec<u8>> {
    let channels = pixels.len().checked_div(w * h).unwrap_or(0);
    if channels == 0 || pixels.len() != w * h * channels {
        return Err(Error::Encode(format!("{} bytes are not a {w}x{h} picture", pixels.len())));
    }
    // SAFETY: a plain constructor; null means failure.
    let handle = Compressor(unsafe { tj::tjInitCompress() });
    if handle.0.is_null() {
        return Err(Error::Encode("libjpeg-turbo could not make a compressor".into()));
    }
    let (mut out, mut size) = (std::ptr::null_mut(), 0);
    // SAFETY: `pixels` holds `h` rows of `w * channels` bytes (checked above); TurboJPEG
    // allocates the output, which is copied and freed here.
    unsafe {
        let rc = tj::tjCompress2(
            handle.0,
            pixels.as_ptr(),
            w as std::ffi::c_int,
            (w * channels) as std::ffi::c_int,
            h as std::ffi::c_int,
            format as std::ffi::c_int,
            &mut out,
            &mut size,
            subsampling as std::ffi::c_int,
            std::ffi::c_int::from(quality),
            tj::TJFLAG_ACCURATEDCT as std::ffi::c_int,
        );
        if rc != 0 {
            let message = std::ffi::CStr::from_ptr(tj::tjGetErrorStr2(handle.0)).to_string_lossy().into_owned();
            tj::tjFree(out);
            return Err(Error::Encode(format!("a {w}x{h} JPEG picture: {message}")));
        }
        let bytes = std::slice::from_raw_parts(out, size as usize).to_vec();
        tj::tjFree(out);
        Ok(bytes)
    }
}

/// `rgb` (`h` rows of `w` RGB pixels) compressed as a JPEG picture at `quality` (1 to 100) with
/// 4:2:0 chroma and decompressed again: the pixels a picture saved at that quality shows.
///
/// # Errors
/// [`Error::Encode`] or [`Error::Decode`] with libjpeg's message.
pub fn jpeg_round_trip(rgb: &[u8], (w, h): (usize, usize), quality: u8) -> Result<Vec<u8>> {
    if rgb.len() != w * h * 3 {
        return Err(Error::Encode(format!("{} bytes are not a {w}x{h} RGB picture", rgb.len())));
    }
    let jpeg = compress(rgb, (w, h), tj::TJPF_TJPF_RGB, tj::TJSAMP_TJSAMP_420, quality.clamp(1, 100))?;
    let mut out = vec![0u8; rgb.len()];
    turbojpeg_rgb(0, &jpeg, (w, h), &mut out)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A round trip keeps the size, changes a textured picture by a few levels at a high
    /// quality, and more at a low one; a flat picture comes back as it was.
    #[test]
    fn round_trips_lose_with_the_quality() {
        let (w, h) = (33, 18);
        let picture: Vec<u8> = (0..w * h * 3).map(|i| ((i * 37 + i / (w * 3) * 11) % 256) as u8).collect();
        let error = |q| {
            let back = jpeg_round_trip(&picture, (w, h), q).expect("round trip");
            assert_eq!(back.len(), picture.len());
            back.iter().zip(&picture).map(|(a, b)| u64::from(a.abs_diff(*b))).sum::<u64>()
        };
        assert!(error(95) < error(10), "{} {}", error(95), error(10));
        assert!(error(95) > 0);
        let flat = vec![128u8; w * h * 3];
        assert_eq!(jpeg_round_trip(&flat, (w, h), 50).expect("round trip"), flat);
        assert!(matches!(jpeg_round_trip(&flat[1..], (w, h), 50), Err(Error::Encode(_))));
    }
}
