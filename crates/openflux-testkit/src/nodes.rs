//! The nodes cell ([`crate::Cell::Nodes`]): real nodes on the local control
//! plane, Flux running as Pods, openflux installed from a clone as the
//! contributors' guide (CONTRIBUTING.md) tells.
//!
//! [`install_block`] is the `sh` block of the guide's "Install from a
//! clone" section, and [`install_as_the_guide_says`] runs exactly that
//! text, so what the tests install and what the guide says cannot drift
//! apart.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use crate::{workspace_root, Env};

/// The file that holds the install blocks, at the repository's root.
pub const GUIDE: &str = "CONTRIBUTING.md";

/// The [`GUIDE`]'s section whose first `sh` block is the install sequence.
pub const INSTALL_SECTION: &str = "## Install from a clone";

/// What the install block leaves in the directory it runs in (the
/// repository root), removed before and after [`install_as_the_guide_says`].
pub const INSTALL_OUTPUTS: [&str; 1] = ["openflux-install"];

/// The [`GUIDE`]'s section whose first `sh` block installs openflux with
/// Flux from its OCI artifact (after the images are pushed as in
/// [`INSTALL_SECTION`]).
pub const FLUX_INSTALL_SECTION: &str = "## Install with Flux from a clone";

/// The first `sh` block of section `heading` in `guide`.
pub fn sh_block_of(guide: &str, heading: &str) -> Result<String, String> {
    block_of(GUIDE, guide, heading, "sh")
}

/// The first block fenced as ```` ```lang ```` in section `heading` (a
/// `## ` heading) of `text`, the markdown file `file`.
pub fn block_of(file: &str, text: &str, heading: &str, lang: &str) -> Result<String, String> {
    let start = text
        .find(&format!("\n{heading}\n"))
        .ok_or_else(|| format!("{file} has no section '{heading}'"))?;
    let section = &text[start + 1..];
    let end = section[heading.len()..]
        .find("\n## ")
        .map_or(section.len(), |i| i + heading.len());
    let section = &section[..end];
    let fence = format!("\n```{lang}\n");
    let open = section
        .find(&fence)
        .ok_or_else(|| format!("{file}'s '{heading}' has no {lang} block"))?;
    let body = &section[open + fence.len()..];
    let close = body
        .find("\n```")
        .ok_or_else(|| format!("{file}'s '{heading}' {lang} block is not closed"))?;
    Ok(body[..close + 1].to_string())
}

/// The first `sh` block of [`INSTALL_SECTION`] in `guide`.
pub fn install_block_of(guide: &str) -> Result<String, String> {
    sh_block_of(guide, INSTALL_SECTION)
}

