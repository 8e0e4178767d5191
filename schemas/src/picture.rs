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

/// Reads a JPEG picture's headers up to its first scan, refusing what PIL or libjpeg refuse:
/// no marker after the start marker, a marker PIL does not know (0xFF01 to 0xFFBF), a second
/// start or frame header, a frame header libjpeg cannot decode (0xC8, 0xDE, 0xDF, 0xF0 to 0xFD)
/// or of a length its components do not give.
///
/// # Errors
/// What is wrong, when the bytes are no JPEG or its headers are cut short or have no frame
/// header before the first scan.
pub fn jpeg_header(bytes: &[u8]) -> Result<JpegHeader, String> {
    if !bytes.starts_with(&[0xFF, 0xD8, 0xFF]) {
        return Err("it does not start with a JPEG start-of-image marker".into());
    }
    let mut frame: Option<JpegHeader> = None;
    let mut exif: Option<Vec<u8>> = None;
    let mut xmp: Option<&[u8]> = None;
    let mut at = 2;
    loop {
        let Some((marker, after)) = next_marker(bytes, at) else {
            return Err("its headers are cut short before the first scan".into());
        };
        at = after;
        match marker {
            0xD9 => return Err("it ends before its first scan".into()),
            0xD8 => return Err("it has a second start-of-image marker".into()),
            0x01..=0xBF => return Err(format!("it has no JPEG marker where one is expected (0xFF{marker:02X})")),
            0xC8 | 0xDE | 0xDF | 0xF0..=0xFD => return Err(format!("it has a marker libjpeg does not decode (0xFF{marker:02X})")),
            m if standalone(m) => continue,
            _ => {}
        }
        let Some(length) = bytes.get(at..at + 2).map(|l| usize::from(l[0]) << 8 | usize::from(l[1])) else {
            return Err("its headers are cut short before the first scan".into());
        };
        let Some(segment) = bytes.get(at + 2..at + length.max(2)) else {
            return Err(format!("its segment 0xFF{marker:02X} is cut short"));
        };
        if marker == 0xDA {
            let frame = frame.ok_or_else(|| "it has no frame header (SOF) before its first scan".to_string())?;
            let orientation = match exif.as_deref().map(exif_orientation) {
                Some(Tag::Value(v)) => v,
                Some(Tag::Invalid) => 1,
                // No orientation tag in the EXIF block: PIL looks in the XMP packet.
                Some(Tag::Absent) | None => xmp.and_then(xmp_orientation).unwrap_or(1),
            };
            return Ok(JpegHeader { orientation, ..frame });
        }
        if frame_marker(marker) {
            if frame.is_some() {
                return Err("it has a second frame header (SOF)".into());
            }
            let [precision, h0, h1, w0, w1, components, ..] = *segment else {
                return Err("its frame header (SOF) is cut short".into());
            };
            if segment.len() != 6 + 3 * usize::from(components) {
                return Err(format!("its frame header (SOF) is {} bytes long for {components} components", segment.len() + 2));
            }
            let (width, height) = (u32::from(w0) << 8 | u32::from(w1), u32::from(h0) << 8 | u32::from(h1));
            if width == 0 || height == 0 {
                return Err(format!("its frame header gives no size ({width}x{height})"));
            }
            frame = Some(JpegHeader { width, height, components, precision, process: marker, orientation: 1 });
        }
        if marker == 0xE1 {
            // PIL takes the first EXIF segment and appends the later ones' bytes to it; of XMP
            // packets, the last.
            if let Some(more) = segment.strip_prefix(b"Exif\0\0") {
                exif.get_or_insert_with(Vec::new).extend_from_slice(more);
            } else if segment.starts_with(b"http://ns.adobe.com/xap/1.0/\0") {
                xmp = Some(segment);
            }
        }
        at += length;
    }
}

/// Whether a JPEG picture is cut short: its markers, walked as libjpeg walks them (segments by
/// their lengths, entropy-coded data up to the next marker, restart markers and stuffed bytes
/// within it), do not reach an end-of-image marker. So a thumbnail's end marker inside an EXIF
/// segment, or one inside a comment between progressive scans, is no end, and a segment that
/// runs past the last byte is cut short. What follows the end is not read, as PIL does not read
/// it.
pub fn jpeg_cut_short(bytes: &[u8]) -> bool {
    if !bytes.starts_with(&[0xFF, 0xD8]) {
        return true;
    }
    let mut at = 2;
    loop {
        let Some((marker, after)) = next_marker(bytes, at) else { return true };
        at = after;
        match marker {
            0xD9 => return false,
            m if standalone(m) => {}
            _ => {
                let Some(length) = bytes.get(at..at + 2).map(|l| usize::from(l[0]) << 8 | usize::from(l[1])) else { return true };
                match at.checked_add(length) {
                    Some(end) if end <= bytes.len() => at = end,
                    _ => return true,
                }
            }
        }
    }
}

