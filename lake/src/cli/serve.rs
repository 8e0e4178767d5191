//! `lake serve`: Arrow Flight and HTTP from one process over one lake.

use std::{net::SocketAddr, process::ExitCode};

use anyhow::Context;
use lake_serve::{ServeOptions, Service, do_get, flight::LakeFlight, http, linger};
use lake_store::Lake;

/// `HOST:PORT`, the host an IP address or a name (`localhost:8080`: its first address).
fn socket_address(text: &str) -> Result<SocketAddr, String> {
    if let Ok(addr) = text.parse() {
        return Ok(addr);
    }
    if text.rsplit_once(':').is_none_or(|(host, port)| host.is_empty() || port.parse::<u16>().is_err()) {
        return Err(format!("`{text}` is not HOST:PORT (e.g. 127.0.0.1:8080, localhost:8080, [::1]:8080)"));
    }
    match std::net::ToSocketAddrs::to_socket_addrs(text) {
        Ok(mut addrs) => addrs.next().ok_or_else(|| format!("`{text}` resolves to no address")),
        Err(e) => Err(format!("cannot resolve `{text}`: {e}")),
    }
}

/// Arguments of `lake serve`. Each can also come from its `LAKE_*` environment variable (a flag
/// wins over the variable), for servers started by a container or a service manager.
#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// Arrow Flight address, `HOST:PORT` (port 0 picks a free port).
    #[arg(long, env = "LAKE_SERVE_FLIGHT", default_value = "127.0.0.1:50051", value_parser = socket_address)]
    flight: SocketAddr,
    /// HTTP address, `HOST:PORT` (port 0 picks a free port).
    #[arg(long, env = "LAKE_SERVE_HTTP", default_value = "127.0.0.1:8080", value_parser = socket_address)]
    http: SocketAddr,
    /// File with one accepted bearer token per line; every endpoint but /healthz then needs one.
    #[arg(long, env = "LAKE_TOKEN_FILE")]
    token_file: Option<std::path::PathBuf>,
    /// Accepted bearer tokens, comma-separated (accepted beside those of --token-file).
    #[arg(long, env = "LAKE_TOKENS", hide_env_values = true)]
    tokens: Option<String>,
    /// Decode threads, 1 to 256 [default: number of cores].
    #[arg(long, env = "LAKE_SERVE_THREADS", value_parser = crate::args::threads_in_range)]
    threads: Option<usize>,
    /// Decoded-frame cache budget in MiB, shared by every stream.
    #[arg(long, env = "LAKE_SERVE_CACHE_MB", default_value_t = lake_loader::DEFAULT_CACHE_MIB, value_parser = crate::args::mebibytes)]
    cache_mb: u64,
    /// MiB of batches each stream prepares ahead of its client (at least one batch; a batch
    /// counts twice, for its encoded copy).
    #[arg(long, env = "LAKE_SERVE_PREFETCH_MB", default_value_t = 128, value_parser = crate::args::mebibytes)]
    prefetch_mb: u64,
    /// MiB the server's streams and SQL queries may hold together (SQL takes
    /// --sql-memory-mb of it, the streams the rest). Streams count each open stream's send
    /// buffer (one encoded batch)
    /// and the batches being made, ready or being sent (two encoded sizes each); a local
    /// stream's slots of shared memory and its batches (one size each). Streams wait
    /// for room for their next batch; a stream that cannot get its send buffer is refused
    /// (RESOURCE_EXHAUSTED / 503). The server's memory is about this plus the cache plus the
    /// open datasets.
    #[arg(long, env = "LAKE_SERVE_MEMORY_MB", default_value_t = 4096, value_parser = crate::args::mebibytes_at_least_one)]
    memory_mb: u64,
    /// Seconds a SQL query (HTTP or Flight SQL) may run before it is stopped and its answer
    /// ends with an error.
    #[arg(long, env = "LAKE_SERVE_SQL_TIMEOUT", default_value_t = 300, value_parser = crate::args::seconds_at_least_one)]
    sql_timeout: u64,
    /// MiB of --memory-mb that SQL queries (HTTP or Flight SQL) may hold together: sorts, joins
    /// and aggregations spill to temporary files past it, and a query that needs more where it
    /// cannot spill fails as resources exhausted (507 / RESOURCE_EXHAUSTED)
    /// [default: 1024, or a quarter of --memory-mb when that is less than 4096]
    #[arg(long, env = "LAKE_SERVE_SQL_MEMORY_MB", value_parser = crate::args::mebibytes_at_least_one)]
    sql_memory_mb: Option<u64>,
    /// SQL queries (HTTP or Flight SQL) run at once, each on a thread of its own; one more is
    /// refused as busy (503 / RESOURCE_EXHAUSTED) [default: the number of cores].
    #[arg(long, env = "LAKE_SERVE_SQL_CONCURRENCY", value_parser = crate::args::at_least_one)]
    sql_concurrency: Option<u64>,
    /// Draws the streams of one order and global batch (the ranks of a job) plan ahead together,
    /// to keep frames a decode yields for the rank that shows them next, in the frame cache's
    /// room (0: off, at most 131072).
    #[arg(long, env = "LAKE_SERVE_LOOKAHEAD", default_value_t = lake_loader::DEFAULT_HORIZON, value_parser = crate::args::horizon_in_range)]
    lookahead: u64,
    /// Also serve batch streams to trainers on this machine on a Unix socket at PATH, their
    /// batches written once into shared memory instead of through TCP (lake_client's
    /// LocalLoader reads them); tokens apply as on the other endpoints.
    #[arg(long, env = "LAKE_SERVE_LOCAL", value_name = "PATH")]
    local: Option<std::path::PathBuf>,
    /// Seconds a client may take to open its connection (send its first bytes; over HTTP/2,
    /// Flight's protocol, the whole handshake), and an HTTP client then to send a request's
    /// head (the next on a kept-alive connection from the answer before) and as many for its
    /// body; slower connections are cut, slower bodies answered 408.
    #[arg(long, env = "LAKE_SERVE_REQUEST_WAIT", value_name = "SECONDS", default_value_t = 30, value_parser = crate::args::seconds_at_least_one)]
    request_wait: u64,
    /// Seconds a shutdown (Ctrl-C, SIGTERM) waits for open streams to finish the batch they
    /// are sending; streams whose clients stopped reading are cut after that.
    #[arg(long, env = "LAKE_SERVE_SHUTDOWN_WAIT", value_name = "SECONDS", default_value_t = 10, value_parser = crate::args::seconds)]
    shutdown_wait: u64,
    /// Serve the lake read-only: refuse every request that would write to it (making a view
    /// over HTTP, the only one) with 403, whatever the token. For servers that share a lake
    /// they must not change, or whose storage is mounted or credentialed read-only.
    #[arg(long, env = "LAKE_SERVE_READ_ONLY", value_parser = clap::builder::BoolishValueParser::new())]
    read_only: bool,
}

