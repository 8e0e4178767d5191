//! `lake sql`, `lake view` and `lake stats`: the lake for data engineers.

use std::{
    io::{IsTerminal, Write},
    path::PathBuf,
    process::ExitCode,
};

use anyhow::Context;
use arrow::{
    array::{Array, AsArray, RecordBatch},
    datatypes::{Float64Type, Int64Type, SchemaRef},
    ipc::writer::{FileWriter, StreamWriter},
};
use futures::StreamExt;
use lake::{
    sql::{LakeSql, TableInfo},
    views,
};
use lake_store::Lake;
use serde_json::{Map, Value};

/// Output formats of `lake sql`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// An aligned text table.
    Table,
    /// CSV with a header row.
    Csv,
    /// One JSON array of row objects.
    Json,
    /// One JSON object per line.
    Ndjson,
    /// Arrow IPC (a file with --output, a stream on stdout).
    Arrow,
    /// Parquet (zstd).
    Parquet,
}

/// Arguments of `lake sql`.
#[derive(Debug, clap::Args)]
pub struct SqlArgs {
    /// The query; without one, an interactive shell (statements end with `;`, `\d` lists
    /// tables, `\d NAME` shows one, `\q` quits).
    query: Option<String>,
    /// Output format.
    #[arg(long, value_enum, default_value = "table")]
    format: Format,
    /// Write the result to this file instead of stdout.
    #[arg(long, short)]
    output: Option<PathBuf>,
}

/// `lake sql`.
pub async fn sql(root: &str, args: SqlArgs) -> anyhow::Result<ExitCode> {
    let lake = Lake::open(root)?;
    let session = LakeSql::open(&lake).await?;
    match &args.query {
        Some(query) => {
            run(&session, query, args.format, args.output.as_deref()).await?;
            Ok(ExitCode::SUCCESS)
        }
        None => shell(&session, args.format).await,
    }
}

/// Runs one statement and writes its result.
async fn run(session: &LakeSql, query: &str, format: Format, output: Option<&std::path::Path>) -> anyhow::Result<()> {
    if matches!(format, Format::Arrow | Format::Parquet) && output.is_none() && std::io::stdout().is_terminal() {
        anyhow::bail!("--format {format:?} is binary; give --output FILE or redirect stdout");
    }
    let mut stream = session.stream(query).await?;
    let schema = stream.schema();
    let (tmp, mut out): (Option<PathBuf>, Box<dyn Write + Send>) = match output {
        Some(path) => {
            let tmp = path.with_extension("partial");
            let file = std::fs::File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
            (Some(tmp), Box::new(std::io::BufWriter::new(file)))
        }
        None => (None, Box::new(std::io::BufWriter::new(std::io::stdout()))),
    };
    let mut sink = Sink::new(format, schema.clone(), output.is_some(), out.as_mut())?;
    let mut rows = 0usize;
    while let Some(batch) = stream.next().await {
        let batch = batch.map_err(|e| anyhow::anyhow!("{}", e.strip_backtrace()))?;
        rows += batch.num_rows();
        sink.write(batch)?;
    }
    sink.finish()?;
    out.flush()?;
    drop(out);
    if let (Some(tmp), Some(path)) = (tmp, output) {
        std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))?;
        eprintln!("wrote {rows} rows to {}", path.display());
    } else if format == Format::Table {
        eprintln!("({rows} row{})", if rows == 1 { "" } else { "s" });
    }
    Ok(())
}

