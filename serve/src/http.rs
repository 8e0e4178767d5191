//! The HTTP service (axum): datasets, sampling as an Arrow IPC stream, SQL, health, metrics and
//! the OpenAPI document.

use std::sync::Arc;

use arrow::{array::RecordBatch, datatypes::SchemaRef, ipc::writer::StreamWriter};
use axum::{
    Json, Router,
    body::{Body, Bytes},
    extract::{Path, Query, Request, State, rejection::QueryRejection},
    http::{HeaderMap, StatusCode, header},
    middleware::{self, Next},
    response::{IntoResponse, Response},
    routing::{get, post},
};
use futures::{Stream, StreamExt};
use http_body::Frame;
use lake_client::local::wire;
use lake_loader::SampleBatch;
use serde_json::{Value, json};

use super::{Refusal, Service, browse, refusal};
use lake_query::sql::flat_for_csv;

use crate::Error;

/// Serves `router` on `listener`'s connections (HTTP/1.1, and HTTP/2 without TLS) until `stop`
/// completes, then ends each connection after the request it is answering and returns once
/// all are closed (the caller bounds the wait).
///
/// An HTTP/1 client has `head_wait` to send a request's head (its line and headers), the
/// first one from its first byte (the listener times what comes before), later ones from the
/// end of the answer before (so an idle kept-alive connection is closed after it, as HTTP
/// servers do); a slower one is cut, so that connections that never finish a request do not
/// pile up. HTTP/2 clients are pinged as Flight's are.
///
/// A client that closes its sending side is taken to have gone (as nginx takes it), so that
/// the work for a client that gave up stops; a client that half-closes after its request
/// (`nc -N`) gets an answer cut short.
pub async fn serve(
    mut listener: super::linger::Listener,
    router: Router,
    head_wait: std::time::Duration,
    stop: impl std::future::Future<Output = ()>,
) {
    use hyper_util::{
        rt::{TokioExecutor, TokioIo, TokioTimer},
        server::conn::auto::Builder,
        service::TowerToHyperService,
    };
    let mut builder = Builder::new(TokioExecutor::new());
    builder.http1().timer(TokioTimer::new()).header_read_timeout(head_wait);
    builder.http2().timer(TokioTimer::new()).keep_alive_interval(super::PING_EVERY).keep_alive_timeout(super::PING_ANSWER_WAIT);
    let builder = Arc::new(builder);
    let (stopping, _) = tokio::sync::watch::channel(false);
    let mut open = tokio::task::JoinSet::new();
    let mut stop = std::pin::pin!(stop);
    loop {
        tokio::select! {
            (io, addr) = axum::serve::Listener::accept(&mut listener) => {
                let service = TowerToHyperService::new(router.clone());
                let (builder, mut stopping) = (builder.clone(), stopping.subscribe());
                open.spawn(async move {
                    // (Until hyper knows the protocol, the listener times the client.)
                    let mut connection = std::pin::pin!(builder.serve_connection_with_upgrades(TokioIo::new(io), service));
                    let mut ending = false;
                    loop {
                        tokio::select! {
                            done = connection.as_mut() => {
                                if let Err(e) = done {
                                    tracing::debug!("HTTP connection from {addr}: {e}");
                                }
                                break;
                            }
                            _ = stopping.wait_for(|s| *s), if !ending => {
                                ending = true;
                                connection.as_mut().graceful_shutdown();
                            }
                        }
                    }
                });
            }
            Some(_) = open.join_next(), if !open.is_empty() => {}
            () = &mut stop => break,
        }
    }
    drop(listener);
    stopping.send_replace(true);
    while open.join_next().await.is_some() {}
}

/// The media type of Arrow IPC streams.
pub const ARROW_STREAM: &str = "application/vnd.apache.arrow.stream";

/// The HTTP routes over `service`.
pub fn router(service: Arc<Service>) -> Router {
    let api = Router::new()
        .route("/metrics", get(metrics))
        .route("/v1/server", get(server))
        .route("/v1/datasets", get(datasets))
        .route("/v1/datasets/{name}", get(dataset))
        .route("/v1/datasets/{name}/episodes", get(episodes))
        .route("/v1/datasets/{name}/episodes/{episode}", get(episode))
        .route("/v1/datasets/{name}/findings", get(findings))
        .route("/v1/datasets/{name}/frame", get(frame))
        .route("/v1/datasets/{name}/frames", get(frames))
        .route("/v1/views", post(create_view))
        .route("/v1/sample", post(sample))
        .route("/v1/facts", post(facts))
        .route("/v1/sql", post(sql))
        .layer(axum::extract::DefaultBodyLimit::max(super::MAX_REQUEST_BYTES))
        .layer(middleware::from_fn_with_state(service.clone(), body_in_time))
        .layer(middleware::from_fn_with_state(service.clone(), refuse_oversized))
        .route("/v1/openapi.json", get(openapi))
        .route_layer(middleware::from_fn_with_state(service.clone(), auth));
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/", get(super::assets::index))
        .route("/app/{file}", get(super::assets::app_file))
        .merge(api)
        .fallback(|State(service): State<Arc<Service>>| async move {
            service.metrics.not_found.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Refused(StatusCode::NOT_FOUND, "no such endpoint (see /v1/openapi.json)".into())
        })
        .layer(middleware::from_fn_with_state(service.clone(), method_not_allowed_json))
        .with_state(service)
}

/// The request's body, read whole within the server's request wait (after the checks of its
/// head): a client that stalls while sending it gets a 408, instead of holding a handler and
/// its connection for as long as it likes.
async fn body_in_time(State(service): State<Arc<Service>>, request: Request, next: Next) -> Response {
    let wait = service.options.request_wait;
    let (parts, body) = request.into_parts();
    match tokio::time::timeout(wait, axum::body::to_bytes(body, super::MAX_REQUEST_BYTES)).await {
        Ok(Ok(bytes)) => next.run(Request::from_parts(parts, Body::from(bytes))).await,
        Ok(Err(e)) => {
            service.count_bad();
            let too_large = std::error::Error::source(&e).is_some_and(|s| s.is::<http_body_util::LengthLimitError>());
            if too_large {
                Refused(StatusCode::PAYLOAD_TOO_LARGE, "the request body is over the 2 MiB limit".into()).into_response()
            } else {
                Refused(StatusCode::BAD_REQUEST, format!("the request body could not be read: {e}")).into_response()
            }
        }
        Err(_) => {
            service.count_bad();
            Refused(StatusCode::REQUEST_TIMEOUT, format!("the request body did not arrive within {} s", wait.as_secs())).into_response()
        }
    }
}

/// A 413 for a request whose declared `Content-Length` is over the limit, at once: before its
/// body is read (and before `100 Continue` invites a client that asked to send it).
async fn refuse_oversized(State(service): State<Arc<Service>>, request: Request, next: Next) -> Response {
    let declared = request.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.trim().parse::<u64>().ok());
    if declared.is_some_and(|n| n > super::MAX_REQUEST_BYTES as u64) {
        service.count_bad();
        return Refused(StatusCode::PAYLOAD_TOO_LARGE, "the request body is over the 2 MiB limit".into()).into_response();
    }
    next.run(request).await
}

/// A 405 with a JSON body like every other error (its `Allow` header kept), counted as a bad
/// request.
async fn method_not_allowed_json(State(service): State<Arc<Service>>, request: Request, next: Next) -> Response {
    let (method, path) = (request.method().clone(), request.uri().path().to_string());
    let response = next.run(request).await;
    if response.status() != StatusCode::METHOD_NOT_ALLOWED {
        return response;
    }
    service.count_bad();
    let mut json = Refused(StatusCode::METHOD_NOT_ALLOWED, format!("{path} does not take {method} (see /v1/openapi.json)")).into_response();
    if let Some(value) = response.headers().get(header::ALLOW) {
        json.headers_mut().insert(header::ALLOW, value.clone());
    }
    json
}

