//! Human-readable output: the ingest summary, `ls` and `inspect`.

use std::{collections::BTreeMap, io::Write};

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::{Int64Type, UInt32Type, UInt64Type};
use lake_ingest::Report;
use lake_schemas::{CommitRecord, Feature, FeatureKind, InfoJson, tables};
use lake_store::Lake;

/// `12.3 MB`-style sizes (decimal units).
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "kB", "MB", "GB", "TB"];
    let mut v = n as f64;
    let mut unit = 0;
    while v >= 1000.0 && unit < UNITS.len() - 1 {
        v /= 1000.0;
        unit += 1;
    }
    if unit == 0 { format!("{n} B") } else { format!("{v:.1} {}", UNITS[unit]) }
}

/// `n` and `noun`, plural unless `n` is 1 (`1 task`, `3 tasks`).
fn count(n: impl Into<u64>, noun: &str) -> String {
    let n = n.into();
    if n == 1 { format!("1 {noun}") } else { format!("{n} {noun}s") }
}

pub fn ingest_summary(out: &mut impl Write, record: &CommitRecord, report: &Report, root: &str) -> std::io::Result<()> {
    let secs = report.seconds.max(1e-9);
    let frames: u64 = report.cameras.iter().map(|c| c.packets).sum();
    writeln!(out, "ingested {} as {}@{} into {root}", report.source, record.name, record.version)?;
    writeln!(
        out,
        "  {} of {}, {} steps ({:.1} s of recording at {} fps), {}",
        report.episodes,
        count(report.episodes_total, "episode"),
        report.steps,
        report.recorded_seconds,
        record.fps,
        count(record.counts.tasks, "task")
    )?;
    for c in &report.cameras {
        let declared = match &c.declared_codec {
            Some(d) if d != &c.codec => format!(" (info.json says {d})"),
            _ => String::new(),
        };
        writeln!(
            out,
            "  camera {}: {} {} {}x{}{declared}, {}, {} frames, max GOP {}",
            c.name,
            c.kind,
            c.codec,
            c.width,
            c.height,
            count(c.streams, "file"),
            c.packets,
            c.max_gop
        )?;
    }
    // A dataset without cameras has steps to count, not frames.
    let rate =
        if frames > 0 { format!("{:.0} frames/s", frames as f64 / secs) } else { format!("{:.0} steps/s", report.steps as f64 / secs) };
    let stored = if frames > 0 { format!(", {} of packets stored", bytes(report.packet_bytes)) } else { String::new() };
    writeln!(
        out,
        "  {:.2} s: {rate}, {}/s read, {:.0}x real time; {} read{stored}",
        report.seconds,
        bytes((report.bytes_read as f64 / secs) as u64),
        report.recorded_seconds / secs,
        bytes(report.bytes_read),
    )?;
    findings_summary(out, report)?;
    Ok(())
}

fn findings_summary(out: &mut impl Write, report: &Report) -> std::io::Result<()> {
    let mut by_kind: BTreeMap<(&str, &str), usize> = BTreeMap::new();
    for f in report.findings.iter().filter(|f| f.kind != lake_schemas::FindingKind::EpisodeSkipped) {
        *by_kind.entry((f.severity.as_str(), f.kind.as_str())).or_default() += 1;
    }
    if !report.skipped.is_empty() {
        writeln!(out, "  skipped {} episode(s) (--skip-bad-episodes):", report.skipped.len())?;
        for reason in report.skipped.values().take(8) {
            writeln!(out, "    {reason}")?;
        }
        if report.skipped.len() > 8 {
            writeln!(out, "    … {} more (see `lake inspect`)", report.skipped.len() - 8)?;
        }
    }
    if by_kind.is_empty() {
        writeln!(out, "  validation: no findings")?;
    } else {
        let parts: Vec<String> = by_kind.iter().map(|((s, k), n)| format!("{n} {s}[{k}]")).collect();
        writeln!(out, "  validation: {}", parts.join(", "))?;
        for f in report.findings.iter().filter(|f| !f.is_error() && f.kind != lake_schemas::FindingKind::EpisodeSkipped).take(5) {
            writeln!(out, "    {f}")?;
        }
    }
    Ok(())
}

