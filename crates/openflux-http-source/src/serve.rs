//! The artifact server: serves the artifacts this controller published for
//! live HttpSources, and nothing else.
//!
//! A file is served only when it is in the [`Catalog`] (the artifacts
//! stored, or found in storage as a source's published one, by this
//! process) and is still a regular file in storage, reached through no
//! link (the producer kit's server, [`Storage::router_serving`]):
//! superseded artifacts stay downloadable while retention keeps them, a
//! deleted source's artifacts are gone at once, and temporary files, other
//! files and directories are never served or listed. Anything else is a
//! 404.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, RwLock};

use axum::Router;
use openflux_api::producer::storage::artifact_path;
use openflux_api::producer::Storage;

/// The artifacts that may be served, by source.
#[derive(Debug, Default)]
pub struct Catalog(RwLock<HashMap<(String, String), BTreeSet<String>>>);

impl Catalog {
    /// Adds an artifact by its storage path, `<namespace>/<name>/<file>`.
    pub fn add(&self, relative: &str) {
        let Some((namespace, name, file)) = artifact_path(relative) else {
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

/// The router of the artifact server over `storage`, serving what
/// `catalog` holds.
pub fn router(storage: &Storage, catalog: Arc<Catalog>) -> Router {
    storage.router_serving(move |namespace, name, file| catalog.contains(namespace, name, file))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    /// Suffix of artifact files.
    const SUFFIX: &str = ".tar.gz";

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
            let storage = Storage::new(root, "unused:80");
            let _ = axum::serve(listener, router(&storage, catalog)).await;
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