/// What an EXIF block says of the orientation.
#[derive(Debug, PartialEq, Eq)]
enum Tag {
    /// No Orientation tag PIL would load.
    Absent,
    /// A tag whose value is no orientation (PIL then turns nothing, and reads no XMP).
    Invalid,
    /// An orientation, 1 to 8.
    Value(u8),
}

/// The Orientation tag (0x0112) of IFD0 in an EXIF (TIFF) block, read as PIL reads it: the
/// TIFF prefixes PIL knows, entries of SHORT, LONG, SSHORT or SLONG type with at least one value
/// (inline in the entry when they fit, else at the offset it holds), the first such entry
/// winning.
fn exif_orientation(tiff: &[u8]) -> Tag {
    const PREFIXES: [&[u8; 4]; 6] = [b"MM\0\x2A", b"II\x2A\0", b"MM\x2A\0", b"II\0\x2A", b"MM\0\x2B", b"II\x2B\0"];
    let Some(prefix) = tiff.get(0..4) else { return Tag::Absent };
    if !PREFIXES.iter().any(|p| p.as_slice() == prefix) {
        return Tag::Absent;
    }
    let little = prefix[0] == b'I';
    let bytes_at = |at: usize, n: usize| at.checked_add(n).and_then(|end| tiff.get(at..end));
    let u16_at =
        |at: usize| bytes_at(at, 2).map(|b| if little { u16::from_le_bytes([b[0], b[1]]) } else { u16::from_be_bytes([b[0], b[1]]) });
    let u32_at = |at: usize| {
        bytes_at(at, 4).map(|b| {
            let b = [b[0], b[1], b[2], b[3]];
            if little { u32::from_le_bytes(b) } else { u32::from_be_bytes(b) }
        })
    };
    let Some(ifd) = u32_at(4).map(|o| o as usize) else { return Tag::Absent };
    let Some(entries) = u16_at(ifd) else { return Tag::Absent };
    for i in 0..usize::from(entries) {
        let entry = ifd.saturating_add(2 + 12 * i);
        let (Some(tag), Some(kind), Some(count)) = (u16_at(entry), u16_at(entry.saturating_add(2)), u32_at(entry.saturating_add(4))) else {
            return Tag::Absent;
        };
        if tag != 0x0112 || count == 0 {
            continue;
        }
        let size = match kind {
            3 | 8 => 2,
            4 | 9 => 4,
            _ => continue,
        };
        let inline = u64::from(count) * size <= 4;
        let at = if inline { Some(entry.saturating_add(8)) } else { u32_at(entry.saturating_add(8)).map(|o| o as usize) };
        let value = match (kind, at) {
            (3, Some(at)) => u16_at(at).map(i64::from),
            (8, Some(at)) => u16_at(at).map(|v| i64::from(v as i16)),
            (4, Some(at)) => u32_at(at).map(i64::from),
            (9, Some(at)) => u32_at(at).map(|v| i64::from(v as i32)),
            _ => None,
        };
        return match value {
            Some(v @ 1..=8) => Tag::Value(v as u8),
            Some(_) => Tag::Invalid,
            None => Tag::Absent,
        };
    }
    Tag::Absent
}