/// A refused request: status and a JSON body `{"error": message}`, with `position` (`line`,
/// `column`) where the message gives one (`Line: L, Column: C`, as SQL errors do).
struct Refused(StatusCode, String);

/// The position a message gives as `Line: L, Column: C` (the last one).
fn position(message: &str) -> Option<Value> {
    let (_, rest) = message.rsplit_once("Line: ")?;
    let (line, rest) = rest.split_once(", Column: ")?;
    let column: String = rest.chars().take_while(char::is_ascii_digit).collect();
    Some(json!({"line": line.parse::<u64>().ok()?, "column": column.parse::<u64>().ok()?}))
}

impl IntoResponse for Refused {
    fn into_response(self) -> Response {
        let mut body = json!({"error": self.1});
        if let Some(position) = position(&self.1) {
            body["position"] = position;
        }
        let mut response = (self.0, Json(body)).into_response();
        let extra = match self.0 {
            StatusCode::UNAUTHORIZED => Some((header::WWW_AUTHENTICATE, "Bearer")),
            StatusCode::SERVICE_UNAVAILABLE => Some((header::RETRY_AFTER, "1")),
            _ => None,
        };
        if let Some((name, value)) = extra {
            response.headers_mut().insert(name, header::HeaderValue::from_static(value));
        }
        response
    }
}

impl From<Error> for Refused {
    fn from(e: Error) -> Self {
        let (kind, message) = refusal(&e);
        Self(status_of(kind), message)
    }
}

/// The HTTP status of a refusal of `kind`.
fn status_of(kind: Refusal) -> StatusCode {
    match kind {
        Refusal::BadRequest => StatusCode::BAD_REQUEST,
        Refusal::NotFound => StatusCode::NOT_FOUND,
        Refusal::Busy | Refusal::Unavailable | Refusal::StoreUnavailable => StatusCode::SERVICE_UNAVAILABLE,
        Refusal::TooLarge => StatusCode::INSUFFICIENT_STORAGE,
        Refusal::Internal | Refusal::Frame => StatusCode::INTERNAL_SERVER_ERROR,
        Refusal::ReadOnly => StatusCode::FORBIDDEN,
    }
}

async fn auth(State(service): State<Arc<Service>>, request: Request, next: Next) -> Response {
    let token = super::bearer_token(request.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()));
    if service.authorized(token) {
        next.run(request).await
    } else {
        Refused(StatusCode::UNAUTHORIZED, "a valid bearer token is required".into()).into_response()
    }
}

async fn metrics(State(service): State<Arc<Service>>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], service.prometheus().await)
}

/// What this server is and allows, for clients that adapt to it (the web app offers no view
/// saving on a read-only server).
async fn server(State(service): State<Arc<Service>>) -> Json<Value> {
    Json(json!({"version": env!("CARGO_PKG_VERSION"), "read_only": service.writable().is_err()}))
}

async fn datasets(State(service): State<Arc<Service>>) -> Result<Json<Value>, Refused> {
    let lake = service.lake();
    answer(&service, async {
        let (records, unreadable) = lake.datasets_listed().await?;
        let (views, unreadable_views) = lake.views_listed().await?;
        let removed = lake_loader::views::removals_of_all(lake, &views).await;
        let views: Vec<Value> = views.iter().zip(removed).map(|(v, removed)| view_json(v, removed)).collect();
        // Records damaged outside lake: named, so that a client sees why a dataset is missing.
        let unreadable: Vec<Value> = unreadable
            .iter()
            .map(|u| json!({"kind": "dataset", "name": u.name, "version": u.version}))
            .chain(unreadable_views.iter().map(|u| json!({"kind": "view", "name": u.name, "version": u.version})))
            .collect();
        let summaries = futures::future::join_all(records.iter().map(|r| browse::dataset_summary(lake, r))).await;
        let list = summaries.into_iter().collect::<crate::Result<Vec<Value>>>()?;
        Ok(json!({ "datasets": list, "views": views, "unreadable": unreadable }))
    })
    .await
}

/// A view as the API shows it: what a request naming it samples (each dataset version `lake rm`
/// removed with the removal as `removed`: a request for the view is refused).
fn view_json(v: &lake_schemas::ViewRecord, removed: Vec<Option<lake_store::Removal>>) -> Value {
    let selects: Vec<Value> = v
        .datasets
        .iter()
        .zip(removed)
        .map(|(d, removed)| {
            let mut entry = json!({"dataset": format!("{}@{}", d.name, d.version), "weight": d.weight, "episodes": d.episodes});
            if let Some(removed) = removed {
                entry["removed"] = json!(removed);
            }
            entry
        })
        .collect();
    json!({"name": v.name, "version": v.version, "kind": "view", "sql": v.sql, "created_at": v.created_at,
           "episodes": v.episode_count(), "selects": selects})
}

async fn dataset(
    State(service): State<Arc<Service>>,
    name: Result<Path<String>, axum::extract::rejection::PathRejection>,
    query: Result<Query<DatasetQuery>, QueryRejection>,
) -> Result<Json<Value>, Refused> {
    let Path(name) = name.map_err(|e| path_refused(&service, &e))?;
    let Query(query) = query.map_err(|e| query_refused(&service, &e))?;
    answer(&service, describe_dataset(&service, &name, query.episodes.unwrap_or(true))).await
}

/// What `GET /v1/datasets/{name}` takes: whether to list every episode (a page of them is
/// `/v1/datasets/{name}/episodes`).
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct DatasetQuery {
    episodes: Option<bool>,
}

/// A 400 for a path whose parts cannot be read.
fn path_refused(service: &Service, e: &axum::extract::rejection::PathRejection) -> Refused {
    service.count_bad();
    Refused(e.status(), format!("the path cannot be read: {}", e.body_text()))
}

/// A 400 for a query string that cannot be read.
fn query_refused(service: &Service, e: &QueryRejection) -> Refused {
    service.count_bad();
    Refused(e.status(), format!("the query string cannot be read: {}", e.body_text()))
}

/// The JSON `made` answers, or its error explained (a dataset `lake rm` removed) and counted.
async fn answer(service: &Service, made: impl std::future::Future<Output = crate::Result<Value>>) -> Result<Json<Value>, Refused> {
    let made = match made.await {
        Err(e) => Err(service.explained(e).await),
        ok => ok,
    };
    Ok(made.map(Json).inspect_err(|e| service.count_refusal(e))?)
}

/// `GET /v1/datasets/{name}/episodes`: a page of a dataset's episodes.
async fn episodes(
    State(service): State<Arc<Service>>,
    name: Result<Path<String>, axum::extract::rejection::PathRejection>,
    query: Result<Query<browse::EpisodeQuery>, QueryRejection>,
) -> Result<Json<Value>, Refused> {
    let Path(name) = name.map_err(|e| path_refused(&service, &e))?;
    let Query(query) = query.map_err(|e| query_refused(&service, &e))?;
    let lake = service.lake();
    answer(&service, async { browse::episodes_page(lake, &browse::dataset_record(lake, &name).await?, &query).await }).await
}

/// `GET /v1/datasets/{name}/findings`: what ingest found in a dataset.
async fn findings(
    State(service): State<Arc<Service>>,
    name: Result<Path<String>, axum::extract::rejection::PathRejection>,
) -> Result<Json<Value>, Refused> {
    let Path(name) = name.map_err(|e| path_refused(&service, &e))?;
    let lake = service.lake();
    answer(&service, async { browse::findings(lake, &browse::dataset_record(lake, &name).await?).await }).await
}

/// `GET /v1/datasets/{name}/episodes/{episode}`: one episode's steps as columns.
async fn episode(
    State(service): State<Arc<Service>>,
    path: Result<Path<(String, i64)>, axum::extract::rejection::PathRejection>,
) -> Result<Json<Value>, Refused> {
    let Path((name, episode)) = path.map_err(|e| path_refused(&service, &e))?;
    answer(&service, browse::episode(&service, &name, episode)).await
}

