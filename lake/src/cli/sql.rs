//! `lake sql`: DataFusion over the lake, one query or an interactive shell.

use std::{
    io::{IsTerminal, Write},
    path::PathBuf,
    process::ExitCode,
    sync::Arc,
};

use anyhow::Context;
use arrow::{
    array::RecordBatch,
    datatypes::{DataType, SchemaRef},
    ipc::writer::{FileWriter, StreamWriter},
};
use futures::StreamExt;
use lake_query::sql::{LakeSql, TableInfo};
use lake_store::Lake;

use crate::output::Output;

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

impl Format {
    /// The format an output file's extension names; a text table for any other file.
    fn of_file(path: &std::path::Path) -> Self {
        let ext = path.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase);
        match ext.as_deref() {
            Some("csv") => Self::Csv,
            Some("json") => Self::Json,
            Some("ndjson" | "jsonl") => Self::Ndjson,
            Some("arrow" | "arrows" | "ipc" | "feather") => Self::Arrow,
            Some("parquet" | "pq") => Self::Parquet,
            _ => Self::Table,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::Table => "table",
            Self::Csv => "csv",
            Self::Json => "json",
            Self::Ndjson => "ndjson",
            Self::Arrow => "arrow",
            Self::Parquet => "parquet",
        }
    }
}

/// Arguments of `lake sql`.
#[derive(Debug, clap::Args)]
pub struct SqlArgs {
    /// The query; without one, an interactive shell (statements end with `;`, `\d` lists
    /// tables, `\d NAME` shows one, `\q` quits).
    query: Option<String>,
    /// Output format [default: from the --output file's extension (.csv, .json, .ndjson,
    /// .jsonl, .arrow, .ipc, .feather, .parquet), else a text table].
    #[arg(long, value_enum)]
    format: Option<Format>,
    /// Write the result to this file instead of stdout.
    #[arg(long, short)]
    output: Option<PathBuf>,
    /// MiB the query may hold: sorts, joins and aggregations spill to temporary files past it,
    /// and a query that needs more where it cannot spill fails as resources exhausted
    /// [default: half the machine's memory].
    #[arg(long, env = "LAKE_SQL_MEMORY_MB", value_parser = crate::args::mebibytes_at_least_one)]
    memory_mb: Option<u64>,
}

impl SqlArgs {
    /// Whether these open the interactive shell (which reads lines on the main thread, where
    /// the default signal actions must stay: Ctrl-C at the prompt is the line editor's).
    pub fn is_shell(&self) -> bool {
        self.query.is_none()
    }
}

/// `lake sql`.
pub async fn sql(root: &str, args: SqlArgs) -> anyhow::Result<ExitCode> {
    let format = match (args.format, &args.output) {
        (Some(format), _) => format,
        (None, Some(path)) => Format::of_file(path),
        (None, None) => Format::Table,
    };
    let lake = Lake::open(root)?;
    // Queries only, as a server answers: `CREATE TABLE … AS` would make a table this process
    // forgets, `COPY … TO` writes what `--output` writes.
    let memory = lake_query::sql::SqlMemory::new(args.memory_mb.map_or_else(lake_query::sql::SqlMemory::default_bytes, |mb| mb << 20))?;
    let session = LakeSql::open_with(&lake, &lake_query::sql::OpenedTables::default(), &memory).await?.read_only();
    for (spec, why) in session.unreadable() {
        // A version `lake rm` took while the session opened it.
        let removal = match spec.rsplit_once('@').map(|(name, v)| (name, v.parse::<u64>())) {
            Some((name, Ok(version))) => lake.removal(name).await.ok().flatten().filter(|r| r.through_version >= version),
            _ => None,
        };
        match removal {
            Some(removal) => errln!("warning: {removal} while this command opened it; it is left out of every table"),
            None => errln!("warning: dataset {spec} cannot be read and is left out of every table: {why}"),
        }
    }
    for (_, skipped) in session.skipped_tables() {
        errln!("warning: {skipped}");
    }
    match &args.query {
        Some(query) if query.trim_start().starts_with('\\') => {
            Ok(if meta_command(&session, query.trim()).await? { ExitCode::SUCCESS } else { ExitCode::from(2) })
        }
        Some(query) => {
            run(&session, query, format, args.output.as_deref()).await?;
            Ok(ExitCode::SUCCESS)
        }
        None => shell(&session, format).await,
    }
}

