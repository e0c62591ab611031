//! Releases of openflux for the nodes cell's tests: this tree's release
//! bundle (`make release`, then `make publish` to the cell's registry), the
//! previous release's bundle, made the same way by its own tools from its
//! commit (`OPENFLUX_PREVIOUS_RELEASE` in e2e/versions.env), and this
//! build's image alone, pushed by digest.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use crate::nodes::registry;
use crate::{workspace_root, Env};

/// `OPENFLUX_PREVIOUS_RELEASE` of e2e/versions.env.
pub fn previous_commit() -> String {
    let path = workspace_root().join("e2e/versions.env");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    text.lines()
        .find_map(|l| l.strip_prefix("OPENFLUX_PREVIOUS_RELEASE="))
        .map(|c| c.trim().to_string())
        .filter(|c| c.len() == 40 && c.chars().all(|ch| ch.is_ascii_hexdigit()))
        .unwrap_or_else(|| {
            panic!(
                "{} names no OPENFLUX_PREVIOUS_RELEASE=<40-hex commit>",
                path.display()
            )
        })
}

fn run(what: &str, command: &mut Command) -> Vec<u8> {
    run_output(what, command).stdout
}

/// Runs `command`, which must succeed: its stdout and stderr.
fn run_output(what: &str, command: &mut Command) -> std::process::Output {
    let out = command
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| workspace_root().join("target"), PathBuf::from)
}

/// This build's images (`images/build`, as `make images` builds them: a
/// no-op when they are fresh), openflux pushed as `openflux:current`: its
/// reference by digest.
pub fn current_image(env: &Env) -> String {
    let root = workspace_root();
    let work = tempfile::tempdir().expect("a temp dir");
    let out = work.path().join("images");
    run(
        "images/build",
        crate::openflux::without_test_env(&mut Command::new(root.join("images/build")))
            .current_dir(&root)
            .env("IMAGES_OUT", &out),
    );
    let digest_file = work.path().join("openflux.digest");
    let registry = registry(env);
    run(
        "skopeo copy",
        Command::new("skopeo")
            .arg("copy")
            .arg("--digestfile")
            .arg(&digest_file)
            .arg(format!(
                "oci-archive:{}",
                out.join("openflux.oci.tar").display()
            ))
            .arg(format!("docker://{registry}/openflux:current")),
    );
    let digest = std::fs::read_to_string(&digest_file).expect("skopeo's digest file");
    format!("{registry}/openflux@{}", digest.trim())
}

/// A release published to the nodes cell's registry.
pub struct Bundle {
    /// The tree it was released from (its docs included).
    pub tree: PathBuf,
    /// Its workspace's version, the release's.
    pub version: String,
    /// Where it is published: `<cell registry>/release`.
    pub registry: String,
    /// `target/dist/<version>`: install.yaml, cosign.pub, SHA256SUMS...
    pub dir: PathBuf,
    /// The helm `make release` built (from its Go module).
    pub helm: PathBuf,
    /// The commit it was released from, as `make release` said (and as
    /// its binaries' `--version` says).
    pub commit: String,
    /// The public key of the tests' own signing key, which stands in for
    /// the project's (`cosign.pub` at the repository's root) in a test
    /// build (`TEST_BUILD=1`): the throwaway key `make release` made for
    /// it. None for an unsigned bundle.
    pub test_key: Option<PathBuf>,
}

/// The cosign that `make release` builds (from its Go module).
pub fn cosign() -> PathBuf {
    let cosign = run(
        "release/tools bin cosign",
        Command::new(workspace_root().join("release/tools")).args(["bin", "cosign"]),
    );
    PathBuf::from(String::from_utf8_lossy(&cosign).trim())
}

/// The version in the workspace's Cargo.toml.
pub fn workspace_version() -> String {
    version_of(&workspace_root())
}

/// The version in the Cargo.toml of the workspace at `tree`.
fn version_of(tree: &Path) -> String {
    let path = tree.join("Cargo.toml");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    text.lines()
        .find_map(|l| l.strip_prefix("version = \""))
        .and_then(|v| v.strip_suffix('"'))
        .unwrap_or_else(|| panic!("{} names no version", path.display()))
        .to_string()
}

/// The helm that `make release` builds (from its Go module).
fn helm() -> PathBuf {
    let helm = run(
        "release/tools bin helm",
        Command::new(workspace_root().join("release/tools")).args(["bin", "helm"]),
    );
    PathBuf::from(String::from_utf8_lossy(&helm).trim())
}

