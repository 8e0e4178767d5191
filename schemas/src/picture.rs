//! What a JPEG picture's headers say, read the way libjpeg (and so PIL, LeRobot's reader) reads
//! them: segments walked by their lengths, bytes between segments that are no marker skipped,
//! and the EXIF orientation that Hugging Face `datasets` applies (`ImageOps.exif_transpose`)
//! when LeRobot loads a picture. Ingest checks pictures with it; the loader sizes and turns
//! them with it.

/// A JPEG picture's frame header (SOF) and EXIF orientation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JpegHeader {
    /// Width as stored.
    pub width: u32,
    /// Height as stored.
    pub height: u32,
    /// Colour components: 1 greyscale, 3 YCbCr or RGB, 4 CMYK or YCCK.
    pub components: u8,
    /// Bits per sample.
    pub precision: u8,
    /// The frame marker's second byte: 0xC0 baseline, 0xC1 extended, 0xC2 progressive, 0xC3
    /// lossless, 0xC9/0xCA arithmetic-coded…
    pub process: u8,
    /// EXIF orientation (1 to 8; 1, upright, when there is none).
    pub orientation: u8,
}

impl JpegHeader {
    /// The size a reader that applies the orientation shows: width and height swap for
    /// orientations 5 to 8 (a quarter turn).
    pub fn shown_size(&self) -> (u32, u32) {
        if (5..=8).contains(&self.orientation) { (self.height, self.width) } else { (self.width, self.height) }
    }

    /// Why this build cannot decode the picture to RGB as LeRobot reads it, if it cannot:
    /// CMYK (PIL reads four channels), samples of other than 8 bits, lossless and hierarchical
    /// JPEG (Debian's libjpeg-turbo 2.1 decodes neither).
    pub fn unsupported(&self) -> Option<String> {
        if self.components == 4 {
            return Some("the JPEG picture is CMYK: LeRobot reads it as 4 channels, and lake's camera columns are RGB".into());
        }
        if self.precision != 8 {
            return Some(format!("the JPEG picture has {}-bit samples; lake decodes 8-bit JPEG", self.precision));
        }
        if !matches!(self.process, 0xC0 | 0xC1 | 0xC2 | 0xC9 | 0xCA) {
            let kind = if matches!(self.process, 0xC3 | 0xCB) { "lossless" } else { "hierarchical" };
            return Some(format!(
                "the JPEG picture is {kind} (frame marker 0xFF{:02X}), which this build's libjpeg-turbo cannot decode",
                self.process
            ));
        }
        None
    }
}

/// The next marker from `at`: libjpeg skips bytes that are no marker (with a warning) and any
/// number of 0xFF fill bytes. Returns the marker's second byte and the position after it.
fn next_marker(bytes: &[u8], mut at: usize) -> Option<(u8, usize)> {
    loop {
        while *bytes.get(at)? != 0xFF {
            at += 1;
        }
        while *bytes.get(at)? == 0xFF {
            at += 1;
        }
        let marker = *bytes.get(at)?;
        at += 1;
        if marker != 0x00 {
            return Some((marker, at));
        }
    }
}

/// Whether a marker stands alone (no length and segment after it).
fn standalone(marker: u8) -> bool {
    matches!(marker, 0x01 | 0xD0..=0xD9)
}

fn frame_marker(marker: u8) -> bool {
    matches!(marker, 0xC0..=0xCF) && !matches!(marker, 0xC4 | 0xC8 | 0xCC)
}