pub fn dataset_list(out: &mut impl Write, datasets: &[CommitRecord], root: &str) -> std::io::Result<()> {
    if datasets.is_empty() {
        return writeln!(out, "no datasets in the lake at {root}");
    }
    let w = datasets.iter().map(|d| d.name.len() + 1 + d.version.to_string().len()).max().unwrap_or(0).max(7);
    writeln!(
        out,
        "{:<w$}  {:>8}  {:>9}  {:>7}  {:>4}  {:<6}  {:<20}  source",
        "dataset", "episodes", "steps", "cameras", "fps", "lerobot", "committed"
    )?;
    for d in datasets {
        writeln!(
            out,
            "{:<w$}  {:>8}  {:>9}  {:>7}  {:>4}  {:<6}  {:<20}  {}",
            format!("{}@{}", d.name, d.version),
            d.counts.episodes,
            d.counts.steps,
            d.counts.cameras,
            d.fps,
            d.source.codebase_version,
            d.committed_at.format("%Y-%m-%d %H:%M:%S"),
            d.source.url
        )?;
    }
    Ok(())
}

/// The tables `inspect` shows.
pub struct InspectTables {
    streams: Vec<RecordBatch>,
    episodes: Vec<RecordBatch>,
    tasks: Vec<RecordBatch>,
    findings: Vec<RecordBatch>,
    frame_tables: Vec<lake_loader::FrameTableInfo>,
    /// The version's training proxy, if `lake cache --proxy` made one.
    proxy: Option<lake_loader::ProxyInfo>,
}

struct CameraInfo {
    kind: String,
    codec: String,
    declared: Option<String>,
    size: String,
    pix_fmt: String,
    colour: String,
    files: u64,
    packets: u64,
    keyframes: u64,
    max_gop: u64,
    reordered: bool,
    bytes: u64,
}

