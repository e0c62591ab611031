# shellcheck shell=bash disable=SC2034
# Sourced by e2e/cluster: which binaries a Flux line needs and how they are
# built and cached. Expects E2E_DIR, CACHE_ROOT, GO_PARALLEL, say and die, and
# e2e/versions.env sourced.
#
# Cache layout under CACHE_ROOT:
#   wrappers/<wrapper>-<key>/<binary>   what `go build` produced; <key> hashes
#                                       the wrapper module alone (go.mod,
#                                       go.sum, *.go, the build recipe), so a
#                                       new or changed wrapper rebuilds only
#                                       its own binaries
#   sets/flux-<line>-<key>/bin/         the bin dir users see: one symlink per
#                                       binary of the line; <key> hashes the
#                                       wrapper keys of the line
#   sets/flux-<line>-<key>/crds/        the line's Flux CRDs
# Nothing is ever deleted; remove old directories by hand.

# ----------------------------------------------------------- flux lines ----

# select_kubernetes [LINE]: sets KUBE_LINE, KUBE_WRAPPER and KUBE_VERSION,
# the control plane's Kubernetes release: the pinned KUBERNETES_VERSION
# (wrapper kubernetes) when LINE is empty, else KUBERNETES_<LINE>_VERSION
# (wrapper kubernetes-<LINE>, a control-plane cell's: its kube-apiserver and
# kube-controller-manager).
select_kubernetes() {
  KUBE_LINE=${1:-}
  case $KUBE_LINE in
    newest) KUBE_LINE=$KUBERNETES_NEWEST_LINE ;;
    oldest) KUBE_LINE=$KUBERNETES_OLDEST_LINE ;;
  esac
  if [ -z "$KUBE_LINE" ]; then
    KUBE_WRAPPER=kubernetes
    KUBE_VERSION=$KUBERNETES_VERSION
    return 0
  fi
  case $KUBE_LINE in
    "$KUBERNETES_NEWEST_LINE" | "$KUBERNETES_OLDEST_LINE") ;;
    *) die "unknown Kubernetes line '$KUBE_LINE' (OPENFLUX_E2E_KUBERNETES_LINE): known are" \
      "$KUBERNETES_NEWEST_LINE and $KUBERNETES_OLDEST_LINE (e2e/versions.env), or empty for $KUBERNETES_VERSION" ;;
  esac
  KUBE_WRAPPER=kubernetes-$KUBE_LINE
  KUBE_VERSION=$(kube_version "$KUBE_WRAPPER")
}

# kube_version WRAPPER: the k8s.io/kubernetes release a Kubernetes wrapper
# pins, as e2e/versions.env says.
kube_version() {
  local var
  case $1 in
    kubernetes | kubernetes-node) echo "$KUBERNETES_VERSION" ;;
    kubernetes-*)
      var=KUBERNETES_${1#kubernetes-}_VERSION
      var=${var//./_}
      [ -n "${!var:-}" ] || die "e2e/versions.env has no $var for the wrapper e2e/go/$1"
      echo "${!var}"
      ;;
    *) die "kube_version: $1 is no Kubernetes wrapper" ;;
  esac
}

