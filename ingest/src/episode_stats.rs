//! LeRobot's per-episode statistics on their way from the source's metadata to the lake's
//! `stats` table. They are read once, with the rest of the metadata, into a file among the
//! ingest's scratch files (Arrow IPC, in the table's schema), and read back a batch at a time
//! when the table is written: memory holds one batch whatever the number of episodes, and the
//! source's metadata files are neither decoded nor counted twice.

use std::{
    fs::File,
    io::{BufReader, BufWriter},
    path::PathBuf,
    sync::Arc,
};

use arrow::{
    array::{ArrayRef, Float64Builder, Int64Builder, ListBuilder, RecordBatch, StringBuilder},
    ipc::{reader::StreamReader, writer::StreamWriter},
};
use lake_schemas::tables::{self, STATS};

use crate::{Error, Result, columns::cast_to_schema, scratch::Scratch};

/// One statistic of one feature, for one episode or the whole dataset.
#[derive(Debug, Clone, PartialEq)]
pub struct StatRow {
    /// The episode, or `None` for dataset-level statistics.
    pub episode: Option<i64>,
    /// Feature key.
    pub feature: String,
    /// Statistic name (`min`, `max`, `mean`, `std`, `count`, `q01`, …).
    pub stat: String,
    /// Values, flattened row-major.
    pub values: Vec<f64>,
    /// Shape of the values.
    pub shape: Vec<i64>,
}

/// A batch holds at most this many rows…
const BATCH_ROWS: usize = 64 * 1024;
/// …or values (of wide features).
const BATCH_VALUES: usize = 4 << 20;
/// The scratch file's name.
const FILE: &str = "episode-stats.arrows";

/// Rows of the `stats` table being built.
#[derive(Default)]
pub(crate) struct StatsRows {
    episode: Int64Builder,
    feature: StringBuilder,
    stat: StringBuilder,
    values: ListBuilder<Float64Builder>,
    shape: ListBuilder<Int64Builder>,
    source: StringBuilder,
    len: usize,
}

impl StatsRows {
    pub(crate) fn push(&mut self, s: &StatRow) {
        self.episode.append_option(s.episode);
        self.feature.append_value(&s.feature);
        self.stat.append_value(&s.stat);
        self.values.values().append_slice(&s.values);
        self.values.append(true);
        self.shape.values().append_slice(&s.shape);
        self.shape.append(true);
        self.source.append_value("lerobot");
        self.len += 1;
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Whether the rows make a batch.
    fn full(&self) -> bool {
        self.len >= BATCH_ROWS || self.values.values_ref().values_slice().len() >= BATCH_VALUES
    }

    pub(crate) fn finish(&mut self) -> Result<RecordBatch> {
        let schema = tables::stats_schema();
        let columns: Vec<ArrayRef> = vec![
            Arc::new(self.episode.finish()),
            Arc::new(self.feature.finish()),
            Arc::new(self.stat.finish()),
            Arc::new(self.values.finish()),
            Arc::new(self.shape.finish()),
            Arc::new(self.source.finish()),
        ];
        self.len = 0;
        let columns = cast_to_schema(columns, &schema)?;
        RecordBatch::try_new(schema, columns).map_err(Error::arrow(STATS))
    }
}

/// The episode statistics being read, written to the scratch file a batch at a time.
pub(crate) struct Spill {
    writer: StreamWriter<BufWriter<File>>,
    rows: StatsRows,
    path: PathBuf,
}

impl Spill {
    /// Creates the scratch file.
    ///
    /// # Errors
    /// When it cannot be created.
    pub(crate) fn create(scratch: &Scratch) -> Result<Self> {
        let (file, path) = scratch.create_file(FILE)?;
        let writer = StreamWriter::try_new(BufWriter::new(file), &tables::stats_schema()).map_err(Error::arrow(STATS))?;
        Ok(Self { writer, rows: StatsRows::default(), path })
    }

    /// Takes one row (kept in memory until [`Spill::flush`] finds a batch's worth).
    pub(crate) fn push(&mut self, row: &StatRow) {
        self.rows.push(row);
    }

    /// Writes the rows taken so far once they make a batch.
    ///
    /// # Errors
    /// When the scratch file cannot be written.
    pub(crate) fn flush(&mut self) -> Result<()> {
        if self.rows.full() { self.write() } else { Ok(()) }
    }

    fn write(&mut self) -> Result<()> {
        let batch = self.rows.finish()?;
        self.writer.write(&batch).map_err(|e| self.error(e))
    }

    fn error(&self, e: arrow::error::ArrowError) -> Error {
        let source = match e {
            arrow::error::ArrowError::IoError(_, source) => source,
            other => std::io::Error::other(other),
        };
        Error::Scratch { dir: self.path.display().to_string(), source }
    }

    /// Writes what is left and closes the file.
    ///
    /// # Errors
    /// When the scratch file cannot be written.
    pub(crate) fn finish(mut self) -> Result<SpilledStats> {
        if self.rows.len() > 0 {
            self.write()?;
        }
        self.writer.finish().map_err(|e| self.error(e))?;
        Ok(SpilledStats { path: self.path })
    }
}

/// Episode statistics in a scratch file.
#[derive(Debug, Clone)]
pub(crate) struct SpilledStats {
    path: PathBuf,
}

impl SpilledStats {
    /// The stored rows, a batch at a time, in the order they were read.
    ///
    /// # Errors
    /// When the scratch file cannot be read.
    pub(crate) fn batches(&self) -> Result<impl Iterator<Item = Result<RecordBatch>> + use<>> {
        let dir = self.path.display().to_string();
        let scratch = |source| Error::Scratch { dir: dir.clone(), source };
        let file = File::open(&self.path).map_err(scratch)?;
        let reader = StreamReader::try_new(BufReader::new(file), None).map_err(|e| scratch(std::io::Error::other(e)))?;
        Ok(reader.map(move |batch| batch.map_err(|e| Error::Scratch { dir: dir.clone(), source: std::io::Error::other(e) })))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(episode: Option<i64>, feature: &str, values: Vec<f64>) -> StatRow {
        let shape = vec![values.len() as i64];
        StatRow { episode, feature: feature.into(), stat: "mean".into(), values, shape }
    }

    #[test]
    fn spilled_rows_read_back_in_order_across_batches() {
        let scratch = Scratch::new().expect("scratch");
        let mut spill = Spill::create(&scratch).expect("spill");
        let rows: Vec<StatRow> = (0..(BATCH_ROWS as i64 + 5)).map(|e| row(Some(e), "action", vec![e as f64, -0.5])).collect();
        for r in &rows {
            spill.push(r);
            spill.flush().expect("flush");
        }
        // A wide feature makes a batch of its own by its values.
        spill.push(&row(None, "observation.wide", vec![1.0; BATCH_VALUES]));
        spill.flush().expect("flush");
        let spilled = spill.finish().expect("finish");
        let batches: Vec<RecordBatch> = spilled.batches().expect("read").collect::<Result<_>>().expect("batches");
        assert_eq!(batches.iter().map(RecordBatch::num_rows).collect::<Vec<_>>(), vec![BATCH_ROWS, 6]);
        let episodes: Vec<Option<i64>> = batches
            .iter()
            .flat_map(|b| arrow::array::AsArray::as_primitive::<arrow::datatypes::Int64Type>(b.column(0)).iter().collect::<Vec<_>>())
            .collect();
        let want: Vec<Option<i64>> = rows.iter().map(|r| r.episode).chain([None]).collect();
        assert_eq!(episodes, want);
        assert_eq!(batches[0].schema(), tables::stats_schema());
    }
}
