# shellcheck shell=bash
# Sourced by e2e/cluster when OPENFLUX_E2E_NODES=1 (the `nodes` cell): real
# nodes on the local control plane, so that Pods run as in a cluster.
#
# Network (only 198.18.0.0/15, nothing routed off the machine):
#   bridge NODES_BRIDGE on the host, address NODES_HOST_IP (198.18.0.1/24):
#   the API server, the fixtures server, the registry and the cluster DNS
#   listen there; node i lives in the network namespace ofx-node-<i> with a
#   veth (ofx0, address 198.18.0.1<i>) into the bridge; its Pods get
#   198.18.<i>.0/24 (CNI bridge + host-local inside the node's namespace);
#   the host routes each Pod range to its node. Services: 198.19.0.0/16
#   (the `kubernetes` Service 198.19.0.1, cluster DNS 198.19.0.10). Nodes
#   have no default route: a Pod reaches nothing outside 198.18.0.0/15.
# Each node: its own containerd (root, state, sockets under the node's dir,
#   pulls through hosts.toml from the cell's registry only), kubelet (root
#   dir, cgroupRoot /openflux-e2e-<node>, ports base+700+10i..), kube-proxy
#   (iptables mode, inside the node's namespace, so its rules go with it).
# Cluster-wide: kube-scheduler, the registry (Debian's docker-registry on
#   NODES_HOST_IP:base+590), CoreDNS (NODES_HOST_IP:base+553, behind the
#   kube-dns Service), the pause image pushed there.
#
# Expects the variables and helpers of e2e/cluster (STATE, BIN_DIR, HOST,
# say, die, fail_up, log_tail, kubectl_, client_cert, kubeconfig).

# shellcheck source=e2e/lib/flux-install.sh
source "$E2E_DIR/lib/flux-install.sh"

NODES_COUNT=2
NODES_BRIDGE=ofx-nodes0
NODES_HOST_IP=198.18.0.1
NODES_SERVICE_CIDR=198.19.0.0/16
NODES_KUBERNETES_SERVICE_IP=198.19.0.1
NODES_DNS_SERVICE_IP=198.19.0.10
NODES_POD_CIDR=198.18.0.0/16
NODES_CLUSTER_DOMAIN=cluster.local
# The Debian packages a node needs (installed by nodes_packages).
NODES_PACKAGES=(containerd runc containernetworking-plugins iptables conntrack docker-registry skopeo)
NODES_CNI_BIN=/usr/lib/cni
NODES_SKOPEO_CONF=/etc/containers/registries.conf.d/openflux-e2e-nodes.conf

nodes_ports() {
  local base=$1
  SCHEDULER_PORT=$((base + 259))
  REGISTRY_PORT=$((base + 590))
  DNS_PORT=$((base + 553))
  REGISTRY=$NODES_HOST_IP:$REGISTRY_PORT
  PAUSE_IMAGE=$REGISTRY/openflux-e2e/pause:1
}

node_name() { echo "node-$1"; }
node_ip() { echo "198.18.0.1$1"; }
node_netns() { echo "ofx-node-$1"; }
node_dir() { echo "$STATE/nodes/node-$1"; }
node_pod_cidr() { echo "198.18.$1.0/24"; }
node_cgroup() { echo "openflux-e2e-node-$1"; }
node_port() { echo $((NODES_BASE + 700 + 10 * $1 + $2)); } # node_port I OFFSET

# ------------------------------------------------------------- packages ----

# nodes_packages: installs the Debian packages the nodes need (as .ci/run
# installs its own), once.
nodes_packages() {
  local pkg missing=()
  for pkg in "${NODES_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || missing+=("$pkg")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  [ "$(id -u)" = 0 ] || die "the nodes cell needs the Debian packages ${missing[*]} and root to install them"
  say "installing Debian packages: ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq >"$STATE.apt.log" 2>&1 &&
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >>"$STATE.apt.log" 2>&1 ||
    { tail -n 20 "$STATE.apt.log" >&2; die "installing ${missing[*]} failed (log: $STATE.apt.log)"; }
  rm -f "$STATE.apt.log"
}