/// What `GET /v1/datasets/{name}/frame` and `…/frames` take.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct FrameQuery {
    /// The camera's key.
    camera: String,
    /// LeRobot's `index` of the (first) step.
    index: i64,
    /// Frames from that step on (`frames` only; `frame` is one).
    count: Option<u64>,
}

/// `GET /v1/datasets/{name}/frame?camera=KEY&index=I`: one camera's frame at a step, as PNG,
/// with the step's episode and frame index in `Lake-Episode-Index` and `Lake-Frame-Index`.
async fn frame(
    State(service): State<Arc<Service>>,
    name: Result<Path<String>, axum::extract::rejection::PathRejection>,
    query: Result<Query<FrameQuery>, QueryRejection>,
) -> Result<Response, Refused> {
    strip(service, name, query, false).await
}

/// `GET /v1/datasets/{name}/frames?camera=KEY&index=I&count=N`: one camera's frames at a step
/// and the steps after it in its episode, as PNG files one after another, with their sizes in
/// `Lake-Frame-Bytes` (comma-separated), the first step's episode and frame index in
/// `Lake-Episode-Index` and `Lake-Frame-Index`, and the frames in `Lake-Frame-Count` (`N`, or
/// fewer where the episode ends or past [`browse::MAX_FRAMES_BYTES`] of RGB).
async fn frames(
    State(service): State<Arc<Service>>,
    name: Result<Path<String>, axum::extract::rejection::PathRejection>,
    query: Result<Query<FrameQuery>, QueryRejection>,
) -> Result<Response, Refused> {
    strip(service, name, query, true).await
}

async fn strip(
    service: Arc<Service>,
    name: Result<Path<String>, axum::extract::rejection::PathRejection>,
    query: Result<Query<FrameQuery>, QueryRejection>,
    counted: bool,
) -> Result<Response, Refused> {
    let Path(name) = name.map_err(|e| path_refused(&service, &e))?;
    let Query(query) = query.map_err(|e| query_refused(&service, &e))?;
    let count = match (counted, query.count) {
        (true, Some(count)) => Ok(count),
        (true, None) => Err(Error::Invalid(format!("`count` is missing: how many frames, 1 to {}", browse::MAX_FRAMES))),
        (false, None) => Ok(1),
        (false, Some(_)) => Err(Error::Invalid("`frame` is one frame: ask `frames` for `count` of them".into())),
    };
    let made = match async { browse::frames(&service, &name, &query.camera, query.index, count?).await }.await {
        Err(e) => Err(service.explained(e).await),
        ok => ok,
    };
    let frames = made.inspect_err(|e| service.count_refusal(e))?;
    let count = frames.pngs.len();
    let sizes: Vec<String> = frames.pngs.iter().map(|p| p.len().to_string()).collect();
    let (content_type, mut response) = if counted {
        ("application/octet-stream", frames.pngs.concat().into_response())
    } else {
        ("image/png", frames.pngs.into_iter().next().expect("at least one frame").into_response())
    };
    let mut set = |name: header::HeaderName, value: String| {
        response.headers_mut().insert(name, header::HeaderValue::try_from(value).expect("digits, commas and ASCII"));
    };
    set(header::CONTENT_TYPE, content_type.into());
    set(header::CACHE_CONTROL, "private, max-age=3600".into());
    set(header::HeaderName::from_static("lake-episode-index"), frames.episode_index.to_string());
    set(header::HeaderName::from_static("lake-frame-index"), frames.frame_index.to_string());
    if counted {
        set(header::HeaderName::from_static("lake-frame-count"), count.to_string());
        set(header::HeaderName::from_static("lake-frame-bytes"), sizes.join(","));
    }
    Ok(response)
}

/// What `POST /v1/views` takes.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ViewRequest {
    name: String,
    sql: String,
    #[serde(default)]
    replace: bool,
}

/// `POST /v1/views`: names a training set, as `lake view create` does.
async fn create_view(State(service): State<Arc<Service>>, body_bytes: Result<Bytes, axum::extract::rejection::BytesRejection>) -> Response {
    let made = async {
        service.writable()?;
        let body = body(body_bytes).map_err(|r| Error::Invalid(r.1))?;
        let request: ViewRequest = serde_json::from_slice(&body)
            .map_err(|e| Error::Invalid(format!("the body must be {{\"name\", \"sql\", \"replace\"}}: {e}")))?;
        // The view's query runs as `/v1/sql`'s do: in a SQL slot, within the SQL memory and
        // timeout, on a thread whose stack holds a query at the nesting limits; so does the
        // walk over its answer.
        let slot = service.sql_slot()?;
        let session = service.sql_session().await?;
        let rows = service.sql_stream(session.clone(), &request.sql, slot).await?;
        let lake = service.lake().clone();
        let ViewRequest { name, sql, replace } = request;
        let created = lake_query::sql::apart("lake-view", move || async move {
            lake_query::views::create_from(&lake, &session, rows, &name, &sql, replace, &[]).await
        })
        .await
        .map_err(refused_write)?;
        let removed = lake_loader::views::removals(service.lake(), &created.view).await;
        let mut view = view_json(&created.view, removed);
        view["notes"] = json!(created.notes);
        Ok::<_, Error>(view)
    };
    match answer(&service, made).await {
        Ok(view) => (StatusCode::CREATED, view).into_response(),
        Err(refused) => refused.into_response(),
    }
}

/// A write the lake's storage refused, as [`Error::ReadOnly`] (its details, which name the lake's
/// paths, go to the log); other errors as they are.
fn refused_write(e: Error) -> Error {
    match lake_store::write_refusal(&e) {
        Some(why) => {
            tracing::warn!("a view could not be written: {e}");
            Error::ReadOnly(format!(
                "this server may not write to its lake ({why}): make the view with `lake view create` where the lake may be written"
            ))
        }
        None => e,
    }
}

/// A dataset (features, cameras, episodes, stats, counts) or a view, as JSON.
async fn describe_dataset(service: &Service, name: &str, list_episodes: bool) -> crate::Result<Value> {
    let lake = service.lake();
    let (base, version) = match name.rsplit_once('@') {
        Some((base, version)) => (base, Some(version)),
        None => (name, None),
    };
    let is_dataset = lake_store::validate_name(base).is_err() || lake.version_count(base).await.is_ok_and(|n| n > 0);
    if !is_dataset {
        return match lake_loader::views::view(lake, base, version).await? {
            Some(view) => Ok(view_json(&view, lake_loader::views::removals(service.lake(), &view).await)),
            None => Err(lake_loader::views::not_found(lake, name).await?.into()),
        };
    }
    let record = lake.resolve(name).await?;
    let episodes = if list_episodes {
        lake_store::read_columns(lake, &record, lake_schemas::tables::EPISODES, &["episode_index", "length"]).await?
    } else {
        Vec::new()
    };
    let mut list = Vec::new();
    for b in &episodes {
        let (e, l) = (b.column(0), b.column(1));
        let e = arrow::array::AsArray::as_primitive::<arrow::datatypes::Int64Type>(e);
        let l = arrow::array::AsArray::as_primitive::<arrow::datatypes::Int64Type>(l);
        for r in 0..b.num_rows() {
            list.push(json!({"episode_index": e.value(r), "length": l.value(r)}));
        }
    }
    let streams =
        lake_store::read_columns(lake, &record, lake_schemas::tables::STREAMS, &["camera", "kind", "codec", "width", "height", "max_gop"])
            .await?;
    let cameras = cameras_json(browse::batches_json(&streams)?);
    let features = features_json(&record.info, &cameras);
    let stats = lake_stats::stats_json(lake, &record, None).await.ok().map(|s| lake_schemas::pyjson::strict(&s));
    let frame_tables = lake_loader::frame_tables(lake, &record).await;
    let mut described = json!({
        "name": record.name, "version": record.version, "fps": record.fps,
        "features": features, "cameras": cameras, "episodes": list, "stats": stats,
        "counts": record.counts, "source": record.source, "frame_tables": frame_tables,
        "tasks": browse::tasks(lake, &record).await?,
    });
    if !list_episodes {
        described.as_object_mut().expect("an object").remove("episodes");
    }
    Ok(described)
}