/// Runs `release/release`, then `release/publish` (PLAIN_HTTP=1), of
/// `tree` to `registry`, each with the environment `env` adds.
fn release_and_publish(tree: &Path, registry: &str, env: &[(&str, &OsStr)]) -> Bundle {
    let version = version_of(tree);
    let mut release = Command::new(tree.join("release/release"));
    crate::openflux::without_test_env(&mut release)
        .args([&version, registry])
        .current_dir(tree);
    let mut publish = Command::new(tree.join("release/publish"));
    publish
        .args([&version, registry])
        .current_dir(tree)
        .env("PLAIN_HTTP", "1");
    for (name, value) in env {
        release.env(name, value);
        publish.env(name, value);
    }
    let out = run_output(
        &format!("{}/release/release (make release)", tree.display()),
        &mut release,
    );
    println!(
        "make release: {}",
        String::from_utf8_lossy(&out.stdout).trim()
    );
    let commit = released_commit(&version, &String::from_utf8_lossy(&out.stderr));
    run(
        &format!("{}/release/publish (make publish)", tree.display()),
        &mut publish,
    );
    let target = env
        .iter()
        .find(|(name, _)| *name == "CARGO_TARGET_DIR")
        .map_or_else(target_dir, |(_, dir)| PathBuf::from(dir));
    let test_key = target.join("release-keys/test/cosign.pub");
    let test_build = env
        .iter()
        .any(|(name, value)| *name == "TEST_BUILD" && *value == "1");
    let signed = !env
        .iter()
        .any(|(name, value)| *name == "SIGN" && *value == "0");
    Bundle {
        tree: tree.to_path_buf(),
        dir: target.join("dist").join(&version),
        version,
        registry: registry.to_string(),
        helm: helm(),
        commit,
        test_key: (test_build && signed).then(|| {
            assert!(
                test_key.exists(),
                "a test build signed without COSIGN_KEY leaves its key in {}",
                test_key.display()
            );
            test_key
        }),
    }
}

/// The commit `make release` of `version` said it released, from its log
/// ("openflux X.Y.Z, commit <sha>, SOURCE_DATE_EPOCH ...").
fn released_commit(version: &str, log: &str) -> String {
    let said = format!("openflux {version}, commit ");
    log.lines()
        .find_map(|l| l.split_once(&said))
        .and_then(|(_, rest)| rest.split(',').next())
        .filter(|c| c.len() == 40 && c.chars().all(|ch| ch.is_ascii_hexdigit()))
        .unwrap_or_else(|| panic!("make release named no commit:\n{log}"))
        .to_string()
}

static BUNDLE: OnceLock<Bundle> = OnceLock::new();

/// This tree released as `make release` does and pushed as `make publish`
/// does to the cell's registry (plain HTTP), once per test process:
/// signed, with install.yaml, the chart and the manifests artifact, all
/// naming the images by digest, each image an index of linux/amd64 and
/// linux/arm64, SHA256SUMS and its signature. Three differences from a
/// release, all said by `make release`: a test build (`TEST_BUILD=1`),
/// signed with the tests' own throwaway key instead of the project's
/// (whose private half is a secret of the release workflow), so its
/// `cosign.pub` is that key's ([`Bundle::test_key`]); a tree with
/// uncommitted changes is allowed (`ALLOW_DIRTY=1`); and the arm64
/// binaries are built without the release profile's optimisation
/// (`QUICK_CROSS=1`: a debug build's time, not the 17 minutes of an
/// optimised cross build); release/release still checks that they are
/// aarch64 and runs their `--version` under qemu. This machine's binaries
/// are the ones `make images` built.
pub fn published_bundle(env: &Env) -> &'static Bundle {
    BUNDLE.get_or_init(|| {
        let registry = format!("{}/release", registry(env));
        release_and_publish(
            &workspace_root(),
            &registry,
            &[
                ("TEST_BUILD", OsStr::new("1")),
                ("ALLOW_DIRTY", OsStr::new("1")),
                ("QUICK_CROSS", OsStr::new("1")),
            ],
        )
    })
}

