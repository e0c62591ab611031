# shellcheck shell=bash
# Sourced by e2e/cluster for `cells` and `cell NAME ...`: the matrix cells.
#
# A cell is one more instance of this control plane with a Flux line and
# feature gates of its own, so that one test run exercises openflux against
# several Flux installations (the tests' own control plane is the main one).
# Every cell has its own state dir and port block:
#   ports  OPENFLUX_E2E_CELL_PORT_BASE (default 18000) + 1000 * <index in
#          CELLS>, with the offsets of the tests' control plane (etcd
#          +379/+380, kube-apiserver +443, kube-controller-manager +257,
#          Flux controllers +501..+544, fixtures +580)
#   state  ${TMPDIR:-/tmp}/openflux-e2e-cell-<name>-<first port of its block>
# so cells collide neither with the tests' control plane (16xxx) nor with
# the demo (17xxx). OPENFLUX_E2E_CELL_PORT_BASE moves every cell, state dirs
# included, so several checkouts can run their cells at once.
#
# The test kit starts a cell when a test asks for it, reuses a running one
# and holds the cell's lock file (`cells lock-file NAME`) while a test uses
# it: the matrix cells share one, so their tests run one after another; the
# nodes cell has its own, so its tests (a test binary `make test` runs
# beside the others) run one after another beside them. `cells down` stops
# them all (`make test` and .ci/run do so at the end).
#
# Expects E2E_DIR, say and die.

# name|line|feature gates|kind|Kubernetes line. The position in this list places the port
# block: append new cells at the end. Kind `nodes`: the control plane with
# real nodes, where Flux and openflux run as Pods (e2e/lib/nodes.sh). Kind
# `lockdown`: the Flux controllers run with the flags of Flux's
# multi-tenancy lockdown (OPENFLUX_E2E_LOCKDOWN in e2e/cluster), so
# kustomize-controller impersonates each namespace's ServiceAccount
# `default`. Kubernetes line: empty for KUBERNETES_VERSION, `newest` or
# `oldest` for the lines e2e/versions.env names (OPENFLUX_E2E_KUBERNETES_LINE
# in e2e/cluster).
CELLS=(
  "current-external-artifact|current|ExternalArtifact=true"
  "flux27-default|2.7|"
  "nodes|current||nodes"
  "lockdown|current||lockdown"
  "kubernetes-newest|current|||newest"
  "kubernetes-oldest|current|||oldest"
)

CELL_PORT_BASE=${OPENFLUX_E2E_CELL_PORT_BASE:-18000}
case $CELL_PORT_BASE in
  '' | *[!0-9]*) die "OPENFLUX_E2E_CELL_PORT_BASE must be a number, not '$CELL_PORT_BASE'" ;;