/// The source's features, each camera it declares that ingest left out (it had no video,
/// `--drop-missing-cameras`) marked `"ingested": false`: no sample can show it.
fn features_json(info: &Value, cameras: &Value) -> Value {
    let mut features = info.get("features").cloned().unwrap_or(Value::Null);
    let kept = |name: &str| cameras.as_array().into_iter().flatten().any(|c| c.get("camera").and_then(Value::as_str) == Some(name));
    for (name, feature) in features.as_object_mut().into_iter().flatten() {
        let camera = matches!(feature.get("dtype").and_then(Value::as_str), Some("video" | "image"));
        if camera
            && !kept(name)
            && let Some(feature) = feature.as_object_mut()
        {
            feature.insert("ingested".into(), false.into());
        }
    }
    features
}

/// One entry per camera from the `streams` rows (one per camera and file): the first file's
/// codec facts, the longest GOP of any, and how many files the camera has.
fn cameras_json(streams: Value) -> Value {
    let mut cameras: Vec<serde_json::Map<String, Value>> = Vec::new();
    for row in streams.as_array().into_iter().flatten().filter_map(Value::as_object) {
        let max_gop = row.get("max_gop").and_then(Value::as_i64);
        match cameras.iter_mut().find(|c| c.get("camera") == row.get("camera")) {
            Some(camera) => {
                if let Some(gop) = max_gop
                    && camera.get("max_gop").and_then(Value::as_i64).is_none_or(|g| g < gop)
                {
                    camera.insert("max_gop".into(), gop.into());
                }
                let files = camera.get("files").and_then(Value::as_u64).unwrap_or(1) + 1;
                camera.insert("files".into(), files.into());
            }
            None => {
                let mut camera = row.clone();
                camera.insert("files".into(), 1.into());
                cameras.push(camera);
            }
        }
    }
    Value::Array(cameras.into_iter().map(Value::Object).collect())
}

/// How a streamed answer is written: an Arrow IPC stream, a JSON array of row objects, or CSV
/// with a header row.
enum Encoder {
    /// Writes the schema and the end marker; batches are framed here, their buffers shared.
    Arrow(StreamWriter<Vec<u8>>),
    /// Whether a row has been written (the next one follows a comma).
    Json(bool),
    /// The schema, until the header row is written.
    Csv(Option<SchemaRef>),
}

impl Encoder {
    /// The encoder, and the bytes that open its stream.
    fn new(answer: Answer, schema: &SchemaRef) -> crate::Result<(Self, Bytes)> {
        Ok(match answer {
            Answer::Csv => (Self::Csv(Some(schema.clone())), Bytes::new()),
            Answer::Json => (Self::Json(false), Bytes::from_static(b"[")),
            Answer::Arrow => {
                let mut writer =
                    StreamWriter::try_new(Vec::new(), schema).map_err(|e| Error::Internal(format!("writing the answer: {e}")))?;
                let header = Bytes::from(std::mem::take(writer.get_mut()));
                (Self::Arrow(writer), header)
            }
        })
    }

    /// A batch's bytes: for Arrow its encapsulated IPC message, whose body is the batch's own
    /// buffers (a training batch is tens of MB of frames; encoding it into one buffer would copy
    /// them all).
    fn write(&mut self, batch: &SampleBatch) -> Result<Vec<Bytes>, String> {
        if !matches!(self, Self::Arrow(_)) {
            let batch = batch.to_record_batch().map_err(|e| e.to_string())?;
            return self.write_rows(&batch);
        }
        let (header, body, _) = super::do_get::ipc_parts(batch).map_err(|s| s.message().to_string())?;
        Ok(std::iter::once(Bytes::from(wire::message_prefix(&header))).chain(body).collect())
    }

    /// A batch's rows as JSON objects or CSV lines.
    fn write_rows(&mut self, batch: &RecordBatch) -> Result<Vec<Bytes>, String> {
        match self {
            Self::Arrow(_) => self.write(&SampleBatch::from(batch.clone())),
            Self::Json(started) => {
                // One object per line from Arrow's writer (nulls kept), joined into the array.
                let mut lines =
                    arrow::json::WriterBuilder::new().with_explicit_nulls(true).build::<_, arrow::json::writer::LineDelimited>(Vec::new());
                lines.write(batch).map_err(|e| e.to_string())?;
                lines.finish().map_err(|e| e.to_string())?;
                let text = String::from_utf8(lines.into_inner()).map_err(|e| e.to_string())?;
                let rows = text.trim_end_matches('\n');
                if rows.is_empty() {
                    return Ok(Vec::new());
                }
                // Row objects hold no raw newlines (JSON escapes them in strings).
                let mut out = if *started { String::from(",") } else { String::new() };
                out.push_str(&rows.replace('\n', ","));
                *started = true;
                Ok(vec![out.into()])
            }
            Self::Csv(unwritten) => {
                let mut out = Vec::new();
                let flat = flat_for_csv(batch).map_err(|e| e.to_string())?;
                arrow::csv::WriterBuilder::new()
                    .with_header(unwritten.take().is_some())
                    .build(&mut out)
                    .write(&flat)
                    .map_err(|e| e.to_string())?;
                Ok(vec![out.into()])
            }
        }
    }

    fn finish(&mut self) -> Result<Vec<Bytes>, String> {
        match self {
            Self::Arrow(writer) => {
                writer.finish().map_err(|e| e.to_string())?;
                Ok(vec![Bytes::from(std::mem::take(writer.get_mut()))])
            }
            Self::Json(_) => Ok(vec![Bytes::from_static(b"]")]),
            // An empty answer still has its header row.
            Self::Csv(Some(schema)) => {
                let empty = RecordBatch::new_empty(schema.clone());
                self.write_rows(&empty)
            }
            Self::Csv(None) => Ok(Vec::new()),
        }
    }
}

/// Encodes `batches` as `answer` (an Arrow IPC stream, a JSON array or CSV), batch by batch,
/// as they arrive, as a response body.
///
/// An error after the head is sent can no longer be a status. The body then ends before the
/// answer's end (an Arrow stream without its end marker, a JSON array without its `]`). With
/// `trailers` (the client sent `TE: trailers`), it ends with the [`ERROR_TRAILERS`]: the
/// status it would have had and the message, as gRPC sends a stream's status. Without them,
/// the connection is cut before the last chunk, so that no client takes the answer for whole.
fn encoded_body(
    answer: Answer,
    schema: SchemaRef,
    batches: impl Stream<Item = crate::Result<SampleBatch>> + Send + 'static,
    trailers: bool,
) -> crate::Result<Body> {
    type Chunk = Result<Frame<Bytes>, std::io::Error>;
    let (encoder, header) = Encoder::new(answer, &schema)?;
    let state = (Some(encoder), Box::pin(batches));
    let body = futures::stream::unfold(state, move |(encoder, mut batches)| async move {
        let mut encoder = encoder?;
        let (out, encoder) = match batches.next().await {
            Some(Ok(batch)) => (encoder.write(&batch), Some(encoder)),
            Some(Err(e)) => {
                let (kind, message) = refusal(&e);
                let end: Chunk = if trailers {
                    Ok(Frame::trailers(error_trailers(status_of(kind), &message)))
                } else {
                    flush_grace().await;
                    Err(std::io::Error::other(message))
                };
                return Some((vec![end], (None, batches)));
            }
            None => (encoder.finish(), None),
        };
        Some(match out {
            Ok(chunks) => (chunks.into_iter().map(|c| Ok(Frame::data(c))).collect::<Vec<Chunk>>(), (encoder, batches)),
            Err(e) => {
                tracing::error!("writing an answer failed: {e}");
                let end: Chunk = if trailers {
                    Ok(Frame::trailers(error_trailers(StatusCode::INTERNAL_SERVER_ERROR, "writing the answer failed")))
                } else {
                    flush_grace().await;
                    Err(std::io::Error::other(e))
                };
                (vec![end], (None, batches))
            }
        })
    })
    .flat_map(futures::stream::iter);
    let frames = futures::stream::once(async move { Ok(Frame::data(header)) }).chain(body);
    Ok(Body::new(http_body_util::StreamBody::new(frames)))
}