/// Writes batches in one format as they arrive (the text table collects them first, to align).
enum Sink<'a> {
    Table(Vec<RecordBatch>, SchemaRef, &'a mut (dyn Write + Send)),
    Csv(arrow::csv::Writer<&'a mut (dyn Write + Send)>),
    Json(arrow::json::ArrayWriter<&'a mut (dyn Write + Send)>),
    Ndjson(arrow::json::LineDelimitedWriter<&'a mut (dyn Write + Send)>),
    ArrowFile(FileWriter<&'a mut (dyn Write + Send)>),
    ArrowStream(StreamWriter<&'a mut (dyn Write + Send)>),
    Parquet(parquet::arrow::ArrowWriter<&'a mut (dyn Write + Send)>),
}

impl<'a> Sink<'a> {
    fn new(format: Format, schema: SchemaRef, to_file: bool, out: &'a mut (dyn Write + Send)) -> anyhow::Result<Self> {
        Ok(match format {
            Format::Table => Self::Table(Vec::new(), schema, out),
            Format::Csv => Self::Csv(arrow::csv::WriterBuilder::new().with_header(true).build(out)),
            Format::Json => Self::Json(arrow::json::ArrayWriter::new(out)),
            Format::Ndjson => Self::Ndjson(arrow::json::LineDelimitedWriter::new(out)),
            Format::Arrow if to_file => Self::ArrowFile(FileWriter::try_new(out, &schema)?),
            Format::Arrow => Self::ArrowStream(StreamWriter::try_new(out, &schema)?),
            Format::Parquet => {
                let props = parquet::file::properties::WriterProperties::builder()
                    .set_compression(parquet::basic::Compression::ZSTD(Default::default()))
                    .build();
                Self::Parquet(parquet::arrow::ArrowWriter::try_new(out, schema, Some(props))?)
            }
        })
    }

    fn write(&mut self, batch: RecordBatch) -> anyhow::Result<()> {
        match self {
            Self::Table(batches, ..) => batches.push(batch),
            Self::Csv(w) => w.write(&batch)?,
            Self::Json(w) => w.write(&batch)?,
            Self::Ndjson(w) => w.write(&batch)?,
            Self::ArrowFile(w) => w.write(&batch)?,
            Self::ArrowStream(w) => w.write(&batch)?,
            Self::Parquet(w) => w.write(&batch)?,
        }
        Ok(())
    }

    fn finish(self) -> anyhow::Result<()> {
        match self {
            Self::Table(batches, schema, out) => {
                let text = if batches.is_empty() {
                    arrow::util::pretty::pretty_format_batches(&[RecordBatch::new_empty(schema)])?
                } else {
                    arrow::util::pretty::pretty_format_batches(&batches)?
                };
                writeln!(out, "{text}")?;
            }
            Self::Csv(_) => {}
            Self::Json(mut w) => w.finish()?,
            Self::Ndjson(mut w) => w.finish()?,
            Self::ArrowFile(mut w) => w.finish()?,
            Self::ArrowStream(mut w) => w.finish()?,
            Self::Parquet(w) => {
                w.close()?;
            }
        }
        Ok(())
    }
}

/// The interactive shell.
async fn shell(session: &LakeSql, format: Format) -> anyhow::Result<ExitCode> {
    let mut editor = rustyline::DefaultEditor::new()?;
    let history = std::env::var_os("LAKE_HISTORY")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache").join("lake").join("sql_history")));
    if let Some(h) = &history {
        let _ = editor.load_history(h);
    }
    let interactive = std::io::stdin().is_terminal();
    if interactive {
        eprintln!(
            "lake sql over {} dataset(s); statements end with `;`; \\d lists tables, \\d NAME shows one, \\q quits",
            session.datasets().len()
        );
    }
    let mut statement = String::new();
    let mut failed = false;
    loop {
        let prompt = if statement.is_empty() { "lake> " } else { "  ... " };
        let line = match editor.readline(prompt) {
            Ok(line) => line,
            Err(rustyline::error::ReadlineError::Interrupted) => {
                statement.clear();
                continue;
            }
            Err(rustyline::error::ReadlineError::Eof) => break,
            Err(e) => return Err(e.into()),
        };
        let trimmed = line.trim();
        if statement.is_empty() && trimmed.starts_with('\\') {
            let _ = editor.add_history_entry(trimmed);
            match trimmed.split_whitespace().collect::<Vec<_>>().as_slice() {
                ["\\q"] => break,
                ["\\d"] => print!("{}", describe_tables(&session.tables().await?)),
                ["\\d", name] => match find_table(&session.tables().await?, name) {
                    Some(t) => print!("{}", describe_columns(t)),
                    None => {
                        eprintln!("error: no table `{name}` (\\d lists them)");
                        failed = true;
                    }
                },
                _ => eprintln!("commands: \\d (tables), \\d NAME (columns), \\q (quit)"),
            }
            continue;
        }
        if trimmed.is_empty() && statement.is_empty() {
            continue;
        }
        statement.push_str(&line);
        statement.push('\n');
        if !trimmed.ends_with(';') {
            continue;
        }
        let query = statement.trim().trim_end_matches(';').to_string();
        statement.clear();
        let _ = editor.add_history_entry(query.as_str());
        if let Err(e) = run(session, &query, format, None).await {
            eprintln!("error: {e:#}");
            failed = true;
        }
    }
    if !statement.trim().is_empty() {
        let query = statement.trim().to_string();
        if let Err(e) = run(session, &query, format, None).await {
            eprintln!("error: {e:#}");
            failed = true;
        }
    }
    if let Some(h) = &history {
        if let Some(dir) = h.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        let _ = editor.save_history(h);
    }
    // Piped scripts report failure through the exit status; an interactive session does not.
    Ok(if failed && !interactive { ExitCode::from(2) } else { ExitCode::SUCCESS })
}

fn find_table<'a>(tables: &'a [TableInfo], name: &str) -> Option<&'a TableInfo> {
    let name = name.trim_end_matches(';');
    tables.iter().find(|t| {
        let unquoted = name.replace('"', "");
        (t.schema == lake::sql::SCHEMA && t.name == unquoted) || format!("{}.{}", t.schema, t.name) == unquoted
    })
}

fn describe_tables(tables: &[TableInfo]) -> String {
    let mut out = String::new();
    for t in tables {
        let name = if t.schema == lake::sql::SCHEMA { t.name.clone() } else { format!("\"{}\".{}", t.schema, t.name) };
        out.push_str(&format!("{name:<48} {} columns\n", t.columns.fields().len()));
    }
    out
}

fn describe_columns(t: &TableInfo) -> String {
    let mut out = format!("{}.{}\n", t.schema, t.name);
    for f in t.columns.fields() {
        out.push_str(&format!("  {:<40} {}{}\n", f.name(), f.data_type(), if f.is_nullable() { "" } else { " not null" }));
    }
    out
}

/// Arguments of `lake view`.
#[derive(Debug, clap::Subcommand)]
pub enum ViewCommand {
    /// Store the episodes a query selects as a named training set. The query returns
    /// `episode_index`, `dataset` (optional with one dataset) and optionally `weight`.
    Create {
        /// View name (letters, digits, `.`, `_`, `-`; not a dataset's name).
        name: String,
        /// The SELECT that picks episodes, e.g. "SELECT dataset, episode_index FROM episodes WHERE length > 100".
        query: String,
        /// Overwrite a view of the same name.
        #[arg(long)]
        replace: bool,
    },
    /// List the views.
    Ls,
    /// Show one view: its query, the dataset versions it is pinned to and its episodes.
    Show {
        /// View name.
        name: String,
    },
    /// Remove a view.
    Drop {
        /// View name.
        name: String,
    },
}

/// `lake view`.
pub async fn view(root: &str, command: ViewCommand) -> anyhow::Result<ExitCode> {
    let lake = Lake::open(root)?;
    match command {
        ViewCommand::Create { name, query, replace } => {
            let v = views::create(&lake, &name, &query, replace).await?;
            let parts: Vec<String> =
                v.datasets.iter().map(|d| format!("{}@{}: {} episodes", d.name, d.version, d.episodes.len())).collect();
            println!("view {} created: {} episodes ({})", v.name, v.episode_count(), parts.join("; "));
        }
        ViewCommand::Ls => {
            let all = lake.views().await?;
            if all.is_empty() {
                println!("no views in {}", lake.display_root());
            }
            for v in all {
                let parts: Vec<String> = v.datasets.iter().map(|d| format!("{}@{}", d.name, d.version)).collect();
                println!(
                    "{:<24} {:>6} episodes  {:<40} {}",
                    v.name,
                    v.episode_count(),
                    parts.join(","),
                    v.created_at.format("%Y-%m-%d %H:%M")
                );
            }
        }
        ViewCommand::Show { name } => {
            let v = lake.view(&name).await?.ok_or_else(|| anyhow::anyhow!("no view `{name}` in {}", lake.display_root()))?;
            println!("{}", serde_json::to_string_pretty(&v)?);
        }
        ViewCommand::Drop { name } => {
            lake.drop_view(&name).await?;
            println!("view {name} dropped");
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Arguments of `lake stats`.
#[derive(Debug, clap::Args)]
pub struct StatsArgs {
    /// Dataset name, optionally `NAME@VERSION`.
    dataset: String,
    /// Write LeRobot's `meta/stats.json` layout to this file (else print it).
    #[arg(long, short)]
    output: Option<PathBuf>,
}

/// `lake stats`: a dataset's statistics in LeRobot's `stats.json` layout: lake's exact ones for
/// numeric features, the source's stored ones for cameras.
pub async fn stats(root: &str, args: StatsArgs) -> anyhow::Result<ExitCode> {
    let lake = Lake::open(root)?;
    let record = lake.resolve(&args.dataset).await?;
    let json = stats_json(&lake, &record).await?;
    let text = serde_json::to_string_pretty(&json)?;
    match &args.output {
        Some(path) => {
            std::fs::write(path, text + "\n").with_context(|| format!("writing {}", path.display()))?;
            eprintln!("wrote the stats of {}@{} to {}", record.name, record.version, path.display());
        }
        None => println!("{text}"),
    }
    Ok(ExitCode::SUCCESS)
}

/// Nests flat `values` by `shape` (a scalar feature is a one-element list, as LeRobot writes).
fn nest(values: &[f64], shape: &[usize]) -> Value {
    match shape {
        [] | [_] => Value::from(values.to_vec()),
        [_, rest @ ..] => {
            let inner: usize = rest.iter().product();
            Value::Array(values.chunks(inner.max(1)).map(|c| nest(c, rest)).collect())
        }
    }
}

/// The dataset-level statistics of a version as LeRobot's `stats.json` object.
async fn stats_json(lake: &Lake, record: &lake_schemas::CommitRecord) -> anyhow::Result<Value> {
    use lake_schemas::tables::{FEATURE_STATS, QUANTILES, STATS};
    let mut out = Map::new();
    if !record.tables.tables.iter().any(|t| t == FEATURE_STATS) {
        anyhow::bail!("{}@{} was ingested before lake computed exact statistics; ingest it again", record.name, record.version);
    }
    let shapes = feature_shapes(&record.info);
    // Exact statistics of numeric features: dataset rows, by feature then dimension.
    let mut features: Vec<(String, Vec<Vec<f64>>, i64)> = Vec::new();
    let stat_names: Vec<&str> = ["min", "max", "mean", "std"].into_iter().chain(QUANTILES.iter().map(|(q, _)| *q)).collect();
    for batch in lake_store::read_table(lake, record, FEATURE_STATS).await? {
        let episode = batch.column_by_name("episode_index").expect("feature_stats schema");
        let feature = batch.column_by_name("feature").expect("feature_stats schema").as_string::<i32>();
        let count = batch.column_by_name("count").expect("feature_stats schema").as_primitive::<Int64Type>();
        let stats: Vec<_> =
            stat_names.iter().map(|s| batch.column_by_name(s).expect("feature_stats schema").as_primitive::<Float64Type>()).collect();
        for row in (0..batch.num_rows()).filter(|&r| episode.is_null(r)) {
            let name = feature.value(row);
            if features.last().is_none_or(|(n, ..)| n != name) {
                features.push((name.to_string(), vec![Vec::new(); stat_names.len()], count.value(row)));
            }
            let (_, values, _) = features.last_mut().expect("pushed above");
            for (v, col) in values.iter_mut().zip(&stats) {
                v.push(if col.is_null(row) { f64::NAN } else { col.value(row) });
            }
        }
    }
    for (name, values, count) in features {
        let shape = shapes.get(&name).cloned().unwrap_or_default();
        let mut entry = Map::new();
        for (stat, v) in stat_names.iter().zip(&values) {
            entry.insert(stat.to_string(), nest(v, &shape));
        }
        entry.insert("count".into(), Value::from(vec![count]));
        out.insert(name, Value::Object(entry));
    }
    // Cameras: the statistics the source stored (lake does not decode frames at ingest).
    for batch in lake_store::read_table(lake, record, STATS).await? {
        let episode = batch.column_by_name("episode_index").expect("stats schema");
        let feature = batch.column_by_name("feature").expect("stats schema").as_string::<i32>();
        let stat = batch.column_by_name("stat").expect("stats schema").as_string::<i32>();
        let values = batch.column_by_name("values").expect("stats schema").as_list::<i32>();
        let shape = batch.column_by_name("shape").expect("stats schema").as_list::<i32>();
        for row in (0..batch.num_rows()).filter(|&r| episode.is_null(r)) {
            let name = feature.value(row);
            if out.get(name).is_some_and(|e| !e.as_object().is_some_and(|o| o.contains_key("camera"))) {
                continue; // numeric: lake's exact statistics above win
            }
            let v: Vec<f64> = values.value(row).as_primitive::<Float64Type>().iter().map(|x| x.unwrap_or(f64::NAN)).collect();
            let s: Vec<usize> = shape.value(row).as_primitive::<Int64Type>().iter().map(|x| x.unwrap_or(1) as usize).collect();
            let entry = out.entry(name.to_string()).or_insert_with(|| serde_json::json!({"camera": true}));
            let value =
                if stat.value(row) == "count" { Value::from(v.iter().map(|c| *c as i64).collect::<Vec<_>>()) } else { nest(&v, &s) };
            entry.as_object_mut().expect("object").insert(stat.value(row).to_string(), value);
        }
    }
    for entry in out.values_mut() {
        entry.as_object_mut().expect("object").remove("camera");
    }
    Ok(Value::Object(out))
}

/// Declared shapes of features from `info.json`.
fn feature_shapes(info: &Value) -> std::collections::HashMap<String, Vec<usize>> {
    let mut out = std::collections::HashMap::new();
    if let Some(features) = info.get("features").and_then(Value::as_object) {
        for (name, f) in features {
            if let Some(shape) = f.get("shape").and_then(Value::as_array) {
                out.insert(name.clone(), shape.iter().filter_map(Value::as_u64).map(|d| d as usize).collect());
            }
        }
    }
    out
}
