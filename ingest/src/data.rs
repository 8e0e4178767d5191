//! The data parquet files: which column is what, LeRobot's shapes normalised to fixed-size
//! vectors, and the first pass that validates every row and collects the timestamps that video
//! frames are resolved against.

use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
};

use arrow::{
    array::{Array, ArrayRef, AsArray, FixedSizeListArray, RecordBatch},
    compute::cast,
    datatypes::{DataType, Field, Float32Type, Int64Type, SchemaRef},
};
use futures::TryStreamExt;
use lake_schemas::{Feature, FeatureKind, Finding, FindingKind};
use parquet::arrow::ParquetRecordBatchStreamBuilder;

use crate::{
    Result,
    meta::{DatasetMeta, EpisodeMeta},
    source::{Source, SourceFile},
};

/// The Arrow type of a LeRobot numeric dtype.
pub fn arrow_dtype(dtype: &str) -> Option<DataType> {
    Some(match dtype {
        "float16" => DataType::Float16,
        "float32" => DataType::Float32,
        "float64" => DataType::Float64,
        "int8" => DataType::Int8,
        "int16" => DataType::Int16,
        "int32" => DataType::Int32,
        "int64" => DataType::Int64,
        "uint8" => DataType::UInt8,
        "uint16" => DataType::UInt16,
        "uint32" => DataType::UInt32,
        "uint64" => DataType::UInt64,
        "bool" => DataType::Boolean,
        _ => return None,
    })
}

/// What a data parquet column is.
#[derive(Debug, Clone, PartialEq)]
pub enum Role {
    /// A declared numeric feature (index columns included).
    Numeric(Feature),
    /// A declared image feature: encoded image bytes per row.
    Image(Feature),
    /// A declared string or other feature, or an undeclared column: carried through.
    Passthrough,
}

/// The roles of a data file's columns, checked against `info.json`.
#[derive(Debug, Clone)]
pub struct ColumnPlan {
    /// `(column name, role)` in the file's column order.
    pub columns: Vec<(String, Role)>,
    /// The file's Arrow schema.
    pub schema: SchemaRef,
}

impl ColumnPlan {
    /// Matches a file's schema against the declared features.
    ///
    /// # Errors
    /// A finding (schema mismatch) naming the column, when a declared feature is missing or
    /// has a type that cannot hold its declared shape.
    pub fn new(meta: &DatasetMeta, file: &str, schema: SchemaRef) -> std::result::Result<(Self, Vec<Finding>), Finding> {
        let mut columns = Vec::new();
        let mut warnings = Vec::new();
        for field in schema.fields() {
            let name = field.name();
            let role = match meta.features.iter().find(|f| &f.name == name) {
                Some(f) if f.kind() == FeatureKind::Numeric => {
                    if !numeric_type_fits(field.data_type()) {
                        return Err(Finding::error(
                            FindingKind::SchemaMismatch,
                            format!("column `{name}` is {}, but info.json declares {} {:?}", field.data_type(), f.dtype, f.shape),
                        )
                        .with_file(file));
                    }
                    if let DataType::FixedSizeList(_, n) = field.data_type()
                        && leaf_width(field.data_type()) != Some(f.numel())
                    {
                        return Err(Finding::error(
                            FindingKind::ShapeMismatch,
                            format!(
                                "column `{name}` holds {} values per row (fixed size {n}), but info.json declares shape {:?}",
                                leaf_width(field.data_type()).unwrap_or(0),
                                f.shape
                            ),
                        )
                        .with_file(file));
                    }
                    Role::Numeric(f.clone())
                }
                Some(f) if f.kind() == FeatureKind::Image => Role::Image(f.clone()),
                Some(f) if f.kind() == FeatureKind::Video => {
                    warnings.push(
                        Finding::warning(
                            FindingKind::UndeclaredColumn,
                            format!("video feature `{name}` also has a parquet column; it is kept as a plain column"),
                        )
                        .with_file(file),
                    );
                    Role::Passthrough
                }
                Some(_) => Role::Passthrough,
                None => {
                    warnings.push(
                        Finding::warning(
                            FindingKind::UndeclaredColumn,
                            format!("column `{name}` is not declared in info.json; kept as is"),
                        )
                        .with_file(file),
                    );
                    Role::Passthrough
                }
            };
            columns.push((name.clone(), role));
        }
        for f in &meta.features {
            if f.kind() != FeatureKind::Video && !columns.iter().any(|(n, _)| n == &f.name) {
                return Err(
                    Finding::error(FindingKind::SchemaMismatch, format!("declared feature `{}` has no column", f.name)).with_file(file)
                );
            }
        }
        for required in lake_schemas::tables::INDEX_COLUMNS {
            if !columns.iter().any(|(n, _)| n == required) {
                return Err(Finding::error(FindingKind::SchemaMismatch, format!("required column `{required}` is missing")).with_file(file));
            }
        }
        Ok((Self { columns, schema }, warnings))
    }
}

fn numeric_type_fits(dt: &DataType) -> bool {
    match dt {
        DataType::List(f) | DataType::LargeList(f) | DataType::FixedSizeList(f, _) => numeric_type_fits(f.data_type()),
        dt => dt.is_numeric() || matches!(dt, DataType::Boolean),
    }
}

/// Values per row of a (nested) fixed-size list type, when every level is fixed.
fn leaf_width(dt: &DataType) -> Option<usize> {
    match dt {
        DataType::FixedSizeList(f, n) => Some(*n as usize * leaf_width(f.data_type())?),
        DataType::List(_) | DataType::LargeList(_) => None,
        _ => Some(1),
    }
}