nodes_check_host() {
  [ "$(id -u)" = 0 ] || die "the nodes cell runs kubelets and containerd: it needs root"
  local tool
  for tool in ip nsenter containerd containerd-shim-runc-v2 runc iptables docker-registry skopeo; do
    command -v "$tool" >/dev/null || die "$tool is missing (Debian packages: ${NODES_PACKAGES[*]})"
  done
  [ -x "$NODES_CNI_BIN/bridge" ] && [ -x "$NODES_CNI_BIN/host-local" ] && [ -x "$NODES_CNI_BIN/loopback" ] ||
    die "the CNI plugins bridge, host-local and loopback are missing in $NODES_CNI_BIN (Debian package containernetworking-plugins)"
  [ -d /sys/fs/cgroup/memory ] || [ -f /sys/fs/cgroup/cgroup.controllers ] || die "no cgroup hierarchy under /sys/fs/cgroup"
  if ip link show "$NODES_BRIDGE" >/dev/null 2>&1; then
    die "the bridge $NODES_BRIDGE exists already: another nodes cell runs on this machine (only one can)"
  fi
}

# ---------------------------------------------------------------- pki ----

# nodes_pki: certificates of the node components (in pki/, beside the
# control plane's).
nodes_pki() {
  local i
  (
    cd "$STATE/pki"
    umask 077
    printf '%s\n' "keyUsage=critical,digitalSignature,keyEncipherment" "extendedKeyUsage=clientAuth" >client.ext
    client_cert kube-scheduler "/CN=system:kube-scheduler"
    client_cert kube-proxy "/CN=system:kube-proxy"
    client_cert coredns "$(service_account_subject kube-system coredns)"
    # The API server's client certificate towards kubelets (logs, exec).
    client_cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client"
    for i in $(seq 1 "$NODES_COUNT"); do
      client_cert "$(node_name "$i")" "/O=system:nodes/CN=system:node:$(node_name "$i")"
      # The kubelet's serving certificate.
      openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "kubelet-$i.key" -out "kubelet-$i.csr" \
        -subj "/CN=$(node_name "$i")" 2>/dev/null
      printf '%s\n' "subjectAltName=IP:$(node_ip "$i"),DNS:$(node_name "$i")" \
        "keyUsage=critical,digitalSignature,keyEncipherment" "extendedKeyUsage=serverAuth" >"kubelet-$i.ext"
      openssl x509 -req -in "kubelet-$i.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 \
        -extfile "kubelet-$i.ext" -out "kubelet-$i.crt" 2>/dev/null
    done
    rm -f ./*.csr ./*.ext ./*.srl
  ) || die "generating the node certificates with openssl failed"
  kubeconfig "$STATE/kube-scheduler.kubeconfig" kube-scheduler
  kubeconfig "$STATE/kube-proxy.kubeconfig" kube-proxy
  kubeconfig "$STATE/coredns.kubeconfig" coredns
  for i in $(seq 1 "$NODES_COUNT"); do
    kubeconfig "$STATE/$(node_name "$i").kubeconfig" "$(node_name "$i")"
  done
}

# ------------------------------------------------------------- network ----

# nodes_network_up: the bridge, the host's address on it, forwarding on.
nodes_network_up() {
  cat /proc/sys/net/ipv4/ip_forward >"$STATE/nodes/ip_forward.saved"
  ip link add "$NODES_BRIDGE" type bridge || die "creating the bridge $NODES_BRIDGE failed"
  echo "$NODES_BRIDGE" >"$STATE/nodes/bridge"
  ip addr add "$NODES_HOST_IP/24" dev "$NODES_BRIDGE"
  ip link set "$NODES_BRIDGE" up
  sysctl -qw net.ipv4.ip_forward=1
}

# node_network_up I: the node's namespace, its veth into the bridge, the
# host's route to its Pods.
node_network_up() {
  local i=$1 ns host_if
  ns=$(node_netns "$i")
  host_if=ofx-n$i
  ip netns add "$ns" || fail_up "creating the network namespace $ns failed"
  echo "$ns" >>"$STATE/nodes/netns"
  ip link add "$host_if" type veth peer name ofx0 netns "$ns"
  ip link set "$host_if" master "$NODES_BRIDGE" up
  ip -n "$ns" link set lo up
  ip -n "$ns" addr add "$(node_ip "$i")/24" dev ofx0
  ip -n "$ns" link set ofx0 up
  # Service addresses are translated by kube-proxy; the route makes them
  # routable for the node's own processes.
  ip -n "$ns" route add "$NODES_SERVICE_CIDR" via "$NODES_HOST_IP" dev ofx0
  # The other nodes' Pods, through the host.
  ip -n "$ns" route add "$NODES_POD_CIDR" via "$NODES_HOST_IP" dev ofx0
  ip route add "$(node_pod_cidr "$i")" via "$(node_ip "$i")" dev "$NODES_BRIDGE"
  nsenter --net="/run/netns/$ns" sysctl -qw net.ipv4.ip_forward=1
}

# --------------------------------------------------------------- start ----

# node_start I NAME BINARY ARGS...: runs BINARY in node I's network
# namespace, detached, logging to logs/node-I.NAME.log; its PID goes to
# nodes/node-I/pids/NAME.pid.
node_start() {
  local i=$1 name=$2 bin=$3 dir
  shift 3
  dir=$(node_dir "$i")
  say "starting $name on $(node_name "$i")"
  setsid nsenter --net="/run/netns/$(node_netns "$i")" -- "$bin" "$@" \
    </dev/null >>"$STATE/logs/$(node_name "$i").$name.log" 2>&1 9>&- &
  echo $! >"$dir/pids/$name.pid"
}

# node_pid I NAME: the PID node_start recorded for node I's NAME.
node_pid() { cat "$(node_dir "$1")/pids/$2.pid" 2>/dev/null || true; }

# node_alive I NAME BINARY: the process node_start started runs BINARY, or
# is still on its way there (node_start's setsid and nsenter exec into it
# under the same pid, which takes a moment on a busy machine).
node_alive() {
  local pid exe
  pid=$(node_pid "$1" "$2")
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 1
  exe=$(readlink "/proc/$pid/exe" 2>/dev/null || true)
  exe=${exe% (deleted)}
  case "${exe##*/}" in
    "${3##*/}" | setsid | nsenter) return 0 ;;
    *) return 1 ;;
  esac
}

