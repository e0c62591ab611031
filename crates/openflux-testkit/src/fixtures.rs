//! The loopback fixtures of `e2e/cluster`: a Git smart HTTP server, a static
//! file server with a Helm repository, and where the Flux controllers serve
//! their artifacts. Tests get them from [`Env::fixtures`](crate::Env::fixtures),
//! which fails the test, naming the missing variables, when the cluster in
//! use has none.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{anyhow, bail, Context as _};

/// The variables `e2e/cluster env` prints for the fixtures, all required
/// (`OPENFLUX_E2E_WATCHER_STORAGE_ADDR` too, where the Flux line has
/// source-watcher).
pub const FIXTURE_VARIABLES: [&str; 6] = [
    "OPENFLUX_E2E_GIT_URL",
    "OPENFLUX_E2E_GIT_ROOT",
    "OPENFLUX_E2E_HTTP_URL",
    "OPENFLUX_E2E_HTTP_ROOT",
    "OPENFLUX_E2E_HELM_REPO_URL",
    "OPENFLUX_E2E_SOURCE_STORAGE_ADDR",
];

/// The test fixtures served on loopback by `e2e/cluster`.
#[derive(Clone, Debug)]
pub struct Fixtures {
    /// Base URL of the Git smart HTTP server; `<git_url>/<name>.git` is the
    /// bare repository `<git_root>/<name>.git`.
    pub git_url: String,
    /// Directory of the served bare repositories.
    pub git_root: PathBuf,
    /// Base URL of the static file server; `<http_url>/<path>` is
    /// `<http_root>/<path>`.
    pub http_url: String,
    /// Directory served by the static file server.
    pub http_root: PathBuf,
    /// A Helm repository with the chart `hello` 0.1.0.
    pub helm_repo_url: String,
    /// `host:port` of source-controller's artifact storage.
    pub source_storage_addr: String,
    /// `host:port` of source-watcher's artifact storage (`None` on a Flux
    /// line without source-watcher, such as 2.7).
    pub watcher_storage_addr: Option<String>,
}

impl Fixtures {
    /// The fixtures described by `vars` (the `OPENFLUX_E2E_*` variables), or
    /// the names of those that are missing or empty.
    pub fn from_vars(vars: &BTreeMap<String, String>) -> Result<Self, Vec<&'static str>> {
        let missing: Vec<&'static str> = FIXTURE_VARIABLES
            .into_iter()
            .filter(|k| vars.get(*k).is_none_or(|v| v.is_empty()))
            .collect();
        if !missing.is_empty() {
            return Err(missing);
        }
        let get = |k: &str| vars.get(k).cloned().unwrap_or_default();
        Ok(Fixtures {
            git_url: get("OPENFLUX_E2E_GIT_URL"),
            git_root: PathBuf::from(get("OPENFLUX_E2E_GIT_ROOT")),
            http_url: get("OPENFLUX_E2E_HTTP_URL"),
            http_root: PathBuf::from(get("OPENFLUX_E2E_HTTP_ROOT")),
            helm_repo_url: get("OPENFLUX_E2E_HELM_REPO_URL"),
            source_storage_addr: get("OPENFLUX_E2E_SOURCE_STORAGE_ADDR"),
            watcher_storage_addr: vars
                .get("OPENFLUX_E2E_WATCHER_STORAGE_ADDR")
                .filter(|v| !v.is_empty())
                .cloned(),
        })
    }
}

/// A bare repository served by the fixtures Git server.
#[derive(Clone, Debug)]
pub struct GitRepo {
    /// Repository name without `.git`.
    pub name: String,
    /// Path of the bare repository.
    pub path: PathBuf,
    /// Clone URL over HTTP (what a GitRepository's `spec.url` takes).
    pub url: String,
    /// The branch commits go to (`main`).
    pub branch: String,
}

