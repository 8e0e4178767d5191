//! A run's scalars as TensorBoard event files, so that `tensorboard --logdir runs` shows every
//! run's curves as they train: the file format TensorFlow's `tf.summary` writes
//! (`events.out.tfevents.*`: records of `Event` protocol buffers, each framed by its length and
//! masked CRC-32C checksums).
//!
//! The tags follow lerobot-train's metric names (`train/loss`, `train/grad_norm`, `train/lr`,
//! `eval/loss`, ...). A resumed run writes a new file in the same directory that opens with a
//! `SessionLog` START at its first step: TensorBoard then drops what the interrupted process
//! logged after the checkpoint, as the step log counts a step by its last line.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use prost::Message as _;

use crate::{Error, Result};

/// The version string TensorBoard reads: version 2 files mark restarts with `SessionLog`s.
const FILE_VERSION: &str = "brain.Event:2";

/// `SessionLog.SessionStatus.START`.
const SESSION_START: i32 = 1;

/// `tensorflow.Event` (`tensorflow/core/util/event.proto`), with the fields lake writes.
#[derive(Clone, PartialEq, prost::Message)]
struct Event {
    #[prost(double, tag = "1")]
    wall_time: f64,
    #[prost(int64, tag = "2")]
    step: i64,
    #[prost(oneof = "What", tags = "3, 5, 7")]
    what: Option<What>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
enum What {
    #[prost(string, tag = "3")]
    FileVersion(String),
    #[prost(message, tag = "5")]
    Summary(Summary),
    #[prost(message, tag = "7")]
    SessionLog(SessionLog),
}

/// `tensorflow.Summary`.
#[derive(Clone, PartialEq, prost::Message)]
struct Summary {
    #[prost(message, repeated, tag = "1")]
    value: Vec<SummaryValue>,
}

/// `tensorflow.Summary.Value` with a scalar. `simple_value` sits in a oneof there, which keeps
/// a value of 0 on the wire.
#[derive(Clone, PartialEq, prost::Message)]
struct SummaryValue {
    #[prost(string, tag = "1")]
    tag: String,
    #[prost(oneof = "Scalar", tags = "2")]
    value: Option<Scalar>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
enum Scalar {
    #[prost(float, tag = "2")]
    SimpleValue(f32),
}

/// `tensorflow.SessionLog`.
#[derive(Clone, PartialEq, prost::Message)]
struct SessionLog {
    #[prost(int32, tag = "1")]
    status: i32,
}

/// One events file of a run, written as the run goes: every record reaches the file when
/// written, so TensorBoard shows a step as soon as it is logged.
#[derive(Debug)]
pub struct EventsFile {
    file: std::fs::File,
    path: PathBuf,
}

impl EventsFile {
    /// Creates a new events file in `dir`. `resumed_at`: the first step of a resumed run, where a
    /// `SessionLog` START tells TensorBoard to drop what earlier files logged from that step on.
    ///
    /// # Errors
    /// When the file cannot be created or written.
    pub fn create(dir: &Path, resumed_at: Option<u64>) -> Result<EventsFile> {
        // TensorBoard reads a directory's files in the order of their names: the time to the
        // microsecond keeps a resumed run's file after the interrupted one's.
        let (file, path) = loop {
            let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
            let name = format!("events.out.tfevents.{}.{:06}.lake.{}", now.as_secs(), now.subsec_micros(), std::process::id());
            let path = dir.join(name);
            match std::fs::OpenOptions::new().create_new(true).write(true).open(&path) {
                Ok(file) => break (file, path),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(Error::io(&path)(e)),
            }
        };
        let mut events = EventsFile { file, path };
        events.write(0, What::FileVersion(FILE_VERSION.to_owned()))?;
        if let Some(step) = resumed_at {
            events.write(step, What::SessionLog(SessionLog { status: SESSION_START }))?;
        }
        Ok(events)
    }

    /// Where the file is.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The scalars of one step, as TensorBoard's 32-bit floats.
    ///
    /// # Errors
    /// When the file cannot be written.
    pub fn scalars(&mut self, step: u64, values: &[(&str, f64)]) -> Result<()> {
        let value =
            values.iter().map(|&(tag, v)| SummaryValue { tag: tag.to_owned(), value: Some(Scalar::SimpleValue(v as f32)) }).collect();
        self.write(step, What::Summary(Summary { value }))
    }

