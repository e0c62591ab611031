//! The Flux matrix: control planes besides the tests' own, each a cell of
//! `e2e/cluster` (`e2e/lib/cells.sh` defines them: Flux line, feature gates,
//! state dir and ports, moved with `OPENFLUX_E2E_CELL_PORT_BASE`).
//!
//! [`cell`] starts a cell when a test first asks for it and reuses it while
//! it runs; `e2e/cluster cells down` stops every cell (`make test` does so
//! at the end). A test holds its cell, through a lock file, for as long as
//! it keeps the [`Env`]: the matrix cells share one, so their tests run one
//! after another, however many threads or test processes ask, and at most
//! one of them is busy at a time; the nodes cell has its own, so its tests
//! (a binary `make test` runs beside the others) run one after another
//! beside them.

use std::fs::{File, OpenOptions};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::{cluster, cluster_script, connect, parse_env, Env};

/// How long [`cell`] waits for another test to release the cells.
pub const CELL_LOCK_TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// A control plane of the matrix.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Cell {
    /// The tests' own control plane ([`cluster`]): the current Flux line
    /// with `OPENFLUX_E2E_FEATURE_GATES` (or whatever runs there, or the
    /// cluster of `KUBECONFIG`).
    Main,
    /// The current Flux line with `--feature-gates=ExternalArtifact=true`.
    CurrentExternalArtifact,
    /// The Flux 2.7 line with Flux's default flags (no feature gates).
    Flux27Default,
    /// Real nodes (kubelet, containerd, runc) on the local control plane,
    /// Flux installed as Pods as `flux install` lays it out
    /// (`e2e/lib/nodes.sh`); not part of [`Cell::ALL`]: its tests install
    /// openflux as a user does ([`crate::nodes`]).
    Nodes,
    /// The current Flux line under Flux's multi-tenancy lockdown:
    /// kustomize-controller and helm-controller with
    /// `--no-cross-namespace-refs=true --default-service-account=default`
    /// (so they impersonate each namespace's ServiceAccount `default`),
    /// kustomize-controller also with `--no-remote-bases=true`; not part of
    /// [`Cell::ALL`]: its tests are about tenants, not about the matrix.
    Lockdown,
    /// The current Flux line on the newest Kubernetes release the Go
    /// module proxy serves (`KUBERNETES_NEWEST_LINE` in e2e/versions.env):
    /// its kube-apiserver, kube-controller-manager and kubectl. Not part of
    /// [`Cell::ALL`]: [`Cell::KUBERNETES`] lists the Kubernetes lines.
    KubernetesNewest,
    /// The current Flux line on the oldest Kubernetes line the README
    /// supports (`KUBERNETES_OLDEST_LINE`).
    KubernetesOldest,
}

impl Cell {
    /// Every control plane of the matrix, the main one first.
    pub const ALL: [Cell; 3] = [
        Cell::Main,
        Cell::CurrentExternalArtifact,
        Cell::Flux27Default,
    ];

    /// The control planes of every Kubernetes line the tests run: the
    /// pinned one (the tests' own), the newest and the oldest.
    pub const KUBERNETES: [Cell; 3] = [Cell::Main, Cell::KubernetesNewest, Cell::KubernetesOldest];

    /// The cell's name in `e2e/cluster cell NAME ...` (`main` for the
    /// tests' own control plane, which is not a cell there).
    pub fn name(self) -> &'static str {
        match self {
            Cell::Main => "main",
            Cell::CurrentExternalArtifact => "current-external-artifact",
            Cell::Flux27Default => "flux27-default",
            Cell::Nodes => "nodes",
            Cell::Lockdown => "lockdown",
            Cell::KubernetesNewest => "kubernetes-newest",
            Cell::KubernetesOldest => "kubernetes-oldest",
        }
    }
}

impl std::fmt::Display for Cell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Runs `e2e/cluster ARGS` with `envs` added, its stderr (progress) passed
/// through; its stdout on success.
fn run_script(args: &[&str], envs: &[(&str, &str)]) -> Result<String, String> {
    let script = cluster_script();
    let shown = format!("{} {}", script.display(), args.join(" "));
    let out = Command::new(&script)
        .args(args)
        .envs(envs.iter().copied())
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("running {shown}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{shown} failed ({}); its output above names what did not work",
            out.status
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Takes the lock file of the cell `what` (blocking), at most
/// [`CELL_LOCK_TIMEOUT`].
async fn hold_cells(what: Cell) -> File {
    let path =
        tokio::task::spawn_blocking(move || run_script(&["cells", "lock-file", what.name()], &[]))
            .await
            .unwrap_or_else(|e| panic!("e2e cell {what}: {e}"))
            .unwrap_or_else(|e| panic!("e2e cell {what}: {e}"));
    let path = PathBuf::from(path.trim());
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .unwrap_or_else(|e| panic!("e2e cell {what}: opening {}: {e}", path.display()));
    let locked = tokio::time::timeout(
        CELL_LOCK_TIMEOUT,
        tokio::task::spawn_blocking(move || file.lock().map(|()| file)),
    )
    .await
    .unwrap_or_else(|_| {
        panic!(
            "e2e cell {what}: another test held the cells ({}) for {CELL_LOCK_TIMEOUT:?}",
            path.display()
        )
    });
    locked
        .unwrap_or_else(|e| panic!("e2e cell {what}: {e}"))
        .unwrap_or_else(|e| panic!("e2e cell {what}: locking {}: {e}", path.display()))
}

/// The control plane of a matrix cell, for this test alone until the
/// returned `Env` is dropped: brings the cell up unless it runs (with the
/// cell's own feature gates, whatever an earlier test set), and returns a
/// client and fixtures for it, shaped like [`cluster`]'s. [`Cell::Main`] is
/// [`cluster`] itself (shared, not held). Panics, naming the cell and what
/// did not start, when the cell cannot be brought up.
pub async fn cell(which: Cell) -> Env {
    if which == Cell::Main {
        return cluster().await;
    }
    // The turn before the cell's lock, always in this order: a test waits
    // for a cell only while its module has the turn.
    let turn = crate::turns::Turn::take();
    let hold = hold_cells(which).await;
    let name = which.name();
    let vars = tokio::task::spawn_blocking(move || {
        run_script(&["cell", name, "up"], &[])?;
        run_script(&["cell", name, "env"], &[]).map(|out| parse_env(&out))
    })
    .await
    .unwrap_or_else(|e| panic!("e2e cell {which}: {e}"))
    .unwrap_or_else(|e| panic!("e2e cell {which}: the control plane did not start: {e}"));
    let kubeconfig = vars
        .get("KUBECONFIG")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            panic!("e2e cell {which}: `e2e/cluster cell {name} env` printed no KUBECONFIG")
        });
    connect(which, true, Some(kubeconfig), vars, Some(hold), turn).await
}

