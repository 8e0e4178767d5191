//! The `lake` command line.
#![allow(clippy::print_stdout, clippy::print_stderr)] // the binary is where output belongs

use std::{io::IsTerminal, process::ExitCode};

use clap::{Parser, Subcommand};

/// `println!` that hands a failed write (a full disk, a closed pipe) back as an error instead
/// of panicking: `outln!(...)?`.
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout().lock(), $($arg)*)
    }};
}

/// `print!` that hands a failed write back as an error (see `outln!`).
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let mut stdout = std::io::stdout().lock();
        write!(stdout, $($arg)*).and_then(|()| stdout.flush())
    }};
}

/// `eprintln!` that drops a failed write: with stderr gone there is nowhere left to say so,
/// and the exit status still tells.
macro_rules! errln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr().lock(), $($arg)*);
    }};
}

mod args;
mod cli;
mod explain;
mod output;
mod render;
mod signals;
mod text;

use signals::{interrupt_ignored, reader_gone, stop_requested};

// jemalloc with two arenas and a background thread that hands freed pages back after 10 s.
// Ingest churns through many short-lived multi-megabyte buffers (packet batches, read-ahead
// blocks, Lance pages), and glibc's per-thread arenas kept them, so RSS grew with the number of
// camera files although the live heap stays under 30 MB (valgrind massif). The loader frees and
// reallocates decoded frames and batch buffers every few milliseconds; handing pages back
// sooner (200 ms was tried) made it page-fault its frames in again and cost ~20 % of its CPU
// time, for no lower peak RSS. Allocations of 8 MiB and more (a batch's frame column is tens
// of MB) stay in those arenas under the same decay: jemalloc's default puts them in an arena of
// their own that hands their pages back at once, so each batch would fault its column in anew.
// `lake serve` keeps freed pages while it is busy (see server.rs).
#[cfg(feature = "jemalloc")]
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// The configuration jemalloc reads at start-up (see above).
#[cfg(feature = "jemalloc")]
#[allow(non_upper_case_globals)] // the symbol name jemalloc reads its configuration from
#[unsafe(export_name = "_rjem_malloc_conf")]
pub static malloc_conf: &[u8] = b"background_thread:true,dirty_decay_ms:10000,muzzy_decay_ms:0,narenas:2,oversize_threshold:0\0";