    fn write(&mut self, step: u64, what: What) -> Result<()> {
        let wall_time = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
        let event = Event { wall_time, step: i64::try_from(step).unwrap_or(i64::MAX), what: Some(what) };
        let record = frame(&event.encode_to_vec());
        self.file.write_all(&record).map_err(Error::io(&self.path))
    }
}

/// A TFRecord: the data's length (u64, little-endian) and its masked CRC-32C, the data, and the
/// data's masked CRC-32C.
fn frame(data: &[u8]) -> Vec<u8> {
    let length = (data.len() as u64).to_le_bytes();
    let mut record = Vec::with_capacity(data.len() + 16);
    record.extend_from_slice(&length);
    record.extend_from_slice(&masked_crc(&length).to_le_bytes());
    record.extend_from_slice(data);
    record.extend_from_slice(&masked_crc(data).to_le_bytes());
    record
}

/// TFRecord's checksum: CRC-32C (Castagnoli), rotated right by 15 bits plus a constant.
fn masked_crc(data: &[u8]) -> u32 {
    let crc = crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, data) as u32;
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// CRC-32C's check value (the CRC of the ASCII digits 1 to 9) is 0xE3069283.
    #[test]
    fn the_checksum_is_crc32c() {
        let crc = crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, b"123456789") as u32;
        assert_eq!(crc, 0xE306_9283);
        assert_eq!(masked_crc(b"123456789"), 0xE306_9283_u32.rotate_right(15).wrapping_add(0xa282_ead8));
    }

    /// Files made one after another in a directory are named in the order they were made.
    #[test]
    fn files_are_named_in_order() {
        let dir = tempfile::tempdir().expect("tmp");
        let made: Vec<PathBuf> = (0..3).map(|_| EventsFile::create(dir.path(), None).expect("events").path().to_path_buf()).collect();
        let mut sorted = made.clone();
        sorted.sort();
        assert_eq!(made, sorted);
        assert_eq!(sorted.iter().collect::<std::collections::HashSet<_>>().len(), 3);
    }

    /// A record reads back as TFRecord readers read it: length, checked; data, checked.
    #[test]
    fn records_are_framed_and_checked() {
        let dir = tempfile::tempdir().expect("tmp");
        let mut events = EventsFile::create(dir.path(), Some(4)).expect("events");
        events.scalars(4, &[("train/loss", 0.0), ("train/lr", 1e-4)]).expect("scalars");
        let bytes = std::fs::read(events.path()).expect("read");
        let mut at = 0;
        let mut decoded = Vec::new();
        while at < bytes.len() {
            let length = &bytes[at..at + 8];
            assert_eq!(bytes[at + 8..at + 12], masked_crc(length).to_le_bytes());
            let n = u64::from_le_bytes(length.try_into().expect("8 bytes")) as usize;
            let data = &bytes[at + 12..at + 12 + n];
            assert_eq!(bytes[at + 12 + n..at + 16 + n], masked_crc(data).to_le_bytes());
            decoded.push(Event::decode(data).expect("an event"));
            at += 16 + n;
        }
        let whats: Vec<_> = decoded.iter().map(|e| (e.step, e.what.clone())).collect();
        assert_eq!(
            whats,
            [
                (0, Some(What::FileVersion(FILE_VERSION.into()))),
                (4, Some(What::SessionLog(SessionLog { status: SESSION_START }))),
                (
                    4,
                    Some(What::Summary(Summary {
                        value: vec![
                            SummaryValue { tag: "train/loss".into(), value: Some(Scalar::SimpleValue(0.0)) },
                            SummaryValue { tag: "train/lr".into(), value: Some(Scalar::SimpleValue(1e-4)) },
                        ]
                    }))
                ),
            ]
        );
        // A loss of exactly 0 is on the wire: the scalar's field is there.
        let summary = decoded[2].encode_to_vec();
        assert!(summary.windows(5).any(|w| w == [0x15, 0, 0, 0, 0]), "{summary:?}");
    }
}