/// Sets jemalloc's dirty-page decay of every arena (the binary runs on jemalloc; see main.rs):
/// `-1` keeps freed pages until [`return_pages`].
#[cfg(feature = "jemalloc")]
fn set_page_decay(ms: isize) {
    let mut narenas: u32 = 0;
    let mut len = std::mem::size_of::<u32>();
    // SAFETY: "arenas.narenas" is an `unsigned` read into `narenas`, whose size is in `len`.
    unsafe { tikv_jemalloc_sys::mallctl(c"arenas.narenas".as_ptr(), (&raw mut narenas).cast(), &raw mut len, std::ptr::null_mut(), 0) };
    // New arenas take the default; those made so far are set one by one (an arena not made yet
    // refuses, and will take the default).
    let names = std::iter::once("arenas.dirty_decay_ms".to_string()).chain((0..narenas).map(|i| format!("arena.{i}.dirty_decay_ms")));
    for (i, name) in names.enumerate() {
        let name = std::ffi::CString::new(name).expect("no NUL in a mallctl name");
        let mut value = ms;
        // SAFETY: each name is a NUL-terminated mallctl name whose value is an `ssize_t`, and
        // `value` outlives the call.
        let rc = unsafe {
            tikv_jemalloc_sys::mallctl(
                name.as_ptr(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                (&raw mut value).cast(),
                std::mem::size_of::<isize>(),
            )
        };
        if rc != 0 && i == 0 {
            tracing::warn!("jemalloc {name:?} = {ms}: error {rc}");
        }
    }
}

/// On the system allocator (built without the `jemalloc` feature) there is nothing to set.
#[cfg(not(feature = "jemalloc"))]
fn set_page_decay(_ms: isize) {}

/// Hands every arena's freed pages back to the system.
#[cfg(feature = "jemalloc")]
fn return_pages() {
    // SAFETY: "arena.<MALLCTL_ARENAS_ALL>.purge" takes no value.
    let rc = unsafe {
        tikv_jemalloc_sys::mallctl(c"arena.4096.purge".as_ptr(), std::ptr::null_mut(), std::ptr::null_mut(), std::ptr::null_mut(), 0)
    };
    if rc != 0 {
        tracing::warn!("jemalloc arena purge: error {rc}");
    }
}

#[cfg(not(feature = "jemalloc"))]
fn return_pages() {}

/// Seconds the number of open streams must stay at or below half its peak before the freed
/// pages are handed back.
const CALM_SECONDS: u32 = 10;

/// While serving, freed pages stay with the process: the server frees and reallocates tens of
/// MB of batch buffers per batch, and handing freed pages back (jemalloc's decay, even at 10 s)
/// made it fault every batch's buffers in again (zeroed by the kernel), a fifth of the
/// machine's CPU at 64 streams. What it keeps is what its streams used at their peak, within
/// the memory budget. Once the open streams have stayed at or below half their peak for
/// [`CALM_SECONDS`] (or all closed), the pages go back.
async fn keep_pages_under_load(service: std::sync::Arc<Service>) {
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
    let (mut peak, mut calm) = (0u64, 0u32);
    loop {
        tick.tick().await;
        // SQL queries count as streams do: the pages a sort or a join freed go back once
        // the queries have ended (jemalloc keeps them otherwise; see `set_page_decay`).
        let open = service.metrics.active_streams.load(std::sync::atomic::Ordering::Relaxed) + service.sql_running() as u64;
        peak = peak.max(open);
        calm = if peak > 0 && open * 2 <= peak { calm + 1 } else { 0 };
        if calm >= CALM_SECONDS {
            return_pages();
            (peak, calm) = (open, 0);
        }
    }
}

/// The Flight service, with `DoGet` answered by lake's own route (batches leave without being
/// copied; see [`lake_serve::do_get`]).
fn flight_routes(flight: LakeFlight) -> tonic::service::Routes {
    let generated = arrow_flight::flight_service_server::FlightServiceServer::new(flight.clone());
    let router = tonic::service::Routes::new(generated)
        .into_axum_router()
        .route(do_get::DO_GET_PATH, axum::routing::post(move |request| do_get::do_get(flight.clone(), request)));
    tonic::service::Routes::from(router)
}

/// `lake serve`.
pub async fn serve(root: &str, args: ServeArgs) -> anyhow::Result<ExitCode> {
    set_page_decay(-1);
    let lake = Lake::open(root)?;
    let mut tokens: Vec<String> =
        args.tokens.iter().flat_map(|t| t.split(',')).map(str::trim).filter(|t| !t.is_empty()).map(String::from).collect();
    if let Some(file) = &args.token_file {
        let text = std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
        tokens.extend(text.lines().map(str::trim).filter(|t| !t.is_empty() && !t.starts_with('#')).map(String::from));
    }
    // A bearer token is one word: a space inside (an inline comment, say) would make a token
    // no client sends.
    if let Some(bad) = tokens.iter().position(|t| t.chars().any(char::is_whitespace)) {
        anyhow::bail!(
            "token {} of --token-file / --tokens / LAKE_TOKENS holds whitespace (a token is one word; comments go on lines of their own, starting with #)",
            bad + 1
        );
    }
    if tokens.is_empty() && (args.token_file.is_some() || args.tokens.is_some()) {
        anyhow::bail!(
            "--token-file / --tokens / LAKE_TOKENS hold no token (blank lines and # comments are skipped); refusing to serve without the authentication asked for"
        );
    }
    let sql_memory_mb = args.sql_memory_mb.unwrap_or((args.memory_mb / 4).clamp(1, 1024));
    if sql_memory_mb >= args.memory_mb {
        anyhow::bail!(
            "--sql-memory-mb ({sql_memory_mb} MiB) must be less than --memory-mb ({} MiB), which holds it and the streams' batches",
            args.memory_mb
        );
    }
    let tokens_empty = tokens.is_empty();
    let options = ServeOptions {
        loader: lake_loader::LoaderOptions { threads: args.threads.unwrap_or(0), cache_bytes: args.cache_mb << 20, frame_table: true },
        prefetch_bytes: args.prefetch_mb << 20,
        memory_bytes: (args.memory_mb - sql_memory_mb) << 20,
        sql_memory_bytes: sql_memory_mb << 20,
        lookahead: args.lookahead,
        sql_timeout: std::time::Duration::from_secs(args.sql_timeout),
        request_wait: std::time::Duration::from_secs(args.request_wait),
        sql_concurrency: args.sql_concurrency.map_or(ServeOptions::default().sql_concurrency, |n| n.min(1024) as usize),
        tokens,
        read_only: args.read_only,
        ..Default::default()
    };
    let service = Service::new(lake, options)?;
    tokio::spawn(keep_pages_under_load(service.clone()));
    let flight_listener = tokio::net::TcpListener::bind(args.flight).await.with_context(|| format!("binding {}", args.flight))?;
    let http_listener = tokio::net::TcpListener::bind(args.http).await.with_context(|| format!("binding {}", args.http))?;
    let local_listener = match &args.local {
        Some(path) => Some(lake_serve::local::bind(path).await.with_context(|| format!("binding {}", path.display()))?),
        None => None,
    };
    let (flight_addr, http_addr) = (flight_listener.local_addr()?, http_listener.local_addr()?);
    for addr in [flight_addr, http_addr] {
        if tokens_empty && !addr.ip().is_loopback() {
            let may = if args.read_only { "read the lake" } else { "read the lake and make views in it" };
            errln!("warning: serving on {addr} without tokens: anyone who can reach it can {may} (use --token-file)");
        }
    }
    let local = args.local.as_ref().map(|p| format!(" local {}", p.display())).unwrap_or_default();
    let read_only = if args.read_only { " (read-only)" } else { "" };
    outln!("lake serving {root}{read_only}: flight grpc://{flight_addr} http://{http_addr}{local}")?;
    use std::io::Write;
    std::io::stdout().flush()?;

    // Ctrl-C, or SIGTERM (what service managers and container runtimes send).
    let shutdown = async move {
        crate::signals::stop_requested().await;
        errln!("shutting down: finishing the batches in flight");
    };
    let (stop_tx, _) = tokio::sync::broadcast::channel::<()>(1);
    let mut flight_stop = stop_tx.subscribe();
    let mut http_stop = stop_tx.subscribe();
    // Connections close without losing what was sent last (see `linger`).
    let closes = linger::Closes::default();
    // A client has the request wait to open its connection.
    let request_wait = std::time::Duration::from_secs(args.request_wait);
    let flight_listener = linger::Listener::new(flight_listener, closes.clone(), request_wait);
    let http_listener = linger::Listener::new(http_listener, closes.clone(), request_wait);
    let flight = tonic::transport::Server::builder()
        .initial_stream_window_size(32 << 20)
        .initial_connection_window_size(64 << 20)
        .max_frame_size((1 << 24) - 1)
        .http2_keepalive_interval(Some(lake_serve::PING_EVERY))
        .http2_keepalive_timeout(Some(lake_serve::PING_ANSWER_WAIT))
        .add_routes(flight_routes(LakeFlight::new(service.clone())))
        .serve_with_incoming_shutdown(flight_listener.incoming(), async move {
            let _ = flight_stop.recv().await;
        });
    let http = http::serve(http_listener, http::router(service.clone()), request_wait, async move {
        let _ = http_stop.recv().await;
    });
    let flight = tokio::spawn(flight);
    let http = tokio::spawn(http);
    let local = local_listener.map(|listener| {
        let mut local_stop = stop_tx.subscribe();
        tokio::spawn(lake_serve::local::serve(service.clone(), listener, async move {
            let _ = local_stop.recv().await;
        }))
    });
    shutdown.await;
    service.shut_down();
    let _ = stop_tx.send(());
    // Streams end after the batch they are sending; a client that stopped reading never takes
    // it, so the drain is bounded and what is left open then is cut; a second Ctrl-C or
    // SIGTERM cuts it at once.
    let wait = std::time::Duration::from_secs(args.shutdown_wait);
    let drain = tokio::time::timeout(wait, async {
        flight.await?.context("the Flight server failed")?;
        http.await?;
        if let Some(local) = local {
            local.await?;
        }
        closes.finished().await;
        anyhow::Ok(())
    });
    // (A signal within a second of the first is the same stop sent twice: a service manager
    // signals every process of the service, a wrapper script passes its own on.)
    let began = std::time::Instant::now();
    let again = async {
        loop {
            crate::signals::stop_requested().await;
            if began.elapsed() >= std::time::Duration::from_secs(1) {
                break;
            }
        }
    };
    let drained = tokio::select! {
        drained = drain => drained.map_err(|_| format!("{wait:?} after the shutdown began")),
        () = again => Err("when stopped again".to_string()),
    };
    if let Some(path) = &args.local {
        let _ = std::fs::remove_file(path);
    }
    match drained {
        Ok(done) => done.map(|()| ExitCode::SUCCESS),
        Err(when) => {
            // SQL queries count as streams do: the pages a sort or a join freed go back once
            // the queries have ended (jemalloc keeps them otherwise; see `set_page_decay`).
            let open = service.metrics.active_streams.load(std::sync::atomic::Ordering::Relaxed) + service.sql_running() as u64;
            let (count, what, why) = if open > 0 {
                (open, "stream", "clients not taking their batches")
            } else {
                (closes.open() as u64, "connection", "requests unfinished, or clients not taking the last bytes")
            };
            let (s, them) = if count == 1 { ("", "it") } else { ("s", "them") };
            if count == 0 {
                errln!("shutting down: stopped {when}; closing what is left");
            } else {
                errln!("shutting down: {count} {what}{s} still open {when} ({why}); closing {them}");
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}
