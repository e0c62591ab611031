//! The nodes cell ([`crate::Cell::Nodes`]): real nodes on the local control
//! plane, Flux running as Pods, openflux installed as the README tells a
//! user to install it.
//!
//! [`install_block`] is the `sh` block of the README's "Install beside
//! Flux" section, and [`install_as_readme_says`] runs exactly that text,
//! so what the tests install and what the README says cannot drift apart.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use crate::{workspace_root, Env};

/// The README section whose first `sh` block is the install sequence.
pub const INSTALL_SECTION: &str = "## Install beside Flux";

/// What the install block leaves in the directory it runs in (the
/// repository root), removed before and after [`install_as_readme_says`].
pub const INSTALL_OUTPUTS: [&str; 1] = ["openflux-install"];

/// The first `sh` block of [`INSTALL_SECTION`] in `readme`.
pub fn install_block_of(readme: &str) -> Result<String, String> {
    let start = readme
        .find(&format!("\n{INSTALL_SECTION}\n"))
        .ok_or_else(|| format!("README.md has no section '{INSTALL_SECTION}'"))?;
    let section = &readme[start + 1..];
    let end = section[INSTALL_SECTION.len()..]
        .find("\n## ")
        .map_or(section.len(), |i| i + INSTALL_SECTION.len());
    let section = &section[..end];
    let open = section
        .find("\n```sh\n")
        .ok_or_else(|| format!("README.md's '{INSTALL_SECTION}' has no sh block"))?;
    let body = &section[open + "\n```sh\n".len()..];
    let close = body
        .find("\n```")
        .ok_or_else(|| format!("README.md's '{INSTALL_SECTION}' sh block is not closed"))?;
    Ok(body[..close + 1].to_string())
}

/// The install block of this repository's README.md.
pub fn install_block() -> String {
    let path = workspace_root().join("README.md");
    let readme = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    install_block_of(&readme).unwrap_or_else(|e| panic!("{e}"))
}

/// A variable of the nodes cell's environment, or a panic naming it.
pub fn var<'a>(env: &'a Env, name: &str) -> &'a str {
    env.vars.get(name).map(String::as_str).unwrap_or_else(|| {
        panic!("`e2e/cluster cell nodes env` printed no {name}: is this the nodes cell?")
    })
}

/// The cell's registry (`host:port`, plain HTTP), where images are pushed.
pub fn registry(env: &Env) -> &str {
    var(env, "OPENFLUX_E2E_REGISTRY")
}

/// Each node's name and network namespace (`/run/netns/<name>`).
pub fn node_netns(env: &Env) -> Vec<(String, String)> {
    var(env, "OPENFLUX_E2E_NODE_NETNS")
        .split_whitespace()
        .filter_map(|pair| pair.split_once('='))
        .map(|(node, ns)| (node.to_string(), ns.to_string()))
        .collect()
}

/// `program args` run inside node `node`'s network namespace (where
/// kube-proxy's Service rules are), for instance `curl` to a ClusterIP.
pub fn in_node(env: &Env, node: &str, program: &str, args: &[&str]) -> Output {
    let ns = node_netns(env)
        .into_iter()
        .find(|(n, _)| n == node)
        .map(|(_, ns)| ns)
        .unwrap_or_else(|| panic!("the nodes cell has no node {node}"));
    Command::new("nsenter")
        .arg(format!("--net=/run/netns/{ns}"))
        .arg("--")
        .arg(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("running nsenter ... {program} in {node}: {e}"))
}

/// The PIDs of the processes running `binary` in containers of the cell's
/// nodes (under a node's cgroup, `openflux-e2e-node-<i>`), not those of the
/// same name the other tests run on the host.
pub fn node_processes(binary: &str) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut pids: Vec<u32> = entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok();
            let named = exe
                .as_deref()
                .and_then(Path::file_name)
                .is_some_and(|n| n == binary);
            named
                && std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
                    .is_ok_and(|c| c.contains("/openflux-e2e-node-"))
        })
        .collect();
    pids.sort_unstable();
    pids
}

