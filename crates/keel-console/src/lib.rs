//! Keel's web console: the operator's view of agents, threads, tasks and runs in a browser.
//!
//! The console is a handful of plain ES modules and one style sheet under `assets/`, built
//! into the binary with `include_bytes!`: nothing is fetched from a CDN and there is no
//! front-end build step, so the console works offline and a fresh clone's CI tests exactly
//! what ships. In the browser it calls the operator API (`/api/v1/...`, see
//! `docs/operator-api.md`) and the A2A routes of the same server, with the API key the
//! operator types in (kept in the browser's `localStorage`).
//!
//! [`router`] serves the assets under [`CONSOLE_PATH`]; `keel serve` merges it into its
//! server (`A2aServer::with_console`). The router knows no Keel type: the console reads the
//! same JSON as any other client, so it cannot see more than the caller's credentials allow.
//!
//! ```
//! let app: axum::Router = keel_console::router();
//! # let _ = app;
//! ```

use axum::extract::Path;
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE, ETAG, IF_NONE_MATCH, LOCATION};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

/// Where the console is served: its page is at `/console/`, its assets below it.
pub const CONSOLE_PATH: &str = "/console";

/// One embedded file: its name under [`CONSOLE_PATH`], content type, bytes and entity tag.
struct Asset {
    name: &'static str,
    content_type: &'static str,
    body: &'static [u8],
    etag: &'static str,
}

/// An asset under `assets/`, its entity tag computed at compile time from its bytes.
macro_rules! asset {
    ($name:literal, $type:expr) => {{
        const BODY: &[u8] = include_bytes!(concat!("../assets/", $name));
        const TAG: [u8; 18] = etag_of(BODY);
        Asset {
            name: $name,
            content_type: $type,
            body: BODY,
            // `etag_of` writes only ASCII hex digits and quotes.
            etag: match std::str::from_utf8(&TAG) {
                Ok(tag) => tag,
                Err(_) => panic!("an entity tag is ASCII"),
            },
        }
    }};
}

const JS: &str = "text/javascript; charset=utf-8";

/// Every file the console serves; `index.html` is the page at `/console/`.
static ASSETS: &[Asset] = &[
    asset!("index.html", "text/html; charset=utf-8"),
    asset!("console.css", "text/css; charset=utf-8"),
    asset!("favicon.svg", "image/svg+xml"),
    asset!("app.js", JS),
    asset!("api.js", JS),
    asset!("views.js", JS),
    asset!("run.js", JS),
    asset!("charts.js", JS),
    asset!("dom.js", JS),
];

/// A strong entity tag of `bytes`: their 64-bit FNV-1a hash, in hex, quoted. The assets are
/// fixed for a binary, so the tag is computed once, by the compiler.
const fn etag_of(bytes: &[u8]) -> [u8; 18] {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let mut i = 0;
    while i < bytes.len() {
        hash ^= bytes[i] as u64;
        hash = hash.wrapping_mul(0x0100_0000_01b3);
        i += 1;
    }
    let digits = b"0123456789abcdef";
    let mut tag = [b'"'; 18];
    let mut j = 0;
    while j < 16 {
        tag[1 + j] = digits[((hash >> (60 - 4 * j)) & 0xf) as usize];
        j += 1;
    }
    tag
}

/// The console's routes: `GET /console` (a redirect to `/console/`, so that the page's
/// relative module URLs resolve under it, also behind a proxy's path prefix),
/// `GET /console/` (the page) and `GET /console/{file}` (the modules, style sheet and icon).
///
/// Every answer carries its content type, a strong `ETag` and `Cache-Control: no-cache`:
/// a browser revalidates each load and gets `304 Not Modified` until the binary changes, so
/// an upgraded server never runs an old module beside a new one.
pub fn router() -> Router {
    Router::new()
        .route(CONSOLE_PATH, get(to_page))
        .route(&format!("{CONSOLE_PATH}/"), get(page))
        .route(&format!("{CONSOLE_PATH}/{{file}}"), get(file))
}