/// The leaf values of a (possibly nested) list column and, per row, the range of leaves it
/// covers (`offsets[r]..offsets[r + 1]`).
fn flatten(col: &dyn Array) -> std::result::Result<(ArrayRef, Vec<usize>), String> {
    let (child, offsets): (ArrayRef, Vec<usize>) = match col.data_type() {
        DataType::List(_) => {
            let l = col.as_list::<i32>();
            (l.values().clone(), l.value_offsets().iter().map(|o| *o as usize).collect())
        }
        DataType::LargeList(_) => {
            let l = col.as_list::<i64>();
            (l.values().clone(), l.value_offsets().iter().map(|o| *o as usize).collect())
        }
        DataType::FixedSizeList(_, n) => {
            let l = col.as_fixed_size_list();
            let n = *n as usize;
            (l.values().clone(), (0..=l.len()).map(|i| (l.offset() + i) * n).collect())
        }
        _ => return Err("not a list".into()),
    };
    match child.data_type() {
        DataType::List(_) | DataType::LargeList(_) | DataType::FixedSizeList(_, _) => {
            let (leaves, inner) = flatten(child.as_ref())?;
            Ok((leaves, offsets.iter().map(|o| inner[*o]).collect()))
        }
        _ => Ok((child, offsets)),
    }
}

/// Normalises a numeric feature column: scalars stay scalars of the declared dtype; vectors and
/// arrays (fixed-size, variable or nested lists) become `FixedSizeList<dtype, numel>`.
///
/// # Errors
/// `(row, kind, message)` for the first row whose value is null, has the wrong number of
/// values (a shape mismatch) or a value the declared dtype cannot hold (a schema mismatch).
pub fn normalize_numeric(col: &ArrayRef, feature: &Feature) -> std::result::Result<ArrayRef, (usize, FindingKind, String)> {
    use FindingKind::{SchemaMismatch, ShapeMismatch};
    let dtype = arrow_dtype(&feature.dtype).ok_or((0, SchemaMismatch, format!("unsupported dtype {}", feature.dtype)))?;
    let is_list = matches!(col.data_type(), DataType::List(_) | DataType::LargeList(_) | DataType::FixedSizeList(_, _));
    if !is_list {
        if !feature.is_scalar() {
            return Err((0, ShapeMismatch, format!("holds scalars, but info.json declares shape {:?}", feature.shape)));
        }
        if let Some(row) = (0..col.len()).find(|r| col.is_null(*r)) {
            return Err((row, ShapeMismatch, "null value".into()));
        }
        return cast_exact(col, &dtype, &feature.dtype, |i| i).map_err(|(row, m)| (row, SchemaMismatch, m));
    }
    if let Some(row) = (0..col.len()).find(|r| col.is_null(*r)) {
        return Err((row, ShapeMismatch, "null value".into()));
    }
    let numel = feature.numel();
    let (leaves, offsets) = flatten(col.as_ref()).map_err(|e| (0, ShapeMismatch, e))?;
    for row in 0..col.len() {
        let n = offsets[row + 1] - offsets[row];
        if n != numel {
            return Err((
                row,
                ShapeMismatch,
                format!("holds {n} values, but info.json declares shape {:?} ({numel} values)", feature.shape),
            ));
        }
    }
    let start = offsets[0];
    let leaves = leaves.slice(start, offsets[col.len()] - start);
    if leaves.null_count() > 0 {
        let row = (0..col.len()).find(|r| (offsets[*r]..offsets[r + 1]).any(|i| leaves.is_null(i - start))).unwrap_or(0);
        return Err((row, ShapeMismatch, "null element".into()));
    }
    let row_of = |i: usize| offsets.partition_point(|o| *o <= i + start).saturating_sub(1);
    let leaves = cast_exact(&leaves, &dtype, &feature.dtype, row_of).map_err(|(row, m)| (row, SchemaMismatch, m))?;
    let field = Arc::new(Field::new("item", dtype, false));
    let size = i32::try_from(numel).map_err(|_| (0, ShapeMismatch, "too many values per row".to_string()))?;
    FixedSizeListArray::try_new(field, size, leaves, None).map(|a| Arc::new(a) as ArrayRef).map_err(|e| (0, ShapeMismatch, e.to_string()))
}

/// `values` as `dtype` (LeRobot's `declared` name for it), refusing a cast that would change a
/// value: a fraction or an out-of-range number made an integer, anything but 0 and 1 made a
/// bool (what LeRobot's own reader, a checked pyarrow cast, refuses too). Narrowing between
/// floating-point types rounds, as LeRobot's does.
///
/// # Errors
/// `(row, message)` for the first value that would change (`row_of` maps a value's position to
/// its row).
fn cast_exact(
    values: &ArrayRef,
    dtype: &DataType,
    declared: &str,
    row_of: impl Fn(usize) -> usize,
) -> std::result::Result<ArrayRef, (usize, String)> {
    let from = values.data_type();
    if from == dtype {
        return Ok(values.clone());
    }
    let checked = arrow::compute::CastOptions { safe: false, ..Default::default() };
    let cast = arrow::compute::cast_with_options(values, dtype, &checked).map_err(|e| (0, format!("as {declared}: {e}")))?;
    if dtype.is_floating() || (dtype.is_integer() && from.is_integer()) {
        // Integers widen or fail on overflow above; floats take any number.
        return Ok(cast);
    }
    let back = arrow::compute::cast_with_options(&cast, from, &checked).map_err(|e| (0, format!("as {declared}: {e}")))?;
    let changed = arrow::compute::kernels::cmp::distinct(values, &back).map_err(|e| (0, e.to_string()))?;
    // Arrow compares floats by their bits: -0.0 comes back as 0.0, the same number.
    let negative_zero = |i: usize| {
        from.is_floating()
            && arrow::compute::cast(&values.slice(i, 1), &DataType::Float64)
                .is_ok_and(|v| v.as_primitive::<arrow::datatypes::Float64Type>().value(0) == 0.0)
    };
    match changed.values().set_indices().find(|i| !negative_zero(*i)) {
        None => Ok(cast),
        Some(i) => {
            let value = arrow::util::display::array_value_to_string(values, i).unwrap_or_default();
            Err((row_of(i), format!("holds {value} ({from}), which {declared} (the dtype info.json declares) cannot hold")))
        }
    }
}

