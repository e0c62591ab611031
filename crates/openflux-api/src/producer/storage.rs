//! Artifact storage on local disk and the HTTP server that serves it.
//!
//! Layout: `<root>/<namespace>/<name>/<digest-hex>.tar.gz` (content
//! addressed: one file per distinct artifact of a source), written through
//! a temporary file and a rename so a reader never sees a partial file. The
//! server answers `GET /<namespace>/<name>/<digest-hex>.tar.gz` with the
//! digest as ETag; URLs are advertised under an address of the caller's
//! choosing (Flux's `--storage-adv-addr`), as Flux's source-controller does.
//! Superseded files are kept by Flux's rules ([`Retention`]).

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use axum::extract::{Path as UrlPath, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use super::archive::Packed;

/// Where artifacts live and how they are addressed.
#[derive(Debug, Clone)]
pub struct Storage {
    root: PathBuf,
    /// `host[:port]` URLs are advertised under.
    adv_addr: String,
    /// `http`, or `https` when the server is served over TLS.
    scheme: &'static str,
}

/// Suffix of artifact files.
const SUFFIX: &str = ".tar.gz";
/// Prefix of temporary files (never served, removed by garbage collection).
const TMP_PREFIX: &str = ".tmp-";

static TMP_COUNTER: AtomicU64 = AtomicU64::new(0);

impl Storage {
    pub fn new(root: impl Into<PathBuf>, adv_addr: impl Into<String>) -> Self {
        Storage {
            root: root.into(),
            adv_addr: adv_addr.into(),
            scheme: "http",
        }
    }

    /// The same storage, its URLs advertised as `https` (the server is
    /// served over TLS, e.g. SPIFFE mTLS).
    pub fn https(mut self) -> Self {
        self.scheme = "https";
        self
    }

    /// The storage-relative path of an artifact.
    pub fn relative_path(namespace: &str, name: &str, hex: &str) -> String {
        format!("{namespace}/{name}/{hex}{SUFFIX}")
    }

    /// The advertised URL of a storage-relative path.
    pub fn url(&self, relative: &str) -> String {
        format!("{}://{}/{relative}", self.scheme, self.adv_addr)
    }

    fn absolute(&self, relative: &str) -> PathBuf {
        self.root.join(relative)
    }

    /// Whether the file of a storage-relative path exists.
    pub async fn exists(&self, relative: &str) -> bool {
        tokio::fs::metadata(self.absolute(relative))
            .await
            .is_ok_and(|m| m.is_file())
    }

    /// Writes an artifact atomically. Content-addressed: an existing file of
    /// the same path already holds these bytes and is only touched, so its
    /// age counts from its latest use.
    pub async fn store(&self, relative: &str, bytes: &[u8]) -> io::Result<()> {
        let path = self.absolute(relative);
        let dir = path
            .parent()
            .ok_or_else(|| io::Error::other("artifact path has no directory"))?;
        tokio::fs::create_dir_all(dir).await?;
        if tokio::fs::metadata(&path)
            .await
            .is_ok_and(|m| m.len() == bytes.len() as u64)
        {
            let file = std::fs::File::options().append(true).open(&path)?;
            file.set_modified(SystemTime::now())?;
            return Ok(());
        }
        let tmp = dir.join(format!(
            "{TMP_PREFIX}{}-{}",
            std::process::id(),
            TMP_COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let written = async {
            tokio::fs::write(&tmp, bytes).await?;
            tokio::fs::File::open(&tmp).await?.sync_all().await?;
            tokio::fs::rename(&tmp, &path).await
        }
        .await;
        if written.is_err() {
            let _ = tokio::fs::remove_file(&tmp).await;
        }
        written
    }

    /// Stores a packed artifact of source `namespace`/`name` under its
    /// digest and returns its storage-relative path.
    pub async fn store_packed(
        &self,
        namespace: &str,
        name: &str,
        packed: &Packed,
    ) -> io::Result<String> {
        let relative = Self::relative_path(namespace, name, packed.hex());
        self.store(&relative, &packed.bytes).await?;
        Ok(relative)
    }

    /// Removes old files of one source (see [`gc_plan`]); returns how many.
    pub async fn collect_garbage(
        &self,
        namespace: &str,
        name: &str,
        current: Option<&str>,
        retention: Retention,
    ) -> io::Result<usize> {
        let dir = self.root.join(namespace).join(name);
        let files = list_files(&dir).await?;
        let current = current.and_then(|c| c.rsplit('/').next());
        let doomed = gc_plan(&files, current, SystemTime::now(), retention);
        for file in &doomed {
            tokio::fs::remove_file(dir.join(file)).await?;
        }
        Ok(doomed.len())
    }

    /// The `(namespace, name)` directories in storage.
    pub async fn sources(&self) -> io::Result<Vec<(String, String)>> {
        let mut out = Vec::new();
        for namespace in list_dirs(&self.root).await? {
            for name in list_dirs(&self.root.join(&namespace)).await? {
                out.push((namespace.clone(), name));
            }
        }
        Ok(out)
    }

    /// Removes everything stored for a source that no longer exists.
    pub async fn remove_source(&self, namespace: &str, name: &str) -> io::Result<()> {
        let ns_dir = self.root.join(namespace);
        tokio::fs::remove_dir_all(ns_dir.join(name)).await?;
        // Drop the namespace directory when it became empty; fine if not.
        let _ = tokio::fs::remove_dir(ns_dir).await;
        Ok(())
    }

    /// The router of the artifact server: every artifact file in storage,
    /// as a regular file (never a directory, never through a link).
    pub fn router(&self) -> Router {
        self.router_serving(|_: &str, _: &str, _: &str| true)
    }

    /// [`Self::router`] serving only the artifacts `allowed(namespace,
    /// name, file)` admits (the ones the caller keeps a record of, say);
    /// anything else is a 404, as a file that is not there.
    pub fn router_serving<F>(&self, allowed: F) -> Router
    where
        F: Fn(&str, &str, &str) -> bool + Send + Sync + 'static,
    {
        let served = Served {
            root: self.root.clone(),
            allowed: std::sync::Arc::new(allowed),
        };
        Router::new()
            .route("/{namespace}/{name}/{file}", get(serve))
            .fallback(|| async { StatusCode::NOT_FOUND })
            .with_state(served)
    }
}

async fn list_files(dir: &Path) -> io::Result<Vec<(String, SystemTime)>> {
    let mut out = Vec::new();
    let mut entries = match tokio::fs::read_dir(dir).await {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(e),
    };
    while let Some(entry) = entries.next_entry().await? {
        let meta = entry.metadata().await?;
        if meta.is_file() {
            if let Some(name) = entry.file_name().to_str() {
                out.push((name.to_string(), meta.modified()?));
            }
        }
    }
    Ok(out)
}

async fn list_dirs(dir: &Path) -> io::Result<Vec<String>> {
    let mut out = Vec::new();
    let mut entries = match tokio::fs::read_dir(dir).await {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(e),
    };
    while let Some(entry) = entries.next_entry().await? {
        if entry.file_type().await?.is_dir() {
            if let Some(name) = entry.file_name().to_str() {
                out.push(name.to_string());
            }
        }
    }
    Ok(out)
}

/// How long and how many superseded artifacts are kept (Flux's
/// `--artifact-retention-ttl` and `--artifact-retention-records`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    pub ttl: Duration,
    /// Artifacts kept per source, the current one included.
    pub records: usize,
}

/// The files of one source's directory to delete: never the current one;
/// of the others, those beyond the newest `records - 1` and those older
/// than the TTL. Temporary files go once older than the TTL.
pub fn gc_plan(
    files: &[(String, SystemTime)],
    current: Option<&str>,
    now: SystemTime,
    retention: Retention,
) -> Vec<String> {
    let expired = |t: &SystemTime| now.duration_since(*t).unwrap_or_default() > retention.ttl;
    let mut doomed = Vec::new();
    let mut older: Vec<&(String, SystemTime)> = Vec::new();
    for file in files {
        let (name, modified) = file;
        if Some(name.as_str()) == current {
            continue;
        }
        if name.starts_with(TMP_PREFIX) || !name.ends_with(SUFFIX) {
            if expired(modified) {
                doomed.push(name.clone());
            }
            continue;
        }
        older.push(file);
    }
    older.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    let keep = retention.records.saturating_sub(1);
    for (i, (name, modified)) in older.into_iter().enumerate() {
        if i >= keep || expired(modified) {
            doomed.push(name.clone());
        }
    }
    doomed.sort();
    doomed
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

/// Whether the server may serve `(namespace, name, file)`.
type Allowed = dyn Fn(&str, &str, &str) -> bool + Send + Sync;

/// What the artifact server serves.
#[derive(Clone)]
struct Served {
    root: PathBuf,
    allowed: std::sync::Arc<Allowed>,
}

/// `<namespace>/<name>/<file>` of a storage-relative artifact path, when
/// it is one: namespace and name as Kubernetes names them, the file
/// `<64 hex>.tar.gz`.
pub fn artifact_path(relative: &str) -> Option<(&str, &str, &str)> {
    let mut parts = relative.splitn(3, '/');
    let (namespace, name, file) = (parts.next()?, parts.next()?, parts.next()?);
    (is_object_name(namespace) && is_object_name(name) && is_artifact_file(file))
        .then_some((namespace, name, file))
}

async fn serve(
    State(served): State<Served>,
    UrlPath((namespace, name, file)): UrlPath<(String, String, String)>,
) -> Response {
    let relative = format!("{namespace}/{name}/{file}");
    if artifact_path(&relative).is_none() || !(served.allowed)(&namespace, &name, &file) {
        return StatusCode::NOT_FOUND.into_response();
    }
    let path = served.root.join(&relative);
    // A regular file only, and no link on the way: a link in storage may
    // point anywhere on the disk.
    let mut at = served.root.clone();
    for part in [&namespace, &name, &file] {
        at.push(part);
        let last = part == &file;
        let fine = tokio::fs::symlink_metadata(&at).await.is_ok_and(|m| {
            let kind = m.file_type();
            if last {
                kind.is_file()
            } else {
                kind.is_dir()
            }
        });
        if !fine {
            return StatusCode::NOT_FOUND.into_response();
        }
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

    const HEX_A: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";

    fn file(hex_char: char, age_secs: u64, now: SystemTime) -> (String, SystemTime) {
        (
            format!("{}{SUFFIX}", hex_char.to_string().repeat(64)),
            now - Duration::from_secs(age_secs),
        )
    }

    #[test]
    fn gc_keeps_the_current_and_the_newest_records_within_the_ttl() {
        let now = SystemTime::now();
        let retention = Retention {
            ttl: Duration::from_secs(60),
            records: 2,
        };
        let files = vec![
            file('a', 500, now), // current, however old
            file('b', 10, now),  // newest superseded: kept
            file('c', 20, now),  // beyond the records
            file('d', 100, now), // expired
        ];
        let current = format!("{HEX_A}{SUFFIX}");
        let doomed = gc_plan(&files, Some(&current), now, retention);
        assert_eq!(doomed, [files[2].0.clone(), files[3].0.clone()]);

        // Expired even when within the records.
        let files = vec![file('a', 0, now), file('b', 61, now)];
        assert_eq!(
            gc_plan(&files, Some(&current), now, retention),
            [files[1].0.clone()]
        );
        // records = 1 keeps only the current one.
        let one = Retention {
            records: 1,
            ..retention
        };
        let files = vec![file('a', 0, now), file('b', 1, now)];
        assert_eq!(
            gc_plan(&files, Some(&current), now, one),
            [files[1].0.clone()]
        );
    }

    #[test]
    fn gc_removes_stale_temporary_files_only() {
        let now = SystemTime::now();
        let retention = Retention {
            ttl: Duration::from_secs(60),
            records: 2,
        };
        let files = vec![
            (".tmp-1-0".to_string(), now - Duration::from_secs(5)),
            (".tmp-1-1".to_string(), now - Duration::from_secs(120)),
        ];
        assert_eq!(gc_plan(&files, None, now, retention), [".tmp-1-1"]);
    }

    #[test]
    fn serves_only_artifact_shaped_paths() {
        assert!(is_object_name("team-a"));
        assert!(is_object_name("a.b"));
        assert!(!is_object_name(".."));
        assert!(!is_object_name("A"));
        assert!(!is_object_name(""));
        assert!(is_artifact_file(&format!("{HEX_A}.tar.gz")));
        assert!(!is_artifact_file("x.tar.gz"));
        assert!(!is_artifact_file(&format!("{HEX_A}.tar")));
    }

    #[tokio::test]
    async fn stores_atomically_and_collects() {
        let dir = tempfile::tempdir().unwrap();
        let storage = Storage::new(dir.path(), "localhost:9090");
        let rel = Storage::relative_path("ns", "src", HEX_A);
        assert_eq!(
            storage.url(&rel),
            format!("http://localhost:9090/ns/src/{HEX_A}.tar.gz")
        );
        assert_eq!(
            storage.clone().https().url(&rel),
            format!("https://localhost:9090/ns/src/{HEX_A}.tar.gz"),
            "served over TLS, the URLs are https"
        );
        assert!(!storage.exists(&rel).await);
        storage.store(&rel, b"bytes").await.unwrap();
        storage.store(&rel, b"bytes").await.unwrap();
        assert!(storage.exists(&rel).await);
        let names: Vec<_> = std::fs::read_dir(dir.path().join("ns/src"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names, [format!("{HEX_A}.tar.gz")]);
        assert_eq!(
            storage.sources().await.unwrap(),
            [("ns".to_string(), "src".to_string())]
        );
        let packed = crate::producer::pack(&[]).unwrap();
        let other = storage.store_packed("ns", "src", &packed).await.unwrap();
        assert_eq!(other, format!("ns/src/{}.tar.gz", packed.hex()));
        assert_eq!(
            std::fs::read(dir.path().join(&other)).unwrap(),
            packed.bytes
        );
        storage.remove_source("ns", "src").await.unwrap();
        assert!(storage.sources().await.unwrap().is_empty());
    }

    /// The status of a raw `GET path` (sent exactly as written) to `router`.
    async fn get_status(router: Router, path: &str) -> u16 {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move { axum::serve(listener, router).await });
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let request = format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n");
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut response = Vec::new();
        stream.read_to_end(&mut response).await.unwrap();
        server.abort();
        String::from_utf8_lossy(&response)
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap()
    }

    /// A link in storage, to a file or as a source's directory, is never
    /// followed: it may point anywhere on the disk. Nor is what the
    /// caller's filter leaves out served.
    #[cfg(unix)]
    #[tokio::test]
    async fn the_server_serves_regular_files_only_and_follows_no_link() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let secret = outside.path().join("secret");
        std::fs::write(&secret, b"not an artifact").unwrap();
        std::fs::create_dir_all(outside.path().join("app")).unwrap();
        std::fs::write(
            outside.path().join("app").join(format!("{HEX_A}.tar.gz")),
            b"x",
        )
        .unwrap();
        let storage = Storage::new(dir.path(), "localhost:9090");
        storage
            .store(&Storage::relative_path("ns", "app", HEX_A), b"artifact")
            .await
            .unwrap();
        let hex_b = "b".repeat(64);
        let linked_file = dir.path().join("ns/app").join(format!("{hex_b}.tar.gz"));
        std::os::unix::fs::symlink(&secret, linked_file).unwrap();
        std::os::unix::fs::symlink(outside.path().join("app"), dir.path().join("ns/linked"))
            .unwrap();

        let everything = storage.router();
        assert_eq!(
            get_status(everything.clone(), &format!("/ns/app/{HEX_A}.tar.gz")).await,
            200
        );
        for path in [
            format!("/ns/app/{hex_b}.tar.gz"),
            format!("/ns/linked/{HEX_A}.tar.gz"),
            "/ns/app/".to_string(),
            "/ns".to_string(),
        ] {
            assert_eq!(get_status(everything.clone(), &path).await, 404, "{path}");
        }
        let none = storage.router_serving(|_: &str, name: &str, _: &str| name != "app");
        assert_eq!(
            get_status(none, &format!("/ns/app/{HEX_A}.tar.gz")).await,
            404
        );
    }
}
