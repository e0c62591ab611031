//! The artifact server: serves the artifacts this controller published for
//! live HttpSources, and nothing else.
//!
//! A file is served only when it is in the [`Catalog`] (the artifacts
//! stored, or found in storage as a source's published one, by this
//! process) and is still a regular file in storage: superseded artifacts
//! stay downloadable while retention keeps them, a deleted source's
//! artifacts are gone at once, and temporary files, other files and
//! directories are never served or listed. Anything else is a 404.

use std::collections::{BTreeSet, HashMap};
use std::io;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use axum::extract::{Path as UrlPath, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

/// Suffix of artifact files.
const SUFFIX: &str = ".tar.gz";

/// The artifacts that may be served, by source.
#[derive(Debug, Default)]
pub struct Catalog(RwLock<HashMap<(String, String), BTreeSet<String>>>);

impl Catalog {
    /// Adds an artifact by its storage path, `<namespace>/<name>/<file>`.
    pub fn add(&self, relative: &str) {
        let Some((namespace, name, file)) = split(relative) else {
            return;
        };
        let mut map = self.0.write().unwrap_or_else(|e| e.into_inner());
        map.entry((namespace.to_string(), name.to_string()))
            .or_default()
            .insert(file.to_string());
    }

    pub fn contains(&self, namespace: &str, name: &str, file: &str) -> bool {
        let map = self.0.read().unwrap_or_else(|e| e.into_inner());
        map.get(&(namespace.to_string(), name.to_string()))
            .is_some_and(|files| files.contains(file))
    }

    /// Forgets a source (it was deleted).
    pub fn remove_source(&self, namespace: &str, name: &str) {
        let mut map = self.0.write().unwrap_or_else(|e| e.into_inner());
        map.remove(&(namespace.to_string(), name.to_string()));
    }

    /// Keeps the sources `live` says exist, and of their files those
    /// `exists` says are still stored.
    pub fn retain(&self, live: impl Fn(&str, &str) -> bool, exists: impl Fn(&str) -> bool) {
        let mut map = self.0.write().unwrap_or_else(|e| e.into_inner());
        map.retain(|(namespace, name), files| {
            files.retain(|f| exists(&format!("{namespace}/{name}/{f}")));
            live(namespace, name) && !files.is_empty()
        });
    }
}

fn split(relative: &str) -> Option<(&str, &str, &str)> {
    let mut parts = relative.splitn(3, '/');
    let (namespace, name, file) = (parts.next()?, parts.next()?, parts.next()?);
    (is_object_name(namespace) && is_object_name(name) && is_artifact_file(file))
        .then_some((namespace, name, file))
}

/// A DNS-1123 subdomain, as namespaces and object names are.
fn is_object_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && s.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
        && s.bytes().last().is_some_and(|b| b.is_ascii_alphanumeric())
}