fn guide() -> String {
    let path = workspace_root().join(GUIDE);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// The install block of this repository's [`GUIDE`].
pub fn install_block() -> String {
    install_block_of(&guide()).unwrap_or_else(|e| panic!("{e}"))
}

/// The lines of `block` down to its last `skopeo copy` command (with that
/// command's continuation lines): what pushes the images.
pub fn through_image_push(block: &str) -> Result<String, String> {
    let lines: Vec<&str> = block.lines().collect();
    let last = lines
        .iter()
        .rposition(|l| l.trim_start().starts_with("skopeo copy"))
        .ok_or("the install block pushes no image (no `skopeo copy`)")?;
    let mut end = last;
    while lines[end].trim_end().ends_with('\\') && end + 1 < lines.len() {
        end += 1;
    }
    Ok(lines[..=end].join("\n") + "\n")
}

/// What installs openflux with Flux as the guide says: the install
/// block's image push, then the first `sh` block of
/// [`FLUX_INSTALL_SECTION`].
pub fn flux_install_block() -> String {
    let guide = guide();
    let push = install_block_of(&guide)
        .and_then(|b| through_image_push(&b))
        .unwrap_or_else(|e| panic!("{e}"));
    let flux = sh_block_of(&guide, FLUX_INSTALL_SECTION).unwrap_or_else(|e| panic!("{e}"));
    push + &flux
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

/// Removes openflux as docs/install.md's "Uninstall" does (steps 2 to 4:
/// the webhook configurations, what the clone's manifests applied, then the
/// validating configuration again), and the Flux objects of an earlier
/// install with Flux, so what follows installs from nothing.
pub fn uninstall(env: &Env) {
    for args in [
        &[
            "-n",
            "flux-system",
            "delete",
            "kustomizations.kustomize.toolkit.fluxcd.io,ocirepositories.source.toolkit.fluxcd.io",
            "openflux-http-source",
            "openflux",
            "--ignore-not-found",
            "--wait=true",
            "--timeout=120s",
        ][..],
        &[
            "delete",
            "mutatingwebhookconfiguration,validatingwebhookconfiguration",
            "openflux",
            "--ignore-not-found",
        ],
        &[
            "delete",
            "-k",
            "manifests/http-source/",
            "--ignore-not-found",
            "--wait=true",
            "--timeout=120s",
        ],
        &[
            "delete",
            "-k",
            "manifests/",
            "--ignore-not-found",
            "--wait=true",
            "--timeout=180s",
        ],
        // Step 4: openflux keeps its validating configuration and may have
        // written it again while it was stopping.
        &[
            "delete",
            "validatingwebhookconfiguration",
            "openflux",
            "--ignore-not-found",
        ],
    ] {
        let out = env.run_kubectl(args, None);
        assert!(
            out.status.success(),
            "kubectl {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    }
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

/// The openflux image again, from the release binaries `make images`
/// built, stamped `epoch` (`SOURCE_DATE_EPOCH`): the same program under
/// another digest, as a new release would be. Pushed to the cell's registry
/// as `openflux:<tag>` with skopeo (as the guide does); returns the
/// reference by digest, `<registry>/openflux@sha256:...`.
pub fn push_restamped_openflux(env: &Env, epoch: u64, tag: &str) -> String {
    let root = workspace_root();
    let out_dir = tempfile::tempdir().expect("a temp dir");
    let built = Command::new(root.join("images/build"))
        .arg("--no-cargo")
        .env("IMAGES_OUT", out_dir.path())
        .env("SOURCE_DATE_EPOCH", epoch.to_string())
        .stdin(Stdio::null())
        .output()
        .expect("running images/build");
    assert!(
        built.status.success(),
        "images/build --no-cargo: {}",
        String::from_utf8_lossy(&built.stderr)
    );
    let registry = registry(env);
    let digest_file = out_dir.path().join("openflux.digest");
    let pushed = Command::new("skopeo")
        .arg("copy")
        .arg("--digestfile")
        .arg(&digest_file)
        .arg(format!(
            "oci-archive:{}",
            out_dir.path().join("openflux.oci.tar").display()
        ))
        .arg(format!("docker://{registry}/openflux:{tag}"))
        .stdin(Stdio::null())
        .output()
        .expect("running skopeo");
    assert!(
        pushed.status.success(),
        "skopeo copy to {registry}: {}",
        String::from_utf8_lossy(&pushed.stderr)
    );
    let digest = std::fs::read_to_string(&digest_file).expect("skopeo's digest file");
    format!("{registry}/openflux@{}", digest.trim())
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

/// Runs the guide's install block (bash, `-euo pipefail`) from the
/// repository root against the nodes cell: `kubectl` is the cell's,
/// `REGISTRY` the cell's registry (plain HTTP: the cell tells skopeo so in
/// a registries.conf drop-in, as a user does), `openflux` the release
/// binary `make images` builds. Its outputs are removed before and after.
/// Panics with the block's output when it fails.
pub fn install_as_the_guide_says(env: &Env) -> Output {
    run_block(env, &install_block(), "install beside Flux")
}

/// Installs openflux with Flux from its OCI artifact as the guide says
/// ([`flux_install_block`]), the artifact pushed to the cell's registry
/// (plain HTTP, so `OCI_INSECURE=true` as the guide tells).
pub fn install_with_flux_as_the_guide_says(env: &Env) -> Output {
    run_block(env, &flux_install_block(), "install with Flux")
}

fn run_block(env: &Env, block: &str, what: &str) -> Output {
    let root = workspace_root()
        .canonicalize()
        .expect("the repository root");
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
    // The block's `make images` is the build e2e_images made: with the
    // test's cargo variables it would build the release binaries again.
    let mut bash = Command::new("bash");
    let out = crate::openflux::without_test_env(&mut bash)
        .args(["-euo", "pipefail", "-c", block])
        .current_dir(&root)
        .env("KUBECONFIG", &kubeconfig)
        .env("REGISTRY", &registry)
        .env("OCI_INSECURE", "true")
        .env("PATH", path)
        .stdin(Stdio::null())
        .output()
        .expect("running bash");
    remove_outputs(&root);
    assert!(
        out.status.success(),
        "{GUIDE}'s {what} block failed ({}):\n{block}\n----- stdout\n{}\n----- stderr\n{}",
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
        let guide = "# x\n\n## Install from a clone\n\ntext\n\n```yaml\na: b\n```\n\n```sh\nmake images\nkubectl apply -k x/\n```\n\n```sh\nno\n```\n\n## Next\n\n```sh\nother\n```\n";
        assert_eq!(
            install_block_of(guide).unwrap(),
            "make images\nkubectl apply -k x/\n"
        );
        assert!(install_block_of(
            "\n## Install from a clone\n\nno block\n## Next\n```sh\nx\n```\n"
        )
        .unwrap_err()
        .contains("has no sh block"));
        assert!(install_block_of("# none\n")
            .unwrap_err()
            .contains("no section"));
    }

    #[test]
    fn the_image_push_ends_with_the_last_skopeo_copy_and_its_continuations() {
        let block =
            "make images\nskopeo copy a \\\n  b\nskopeo copy c \\\n  d\nkubectl apply -k x/\n";
        assert_eq!(
            through_image_push(block).unwrap(),
            "make images\nskopeo copy a \\\n  b\nskopeo copy c \\\n  d\n"
        );
        assert!(through_image_push("make images\n").is_err());
    }

    #[test]
    fn the_guide_installs_with_flux_from_the_pushed_images() {
        let block = flux_install_block();
        assert!(block.contains("skopeo copy"), "{block}");
        assert!(block.contains("make manifests-artifact"), "{block}");
        assert!(!block.contains("kubectl apply -k"), "{block}");
        assert!(block.contains("kind: OCIRepository"), "{block}");
    }

    #[test]
    fn the_guide_has_an_install_block_that_installs_with_kubectl() {
        let block = install_block();
        assert!(block.contains("make images"), "{block}");
        assert!(block.contains("kubectl apply -k"), "{block}");
    }
}