impl InspectTables {
    /// Reads the tables, refusing one whose columns are not those ingest writes (a damaged
    /// lake, or one written by another format version), so that what is shown below reads
    /// only columns known to be there.
    pub async fn load(lake: &Lake, record: &CommitRecord) -> anyhow::Result<Self> {
        let read = |name: &'static str, schema: arrow::datatypes::SchemaRef| async move {
            let batches = lake_store::read_table(lake, record, name).await?;
            if let Some(b) = batches.iter().find(|b| !same_columns(&b.schema(), &schema)) {
                anyhow::bail!(
                    "dataset {}@{}: its `{name}` table has the columns {:?}, not those ingest writes ({:?})",
                    record.name,
                    record.version,
                    b.schema().fields().iter().map(|f| format!("{} {}", f.name(), f.data_type())).collect::<Vec<_>>(),
                    schema.fields().iter().map(|f| format!("{} {}", f.name(), f.data_type())).collect::<Vec<_>>()
                );
            }
            Ok(batches)
        };
        Ok(Self {
            streams: read(tables::STREAMS, tables::streams_schema()).await?,
            episodes: read(tables::EPISODES, tables::episodes_schema()).await?,
            tasks: read(tables::TASKS, tables::tasks_schema()).await?,
            findings: read(tables::FINDINGS, tables::findings_schema()).await?,
            frame_tables: lake_loader::frame_tables(lake, record).await,
            proxy: lake_loader::ProxyInfo::read(lake, record).await?,
        })
    }

    // Below, `expect` on a column holds by `load`'s check.
    fn cameras(&self) -> BTreeMap<String, CameraInfo> {
        let mut out: BTreeMap<String, CameraInfo> = BTreeMap::new();
        for b in &self.streams {
            let s = |name: &str| b.column_by_name(name).expect("streams column").as_string::<i32>().clone();
            let u64c = |name: &str| b.column_by_name(name).expect("streams column").as_primitive::<UInt64Type>().clone();
            let u32c = |name: &str| b.column_by_name(name).expect("streams column").as_primitive::<UInt32Type>().clone();
            let (camera, kind, codec, declared, pix, range, space) =
                (s("camera"), s("kind"), s("codec"), s("declared_codec"), s("pix_fmt"), s("color_range"), s("color_space"));
            let (w, h) = (u32c("width"), u32c("height"));
            let (packets, keys, gop, bytes) = (u64c("packets"), u64c("keyframes"), u64c("max_gop"), u64c("bytes"));
            let reordered = b.column_by_name("reordered").expect("streams column").as_boolean().clone();
            for r in 0..b.num_rows() {
                let opt = |a: &arrow::array::StringArray| (!a.is_null(r)).then(|| a.value(r).to_string());
                let e = out.entry(camera.value(r).to_string()).or_insert_with(|| CameraInfo {
                    kind: kind.value(r).to_string(),
                    codec: codec.value(r).to_string(),
                    declared: opt(&declared),
                    size: format!("{}x{}", w.value(r), h.value(r)),
                    pix_fmt: opt(&pix).unwrap_or_default(),
                    colour: [opt(&range), opt(&space)].into_iter().flatten().filter(|c| c != "unknown").collect::<Vec<_>>().join("/"),
                    files: 0,
                    packets: 0,
                    keyframes: 0,
                    max_gop: 0,
                    reordered: false,
                    bytes: 0,
                });
                e.files += 1;
                e.packets += packets.value(r);
                e.keyframes += keys.value(r);
                e.max_gop = e.max_gop.max(gop.value(r));
                e.reordered |= reordered.value(r);
                e.bytes += bytes.value(r);
            }
        }
        out
    }

    fn episode_rows(&self) -> Vec<(i64, i64, String)> {
        let mut rows = Vec::new();
        for b in &self.episodes {
            let idx = b.column_by_name("episode_index").expect("episodes column").as_primitive::<Int64Type>();
            let len = b.column_by_name("length").expect("episodes column").as_primitive::<Int64Type>();
            let tasks = b.column_by_name("tasks").expect("episodes column").as_list::<i32>();
            for r in 0..b.num_rows() {
                let t = tasks.value(r);
                let t = t.as_string::<i32>();
                let names: Vec<&str> = (0..t.len()).map(|i| t.value(i)).collect();
                rows.push((idx.value(r), len.value(r), names.join("; ")));
            }
        }
        rows
    }

    fn task_rows(&self) -> Vec<(i64, String)> {
        self.tasks
            .iter()
            .flat_map(|b| {
                let idx = b.column(0).as_primitive::<Int64Type>().clone();
                let task = b.column(1).as_string::<i32>().clone();
                (0..b.num_rows()).map(move |r| (idx.value(r), task.value(r).to_string()))
            })
            .collect()
    }

    fn finding_rows(&self) -> Vec<lake_schemas::Finding> {
        let mut out = Vec::new();
        for b in &self.findings {
            let s = |i: usize| b.column(i).as_string::<i32>().clone();
            let i = |c: usize| b.column(c).as_primitive::<Int64Type>().clone();
            let (sev, kind, file, camera, msg) = (s(0), s(1), s(2), s(4), s(6));
            let (ep, fr) = (i(3), i(5));
            for r in 0..b.num_rows() {
                let value = serde_json::json!({
                    "severity": sev.value(r), "kind": kind.value(r),
                    "file": (!file.is_null(r)).then(|| file.value(r)),
                    "episode": (!ep.is_null(r)).then(|| ep.value(r)),
                    "camera": (!camera.is_null(r)).then(|| camera.value(r)),
                    "frame": (!fr.is_null(r)).then(|| fr.value(r)),
                    "message": msg.value(r),
                });
                if let Ok(f) = serde_json::from_value(value) {
                    out.push(f);
                }
            }
        }
        out
    }

    /// The dataset as JSON, with the first `episodes` episodes listed (all when `None`).
    pub fn to_json(&self, record: &CommitRecord, episodes: Option<usize>) -> serde_json::Value {
        let cameras: serde_json::Map<String, serde_json::Value> = self
            .cameras()
            .into_iter()
            .map(|(k, c)| {
                (k, serde_json::json!({"kind": c.kind, "codec": c.codec, "declared_codec": c.declared, "size": c.size, "pix_fmt": c.pix_fmt,
                    "files": c.files, "frames": c.packets, "keyframes": c.keyframes, "max_gop": c.max_gop, "b_frames": c.reordered, "bytes": c.bytes}))
            })
            .collect();
        serde_json::json!({
            "record": record,
            "cameras": cameras,
            "episodes": self.episode_rows().iter().take(episodes.unwrap_or(usize::MAX)).map(|(i, l, t)| serde_json::json!({"episode_index": i, "length": l, "tasks": t})).collect::<Vec<_>>(),
            "tasks": self.task_rows().iter().map(|(i, t)| serde_json::json!({"task_index": i, "task": t})).collect::<Vec<_>>(),
            "findings": self.finding_rows(),
            "frame_tables": self.frame_tables,
            "proxy": self.proxy.as_ref().map(|p| serde_json::json!({"codec": p.settings.codec, "gop": p.settings.gop, "crf": p.settings.crf,
                "lossy": true, "cameras": p.cameras})),
        })
    }
}

