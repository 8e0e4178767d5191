//! Writing packets back into an mp4 without re-encoding (stream copy), and reading back the
//! timestamps a reader of the written file sees.

use std::path::{Path, PathBuf};

use ffmpeg_next as ffmpeg;
use lake_schemas::CodecParams;

use crate::{Error, Result, codec_context};

/// An mp4 file of one video stream being written from packets as they were demuxed.
pub struct Mp4Writer {
    output: ffmpeg::format::context::Output,
    path: PathBuf,
    time_base: ffmpeg::Rational,
    file_time_base: ffmpeg::Rational,
    written: usize,
}

impl std::fmt::Debug for Mp4Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mp4Writer").field("path", &self.path).field("written", &self.written).finish_non_exhaustive()
    }
}

fn mux_error(path: &Path) -> impl Fn(ffmpeg::Error) -> Error + '_ {
    move |e| Error::Mux(format!("{}: {e}", path.display()))
}

impl Mp4Writer {
    /// Creates `path` for packets of the stream ingest recorded as `params`, timed in
    /// `time_base` (numerator, denominator), and writes its header.
    ///
    /// # Errors
    /// When FFmpeg has no decoder context for the codec, or the file cannot be written.
    pub fn create(path: &Path, params: &CodecParams, time_base: (i32, i32)) -> Result<Self> {
        let context = codec_context(params)?;
        let time_base = ffmpeg::Rational::new(time_base.0, time_base.1);
        let mut output = ffmpeg::format::output_as(path, "mp4").map_err(mux_error(path))?;
        {
            let mut stream = output.add_stream_with(&context).map_err(mux_error(path))?;
            stream.set_time_base(time_base);
            // SAFETY: the stream's parameters were just filled from the context; a zero tag lets
            // the mp4 muxer choose the sample entry for the codec.
            unsafe { (*(*stream.as_mut_ptr()).codecpar).codec_tag = 0 };
        }
        output.write_header().map_err(mux_error(path))?;
        let file_time_base = output.stream(0).map(|s| s.time_base()).ok_or_else(|| Error::Mux(format!("{}: no stream", path.display())))?;
        Ok(Self { output, path: path.to_path_buf(), time_base, file_time_base, written: 0 })
    }

    /// Appends one packet, its times in the stream's time base.
    ///
    /// # Errors
    /// When the muxer refuses it (timestamps out of order) or the file cannot be written.
    pub fn write(&mut self, data: &[u8], (pts, dts, duration): (i64, i64, i64), keyframe: bool) -> Result<()> {
        let mut packet = crate::context::packet(data, pts, dts, keyframe);
        packet.set_duration(duration);
        packet.set_stream(0);
        packet.rescale_ts(self.time_base, self.file_time_base);
        packet
            .write(&mut self.output)
            .map_err(|e| Error::Mux(format!("{}: packet {} (pts {pts}, dts {dts}): {e}", self.path.display(), self.written)))?;
        self.written += 1;
        Ok(())
    }

    /// Packets written so far.
    pub fn written(&self) -> usize {
        self.written
    }

    /// Writes the file's index and closes it.
    ///
    /// # Errors
    /// When the file cannot be written.
    pub fn finish(mut self) -> Result<()> {
        self.output.write_trailer().map_err(mux_error(&self.path))
    }
}

/// The presentation time, in seconds, of every packet of the first stream of the file at `path`
/// in file order (a packet without one reads as `-inf`): what a reader of the file sees.
///
/// # Errors
/// When the file cannot be opened or has no stream.
pub fn packet_times(path: &Path) -> Result<Vec<f64>> {
    crate::init_ffmpeg();
    let demux_error = |e: ffmpeg::Error| Error::Demux(format!("{}: {e}", path.display()));
    let mut input = ffmpeg::format::input(path).map_err(demux_error)?;
    let tb = input.stream(0).ok_or_else(|| Error::Demux(format!("{}: the file has no stream", path.display())))?.time_base();
    let scale = f64::from(tb.numerator()) / f64::from(tb.denominator());
    Ok(input.packets().map(|(_, p)| p.pts().map_or(f64::NEG_INFINITY, |t| t as f64 * scale)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packets_written_come_back_with_their_times() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join("out.mp4");
        let params =
            CodecParams { codec: "mjpeg".into(), width: 16, height: 16, pix_fmt: Some("yuvj420p".into()), ..CodecParams::default() };
        let mut writer = Mp4Writer::create(&path, &params, (1, 30)).expect("an mp4 for MJPEG");
        for k in 0..3 {
            writer.write(&[0xff, 0xd8, 0xff, 0xd9], (k, k, 1), true).expect("written");
        }
        assert_eq!(writer.written(), 3);
        writer.finish().expect("closed");
        let times = packet_times(&path).expect("read back");
        let want = [0.0, 1.0 / 30.0, 2.0 / 30.0];
        assert_eq!(times.len(), 3);
        assert!(times.iter().zip(want).all(|(t, w)| (t - w).abs() < 1e-9), "{times:?}");
    }

    #[test]
    fn a_file_that_cannot_be_written_is_named() {
        let params = CodecParams { codec: "h264".into(), width: 16, height: 16, ..CodecParams::default() };
        let path = Path::new("/nonexistent-directory/out.mp4");
        let err = Mp4Writer::create(path, &params, (1, 30)).expect_err("no such directory");
        assert!(matches!(&err, Error::Mux(m) if m.contains("/nonexistent-directory/out.mp4")), "{err}");
    }
}
