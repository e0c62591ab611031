# shellcheck shell=bash
# Sourced by e2e/lib/nodes.sh: Flux installed on the nodes cell as Pods, laid
# out as `flux install` lays it out (flux2's pkg/manifestgen/install), from
# the pinned modules' own trees, never written by hand:
#
#   <state>/flux-install/src/<controller>/config/{crd,manager}
#       each controller's config/crd and config/manager, copied from its Go
#       module (what its release's <controller>.crds.yaml and
#       <controller>.deployment.yaml are built from)
#   <state>/flux-install/flux2/manifests/{bases,rbac,policies}
#       flux2's (FLUX_CLI_VERSION) manifests; each base's two release URLs
#       replaced by the two directories above
#   <state>/flux-install/<shape>/kustomization.yaml
#       what `flux install` generates: namespace, NetworkPolicies, RBAC
#       (suffix -flux-system), the components, the args patches, the
#       kubernetes.io/os node selector, images under ghcr.io/fluxcd
#
# Shapes: `default` is `flux install` (source-, kustomize-, helm- and
# notification-controller; the ExternalArtifact gate off); `source-watcher`
# is `flux install --components-extra=source-watcher`, which also turns on
# --feature-gates=ExternalArtifact=true on kustomize- and helm-controller.
#
# Images: each controller's pinned binary (from the bin dir) packed as an OCI
# image (/usr/local/bin/<controller>, user 65534:65534, as Flux's own
# Dockerfiles), pushed to the cell's registry as fluxcd/<controller>:<version>,
# so that ghcr.io/fluxcd/<controller>:<version> is pulled from there.

FLUX_INSTALL_NAMESPACE=flux-system

# flux_components SHAPE: the controllers of a shape, in `flux install`'s order.
flux_components() {
  case $1 in
    default) echo "source-controller kustomize-controller helm-controller notification-controller" ;;
    source-watcher) echo "source-controller kustomize-controller helm-controller notification-controller source-watcher" ;;
    *) die "unknown Flux install shape '$1': default (flux install) or source-watcher (flux install --components-extra=source-watcher)" ;;
  esac
}

