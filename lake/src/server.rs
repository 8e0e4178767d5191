//! `lake serve`: Arrow Flight and HTTP from one process over one lake.

use std::{net::SocketAddr, process::ExitCode};

use anyhow::Context;
use lake::serve::{ServeOptions, Service, do_get, flight::LakeFlight, http};
use lake_store::Lake;

/// Arguments of `lake serve`.
#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// Arrow Flight address (port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:50051")]
    flight: SocketAddr,
    /// HTTP address (port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:8080")]
    http: SocketAddr,
    /// File with one accepted bearer token per line; every endpoint but /healthz then needs one.
    #[arg(long)]
    token_file: Option<std::path::PathBuf>,
    /// Accepted bearer tokens, comma-separated (alternative to --token-file).
    #[arg(long, env = "LAKE_TOKENS", hide_env_values = true)]
    tokens: Option<String>,
    /// Decode threads [default: number of cores].
    #[arg(long)]
    threads: Option<usize>,
    /// Decoded-frame cache budget in MiB, shared by every stream.
    #[arg(long, default_value_t = 512)]
    cache_mb: u64,
    /// MiB of batches each stream prepares ahead of its client (at least one batch; a batch
    /// counts twice, for its encoded copy).
    #[arg(long, default_value_t = 128)]
    prefetch_mb: u64,
    /// MiB all streams may hold together: each open stream's send buffer (one encoded batch)
    /// and the batches being made, ready or being sent (two encoded sizes each). Streams wait
    /// for room for their next batch; a stream that cannot get its send buffer is refused
    /// (RESOURCE_EXHAUSTED / 503). The server's memory is about this plus the cache plus the
    /// open datasets.
    #[arg(long, default_value_t = 4096)]
    memory_mb: u64,
}

/// How long freed pages stay with the process while serving, in ms (ingest's 10 s would keep
/// hundreds of MB of freed batch buffers: the server frees batches at hundreds of MB/s).
const SERVE_PAGE_DECAY_MS: isize = 1000;

/// Sets jemalloc's dirty-page decay of every arena (the binary runs on jemalloc; see main.rs).
fn set_page_decay(ms: isize) {
    // New arenas take the default; the one made so far is set directly.
    for name in [c"arenas.dirty_decay_ms", c"arena.0.dirty_decay_ms"] {
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
        if rc != 0 {
            tracing::warn!("jemalloc {name:?} = {ms}: error {rc}");
        }
    }
}

/// The Flight service, with `DoGet` answered by lake's own route (batches leave without being
/// copied; see [`lake::serve::do_get`]).
fn flight_routes(flight: LakeFlight) -> tonic::service::Routes {
    let generated = arrow_flight::flight_service_server::FlightServiceServer::new(flight.clone());
    let router = tonic::service::Routes::new(generated)
        .into_axum_router()
        .route(do_get::DO_GET_PATH, axum::routing::post(move |request| do_get::do_get(flight.clone(), request)));
    tonic::service::Routes::from(router)
}

/// `lake serve`.
pub async fn serve(root: &str, args: ServeArgs) -> anyhow::Result<ExitCode> {
    set_page_decay(SERVE_PAGE_DECAY_MS);
    let lake = Lake::open(root)?;
    let mut tokens: Vec<String> =
        args.tokens.iter().flat_map(|t| t.split(',')).map(str::trim).filter(|t| !t.is_empty()).map(String::from).collect();
    if let Some(file) = &args.token_file {
        let text = std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
        tokens.extend(text.lines().map(str::trim).filter(|t| !t.is_empty() && !t.starts_with('#')).map(String::from));
    }
    for addr in [args.flight, args.http] {
        if tokens.is_empty() && !addr.ip().is_loopback() {
            eprintln!("warning: serving on {addr} without tokens: anyone who can reach it can read the lake (use --token-file)");
        }
    }
    let options = ServeOptions {
        loader: lake_loader::LoaderOptions { threads: args.threads.unwrap_or(0), cache_bytes: args.cache_mb << 20, frame_table: true },
        prefetch_bytes: args.prefetch_mb << 20,
        memory_bytes: args.memory_mb << 20,
        tokens,
        ..Default::default()
    };
    let service = Service::new(lake, options)?;
    let flight_listener = tokio::net::TcpListener::bind(args.flight).await.with_context(|| format!("binding {}", args.flight))?;
    let http_listener = tokio::net::TcpListener::bind(args.http).await.with_context(|| format!("binding {}", args.http))?;
    let (flight_addr, http_addr) = (flight_listener.local_addr()?, http_listener.local_addr()?);
    println!("lake serving {root}: flight grpc://{flight_addr} http://{http_addr}");
    use std::io::Write;
    std::io::stdout().flush()?;

    let shutdown = async {
        let _ = tokio::signal::ctrl_c().await;
        eprintln!("shutting down: finishing the batches in flight");
    };
    let (stop_tx, _) = tokio::sync::broadcast::channel::<()>(1);
    let mut flight_stop = stop_tx.subscribe();
    let mut http_stop = stop_tx.subscribe();
    let flight = tonic::transport::Server::builder()
        .tcp_nodelay(true)
        .initial_stream_window_size(32 << 20)
        .initial_connection_window_size(64 << 20)
        .max_frame_size((1 << 24) - 1)
        .add_routes(flight_routes(LakeFlight::new(service.clone())))
        .serve_with_incoming_shutdown(tonic::transport::server::TcpIncoming::from(flight_listener), async move {
            let _ = flight_stop.recv().await;
        });
    let http = axum::serve(http_listener, http::router(service.clone())).with_graceful_shutdown(async move {
        let _ = http_stop.recv().await;
    });
    let flight = tokio::spawn(flight);
    let http = tokio::spawn(async move { http.await });
    shutdown.await;
    service.shut_down();
    let _ = stop_tx.send(());
    flight.await?.context("the Flight server failed")?;
    http.await?.context("the HTTP server failed")?;
    Ok(ExitCode::SUCCESS)
}