# node_running I NAME BINARY: like running, for a node's process.
node_running() {
  node_alive "$@" || launching "$(node_pid "$1" "$2")"
}

# node_wait I NAME BINARY WHAT COMMAND...: like wait_until, for a node's process.
node_wait() {
  local i=$1 name=$2 bin=$3 what=$4 deadline=$(($(date +%s) + TIMEOUT))
  shift 4
  until "$@" >/dev/null 2>&1; do
    if gone node_running "$i" "$name" "$bin"; then
      log_tail "$(node_name "$i").$name"
      fail_up "$name of $(node_name "$i") exited while waiting for $what ($(process_state "$(node_pid "$i" "$name")"))"
    fi
    if [ "$(date +%s)" -ge "$deadline" ]; then
      log_tail "$(node_name "$i").$name"
      fail_up "timed out after ${TIMEOUT}s waiting for $what"
    fi
    sleep 0.5
  done
  say "$what: ok"
}

in_node() { local i=$1; shift; nsenter --net="/run/netns/$(node_netns "$i")" -- "$@"; }

# ------------------------------------------------------- images, registry ----

# oci_image_archive OUT NAME TAG BINARY ENTRYPOINT USER: a one-layer OCI
# image archive (OCI layout in a tar) of a static BINARY at ENTRYPOINT, packed
# as images/build packs openflux's (sorted entries, owner 0:0, time 0).
oci_image_archive() {
  local out=$1 name=$2 tag=$3 bin=$4 entry=$5 user=$6 work layout root raw gz
  work=$(mktemp -d "$STATE/oci.XXXXXX")
  layout=$work/layout root=$work/root
  mkdir -p "$layout/blobs/sha256" "$root$(dirname "$entry")" "$root/tmp" "$root/etc"
  cp "$bin" "$root$entry"
  chmod 0755 "$root$entry"
  chmod 1777 "$root/tmp"
  printf '%s\n' "root:x:0:0:root:/root:/sbin/nologin" "nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin" \
    "nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin" >"$root/etc/passwd"
  printf '%s\n' "root:x:0:" "nonroot:x:65532:" "nogroup:x:65534:" >"$root/etc/group"
  raw=$work/layer.tar gz=$work/layer.tar.gz
  (cd "$root" && LC_ALL=C tar --create --file="$raw" --format=ustar --sort=name --mtime=@0 \
    --owner=0 --group=0 --numeric-owner -- etc tmp "${entry#/}")
  gzip -n -9 -c "$raw" >"$gz"
  local diff_id layer_digest layer_size config config_digest manifest manifest_digest
  diff_id=$(sha256sum "$raw" | cut -d' ' -f1)
  layer_digest=$(sha256sum "$gz" | cut -d' ' -f1)
  layer_size=$(stat -c %s "$gz")
  mv "$gz" "$layout/blobs/sha256/$layer_digest"
  config=$work/config.json
  printf '{"architecture":"amd64","os":"linux","created":"1970-01-01T00:00:00Z","config":{"User":"%s","Entrypoint":["%s"],"Env":["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],"WorkingDir":"/"},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]},"history":[{"created":"1970-01-01T00:00:00Z","created_by":"e2e/lib/nodes.sh %s"}]}' \
    "$user" "$entry" "$diff_id" "$name" >"$config"
  config_digest=$(sha256sum "$config" | cut -d' ' -f1)
  printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"sha256:%s","size":%s}]}' \
    "$config_digest" "$(stat -c %s "$config")" "$layer_digest" "$layer_size" >"$work/manifest.json"
  mv "$config" "$layout/blobs/sha256/$config_digest"
  manifest_digest=$(sha256sum "$work/manifest.json" | cut -d' ' -f1)
  printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,"annotations":{"org.opencontainers.image.ref.name":"%s"}}]}' \
    "$manifest_digest" "$(stat -c %s "$work/manifest.json")" "$tag" >"$layout/index.json"
  mv "$work/manifest.json" "$layout/blobs/sha256/$manifest_digest"
  printf '{"imageLayoutVersion":"1.0.0"}' >"$layout/oci-layout"
  tar --create --file="$out" --directory="$layout" --format=ustar --sort=name --mtime=@0 \
    --owner=0 --group=0 --numeric-owner -- blobs index.json oci-layout
  rm -rf "$work"
}