pub fn inspect(out: &mut impl Write, record: &CommitRecord, versions: u64, t: &InspectTables, max_episodes: usize) -> std::io::Result<()> {
    writeln!(
        out,
        "dataset   {}@{} (version {} of {versions}), committed {}",
        record.name,
        record.version,
        record.version,
        record.committed_at.format("%Y-%m-%d %H:%M:%S UTC")
    )?;
    writeln!(
        out,
        "source    {} (LeRobot {}, {} files, {}, {})",
        record.source.url,
        record.source.codebase_version,
        record.source.files,
        bytes(record.source.bytes),
        short_hash(&record.source.content_hash)
    )?;
    writeln!(out, "robot     {}, {} fps", record.robot_type.as_deref().unwrap_or("unknown"), record.fps)?;
    writeln!(
        out,
        "contents  {}, {} steps ({:.1} s), {}, {} packets in {}{}",
        count(record.counts.episodes, "episode"),
        record.counts.steps,
        record.counts.steps as f64 / f64::from(record.fps.max(1)),
        count(record.counts.tasks, "task"),
        record.counts.packets,
        count(record.counts.streams, "stream"),
        if record.counts.skipped_episodes > 0 {
            format!(", {} skipped", count(record.counts.skipped_episodes, "episode"))
        } else {
            String::new()
        }
    )?;
    writeln!(out, "tables    {}/{{{}}}.lance", record.tables.dir, record.tables.tables.join(","))?;
    if t.frame_tables.is_empty() && record.counts.cameras > 0 {
        writeln!(out, "frames    decoded from packets (`lake cache {}` stores them decoded)", record.name)?;
    }
    for (i, f) in t.frame_tables.iter().enumerate() {
        let size = f.size.map_or_else(|| "recorded size".to_string(), |s| s.to_string());
        let again = match f.size {
            Some(size) => format!("`lake cache {}@{} --size {size}`", record.name, record.version),
            None => format!("`lake cache {}@{}`", record.name, record.version),
        };
        let what = match (f.storage, f.frames, &f.damage) {
            (Some(storage), Some(frames), None) if f.checksums == Some(false) => {
                format!("{frames} frames, {storage}, {}, without checksums (run {again} again to add them)", bytes(f.bytes))
            }
            (Some(storage), Some(frames), None) => format!("{frames} frames, {storage}, {}", bytes(f.bytes)),
            (Some(_), Some(_), Some(damage)) => format!("damaged outside lake: {damage} (run {again} again)"),
            _ => format!("unreadable, {} (run {again} again)", bytes(f.bytes)),
        };
        writeln!(out, "{:<10}{size}: {what}", if i == 0 { "frames" } else { "" })?;
    }
    if let Some(p) = &t.proxy {
        writeln!(out, "proxy     {}: lossy re-encoding, served only to requests for it (--proxy)", p.label())?;
        for c in &p.cameras {
            writeln!(
                out,
                "            {}: PSNR {} against the recorded frames, {} frames, {}",
                c.camera,
                lake_loader::ProxyInfo::psnr_words(c),
                c.frames,
                bytes(c.bytes)
            )?;
        }
    }

    writeln!(out, "\nfeatures")?;
    let features: Vec<Feature> = InfoJson::parse(&record.info.to_string()).ok().and_then(|i| i.parsed_features().ok()).unwrap_or_default();
    let cameras = t.cameras();
    for f in &features {
        let note = match f.kind() {
            FeatureKind::Video | FeatureKind::Image if !cameras.contains_key(&f.name) => " (not ingested)",
            _ => "",
        };
        writeln!(out, "  {:<40} {:<8} {:?}{note}", f.name, f.dtype, f.shape)?;
    }
    if !cameras.is_empty() {
        writeln!(out, "\ncameras")?;
        for (name, c) in &cameras {
            let declared = match &c.declared {
                Some(d) if !d.eq_ignore_ascii_case(&c.codec) => format!(" (declared {d})"),
                _ => String::new(),
            };
            writeln!(
                out,
                "  {name}: {} {}{declared} {}, {}, {} frames, {} keyframes, max GOP {}{}, {}",
                c.kind,
                c.codec,
                [c.size.as_str(), c.pix_fmt.as_str(), c.colour.as_str()]
                    .iter()
                    .filter(|s| !s.is_empty())
                    .copied()
                    .collect::<Vec<_>>()
                    .join(" "),
                count(c.files, "file"),
                c.packets,
                c.keyframes,
                c.max_gop,
                if c.reordered { ", B-frames" } else { "" },
                bytes(c.bytes)
            )?;
        }
    }
    let episodes = t.episode_rows();
    writeln!(out, "\nepisodes ({})", episodes.len())?;
    if !episodes.is_empty() {
        let lengths: Vec<i64> = episodes.iter().map(|e| e.1).collect();
        let (min, max) = (lengths.iter().min().copied().unwrap_or(0), lengths.iter().max().copied().unwrap_or(0));
        writeln!(out, "  length min {min}, max {max}, mean {:.1}", lengths.iter().sum::<i64>() as f64 / lengths.len() as f64)?;
        for (i, l, tasks) in episodes.iter().take(max_episodes) {
            writeln!(out, "  {i:>6}  {l:>6}  {tasks}")?;
        }
        if episodes.len() > max_episodes {
            writeln!(out, "  … {} more (--episodes N)", episodes.len() - max_episodes)?;
        }
    }
    let tasks = t.task_rows();
    writeln!(out, "\ntasks ({})", tasks.len())?;
    for (i, task) in tasks.iter().take(20) {
        writeln!(out, "  {i:>4}  {task}")?;
    }
    if tasks.len() > 20 {
        writeln!(out, "  … {} more", tasks.len() - 20)?;
    }
    let findings = t.finding_rows();
    writeln!(out, "\nfindings ({})", findings.len())?;
    let mut groups: BTreeMap<(lake_schemas::Severity, &str), Vec<&lake_schemas::Finding>> = BTreeMap::new();
    for f in &findings {
        groups.entry((f.severity, f.kind.as_str())).or_default().push(f);
    }
    for ((severity, kind), group) in &groups {
        // Each episode once, in order (several findings of a kind may name one episode).
        let episodes: Vec<String> =
            group.iter().filter_map(|f| f.episode).collect::<std::collections::BTreeSet<_>>().iter().map(ToString::to_string).collect();
        let which = match episodes.len() {
            0 => String::new(),
            n if n <= 12 => format!(" (episodes {})", episodes.join(", ")),
            n => format!(" ({n} episodes: {}, …)", episodes[..8].join(", ")),
        };
        writeln!(out, "  {} {}[{kind}]{which}", group.len(), severity.as_str())?;
        for f in group.iter().take(3) {
            writeln!(out, "    {f}")?;
        }
        if group.len() > 3 {
            writeln!(out, "    … {} more (--json lists all)", group.len() - 3)?;
        }
    }
    Ok(())
}

fn short_hash(h: &str) -> String {
    h.chars().take(7 + 16).collect::<String>() + "…"
}

/// Whether `got` has every column of `want` with its type (extra columns are allowed).
fn same_columns(got: &arrow::datatypes::Schema, want: &arrow::datatypes::Schema) -> bool {
    want.fields().iter().all(|f| got.field_with_name(f.name()).is_ok_and(|g| g.data_type() == f.data_type()))
}