/// The platforms (`os/architecture`) of the image index `reference`
/// (`<registry>/<name>@sha256:...`) as the registry serves it, sorted;
/// panics when it is not an image index.
pub fn index_platforms(reference: &str) -> Vec<String> {
    let raw = run(
        &format!("skopeo inspect --raw {reference}"),
        Command::new("skopeo")
            .args(["inspect", "--raw", "--tls-verify=false"])
            .arg(format!("docker://{reference}")),
    );
    let index: serde_json::Value =
        serde_json::from_slice(&raw).unwrap_or_else(|e| panic!("{reference} is not JSON: {e}"));
    assert_eq!(
        index["mediaType"], "application/vnd.oci.image.index.v1+json",
        "{reference} is not an OCI image index: {index}"
    );
    let mut platforms: Vec<String> = index["manifests"]
        .as_array()
        .unwrap_or_else(|| panic!("{reference} lists no manifests: {index}"))
        .iter()
        .filter_map(|m| {
            let p = &m["platform"];
            Some(format!(
                "{}/{}",
                p["os"].as_str()?,
                p["architecture"].as_str()?
            ))
        })
        .collect();
    platforms.sort();
    platforms
}

static PREVIOUS: OnceLock<Bundle> = OnceLock::new();

/// A clone of this repository checked out at `commit` (40 hex digits),
/// in `base`, named by the commit's first 12 digits; made once, then kept.
pub fn checkout_at(commit: &str, base: &Path) -> PathBuf {
    let tree = base.join(&commit[..12]);
    if !tree.join(".git").exists() {
        // Cloned and checked out aside, then moved in whole: a run cut
        // short leaves no half tree to build from.
        std::fs::create_dir_all(base)
            .unwrap_or_else(|e| panic!("creating {}: {e}", base.display()));
        let aside = base.join(format!(".{}.{}", &commit[..12], std::process::id()));
        let _ = std::fs::remove_dir_all(&aside);
        run(
            "git clone of this repository",
            Command::new("git")
                .args(["clone", "--quiet", "--no-checkout"])
                .arg(workspace_root())
                .arg(&aside),
        );
        run(
            &format!("git checkout of {commit} (a clone with full history is needed)"),
            Command::new("git")
                .arg("-C")
                .arg(&aside)
                .args(["checkout", "--quiet", "--detach", commit]),
        );
        std::fs::rename(&aside, &tree)
            .unwrap_or_else(|e| panic!("moving {} to {}: {e}", aside.display(), tree.display()));
    }
    tree
}

/// Where builds of fixed inputs stay between runs and clones: the e2e
/// build cache of e2e/cluster (`OPENFLUX_E2E_CACHE`, by default
/// `${XDG_CACHE_HOME:-$HOME/.cache}/openflux-e2e`).
pub fn cache_root() -> PathBuf {
    if let Some(dir) = std::env::var_os("OPENFLUX_E2E_CACHE") {
        return PathBuf::from(dir);
    }
    let cache = std::env::var_os("XDG_CACHE_HOME").map_or_else(
        || {
            let home = std::env::var_os("HOME").unwrap_or_else(|| "/tmp".into());
            PathBuf::from(home).join(".cache")
        },
        PathBuf::from,
    );
    cache.join("openflux-e2e")
}

/// The previous release (`OPENFLUX_PREVIOUS_RELEASE`), made by its own
/// `make release` in a clone at its commit and pushed by its own `make
/// publish` to `<cell registry>/previous`, once per test process, by
/// e2e/previous-release (which says how it differs from the shipped one:
/// nothing it installs). Its clone and target dir stay in the e2e build
/// cache, and `make test` builds it beside the tests, so this mostly
/// packages and pushes.
pub fn previous_bundle(env: &Env) -> &'static Bundle {
    PREVIOUS.get_or_init(|| {
        let registry = format!("{}/previous", registry(env));
        let mut script = Command::new(workspace_root().join("e2e/previous-release"));
        crate::openflux::without_test_env(&mut script).args([registry.as_str(), "--publish"]);
        let out = run_output(
            "e2e/previous-release (its make release and make publish)",
            &mut script,
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        let mut lines = stdout.lines();
        let (Some(tree), Some(dir)) = (lines.next(), lines.next()) else {
            panic!("e2e/previous-release printed no clone and bundle directory: {stdout}");
        };
        let tree = PathBuf::from(tree);
        let version = version_of(&tree);
        let commit = released_commit(&version, &String::from_utf8_lossy(&out.stderr));
        Bundle {
            dir: PathBuf::from(dir),
            tree,
            version,
            registry,
            helm: helm(),
            commit,
            test_key: None,
        }
    })
}