/// Restarts kustomize-controller and helm-controller of `env`'s local
/// control plane with `--feature-gates=VALUE` (`""`: none, Flux's
/// defaults) through `e2e/cluster gates`, which also rewrites their
/// Deployments in flux-system, and returns once both are healthy again.
///
/// On [`Cell::Main`] this changes the gates for every test sharing the
/// tests' control plane; a cell is held by one test, and the next [`cell`]
/// restores the cell's own gates. Panics for a cluster not started by
/// `e2e/cluster` (`KUBECONFIG` set) and when the restart fails.
pub async fn set_feature_gates(env: &Env, value: &str) {
    let which = env.cell;
    assert!(
        env.local,
        "set_feature_gates on {which}: this cluster was not started by e2e/cluster (KUBECONFIG is set), so its Flux controllers cannot be restarted"
    );
    let state = env
        .vars
        .get("OPENFLUX_E2E_STATE")
        .cloned()
        .unwrap_or_else(|| {
            panic!("set_feature_gates on {which}: `e2e/cluster env` printed no OPENFLUX_E2E_STATE")
        });
    let value = value.to_string();
    tokio::task::spawn_blocking(move || {
        run_script(&["gates", &value], &[("OPENFLUX_E2E_STATE", &state)])
    })
    .await
    .unwrap_or_else(|e| panic!("set_feature_gates on {which}: {e}"))
    .unwrap_or_else(|e| panic!("set_feature_gates on {which}: {e}"));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cell_names_are_those_of_e2e_cluster() {
        let script = std::fs::read_to_string(crate::workspace_root().join("e2e/lib/cells.sh"))
            .expect("reading e2e/lib/cells.sh");
        for cell in Cell::ALL {
            if cell == Cell::Main {
                continue;
            }
            assert!(
                script.contains(&format!("\n  \"{}|", cell.name())),
                "e2e/lib/cells.sh defines no cell {cell}"
            );
        }
        assert!(script.contains("\"current-external-artifact|current|ExternalArtifact=true\""));
        assert!(script.contains("\"flux27-default|2.7|\""));
        assert!(script.contains(&format!("\"{}|current||lockdown\"", Cell::Lockdown.name())));
        for (cell, line) in [
            (Cell::KubernetesNewest, "newest"),
            (Cell::KubernetesOldest, "oldest"),
        ] {
            assert!(
                script.contains(&format!("\"{}|current|||{line}\"", cell.name())),
                "e2e/lib/cells.sh defines no cell {cell} on the {line} Kubernetes line"
            );
        }
    }

    /// A test holds its cell's lock while the cell's `up` and `down` take
    /// the lock of its state dir: were they one file, the first test on a
    /// cell would wait for itself.
    #[test]
    fn a_cells_test_lock_is_not_its_start_lock_and_only_the_nodes_cell_has_its_own() {
        let states = run_script(&["cells", "state-dirs"], &[]).expect("cells state-dirs");
        let states: Vec<&str> = states.lines().collect();
        let cells = [
            Cell::CurrentExternalArtifact,
            Cell::Flux27Default,
            Cell::Nodes,
            Cell::Lockdown,
            Cell::KubernetesNewest,
            Cell::KubernetesOldest,
        ];
        let mut matrix = Vec::new();
        for cell in cells {
            let lock = run_script(&["cells", "lock-file", cell.name()], &[])
                .unwrap_or_else(|e| panic!("cells lock-file {cell}: {e}"));
            let lock = lock.trim().to_string();
            for state in &states {
                assert_ne!(lock, format!("{state}.lock"), "{cell}'s test lock");
            }
            if cell != Cell::Nodes {
                matrix.push(lock);
            } else {
                assert!(lock.ends_with("-nodes.lock"), "{lock}");
            }
        }
        matrix.dedup();
        assert_eq!(
            matrix.len(),
            1,
            "the matrix cells share one lock: {matrix:?}"
        );
        assert!(run_script(&["cells", "lock-file"], &[]).is_err());
    }
}