/// Reads a JPEG picture's headers up to its first scan.
///
/// # Errors
/// What is wrong, when the bytes are no JPEG or its headers are cut short or have no frame
/// header before the first scan.
pub fn jpeg_header(bytes: &[u8]) -> Result<JpegHeader, String> {
    if !bytes.starts_with(&[0xFF, 0xD8]) {
        return Err("it does not start with a JPEG start-of-image marker".into());
    }
    let (mut frame, mut orientation, mut at) = (None, 1, 2);
    loop {
        let Some((marker, after)) = next_marker(bytes, at) else {
            return Err("its headers are cut short before the first scan".into());
        };
        at = after;
        if marker == 0xD9 {
            return Err("it ends before its first scan".into());
        }
        if standalone(marker) {
            continue;
        }
        let Some(length) = bytes.get(at..at + 2).map(|l| usize::from(l[0]) << 8 | usize::from(l[1])) else {
            return Err("its headers are cut short before the first scan".into());
        };
        let Some(segment) = bytes.get(at + 2..at + length.max(2)) else {
            return Err(format!("its segment 0xFF{marker:02X} is cut short"));
        };
        if marker == 0xDA {
            return frame
                .ok_or_else(|| "it has no frame header (SOF) before its first scan".to_string())
                .map(|f: JpegHeader| JpegHeader { orientation, ..f });
        }
        if frame_marker(marker) && frame.is_none() {
            let [precision, h0, h1, w0, w1, components, ..] = *segment else {
                return Err("its frame header (SOF) is cut short".into());
            };
            let (width, height) = (u32::from(w0) << 8 | u32::from(w1), u32::from(h0) << 8 | u32::from(h1));
            if width == 0 || height == 0 {
                return Err(format!("its frame header gives no size ({width}x{height})"));
            }
            frame = Some(JpegHeader { width, height, components, precision, process: marker, orientation: 1 });
        }
        // The last EXIF segment counts, as in PIL.
        if marker == 0xE1
            && let Some(tiff) = segment.strip_prefix(b"Exif\0\0")
        {
            orientation = exif_orientation(tiff).unwrap_or(1);
        }
        at += length;
    }
}

/// Whether a JPEG picture is cut short: no end-of-image marker follows its first scan's header.
/// The headers before it are walked by their lengths (so a thumbnail's end marker inside an
/// EXIF segment is no end); after it, entropy-coded data never holds 0xFF 0xD9 (a 0xFF there is
/// followed by 0x00 or a restart marker), so the first such pair is the end, also when the data
/// before it is damaged (libjpeg decodes around that, with a warning). What follows the end is
/// not read, as PIL does not read it.
pub fn jpeg_cut_short(bytes: &[u8]) -> bool {
    if !bytes.starts_with(&[0xFF, 0xD8]) {
        return true;
    }
    let mut at = 2;
    loop {
        let Some((marker, after)) = next_marker(bytes, at) else { return true };
        at = after;
        if marker == 0xD9 {
            return false;
        }
        if standalone(marker) {
            continue;
        }
        let Some(length) = bytes.get(at..at + 2).map(|l| usize::from(l[0]) << 8 | usize::from(l[1])) else { return true };
        if at + length > bytes.len() {
            return true;
        }
        at += length;
        if marker == 0xDA {
            return !bytes[at..].windows(2).any(|pair| pair == [0xFF, 0xD9]);
        }
    }
}