/// `<64 hex>.tar.gz`
fn is_artifact_file(s: &str) -> bool {
    s.strip_suffix(SUFFIX).is_some_and(|hex| {
        hex.len() == 64
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

#[derive(Clone)]
struct Served {
    root: PathBuf,
    catalog: Arc<Catalog>,
}

/// The router of the artifact server over the storage at `root`.
pub fn router(root: PathBuf, catalog: Arc<Catalog>) -> Router {
    Router::new()
        .route("/{namespace}/{name}/{file}", get(serve))
        .fallback(|| async { StatusCode::NOT_FOUND })
        .with_state(Served { root, catalog })
}

async fn serve(
    State(served): State<Served>,
    UrlPath((namespace, name, file)): UrlPath<(String, String, String)>,
) -> Response {
    let relative = format!("{namespace}/{name}/{file}");
    if split(&relative).is_none() || !served.catalog.contains(&namespace, &name, &file) {
        return StatusCode::NOT_FOUND.into_response();
    }
    let path = served.root.join(&namespace).join(&name).join(&file);
    // A regular file only: never a directory, never through a link.
    let regular = tokio::fs::symlink_metadata(&path)
        .await
        .is_ok_and(|m| m.file_type().is_file());
    if !regular {
        return StatusCode::NOT_FOUND.into_response();
    }
    match tokio::fs::read(&path).await {
        Ok(bytes) => {
            let etag = format!("\"{}\"", file.trim_end_matches(SUFFIX));
            (
                [
                    (header::CONTENT_TYPE, "application/gzip".to_string()),
                    (header::ETAG, etag),
                ],
                bytes,
            )
                .into_response()
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => StatusCode::NOT_FOUND.into_response(),
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "cannot read artifact");
            StatusCode::INTERNAL_SERVER_ERROR.into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    const B: &str = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";

    fn file(hex: &str) -> String {
        format!("{hex}{SUFFIX}")
    }

    /// Serves `root` on a loopback port; returns its base URL.
    async fn start(root: PathBuf, catalog: Arc<Catalog>) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let _ = axum::serve(listener, router(root, catalog)).await;
        });
        format!("http://{addr}")
    }

    /// A raw GET (the path is sent exactly as written): status, head, body.
    async fn get(base: &str, path: &str) -> (u16, String, Vec<u8>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let addr = base.trim_start_matches("http://");
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let request = format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n");
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut response = Vec::new();
        stream.read_to_end(&mut response).await.unwrap();
        let split = response.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
        let head = String::from_utf8_lossy(&response[..split]).to_ascii_lowercase();
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap();
        (status, head, response[split + 4..].to_vec())
    }

    async fn status(base: &str, path: &str) -> u16 {
        get(base, path).await.0
    }

    #[test]
    fn the_catalog_holds_artifact_paths_only() {
        let c = Catalog::default();
        c.add(&format!("ns/app/{}", file(A)));
        c.add("ns/app/.tmp-1-2");
        c.add(&format!("ns/app/../{}", file(B)));
        c.add(&format!("../app/{}", file(B)));
        assert!(c.contains("ns", "app", &file(A)));
        assert!(!c.contains("ns", "app", ".tmp-1-2"));
        assert!(!c.contains("ns", "app", &file(B)));
        c.retain(|_, _| true, |p| p.ends_with(&file(B)));
        assert!(
            !c.contains("ns", "app", &file(A)),
            "a removed file is forgotten"
        );
        c.add(&format!("ns/app/{}", file(A)));
        c.retain(|_, _| false, |_| true);
        assert!(
            !c.contains("ns", "app", &file(A)),
            "a deleted source is forgotten"
        );
    }

    /// Only catalogued, stored artifacts are served; directories, other
    /// files, unknown sources and paths outside the layout are 404s.
    #[tokio::test]
    async fn serves_only_current_artifacts_and_never_lists() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_path_buf();
        let source = root.join("ns").join("app");
        std::fs::create_dir_all(&source).unwrap();
        std::fs::write(source.join(file(A)), b"current").unwrap();
        std::fs::write(source.join(file(B)), b"not published by this process").unwrap();
        std::fs::write(source.join(".tmp-1-0"), b"partial").unwrap();
        std::fs::create_dir_all(
            root.join("ns")
                .join("app")
                .join(format!("{}.tar.gz", "c".repeat(64))),
        )
        .unwrap();
        let other = root.join("ns").join("gone");
        std::fs::create_dir_all(&other).unwrap();
        std::fs::write(other.join(file(A)), b"of a deleted source").unwrap();
        #[cfg(unix)]
        std::os::unix::fs::symlink("/etc/hostname", source.join(file(&"d".repeat(64)))).unwrap();

        let catalog = Arc::new(Catalog::default());
        catalog.add(&format!("ns/app/{}", file(A)));
        catalog.add(&format!("ns/app/{}.tar.gz", "c".repeat(64)));
        catalog.add(&format!("ns/app/{}.tar.gz", "d".repeat(64)));
        let base = start(root.clone(), catalog.clone()).await;

        let (status_code, head, body) = get(&base, &format!("/ns/app/{}", file(A))).await;
        assert_eq!(status_code, 200);
        assert!(head.contains(&format!("etag: \"{A}\"")), "{head}");
        assert_eq!(body, b"current");

        for path in [
            "/".to_string(),
            "/ns".to_string(),
            "/ns/".to_string(),
            "/ns/app".to_string(),
            "/ns/app/".to_string(),
            format!("/ns/app/{}", file(B)),
            "/ns/app/.tmp-1-0".to_string(),
            format!("/ns/app/{}.tar.gz", "c".repeat(64)),
            format!("/ns/app/{}.tar.gz", "d".repeat(64)),
            format!("/ns/gone/{}", file(A)),
            format!("/ns/app/..%2F..%2Fgone%2F{}", file(A)),
            format!("/ns/app/../gone/{}", file(A)),
            format!("/NS/app/{}", file(A)),
        ] {
            assert_eq!(status(&base, &path).await, 404, "{path}");
        }

        // The source is deleted: its artifact is gone at once.
        catalog.remove_source("ns", "app");
        assert_eq!(status(&base, &format!("/ns/app/{}", file(A))).await, 404);
    }
}