/// The first row of each episode that `check` refuses, for a column `check` refused as a whole
/// (which names only its first bad row): one bad episode must not hide another in the same file.
fn refused_per_episode(
    col: &ArrayRef,
    episode: &[Option<i64>],
    check: impl Fn(&ArrayRef) -> std::result::Result<(), (usize, FindingKind, String)>,
) -> Vec<(usize, FindingKind, String)> {
    let mut rows: BTreeMap<Option<i64>, Vec<u32>> = BTreeMap::new();
    for (row, e) in episode.iter().enumerate() {
        rows.entry(*e).or_default().push(row as u32);
    }
    let mut out = Vec::new();
    for rows in rows.values() {
        let refused = match arrow::compute::take(col.as_ref(), &arrow::array::UInt32Array::from(rows.clone()), None) {
            Ok(part) => check(&part).err().map(|(r, kind, m)| (rows[r.min(rows.len() - 1)] as usize, kind, m)),
            Err(e) => Some((rows[0] as usize, FindingKind::SchemaMismatch, e.to_string())),
        };
        out.extend(refused);
    }
    out
}

/// The encoded bytes of an image column's rows (HF `Image` struct `{bytes, path}` or binary).
///
/// # Errors
/// `(row, message)` for the first row without bytes.
pub fn image_bytes(col: &ArrayRef) -> std::result::Result<Vec<&[u8]>, (usize, String)> {
    let bytes_col: &dyn Array = match col.data_type() {
        DataType::Struct(_) => {
            col.as_struct().column_by_name("bytes").ok_or((0, "image struct has no `bytes` field".to_string()))?.as_ref()
        }
        _ => col.as_ref(),
    };
    let mut out = Vec::with_capacity(col.len());
    for row in 0..col.len() {
        let v: Option<&[u8]> = match bytes_col.data_type() {
            DataType::Binary => (!bytes_col.is_null(row)).then(|| bytes_col.as_binary::<i32>().value(row)),
            DataType::LargeBinary => (!bytes_col.is_null(row)).then(|| bytes_col.as_binary::<i64>().value(row)),
            DataType::BinaryView => (!bytes_col.is_null(row)).then(|| bytes_col.as_binary_view().value(row)),
            other => return Err((row, format!("image column has type {other}, expected binary bytes"))),
        };
        match v {
            Some(b) if !b.is_empty() && !col.is_null(row) => out.push(b),
            _ => return Err((row, "no image bytes (only a path, or null)".into())),
        }
    }
    Ok(out)
}

/// Format and size of an encoded image, read from its header. A JPEG's is the size LeRobot's
/// reader shows, its EXIF orientation applied (a quarter turn swaps width and height), and its
/// headers are read as libjpeg reads them (bytes between segments skipped).
pub fn image_header(bytes: &[u8]) -> Option<(&'static str, u32, u32)> {
    if bytes.starts_with(&[0xFF, 0xD8]) {
        let (w, h) = lake_schemas::picture::jpeg_header(bytes).ok()?.shown_size();
        return Some(("mjpeg", w, h));
    }
    let format = match imagesize::image_type(bytes).ok()? {
        imagesize::ImageType::Png => "png",
        imagesize::ImageType::Jpeg => "mjpeg",
        imagesize::ImageType::Webp => "webp",
        imagesize::ImageType::Bmp => "bmp",
        imagesize::ImageType::Tiff => "tiff",
        _ => return None,
    };
    let size = imagesize::blob_size(bytes).ok()?;
    Some((format, size.width as u32, size.height as u32))
}

/// Damage an encoded image's framing shows without decoding it: a PNG whose header chunk fails
/// its CRC (what a header of garbage does) or that does not end with its `IEND` chunk (padding of
/// zeros or 0xFF after it is taken), a JPEG whose scans do not reach its end-of-image marker
/// (bytes after it are not read, as PIL does not read them): both cut short. And a JPEG this
/// build cannot decode as LeRobot reads it (CMYK, 12-bit, lossless).
pub fn image_damage(format: &str, bytes: &[u8]) -> Option<String> {
    match format {
        "png" => {
            // Signature (8 bytes), then IHDR: length (4), type (4), 13 bytes of data, CRC (4).
            let ok = bytes.get(12..29).zip(bytes.get(29..33)).is_some_and(|(chunk, crc)| crc32fast::hash(chunk).to_be_bytes() == crc);
            if !ok {
                return Some("its PNG header chunk (IHDR) fails its checksum".into());
            }
            const IEND: [u8; 12] = [0, 0, 0, 0, b'I', b'E', b'N', b'D', 0xAE, 0x42, 0x60, 0x82];
            (!ends_with(bytes, &IEND))
                .then(|| format!("the PNG image is cut short: its {} bytes do not end with the IEND chunk", bytes.len()))
        }
        "mjpeg" => {
            if lake_schemas::picture::jpeg_cut_short(bytes) {
                return Some(format!("the JPEG image is cut short: its {} bytes end before its end-of-image marker", bytes.len()));
            }
            lake_schemas::picture::jpeg_header(bytes).ok()?.unsupported()
        }
        _ => None,
    }
}

/// Whether `bytes` end with `marker`, padding after it taken (writers pad with zeros or 0xFF):
/// the last marker is looked for from the end, and only padding may follow it (an earlier
/// one, a thumbnail's, followed by more of the image, is no end).
fn ends_with(bytes: &[u8], marker: &[u8]) -> bool {
    let padding = bytes.iter().rev().take_while(|b| matches!(b, 0x00 | 0xFF)).count();
    // The marker itself may end in padding bytes (a JPEG's EOI is FF D9).
    (0..=padding).any(|p| bytes[..bytes.len() - p].ends_with(marker))
}