/// Runs one statement and writes its result.
async fn run(session: &LakeSql, query: &str, format: Format, output: Option<&std::path::Path>) -> anyhow::Result<()> {
    if matches!(format, Format::Arrow | Format::Parquet) && output.is_none() && std::io::stdout().is_terminal() {
        anyhow::bail!("--format {} is binary; give --output FILE or redirect stdout", format.name());
    }
    let mut stream = session.stream(query).await?;
    let schema = stream.schema();
    // A query that fails part-way leaves no half-written file (see `Output`).
    let mut file = output.map(|path| Output::create(path).with_context(|| format!("cannot write {}", path.display()))).transpose()?;
    let mut stdout = std::io::BufWriter::new(std::io::stdout());
    let out: &mut (dyn Write + Send) = match &mut file {
        Some(file) => file,
        None => &mut stdout,
    };
    let mut sink = Sink::new(format, schema.clone(), output.is_some(), out)?;
    let mut rows = 0usize;
    while let Some(batch) = stream.next().await {
        let batch = batch.map_err(|e| lake_query::sql::sql_error(&e))?;
        rows += batch.num_rows();
        sink.write(batch)?;
    }
    sink.finish()?;
    if let Some(file) = file {
        let path = file.path().to_path_buf();
        file.commit().with_context(|| format!("writing {}", path.display()))?;
        errln!("wrote {rows} row{} to {}", if rows == 1 { "" } else { "s" }, path.display());
    } else {
        stdout.flush()?;
    }
    // The footer follows its table on stdout, as psql's does.
    if output.is_none() && format == Format::Table {
        writeln!(stdout, "({rows} row{})", if rows == 1 { "" } else { "s" })?;
        stdout.flush()?;
    }
    Ok(())
}

