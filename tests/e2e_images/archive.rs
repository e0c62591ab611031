//! The OCI image archives of `images/build` (what `make images` writes):
//! built once per test process and read back with every digest checked,
//! their layers unpacked into a root file system.

use openflux_testkit as support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use serde_json::Value;
use sha2::{Digest, Sha256};

/// The target directory the running test was built in (`<target>/debug/deps/<test>`).
fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the path of the running test executable");
    exe.ancestors()
        .nth(3)
        .expect("a test executable lives in <target>/<profile>/deps")
        .to_path_buf()
}

/// Runs `images/build` once per process (cargo rebuilds the release
/// binaries only when they are stale) and returns the directory holding the
/// archives. A failed build fails the test with the command to run.
pub fn archives() -> &'static Path {
    static DIR: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let dir = DIR.get_or_init(|| {
        let script = support::workspace_root().join("images/build");
        let target = target_dir();
        let mut cmd = Command::new(&script);
        cmd.env("CARGO", env!("CARGO"))
            .env("CARGO_TARGET_DIR", &target)
            .env_remove("IMAGES_OUT")
            .env_remove("SOURCE_DATE_EPOCH")
            .stdin(Stdio::null());
        // What cargo sets for the running test is not meant for the build.
        support::openflux::without_test_env(&mut cmd);
        let status = cmd
            .status()
            .map_err(|e| format!("running {}: {e}", script.display()))?;
        if !status.success() {
            return Err(format!(
                "{} failed ({status}); run `make images` to see why",
                script.display()
            ));
        }
        Ok(target.join("images"))
    });
    match dir {
        Ok(dir) => dir,
        Err(e) => panic!("building the image archives: {e}"),
    }
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// One image read from its archive: the reference it is tagged with, its
/// config, and its layers unpacked (in order) into `rootfs`.
pub struct Image {
    pub reference: String,
    pub config: Value,
    pub rootfs: PathBuf,
    /// Holds the layout and the root file system; removed on drop.
    _dir: tempfile::TempDir,
}

