//! Releases of openflux for the nodes cell's tests: this tree's release
//! bundle (`make release`, then `make publish` to the cell's registry), and
//! for the upgrade test this build's image and the previous release's,
//! built from its commit (`OPENFLUX_PREVIOUS_RELEASE` in e2e/versions.env),
//! each pushed to the cell's registry by digest.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use crate::nodes::registry;
use crate::{workspace_root, Env};

/// The previous release: its commit, the tree at that commit (manifests
/// included) and its openflux image in the cell's registry.
pub struct Previous {
    pub commit: String,
    pub tree: PathBuf,
    pub image: String,
    /// The release's own openflux binary (for `openflux certs`).
    pub binary: PathBuf,
}

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
    out.stdout
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| workspace_root().join("target"), PathBuf::from)
}

/// Packs `openflux` (and `http_source`) as images with the packer of
/// `tree`, and pushes the openflux image as `openflux:<tag>`: its reference
/// by digest.
fn pack_and_push(env: &Env, tree: &Path, openflux: &Path, http_source: &Path, tag: &str) -> String {
    let work = tempfile::tempdir().expect("a temp dir");
    let release = work.path().join("release");
    std::fs::create_dir_all(&release).expect("a release dir");
    for (bin, name) in [
        (openflux, "openflux"),
        (http_source, "openflux-http-source"),
    ] {
        std::fs::copy(bin, release.join(name))
            .unwrap_or_else(|e| panic!("copying {}: {e}", bin.display()));
    }
    let out = work.path().join("images");
    run(
        "images/build --no-cargo",
        Command::new(tree.join("images/build"))
            .arg("--no-cargo")
            .env("CARGO_TARGET_DIR", work.path())
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
            .arg(format!("docker://{registry}/openflux:{tag}")),
    );
    let digest = std::fs::read_to_string(&digest_file).expect("skopeo's digest file");
    format!("{registry}/openflux@{}", digest.trim())
}

/// This build's release binaries (`images/build`, a no-op when they are
/// fresh), openflux pushed as `openflux:current`.
pub fn current_image(env: &Env) -> String {
    let root = workspace_root();
    run(
        "images/build",
        crate::openflux::without_test_env(&mut Command::new(root.join("images/build")))
            .current_dir(&root),
    );
    let release = target_dir().join("release");
    pack_and_push(
        env,
        &root,
        &release.join("openflux"),
        &release.join("openflux-http-source"),
        "current",
    )
}

/// The previous release: its tree (from git, under the target dir), its
/// openflux built there (a target dir of its own, so this build's binaries
/// are never overwritten; kept between runs), packed by its own
/// images/build and pushed as `openflux:previous`.
pub fn previous(env: &Env) -> Previous {
    let commit = previous_commit();
    let root = workspace_root();
    let base = target_dir().join("previous-release");
    let tree = base.join(&commit[..12]);
    if !tree.join("Cargo.toml").exists() {
        std::fs::create_dir_all(&tree).expect("the previous release's dir");
        let archive = run(
            "git archive of the previous release (a clone with full history is needed)",
            Command::new("git")
                .arg("-C")
                .arg(&root)
                .args(["archive", "--format=tar", &commit]),
        );
        let mut untar = Command::new("tar")
            .arg("-x")
            .arg("-C")
            .arg(&tree)
            .stdin(Stdio::piped())
            .spawn()
            .expect("running tar");
        std::io::Write::write_all(untar.stdin.as_mut().expect("tar's stdin"), &archive)
            .expect("unpacking the previous release");
        drop(untar.stdin.take());
        assert!(untar.wait().expect("tar").success(), "tar failed");
    }
    // Debug: the dependencies build faster, and the program is the same.
    run(
        "cargo build of the previous release",
        Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
            .args(["build", "--locked", "-p", "openflux", "--bin", "openflux"])
            .current_dir(&tree)
            .env("CARGO_TARGET_DIR", base.join("target")),
    );
    let binary = base.join("target/debug/openflux");
    // The HttpSource binary only fills the packer's second image.
    let http_source = target_dir().join("release/openflux-http-source");
    let image = pack_and_push(env, &tree, &binary, &http_source, "previous");
    Previous {
        commit,
        tree,
        image,
        binary,
    }
}

/// A release of this tree, published to the nodes cell's registry.
pub struct Bundle {
    /// The workspace's version, the release's.
    pub version: String,
    /// Where it is published: `<cell registry>/release`.
    pub registry: String,
    /// `target/dist/<version>`: install.yaml, cosign.pub, SHA256SUMS...
    pub dir: PathBuf,
    /// The helm `make release` built (from its Go module).
    pub helm: PathBuf,
}

/// The version in the workspace's Cargo.toml.
pub fn workspace_version() -> String {
    let path = workspace_root().join("Cargo.toml");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    text.lines()
        .find_map(|l| l.strip_prefix("version = \""))
        .and_then(|v| v.strip_suffix('"'))
        .unwrap_or_else(|| panic!("{} names no version", path.display()))
        .to_string()
}

static BUNDLE: OnceLock<Bundle> = OnceLock::new();

/// This tree released as `make release` does and pushed as `make publish`
/// does to the cell's registry (plain HTTP), once per test process:
/// signed, with install.yaml, the chart and the manifests artifact, all
/// naming the images by digest. Two differences from a release, both said:
/// a tree with uncommitted changes is allowed (`ALLOW_DIRTY=1`), and the
/// images are this machine's platform alone (`PLATFORMS`), sparing the
/// arm64 cross build; this machine's binaries are the ones `make images`
/// built.
pub fn published_bundle(env: &Env) -> &'static Bundle {
    BUNDLE.get_or_init(|| {
        let root = workspace_root();
        let version = workspace_version();
        let registry = format!("{}/release", registry(env));
        let platform = match std::env::consts::ARCH {
            "x86_64" => "linux/amd64",
            "aarch64" => "linux/arm64",
            other => panic!("no image platform for {other}"),
        };
        let out = run(
            "release/release (make release)",
            crate::openflux::without_test_env(&mut Command::new(root.join("release/release")))
                .args([&version, &registry])
                .current_dir(&root)
                .env("ALLOW_DIRTY", "1")
                .env("PLATFORMS", platform),
        );
        println!("make release: {}", String::from_utf8_lossy(&out).trim());
        run(
            "release/publish (make publish)",
            Command::new(root.join("release/publish"))
                .args([&version, &registry])
                .current_dir(&root)
                .env("PLAIN_HTTP", "1"),
        );
        let helm = run(
            "release/tools bin helm",
            Command::new(root.join("release/tools")).args(["bin", "helm"]),
        );
        let helm = PathBuf::from(String::from_utf8_lossy(&helm).trim());
        Bundle {
            dir: target_dir().join("dist").join(&version),
            version,
            registry,
            helm,
        }
    })
}