/// Whether a WebP picture is lossy: its first image chunk is `VP8 ` (lossless ones are `VP8L`;
/// an extended file's `VP8X` header comes before either).
fn webp_lossy(bytes: &[u8]) -> bool {
    let mut at = 12;
    while let Some(chunk) = bytes.get(at..at + 8) {
        match &chunk[..4] {
            b"VP8 " => return true,
            b"VP8L" => return false,
            _ => {}
        }
        let size = u32::from_le_bytes([chunk[4], chunk[5], chunk[6], chunk[7]]) as usize;
        match at.checked_add(8).and_then(|a| a.checked_add(size)).and_then(|a| a.checked_add(size % 2)) {
            Some(next) => at = next,
            None => return false,
        }
    }
    false
}

/// Whether a WebP picture has an alpha channel (PIL opens it as `RGBA`): the alpha flag of an
/// extended file's `VP8X` header, or of a lossless bitstream's header.
fn webp_alpha(bytes: &[u8]) -> bool {
    match bytes.get(12..16) {
        Some(b"VP8X") => bytes.get(20).is_some_and(|flags| flags & 0x10 != 0),
        // The signature byte 0x2F, then width and height (14 bits each) and the alpha bit.
        Some(b"VP8L") => bytes.get(21..25).is_some_and(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) >> 28 & 1 == 1),
        _ => false,
    }
}

/// How the channels LeRobot gets from a picture (PIL's mode, through `ToTensor`) differ from
/// the RGB lake serves, where they do.
fn picture_channels(format: &str, bytes: &[u8]) -> Option<&'static str> {
    const GREY: &str = "greyscale: LeRobot returns 1 channel (PIL's `L`, or unscaled `I;16` for 16-bit ones), lake 3 equal channels";
    match format {
        // The colour type, after the signature and the header chunk's length, type, width,
        // height and bit depth.
        "png" => match bytes.get(25)? {
            0 => Some(GREY),
            3 => Some("palette-indexed: LeRobot returns 1 channel of palette indices (PIL's `P`), lake the palette's RGB colours"),
            4 => Some("greyscale with alpha: LeRobot returns 2 channels (PIL's `LA`), lake 3 equal channels without the alpha"),
            6 => Some("RGBA: LeRobot returns 4 channels, lake the 3 colour channels without the alpha"),
            _ => None,
        },
        "mjpeg" => (lake_schemas::picture::jpeg_header(bytes).ok()?.components == 1).then_some(GREY),
        "webp" => {
            webp_alpha(bytes).then_some("RGBA: LeRobot returns 4 channels (PIL's `RGBA`), lake the 3 colour channels without the alpha")
        }
        _ => None,
    }
}

/// How people call an image format (`mjpeg` is FFmpeg's name for JPEG).
pub fn image_format_name(format: &str) -> String {
    match format {
        "mjpeg" => "JPEG".into(),
        other => other.to_ascii_uppercase(),
    }
}