# flux_module_dir MODULE: the module's directory in the Go module cache
# (downloaded through the wrapper that pins it).
flux_module_dir() {
  local entry name wrapper mod dir
  for entry in "${FLUX[@]}"; do
    IFS='|' read -r name wrapper mod _ <<<"$entry"
    [ "$name" = "$1" ] || continue
    dir=$(cd "$E2E_DIR/go/$wrapper" && go_env go mod download -json "$mod" |
      sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
    [ -n "$dir" ] && [ -d "$dir" ] || die "cannot find the module of $1 ($mod)"
    echo "$dir"
    return 0
  done
  die "the Flux line has no $1"
}

flux_version() {
  local entry name _w _m ver
  for entry in "${FLUX[@]}"; do
    IFS='|' read -r name _w _m ver _ <<<"$entry"
    [ "$name" = "$1" ] && { echo "$ver"; return 0; }
  done
  die "the Flux line has no $1"
}

# flux_install_tree SHAPE: writes the kustomize tree and prints the
# directory to build.
flux_install_tree() {
  local shape=$1 root=$STATE/flux-install c dir flux2
  mkdir -p "$root/src"
  if [ ! -d "$root/flux2" ]; then
    flux2=$(flux_module_dir flux)
    mkdir -p "$root/flux2/manifests"
    cp -r "$flux2/manifests/bases" "$flux2/manifests/rbac" "$flux2/manifests/policies" "$root/flux2/manifests/"
    chmod -R u+w "$root/flux2"
  fi
  for c in $(flux_components "$shape"); do
    if [ ! -d "$root/src/$c" ]; then
      dir=$(flux_module_dir "$c")
      mkdir -p "$root/src/$c/config"
      cp -r "$dir/config/crd" "$dir/config/manager" "$root/src/$c/config/"
      chmod -R u+w "$root/src/$c"
    fi
    # The release artifacts a base names, by what they are built from.
    sed -i -E \
      -e "s#^- https://github.com/fluxcd/$c/releases/download/[^/]+/$c\\.crds\\.yaml\$#- ../../../../src/$c/config/crd#" \
      -e "s#^- https://github.com/fluxcd/$c/releases/download/[^/]+/$c\\.deployment\\.yaml\$#- ../../../../src/$c/config/manager#" \
      "$root/flux2/manifests/bases/$c/kustomization.yaml"
    ! grep -q 'https://' "$root/flux2/manifests/bases/$c/kustomization.yaml" ||
      die "flux2's base of $c names a release URL this layout does not replace: $(grep 'https://' "$root/flux2/manifests/bases/$c/kustomization.yaml")"
  done

  local out=$root/$shape
  rm -rf "$out"
  mkdir -p "$out/roles"
  # pkg/manifestgen/install/templates.go of flux2, with its defaults
  # (namespace flux-system, watch all namespaces, log level info, network
  # policies, registry ghcr.io/fluxcd, cluster domain cluster.local).
  cat >"$out/namespace.yaml" <<EOF
---
apiVersion: v1
kind: Namespace
metadata:
  name: $FLUX_INSTALL_NAMESPACE
  labels:
    pod-security.kubernetes.io/warn: restricted
    pod-security.kubernetes.io/warn-version: latest
EOF
  cat >"$out/labels.yaml" <<EOF
---
apiVersion: builtin
kind: LabelTransformer
metadata:
  name: labels
labels:
  app.kubernetes.io/instance: $FLUX_INSTALL_NAMESPACE
  app.kubernetes.io/version: "$FLUX_CLI_VERSION"
  app.kubernetes.io/part-of: flux
fieldSpecs:
  - path: metadata/labels
    create: true
  - kind: Deployment
    path: spec/template/metadata/labels
    create: true
EOF
  cat >"$out/node-selector.yaml" <<EOF
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: all
spec:
  template:
    spec:
      nodeSelector:
        kubernetes.io/os: linux
EOF
  cat >"$out/roles/kustomization.yaml" <<EOF
---
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
namespace: $FLUX_INSTALL_NAMESPACE
resources:
  - ../../flux2/manifests/rbac
nameSuffix: -$FLUX_INSTALL_NAMESPACE
EOF
  local events="http://notification-controller.$FLUX_INSTALL_NAMESPACE.svc.cluster.local./"
  {
    cat <<EOF
---
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
namespace: $FLUX_INSTALL_NAMESPACE

transformers:
  - labels.yaml

resources:
  - namespace.yaml
  - ../flux2/manifests/policies
  - roles
EOF
    for c in $(flux_components "$shape"); do echo "  - ../flux2/manifests/bases/$c"; done
    printf '\npatches:\n- path: node-selector.yaml\n  target:\n    kind: Deployment\n'
    for c in $(flux_components "$shape"); do
      cat <<EOF
- target:
    group: apps
    version: v1
    kind: Deployment
    name: $c
  patch: |-
EOF
      case $c in
        notification-controller)
          cat <<EOF
    - op: replace
      path: /spec/template/spec/containers/0/args/0
      value: --watch-all-namespaces=true
    - op: replace
      path: /spec/template/spec/containers/0/args/1
      value: --log-level=info
EOF
          ;;
        source-controller | source-watcher)
          cat <<EOF
    - op: replace
      path: /spec/template/spec/containers/0/args/0
      value: --events-addr=$events
    - op: replace
      path: /spec/template/spec/containers/0/args/1
      value: --watch-all-namespaces=true
    - op: replace
      path: /spec/template/spec/containers/0/args/2
      value: --log-level=info
    - op: replace
      path: /spec/template/spec/containers/0/args/6
      value: --storage-adv-addr=$c.\$(RUNTIME_NAMESPACE).svc.cluster.local.
EOF
          ;;
        *)
          cat <<EOF
    - op: replace
      path: /spec/template/spec/containers/0/args/0
      value: --events-addr=$events
    - op: replace
      path: /spec/template/spec/containers/0/args/1
      value: --watch-all-namespaces=true
    - op: replace
      path: /spec/template/spec/containers/0/args/2
      value: --log-level=info
EOF
          ;;
      esac
    done
    if [ "$shape" = source-watcher ]; then
      cat <<EOF