/// Writes batches in one format as they arrive (the text table collects a page of them first,
/// to align it).
enum Sink<'a> {
    Table(TablePages<'a>),
    /// The writer, and the schema until a batch is written (an empty result still gets its
    /// header row).
    Csv(arrow::csv::Writer<&'a mut (dyn Write + Send)>, Option<SchemaRef>),
    Json(arrow::json::ArrayWriter<&'a mut (dyn Write + Send)>),
    Ndjson(arrow::json::LineDelimitedWriter<&'a mut (dyn Write + Send)>),
    ArrowFile(FileWriter<&'a mut (dyn Write + Send)>),
    ArrowStream(StreamWriter<&'a mut (dyn Write + Send)>),
    /// The writer and the schema batches are cast to ([`parquet_schema`]).
    Parquet(parquet::arrow::ArrowWriter<&'a mut (dyn Write + Send)>, SchemaRef),
}

/// The schema a result is written to parquet with: nullable fixed-size list columns (a vector
/// feature of the stacked tables, null in the rows of datasets without it) become
/// variable-size lists. Parquet has no fixed-size list type either way, and pyarrow cannot read
/// back a null fixed-size list from parquet (apache/arrow#35692), so pandas users could not open
/// the file; non-null vectors keep their fixed size in the Arrow schema stored with the file.
fn parquet_schema(schema: &SchemaRef) -> SchemaRef {
    let fields: Vec<arrow::datatypes::FieldRef> = schema
        .fields()
        .iter()
        .map(|f| match f.data_type() {
            DataType::FixedSizeList(item, _) if f.is_nullable() => {
                Arc::new(f.as_ref().clone().with_data_type(DataType::List(item.clone())))
            }
            _ => f.clone(),
        })
        .collect();
    Arc::new(arrow::datatypes::Schema::new_with_metadata(fields, schema.metadata().clone()))
}

/// A text table printed a page at a time, as psql's `FETCH_COUNT` does: rows are collected
/// until [`PAGE_ROWS`] rows or [`PAGE_BYTES`] bytes and then printed as one aligned table, so
/// a result of any size is shown whole in bounded memory (one page of a few thousand rows is
/// one table, as before).
struct TablePages<'a> {
    page: Vec<RecordBatch>,
    rows: usize,
    bytes: usize,
    schema: SchemaRef,
    printed: bool,
    out: &'a mut (dyn Write + Send),
}

const PAGE_ROWS: usize = 10_000;
const PAGE_BYTES: usize = 64 << 20;

impl TablePages<'_> {
    fn push(&mut self, batch: RecordBatch) -> anyhow::Result<()> {
        if batch.num_rows() == 0 {
            return Ok(());
        }
        self.rows += batch.num_rows();
        // The bytes of the rows themselves (a slice of a larger batch holds its whole buffers).
        self.bytes += batch
            .columns()
            .iter()
            .map(|c| c.to_data().get_slice_memory_size().unwrap_or_else(|_| c.get_array_memory_size()))
            .sum::<usize>();
        self.page.push(batch);
        if self.rows >= PAGE_ROWS || self.bytes >= PAGE_BYTES {
            self.print_page()?;
        }
        Ok(())
    }

    fn print_page(&mut self) -> anyhow::Result<()> {
        let page = std::mem::take(&mut self.page);
        (self.rows, self.bytes) = (0, 0);
        let text = if page.is_empty() {
            arrow::util::pretty::pretty_format_batches(&[RecordBatch::new_empty(self.schema.clone())])?
        } else {
            let page = page.iter().map(tabs_shown).collect::<Result<Vec<_>, _>>()?;
            arrow::util::pretty::pretty_format_batches(&page)?
        };
        writeln!(self.out, "{text}")?;
        self.printed = true;
        Ok(())
    }

    /// Prints what is left: the last page, or the header of an empty result.
    fn finish(mut self) -> anyhow::Result<()> {
        if !self.page.is_empty() || !self.printed { self.print_page() } else { Ok(()) }
    }
}

impl<'a> Sink<'a> {
    fn new(format: Format, schema: SchemaRef, to_file: bool, out: &'a mut (dyn Write + Send)) -> anyhow::Result<Self> {
        Ok(match format {
            Format::Table => Self::Table(TablePages { page: Vec::new(), rows: 0, bytes: 0, schema, printed: false, out }),
            Format::Csv => Self::Csv(arrow::csv::WriterBuilder::new().with_header(true).build(out), Some(schema)),
            // Null values are written as `null`, so every row has every column.
            Format::Json => Self::Json(arrow::json::WriterBuilder::new().with_explicit_nulls(true).build(out)),
            Format::Ndjson => Self::Ndjson(arrow::json::WriterBuilder::new().with_explicit_nulls(true).build(out)),
            Format::Arrow if to_file => Self::ArrowFile(FileWriter::try_new(out, &schema)?),
            Format::Arrow => Self::ArrowStream(StreamWriter::try_new(out, &schema)?),
            Format::Parquet => {
                let props = parquet::file::properties::WriterProperties::builder()
                    .set_compression(parquet::basic::Compression::ZSTD(Default::default()))
                    .build();
                let schema = parquet_schema(&schema);
                Self::Parquet(parquet::arrow::ArrowWriter::try_new(out, schema.clone(), Some(props))?, schema)
            }
        })
    }

    fn write(&mut self, batch: RecordBatch) -> anyhow::Result<()> {
        match self {
            Self::Table(pages) => pages.push(batch)?,
            Self::Csv(w, unwritten) => {
                w.write(&lake_query::sql::flat_for_csv(&batch)?)?;
                *unwritten = None;
            }
            Self::Json(w) => w.write(&batch)?,
            Self::Ndjson(w) => w.write(&batch)?,
            Self::ArrowFile(w) => w.write(&batch)?,
            Self::ArrowStream(w) => w.write(&batch)?,
            Self::Parquet(w, schema) => {
                let columns = batch
                    .columns()
                    .iter()
                    .zip(schema.fields())
                    .map(|(c, f)| if c.data_type() == f.data_type() { Ok(c.clone()) } else { arrow::compute::cast(c, f.data_type()) })
                    .collect::<Result<Vec<_>, _>>()?;
                w.write(&RecordBatch::try_new(schema.clone(), columns)?)?;
            }
        }
        Ok(())
    }

    fn finish(self) -> anyhow::Result<()> {
        match self {
            Self::Table(pages) => pages.finish()?,
            Self::Csv(mut w, unwritten) => {
                if let Some(schema) = unwritten {
                    w.write(&lake_query::sql::flat_for_csv(&RecordBatch::new_empty(schema))?)?;
                }
            }
            Self::Json(mut w) => {
                w.finish()?;
                w.into_inner().write_all(b"\n")?;
            }
            Self::Ndjson(mut w) => w.finish()?,
            Self::ArrowFile(mut w) => w.finish()?,
            Self::ArrowStream(mut w) => w.finish()?,
            Self::Parquet(w, _) => {
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
        errln!(
            "lake sql over {} dataset(s); statements end with `;`; \\d lists tables, \\d NAME shows one, \\q quits",
            session.datasets().len()
        );
    }
    let mut statement = String::new();
    let mut failed = false;
    let mut gone = None;
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
        // A `\\` command is read anywhere in a line outside strings and comments, a statement
        // begun or not (`\\q` drops that statement): the text before it is SQL, the rest of the
        // line the command.
        if line.trim().is_empty() && statement.is_empty() {
            continue;
        }
        statement.push_str(&line);
        statement.push('\n');
        let (complete, rest, command) = split_statements(&statement);
        statement = rest;
        for query in complete {
            // Recalled, a statement runs as it is: with its `;`.
            let _ = editor.add_history_entry(format!("{};", query.trim_end()));
            if let Err(e) = run(session, &query, format, None).await {
                // With the output's reader gone there is no one left to answer.
                if crate::signals::reader_gone(&e) {
                    gone = Some(e);
                    break;
                }
                errln!("error: {e:#}");
                failed = true;
            }
        }
        if gone.is_some() {
            break;
        }
        let Some(command) = command else { continue };
        let _ = editor.add_history_entry(command.as_str());
        if command == "\\q" {
            statement.clear();
            break;
        }
        match meta_command(session, &command).await {
            Ok(found) => failed |= !found,
            Err(e) if crate::signals::reader_gone(&e) => {
                gone = Some(e);
                break;
            }
            Err(e) => return Err(e),
        }
    }
    // What a script leaves at its end runs as if a `;` ended it (nothing, when it holds no
    // code); at a terminal, Ctrl-D drops an unfinished statement, as it would a line.
    if interactive && !statement.trim().is_empty() {
        errln!("(the unfinished statement was not run: a statement ends with `;`)");
        statement.clear();
    }
    if gone.is_none() {
        for query in split_statements(&format!("{statement}\n;")).0 {
            if let Err(e) = run(session, &query, format, None).await {
                errln!("error: {e:#}");
                failed = true;
            }
        }
    }
    if let Some(h) = &history {
        if let Some(dir) = h.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        let _ = editor.save_history(h);
    }
    if let Some(e) = gone {
        return Err(e);
    }
    // Piped scripts report failure through the exit status; an interactive session does not.
    Ok(if failed && !interactive { ExitCode::from(2) } else { ExitCode::SUCCESS })
}

/// Splits `text` at the `;`s that end statements, not those in strings (`'…'`, `"…"`, `E'…'`
/// with backslash escapes, `$tag$…$tag$`) or comments (block comments nesting as DataFusion's
/// parser nests them): the complete statements, without their `;` (those holding no code left
/// out), the text after the last (empty when it holds neither code nor an open string or
/// comment), and a `\\` command: a backslash outside strings and comments (never SQL) ends
/// the text there, and the rest of its line is the command.
fn split_statements(text: &str) -> (Vec<String>, String, Option<String>) {
    #[derive(Clone, PartialEq)]
    enum In {
        Code,
        Quoted(char),
        Escaped,
        Dollar(String),
        LineComment,
        BlockComment(usize),
    }
    let chars: Vec<(usize, char)> = text.char_indices().collect();
    let at = |i: usize| chars.get(i).map(|&(_, c)| c);
    let (mut complete, mut start, mut state, mut code) = (Vec::new(), 0, In::Code, false);
    let mut i = 0;
    while let Some(c) = at(i) {
        let next = at(i + 1);
        let mut step = 1;
        state = match (state, c) {
            (In::Code, '-') if next == Some('-') => In::LineComment,
            (In::Code, '/') if next == Some('*') => {
                step = 2;
                In::BlockComment(1)
            }
            (In::Code, ';') => {
                if code {
                    complete.push(text[start..chars[i].0].trim().to_string());
                }
                (start, code) = (chars[i].0 + 1, false);
                In::Code
            }
            (In::Code, '\\') => {
                let at = chars[i].0;
                let command = text[at..].lines().next().unwrap_or_default().trim().to_string();
                return (complete, if code { text[start..at].to_string() } else { String::new() }, Some(command));
            }
            (In::Code, c) => {
                code |= !c.is_whitespace();
                let word_before = i > 0 && at(i - 1).is_some_and(|p| p.is_alphanumeric() || p == '_');
                if matches!(c, 'E' | 'e') && next == Some('\'') && !word_before {
                    step = 2;
                    In::Escaped
                } else if c == '$' && !word_before {
                    // `$tag$` opens a string that the same `$tag$` closes (`$1` is a parameter).
                    let tag: String = chars[i + 1..].iter().map(|&(_, c)| c).take_while(|c| c.is_alphanumeric() || *c == '_').collect();
                    let closes = at(i + 1 + tag.chars().count()) == Some('$') && !tag.starts_with(|c: char| c.is_ascii_digit());
                    if closes {
                        step = tag.chars().count() + 2;
                        In::Dollar(tag)
                    } else {
                        In::Code
                    }
                } else if matches!(c, '\'' | '"') {
                    In::Quoted(c)
                } else {
                    In::Code
                }
            }
            (In::Quoted(q), c) if c == q => In::Code,
            (In::Escaped, '\\') => {
                step = 2;
                In::Escaped
            }
            (In::Escaped, '\'') => In::Code,
            (In::Dollar(tag), '$') => {
                let closing: String = chars[i + 1..].iter().map(|&(_, c)| c).take(tag.chars().count() + 1).collect();
                if closing == format!("{tag}$") {
                    step = tag.chars().count() + 2;
                    In::Code
                } else {
                    In::Dollar(tag)
                }
            }
            (In::LineComment, '\n') => In::Code,
            (In::BlockComment(depth), '/') if next == Some('*') => {
                step = 2;
                In::BlockComment(depth + 1)
            }
            (In::BlockComment(depth), '*') if next == Some('/') => {
                step = 2;
                if depth == 1 { In::Code } else { In::BlockComment(depth - 1) }
            }
            (state, _) => state,
        };
        i += step;
    }
    let open = !matches!(state, In::Code | In::LineComment);
    (complete, if code || open { text[start..].to_string() } else { String::new() }, None)
}

fn find_table<'a>(tables: &'a [TableInfo], name: &str) -> Option<&'a TableInfo> {
    let name = name.trim_end_matches(';');
    tables.iter().find(|t| {
        let unquoted = name.replace('"', "");
        (t.schema == lake_query::sql::SCHEMA && t.name == unquoted) || format!("{}.{}", t.schema, t.name) == unquoted
    })
}

/// Runs a `\\` command (`\\d`, `\\d NAME`); false when it named no table.
async fn meta_command(session: &LakeSql, command: &str) -> anyhow::Result<bool> {
    match command.split_whitespace().collect::<Vec<_>>().as_slice() {
        ["\\d"] => out!("{}", describe_tables(&session.tables().await?))?,
        ["\\d", name] => {
            // An earlier version's tables are opened when first named.
            if name.contains('@')
                && let Err(e) = session.open_version_of(name).await
            {
                errln!("error: {e}");
                return Ok(false);
            }
            match find_table(&session.tables().await?, name) {
                Some(t) => out!("{}", describe_columns(t))?,
                None => {
                    errln!("error: no table `{name}` (\\d lists them)");
                    return Ok(false);
                }
            }
        }
        _ => errln!("commands: \\d (tables), \\d NAME (columns), \\q (quit)"),
    }
    Ok(true)
}

fn describe_tables(tables: &[TableInfo]) -> String {
    let mut out = String::new();
    for t in tables {
        let name = if t.schema == lake_query::sql::SCHEMA { t.name.clone() } else { format!("\"{}\".{}", t.schema, t.name) };
        out.push_str(&format!("{name:<48} {} columns\n", t.columns.fields().len()));
    }
    out
}

fn describe_columns(t: &TableInfo) -> String {
    let mut out = format!("{}.{}\n", t.schema, t.name);
    for f in t.columns.fields() {
        out.push_str(&format!("  {:<40} {}{}\n", f.name(), type_name(f.data_type()), if f.is_nullable() { "" } else { " not null" }));
    }
    out
}

/// `batch` with the tabs and carriage returns in its text columns written as `\t` and `\r`,
/// which a table would print raw, out of its columns.
fn tabs_shown(batch: &RecordBatch) -> Result<RecordBatch, arrow::error::ArrowError> {
    use arrow::array::{AsArray, StringArray};
    let columns = batch
        .columns()
        .iter()
        .map(|c| match c.as_string_opt::<i32>() {
            Some(text) if text.iter().flatten().any(|t| t.contains(['\t', '\r'])) => {
                let shown: StringArray = text.iter().map(|t| t.map(|t| t.replace('\t', "\\t").replace('\r', "\\r"))).collect();
                Arc::new(shown) as arrow::array::ArrayRef
            }
            _ => c.clone(),
        })
        .collect();
    RecordBatch::try_new(batch.schema(), columns)
}

/// A column type as SQL users read it: nested types spelled out (`struct<a: Int64, …>`,
/// `list<Float32>`, `Float32[6]` for a fixed-size list), without Arrow's field metadata.
fn type_name(t: &DataType) -> String {
    match t {
        DataType::Struct(fields) => {
            // Members by the names a query uses (`packet_row['observation/images/front']`).
            let inner: Vec<String> = fields.iter().map(|f| format!("{}: {}", f.name(), type_name(f.data_type()))).collect();
            format!("struct<{}>", inner.join(", "))
        }
        DataType::List(item) | DataType::LargeList(item) => format!("list<{}>", type_name(item.data_type())),
        DataType::FixedSizeList(item, n) => format!("{}[{n}]", type_name(item.data_type())),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_end_at_semicolons_outside_quotes_and_comments() {
        let (done, rest, _) = split_statements("select 1 as a; select 2 as b;\n");
        assert_eq!((done, rest), (vec!["select 1 as a".to_string(), "select 2 as b".to_string()], String::new()));
        let (done, rest, _) = split_statements("select 'x;\ny' as s, \"a;b\" -- c;\n from t /* ; */;  select");
        assert_eq!(done, vec!["select 'x;\ny' as s, \"a;b\" -- c;\n from t /* ; */".to_string()]);
        assert_eq!(rest, "  select");
        let (done, rest, _) = split_statements("select 'it''s;' ;\n;\n");
        assert_eq!((done, rest), (vec!["select 'it''s;'".to_string()], String::new()));
        let (done, rest, _) = split_statements("select 'open;\n");
        assert!(done.is_empty() && rest == "select 'open;\n");
        let (done, rest, _) = split_statements("select 1 as x; -- done\n");
        assert_eq!((done, rest), (vec!["select 1 as x".to_string()], String::new()), "a trailing comment is no statement");
        let (done, rest, _) = split_statements("/* a /* nested ; */ still ; */ select 2;");
        assert_eq!((done, rest), (vec!["/* a /* nested ; */ still ; */ select 2".to_string()], String::new()));
        let (done, rest, _) = split_statements("/* disabled:\nselect 2;\n");
        assert!(done.is_empty() && rest == "/* disabled:\nselect 2;\n", "an open comment goes on: {rest:?}");
        let (done, rest, _) = split_statements("select E'a\\';' as a, $$x;y$$ as b, $t$p;$q$t$ as c, $1 as d; select 2");
        assert_eq!(done, vec!["select E'a\\';' as a, $$x;y$$ as b, $t$p;$q$t$ as c, $1 as d".to_string()]);
        assert_eq!(rest, " select 2");
    }

    #[test]
    fn a_backslash_outside_strings_and_comments_starts_a_command() {
        let split = split_statements("select 1; select 3 as x \\q\nselect 4;\n");
        assert_eq!(split, (vec!["select 1".to_string()], " select 3 as x ".to_string(), Some("\\q".to_string())));
        let split = split_statements("select 1;  \\d steps  \n");
        assert_eq!(split, (vec!["select 1".to_string()], String::new(), Some("\\d steps".to_string())));
        let split = split_statements("select '\\q' as a, E'\\\\' as b -- \\q\n/* \\d */;\n");
        assert_eq!(split, (vec!["select '\\q' as a, E'\\\\' as b -- \\q\n/* \\d */".to_string()], String::new(), None));
    }

    #[test]
    fn a_large_table_prints_a_page_at_a_time_and_an_empty_one_its_header() {
        let schema = Arc::new(arrow::datatypes::Schema::new(vec![arrow::datatypes::Field::new("n", DataType::Int64, false)]));
        let batch = |from: i64, rows: i64| {
            RecordBatch::try_new(schema.clone(), vec![Arc::new(arrow::array::Int64Array::from_iter_values(from..from + rows))])
                .expect("batch")
        };
        let mut out = Vec::new();
        let mut sink = Sink::new(Format::Table, schema.clone(), false, &mut out).expect("sink");
        for part in 0..5 {
            sink.write(batch(part * 6000, 6000)).expect("write");
        }
        sink.write(batch(0, 0)).expect("an empty batch after a page prints nothing");
        sink.finish().expect("finish");
        let text = String::from_utf8(out).expect("utf-8");
        // 30 000 rows: pages of 12 000, 12 000 and 6 000 rows, each with its own header.
        assert_eq!(text.matches("| n ").count(), 3, "three pages");
        let values: Vec<i64> = text.lines().filter_map(|l| l.trim_matches(|c| c == '|' || c == ' ').parse().ok()).collect();
        assert_eq!(values, (0..30_000).collect::<Vec<_>>(), "every row once, in order");
        let mut out = Vec::new();
        Sink::new(Format::Table, schema.clone(), false, &mut out).expect("sink").finish().expect("finish");
        assert_eq!(String::from_utf8(out).expect("utf-8").matches("| n |").count(), 1, "an empty result shows its header");
    }
}