# registry_push ARCHIVE REFERENCE: copies an OCI archive into the cell's
# registry (plain HTTP on the cell's address), as the install guides' users do.
registry_push() {
  skopeo copy --quiet --dest-tls-verify=false "oci-archive:$1" "docker://$2" >>"$STATE/logs/registry-push.log" 2>&1 ||
    { log_tail registry-push; fail_up "pushing $1 to $2 failed"; }
}

nodes_registry_up() {
  mkdir -p "$STATE/registry"
  cat >"$STATE/registry/config.yml" <<EOF
version: 0.1
log:
  level: warn
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: $STATE/registry/data
  delete:
    enabled: true
http:
  addr: $REGISTRY
EOF
  # The registry has no TLS: skopeo is told so as a user tells it, in a
  # registries.conf drop-in (removed by `down`), so the guide's commands
  # push to it unchanged.
  mkdir -p "$(dirname "$NODES_SKOPEO_CONF")"
  printf '# the openflux e2e nodes cell (%s)\n[[registry]]\nlocation = "%s"\ninsecure = true\n' \
    "$STATE" "$REGISTRY" >"$NODES_SKOPEO_CONF"
  echo "$NODES_SKOPEO_CONF" >"$STATE/nodes/skopeo-conf"
  start_extra_process registry "$(command -v docker-registry)" serve "$STATE/registry/config.yml"
  wait_extra registry docker-registry "the registry on $REGISTRY" curl -fsS "http://$REGISTRY/v2/"
  oci_image_archive "$STATE/registry/pause.oci.tar" pause "$PAUSE_IMAGE" "$BIN_DIR/pause" /pause 65535:65535
  registry_push "$STATE/registry/pause.oci.tar" "$PAUSE_IMAGE"
  say "pause image pushed: $PAUSE_IMAGE"
}

# start_extra_process NAME BINARY ARGS...: a host process of the cell that
# is not one of the control plane's binaries (pids/NAME.pid, logs/NAME.log).
start_extra_process() {
  local name=$1 bin=$2
  shift 2
  say "starting $name"
  setsid "$bin" "$@" </dev/null >>"$STATE/logs/$name.log" 2>&1 9>&- &
  echo $! >"$STATE/nodes/pids/$name.pid"
}

# extra_pid NAME: the PID start_extra_process recorded for NAME.
extra_pid() { cat "$STATE/nodes/pids/$1.pid" 2>/dev/null || true; }

extra_alive() {
  local pid exe
  pid=$(extra_pid "$1")
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 1
  exe=$(readlink "/proc/$pid/exe" 2>/dev/null || true)
  exe=${exe% (deleted)}
  [ "${exe##*/}" = "$2" ]
}

# extra_running NAME BINARY: like running, for a process of the cell's own.
extra_running() { extra_alive "$@" || launching "$(extra_pid "$1")"; }

# wait_extra NAME BINARY WHAT COMMAND...
wait_extra() {
  local name=$1 bin=$2 what=$3 deadline=$(($(date +%s) + TIMEOUT))
  shift 3
  until "$@" >/dev/null 2>&1; do
    if gone extra_running "$name" "$bin"; then
      log_tail "$name"
      fail_up "$name exited while waiting for $what ($(process_state "$(extra_pid "$name")"))"
    fi
    if [ "$(date +%s)" -ge "$deadline" ]; then log_tail "$name"; fail_up "timed out after ${TIMEOUT}s waiting for $what"; fi
    sleep 0.5
  done
  say "$what: ok"
}