# select_line LINE: sets FLUX_LINE and FLUX (the line's Flux binaries), one
# entry each: binary|wrapper dir under e2e/go|module|version|main package
# inside the module|kind (controller: started by `up`, its config/crd/bases
# installed; cli: only built). Controllers start in this order.
select_line() {
  case $1 in
    current | 2.9)
      FLUX_LINE=2.9
      FLUX=(
        "notification-controller|notification-controller|github.com/fluxcd/notification-controller|$NOTIFICATION_CONTROLLER_VERSION|.|controller"
        "source-controller|source-controller|github.com/fluxcd/source-controller|$SOURCE_CONTROLLER_VERSION|.|controller"
        "kustomize-controller|kustomize-controller|github.com/fluxcd/kustomize-controller|$KUSTOMIZE_CONTROLLER_VERSION|.|controller"
        "helm-controller|helm-controller|github.com/fluxcd/helm-controller|$HELM_CONTROLLER_VERSION|.|controller"
        "source-watcher|source-watcher|github.com/fluxcd/source-watcher/v2|$SOURCE_WATCHER_VERSION|cmd|controller"
        "flux|flux-cli|github.com/fluxcd/flux2/v2|$FLUX_CLI_VERSION|cmd/flux|cli"
      )
      ;;
    2.7)
      FLUX_LINE=2.7
      FLUX=(
        "source-controller|flux-2.7/source-controller|github.com/fluxcd/source-controller|$FLUX_2_7_SOURCE_CONTROLLER_VERSION|.|controller"
        "kustomize-controller|flux-2.7/kustomize-controller|github.com/fluxcd/kustomize-controller|$FLUX_2_7_KUSTOMIZE_CONTROLLER_VERSION|.|controller"
        "helm-controller|flux-2.7/helm-controller|github.com/fluxcd/helm-controller|$FLUX_2_7_HELM_CONTROLLER_VERSION|.|controller"
      )
      ;;
    *)
      die "unknown Flux line '$1' (OPENFLUX_E2E_FLUX_LINE): known are current (2.9) and 2.7;" \
        "older lines cannot be built from the Go module proxy (see e2e/versions.env)"
      ;;
  esac
  local entry name wrapper mod _v main kind
  # name|wrapper|package to build
  BINARIES=(
    "kube-apiserver|$KUBE_WRAPPER|k8s.io/kubernetes/cmd/kube-apiserver"
    "kube-controller-manager|$KUBE_WRAPPER|k8s.io/kubernetes/cmd/kube-controller-manager"
    # The client stays the pinned release's on every line: the scripts and
    # tests use its flags (`apply --subresource` is newer than 1.30).
    "kubectl|kubernetes|k8s.io/kubernetes/cmd/kubectl"
    "etcd|etcd|."
    "fixtures|fixtures|."
  )
  # The nodes cell (OPENFLUX_E2E_NODES=1, e2e/lib/nodes.sh) also runs a
  # scheduler, kubelets, kube-proxies, the cluster DNS and the sandbox
  # ("pause") program of its nodes' Pods.
  if [ "${OPENFLUX_E2E_NODES:-0}" = 1 ]; then
    BINARIES+=(
      "kube-scheduler|kubernetes-node|k8s.io/kubernetes/cmd/kube-scheduler"
      "kubelet|kubernetes-node|k8s.io/kubernetes/cmd/kubelet"
      "kube-proxy|kubernetes-node|k8s.io/kubernetes/cmd/kube-proxy"
      "coredns|coredns|."
      "pause|pause|."
    )
  fi
  FLUX_CONTROLLERS=()
  for entry in "${FLUX[@]}"; do
    IFS='|' read -r name wrapper mod _v main kind <<<"$entry"
    [ "$main" = . ] && main=$mod || main=$mod/$main
    BINARIES+=("$name|$wrapper|$main")
    [ "$kind" = controller ] && FLUX_CONTROLLERS+=("$name")
  done
  COMPONENTS=(etcd kube-apiserver kube-controller-manager fixtures "${FLUX_CONTROLLERS[@]}")

  local keys=()
  for entry in "${BINARIES[@]}"; do
    IFS='|' read -r name wrapper _ <<<"$entry"
    hash_wrapper "$wrapper"
    keys+=("$name=${WRAPPER_KEYS[$wrapper]}")
  done
  SET_DIR=$CACHE_ROOT/sets/flux-$FLUX_LINE${KUBE_LINE:+-kubernetes-$KUBE_LINE}-$(printf '%s\n' "${keys[@]}" | sha256sum | cut -c1-12)
  BIN_DIR=$SET_DIR/bin
  CRD_DIR=$SET_DIR/crds
}

# line_has BINARY: whether the selected line has that Flux binary.
line_has() {
  local entry
  for entry in "${FLUX[@]}"; do [ "${entry%%|*}" = "$1" ] && return 0; done
  return 1
}

# ---------------------------------------------------------------- cache ----