/// lake: a data lake and streaming dataloader for robot-learning data (LeRobot format).
#[derive(Debug, Parser)]
#[command(name = "lake", version, about, long_about = None, next_help_heading = "Global options")]
struct Cli {
    /// Lake root: a directory (or file:// URL), or an object store prefix (s3://BUCKET/PREFIX,
    /// gs://…, az://…; configured by the AWS_*, GOOGLE_* and AZURE_* variables).
    #[arg(long, global = true, env = "LAKE_ROOT", default_value = "./lake")]
    lake: String,
    /// Keep the table data read from an object store in this directory, so that later reads
    /// (the next epoch, another process) are local: Lance data files, fetched whole on first
    /// read, least recently used out first.
    #[arg(long, global = true, env = "LAKE_OBJECT_CACHE", value_name = "DIR")]
    object_cache: Option<std::path::PathBuf>,
    /// The object cache's budget in GB (decimal).
    #[arg(long, global = true, env = "LAKE_OBJECT_CACHE_GB", value_name = "N", default_value_t = 50.0, requires = "object_cache")]
    object_cache_gb: f64,
    /// How the lake's local files are read: `pread` (positioned reads), or `uring` (io_uring:
    /// a batch's frame-table reads all in flight from one thread, and Lance's io_uring reader
    /// for tables), where the kernel allows it, else `pread`, saying so.
    #[arg(long, global = true, env = "LAKE_IO", value_name = "HOW", default_value = "pread", value_parser = ["pread", "uring"])]
    io: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Validate a LeRobot v2.0/v2.1/v3.0 dataset and add it to the lake as a new version.
    ///
    /// Strict by default: a dataset with errors is refused with a report naming file, episode
    /// and frame, and the lake stays as it was. Re-ingesting an unchanged source is a no-op.
    Ingest(cli::ingest::IngestArgs),
    /// List the datasets in the lake (latest version of each).
    Ls(cli::ls::LsArgs),
    /// Remove a dataset from the lake: every version, its tables and frame tables.
    ///
    /// Streams and servers reading it fail from then on. Its version numbers stay taken: an
    /// ingest under the name later continues after them.
    Rm(cli::rm::RmArgs),
    /// Show a dataset: features, cameras (codec, size, GOP), episodes, tasks, findings.
    Inspect(cli::inspect::InspectArgs),
    /// Read every file of dataset versions and check it against the digest its ingest recorded,
    /// and every stored frame against its checksum: a scrub for damage the readers cannot see.
    ///
    /// Exits 0 when everything checked is as written, 1 when something is damaged (each named,
    /// with the command that mends it).
    Verify(cli::verify::VerifyArgs),
    /// Write the LeRobot samples of given step indices to an Arrow IPC file.
    Sample(cli::sample::SampleArgs),
    /// Measure loader throughput: samples/s, CPU per sample, first-batch latency, peak RSS.
    Bench(cli::bench::BenchArgs),
    /// Decode every frame of a dataset version once and store it losslessly (RGB) beside
    /// it; the loader then reads frames instead of decoding them.
    Cache(cli::cache::CacheArgs),
    /// Query the lake with SQL (DataFusion): `datasets`, `steps`, `episodes`, `tasks`, `stats`,
    /// `feature_stats`, `image_stats` (from `lake stats --images`), `findings`, `streams`, `packets`,
    /// `views`, and `"<dataset>".<table>`.
    /// Without a query, an interactive shell.
    Sql(cli::sql::SqlArgs),
    /// Named training sets: the episodes a SQL query selects, usable wherever a dataset is.
    #[command(subcommand)]
    View(cli::view::ViewCommand),
    /// Print a dataset's statistics in LeRobot's `meta/stats.json` layout (exact quantiles).
    Stats(cli::stats::StatsArgs),
    /// Write a dataset or a view over one as a LeRobot v3.0 dataset (videos by stream copy) or
    /// as plain parquet tables.
    Export(cli::export::ExportArgs),
    /// Serve sampling streams (Arrow Flight and HTTP) and SQL over the lake.
    Serve(cli::serve::ServeArgs),
    /// Train LeRobot's ACT or Diffusion Policy on datasets of the lake, with checkpoints LeRobot loads.
    ///
    /// Batches come from the loader in this process, or from a running `lake serve`
    /// (--server, --local). Needs a build with the `torch` feature (libtorch).
    Train(Box<cli::train::TrainArgs>),
    /// Show what this machine's GPU side has (CUDA driver and devices, NVRTC, NCCL, NVDEC) and
    /// check lake's colour kernel on a device against its CPU twin.
    ///
    /// Exits 0 when the device's frames equal the CPU's, 1 when there is no usable GPU or they
    /// differ.
    Gpu(cli::gpu::GpuArgs),
}

/// The environment variable a refused value came from, when the flag clap names in `error` was
/// not on the command line but its variable is set (clap's message names only the flag).
fn value_from_environment(error: &clap::Error) -> Option<String> {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    if !matches!(error.kind(), ErrorKind::InvalidValue | ErrorKind::ValueValidation) {
        return None;
    }
    let Some(ContextValue::String(arg)) = error.get(ContextKind::InvalidArg) else { return None };
    let long = arg.split_whitespace().next()?.strip_prefix("--")?;
    let given = std::env::args_os().any(|a| a.to_str().is_some_and(|a| a == format!("--{long}") || a.starts_with(&format!("--{long}="))));
    if given {
        return None;
    }
    // (Commands may name one flag alike with their own variables: `lake sql --memory-mb` and
    // `lake serve --memory-mb`. The one set is the one that gave the value.)
    fn find(command: &clap::Command, long: &str, vars: &mut Vec<String>) {
        vars.extend(command.get_arguments().filter(|a| a.get_long() == Some(long)).filter_map(|a| a.get_env()?.to_str().map(String::from)));
        for sub in command.get_subcommands() {
            find(sub, long, vars);
        }
    }
    let mut vars = Vec::new();
    find(&<Cli as clap::CommandFactory>::command(), long, &mut vars);
    vars.into_iter().find(|var| std::env::var_os(var).is_some())
}