/// What the first pass learned about one episode's rows.
#[derive(Debug, Clone, Default)]
pub struct EpisodeRows {
    /// Rows seen.
    pub rows: usize,
    /// The `timestamp` of each row, in order.
    pub timestamps: Vec<f32>,
    /// Largest |timestamp - frame_index / fps|, and the first frame that far off.
    pub max_drift: f64,
    pub max_drift_frame: i64,
    /// Encoded image format per image camera, from the first row.
    pub image_formats: Vec<(String, &'static str, u32, u32)>,
    /// Per image camera and format: the first frame in it and how many rows are.
    pub format_rows: BTreeMap<(String, &'static str), (i64, u64)>,
}

/// What the first pass learned about one data file.
#[derive(Debug, Default)]
pub struct FileScan {
    /// Rows per episode.
    pub episodes: HashMap<i64, EpisodeRows>,
    /// Problems found.
    pub findings: Vec<Finding>,
    /// The column plan (absent when the file could not be read).
    pub plan: Option<ColumnPlan>,
    /// The `index` of the file's first and last rows, when it has any.
    pub index_span: Option<(i64, i64)>,
    /// Per (column, episode): the first frame holding a NaN or infinite value, and how many
    /// values are.
    non_finite: std::collections::BTreeMap<(String, i64), (i64, u64)>,
}

/// First pass over one data file: reads every row, checks it against the metadata, and keeps
/// the timestamps. Problems become findings attached to the episodes they affect; only I/O
/// failures of the store are errors.
///
/// # Errors
/// When the source cannot be read (not when the file's content is bad).
pub async fn scan_file(
    source: &Source,
    meta: &DatasetMeta,
    file: &SourceFile,
    expected: &[&EpisodeMeta],
    tolerance_s: f64,
) -> Result<FileScan> {
    let mut scan = FileScan::default();
    let file_error = |kind: FindingKind, message: String| -> Vec<Finding> {
        expected.iter().map(|e| Finding::error(kind, message.clone()).with_file(&file.path).with_episode(e.index)).collect()
    };
    let builder = match ParquetRecordBatchStreamBuilder::new(source.parquet(file)).await {
        Ok(b) => b,
        Err(e) => {
            scan.findings = file_error(FindingKind::CorruptFile, format!("not a readable parquet file: {e}"));
            return Ok(scan);
        }
    };
    let (plan, warnings) = match ColumnPlan::new(meta, &file.path, builder.schema().clone()) {
        Ok(p) => p,
        Err(f) => {
            scan.findings = expected.iter().map(|e| f.clone().with_episode(e.index)).collect();
            return Ok(scan);
        }
    };
    scan.findings.extend(warnings);
    let mut stream = match builder.with_batch_size(8192).build() {
        Ok(s) => s,
        Err(e) => {
            scan.findings = file_error(FindingKind::CorruptFile, format!("not a readable parquet file: {e}"));
            return Ok(scan);
        }
    };
    let by_index: HashMap<i64, &EpisodeMeta> = expected.iter().map(|e| (e.index, *e)).collect();
    let mut bad: HashMap<i64, ()> = HashMap::new();
    let mut foreign: HashMap<i64, ()> = HashMap::new();
    let fps = f64::from(meta.fps);
    // The last `index` read, and the first row (counted from 0) where `index` went down.
    let (mut last_index, mut rows_read, mut out_of_order): (Option<i64>, u64, Option<(u64, i64, i64)>) = (None, 0, None);
    loop {
        let batch = match stream.try_next().await {
            Ok(Some(b)) => b,
            Ok(None) => break,
            Err(e) => {
                scan.findings.extend(file_error(FindingKind::CorruptFile, format!("reading rows failed: {e}")));
                return Ok(scan);
            }
        };
        check_batch(meta, &plan, &file.path, &batch, &by_index, fps, &mut scan, &mut bad, &mut foreign)?;
        if out_of_order.is_none()
            && let Some(index) = batch.column_by_name("index")
            && let Ok(index) = arrow::compute::cast(index, &arrow::datatypes::DataType::Int64)
        {
            for (i, v) in index.as_primitive::<arrow::datatypes::Int64Type>().iter().enumerate() {
                let Some(v) = v else { continue };
                let first = scan.index_span.map_or(v, |(first, _)| first);
                scan.index_span = Some((first, v));
                if let Some(last) = last_index.filter(|last| v < *last) {
                    out_of_order = Some((rows_read + i as u64, v, last));
                    break;
                }
                last_index = Some(v);
            }
        }
        rows_read += batch.num_rows() as u64;
    }
    if let Some((row, index, last)) = out_of_order {
        scan.findings.push(
            Finding::warning(
                FindingKind::BadMetadata,
                format!(
                    "rows are not in `index` order (row {row} has index {index}, after {last}): LeRobot finds a sample by its \
                     row, so its sample i is not the step whose index is i (lake's is)"
                ),
            )
            .with_file(&file.path),
        );
    }
    for e in expected {
        let rows = scan.episodes.get(&e.index).map_or(0, |r| r.rows);
        if bad.contains_key(&e.index) {
            continue;
        }
        if rows as i64 != e.length {
            scan.findings.push(
                Finding::error(
                    FindingKind::LengthMismatch,
                    format!("has {rows} rows in this file, but the metadata says length {}", e.length),
                )
                .with_file(&file.path)
                .with_episode(e.index),
            );
        } else if let Some(r) = scan.episodes.get(&e.index)
            && r.max_drift > tolerance_s
        {
            scan.findings.push(
                Finding::warning(
                    FindingKind::TimestampDrift,
                    format!(
                        "timestamps drift up to {:.3} ms from frame_index / fps (tolerance {:.3} ms)",
                        r.max_drift * 1e3,
                        tolerance_s * 1e3
                    ),
                )
                .with_file(&file.path)
                .with_episode(e.index)
                .with_frame(r.max_drift_frame),
            );
        }
    }
    for ((column, episode), (frame, count)) in std::mem::take(&mut scan.non_finite) {
        scan.findings.push(
            Finding::warning(
                FindingKind::NonFinite,
                format!(
                    "column `{column}` holds {count} NaN or infinite values (the first at frame {frame}); its statistics over them are NaN, as numpy's"
                ),
            )
            .with_file(&file.path)
            .with_episode(episode)
            .with_frame(frame),
        );
    }
    scan.plan = Some(plan);
    Ok(scan)
}

/// Counts the NaN and infinite values of a normalised numeric column, per episode.
fn note_non_finite(
    name: &str,
    values: &ArrayRef,
    episode: &[Option<i64>],
    frame: &[Option<i64>],
    found: &mut std::collections::BTreeMap<(String, i64), (i64, u64)>,
) {
    let (leaves, width) = match values.data_type() {
        DataType::FixedSizeList(_, n) => (values.as_fixed_size_list().values().clone(), *n as usize),
        _ => (values.clone(), 1),
    };
    if !leaves.data_type().is_floating() {
        return;
    }
    let Ok(leaves) = cast(&leaves, &DataType::Float64) else { return };
    for (i, v) in leaves.as_primitive::<arrow::datatypes::Float64Type>().values().iter().enumerate() {
        if !v.is_finite() {
            let row = i / width.max(1);
            let (Some(ep), Some(fr)) = (episode[row], frame[row]) else { continue };
            let entry = found.entry((name.to_string(), ep)).or_insert((fr, 0));
            entry.0 = entry.0.min(fr);
            entry.1 += 1;
        }
    }
}

#[allow(clippy::too_many_arguments)] // one call site; the pieces are the scan's own state
fn check_batch(
    meta: &DatasetMeta,
    plan: &ColumnPlan,
    path: &str,
    batch: &RecordBatch,
    by_index: &HashMap<i64, &EpisodeMeta>,
    fps: f64,
    scan: &mut FileScan,
    bad: &mut HashMap<i64, ()>,
    foreign: &mut HashMap<i64, ()>,
) -> Result<()> {
    let int_col = |name: &str| -> std::result::Result<Vec<Option<i64>>, String> {
        let col = batch.column_by_name(name).ok_or_else(|| format!("no `{name}` column"))?;
        Ok(cast(col, &DataType::Int64).map_err(|e| e.to_string())?.as_primitive::<Int64Type>().iter().collect())
    };
    let cols = (|| -> std::result::Result<_, String> {
        let ts_col = batch.column_by_name("timestamp").ok_or("no `timestamp` column")?;
        let ts: Vec<Option<f32>> =
            cast(ts_col, &DataType::Float32).map_err(|e| e.to_string())?.as_primitive::<Float32Type>().iter().collect();
        Ok((int_col("episode_index")?, int_col("frame_index")?, int_col("index")?, int_col("task_index")?, ts))
    })();
    let (mut episode, frame, index, task, ts) = match cols {
        Ok(c) => c,
        Err(m) => {
            for e in by_index.values() {
                scan.findings.push(Finding::error(FindingKind::SchemaMismatch, m.clone()).with_file(path).with_episode(e.index));
                bad.insert(e.index, ());
            }
            return Ok(());
        }
    };
    // A row without its episode is an error of the episode whose rows surround it (the one
    // before it, or after it at the start), named as such.
    // (The first such row of each episode is reported; a batch with no episode at all once.)
    let nulls: Vec<usize> = (0..episode.len()).filter(|&r| episode[r].is_none()).collect();
    let mut reported_unplaced = false;
    for row in nulls {
        let near = episode[..row].iter().rev().chain(episode[row + 1..].iter()).find_map(|e| *e);
        let first = match near {
            Some(e) => bad.insert(e, ()).is_none(),
            None => !std::mem::replace(&mut reported_unplaced, true),
        };
        if first {
            let mut f = Finding::error(FindingKind::SchemaMismatch, "episode_index is null in this row").with_file(path);
            if let Some(e) = near {
                f = f.with_episode(e);
            }
            if let Some(fr) = frame[row] {
                f = f.with_frame(fr);
            }
            scan.findings.push(f);
        }
        episode[row] = near;
    }
    // Per-column shape checks; the first bad row marks its episode.
    let mut row_errors: Vec<(usize, FindingKind, String)> = Vec::new();
    let mut images: Vec<(&Feature, Vec<&[u8]>)> = Vec::new();
    for ((name, role), col) in plan.columns.iter().zip(batch.columns()) {
        match role {
            Role::Numeric(f) => match normalize_numeric(col, f) {
                Ok(values) => note_non_finite(name, &values, &episode, &frame, &mut scan.non_finite),
                Err(_) => row_errors.extend(
                    refused_per_episode(col, &episode, |c| normalize_numeric(c, f).map(drop))
                        .into_iter()
                        .map(|(row, kind, m)| (row, kind, format!("column `{name}` {m}"))),
                ),
            },
            Role::Image(f) => match image_bytes(col) {
                Ok(b) => images.push((f, b)),
                Err(_) => row_errors.extend(
                    refused_per_episode(col, &episode, |c| image_bytes(c).map(drop).map_err(|(r, m)| (r, FindingKind::ShapeMismatch, m)))
                        .into_iter()
                        .map(|(row, kind, m)| (row, kind, format!("column `{name}`: {m}"))),
                ),
            },
            Role::Passthrough => {}
        }
    }
    let mut image_headers: Vec<(&str, Vec<Option<&'static str>>)> = Vec::new();
    for (f, rows) in &images {
        let declared = f.camera_hwc();
        let headers: Vec<Option<(&'static str, u32, u32)>> = rows.iter().map(|b| image_header(b)).collect();
        image_headers.push((f.name.as_str(), headers.iter().map(|h| h.map(|(format, ..)| format)).collect()));
        // One format per column (a camera's frames share a decoder): the one most rows have.
        let mut formats: BTreeMap<&str, usize> = BTreeMap::new();
        for (format, ..) in headers.iter().flatten() {
            *formats.entry(format).or_default() += 1;
        }
        let usual = formats.iter().max_by_key(|(_, n)| **n).map(|(f, _)| *f);
        let first_size = headers.iter().flatten().next().map(|(_, w, h)| (*w, *h));
        // Lossy WebP: PIL decodes it with libwebp, lake with FFmpeg, whose chroma upsampling and
        // colour arithmetic differ: said once per file and camera.
        if usual == Some("webp") && rows.iter().any(|b| webp_lossy(b)) {
            let warning = Finding::warning(
                FindingKind::FormatMismatch,
                format!(
                    "column `{}` holds lossy WebP pictures: lake decodes them with FFmpeg, whose pixels differ from those PIL \
                     (libwebp) gives LeRobot by up to a few dozen levels; lossless WebP, PNG and JPEG pictures are LeRobot's \
                     exactly",
                    f.name
                ),
            )
            .with_file(path);
            if !scan.findings.contains(&warning) {
                scan.findings.push(warning);
            }
        }
        // Pictures that are not RGB: LeRobot returns their own channels, lake RGB; said once
        // per file, camera and kind.
        if let Some(format) = usual {
            let mut said = Vec::new();
            for how in rows.iter().filter_map(|b| picture_channels(format, b)) {
                if said.contains(&how) {
                    continue;
                }
                said.push(how);
                let warning = Finding::warning(
                    FindingKind::FormatMismatch,
                    format!("column `{}` holds {} pictures that are {how}", f.name, image_format_name(format)),
                )
                .with_file(path);
                if !scan.findings.contains(&warning) {
                    scan.findings.push(warning);
                }
            }
        }
        for (row, header) in headers.into_iter().enumerate() {
            match header {
                None => row_errors.push((
                    row,
                    FindingKind::CorruptFile,
                    format!("column `{}`: image bytes are not a PNG/JPEG/WebP/BMP/TIFF image", f.name),
                )),
                Some((format, ..)) if Some(format) != usual => row_errors.push((
                    row,
                    FindingKind::FormatMismatch,
                    format!(
                        "column `{}`: image is {} where the column's others are {}; lake takes one image format per camera",
                        f.name,
                        image_format_name(format),
                        image_format_name(usual.unwrap_or_default())
                    ),
                )),
                Some((format, ..)) if let Some(damage) = image_damage(format, rows[row]) => {
                    row_errors.push((row, FindingKind::CorruptFile, format!("column `{}`: {damage}", f.name)));
                }
                Some((_, w, h)) => {
                    if let Some((dh, dw, _)) = declared
                        && (dh as u32 != h || dw as u32 != w)
                    {
                        row_errors.push((
                            row,
                            FindingKind::ShapeMismatch,
                            format!("column `{}`: image is {w}x{h}, info.json declares {dw}x{dh}", f.name),
                        ));
                    } else if declared.is_none()
                        && let Some((fw, fh)) = first_size
                        && (fw, fh) != (w, h)
                    {
                        // No declared size to check against: a camera's pictures share one.
                        row_errors.push((
                            row,
                            FindingKind::ShapeMismatch,
                            format!("column `{}`: image is {w}x{h}, where the column's first is {fw}x{fh}", f.name),
                        ));
                    }
                }
            }
        }
    }
    row_errors.sort_by_key(|e| e.0);
    let mut reported_rows: HashMap<i64, ()> = HashMap::new();
    for (row, kind, message) in row_errors {
        // A row of no episode was reported above.
        let Some(ep) = episode[row] else { continue };
        if reported_rows.insert(ep, ()).is_none() && !bad.contains_key(&ep) {
            let mut f = Finding::error(kind, message).with_file(path).with_episode(ep);
            if let Some(fr) = frame[row] {
                f = f.with_frame(fr);
            }
            scan.findings.push(f);
            bad.insert(ep, ());
        }
    }

    for row in 0..batch.num_rows() {
        let (Some(ep), Some(fi), Some(idx), Some(ti), Some(t)) = (episode[row], frame[row], index[row], task[row], ts[row]) else {
            let Some(ep) = episode[row] else { continue };
            if bad.insert(ep, ()).is_none() {
                scan.findings.push(Finding::error(FindingKind::SchemaMismatch, "null in an index column").with_file(path).with_episode(ep));
            }
            continue;
        };
        let Some(em) = by_index.get(&ep) else {
            if foreign.insert(ep, ()).is_none() {
                let message = match meta.episodes.iter().find(|e| e.index == ep) {
                    Some(e) => format!("rows found in this file, but the metadata places the episode in {}", e.data_file),
                    None => "rows found in this file, but no episode metadata lists the episode (missing meta/episodes shard?)".to_string(),
                };
                scan.findings.push(Finding::error(FindingKind::BadMetadata, message).with_file(path).with_episode(ep).with_frame(fi));
            }
            continue;
        };
        if bad.contains_key(&ep) {
            continue;
        }
        let rows = scan.episodes.entry(ep).or_default();
        let position = rows.rows as i64;
        let problem = if fi != position {
            Some((FindingKind::LengthMismatch, format!("frame_index is {fi} at row {position} of the episode (expected {position})")))
        } else if idx != em.from_index + fi {
            let expected = em.from_index + fi;
            Some((
                FindingKind::LengthMismatch,
                format!(
                    "index is {idx}, expected {expected} ({} {} + frame_index)",
                    if meta.version.is_v2() { "the episode's first index, the lengths before it summed," } else { "dataset_from_index" },
                    em.from_index
                ),
            ))
        } else if meta.task(ti).is_none() {
            let table =
                if meta.version.is_v2() { "no line of meta/tasks.jsonl has it" } else { "the task table has no row at that position" };
            Some((FindingKind::UnknownTask, format!("task_index {ti}: {table} ({} tasks)", meta.tasks.len())))
        } else {
            None
        };
        if let Some((kind, message)) = problem {
            scan.findings.push(Finding::error(kind, message).with_file(path).with_episode(ep).with_frame(fi));
            bad.insert(ep, ());
            continue;
        }
        if rows.rows == 0 {
            rows.image_formats =
                images.iter().filter_map(|(f, b)| image_header(b[row]).map(|(fmt, w, h)| (f.name.clone(), fmt, w, h))).collect();
        }
        for (camera, formats) in &image_headers {
            if let Some(format) = formats[row] {
                rows.format_rows.entry((camera.to_string(), format)).or_insert((fi, 0)).1 += 1;
            }
        }
        rows.rows += 1;
        rows.timestamps.push(t);
        let drift = (f64::from(t) - fi as f64 / fps).abs();
        if drift > rows.max_drift {
            (rows.max_drift, rows.max_drift_frame) = (drift, fi);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use arrow::array::{Float64Array, ListArray};
    use arrow::datatypes::Float64Type;

    use super::*;

    fn feature(shape: Vec<usize>) -> Feature {
        Feature { name: "action".into(), dtype: "float32".into(), shape, names: serde_json::Value::Null, info: None }
    }

    #[test]
    fn variable_lists_become_fixed_size() {
        let col: ArrayRef = Arc::new(ListArray::from_iter_primitive::<Float64Type, _, _>(vec![
            Some(vec![Some(1.0), Some(2.0)]),
            Some(vec![Some(3.0), Some(4.0)]),
        ]));
        let out = normalize_numeric(&col, &feature(vec![2])).unwrap();
        assert_eq!(out.data_type(), &DataType::FixedSizeList(Arc::new(Field::new("item", DataType::Float32, false)), 2));
        let fixed = out.as_fixed_size_list();
        assert_eq!(fixed.value(1).as_primitive::<Float32Type>().values(), &[3.0, 4.0]);
    }

    #[test]
    fn wrong_lengths_name_the_row() {
        let col: ArrayRef =
            Arc::new(ListArray::from_iter_primitive::<Float64Type, _, _>(vec![Some(vec![Some(1.0), Some(2.0)]), Some(vec![Some(3.0)])]));
        let (row, kind, message) = normalize_numeric(&col, &feature(vec![2])).unwrap_err();
        assert_eq!((row, kind), (1, FindingKind::ShapeMismatch));
        assert!(message.contains("holds 1 values"), "{message}");
        let scalars: ArrayRef = Arc::new(Float64Array::from(vec![1.0]));
        // A declared dtype that cannot hold the values is refused, naming the row.
        let fractions: ArrayRef = Arc::new(ListArray::from_iter_primitive::<Float64Type, _, _>(vec![
            Some(vec![Some(1.0), Some(2.0)]),
            Some(vec![Some(3.0), Some(4.5)]),
        ]));
        let as_int = Feature { dtype: "int64".into(), ..feature(vec![2]) };
        let (row, kind, message) = normalize_numeric(&fractions, &as_int).unwrap_err();
        assert_eq!((row, kind), (1, FindingKind::SchemaMismatch), "a value the dtype cannot hold is the schema's fault");
        assert!(message.contains("holds 4.5 (Float64), which int64"), "{message}");
        let as_bool = Feature { dtype: "bool".into(), ..feature(vec![2]) };
        assert_eq!(normalize_numeric(&fractions, &as_bool).unwrap_err().0, 0, "2.0 is no bool");
        let whole: ArrayRef = Arc::new(Float64Array::from(vec![1.0, 300.0, -0.0]));
        let as_int = Feature { dtype: "int64".into(), ..feature(vec![1]) };
        assert_eq!(normalize_numeric(&whole, &as_int).unwrap().as_primitive::<Int64Type>().values(), &[1, 300, 0], "-0.0 is 0");
        let as_bool = Feature { dtype: "bool".into(), ..feature(vec![1]) };
        let bits: ArrayRef = Arc::new(Float64Array::from(vec![1.0, -0.0]));
        assert_eq!(normalize_numeric(&bits, &as_bool).unwrap().as_boolean().values().iter().collect::<Vec<_>>(), [true, false]);
        let as_byte = Feature { dtype: "uint8".into(), ..feature(vec![1]) };
        assert!(normalize_numeric(&whole, &as_byte).unwrap_err().2.contains("uint8"), "300 overflows a byte");
        let wide: ArrayRef = Arc::new(arrow::array::Int64Array::from(vec![1, 1 << 40]));
        assert!(normalize_numeric(&wide, &Feature { dtype: "int32".into(), ..feature(vec![1]) }).is_err());
        assert_eq!(normalize_numeric(&wide, &feature(vec![1])).unwrap().data_type(), &DataType::Float32, "any number is a float");
        assert!(normalize_numeric(&scalars, &feature(vec![3])).is_err());
        assert_eq!(normalize_numeric(&scalars, &feature(vec![1])).unwrap().data_type(), &DataType::Float32);
    }

    #[test]
    fn images_end_with_their_marker_padding_taken() {
        let eoi = [0xFF, 0xD9];
        assert!(ends_with(&[0xFF, 0xD8, 1, 2, 0xFF, 0xD9], &eoi));
        assert!(ends_with(&[0xFF, 0xD8, 1, 2, 0xFF, 0xD9, 0, 0, 0xFF], &eoi), "padding after the marker");
        // A thumbnail's marker, then more of the image, cut short: no end.
        assert!(!ends_with(&[0xFF, 0xD8, 0xFF, 0xD9, 0x12, 0x34, 0x56], &eoi));
        assert!(!ends_with(&[0xFF, 0xD8, 0xFF, 0xD9, 0x12, 0, 0], &eoi));
        // A JPEG: a thumbnail's end marker inside its segment is no end; bytes after the real
        // end are not read.
        let thumbnail_then_cut = [0xFF, 0xD8, 0xFF, 0xE1, 0x00, 0x06, 0xFF, 0xD8, 0xFF, 0xD9, 0x12, 0x34];
        assert!(image_damage("mjpeg", &thumbnail_then_cut).is_some_and(|m| m.contains("cut short")));
        assert!(image_damage("mjpeg", &[0xFF, 0xD8, 0xFF, 0xD9, b'\r', b'\n']).is_none());
    }

    #[test]
    fn lossy_webp_is_told_from_lossless() {
        let riff = |chunks: &[(&[u8; 4], usize)]| {
            let mut out = b"RIFF\0\0\0\0WEBP".to_vec();
            for (fourcc, size) in chunks {
                out.extend_from_slice(*fourcc);
                out.extend_from_slice(&(*size as u32).to_le_bytes());
                out.extend(std::iter::repeat_n(0u8, size + size % 2));
            }
            out
        };
        assert!(webp_lossy(&riff(&[(b"VP8 ", 10)])));
        assert!(!webp_lossy(&riff(&[(b"VP8L", 10)])));
        assert!(webp_lossy(&riff(&[(b"VP8X", 10), (b"ICCP", 3), (b"VP8 ", 4)])));
        assert!(!webp_lossy(&riff(&[(b"VP8X", 10), (b"VP8L", 4)])));
        assert!(!webp_lossy(b"RIFF"));
        // Alpha: the extended header's flag, or the lossless header's bit.
        let mut extended = riff(&[(b"VP8X", 10), (b"VP8 ", 4)]);
        assert!(!webp_alpha(&extended));
        extended[20] |= 0x10;
        assert!(webp_alpha(&extended));
        let mut lossless = riff(&[(b"VP8L", 10)]);
        lossless[20] = 0x2F;
        assert!(!webp_alpha(&lossless));
        lossless[24] |= 0x10;
        assert!(webp_alpha(&lossless));
    }

    #[test]
    fn png_header() {
        // 1x1 PNG
        let png: &[u8] = &[
            0x89, 0x50, 0x4E, 0x47, 0x0D, 0x0A, 0x1A, 0x0A, 0, 0, 0, 13, b'I', b'H', b'D', b'R', 0, 0, 0, 3, 0, 0, 0, 2, 8, 2, 0, 0, 0, 0,
            0, 0, 0,
        ];
        assert_eq!(image_header(png), Some(("png", 3, 2)));
        assert_eq!(image_header(b"garbage"), None);
    }
}