- target:
    kind: Deployment
    name: "(kustomize-controller|helm-controller)"
  patch: |-
    - op: add
      path: /spec/template/spec/containers/0/args/-
      value: --feature-gates=ExternalArtifact=true
EOF
    fi
    echo "images:"
    for c in $(flux_components "$shape"); do
      printf '  - name: fluxcd/%s\n    newName: ghcr.io/fluxcd/%s\n    newTag: %s\n' "$c" "$c" "$(flux_version "$c")"
    done
  } >"$out/kustomization.yaml"
  echo "$out"
}

# flux_images SHAPE: the controllers' images in the cell's registry.
flux_images() {
  local c ver archive
  mkdir -p "$STATE/registry/images"
  for c in $(flux_components "$1"); do
    ver=$(flux_version "$c")
    archive=$STATE/registry/images/$c-$ver.oci.tar
    [ -f "$archive" ] && continue
    [ -x "$BIN_DIR/$c" ] || die "$BIN_DIR/$c is missing: build the Flux line first ('e2e/cluster build')"
    oci_image_archive "$archive.tmp" "$c" "ghcr.io/fluxcd/$c:$ver" "$BIN_DIR/$c" "/usr/local/bin/$c" 65534:65534
    registry_push "$archive.tmp" "$REGISTRY/fluxcd/$c:$ver"
    mv "$archive.tmp" "$archive"
  done
}

# flux_deployments_available SHAPE: every Deployment of the shape rolled
# out (its current generation observed, every replica updated and
# available) and Available.
flux_deployments_available() {
  local c state
  for c in $(flux_components "$1"); do
    state=$(kubectl_ -n "$FLUX_INSTALL_NAMESPACE" get deployment "$c" -o \
      jsonpath='{.metadata.generation} {.status.observedGeneration} {.spec.replicas} {.status.updatedReplicas} {.status.availableReplicas} {.status.replicas} {.status.conditions[?(@.type=="Available")].status}' \
      2>/dev/null) || return 1
    read -r gen observed want updated available total ready <<<"$state"
    [ "$gen" = "$observed" ] && [ "$updated" = "$want" ] && [ "$available" = "$want" ] &&
      [ "$total" = "$want" ] && [ "$ready" = True ] || return 1
  done
}

# flux_install SHAPE: builds the images, applies the layout, waits until
# every Deployment is available. Another shape replaces the running one
# (source-watcher's Deployment is removed going back to the default).
flux_install() {
  local shape=$1 dir deadline
  say "installing Flux as Pods ($shape: $(flux_components "$shape"))"
  flux_images "$shape"
  dir=$(flux_install_tree "$shape")
  kubectl_ kustomize "$dir" >"$STATE/flux-install/$shape.yaml" 2>"$STATE/logs/flux-install.log" ||
    { log_tail flux-install; fail_up "kubectl kustomize $dir failed"; }
  # CRDs first (as `flux install` does), then the rest.
  kubectl_ apply --server-side --force-conflicts -f "$STATE/flux-install/$shape.yaml" \
    >>"$STATE/logs/flux-install.log" 2>&1 ||
    kubectl_ apply --server-side --force-conflicts -f "$STATE/flux-install/$shape.yaml" \
      >>"$STATE/logs/flux-install.log" 2>&1 ||
    { log_tail flux-install; fail_up "applying Flux's install manifests failed"; }
  if [ "$shape" = default ]; then
    kubectl_ -n "$FLUX_INSTALL_NAMESPACE" delete deployment source-watcher --ignore-not-found \
      >>"$STATE/logs/flux-install.log" 2>&1 || true
  fi
  echo "$shape" >"$STATE/flux-install/shape"
  deadline=$(($(date +%s) + TIMEOUT * 2))
  until flux_deployments_available "$shape"; do
    if [ "$(date +%s)" -ge "$deadline" ]; then
      kubectl_ -n "$FLUX_INSTALL_NAMESPACE" get deployments,pods -o wide >&2 || true
      fail_up "Flux's Deployments did not become available within $((TIMEOUT * 2))s"
    fi
    sleep 1
  done
  say "Flux ($shape) is installed: every Deployment in $FLUX_INSTALL_NAMESPACE is available"
}