# ------------------------------------------------------------------ dns ----

nodes_dns_up() {
  mkdir -p "$STATE/coredns"
  # Only the cluster's own names: nothing is forwarded anywhere.
  cat >"$STATE/coredns/Corefile" <<EOF
.:$DNS_PORT {
    bind $NODES_HOST_IP
    errors
    health 127.0.0.1:$((NODES_BASE + 554))
    ready 127.0.0.1:$((NODES_BASE + 555))
    kubernetes $NODES_CLUSTER_DOMAIN in-addr.arpa ip6.arpa {
        kubeconfig $STATE/coredns.kubeconfig openflux-e2e
        pods insecure
    }
    cache 5
}
EOF
  kubectl_ apply --server-side --force-conflicts -f - >>"$STATE/logs/nodes.log" 2>&1 <<EOF ||
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "system:coredns"}
rules:
- apiGroups: [""]
  resources: [endpoints, services, pods, namespaces]
  verbs: [list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "system:coredns"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:coredns"}
subjects:
- {kind: ServiceAccount, name: coredns, namespace: kube-system}
---
apiVersion: v1
kind: Service
metadata:
  name: kube-dns
  namespace: kube-system
  labels: {k8s-app: kube-dns, kubernetes.io/name: CoreDNS}
spec:
  clusterIP: $NODES_DNS_SERVICE_IP
  ports:
  - {name: dns, port: 53, protocol: UDP, targetPort: $DNS_PORT}
  - {name: dns-tcp, port: 53, protocol: TCP, targetPort: $DNS_PORT}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: kube-dns-host
  namespace: kube-system
  labels: {kubernetes.io/service-name: kube-dns, endpointslice.kubernetes.io/managed-by: openflux-e2e}
addressType: IPv4
endpoints:
- addresses: [$NODES_HOST_IP]
  conditions: {ready: true}
ports:
- {name: dns, port: $DNS_PORT, protocol: UDP}
- {name: dns-tcp, port: $DNS_PORT, protocol: TCP}
EOF
    { log_tail nodes; fail_up "installing the cluster DNS's Service and RBAC failed"; }
  start_extra_process coredns "$BIN_DIR/coredns" -conf "$STATE/coredns/Corefile"
  wait_extra coredns coredns "CoreDNS ready" curl -fsS "http://127.0.0.1:$((NODES_BASE + 555))/ready"
}

# ---------------------------------------------------------------- nodes ----

node_cgroups_up() {
  local cg=$1 ctrl
  for ctrl in /sys/fs/cgroup/*/; do
    ctrl=${ctrl%/}
    [ -f "$ctrl/cgroup.procs" ] || continue
    case ${ctrl##*/} in unified) continue ;; esac
    mkdir -p "$ctrl/$cg"
    if [ -f "$ctrl/cpuset.cpus" ]; then
      cat "$ctrl/cpuset.cpus" >"$ctrl/$cg/cpuset.cpus"
      cat "$ctrl/cpuset.mems" >"$ctrl/$cg/cpuset.mems"
    fi
  done
}