/// Exit status: 0 success, 1 the dataset was refused (data problems), 2 usage or fatal
/// errors, 130 cancelled with Ctrl-C, 143 stopped with SIGTERM.
fn main() -> ExitCode {
    // Before any signal handler is installed, which would hide an inherited SIG_IGN.
    interrupt_ignored();
    // An empty variable of a flag (a template's blank) counts as unset, as clap would otherwise
    // parse "" as the flag's value.
    // (Only the variables flags read: an empty LAKE_HISTORY still means no history file.)
    let flag_variable = |n: &str| n.starts_with("LAKE_SERVE_") || matches!(n, "LAKE_ROOT" | "LAKE_TOKENS" | "LAKE_TOKEN_FILE");
    for (name, value) in std::env::vars_os() {
        if value.is_empty() && name.to_str().is_some_and(flag_variable) {
            // SAFETY: the process is single-threaded here: nothing else reads the environment.
            unsafe { std::env::remove_var(&name) };
        }
    }
    let mut cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            match value_from_environment(&e) {
                Some(var) => {
                    let text = e.render().to_string();
                    let (message, rest) = text.split_once("\n\n").unwrap_or((&text, ""));
                    errln!(
                        "{message}\n  (the value came from the environment variable {var}; a flag would override it)\n\n{}",
                        rest.trim_end()
                    );
                }
                None => drop(e.print()),
            }
            return ExitCode::from(if e.use_stderr() { 2 } else { 0 });
        }
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("LAKE_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,lance=error,lake::access=info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    // An empty `LAKE_ROOT` (or `--lake ""`) is the default root, not a root named "".
    if cli.lake.trim().is_empty() {
        cli.lake = "./lake".into();
    }
    if let Some(dir) = &cli.object_cache {
        if !(cli.object_cache_gb.is_finite() && cli.object_cache_gb > 0.0) {
            errln!("error: --object-cache-gb must be a positive number of GB, not {}", cli.object_cache_gb);
            return ExitCode::from(2);
        }
        let settings = lake_store::object_cache::CacheSettings { dir: dir.clone(), budget: (cli.object_cache_gb * 1e9) as u64 };
        if let Err(e) = lake_store::remote::use_object_cache(settings) {
            errln!("error: --object-cache {}: {e}", dir.display());
            return ExitCode::from(2);
        }
    }
    if cli.io == "uring"
        && let Err(why) = lake_store::local_io::use_uring()
    {
        errln!("warning: --io uring: {why}");
    }
    // Commands that plan SQL do it on threads whose stacks hold a query at the nesting limit
    // (see `lake_query::sql::limits`); `serve` gives its queries threads of their own.
    let sql_stack = matches!(cli.command, Command::Sql(_) | Command::View(_) | Command::Stats(_) | Command::Export(_));
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if sql_stack {
        builder.thread_stack_size(lake_query::sql::limits::STACK_BYTES);
    }
    // A query's panics inside the engine are its error (exit 2, the engine's words): the log
    // says where in one line, as the server's does, not with a backtrace.
    let sql = matches!(cli.command, Command::Sql(_));
    if sql {
        builder.on_thread_start(lake_store::log_panics_on_this_thread);
    }
    let runtime = match builder.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            errln!("error: cannot start the runtime: {e}");
            return ExitCode::from(2);
        }
    };
    // `ingest`, `cache` and `serve` stop cleanly on their own, and the SQL shell keeps the
    // default actions; any other command is dropped where it is, which removes what it was
    // writing (an output file not yet in place).
    let own_stop = match &cli.command {
        Command::Ingest(_) | Command::Cache(_) | Command::Serve(_) => true,
        Command::Sql(args) => args.is_shell(),
        _ => false,
    };
    let root = cli.lake.clone();
    let run = || {
        if sql {
            lake_store::log_panics_on_this_thread();
        }
        runtime.block_on(async {
            let command = async {
                let result = match cli.command {
                    Command::Ingest(args) => cli::ingest::ingest(&cli.lake, args).await,
                    Command::Ls(args) => cli::ls::ls(&cli.lake, args).await,
                    Command::Rm(args) => cli::rm::rm(&cli.lake, args).await,
                    Command::Inspect(args) => cli::inspect::inspect(&cli.lake, args).await,
                    Command::Verify(args) => cli::verify::verify(&cli.lake, args).await,
                    Command::Sample(args) => cli::sample::sample(&cli.lake, args).await,
                    Command::Bench(args) => cli::bench::bench(&cli.lake, args).await,
                    Command::Cache(args) => cli::cache::cache(&cli.lake, args).await,
                    Command::Sql(args) => cli::sql::sql(&cli.lake, args).await,
                    Command::View(command) => cli::view::view(&cli.lake, command).await,
                    Command::Stats(args) => cli::stats::stats(&cli.lake, args).await,
                    Command::Export(args) => cli::export::export(&cli.lake, args).await,
                    Command::Serve(args) => cli::serve::serve(&cli.lake, args).await,
                    Command::Train(args) => cli::train::train(&cli.lake, *args).await,
                    Command::Gpu(args) => cli::gpu::gpu(&cli.lake, args).await,
                };
                match result {
                    Err(e) => Err(explain::explained(&root, e).await),
                    ok => ok,
                }
            };
            if own_stop {
                return command.await;
            }
            // Writes in progress stop too (see `output::STOP`).
            tokio::spawn(async {
                let code = stop_requested().await;
                output::STOP.store(code, std::sync::atomic::Ordering::Relaxed);
            });
            tokio::select! {
                result = command => result,
                code = stop_requested() => {
                    errln!("cancelled");
                    Ok(ExitCode::from(code))
                }
            }
        })
    };
    let result = if sql_stack {
        std::thread::scope(|scope| {
            let thread = std::thread::Builder::new()
                .name("lake-main".into())
                .stack_size(lake_query::sql::limits::STACK_BYTES)
                .spawn_scoped(scope, run);
            match thread {
                Ok(thread) => thread.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
                Err(e) => Err(anyhow::anyhow!("cannot start the command's thread: {e}")),
            }
        })
    } else {
        run()
    };
    // Blocking work a command left behind (a server's streams cut at shutdown) is not waited
    // for.
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    // Unpublished tables of work dropped on the way (a cancelled `lake cache`) go for good.
    lake_store::remove_abandoned();
    match result {
        Ok(code) => code,
        // Stopped in the middle of a write: the file is removed, and the status says why.
        Err(_) if output::STOP.load(std::sync::atomic::Ordering::Relaxed) != 0 => {
            errln!("cancelled");
            ExitCode::from(output::STOP.load(std::sync::atomic::Ordering::Relaxed))
        }
        Err(e) => {
            // A reader that stopped early (`lake ls | head -1`) is not an error of lake's.
            if reader_gone(&e) {
                return ExitCode::SUCCESS;
            }
            // The chain of causes, each once: some errors' messages already hold their cause.
            let mut message = String::new();
            // (Without the Rust source locations some libraries append to their messages.)
            for cause in e.chain().map(|c| lake_store::without_source_locations(&c.to_string())) {
                if !message.contains(&cause) {
                    message += &if message.is_empty() { cause } else { format!(": {cause}") };
                }
            }
            errln!("error: {message}");
            ExitCode::from(2)
        }
    }
}