esac
[ "$CELL_PORT_BASE" -ge 1024 ] && [ $((CELL_PORT_BASE + 1000 * ${#CELLS[@]})) -le 65536 ] ||
  die "OPENFLUX_E2E_CELL_PORT_BASE must be between 1024 and $((65536 - 1000 * ${#CELLS[@]})), not $CELL_PORT_BASE"
CELLS_TMP=${TMPDIR:-/tmp}

# cell NAME: sets CELL_LINE, CELL_GATES, CELL_BASE and CELL_STATE.
cell() {
  local i entry name
  for i in "${!CELLS[@]}"; do
    entry=${CELLS[i]}
    IFS='|' read -r name CELL_LINE CELL_GATES CELL_KIND CELL_KUBERNETES <<<"$entry"
    if [ "$name" = "$1" ]; then
      CELL_BASE=$((CELL_PORT_BASE + 1000 * i))
      CELL_STATE=$CELLS_TMP/openflux-e2e-cell-$name-$CELL_BASE
      return 0
    fi
  done
  die "no cell '$1'; the cells are: $(cell_names)"
}

cell_names() {
  local entry
  for entry in "${CELLS[@]}"; do printf '%s ' "${entry%%|*}"; done
}

# cell_run NAME ARGS...: e2e/cluster ARGS for the cell's instance.
cell_run() {
  local name=$1
  cell "$name"
  shift
  local nodes=0 lockdown=0
  [ "$CELL_KIND" != nodes ] || nodes=1
  [ "$CELL_KIND" != lockdown ] || lockdown=1
  env -u KUBECONFIG \
    OPENFLUX_E2E_CELL="$name" \
    OPENFLUX_E2E_NODES="$nodes" OPENFLUX_E2E_NODES_PORT_BASE="$CELL_BASE" \
    OPENFLUX_E2E_LOCKDOWN="$lockdown" \
    OPENFLUX_E2E_STATE="$CELL_STATE" \
    OPENFLUX_E2E_FLUX_LINE="$CELL_LINE" OPENFLUX_E2E_KUBERNETES_LINE="$CELL_KUBERNETES" \
    OPENFLUX_E2E_FEATURE_GATES="$CELL_GATES" \
    OPENFLUX_E2E_ETCD_PORT=$((CELL_BASE + 379)) OPENFLUX_E2E_ETCD_PEER_PORT=$((CELL_BASE + 380)) \
    OPENFLUX_E2E_APISERVER_PORT=$((CELL_BASE + 443)) OPENFLUX_E2E_KCM_PORT=$((CELL_BASE + 257)) \
    OPENFLUX_E2E_FIXTURES_PORT=$((CELL_BASE + 580)) OPENFLUX_E2E_FLUX_PORT_BASE=$((CELL_BASE + 500)) \
    "$E2E_DIR/cluster" "$@"
}

# cell_up NAME: starts the cell (or reuses it), with its own gates: a test
# may have changed them with `gates`.
cell_up() {
  local recorded
  cell "$1"
  recorded=$(cat "$CELL_STATE/feature-gates" 2>/dev/null || echo "$CELL_GATES")
  if [ -d "$CELL_STATE" ] && [ "$recorded" != "$CELL_GATES" ]; then
    if cell_run "$1" status >/dev/null 2>&1; then
      say "cell $1 runs with feature gates '$recorded'; restoring its own ('$CELL_GATES')"
      cell_run "$1" gates "$CELL_GATES"
    else
      cell_run "$1" down
    fi
  fi
  say "cell $1: Kubernetes ${CELL_KUBERNETES:-as pinned}, Flux line $CELL_LINE, feature gates '${CELL_GATES}', ports $CELL_BASE-$((CELL_BASE + 999)), state $CELL_STATE"
  cell_run "$1" up
}

cells_list() {
  local entry name running
  printf '%-28s %-10s %-8s %-24s %-12s %-8s %s\n' CELL KUBERNETES LINE GATES PORTS RUNNING STATE
  for entry in "${CELLS[@]}"; do
    name=${entry%%|*}
    cell "$name"
    if cell_run "$name" status >/dev/null 2>&1; then running=yes; else running=no; fi
    printf '%-28s %-10s %-8s %-24s %-12s %-8s %s\n' "$name" "${CELL_KUBERNETES:-pinned}" "$CELL_LINE" "${CELL_GATES:-(none)}" \
      "$CELL_BASE-$((CELL_BASE + 999))" "$running" "$CELL_STATE"
  done
}

cells_down() {
  local entry name rc=0
  for entry in "${CELLS[@]}"; do
    name=${entry%%|*}
    cell "$name"
    [ -d "$CELL_STATE" ] || continue
    cell_run "$name" down || rc=1
  done
  return $rc
}

cells_usage() {
  die "usage: $0 cells [list|down|lock-file NAME|state-dirs] | $0 cell NAME up|down|status|env|gates V|build|bin (cells: $(cell_names))"
}

# cells_main cells|cell ARGS...
cells_main() {
  case $1 in
    cells)
      case ${2:-list} in
        list) cells_list ;;
        down) cells_down ;;
        # The lock a test holds while it uses the cell NAME (see the test
        # kit): the nodes cell's own, the matrix cells' shared one. Neither
        # is a cell's <state>.lock, which its `up` and `down` take while
        # the test holds this one.
        lock-file)
          [ $# -eq 3 ] || cells_usage
          cell "$3"
          if [ "$CELL_KIND" = nodes ]; then
            echo "$CELLS_TMP/openflux-e2e-cells-$CELL_PORT_BASE-$3.lock"
          else
            echo "$CELLS_TMP/openflux-e2e-cells-$CELL_PORT_BASE.lock"
          fi
          ;;
        state-dirs)
          local entry
          for entry in "${CELLS[@]}"; do
            cell "${entry%%|*}"
            echo "$CELL_STATE"
          done
          ;;
        *) cells_usage ;;
      esac
      ;;
    cell)
      [ $# -ge 3 ] || cells_usage
      case $3 in
        up) [ $# -eq 3 ] || cells_usage; cell_up "$2" ;;
        down | status | env | build | bin) [ $# -eq 3 ] || cells_usage; cell_run "$2" "$3" ;;
        gates) [ $# -eq 4 ] || cells_usage; cell_run "$2" gates "$4" ;;
        flux-install | stop-node | start-node) [ $# -eq 4 ] || cells_usage; cell_run "$2" "$3" "$4" ;;
        *) cells_usage ;;
      esac
      ;;
  esac
}
