//! openflux's Pods on the nodes cell ([`crate::Cell::Nodes`]) as installed
//! from `manifests/`: which are running, which one leads, and the memory
//! cgroup the kubelet made for each container.

use std::path::{Path, PathBuf};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};

use crate::Env;

/// The namespace `manifests/` installs openflux in.
pub const SYSTEM: &str = "openflux-system";
/// The label selector of openflux's Pods.
pub const OPENFLUX_PODS: &str = "app.kubernetes.io/name=openflux";

/// A running openflux Pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpenfluxPod {
    pub name: String,
    pub uid: String,
    pub ip: String,
    /// Restarts of its containers, summed.
    pub restarts: i32,
    /// Whether a container of it was ever killed for memory.
    pub oom_killed: bool,
}

/// openflux's Pods that have an address and are not being deleted.
pub async fn openflux_pods(env: &Env) -> Vec<OpenfluxPod> {
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), SYSTEM);
    let list = pods
        .list(&ListParams::default().labels(OPENFLUX_PODS))
        .await
        .expect("listing openflux's Pods");
    list.items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| {
            let status = p.status?;
            let ip = status.pod_ip?;
            let containers = status.container_statuses.unwrap_or_default();
            let restarts = containers.iter().map(|c| c.restart_count).sum();
            let oom_killed = containers.iter().any(|c| {
                let terminated = c
                    .last_state
                    .as_ref()
                    .and_then(|s| s.terminated.as_ref())
                    .or_else(|| c.state.as_ref().and_then(|s| s.terminated.as_ref()));
                terminated.is_some_and(|t| t.reason.as_deref() == Some("OOMKilled"))
            });
            Some(OpenfluxPod {
                name: p.metadata.name?,
                uid: p.metadata.uid?,
                ip,
                restarts,
                oom_killed,
            })
        })
        .collect()
}

/// The live openflux Pod holding the leader election Lease (its identity
/// is `<host name>_<random>`, the host name being the Pod's name). A Lease
/// still naming a Pod that is gone or going (after a rollout, until it
/// expires) names no leader.
pub async fn leader_pod(env: &Env) -> Option<String> {
    let holder = lease_holder(env).await?;
    openflux_pods(env)
        .await
        .iter()
        .any(|p| p.name == holder)
        .then_some(holder)
}

async fn lease_holder(env: &Env) -> Option<String> {
    let leases: Api<Lease> = Api::namespaced(env.client.clone(), SYSTEM);
    let list = leases.list(&ListParams::default()).await.ok()?;
    list.items
        .iter()
        .filter(|l| {
            l.metadata
                .name
                .as_deref()
                .is_some_and(|n| n.starts_with("openflux-leader-election"))
        })
        .find_map(|l| {
            let holder = l.spec.as_ref()?.holder_identity.clone()?;
            let (pod, _) = holder.rsplit_once('_')?;
            Some(pod.to_string())
        })
}

/// The memory cgroup (v1) of one container on the nodes: what the kubelet
/// charges it and limits it to.
#[derive(Clone, Debug)]
pub struct MemoryCgroup {
    /// The container's process.
    pub pid: u32,
    /// Its directory under `/sys/fs/cgroup/memory`.
    pub dir: PathBuf,
}

impl MemoryCgroup {
    /// The memory cgroup of each container running `binary` on the nodes
    /// ([`crate::nodes::node_processes`]).
    pub fn of_containers(binary: &str) -> Vec<MemoryCgroup> {
        crate::nodes::node_processes(binary)
            .into_iter()
            .filter_map(|pid| {
                let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
                let path = memory_path(&cgroups)?;
                let dir = Path::new("/sys/fs/cgroup/memory").join(path.trim_start_matches('/'));
                Some(MemoryCgroup { pid, dir })
            })
            .collect()
    }

    /// The UID of the Pod the container belongs to, from the cgroup path
    /// the kubelet chose (`.../pod<uid>/<container>`, or the systemd
    /// driver's `...-pod<uid with _>.slice/...`).
    pub fn pod_uid(&self) -> Option<String> {
        pod_uid_of(&self.dir.to_string_lossy())
    }

    /// The highest charge since the container started or the last
    /// [`MemoryCgroup::reset_peak`] (`memory.max_usage_in_bytes`).
    pub fn peak(&self) -> u64 {
        self.read("memory.max_usage_in_bytes")
    }

