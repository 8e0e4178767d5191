//! The HTTP service (axum): datasets, sampling as an Arrow IPC stream, SQL, health, metrics and
//! the OpenAPI document.

use std::sync::Arc;

use arrow::{array::RecordBatch, datatypes::SchemaRef, ipc::writer::StreamWriter};
use axum::{
    Json, Router,
    body::{Body, Bytes},
    extract::{Path, Request, State},
    http::{HeaderMap, StatusCode, header},
    middleware::{self, Next},
    response::{IntoResponse, Response},
    routing::{get, post},
};
use futures::{Stream, StreamExt};
use serde_json::{Value, json};

use super::{Refusal, Service, refusal};
use crate::{Error, sql::LakeSql};

/// The media type of Arrow IPC streams.
pub const ARROW_STREAM: &str = "application/vnd.apache.arrow.stream";

/// The HTTP routes over `service`.
pub fn router(service: Arc<Service>) -> Router {
    let api = Router::new()
        .route("/metrics", get(metrics))
        .route("/v1/datasets", get(datasets))
        .route("/v1/datasets/{name}", get(dataset))
        .route("/v1/sample", post(sample))
        .route("/v1/sql", post(sql))
        .route("/v1/openapi.json", get(openapi))
        .route_layer(middleware::from_fn_with_state(service.clone(), auth));
    Router::new().route("/healthz", get(|| async { "ok\n" })).merge(api).with_state(service)
}

/// A refused request: status and a JSON body `{"error": message}`.
struct Refused(StatusCode, String);

impl IntoResponse for Refused {
    fn into_response(self) -> Response {
        (self.0, Json(json!({"error": self.1}))).into_response()
    }
}

impl From<Error> for Refused {
    fn from(e: Error) -> Self {
        let (kind, message) = refusal(&e);
        let code = match kind {
            Refusal::BadRequest => StatusCode::BAD_REQUEST,
            Refusal::NotFound => StatusCode::NOT_FOUND,
            Refusal::Busy => StatusCode::SERVICE_UNAVAILABLE,
            Refusal::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        };
        Self(code, message)
    }
}

async fn auth(State(service): State<Arc<Service>>, request: Request, next: Next) -> Response {
    let token = request.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "));
    if service.authorized(token) {
        next.run(request).await
    } else {
        Refused(StatusCode::UNAUTHORIZED, "a valid bearer token is required".into()).into_response()
    }
}

async fn metrics(State(service): State<Arc<Service>>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], service.prometheus().await)
}

async fn datasets(State(service): State<Arc<Service>>) -> Result<Json<Value>, Refused> {
    let records = service.lake().datasets().await.map_err(Error::from)?;
    let list: Vec<Value> = records
        .iter()
        .map(|r| {
            json!({"name": r.name, "version": r.version, "episodes": r.counts.episodes, "steps": r.counts.steps,
                   "cameras": r.counts.cameras, "fps": r.fps, "codebase_version": r.source.codebase_version,
                   "robot_type": r.robot_type})
        })
        .collect();
    Ok(Json(json!({ "datasets": list })))
}

async fn dataset(State(service): State<Arc<Service>>, Path(name): Path<String>) -> Result<Json<Value>, Refused> {
    let lake = service.lake();
    let record = lake.resolve(&name).await.map_err(Error::from)?;
    let episodes =
        lake_store::read_columns(lake, &record, lake_schemas::tables::EPISODES, &["episode_index", "length"]).await.map_err(Error::from)?;
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
            .await
            .map_err(Error::from)?;
    let cameras = batches_json(&streams)?;
    let stats = crate::stats::stats_json(lake, &record).await.ok();
    let frame_tables = lake_loader::frame_tables(lake, &record).await;
    Ok(Json(json!({
        "name": record.name, "version": record.version, "fps": record.fps,
        "features": record.info.get("features"), "cameras": cameras, "episodes": list, "stats": stats,
        "counts": record.counts, "source": record.source, "frame_tables": frame_tables,
    })))
}