/// The Orientation tag (0x0112) of IFD0 in an EXIF (TIFF) block, when it is 1 to 8.
fn exif_orientation(tiff: &[u8]) -> Option<u8> {
    let little = match tiff.get(0..2)? {
        b"II" => true,
        b"MM" => false,
        _ => return None,
    };
    let u16_at =
        |at: usize| tiff.get(at..at + 2).map(|b| if little { u16::from_le_bytes([b[0], b[1]]) } else { u16::from_be_bytes([b[0], b[1]]) });
    let u32_at = |at: usize| {
        tiff.get(at..at + 4).map(|b| {
            let b = [b[0], b[1], b[2], b[3]];
            if little { u32::from_le_bytes(b) } else { u32::from_be_bytes(b) }
        })
    };
    let ifd = u32_at(4)? as usize;
    let entries = usize::from(u16_at(ifd)?);
    for i in 0..entries {
        let entry = ifd + 2 + 12 * i;
        if u16_at(entry)? != 0x0112 {
            continue;
        }
        let value = match u16_at(entry + 2)? {
            3 => u32::from(u16_at(entry + 8)?),
            4 => u32_at(entry + 8)?,
            _ => return None,
        };
        return u8::try_from(value).ok().filter(|v| (1..=8).contains(v));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tiny JPEG skeleton: SOI, an optional EXIF segment, SOF0 of `w`x`h`, SOS, data, EOI.
    fn skeleton(w: u16, h: u16, exif: Option<&[u8]>) -> Vec<u8> {
        let mut out = vec![0xFF, 0xD8];
        if let Some(tiff) = exif {
            let length = (2 + 6 + tiff.len()) as u16;
            out.extend_from_slice(&[0xFF, 0xE1]);
            out.extend_from_slice(&length.to_be_bytes());
            out.extend_from_slice(b"Exif\0\0");
            out.extend_from_slice(tiff);
        }
        out.extend_from_slice(&[0xFF, 0xC0, 0x00, 0x0B, 8]);
        out.extend_from_slice(&h.to_be_bytes());
        out.extend_from_slice(&w.to_be_bytes());
        out.extend_from_slice(&[1, 1, 0x11, 0]);
        out.extend_from_slice(&[0xFF, 0xDA, 0x00, 0x08, 1, 1, 0, 0, 63, 0]);
        out.extend_from_slice(&[0x12, 0xFF, 0x00, 0x34, 0xFF, 0xD0, 0x56]);
        out.extend_from_slice(&[0xFF, 0xD9]);
        out
    }

    fn tiff(little: bool, orientation: u16) -> Vec<u8> {
        let u16b = |v: u16| if little { v.to_le_bytes() } else { v.to_be_bytes() };
        let u32b = |v: u32| if little { v.to_le_bytes() } else { v.to_be_bytes() };
        let mut t = if little { b"II".to_vec() } else { b"MM".to_vec() };
        t.extend_from_slice(&u16b(42));
        t.extend_from_slice(&u32b(8));
        t.extend_from_slice(&u16b(1));
        t.extend_from_slice(&u16b(0x0112));
        t.extend_from_slice(&u16b(3));
        t.extend_from_slice(&u32b(1));
        t.extend_from_slice(&u16b(orientation));
        t.extend_from_slice(&[0, 0]);
        t.extend_from_slice(&u32b(0));
        t
    }

    #[test]
    fn headers_sizes_and_orientation() {
        let plain = jpeg_header(&skeleton(48, 36, None)).unwrap();
        assert_eq!((plain.width, plain.height, plain.components, plain.process, plain.orientation), (48, 36, 1, 0xC0, 1));
        assert_eq!(plain.shown_size(), (48, 36));
        for little in [true, false] {
            let turned = jpeg_header(&skeleton(48, 36, Some(&tiff(little, 6)))).unwrap();
            assert_eq!((turned.orientation, turned.shown_size()), (6, (36, 48)));
        }
        assert_eq!(jpeg_header(&skeleton(48, 36, Some(&tiff(true, 3)))).unwrap().shown_size(), (48, 36));
        assert_eq!(jpeg_header(&skeleton(48, 36, Some(&tiff(true, 9)))).unwrap().orientation, 1, "no such orientation");
        // Junk and fill bytes between segments are skipped, as libjpeg skips them.
        let mut junk = skeleton(48, 36, None);
        junk.splice(2..2, [0x00, 0x13, 0x37, 0xFF, 0xFF]);
        assert_eq!(jpeg_header(&junk).unwrap().shown_size(), (48, 36));
        assert!(jpeg_header(b"\x89PNG").is_err() && jpeg_header(&[0xFF, 0xD8, 0xFF, 0xC0, 0x00]).is_err());
    }

    #[test]
    fn cut_short_means_no_end_marker_after_the_scans() {
        let whole = skeleton(8, 8, Some(&tiff(true, 1)));
        assert!(!jpeg_cut_short(&whole));
        let mut trailing = whole.clone();
        trailing.extend_from_slice(b"\r\n\x00\x01garbage");
        assert!(!jpeg_cut_short(&trailing), "bytes after the end marker are not read");
        assert!(jpeg_cut_short(&whole[..whole.len() - 2]));
        assert!(jpeg_cut_short(&whole[..whole.len() - 5]));
        // An end marker inside a segment (a thumbnail's) is no end.
        let mut thumb = skeleton(8, 8, Some(&[b"II".as_slice(), &[0xFF, 0xD8, 0xFF, 0xD9]].concat()));
        let cut = thumb.len() - 8;
        thumb.truncate(cut);
        assert!(jpeg_cut_short(&thumb));
        // Damaged entropy data that looks like a marker with a length past the end: the end
        // marker after it still ends the picture.
        let mut damaged = whole;
        let data = damaged.len() - 9;
        damaged[data..data + 4].copy_from_slice(&[0xFF, 0xC4, 0xFF, 0xF0]);
        assert!(!jpeg_cut_short(&damaged));
    }

    #[test]
    fn unsupported_pictures_say_why() {
        let h = |components, precision, process| JpegHeader { width: 1, height: 1, components, precision, process, orientation: 1 };
        assert!(h(3, 8, 0xC2).unsupported().is_none() && h(1, 8, 0xC0).unsupported().is_none());
        assert!(h(4, 8, 0xC0).unsupported().unwrap().contains("CMYK"));
        assert!(h(3, 12, 0xC1).unsupported().unwrap().contains("12-bit"));
        assert!(h(3, 8, 0xC3).unsupported().unwrap().contains("lossless"));
    }
}