fn run(cmd: &mut Command) -> Vec<u8> {
    let out = cmd
        .stderr(Stdio::piped())
        .output()
        .unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

impl Image {
    /// Reads `archive` as an OCI image layout with one manifest, checks the
    /// digest and size of every blob and the diff id of every layer, and
    /// unpacks the layers.
    pub fn unpack(archive: &Path) -> Image {
        assert!(
            archive.is_file(),
            "{} is missing after images/build",
            archive.display()
        );
        let dir = tempfile::tempdir().expect("temp dir");
        let layout = dir.path().join("layout");
        let rootfs = dir.path().join("rootfs");
        std::fs::create_dir_all(&layout).expect("mkdir");
        std::fs::create_dir_all(&rootfs).expect("mkdir");
        run(Command::new("tar")
            .arg("-xf")
            .arg(archive)
            .arg("-C")
            .arg(&layout));

        let read_json = |path: &Path| -> Value {
            let text = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            serde_json::from_slice(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        };
        let blob = |descriptor: &Value| -> PathBuf {
            let digest = descriptor["digest"].as_str().expect("a descriptor digest");
            let hex = digest.strip_prefix("sha256:").expect("a sha256 digest");
            let path = layout.join("blobs/sha256").join(hex);
            let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("blob {digest}: {e}"));
            assert_eq!(
                sha256_hex(&bytes),
                hex,
                "blob {digest} does not match its digest"
            );
            assert_eq!(
                Some(bytes.len() as u64),
                descriptor["size"].as_u64(),
                "size of blob {digest}"
            );
            path
        };

        assert_eq!(
            read_json(&layout.join("oci-layout"))["imageLayoutVersion"],
            "1.0.0"
        );
        let index = read_json(&layout.join("index.json"));
        let manifests = index["manifests"].as_array().expect("index manifests");
        assert_eq!(manifests.len(), 1, "one image per archive: {index}");
        let reference = manifests[0]["annotations"]["org.opencontainers.image.ref.name"]
            .as_str()
            .expect("the org.opencontainers.image.ref.name annotation")
            .to_string();
        let manifest = read_json(&blob(&manifests[0]));
        assert_eq!(
            manifest["mediaType"],
            "application/vnd.oci.image.manifest.v1+json"
        );
        assert_eq!(
            manifest["config"]["mediaType"],
            "application/vnd.oci.image.config.v1+json"
        );
        let config = read_json(&blob(&manifest["config"]));
        let layers = manifest["layers"].as_array().expect("manifest layers");
        let diff_ids = config["rootfs"]["diff_ids"]
            .as_array()
            .expect("config rootfs.diff_ids");
        assert_eq!(layers.len(), diff_ids.len(), "one diff id per layer");

        // The Docker-style manifest.json names the same config and layers.
        let docker = read_json(&layout.join("manifest.json"));
        assert_eq!(
            docker[0]["Config"],
            format!("blobs/sha256/{}", hex_of(&manifest["config"]))
        );
        assert_eq!(docker[0]["RepoTags"], serde_json::json!([reference]));

        for (i, (layer, diff_id)) in layers.iter().zip(diff_ids).enumerate() {
            assert_eq!(
                layer["mediaType"],
                "application/vnd.oci.image.layer.v1.tar+gzip"
            );
            let path = blob(layer);
            assert_eq!(
                docker[0]["Layers"][i],
                format!("blobs/sha256/{}", hex_of(layer))
            );
            let raw = run(Command::new("gzip").arg("-dc").arg(&path));
            assert_eq!(
                diff_id.as_str(),
                Some(format!("sha256:{}", sha256_hex(&raw)).as_str()),
                "diff id of layer {i}"
            );
            run(Command::new("tar")
                .args(["-xzf"])
                .arg(&path)
                .arg("-C")
                .arg(&rootfs)
                .arg("--numeric-owner"));
        }
        Image {
            reference,
            config,
            rootfs,
            _dir: dir,
        }
    }

    /// A string field of the config's `config` section.
    pub fn field(&self, name: &str) -> &str {
        self.config["config"][name]
            .as_str()
            .unwrap_or_else(|| panic!("config.{name} in {}", self.config))
    }

    /// The entry point, as a list of strings.
    pub fn entrypoint(&self) -> Vec<String> {
        self.config["config"]["Entrypoint"]
            .as_array()
            .expect("config.Entrypoint")
            .iter()
            .map(|v| v.as_str().expect("entry point strings").to_string())
            .collect()
    }

    /// The exposed ports (`9443/tcp`, ...), sorted.
    pub fn exposed_ports(&self) -> Vec<String> {
        self.config["config"]["ExposedPorts"]
            .as_object()
            .expect("config.ExposedPorts")
            .keys()
            .cloned()
            .collect()
    }

    /// The labels.
    pub fn labels(&self) -> BTreeMap<String, String> {
        self.config["config"]["Labels"]
            .as_object()
            .expect("config.Labels")
            .iter()
            .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
            .collect()
    }

    /// Puts a file into the root file system, owned by the image's user
    /// (as a mounted Secret or ConfigMap would be), and returns its path
    /// inside the image.
    pub fn mount_file(&self, path: &str, contents: &[u8]) -> String {
        let host = self.rootfs.join(path.trim_start_matches('/'));
        std::fs::create_dir_all(host.parent().expect("a parent")).expect("mkdir");
        std::fs::write(&host, contents).expect("writing a mounted file");
        self.own(&host);
        path.to_string()
    }

    /// A ConfigMap volume laid out as the kubelet does: each key a symlink
    /// into `..data`, itself a symlink to a timestamped directory.
    pub fn mount_configmap(&self, dir: &str, files: &[(&str, &[u8])]) -> String {
        let host = self.rootfs.join(dir.trim_start_matches('/'));
        let data = host.join("..2026_01_01_00_00_00.000000001");
        std::fs::create_dir_all(&data).expect("mkdir");
        for (name, contents) in files {
            std::fs::write(data.join(name), contents).expect("writing a mounted file");
            std::os::unix::fs::symlink(Path::new("..data").join(name), host.join(name))
                .expect("symlink");
        }
        std::os::unix::fs::symlink(data.file_name().expect("a name"), host.join("..data"))
            .expect("symlink");
        dir.to_string()
    }

    /// An empty directory owned by the image's user (an emptyDir volume).
    pub fn mount_dir(&self, path: &str) -> String {
        let host = self.rootfs.join(path.trim_start_matches('/'));
        std::fs::create_dir_all(&host).expect("mkdir");
        self.own(&host);
        path.to_string()
    }

    fn own(&self, host: &Path) {
        let (uid, gid) = self.user();
        std::os::unix::fs::chown(host, Some(uid), Some(gid)).expect("chown");
    }

    /// The numeric user and group of the config's `User` (`uid:gid`).
    pub fn user(&self) -> (u32, u32) {
        let user = self.field("User");
        let (uid, gid) = user.split_once(':').unwrap_or((user, user));
        (
            uid.parse()
                .unwrap_or_else(|_| panic!("numeric User, not {user:?}")),
            gid.parse()
                .unwrap_or_else(|_| panic!("numeric group, not {user:?}")),
        )
    }
}

fn hex_of(descriptor: &Value) -> &str {
    descriptor["digest"]
        .as_str()
        .and_then(|d| d.strip_prefix("sha256:"))
        .expect("a sha256 digest")
}