/// The orientation an XMP packet gives (`tiff:Orientation="6"` or `<tiff:Orientation>6<`), as
/// PIL finds it when the EXIF block has none.
fn xmp_orientation(xmp: &[u8]) -> Option<u8> {
    let key = b"tiff:Orientation";
    let at = xmp.windows(key.len()).position(|w| w == key)? + key.len();
    let (quote, digit) = (xmp.get(at)?, xmp.get(at + 1..)?);
    let digit = match quote {
        b'=' if digit.first() == Some(&b'"') => *digit.get(1)?,
        b'>' => *digit.first()?,
        _ => return None,
    };
    let v = digit.checked_sub(b'0').filter(|v| *v <= 9)?;
    (1..=8).contains(&v).then_some(v)
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
        let sos = junk.windows(2).position(|m| m == [0xFF, 0xDA]).unwrap();
        junk.splice(sos..sos, [0x00, 0x13, 0x37, 0xFF, 0xFF]);
        assert_eq!(jpeg_header(&junk).unwrap().shown_size(), (48, 36));
        assert!(jpeg_header(b"\x89PNG").is_err() && jpeg_header(&[0xFF, 0xD8, 0xFF, 0xC0, 0x00]).is_err());
        // What PIL or libjpeg refuse: no marker right after the start, a marker PIL does not
        // know, a second frame header.
        let plain_bytes = skeleton(48, 36, None);
        let mut no_ff = plain_bytes.clone();
        no_ff.insert(2, 0x00);
        assert!(jpeg_header(&no_ff).is_err());
        let mut tem = plain_bytes.clone();
        tem.splice(2..2, [0xFF, 0x01]);
        assert!(jpeg_header(&tem).unwrap_err().contains("0xFF01"));
        let sof = plain_bytes.windows(2).position(|m| m == [0xFF, 0xC0]).unwrap();
        let mut two = plain_bytes.clone();
        two.splice(sof..sof, plain_bytes[sof..sof + 13].to_vec());
        assert!(jpeg_header(&two).unwrap_err().contains("second frame header"));
    }

    /// `skeleton` with APP1 segments of `payloads` (each after its own prefix) after SOI.
    fn with_app1(payloads: &[&[u8]]) -> Vec<u8> {
        let base = skeleton(48, 36, None);
        let mut out = base[..2].to_vec();
        for p in payloads {
            out.extend_from_slice(&[0xFF, 0xE1]);
            out.extend_from_slice(&((p.len() + 2) as u16).to_be_bytes());
            out.extend_from_slice(p);
        }
        out.extend_from_slice(&base[2..]);
        out
    }

    #[test]
    fn orientation_is_found_where_pil_finds_it() {
        let exif = |o: u16| [b"Exif\0\0".as_slice(), &tiff(true, o)].concat();
        // PIL reads the first EXIF segment with the later ones' bytes after it.
        assert_eq!(jpeg_header(&with_app1(&[&exif(6), &exif(1)])).unwrap().orientation, 6);
        // XMP counts when the EXIF block has no orientation tag, not when it has an invalid one.
        let xmp = b"http://ns.adobe.com/xap/1.0/\0<x:xmpmeta><rdf:Description tiff:Orientation=\"8\"/></x:xmpmeta>";
        assert_eq!(jpeg_header(&with_app1(&[xmp])).unwrap().orientation, 8);
        let xmp_element = b"http://ns.adobe.com/xap/1.0/\0<tiff:Orientation>3</tiff:Orientation>";
        assert_eq!(jpeg_header(&with_app1(&[xmp_element])).unwrap().orientation, 3);
        assert_eq!(jpeg_header(&with_app1(&[&exif(9), xmp])).unwrap().orientation, 1);
        // A TIFF prefix PIL does not know: no orientation.
        let mut unknown = tiff(true, 6);
        unknown[2..4].copy_from_slice(&[0, 0]);
        assert_eq!(exif_orientation(&unknown), Tag::Absent);
        // SSHORT counts; a count of 0 does not, and a later entry then does.
        let mut sshort = tiff(false, 6);
        sshort[12..14].copy_from_slice(&8u16.to_be_bytes());
        assert_eq!(exif_orientation(&sshort), Tag::Value(6));
        let mut empty = tiff(false, 6);
        empty[14..18].copy_from_slice(&0u32.to_be_bytes());
        assert_eq!(exif_orientation(&empty), Tag::Absent);
        // An IFD offset past the block: nothing, no panic.
        let mut far = tiff(true, 6);
        far[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(exif_orientation(&far), Tag::Absent);
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
        // Damaged entropy data that looks like a segment running past the last byte: cut short
        // (libjpeg hits the end of the data inside it).
        let mut damaged = whole.clone();
        let data = damaged.len() - 9;
        damaged[data..data + 4].copy_from_slice(&[0xFF, 0xFE, 0xFF, 0xF0]);
        assert!(jpeg_cut_short(&damaged));
        // An end marker inside a comment between scans is no end.
        let mut comment = whole[..whole.len() - 2].to_vec();
        comment.extend_from_slice(&[0xFF, 0xFE, 0x00, 0x04, 0xFF, 0xD9]);
        assert!(jpeg_cut_short(&comment));
        comment.extend_from_slice(&[0xFF, 0xD9]);
        assert!(!jpeg_cut_short(&comment));
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