/// Installs Flux on the nodes cell in another shape (`default`: `flux
/// install`; `source-watcher`: `flux install
/// --components-extra=source-watcher`, the ExternalArtifact gate on) and
/// waits until every Deployment is available (`e2e/cluster cell nodes
/// flux-install SHAPE`). Panics with the script's output when it fails.
pub fn flux_install(shape: &str) {
    cell_command(&["flux-install", shape]);
}

fn cell_command(args: &[&str]) {
    let script = crate::cluster_script();
    let out = Command::new(&script)
        .args(["cell", "nodes"])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", script.display()));
    assert!(
        out.status.success(),
        "e2e/cluster cell nodes {} failed ({}):\n{}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Node `number` (1, 2) is lost: its link to the others goes down and its
/// kubelet, containers and containerd are killed (`e2e/cluster cell nodes
/// stop-node`).
pub fn stop_node(number: &str) {
    cell_command(&["stop-node", number]);
}

/// Node `number` comes back and becomes Ready (`e2e/cluster cell nodes
/// start-node`).
pub fn start_node(number: &str) {
    cell_command(&["start-node", number]);
}

fn remove_outputs(root: &Path) {
    for out in INSTALL_OUTPUTS {
        let path = root.join(out);
        if path.exists() {
            std::fs::remove_dir_all(&path)
                .unwrap_or_else(|e| panic!("removing {}: {e}", path.display()));
        }
    }
}

/// Runs the README's install block (bash, `-euo pipefail`) from the
/// repository root against the nodes cell: `kubectl` is the cell's,
/// `REGISTRY` the cell's registry (plain HTTP: the cell tells skopeo so in
/// a registries.conf drop-in, as a user does), `openflux` the release
/// binary `make images` builds. Its
/// outputs are removed before and after. Panics with the block's output
/// when it fails.
pub fn install_as_readme_says(env: &Env) -> Output {
    let root = workspace_root()
        .canonicalize()
        .expect("the repository root");
    let block = install_block();
    let kubeconfig = env
        .kubeconfig
        .clone()
        .expect("the nodes cell has a kubeconfig");
    let kubectl = PathBuf::from(var(env, "OPENFLUX_E2E_KUBECTL"));
    let kubectl_dir = kubectl.parent().expect("kubectl's directory").to_path_buf();
    let registry = registry(env).to_string();
    let target =
        std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), PathBuf::from);
    let path = std::env::join_paths([kubectl_dir, target.join("release")].into_iter().chain(
        std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()),
    ))
    .expect("PATH");
    remove_outputs(&root);
    let out = Command::new("bash")
        .args(["-euo", "pipefail", "-c", &block])
        .current_dir(&root)
        .env("KUBECONFIG", &kubeconfig)
        .env("REGISTRY", &registry)
        .env("PATH", path)
        .stdin(Stdio::null())
        .output()
        .expect("running bash");
    remove_outputs(&root);
    assert!(
        out.status.success(),
        "the README's install block failed ({}):\n{block}\n----- stdout\n{}\n----- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_install_block_is_the_first_sh_block_of_its_section() {
        let readme = "# x\n\n## Install beside Flux\n\ntext\n\n```yaml\na: b\n```\n\n```sh\nmake images\nkubectl apply -k x/\n```\n\n```sh\nno\n```\n\n## Next\n\n```sh\nother\n```\n";
        assert_eq!(
            install_block_of(readme).unwrap(),
            "make images\nkubectl apply -k x/\n"
        );
        assert!(
            install_block_of("\n## Install beside Flux\n\nno block\n## Next\n```sh\nx\n```\n")
                .unwrap_err()
                .contains("has no sh block")
        );
        assert!(install_block_of("# none\n")
            .unwrap_err()
            .contains("no section"));
    }

    #[test]
    fn the_readme_has_an_install_block_that_installs_with_kubectl() {
        let block = install_block();
        assert!(block.contains("make images"), "{block}");
        assert!(block.contains("kubectl apply -k"), "{block}");
    }
}