node_files() {
  local i=$1 dir name ip p=$STATE/pki
  dir=$(node_dir "$i")
  name=$(node_name "$i")
  ip=$(node_ip "$i")
  mkdir -p "$dir"/{pids,containerd/root,containerd/state,kubelet,volume-plugins,pod-logs,cert,cni/net.d,cni/ipam,certs.d/"$REGISTRY"}
  # Image names stay as they are written (ghcr.io/fluxcd/...): every
  # registry the cell's images name is served by the cell's registry, and
  # only by it (no fallback to the real one).
  local reg
  for reg in "$REGISTRY" ghcr.io docker.io; do
    mkdir -p "$dir/certs.d/$reg"
    cat >"$dir/certs.d/$reg/hosts.toml" <<EOF
server = "http://$REGISTRY"

[host."http://$REGISTRY"]
  capabilities = ["pull", "resolve"]
EOF
  done
  cat >"$dir/containerd/config.toml" <<EOF
version = 2
root = "$dir/containerd/root"
state = "$dir/containerd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = "$dir/containerd/containerd.sock"

[ttrpc]
  address = "$dir/containerd/containerd.sock.ttrpc"

[debug]
  address = ""

[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = "$dir/containerd/opt"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  max_container_log_line_size = 16384

  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"

    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"

      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        BinaryName = "$(command -v runc)"

  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$NODES_CNI_BIN"
    conf_dir = "$dir/cni/net.d"
    max_conf_num = 1

  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "$dir/certs.d"
EOF
  cat >"$dir/cni/net.d/10-openflux-e2e.conflist" <<EOF
{
  "cniVersion": "0.4.0",
  "name": "openflux-e2e",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "cni0",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "$dir/cni/ipam",
        "ranges": [[{"subnet": "$(node_pod_cidr "$i")"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    },
    {"type": "loopback"}
  ]
}
EOF
  # The Pods' resolver is the cluster DNS (kubelet's clusterDNS); this file
  # (never the machine's /etc/resolv.conf) is what dnsPolicy: Default gets.
  printf 'nameserver %s\noptions ndots:5\n' "$NODES_DNS_SERVICE_IP" >"$dir/resolv.conf"
  cat >"$dir/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $ip
port: $(node_port "$i" 0)
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $(node_port "$i" 1)
tlsCertFile: $p/kubelet-$i.crt
tlsPrivateKeyFile: $p/kubelet-$i.key
rotateCertificates: false
serverTLSBootstrap: false
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $p/ca.crt}
authorization: {mode: Webhook}
containerRuntimeEndpoint: unix://$dir/containerd/containerd.sock
cgroupDriver: cgroupfs
cgroupRoot: /$(node_cgroup "$i")
cgroupsPerQOS: true
failCgroupV1: false
failSwapOn: false
clusterDomain: $NODES_CLUSTER_DOMAIN
clusterDNS: [$NODES_DNS_SERVICE_IP]
resolvConf: $dir/resolv.conf
volumePluginDir: $dir/volume-plugins
podLogsDir: $dir/pod-logs
staticPodPath: ""
serializeImagePulls: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: 100Mi
  nodefs.available: 1%
  nodefs.inodesFree: 1%
  imagefs.available: 1%
makeIPTablesUtilChains: false
protectKernelDefaults: false
nodeStatusReportFrequency: 10s
nodeStatusUpdateFrequency: 5s
maxPods: 60
EOF
  cat >"$dir/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: $STATE/kube-proxy.kubeconfig
mode: iptables
hostnameOverride: $name
bindAddress: $ip
healthzBindAddress: 127.0.0.1:$(node_port "$i" 3)
metricsBindAddress: 127.0.0.1:$(node_port "$i" 2)
clusterCIDR: $NODES_POD_CIDR
detectLocalMode: ClusterCIDR
nodePortAddresses: [primary]
iptables:
  masqueradeAll: true
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
EOF
}

node_up() {
  local i=$1 dir name
  dir=$(node_dir "$i")
  name=$(node_name "$i")
  node_network_up "$i"
  node_files "$i"
  node_cgroups_up "$(node_cgroup "$i")"
  node_start "$i" containerd "$(command -v containerd)" --config "$dir/containerd/config.toml"
  node_wait "$i" containerd containerd "containerd of $name" test -S "$dir/containerd/containerd.sock"
  node_start "$i" kubelet "$BIN_DIR/kubelet" --config="$dir/kubelet.yaml" \
    --kubeconfig="$STATE/$name.kubeconfig" --root-dir="$dir/kubelet" --cert-dir="$dir/cert" \
    --hostname-override="$name" --node-ip="$(node_ip "$i")" --v=1
  node_start "$i" kube-proxy "$BIN_DIR/kube-proxy" --config="$dir/kube-proxy.yaml" --v=1
}

node_ready() {
  [ "$(kubectl_ get node "$1" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ]
}

# nodes_up: everything of the cell beyond the control plane (after the API
# server and the controller manager).
nodes_up() {
  local i
  [ -d /var/lib/kubelet ] || touch "$STATE/nodes/created-var-lib-kubelet"
  [ -d /var/log/containers ] || touch "$STATE/nodes/created-var-log-containers"
  nodes_registry_up
  nodes_dns_up
  for i in $(seq 1 "$NODES_COUNT"); do node_up "$i"; done
  for i in $(seq 1 "$NODES_COUNT"); do
    node_wait "$i" kubelet kubelet "$(node_name "$i") Ready" node_ready "$(node_name "$i")"
    node_wait "$i" kube-proxy kube-proxy "kube-proxy of $(node_name "$i")" \
      in_node "$i" curl -fsS "http://127.0.0.1:$(node_port "$i" 3)/healthz"
  done
  flux_install "${OPENFLUX_E2E_FLUX_INSTALL:-default}"
}

# ----------------------------------------------------------------- down ----

# pids_in_cgroup CGROUP: every process under it, in every hierarchy.
pids_in_cgroup() {
  local d
  for d in /sys/fs/cgroup/*/"$1"; do
    [ -d "$d" ] || continue
    find "$d" -name cgroup.procs -exec cat {} + 2>/dev/null
  done | sort -u
}

kill_and_wait() {
  local pids=("$@") pid deadline=$(($(date +%s) + 10))
  [ ${#pids[@]} -gt 0 ] || return 0
  kill -TERM "${pids[@]}" 2>/dev/null || true
  for pid in "${pids[@]}"; do
    while kill -0 "$pid" 2>/dev/null && [ "$(date +%s)" -lt "$deadline" ]; do sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  done
}

# node_down I: stops node I and removes what it left outside its dir.
node_down() {
  local i=$1 dir name pids cg f pid
  dir=$(node_dir "$i")
  name=$(node_name "$i")
  [ -d "$dir" ] || return 0
  for f in kube-proxy kubelet; do
    pid=$(cat "$dir/pids/$f.pid" 2>/dev/null || true)
    [ -n "$pid" ] && node_alive "$i" "$f" "$f" && kill_and_wait "$pid"
    rm -f "$dir/pids/$f.pid"
  done
  # Containers and their shims outlive kubelet and containerd: the
  # containers are every process in the node's cgroups, the shims those
  # started for this containerd's socket.
  cg=$(node_cgroup "$i")
  mapfile -t pids < <(pids_in_cgroup "$cg")
  kill_and_wait "${pids[@]}"
  mapfile -t pids < <(pgrep -f -- "containerd-shim-runc-v2 .*-address $dir/containerd/containerd.sock" || true)
  kill_and_wait "${pids[@]}"
  pid=$(cat "$dir/pids/containerd.pid" 2>/dev/null || true)
  [ -n "$pid" ] && node_alive "$i" containerd containerd && kill_and_wait "$pid"
  rm -f "$dir/pids/containerd.pid"
  # The node's cgroups, deepest first.
  for f in /sys/fs/cgroup/*/"$cg"; do
    [ -d "$f" ] && find "$f" -depth -type d -exec rmdir {} + 2>/dev/null
  done
  # Mounts under the node's dir (Pod volumes, container root file systems,
  # sandbox /dev/shm), deepest first.
  unmount_under "$dir"
  local ns
  ns=$(node_netns "$i")
  ip route del "$(node_pod_cidr "$i")" 2>/dev/null || true
  ip link del "ofx-n$i" 2>/dev/null || true
  ip netns del "$ns" 2>/dev/null || true
}

# node_stop I: node I is lost, as a machine that goes away: its link to the
# bridge goes down (what was sent to it gets no answer), then its kubelet,
# kube-proxy, containers and containerd are killed (SIGKILL). Its state
# stays; node_start brings it back.
node_stop() {
  local i=$1 dir f pid pids cg
  dir=$(node_dir "$i")
  [ -d "$dir" ] || die "no node $i in $STATE"
  ip link set "ofx-n$i" down
  for f in kube-proxy kubelet; do
    pid=$(cat "$dir/pids/$f.pid" 2>/dev/null || true)
    [ -n "$pid" ] && node_alive "$i" "$f" "$f" && kill -KILL "$pid" 2>/dev/null
  done
  cg=$(node_cgroup "$i")
  mapfile -t pids < <(pids_in_cgroup "$cg")
  [ ${#pids[@]} -eq 0 ] || kill -KILL "${pids[@]}" 2>/dev/null || true
  mapfile -t pids < <(pgrep -f -- "containerd-shim-runc-v2 .*-address $dir/containerd/containerd.sock" || true)
  [ ${#pids[@]} -eq 0 ] || kill -KILL "${pids[@]}" 2>/dev/null || true
  pid=$(cat "$dir/pids/containerd.pid" 2>/dev/null || true)
  [ -n "$pid" ] && node_alive "$i" containerd containerd && kill -KILL "$pid" 2>/dev/null
  say "$(node_name "$i") stopped (link down, processes killed)"
}

# node_start I: a node stopped by node_stop comes back and becomes Ready.
node_start_again() {
  local i=$1 dir name
  dir=$(node_dir "$i")
  name=$(node_name "$i")
  [ -d "$dir" ] || die "no node $i in $STATE"
  ip link set "ofx-n$i" up
  # The killed containerd left its sockets: wait for the new ones.
  rm -f "$dir/containerd/containerd.sock" "$dir/containerd/containerd.sock.ttrpc"
  node_start "$i" containerd "$(command -v containerd)" --config "$dir/containerd/config.toml"
  node_wait "$i" containerd containerd "containerd of $name" test -S "$dir/containerd/containerd.sock"
  node_start "$i" kubelet "$BIN_DIR/kubelet" --config="$dir/kubelet.yaml" \
    --kubeconfig="$STATE/$name.kubeconfig" --root-dir="$dir/kubelet" --cert-dir="$dir/cert" \
    --hostname-override="$name" --node-ip="$(node_ip "$i")" --v=1
  node_start "$i" kube-proxy "$BIN_DIR/kube-proxy" --config="$dir/kube-proxy.yaml" --v=1
  node_wait "$i" kubelet kubelet "kubelet of $name healthy" \
    in_node "$i" curl -fsS "http://127.0.0.1:$(node_port "$i" 1)/healthz"
  node_wait "$i" kubelet kubelet "$name Ready" node_ready "$name"
}

unmount_under() {
  local m
  awk -v d="$1/" 'index($2, d) == 1 { print $2 }' /proc/self/mounts | sort -r | while read -r m; do
    umount -l "$m" 2>/dev/null || true
  done
}

# nodes_down: the nodes, then the cell's host processes and what lives
# outside the state dir.
nodes_down() {
  [ -d "$STATE/nodes" ] || return 0
  local i name pid
  for i in $(seq 1 "$NODES_COUNT"); do node_down "$i"; done
  for name in coredns registry; do
    pid=$(extra_pid "$name")
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && kill_and_wait "$pid"
    rm -f "$STATE/nodes/pids/$name.pid"
  done
  # Sandboxes' network namespaces that containerd (stopped by force) left.
  local f
  for f in /run/netns/cni-*; do
    [ -e "$f" ] || continue
    umount "$f" 2>/dev/null || true
    rm -f "$f"
  done
  # Shim sockets (containerd keeps them in /run/containerd/s whatever its
  # state dir) and, when no other containerd runs, the directory.
  if ! pgrep -x containerd >/dev/null; then rm -rf /run/containerd; fi
  rm -rf /var/lib/cni
  # kubelet's fixed paths: the device plugin sockets and the container log links.
  if [ -f "$STATE/nodes/created-var-lib-kubelet" ]; then
    rm -rf /var/lib/kubelet
  else
    rm -rf /var/lib/kubelet/device-plugins
  fi
  if [ -d /var/log/containers ]; then
    find /var/log/containers -maxdepth 1 -type l -lname "$STATE/*" -delete 2>/dev/null || true
    [ -f "$STATE/nodes/created-var-log-containers" ] && rmdir /var/log/containers 2>/dev/null || true
  fi
  if [ -f "$STATE/nodes/skopeo-conf" ]; then
    rm -f "$(cat "$STATE/nodes/skopeo-conf")"
    rm -f "$STATE/nodes/skopeo-conf"
  fi
  if [ -f "$STATE/nodes/bridge" ]; then
    ip link del "$(cat "$STATE/nodes/bridge")" 2>/dev/null || true
    rm -f "$STATE/nodes/bridge"
  fi
  if [ -f "$STATE/nodes/ip_forward.saved" ]; then
    sysctl -qw "net.ipv4.ip_forward=$(cat "$STATE/nodes/ip_forward.saved")"
    rm -f "$STATE/nodes/ip_forward.saved"
  fi
  unmount_under "$STATE"
}

nodes_status() {
  local i name rc=0 state pid
  for i in $(seq 1 "$NODES_COUNT"); do
    for name in containerd kubelet kube-proxy; do
      if node_alive "$i" "$name" "$name"; then state=alive; else state=dead; rc=1; fi
      pid=$(node_pid "$i" "$name")
      printf '%-24s %-8s %s\n' "$(node_name "$i")/$name" "${pid:--}" "$state"
    done
  done
  for name in registry:docker-registry coredns:coredns; do
    if extra_alive "${name%%:*}" "${name#*:}"; then state=alive; else state=dead; rc=1; fi
    printf '%-24s %-8s %s\n' "${name%%:*}" "$(cat "$STATE/nodes/pids/${name%%:*}.pid" 2>/dev/null || echo -)" "$state"
  done
  return $rc
}