fn batches_json(batches: &[RecordBatch]) -> Result<Value, Refused> {
    let mut writer = arrow::json::ArrayWriter::new(Vec::new());
    for b in batches {
        writer.write(b).map_err(|e| Refused(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    }
    writer.finish().map_err(|e| Refused(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    let bytes = writer.into_inner();
    if bytes.is_empty() {
        return Ok(json!([]));
    }
    serde_json::from_slice(&bytes).map_err(|e| Refused(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))
}

/// Encodes `batches` as one Arrow IPC stream, message by message, as they arrive.
fn ipc_stream(
    schema: SchemaRef,
    batches: impl Stream<Item = crate::Result<RecordBatch>> + Send + 'static,
) -> Result<impl Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static, Refused> {
    let mut writer = StreamWriter::try_new(Vec::new(), &schema).map_err(|e| Refused(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    let header = Bytes::from(std::mem::take(writer.get_mut()));
    let state = (Some(writer), Box::pin(batches));
    let body = futures::stream::unfold(state, |(writer, mut batches)| async move {
        let mut writer = writer?;
        let out = match batches.next().await {
            Some(Ok(batch)) => writer.write(&batch).map(|()| Bytes::from(std::mem::take(writer.get_mut()))),
            Some(Err(e)) => {
                // Headers are gone; ending the body early tells the client the stream broke.
                let (_, message) = refusal(&e);
                return Some((Err(std::io::Error::other(message)), (None, batches)));
            }
            None => {
                let done = writer.finish().map(|()| Bytes::from(std::mem::take(writer.get_mut())));
                return Some((done.map_err(std::io::Error::other), (None, batches)));
            }
        };
        Some((out.map_err(std::io::Error::other), (Some(writer), batches)))
    });
    Ok(futures::stream::once(async move { Ok(header) }).chain(body))
}

async fn sample(State(service): State<Arc<Service>>, body: Bytes) -> Result<Response, Refused> {
    let request = service.parse_request(&body)?;
    let (schema, batches) = service.batches(&request).await?;
    let body = Body::from_stream(ipc_stream(schema, batches)?);
    Ok(([(header::CONTENT_TYPE, ARROW_STREAM)], body).into_response())
}

async fn sql(State(service): State<Arc<Service>>, headers: HeaderMap, body: Bytes) -> Result<Response, Refused> {
    let query = std::str::from_utf8(&body).map_err(|_| Refused(StatusCode::BAD_REQUEST, "the body must be a UTF-8 SQL query".into()))?;
    let session = LakeSql::open(service.lake()).await?.read_only();
    let wants_json = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()).is_some_and(|v| v.contains("application/json"));
    if wants_json {
        let (_, batches) = session.query(query).await?;
        return Ok(Json(batches_json(&batches)?).into_response());
    }
    let stream = session.stream(query).await?;
    let schema = stream.schema();
    let batches = stream.map(|b| b.map_err(|e| Error::Query(e.strip_backtrace())));
    Ok(([(header::CONTENT_TYPE, ARROW_STREAM)], Body::from_stream(ipc_stream(schema, batches)?)).into_response())
}

async fn openapi() -> Json<Value> {
    Json(openapi_document())
}

/// The OpenAPI 3.1 description of the HTTP API.
pub fn openapi_document() -> Value {
    let error = json!({"description": "refused", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}});
    let arrow = json!({"description": "Arrow IPC stream", "content": {ARROW_STREAM: {}}});
    json!({
        "openapi": "3.1.0",
        "info": {"title": "lake", "version": env!("CARGO_PKG_VERSION"),
                 "description": "Step-granular LeRobot samples and SQL over a lake."},
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {
                "Error": {"type": "object", "properties": {"error": {"type": "string"}}, "required": ["error"]},
                "SampleRequest": {"type": "object", "required": ["datasets"], "additionalProperties": false, "properties": {
                    "datasets": {"type": "array", "items": {"oneOf": [{"type": "string"},
                        {"type": "object", "properties": {"name": {"type": "string"}, "weight": {"type": "number"}}, "required": ["name", "weight"]}]}},
                    "preset": {"type": "string", "enum": ["act", "diffusion", "none"]},
                    "delta_timestamps": {"type": "object", "additionalProperties": {"type": "array", "items": {"type": "number"}}},
                    "batch_size": {"type": "integer", "minimum": 1, "description": "samples per batch for each rank"},
                    "seed": {"type": "integer"}, "epoch": {"type": "integer"}, "start_step": {"type": "integer"},
                    "rank": {"type": "integer"}, "world_size": {"type": "integer", "minimum": 1},
                    "limit_batches": {"type": "integer"}, "drop_last": {"type": "boolean"},
                    "episodes": {"type": "array", "items": {"type": "integer"}},
                    "drop_n_first_frames": {"type": "integer"}, "drop_n_last_frames": {"type": "integer"},
                    "frame_size": {"type": "string", "pattern": "^[0-9]+x[0-9]+$"}}}
            }
        },
        "security": [{"bearer": []}],
        "paths": {
            "/healthz": {"get": {"security": [], "responses": {"200": {"description": "serving"}}}},
            "/metrics": {"get": {"responses": {"200": {"description": "Prometheus text format"}}}},
            "/v1/datasets": {"get": {"responses": {"200": {"description": "the datasets"}}}},
            "/v1/datasets/{name}": {"get": {"parameters": [{"name": "name", "in": "path", "required": true, "schema": {"type": "string"}}],
                "responses": {"200": {"description": "features, cameras, episodes, stats, frame tables (the sizes `frame_size` may ask for)"}, "404": error}}},
            "/v1/sample": {"post": {"requestBody": {"required": true, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/SampleRequest"}}}},
                "responses": {"200": arrow, "400": error, "404": error, "401": error}}},
            "/v1/sql": {"post": {"requestBody": {"required": true, "content": {"text/plain": {}}},
                "responses": {"200": {"description": "Arrow IPC stream, or JSON rows with Accept: application/json",
                    "content": {ARROW_STREAM: {}, "application/json": {}}}, "400": error, "401": error}}}
        }
    })
}