# build_recipe WRAPPER: names how the wrapper's binaries are built (flags in
# build_binary). Part of the cache key: change it when the recipe changes.
build_recipe() {
  case $1 in
    kubernetes | kubernetes-*) echo "go1.26+ cgo-off trimpath ldflags-v2 no-dwarf kube-version-stamp" ;;
    flux-cli) echo "go1.26+ cgo-off trimpath ldflags-v2 no-dwarf flux-version-stamp placeholder-manifests-v2" ;;
    spire) echo "go1.26+ cgo-on trimpath ldflags-v2 no-dwarf" ;;
    helm | cosign) echo "go1.26+ cgo-off trimpath ldflags-v2 no-dwarf version-stamp" ;;
    *) echo "go1.26+ cgo-off trimpath ldflags-v2 no-dwarf" ;;
  esac
}

declare -A WRAPPER_KEYS=()

# hash_wrapper WRAPPER: records in WRAPPER_KEYS 12 hex digits of the hash of
# the wrapper module's go.mod, go.sum and Go files and its build recipe.
hash_wrapper() {
  local w=$1 content
  [ -n "${WRAPPER_KEYS[$w]:-}" ] && return 0
  [ -f "$E2E_DIR/go/$w/go.mod" ] || die "no wrapper module e2e/go/$w"
  content=$(
    cd "$E2E_DIR/go/$w" || exit 1
    LC_ALL=C
    echo "recipe: $(build_recipe "$w")"
    for f in go.mod go.sum *.go; do
      [ -f "$f" ] && { echo "== $f"; cat "$f"; }
    done
    true
  ) || die "hashing e2e/go/$w failed"
  WRAPPER_KEYS[$w]=$(sha256sum <<<"$content" | cut -c1-12)
}

# binary_path NAME WRAPPER: where the cache keeps the built binary (after
# hash_wrapper WRAPPER).
binary_path() {
  echo "$CACHE_ROOT/wrappers/${2//\//-}-${WRAPPER_KEYS[$2]}/$1"
}

# ---------------------------------------------------------------- build ----

# The binaries are linked stripped (-s -w), so the compiler's DWARF would be
# thrown away at link time: not writing it takes about a fifth off a cold
# build's CPU time (measured on helm: 151 s to 116 s on 2 cores).
GO_GCFLAGS="all=-dwarf=false"

go_env() {
  env GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS="-mod=readonly -buildvcs=false" "$@"
}

check_go() {
  command -v go >/dev/null || die "the Go toolchain (1.26 or newer) is required to build the control plane"
  local v
  v=$(go env GOVERSION 2>/dev/null || true)
  v=${v#go}
  case $v in
    1.2[6-9]* | 1.[3-9][0-9]* | [2-9].*) ;;
    *) die "Go 1.26 or newer is required to build the control plane, found '${v:-none}'" ;;
  esac
}