/// The trailers that end an answer broken by an error, for clients that take trailers: the
/// status the answer would have had and the message (control characters as spaces).
pub const ERROR_TRAILERS: [&str; 2] = ["lake-error-status", "lake-error"];

fn error_trailers(status: StatusCode, message: &str) -> HeaderMap {
    let printable: String = message.chars().map(|c| if c.is_control() { ' ' } else { c }).collect();
    let mut trailers = HeaderMap::new();
    trailers.insert(ERROR_TRAILERS[0], status.as_u16().into());
    if let Ok(message) = header::HeaderValue::from_bytes(printable.as_bytes()) {
        trailers.insert(ERROR_TRAILERS[1], message);
    }
    trailers
}

/// Whether the request's `TE` header takes trailers.
fn takes_trailers(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::TE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.split(';').next().unwrap_or_default().trim().eq_ignore_ascii_case("trailers"))
}

/// A streamed answer's response: its content type, and the trailers it may end with declared
/// when the client takes them.
fn streamed(content_type: &'static str, body: Body, trailers: bool) -> Response {
    let mut response = ([(header::CONTENT_TYPE, content_type)], body).into_response();
    if trailers {
        response.headers_mut().insert(header::TRAILER, header::HeaderValue::from_static("lake-error-status, lake-error"));
    }
    response
}

/// How long a body that breaks off waits before its error. hyper drops what it has buffered
/// and not yet written when a body fails (the rest of the batch sent before, or the head and
/// first rows of an answer); waiting lets it write them, so the client gets every whole batch
/// (or row) before the break.
const FLUSH_GRACE: std::time::Duration = std::time::Duration::from_millis(250);

async fn flush_grace() {
    tokio::time::sleep(FLUSH_GRACE).await;
}

/// The forms an answer can take, by media type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    Arrow,
    Json,
    Csv,
}

impl Answer {
    fn media_type(self) -> &'static str {
        match self {
            Self::Arrow => ARROW_STREAM,
            Self::Json => "application/json",
            Self::Csv => "text/csv",
        }
    }
}

/// The first of `offered` (the first is the default) that the request's `Accept` headers take,
/// by their quality and then their order; a 406 naming the offered types when they take none.
fn negotiate(headers: &HeaderMap, path: &str, offered: &[Answer]) -> Result<Answer, Refused> {
    let accept: Vec<&str> = headers.get_all(header::ACCEPT).iter().filter_map(|v| v.to_str().ok()).collect();
    let mut ranges: Vec<(f32, String)> = Vec::new();
    for range in accept.iter().flat_map(|v| v.split(',')) {
        let mut parts = range.split(';');
        let media = parts.next().unwrap_or("").trim().to_ascii_lowercase();
        if media.is_empty() {
            continue;
        }
        let q = parts
            .filter_map(|p| p.split_once('='))
            .find(|(k, _)| k.trim().eq_ignore_ascii_case("q"))
            .map_or(1.0, |(_, v)| v.trim().parse::<f32>().unwrap_or(0.0));
        ranges.push((q, media));
    }
    if ranges.is_empty() {
        return Ok(offered[0]);
    }
    // Types refused outright (`q=0`) are not taken through a wildcard either.
    ranges.sort_by(|a, b| b.0.total_cmp(&a.0));
    let refused = |a: Answer| ranges.iter().any(|(q, m)| *q <= 0.0 && m == a.media_type());
    let chosen = ranges.iter().filter(|(q, _)| *q > 0.0).find_map(|(_, media)| {
        offered.iter().copied().filter(|a| !refused(*a)).find(|a| {
            let ty = a.media_type();
            media == "*/*" || media == ty || media.strip_suffix("/*").is_some_and(|major| ty.split('/').next() == Some(major))
        })
    });
    chosen.ok_or_else(|| {
        let types: Vec<&str> = offered.iter().map(|a| a.media_type()).collect();
        Refused(StatusCode::NOT_ACCEPTABLE, format!("{path} answers in {}, not `{}`", types.join(", "), accept.join(", ")))
    })
}

/// The request body, or a JSON refusal (a body over the 2 MiB limit: 413).
fn body(body: Result<Bytes, axum::extract::rejection::BytesRejection>) -> Result<Bytes, Refused> {
    body.map_err(|e| match e.status() {
        StatusCode::PAYLOAD_TOO_LARGE => Refused(StatusCode::PAYLOAD_TOO_LARGE, "the request body is over the 2 MiB limit".into()),
        status => Refused(status, e.body_text()),
    })
}

