//! The web app's files, built by `scripts/build-web.sh` from `web/` into `serve/assets/` and
//! embedded in the binary. They hold no data (every page reads the lake through the API, with
//! the tab's token), so they are served without one: the login page is among them.

use axum::{
    extract::Path,
    http::{HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
};

/// Each file: its name, media type and bytes.
const FILES: [(&str, &str, &[u8]); 3] = [
    ("index.html", "text/html; charset=utf-8", include_bytes!("../assets/index.html")),
    ("app.js", "text/javascript; charset=utf-8", include_bytes!("../assets/app.js")),
    ("app.css", "text/css; charset=utf-8", include_bytes!("../assets/app.css")),
];

/// The variable naming a directory to read the files from instead (for working on `web/`
/// without rebuilding the binary).
pub const ASSETS_DIR_VARIABLE: &str = "LAKE_WEB_ASSETS";

/// Scripts and styles only from the server itself; frames drawn from `blob:` URLs; no frames
/// or plugins. Inline styles are allowed for the chart library's positioning.
const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; img-src 'self' blob: data:; style-src 'self' 'unsafe-inline'; \
    object-src 'none'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'";

/// `GET /`: the app's page.
pub async fn index() -> Response {
    file("index.html")
}

/// `GET /app/{file}`: one of the app's files.
pub async fn app_file(Path(name): Path<String>) -> Response {
    file(&name)
}

fn file(name: &str) -> Response {
    let Some(&(name, media_type, embedded)) = FILES.iter().find(|(n, _, _)| *n == name) else {
        return (StatusCode::NOT_FOUND, axum::Json(serde_json::json!({"error": format!("no file `{name}` in the web app")})))
            .into_response();
    };
    let bytes = match std::env::var_os(ASSETS_DIR_VARIABLE) {
        Some(dir) => match std::fs::read(std::path::Path::new(&dir).join(name)) {
            Ok(bytes) => bytes,
            Err(e) => {
                let message = format!("{}={}: {name}: {e}", ASSETS_DIR_VARIABLE, std::path::Path::new(&dir).display());
                return (StatusCode::INTERNAL_SERVER_ERROR, axum::Json(serde_json::json!({"error": message}))).into_response();
            }
        },
        None => embedded.to_vec(),
    };
    let mut response = bytes.into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(media_type));
    // The files change with the binary and carry no version in their names: browsers ask again.
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CONTENT_SECURITY_POLICY));
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    response
}