/// The names of the embedded files, for tests and docs.
pub fn asset_names() -> impl Iterator<Item = &'static str> {
    ASSETS.iter().map(|asset| asset.name)
}

async fn to_page() -> Response {
    // Relative, so that a prefix a proxy strips stays in the browser's URL.
    (
        StatusCode::PERMANENT_REDIRECT,
        [(LOCATION, HeaderValue::from_static("console/"))],
    )
        .into_response()
}

async fn page(headers: HeaderMap) -> Response {
    serve("index.html", &headers)
}

async fn file(Path(name): Path<String>, headers: HeaderMap) -> Response {
    serve(&name, &headers)
}

fn serve(name: &str, headers: &HeaderMap) -> Response {
    let Some(asset) = ASSETS.iter().find(|asset| asset.name == name) else {
        return (StatusCode::NOT_FOUND, "no such console file").into_response();
    };
    let cache = [
        (CACHE_CONTROL, HeaderValue::from_static("no-cache")),
        (ETAG, HeaderValue::from_static(asset.etag)),
    ];
    let matches = headers
        .get(IF_NONE_MATCH)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|tags| tags.split(',').any(|tag| tag.trim() == asset.etag));
    if matches {
        return (StatusCode::NOT_MODIFIED, cache).into_response();
    }
    (
        cache,
        [(CONTENT_TYPE, HeaderValue::from_static(asset.content_type))],
        asset.body,
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::Request;
    use tower::ServiceExt;

    async fn get(path: &str, if_none_match: Option<&str>) -> Response {
        let mut request = Request::get(path);
        if let Some(tag) = if_none_match {
            request = request.header(IF_NONE_MATCH, tag);
        }
        router()
            .oneshot(request.body(Body::empty()).unwrap())
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn the_bare_path_redirects_to_the_page_relatively() {
        let answer = get("/console", None).await;
        assert_eq!(answer.status(), StatusCode::PERMANENT_REDIRECT);
        assert_eq!(answer.headers()[LOCATION], "console/");
    }

    #[tokio::test]
    async fn the_page_and_each_module_have_their_content_type() {
        let page = get("/console/", None).await;
        assert_eq!(page.status(), StatusCode::OK);
        assert_eq!(page.headers()[CONTENT_TYPE], "text/html; charset=utf-8");
        assert_eq!(page.headers()[CACHE_CONTROL], "no-cache");
        let module = get("/console/app.js", None).await;
        assert_eq!(module.headers()[CONTENT_TYPE], JS);
        let style = get("/console/console.css", None).await;
        assert_eq!(style.headers()[CONTENT_TYPE], "text/css; charset=utf-8");
    }

    #[tokio::test]
    async fn a_known_entity_tag_is_answered_not_modified() {
        let first = get("/console/app.js", None).await;
        let tag = first.headers()[ETAG].to_str().unwrap().to_owned();
        assert!(
            tag.starts_with('"') && tag.ends_with('"') && tag.len() == 18,
            "{tag}"
        );
        let again = get("/console/app.js", Some(&format!("\"x\", {tag}"))).await;
        assert_eq!(again.status(), StatusCode::NOT_MODIFIED);
        let stale = get("/console/app.js", Some("\"0\"")).await;
        assert_eq!(stale.status(), StatusCode::OK);
    }

    #[tokio::test]
    async fn an_unknown_file_is_not_found() {
        assert_eq!(
            get("/console/secret.txt", None).await.status(),
            StatusCode::NOT_FOUND
        );
        assert_eq!(
            get("/console/..%2FCargo.toml", None).await.status(),
            StatusCode::NOT_FOUND
        );
    }

    #[test]
    fn every_module_the_page_imports_is_embedded() {
        let names: Vec<_> = asset_names().collect();
        for asset in ASSETS {
            let text = std::str::from_utf8(asset.body).unwrap();
            for quoted in text.split(['"', '\'']).filter(|s| s.starts_with("./")) {
                let wanted = quoted.trim_start_matches("./");
                assert!(
                    names.contains(&wanted),
                    "{} refers to {wanted}, which is not embedded",
                    asset.name
                );
            }
        }
    }
}