async fn sample(
    State(service): State<Arc<Service>>,
    headers: HeaderMap,
    body_bytes: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<Response, Refused> {
    negotiate(&headers, "/v1/sample", &[Answer::Arrow]).inspect_err(|_| service.count_bad())?;
    json_content(&headers).inspect_err(|_| service.count_bad())?;
    let body = body(body_bytes).inspect_err(|_| service.count_bad())?;
    let request = service.parse_request(&body)?;
    // The plan, as Flight's GetFlightInfo gives it: the epoch's shape a client keeps its
    // `(epoch, step)` cursor with, and the dataset versions read (the stream is pinned to them).
    let plan = service.describe(&request, super::Footprint::ENCODED).await?;
    let pinned = super::SampleRequest { datasets: plan.datasets.clone(), ..request };
    let (schema, mut batches) = service.batches(&pinned).await?;
    // The status waits for the first batch, so that a stream that cannot begin (a frame the
    // lake cannot give, its store unreachable) is refused with its status, not cut off.
    let first = match batches.next().await {
        Some(Err(e)) => return Err(service.explained(e).await.into()),
        first => first,
    };
    let batches = futures::stream::iter(first).chain(batches);
    let trailers = takes_trailers(&headers);
    let mut response = streamed(ARROW_STREAM, encoded_body(Answer::Arrow, schema, batches, trailers)?, trailers);
    let headers = response.headers_mut();
    headers.insert("lake-epoch-len", plan.epoch_len.into());
    headers.insert("lake-steps-per-epoch", plan.steps_per_epoch.into());
    if let Ok(shape) = header::HeaderValue::from_bytes(plan.shape_json().as_bytes()) {
        headers.insert("lake-plan", shape);
    }
    Ok(response)
}

/// `POST /v1/facts`: what a trainer builds its policy from for the sampling request in the
/// body (fps, features as samples carry them, statistics of the steps sampled, datasets), as
/// Flight's `lake.sampling_facts` action answers.
async fn facts(
    State(service): State<Arc<Service>>,
    headers: HeaderMap,
    body_bytes: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<Json<Value>, Refused> {
    json_content(&headers).inspect_err(|_| service.count_bad())?;
    let body = body(body_bytes).inspect_err(|_| service.count_bad())?;
    let request = service.parse_request(&body)?;
    let facts = service.sampling_facts(&request).await?;
    // Strict JSON: a non-finite statistic is `null`.
    let stats = lake_schemas::pyjson::strict(&facts.stats);
    Ok(Json(json!({"fps": facts.fps, "features": facts.features, "stats": stats, "datasets": facts.datasets})))
}

/// A JSON body, by its `Content-Type`: `application/json` or a `+json` type (parameters such
/// as `charset` aside); a request without one is read as JSON too. Anything else (curl's `-d`
/// alone sends a form) is a 415 that says what to send.
fn json_content(headers: &HeaderMap) -> Result<(), Refused> {
    let Some(value) = headers.get(header::CONTENT_TYPE) else { return Ok(()) };
    let media = value.to_str().unwrap_or_default().split(';').next().unwrap_or_default().trim().to_ascii_lowercase();
    if media == "application/json" || (media.starts_with("application/") && media.ends_with("+json")) {
        return Ok(());
    }
    Err(Refused(
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        format!("the body is a JSON sampling request: send it as `Content-Type: application/json`, not `{media}`"),
    ))
}

/// What `POST /v1/sql` takes in its query string: the most rows to answer with (the query is
/// stopped there).
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct SqlQuery {
    max_rows: Option<u64>,
}

async fn sql(
    State(service): State<Arc<Service>>,
    headers: HeaderMap,
    query: Result<Query<SqlQuery>, QueryRejection>,
    body_bytes: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<Response, Refused> {
    let Query(query) = query.map_err(|e| query_refused(&service, &e))?;
    let answer = negotiate(&headers, "/v1/sql", &[Answer::Arrow, Answer::Json, Answer::Csv]).inspect_err(|_| service.count_bad())?;
    let body = body(body_bytes).inspect_err(|_| service.count_bad())?;
    let answered = match sql_answer(&service, answer, &body, query.max_rows, takes_trailers(&headers)).await {
        Err(e) => Err(service.explained(e).await),
        ok => ok,
    };
    Ok(answered.inspect_err(|e| service.count_sql_error(e))?)
}

async fn sql_answer(service: &Arc<Service>, answer: Answer, body: &[u8], max_rows: Option<u64>, trailers: bool) -> Result<Response, Error> {
    let query = std::str::from_utf8(body).map_err(|_| Error::Invalid("the body must be a UTF-8 SQL query".into()))?;
    let slot = service.sql_slot()?;
    let session = service.sql_session().await?;
    let mut stream = service.sql_stream(session, query, slot).await?;
    let schema = stream.schema();
    // Most errors of a running query come with its first batch: those are still a 400. One
    // later breaks the body off (no end-of-stream marker), and is logged and counted.
    let first = match stream.next().await {
        Some(Err(e)) => return Err(lake_query::sql::sql_error(&e)),
        first => first,
    };
    let counted = service.clone();
    let rows = futures::stream::iter(first).chain(stream).scan(max_rows.unwrap_or(u64::MAX), |left, b| {
        let b = match b {
            Ok(_) if *left == 0 => return std::future::ready(None),
            Ok(b) => {
                let taken = (b.num_rows() as u64).min(*left);
                *left -= taken;
                Ok(b.slice(0, taken as usize))
            }
            Err(e) => Err(e),
        };
        std::future::ready(Some(b))
    });
    let batches = rows.map(move |b| {
        b.map(SampleBatch::from).map_err(|e| {
            let e = lake_query::sql::sql_error(&e);
            counted.count_sql_error(&e);
            tracing::warn!("SQL query failed while streaming its result: {e}");
            e
        })
    });
    let content_type = match answer {
        Answer::Arrow => ARROW_STREAM,
        Answer::Json => "application/json",
        Answer::Csv => "text/csv; charset=utf-8; header=present",
    };
    Ok(streamed(content_type, encoded_body(answer, schema, batches, trailers)?, trailers))
}

async fn openapi() -> Json<Value> {
    Json(openapi_document())
}

/// The OpenAPI 3.1 description of the HTTP API.
pub fn openapi_document() -> Value {
    let error =
        |why: &str| json!({"description": why, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}});
    let mut unauthorized = error("no bearer token, or a wrong one (when the server has tokens)");
    unauthorized["headers"] = json!({"WWW-Authenticate": {"description": "`Bearer`", "schema": {"type": "string"}}});
    let plan_header = |what: &str| json!({"description": what, "schema": {"type": "integer", "minimum": 0}});
    let sample_stream = json!({"description": "the rank's batches as an Arrow IPC stream; an error after the first batch breaks it off before its end marker (a request with `TE: trailers` gets the error as the trailers `Lake-Error-Status` and `Lake-Error`)", "content": {ARROW_STREAM: {}},
        "headers": {
            "Lake-Epoch-Len": plan_header("positions per epoch: the eligible steps (a mixture's summed and rounded up to whole blocks of 4096)"),
            "Lake-Steps-Per-Epoch": plan_header("global steps (batches per rank) per epoch; the stream goes on with step 0 of the next epoch after the last"),
            "Lake-Plan": {"description": "the plan as JSON, as Flight's GetFlightInfo has it in `app_metadata`: `epoch_len`, `steps_per_epoch` and `datasets` with every name pinned to the version read", "schema": {"type": "string"}}}});
    let nullable = |t: &str, description: &str| json!({"type": [t, "null"], "minimum": 0, "description": description});
    let mut document = paths_and_schemas(&error, &unauthorized, &sample_stream, &nullable);
    // What every operation may answer besides its own responses.
    let unreachable = "the lake's object store cannot be reached now";
    for (path, operations) in document["paths"].as_object_mut().expect("paths").iter_mut() {
        let reads_the_lake = path.starts_with("/v1/") && !["/v1/openapi.json", "/v1/server"].contains(&path.as_str());
        for (method, operation) in operations.as_object_mut().expect("operations").iter_mut() {
            let responses = operation["responses"].as_object_mut().expect("responses");
            responses.insert("405".into(), error("the path does not take this method"));
            responses.insert("500".into(), error("the server failed (a damaged lake file, say); the server log has the details"));
            if reads_the_lake {
                let busy = responses.get("503").and_then(|r| r["description"].as_str()).map(|d| format!("{d}; or {unreachable}"));
                responses
                    .insert("503".into(), error(&busy.unwrap_or_else(|| format!("{unreachable} (retry after the Retry-After seconds)"))));
            }
            if method == "post" {
                responses.insert("413".into(), error("the request body is over 2 MiB"));
                responses
                    .insert("408".into(), error("the request body did not arrive within the server's request wait (`--request-wait`)"));
            }
            if let Some(busy) = responses.get_mut("503") {
                busy["headers"] = json!({"Retry-After": {"description": "seconds to wait before a retry (when busy, not when shutting down)", "schema": {"type": "integer"}}});
            }
        }
    }
    document
}

fn paths_and_schemas(
    error: &dyn Fn(&str) -> Value,
    unauthorized: &Value,
    sample_stream: &Value,
    nullable: &dyn Fn(&str, &str) -> Value,
) -> Value {
    let dataset_entry = json!({"oneOf": [
        {"type": "string", "description": "NAME (its latest version, pinned when the request arrives), NAME@VERSION, a view (VIEW or VIEW@VERSION), or any of these with =WEIGHT"},
        {"type": "object", "additionalProperties": false, "required": ["name", "weight"],
         "properties": {"name": {"type": "string"}, "weight": {"type": "number", "exclusiveMinimum": 0}}}]});
    let dataset_name =
        json!({"name": "name", "in": "path", "required": true, "schema": {"type": "string"}, "description": "NAME or NAME@VERSION"});
    json!({
        "openapi": "3.1.0",
        "info": {"title": "lake", "version": env!("CARGO_PKG_VERSION"),
                 "description": "Step-granular LeRobot samples and SQL over a lake. Request bodies may be up to 2 MiB."},
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {
                "Error": {"type": "object", "required": ["error"], "properties": {"error": {"type": "string"},
                    "position": {"type": "object", "description": "where in a SQL query the error is, when known",
                        "properties": {"line": {"type": "integer"}, "column": {"type": "integer"}}}}},
                "SampleRequest": {"type": "object", "required": ["datasets"], "additionalProperties": false, "properties": {
                    "datasets": {"type": "array", "minItems": 1, "maxItems": super::MAX_DATASETS, "items": dataset_entry,
                                 "description": "datasets or views to sample from; more than one is a mixture by weight"},
                    "preset": {"type": "string", "enum": ["act", "diffusion", "none"], "default": "none",
                               "description": "window preset; ignored when delta_timestamps is given"},
                    "delta_timestamps": {"type": ["object", "null"], "additionalProperties": {"type": "array", "minItems": 1, "items": {"type": "number"}},
                                         "description": "LeRobot's delta_timestamps: feature → offsets in seconds (multiples of 1/fps)"},
                    "batch_size": {"type": "integer", "minimum": 1, "maximum": super::MAX_BATCH_SIZE, "default": 32,
                                   "description": "samples per batch for each rank"},
                    "seed": {"type": "integer", "minimum": 0, "maximum": u64::MAX, "default": 0, "description": "sampler seed"},
                    "shuffle": {"type": "boolean", "default": true,
                                "description": "each epoch a shuffle (a function of seed and epoch); false: the eligible steps as recorded, the datasets in the order named, the same every epoch (no weights)"},
                    "epoch": {"type": "integer", "minimum": 0, "maximum": u32::MAX, "default": 0, "description": "epoch to start in"},
                    "start_step": {"type": "integer", "minimum": 0, "default": 0, "description": "global step to start at within the epoch (below the epoch's steps)"},
                    "rank": {"type": "integer", "minimum": 0, "default": 0, "description": "this trainer's rank (below world_size)"},
                    "world_size": {"type": "integer", "minimum": 1, "maximum": super::MAX_WORLD_SIZE, "default": 1},
                    "limit_batches": nullable("integer", "batches to send; absent or null: indefinitely, across epochs"),
                    "step_stride": {"type": "integer", "minimum": 1, "maximum": super::MAX_WORLD_SIZE, "default": 1,
                                    "description": "global steps from one batch to the next (n readers of one rank taking turns)"},
                    "drop_last": {"type": "boolean", "default": true, "description": "drop each epoch's short last global batch"},
                    "episodes": {"type": "array", "items": {"type": "integer"}, "minItems": 1, "description": "only these episodes (of every dataset); left out, every episode"},
                    "drop_n_first_frames": {"type": "integer", "minimum": 0, "maximum": u32::MAX, "default": 0},
                    "drop_n_last_frames": {"type": "integer", "minimum": 0, "maximum": u32::MAX, "default": 0},
                    "frame_size": {"type": ["string", "null"], "pattern": "^[1-9][0-9]*x[1-9][0-9]*$",
                                   "description": "WIDTHxHEIGHT of a frame table of every dataset (lake cache NAME --size WxH)"},
                    "frame_format": {"type": ["string", "null"], "enum": ["rgb24", "yuv420p", "packets", null], "default": "rgb24",
                                     "description": "rgb24: LeRobot's RGB frames; yuv420p: the video cameras whose frames are 8-bit 4:2:0 as YUV planes, to convert on the trainer (camera field metadata pixel_format and yuv_to_rgb); packets: every camera's compressed GOPs in {camera}_packets, the camera column the index of the decoded frame each slot shows"},
                    "proxy": {"type": "boolean", "default": false,
                              "description": "every camera's frames from each dataset's training proxy (lake cache NAME --proxy h264): re-encoded, lossy, not LeRobot's frames; the camera fields' lake:proxy metadata gives the settings and the PSNR against the recorded frames"}}},
                "Datasets": {"type": "object", "properties": {
                    "datasets": {"type": "array", "items": {"type": "object", "properties": {
                        "name": {"type": "string"}, "version": {"type": "integer"}, "episodes": {"type": "integer"}, "steps": {"type": "integer"},
                        "cameras": {"type": "integer"}, "fps": {"type": "integer"}, "codebase_version": {"type": "string"},
                        "robot_type": {"type": ["string", "null"]}, "duration_s": {"type": "number"},
                        "bytes": {"type": ["integer", "null"], "description": "stored under the version's directory (null when it cannot be listed)"},
                        "camera_list": {"type": "array", "items": {"type": "object", "properties": {"camera": {"type": "string"}, "codec": {"type": "string"},
                            "width": {"type": "integer"}, "height": {"type": "integer"}}}},
                        "frame_tables": {"type": "array"}, "findings": {"type": "object", "description": "ingest findings by severity"},
                        "tasks": {"type": "integer"}, "committed_at": {"type": "string", "format": "date-time"}}}},
                    "views": {"type": "array", "items": {"$ref": "#/components/schemas/View"}},
                    "unreadable": {"type": "array", "description": "datasets and views whose catalog record was damaged outside lake (left out)",
                        "items": {"type": "object", "properties": {
                            "kind": {"enum": ["dataset", "view"]}, "name": {"type": "string"}, "version": {"type": "integer"}}}}}},
                "View": {"type": "object", "properties": {
                    "name": {"type": "string"}, "version": {"type": "integer"}, "kind": {"const": "view"}, "sql": {"type": "string"},
                    "created_at": {"type": "string", "format": "date-time"}, "episodes": {"type": "integer"},
                    "selects": {"type": "array", "items": {"type": "object", "properties": {
                        "dataset": {"type": "string"}, "weight": {"type": "number"}, "episodes": {"type": "array", "items": {"type": "integer"}},
                        "removed": {"type": "object", "description": "present when `lake rm` removed this dataset version (a request for the view is then refused)",
                            "properties": {"name": {"type": "string"}, "from_version": {"type": "integer"}, "through_version": {"type": "integer"},
                                "removed_at": {"type": "string", "format": "date-time"}}}}}}}}
            }
        },
        "security": [{"bearer": []}],
        "paths": {
            "/healthz": {"get": {"security": [], "responses": {"200": {"description": "serving (`ok`)", "content": {"text/plain": {}}}}}},
            "/metrics": {"get": {"responses": {"200": {"description": "Prometheus text format", "content": {"text/plain; version=0.0.4": {}}}, "401": unauthorized}}},
            "/v1/openapi.json": {"get": {"responses": {"200": {"description": "this document", "content": {"application/json": {}}}, "401": unauthorized}}},
            "/v1/server": {"get": {"responses": {
                "200": {"description": "this server: `version` (lake's), and `read_only` (true under `lake serve --read-only`: `POST /v1/views` is refused)",
                        "content": {"application/json": {"schema": {"type": "object", "required": ["version", "read_only"],
                            "properties": {"version": {"type": "string"}, "read_only": {"type": "boolean"}}}}}},
                "401": unauthorized}}},
            "/v1/datasets": {"get": {"responses": {
                "200": {"description": "the datasets (latest versions) and views",
                        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Datasets"}}}},
                "401": unauthorized}}},
            "/": {"get": {"security": [], "responses": {"200": {"description": "the web app (its files hold no data: every page reads the API with the tab's token)", "content": {"text/html": {}}}}}},
            "/app/{file}": {"get": {"security": [], "parameters": [{"name": "file", "in": "path", "required": true, "schema": {"enum": ["index.html", "app.js", "app.css"]}}],
                "responses": {"200": {"description": "one of the web app's files"}, "404": error("no such file")}}},
            "/v1/datasets/{name}/episodes": {"get": {"parameters": [
                    dataset_name,
                    {"name": "offset", "in": "query", "schema": {"type": "integer", "minimum": 0, "default": 0}},
                    {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": browse::MAX_PAGE, "default": 50}},
                    {"name": "sort", "in": "query", "schema": {"enum": ["episode_index", "length", "findings"], "default": "episode_index"}},
                    {"name": "order", "in": "query", "schema": {"enum": ["asc", "desc"], "default": "asc"}},
                    {"name": "task", "in": "query", "schema": {"type": "string"}, "description": "only episodes with a task holding this text (any case)"},
                    {"name": "min_length", "in": "query", "schema": {"type": "integer"}},
                    {"name": "max_length", "in": "query", "schema": {"type": "integer"}},
                    {"name": "with_findings", "in": "query", "schema": {"type": "boolean"}, "description": "only episodes with (true) or without (false) ingest findings"}],
                "responses": {"200": {"description": "`total` (after filtering), `offset`, `limit` and `rows`: each episode's `episode_index`, `length`, `tasks`, `from_index` (LeRobot index of its first step) and `findings` (how many)",
                        "content": {"application/json": {}}},
                    "400": error("not a valid query, or a view"), "401": unauthorized, "404": error("no such dataset or version")}}},
            "/v1/datasets/{name}/episodes/{episode}": {"get": {"parameters": [dataset_name,
                    {"name": "episode", "in": "path", "required": true, "schema": {"type": "integer"}, "description": "LeRobot's episode_index"}],
                "responses": {"200": {"description": "the episode's `length`, `fps`, `from_index`, `tasks`, `cameras` (key, size, whether video), `columns` (every steps column but the cameras, by LeRobot key, one value per step) and `names` (info.json's dimension names of each vector that has them)",
                        "content": {"application/json": {}}},
                    "400": error("a view"), "401": unauthorized, "404": error("no such dataset, version or episode")}}},
            "/v1/datasets/{name}/findings": {"get": {"parameters": [dataset_name],
                "responses": {"200": {"description": "`findings`: what ingest found (severity, kind, file, episode_index, camera, frame_index, message)", "content": {"application/json": {}}},
                    "400": error("a view"), "401": unauthorized, "404": error("no such dataset or version")}}},
            "/v1/datasets/{name}/frame": {"get": {"parameters": [dataset_name,
                    {"name": "camera", "in": "query", "required": true, "schema": {"type": "string"}, "description": "the camera's key"},
                    {"name": "index", "in": "query", "required": true, "schema": {"type": "integer"}, "description": "LeRobot's index of the step"}],
                "responses": {"200": {"description": "the camera's frame at the step as the loader serves it (RGB as recorded), in a PNG without a colour profile; `Lake-Episode-Index` and `Lake-Frame-Index` name the step",
                        "content": {"image/png": {}}},
                    "400": error("a view"), "401": unauthorized, "404": error("no such dataset, version, camera or step"), "500": error("the frame could not be decoded")}}},
            "/v1/datasets/{name}/frames": {"get": {"parameters": [dataset_name,
                    {"name": "camera", "in": "query", "required": true, "schema": {"type": "string"}, "description": "the camera's key"},
                    {"name": "index", "in": "query", "required": true, "schema": {"type": "integer"}, "description": "LeRobot's index of the first step"},
                    {"name": "count", "in": "query", "required": true, "schema": {"type": "integer", "minimum": 1, "maximum": 64}, "description": "frames from that step on"}],
                "responses": {"200": {"description": "the camera's frames at the step and the steps after it in its episode, as the loader serves them, each a PNG without a colour profile, one after another; `Lake-Frame-Bytes` gives their sizes (comma-separated), `Lake-Episode-Index` and `Lake-Frame-Index` name the first step, `Lake-Frame-Count` the frames (fewer than `count` where the episode ends, or past 16 MiB of RGB)",
                        "content": {"application/octet-stream": {}}},
                    "400": error("a view, or `count` out of range"), "401": unauthorized, "404": error("no such dataset, version, camera or step"), "500": error("a frame could not be decoded")}}},
            "/v1/views": {"post": {"requestBody": {"required": true, "content": {"application/json": {"schema": {"type": "object", "required": ["name", "sql"], "additionalProperties": false,
                    "properties": {"name": {"type": "string"}, "sql": {"type": "string", "description": "a query returning episode_index (and dataset, over several datasets), as `lake view create` takes"},
                        "replace": {"type": "boolean", "default": false}}}}}},
                "responses": {"201": {"description": "the view made, with `notes`", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/View"}}}},
                    "400": error("not a valid name or query, or the name is taken (without replace)"), "401": unauthorized,
                    "403": error("the server may not write to its lake: it serves it read-only (`lake serve --read-only`), or the lake's storage refuses its writes"),
                    "503": error("as many SQL queries run as the server runs at once")}}},
            "/v1/datasets/{name}": {"get": {"parameters": [{"name": "name", "in": "path", "required": true, "schema": {"type": "string"},
                    "description": "NAME, NAME@VERSION, VIEW or VIEW@VERSION"},
                    {"name": "episodes", "in": "query", "schema": {"type": "boolean", "default": true}, "description": "false: without the list of every episode"}],
                "responses": {"200": {"description": "a dataset's features (a camera left out at ingest marked `\"ingested\": false`), cameras (one entry each: codec, size, longest GOP, files), episodes, stats and frame tables (the sizes `frame_size` may ask for), or a view",
                        "content": {"application/json": {"schema": {"type": "object"}}}},
                    "400": error("not a valid name"), "401": unauthorized, "404": error("no such dataset, version or view")}}},
            "/v1/sample": {"post": {"requestBody": {"required": true, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/SampleRequest"}}}},
                "responses": {"200": sample_stream, "400": error("not a valid request for the lake"), "401": unauthorized,
                    "404": error("no such dataset, version or view"), "406": error("the Accept header takes no Arrow stream"),
                    "415": error("the Content-Type is not JSON (a request without one is read as JSON)"),
                    "503": error("the memory budget has no room for another stream now (retry after the Retry-After seconds)")}}},
            "/v1/facts": {"post": {"requestBody": {"required": true, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/SampleRequest"}}}},
                "responses": {"200": {"description": "what a trainer builds its policy from for the request (Flight: the `lake.sampling_facts` action): `fps`, `features` (info.json's, as samples carry them), `stats` (LeRobot's stats.json layout, over the steps sampled; non-finite values null) and `datasets` (NAME@VERSION)",
                    "content": {"application/json": {}}}, "400": error("not a valid request, or a mixture of rates or features"), "401": unauthorized,
                    "404": error("no such dataset, version or view"), "415": error("the Content-Type is not JSON")}}},
            "/v1/sql": {"post": {"parameters": [{"name": "max_rows", "in": "query", "schema": {"type": "integer", "minimum": 0},
                    "description": "answer with at most this many rows (the query stops there)"}],
                "requestBody": {"required": true, "content": {"text/plain": {}}},
                "responses": {"200": {"description": "by the Accept header: an Arrow IPC stream (the default), a JSON array of row objects (application/json) or CSV with a header row (text/csv; vectors as `[1.0, 2.0]`), each streamed as the query runs; an error after the first rows breaks the answer off (an Arrow stream before its end marker, a JSON array before its `]`; a request with `TE: trailers` gets the error as the trailers `Lake-Error-Status` and `Lake-Error`)",
                    "content": {ARROW_STREAM: {}, "application/json": {}, "text/csv": {}}}, "400": error("bad SQL, a query over the limits (1 MiB of text, nesting), or the query failed"), "401": unauthorized,
                    "406": error("the Accept header takes none of the answer's forms"),
                    "507": error("the query needs more memory than the server's SQL budget (--sql-memory-mb), or builds a value past 256 MiB"),
                    "503": error("as many SQL queries run as the server runs at once (retry after the Retry-After seconds)")}}}
        }
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    #[test]
    fn a_camera_left_out_at_ingest_is_marked_not_ingested() {
        let info = json!({"features": {
            "action": {"dtype": "float32", "shape": [6]},
            "observation.images.front": {"dtype": "video", "shape": [96, 128, 3]},
            "observation.images.wrist": {"dtype": "video", "shape": [96, 128, 3]},
            "observation.images.top": {"dtype": "image", "shape": [96, 128, 3]},
        }});
        let cameras = json!([{"camera": "observation.images.front", "files": 1}, {"camera": "observation.images.top", "files": 1}]);
        let features = super::features_json(&info, &cameras);
        assert_eq!(features["observation.images.wrist"]["ingested"], json!(false));
        for kept in ["action", "observation.images.front", "observation.images.top"] {
            assert!(features[kept].get("ingested").is_none(), "{kept}: {}", features[kept]);
        }
        assert_eq!(features["observation.images.wrist"]["shape"], json!([96, 128, 3]));
    }
}