fn git(dir: Option<&Path>, args: &[&str]) -> anyhow::Result<String> {
    let mut cmd = Command::new("git");
    cmd.args([
        "-c",
        "init.defaultBranch=main",
        "-c",
        "user.name=openflux-e2e",
        "-c",
        "user.email=e2e@openflux.invalid",
        "-c",
        "commit.gpgsign=false",
        "-c",
        "protocol.file.allow=always",
    ]);
    if let Some(dir) = dir {
        cmd.arg("-C").arg(dir);
    }
    let out = cmd
        .args(args)
        .stdin(Stdio::null())
        .output()
        .context("running git")?;
    if !out.status.success() {
        bail!(
            "git {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

impl Fixtures {
    /// URL of a file under the static root (`path` relative to it).
    pub fn http_file_url(&self, path: &str) -> String {
        format!(
            "{}/{}",
            self.http_url.trim_end_matches('/'),
            path.trim_start_matches('/')
        )
    }

    /// Writes a file under the static root (creating directories) and
    /// returns its URL.
    pub fn put_file(&self, path: &str, contents: &[u8]) -> anyhow::Result<String> {
        let dest = self.http_root.join(path.trim_start_matches('/'));
        if let Some(parent) = dest.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("creating {}", parent.display()))?;
        }
        std::fs::write(&dest, contents).with_context(|| format!("writing {}", dest.display()))?;
        Ok(self.http_file_url(path))
    }

    /// A repository by name (it need not exist yet).
    pub fn repo(&self, name: &str) -> GitRepo {
        GitRepo {
            name: name.to_string(),
            path: self.git_root.join(format!("{name}.git")),
            url: format!("{}/{name}.git", self.git_url.trim_end_matches('/')),
            branch: "main".to_string(),
        }
    }

    /// Creates a new bare repository `<name>.git` whose branch `main` has one
    /// commit with `files` (path, contents). Returns it and the commit SHA.
    pub fn create_repo(
        &self,
        name: &str,
        files: &[(&str, &str)],
    ) -> anyhow::Result<(GitRepo, String)> {
        let repo = self.repo(name);
        if repo.path.exists() {
            bail!("repository {} already exists", repo.path.display());
        }
        let path = repo
            .path
            .to_str()
            .ok_or_else(|| anyhow!("non UTF-8 path"))?;
        git(None, &["init", "-q", "--bare", path])?;
        let sha = repo.commit(files, &[], "Initial commit")?;
        Ok((repo, sha))
    }
}

impl GitRepo {
    /// Pushes one commit to the branch that writes `files` (path, contents)
    /// and removes `remove` (paths); returns the new commit SHA.
    pub fn commit(
        &self,
        files: &[(&str, &str)],
        remove: &[&str],
        message: &str,
    ) -> anyhow::Result<String> {
        let work = tempfile::tempdir().context("creating a work tree")?;
        let wt = work.path();
        let bare = self
            .path
            .to_str()
            .ok_or_else(|| anyhow!("non UTF-8 path"))?;
        git(Some(wt), &["init", "-q"])?;
        // An empty repository has no branch yet: start from scratch then.
        if git(
            None,
            &[
                "--git-dir",
                bare,
                "rev-parse",
                "--verify",
                "-q",
                &format!("refs/heads/{}", self.branch),
            ],
        )
        .is_ok()
        {
            git(Some(wt), &["fetch", "-q", bare, &self.branch])?;
            git(
                Some(wt),
                &["checkout", "-q", "-B", &self.branch, "FETCH_HEAD"],
            )?;
        } else {
            git(Some(wt), &["checkout", "-q", "-b", &self.branch])?;
        }
        for (path, contents) in files {
            let dest = wt.join(path);
            if let Some(parent) = dest.parent() {
                std::fs::create_dir_all(parent)?;
            }
            std::fs::write(&dest, contents).with_context(|| format!("writing {path}"))?;
        }
        for path in remove {
            git(Some(wt), &["rm", "-q", "-r", "--ignore-unmatch", path])?;
        }
        git(Some(wt), &["add", "-A"])?;
        git(Some(wt), &["commit", "-q", "--allow-empty", "-m", message])?;
        git(
            Some(wt),
            &[
                "push",
                "-q",
                bare,
                &format!("HEAD:refs/heads/{}", self.branch),
            ],
        )?;
        git(Some(wt), &["rev-parse", "HEAD"])
    }

    /// The SHA the branch points at.
    pub fn head(&self) -> anyhow::Result<String> {
        let bare = self
            .path
            .to_str()
            .ok_or_else(|| anyhow!("non UTF-8 path"))?;
        git(
            None,
            &[
                "--git-dir",
                bare,
                "rev-parse",
                &format!("refs/heads/{}", self.branch),
            ],
        )
    }

    /// The revision string Flux reports for the branch head:
    /// `<branch>@sha1:<sha>`.
    pub fn flux_revision(&self, sha: &str) -> String {
        format!("{}@sha1:{sha}", self.branch)
    }
}

/// Why a cluster has no fixtures, naming the missing variables.
pub(crate) fn missing(local: bool, missing: &[&str]) -> String {
    let names = missing.join(", ");
    if local {
        format!("`e2e/cluster env` printed no {names}")
    } else {
        format!(
            "this test needs the loopback fixtures of e2e/cluster, but {names} \
             {verb} not set. KUBECONFIG is set, so the tests use that cluster as it is: \
             unset KUBECONFIG to run them on the local control plane, or set these \
             variables (`e2e/cluster env` prints them for a local control plane)",
            verb = if missing.len() == 1 { "is" } else { "are" }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn every_variable_present_gives_the_fixtures() {
        let all: Vec<(&str, &str)> = FIXTURE_VARIABLES.iter().map(|k| (*k, "x")).collect();
        let mut all = vars(&all);
        all.insert(
            "OPENFLUX_E2E_HELM_REPO_URL".into(),
            "http://h/charts".into(),
        );
        let fx = Fixtures::from_vars(&all).expect("fixtures");
        assert_eq!(fx.helm_repo_url, "http://h/charts");
        assert_eq!(
            fx.watcher_storage_addr, None,
            "a line without source-watcher"
        );
        all.insert(
            "OPENFLUX_E2E_WATCHER_STORAGE_ADDR".into(),
            "127.0.0.1:2".into(),
        );
        let fx = Fixtures::from_vars(&all).expect("fixtures");
        assert_eq!(fx.watcher_storage_addr.as_deref(), Some("127.0.0.1:2"));
        assert_eq!(fx.http_file_url("/a/b.yaml"), "x/a/b.yaml");
    }

    #[test]
    fn missing_or_empty_variables_are_named() {
        let some = vars(&[
            ("OPENFLUX_E2E_GIT_URL", "http://g"),
            ("OPENFLUX_E2E_GIT_ROOT", "/g"),
            ("OPENFLUX_E2E_HTTP_URL", ""),
            ("OPENFLUX_E2E_HTTP_ROOT", "/f"),
            ("OPENFLUX_E2E_SOURCE_STORAGE_ADDR", "127.0.0.1:1"),
        ]);
        let missing = Fixtures::from_vars(&some).expect_err("incomplete");
        assert_eq!(
            missing,
            ["OPENFLUX_E2E_HTTP_URL", "OPENFLUX_E2E_HELM_REPO_URL"]
        );
        assert_eq!(
            Fixtures::from_vars(&BTreeMap::new()).expect_err("empty"),
            FIXTURE_VARIABLES
        );
    }
}