# require_version WRAPPER MODULE VERSION: the wrapper's go.mod must pin it.
require_version() {
  local gomod=$E2E_DIR/go/$1/go.mod mod=${2//./\\.}
  grep -Eq "^[[:space:]]*(require[[:space:]]+)?${mod} ${3}([[:space:]]|$)" "$gomod" ||
    die "$gomod does not require $2 $3 as e2e/versions.env says; run e2e/go/sync $1"
}

check_versions() {
  local entry wrapper mod ver
  require_version "$KUBE_WRAPPER" k8s.io/kubernetes "$KUBE_VERSION"
  grep -Eq "^replace k8s\.io/api => k8s\.io/api v0\.${KUBE_VERSION#v1.}$" "$E2E_DIR/go/$KUBE_WRAPPER/go.mod" ||
    die "e2e/go/$KUBE_WRAPPER/go.mod does not pin the staging modules to v0.${KUBE_VERSION#v1.}; run e2e/go/sync $KUBE_WRAPPER"
  require_version etcd go.etcd.io/etcd/server/v3 "$ETCD_VERSION"
  for entry in "${FLUX[@]}"; do
    IFS='|' read -r _ wrapper mod ver _ <<<"$entry"
    require_version "$wrapper" "$mod" "$ver"
  done
}

# Version stamp of the Kubernetes binaries, the way the upstream release build
# does it (hack/lib/version.sh), so `kubectl version` reports the real version.
kube_ldflags() {
  local w=${1:-kubernetes} v major minor date commit flags="-s -w"
  v=$(kube_version "$w")
  major=${v#v}; major=${major%%.*}
  minor=${v#v*.}; minor=${minor%%.*}
  # Release time and content hash of the module as the proxy recorded them:
  # the module zip has no git metadata, so its checksum stands in for the commit.
  date=$(cd "$E2E_DIR/go/$w" &&
    go_env go list -m -f '{{.Time.UTC.Format "2006-01-02T15:04:05Z"}}' k8s.io/kubernetes 2>/dev/null || true)
  date=${date:-1970-01-01T00:00:00Z}
  commit=$(grep -E "^k8s\.io/kubernetes $v h1:" "$E2E_DIR/go/$w/go.sum" | sed 's/.* h1://' |
    base64 -d 2>/dev/null | od -An -tx1 | tr -d ' \n' | cut -c1-40)
  local pkg
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    flags+=" -X $pkg.gitVersion=$v -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
    flags+=" -X $pkg.gitCommit=$commit -X $pkg.gitTreeState=clean -X $pkg.buildDate=$date"
  done
  echo "$flags"
}

# flux_cli_module DIR: the flux CLI embeds its install manifests
# (cmd/flux/manifests/*.yaml), which its release build generates and the
# module does not contain (nor can a build overlay add files under the module
# cache). So the build uses a copy of the module in DIR/flux2 with one
# placeholder manifest, through DIR/go.mod (the wrapper's go.mod plus a
# replace directive). `flux install` and `flux bootstrap` do not work with
# this binary; every command that talks to a cluster (get, trace,
# reconcile, events, ...) does.
flux_cli_module() {
  local dir=$1 mod
  mod=$(cd "$E2E_DIR/go/flux-cli" && go_env go mod download -json github.com/fluxcd/flux2/v2 |
    sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
  [ -n "$mod" ] && [ -d "$mod/cmd/flux" ] || die "cannot find the source of github.com/fluxcd/flux2/v2 (module dir '$mod')"
  cp -r "$mod" "$dir/flux2"
  chmod -R u+w "$dir/flux2"
  mkdir -p "$dir/flux2/cmd/flux/manifests"
  echo "# Placeholder: this flux CLI is built without its install manifests." \
    >"$dir/flux2/cmd/flux/manifests/openflux-e2e-placeholder.yaml"
  cp "$E2E_DIR/go/flux-cli/go.mod" "$E2E_DIR/go/flux-cli/go.sum" "$dir/"
  go_env go mod edit -replace="github.com/fluxcd/flux2/v2=$dir/flux2" "$dir/go.mod"
}

HEARTBEAT_PID=
trap '[ -z "$HEARTBEAT_PID" ] || kill "$HEARTBEAT_PID" 2>/dev/null || true' EXIT

# heartbeat WHAT START: every 30 s, says that WHAT is still building; ends
# with this script.
heartbeat() {
  local parent=$$
  while sleep 30; do
    kill -0 "$parent" 2>/dev/null || exit 0
    say "... still building $1 ($(($(date +%s) - $2))s so far)"
  done
}

# build_binary NAME WRAPPER PACKAGE PROGRESS: builds one binary into the
# cache. A lock per wrapper key keeps two control planes from building the
# same thing at once; the second one waits and reuses the result.
build_binary() {
  local name=$1 w=$2 pkg=$3 progress=$4 dest dir start tmp ldflags="-s -w" args=() rc=0 cgo=0
  dest=$(binary_path "$name" "$w")
  dir=${dest%/*}
  mkdir -p "$dir"
  exec 8>"$dir/.lock"
  if ! flock -n 8; then
    say "waiting for another build in $dir"
    flock -w 7200 8 || die "could not lock $dir/.lock"
  fi
  if [ -x "$dest" ]; then
    say "$name [$progress]: built meanwhile by someone else"
    exec 8>&-
    return 0
  fi
  tmp=$(mktemp -d "$dir/.build.XXXXXX")
  case $w in
    kubernetes | kubernetes-*) ldflags=$(kube_ldflags "$w") ;;
    # SPIRE's sqlite3 datastore (github.com/mattn/go-sqlite3) is cgo.
    spire) cgo=1 ;;
    # The release's tools report the version they were built from.
    helm) ldflags+=" -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" ;;
    cosign) ldflags+=" -X sigs.k8s.io/release-utils/version.gitVersion=$COSIGN_VERSION" ;;
    flux-cli)
      ldflags+=" -X main.VERSION=${FLUX_CLI_VERSION#v}"
      flux_cli_module "$tmp"
      args=(-modfile="$tmp/go.mod")
      ;;
  esac
  start=$(date +%s)
  say "building $name [$progress] ($pkg in e2e/go/$w) ..."
  # Without the lock's descriptor: a heartbeat's sleep outlives the kill
  # below, and would hold the lock for up to 30 s more.
  heartbeat "$name [$progress]" "$start" 8>&- &
  HEARTBEAT_PID=$!
  (cd "$E2E_DIR/go/$w" &&
    go_env env CGO_ENABLED=$cgo go build -p "$GO_PARALLEL" -trimpath -gcflags="$GO_GCFLAGS" -ldflags "$ldflags" "${args[@]}" -o "$tmp/$name" "$pkg") || rc=$?
  kill "$HEARTBEAT_PID" 2>/dev/null || true
  wait "$HEARTBEAT_PID" 2>/dev/null || true
  HEARTBEAT_PID=
  if [ $rc -ne 0 ]; then
    rm -rf "$tmp"
    die "building $name failed after $(($(date +%s) - start))s (see the go output above)"
  fi
  mv -f "$tmp/$name" "$dest"
  rm -rf "$tmp"
  exec 8>&-
  say "built $name [$progress] in $(($(date +%s) - start))s"
}

copy_crds() {
  [ -f "$CRD_DIR/.done" ] && return
  local entry wrapper mod kind dir tmp
  tmp=$(mktemp -d "$SET_DIR/.crds.XXXXXX")
  for entry in "${FLUX[@]}"; do
    IFS='|' read -r _ wrapper mod _ _ kind <<<"$entry"
    [ "$kind" = controller ] || continue
    dir=$(cd "$E2E_DIR/go/$wrapper" && go_env go mod download -json "$mod" |
      sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
    [ -n "$dir" ] && [ -d "$dir/config/crd/bases" ] || die "no CRDs found for $mod (module dir '$dir')"
    cp "$dir"/config/crd/bases/*.yaml "$tmp/"
  done
  chmod -R u+w "$tmp"
  touch "$tmp/.done"
  # A leftover of an interrupted copy goes; a complete one from a concurrent
  # build stays (and the rename below fails, so ours goes).
  [ -f "$CRD_DIR/.done" ] || rm -rf "$CRD_DIR"
  mv -T "$tmp" "$CRD_DIR" 2>/dev/null || rm -rf "$tmp"
}

# link_binary NAME WRAPPER: the bin dir's symlink to a built binary. Links
# never change within a set (its name hashes their targets), so a control
# plane running from this bin dir never sees one missing.
link_binary() {
  local target
  target=$(binary_path "$1" "$2")
  [ "$(readlink "$BIN_DIR/$1" 2>/dev/null)" = "$target" ] || ln -sfn "$target" "$BIN_DIR/$1"
}

# build: builds what the selected line lacks and links its bin dir.
build() {
  local entry name wrapper pkg todo=() i=0 start
  mkdir -p "$BIN_DIR"
  for entry in "${BINARIES[@]}"; do
    IFS='|' read -r name wrapper pkg <<<"$entry"
    if [ -x "$(binary_path "$name" "$wrapper")" ]; then
      link_binary "$name" "$wrapper"
    else
      todo+=("$entry")
    fi
  done
  if [ ${#todo[@]} -gt 0 ] || [ ! -f "$CRD_DIR/.done" ]; then
    check_go
    check_versions
  fi
  if [ ${#todo[@]} -gt 0 ]; then
    start=$(date +%s)
    say "Flux line $FLUX_LINE: building ${#todo[@]} of ${#BINARIES[@]} binaries:" \
      "$(for entry in "${todo[@]}"; do printf '%s ' "${entry%%|*}"; done)(a cold build takes tens of minutes on 2 cores)"
    for entry in "${todo[@]}"; do
      IFS='|' read -r name wrapper pkg <<<"$entry"
      i=$((i + 1))
      build_binary "$name" "$wrapper" "$pkg" "$i/${#todo[@]}"
      link_binary "$name" "$wrapper"
    done
    say "built ${#todo[@]} binaries in $(($(date +%s) - start))s"
  fi
  copy_crds
  build_test_tools
}

# ----------------------------------------------------------- test tools ----

# What the tests run beside any Flux line, cheap to build, so built with the
# line (`build`, `up`) and also by `up` on a control plane already running:
# binary|wrapper dir under e2e/go|package|the variable `env` exports its
# path in. pulumi-fetch fetches an artifact as the Pulumi Kubernetes
# Operator's agent does (e2e/go/pulumi-fetch; a cold build takes under a
# minute).
TEST_TOOLS=(
  "pulumi-fetch|pulumi-fetch|.|OPENFLUX_E2E_PULUMI_FETCH"
)

# build_test_tools: builds what is missing of TEST_TOOLS into the cache.
build_test_tools() {
  local entry name wrapper pkg todo=() i=0
  for entry in "${TEST_TOOLS[@]}"; do
    IFS='|' read -r name wrapper _ _ <<<"$entry"
    hash_wrapper "$wrapper"
    [ -x "$(binary_path "$name" "$wrapper")" ] || todo+=("$entry")
  done
  [ ${#todo[@]} -gt 0 ] || return 0
  check_go
  for entry in "${todo[@]}"; do
    IFS='|' read -r name wrapper pkg _ <<<"$entry"
    i=$((i + 1))
    build_binary "$name" "$wrapper" "$pkg" "test tool $i/${#todo[@]}"
  done
}

# test_tools_env: an export line per built test tool (an unset line for one
# not built, so that an earlier eval does not leak a stale path).
test_tools_env() {
  local entry name wrapper var path
  for entry in "${TEST_TOOLS[@]}"; do
    IFS='|' read -r name wrapper _ var <<<"$entry"
    hash_wrapper "$wrapper"
    path=$(binary_path "$name" "$wrapper")
    export_or_unset "$var" "$path" test -x "$path"
  done
}

# ---------------------------------------------------------------- spiffe ----

# The SPIFFE tests' binaries, apart from any Flux line: the SPIRE server and
# agent (a real Workload API) and spiffe-fetch (a fetch client doing what
# kustomize-controller v1.10 does with --authorized-artifact-server-spiffe-id,
# e2e/go/spiffe-fetch). Built only when asked for (`e2e/cluster
# build-spiffe`); linked into sets/spiffe-<key>/bin.
SPIFFE_BINARIES=(
  "spire-server|spire|github.com/spiffe/spire/cmd/spire-server"
  "spire-agent|spire|github.com/spiffe/spire/cmd/spire-agent"
  "spiffe-fetch|spiffe-fetch|."
)

# build_spiffe: builds what is missing of SPIFFE_BINARIES; prints their bin dir.
build_spiffe() {
  local entry name wrapper pkg keys=() todo=() i=0 dir
  for entry in "${SPIFFE_BINARIES[@]}"; do
    IFS='|' read -r name wrapper _ <<<"$entry"
    hash_wrapper "$wrapper"
    keys+=("$name=${WRAPPER_KEYS[$wrapper]}")
  done
  dir=$CACHE_ROOT/sets/spiffe-$(printf '%s\n' "${keys[@]}" | sha256sum | cut -c1-12)/bin
  mkdir -p "$dir"
  for entry in "${SPIFFE_BINARIES[@]}"; do
    IFS='|' read -r name wrapper _ <<<"$entry"
    [ -x "$(binary_path "$name" "$wrapper")" ] || todo+=("$entry")
  done
  if [ ${#todo[@]} -gt 0 ]; then
    check_go
    require_version spire github.com/spiffe/spire "$SPIRE_VERSION"
    say "SPIFFE: building ${#todo[@]} binaries (SPIRE cold: 5 to 25 minutes on 2 cores, by load)"
  fi
  for entry in "${todo[@]}"; do
    IFS='|' read -r name wrapper pkg <<<"$entry"
    i=$((i + 1))
    build_binary "$name" "$wrapper" "$pkg" "$i/${#todo[@]}"
  done
  for entry in "${SPIFFE_BINARIES[@]}"; do
    IFS='|' read -r name wrapper _ <<<"$entry"
    BIN_DIR=$dir link_binary "$name" "$wrapper"
  done
  echo "$dir"
}

# ------------------------------------------------- Go 1.27 extras ----
# What the tests use beside a Flux line and that needs Go 1.27: flux-operator
# (its operator command, for the ResourceSetInputProvider test) and the CRDs
# of Flux 2.10's source-controller (its ExternalArtifact API). Only these
# run the go command with GO_1_27_TOOLCHAIN (which it fetches from the module
# proxy); everything else builds with GOTOOLCHAIN=local.

go127_env() {
  env GOTOOLCHAIN="$GO_1_27_TOOLCHAIN" CGO_ENABLED=0 GOFLAGS="-mod=readonly -buildvcs=false" "$@"
}

# flux_operator: builds flux-operator into the cache (once per wrapper
# module) with its CRDs beside it, and prints that directory:
#   <dir>/flux-operator   the binary (run it with GODEBUG=fips140=on: it
#                         refuses to start outside FIPS 140-3 mode, which its
#                         release build turns on with GOFIPS140)
#   <dir>/crds/           its config/crd/bases
# The web UI (web/dist, built by npm in flux-operator's release) is not in
# the module: the build uses a copy of the module with a placeholder page,
# as flux_cli_module does for the flux CLI; the controllers are unchanged.
flux_operator() {
  local w=flux-operator dest dir tmp mod start rc=0
  hash_wrapper "$w"
  dest=$(binary_path flux-operator "$w")
  dir=${dest%/*}
  mkdir -p "$dir"
  exec 8>"$dir/.lock"
  flock -w 7200 8 || die "could not lock $dir/.lock"
  if [ ! -x "$dest" ] || [ ! -f "$dir/crds/.done" ]; then
    check_go
    grep -Eq "^[[:space:]]*(require[[:space:]]+)?github\.com/controlplaneio-fluxcd/flux-operator ${FLUX_OPERATOR_VERSION}([[:space:]]|$)" \
      "$E2E_DIR/go/$w/go.mod" || die "e2e/go/$w/go.mod does not require flux-operator $FLUX_OPERATOR_VERSION; run e2e/go/sync $w"
    mod=$(cd "$E2E_DIR/go/$w" && go127_env go mod download -json github.com/controlplaneio-fluxcd/flux-operator |
      sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
    [ -n "$mod" ] && [ -d "$mod/cmd/operator" ] || die "cannot find the source of flux-operator (module dir '$mod')"
    tmp=$(mktemp -d "$dir/.build.XXXXXX")
    cp -r "$mod" "$tmp/flux-operator"
    chmod -R u+w "$tmp/flux-operator"
    mkdir -p "$tmp/flux-operator/web/dist"
    echo '<!doctype html><title>flux-operator</title><p>Built without its web UI.</p>' \
      >"$tmp/flux-operator/web/dist/index.html"
    cp "$E2E_DIR/go/$w/go.mod" "$E2E_DIR/go/$w/go.sum" "$tmp/"
    go127_env go mod edit -replace="github.com/controlplaneio-fluxcd/flux-operator=$tmp/flux-operator" "$tmp/go.mod"
    start=$(date +%s)
    say "building flux-operator $FLUX_OPERATOR_VERSION with $GO_1_27_TOOLCHAIN (a cold build takes tens of minutes on 2 cores) ..."
    heartbeat "flux-operator" "$start" 8>&- &
    HEARTBEAT_PID=$!
    (cd "$E2E_DIR/go/$w" &&
      go127_env go build -p "$GO_PARALLEL" -trimpath -gcflags="$GO_GCFLAGS" -ldflags "-s -w -X main.VERSION=${FLUX_OPERATOR_VERSION#v}" \
        -modfile="$tmp/go.mod" -o "$tmp/flux-operator.bin" github.com/controlplaneio-fluxcd/flux-operator/cmd/operator) || rc=$?
    kill "$HEARTBEAT_PID" 2>/dev/null || true
    wait "$HEARTBEAT_PID" 2>/dev/null || true
    HEARTBEAT_PID=
    if [ $rc -ne 0 ]; then
      rm -rf "$tmp"
      die "building flux-operator failed after $(($(date +%s) - start))s (see the go output above)"
    fi
    rm -rf "$dir/crds"
    mkdir -p "$dir/crds"
    cp "$mod"/config/crd/bases/*.yaml "$dir/crds/"
    chmod -R u+w "$dir/crds"
    touch "$dir/crds/.done"
    mv -f "$tmp/flux-operator.bin" "$dest"
    rm -rf "$tmp"
    say "built flux-operator in $(($(date +%s) - start))s"
  fi
  exec 8>&-
  echo "$dir"
}

# flux_2_10_crds: the CRDs of source-controller FLUX_2_10_SOURCE_CONTROLLER_VERSION
# (Flux 2.10's source API, whose ExternalArtifact has status.exportedInputs),
# copied from its module into the cache; prints their directory. The module
# is only read (its go.mod needs Go 1.27, hence GO_1_27_TOOLCHAIN), not built.
flux_2_10_crds() {
  local dir=$CACHE_ROOT/crds/source-controller-$FLUX_2_10_SOURCE_CONTROLLER_VERSION mod tmp
  if [ ! -f "$dir/.done" ]; then
    check_go
    mkdir -p "$CACHE_ROOT/crds"
    mod=$(cd "$CACHE_ROOT/crds" && go127_env go mod download -json \
      "github.com/fluxcd/source-controller@$FLUX_2_10_SOURCE_CONTROLLER_VERSION" |
      sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
    [ -n "$mod" ] && [ -d "$mod/config/crd/bases" ] ||
      die "no CRDs found for source-controller $FLUX_2_10_SOURCE_CONTROLLER_VERSION (module dir '$mod')"
    tmp=$(mktemp -d "$CACHE_ROOT/crds/.copy.XXXXXX")
    cp "$mod"/config/crd/bases/*.yaml "$tmp/"
    chmod -R u+w "$tmp"
    touch "$tmp/.done"
    [ -f "$dir/.done" ] || rm -rf "$dir"
    mv -T "$tmp" "$dir" 2>/dev/null || rm -rf "$tmp"
  fi
  echo "$dir"
}

# ------------------------------------------------------- release tools ----
# What `make release` and `make publish` run beside kubectl (release/tools,
# docs/release.md): helm (chart render, lint, push), oras (pushes by digest)
# and cosign (signatures), each from its wrapper module, built on demand
# into the same cache as the control plane; kubectl is the control plane's
# own (wrapper kubernetes), so a machine that ran the tests has it already.
RELEASE_TOOLS=(
  "kubectl|kubernetes|k8s.io/kubernetes/cmd/kubectl"
  "helm|helm|helm.sh/helm/v3/cmd/helm"
  "oras|oras|oras.land/oras/cmd/oras"
  "cosign|cosign|github.com/sigstore/cosign/v2/cmd/cosign"
)

# build_release_tools NAME...: builds what is missing of those tools and
# prints the path of each, one a line, in the order asked.
build_release_tools() {
  local want entry name wrapper pkg found todo=() i=0
  for want in "$@"; do
    found=
    for entry in "${RELEASE_TOOLS[@]}"; do
      IFS='|' read -r name wrapper pkg <<<"$entry"
      [ "$name" = "$want" ] || continue
      found=$entry
      hash_wrapper "$wrapper"
      [ -x "$(binary_path "$name" "$wrapper")" ] || todo+=("$entry")
    done
    [ -n "$found" ] || die "no release tool named '$want' (known: kubectl helm oras cosign)"
  done
  if [ ${#todo[@]} -gt 0 ]; then
    check_go
    require_version kubernetes k8s.io/kubernetes "$KUBERNETES_VERSION"
    require_version helm helm.sh/helm/v3 "$HELM_VERSION"
    require_version oras oras.land/oras "$ORAS_VERSION"
    require_version cosign github.com/sigstore/cosign/v2 "$COSIGN_VERSION"
  fi
  for entry in "${todo[@]}"; do
    IFS='|' read -r name wrapper pkg <<<"$entry"
    i=$((i + 1))
    build_binary "$name" "$wrapper" "$pkg" "$i/${#todo[@]}" >&2
  done
  for want in "$@"; do
    for entry in "${RELEASE_TOOLS[@]}"; do
      IFS='|' read -r name wrapper _ <<<"$entry"
      [ "$name" = "$want" ] && binary_path "$name" "$wrapper"
    done
  done
  return 0
}