    /// The limit the kubelet set from the container's resources.
    pub fn limit(&self) -> u64 {
        self.read("memory.limit_in_bytes")
    }

    /// The charge now (`memory.usage_in_bytes`).
    pub fn usage(&self) -> u64 {
        self.read("memory.usage_in_bytes")
    }

    /// The working set, as the kubelet counts it against the limit: the
    /// charge less the inactive file pages the kernel can drop.
    pub fn working_set(&self) -> u64 {
        let inactive = std::fs::read_to_string(self.dir.join("memory.stat"))
            .ok()
            .and_then(|stat| stat_value(&stat, "total_inactive_file"))
            .unwrap_or(0);
        self.usage().saturating_sub(inactive)
    }

    /// The process's own peak resident set (`VmHWM`), in bytes: its
    /// whole life, file pages (the binary) included.
    pub fn process_peak_rss(&self) -> Option<u64> {
        self.process_status("VmHWM")
    }

    /// The process's resident anonymous memory now (`RssAnon`), in bytes:
    /// its heap and stacks, what a container is charged for its own
    /// allocations.
    pub fn process_anonymous_rss(&self) -> Option<u64> {
        self.process_status("RssAnon")
    }

    /// A `kB` field of `/proc/<pid>/status`, in bytes.
    fn process_status(&self, field: &str) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid)).ok()?;
        stat_value(&status.replace(':', " "), field).map(|kib| kib * 1024)
    }

    /// Starts [`MemoryCgroup::peak`] again from the charge now (cgroup v1
    /// resets it on a write).
    pub fn reset_peak(&self) {
        let path = self.dir.join("memory.max_usage_in_bytes");
        std::fs::write(&path, "0").unwrap_or_else(|e| panic!("resetting {}: {e}", path.display()));
    }

    fn read(&self, file: &str) -> u64 {
        let path = self.dir.join(file);
        let text =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        text.trim()
            .parse()
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }
}

/// The path of the memory controller's line in `/proc/<pid>/cgroup`.
fn memory_path(cgroups: &str) -> Option<String> {
    cgroups.lines().find_map(|l| {
        let mut parts = l.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        controllers
            .split(',')
            .any(|c| c == "memory")
            .then(|| path.to_string())
    })
}

fn pod_uid_of(path: &str) -> Option<String> {
    let segment = path.split('/').find_map(|s| {
        let at = s.rfind("pod")?;
        let uid = s[at + 3..].trim_end_matches(".slice");
        (uid.len() == 36).then_some(uid)
    })?;
    Some(segment.replace('_', "-"))
}

/// The value of `key` in a `key value` listing (`memory.stat`).
fn stat_value(listing: &str, key: &str) -> Option<u64> {
    listing.lines().find_map(|l| {
        let mut parts = l.split_whitespace();
        (parts.next()? == key)
            .then(|| parts.next()?.parse().ok())
            .flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pod_uid_is_read_from_either_cgroup_driver() {
        let uid = "0b7c4a52-6a0e-4d7f-9a55-3f0c1d2e3f40";
        let cgroupfs =
            format!("/sys/fs/cgroup/memory/openflux-e2e-node-1/kubepods/burstable/pod{uid}/4f2a");
        assert_eq!(pod_uid_of(&cgroupfs).as_deref(), Some(uid));
        let systemd = format!(
            "/sys/fs/cgroup/memory/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-4f2a.scope",
            uid.replace('-', "_")
        );
        assert_eq!(pod_uid_of(&systemd).as_deref(), Some(uid));
        assert_eq!(pod_uid_of("/sys/fs/cgroup/memory/kubepods/burstable"), None);
    }

    #[test]
    fn the_memory_line_is_found_among_the_controllers() {
        let cgroups = "12:cpu,cpuacct:/a\n9:memory:/openflux-e2e-node-2/kubepods/podx/y\n0::/\n";
        assert_eq!(
            memory_path(cgroups).as_deref(),
            Some("/openflux-e2e-node-2/kubepods/podx/y")
        );
        let stat = "cache 4096\ntotal_inactive_file 8192\n";
        assert_eq!(stat_value(stat, "total_inactive_file"), Some(8192));
        assert_eq!(stat_value(stat, "inactive_file"), None);
    }
}
