# shellcheck shell=bash
# Sourced by e2e/cluster: Deployments in flux-system that describe the Flux
# controllers the way `flux install` would, and `gates`, which restarts
# kustomize-controller and helm-controller with other feature gates.
#
# The controllers run as local processes, so the cluster has no Pods and no
# kubelet ever runs these Deployments (nor does the controller manager: its
# deployment controller is not started). They are descriptive objects only,
# for programs that judge a Flux installation by its Deployments (openflux
# reads the `--feature-gates` of the `manager` container and whether the
# rollout is complete). They are rewritten whenever the controllers
# (re)start: spec.template.spec.containers[manager].args are exactly the
# arguments of the running process, and the status says the rollout is
# complete only once the process is healthy.
#
# Expects FLUX_CONTROLLERS, FLUX (e2e/lib/build.sh), flux_args, flux_health,
# kubectl_, client_kubeconfig, start, stop_group, wait_until, say, die and
# STATE.

FLUX_NAMESPACE=flux-system
DEPLOYMENTS_FIELD_MANAGER=openflux-e2e-cluster

# json_string S: S as a JSON string literal.
json_string() {
  local s=$1
  s=${s//\\/\\\\}
  s=${s//\"/\\\"}
  s=${s//$'\t'/\\t}
  s=${s//$'\n'/\\n}
  printf '"%s"' "$s"
}

# flux_version NAME: the version the selected line pins for Flux binary NAME.
flux_version() {
  local entry name version
  for entry in "${FLUX[@]}"; do
    IFS='|' read -r name _ _ version _ <<<"$entry"
    [ "$name" = "$1" ] && { echo "$version"; return 0; }
  done
  die "no version known for $1"
}

# deployment_json NAME: the Deployment describing Flux controller NAME, with
# the arguments it runs with now (flux_args). Labels, selector and container
# name as `flux install` writes them; the image names no registry.
deployment_json() {
  local name=$1 arg args=() list='' sep=''
  mapfile -t args < <(flux_args "$name")
  for arg in "${args[@]}"; do
    list+="$sep$(json_string "$arg")"
    sep=,
  done
  cat <<EOF
{
  "apiVersion": "apps/v1",
  "kind": "Deployment",
  "metadata": {
    "name": "$name",
    "namespace": "$FLUX_NAMESPACE",
    "labels": {
      "app.kubernetes.io/component": "$name",
      "app.kubernetes.io/instance": "$FLUX_NAMESPACE",
      "app.kubernetes.io/part-of": "flux",
      "control-plane": "controller"
    },
    "annotations": {
      "e2e.openflux.dev/description": "Describes $name as e2e/cluster runs it: a local process, not run by any kubelet"
    }
  },
  "spec": {
    "replicas": 1,
    "selector": {"matchLabels": {"app": "$name"}},
    "template": {
      "metadata": {"labels": {"app": "$name"}},
      "spec": {
        "containers": [{
          "name": "manager",
          "image": "fluxcd/$name:$(flux_version "$name")",
          "args": [$list],
          "env": [{"name": "RUNTIME_NAMESPACE", "value": "$FLUX_NAMESPACE"}]
        }]
      }
    }
  }
}
EOF
}

# apply_deployments NAME...: server-side applies the Deployments of the named
# controllers (a changed spec bumps metadata.generation, as a rollout would).
apply_deployments() {
  local name items='' sep=''
  for name in "$@"; do
    items+="$sep$(deployment_json "$name")"
    sep=,
  done
  printf '{"apiVersion": "v1", "kind": "List", "items": [%s]}\n' "$items" |
    kubectl_ apply --server-side --force-conflicts --field-manager="$DEPLOYMENTS_FIELD_MANAGER" -f - \
      >>"$STATE/logs/deployments.log" 2>&1
}

# deployment_status running|starting NAME...: writes the status of the named
# Deployments for their current generation: `running` as a complete rollout
# of one available replica, `starting` as one updated replica not yet
# available (the process was replaced and is not healthy yet).
deployment_status() {
  local phase=$1 name generation generations items='' sep='' now available reason message
  shift
  generations=$(kubectl_ -n "$FLUX_NAMESPACE" get deployments \
    -o 'jsonpath={range .items[*]}{.metadata.name}={.metadata.generation}{"\n"}{end}' \
    2>>"$STATE/logs/deployments.log") || return 1
  now=$(date -u +%Y-%m-%dT%H:%M:%SZ)
  case $phase in
    running)
      available='"readyReplicas": 1, "availableReplicas": 1, "unavailableReplicas": 0'
      available+=", $(condition Available True MinimumReplicasAvailable "Deployment has minimum availability.")"
      reason=NewReplicaSetAvailable message="The process is running and healthy."
      ;;
    starting)
      available='"readyReplicas": 0, "availableReplicas": 0, "unavailableReplicas": 1'
      available+=", $(condition Available False MinimumReplicasUnavailable "Deployment does not have minimum availability.")"
      reason=ReplicaSetUpdated message="The process was restarted with this spec and is not healthy yet."
      ;;
    *) die "unknown Deployment status '$phase'" ;;
  esac
  for name in "$@"; do
    generation=$(sed -n "s/^$name=//p" <<<"$generations")
    [ -n "$generation" ] || { echo "no Deployment $name" >>"$STATE/logs/deployments.log"; return 1; }
    items+="$sep{\"apiVersion\": \"apps/v1\", \"kind\": \"Deployment\","
    items+=" \"metadata\": {\"name\": \"$name\", \"namespace\": \"$FLUX_NAMESPACE\"},"
    items+=" \"status\": {\"observedGeneration\": $generation, \"replicas\": 1, \"updatedReplicas\": 1,"
    items+=" $available, $(condition Progressing True "$reason" "$message")]}}"
    sep=,
  done
  # Only the status subresource is applied: the client's schema check would
  # ask for the whole object (Kubernetes 1.37 marks a Deployment's spec
  # required); the API server checks what it is sent.
  printf '{"apiVersion": "v1", "kind": "List", "items": [%s]}\n' "$items" |
    kubectl_ apply --server-side --force-conflicts --subresource=status --validate=false \
      --field-manager="$DEPLOYMENTS_FIELD_MANAGER" -f - >>"$STATE/logs/deployments.log" 2>&1
}

# condition TYPE STATUS REASON MESSAGE: a Deployment condition (JSON), the
# first one opens the "conditions" list.
condition() {
  local open=''
  [ "$1" = Available ] && open='"conditions": ['
  printf '%s{"type": "%s", "status": "%s", "reason": "%s", "message": %s, "lastUpdateTime": "%s", "lastTransitionTime": "%s"}' \
    "$open" "$1" "$2" "$3" "$(json_string "$4")" "$now" "$now"
}

# write_deployments: a Deployment per running Flux controller, rolled out.
write_deployments() {
  local name
  apply_deployments "${FLUX_CONTROLLERS[@]}" || return 1
  deployment_status running "${FLUX_CONTROLLERS[@]}" || return 1
  say "Deployments in $FLUX_NAMESPACE describe ${FLUX_CONTROLLERS[*]}"
}

# valid_gates VALUE: the --feature-gates syntax (Name=bool, comma separated)
# or empty.
valid_gates() {
  [ -z "$1" ] && return 0
  local gate
  local IFS=,
  for gate in $1; do
    [[ $gate =~ ^[A-Za-z0-9]+=(true|false)$ ]] || return 1
  done
}

# set_gates VALUE: restarts kustomize-controller and helm-controller with
# --feature-gates=VALUE (none when empty), records the gates and keeps their
# Deployments in sync: the new spec first (rollout started), then the
# processes, then a complete rollout once both are healthy again.
set_gates() {
  local value=$1 name args restart=(kustomize-controller helm-controller)
  valid_gates "$value" ||
    die "'$value' is not a --feature-gates value: give Name=true|false pairs separated by commas, or '' for none"
  [ -d "$STATE" ] && all_alive ||
    die "the control plane in $STATE is not running (or not whole): start it with '$0 up' first"
  FEATURE_GATES=$value
  echo "$FEATURE_GATES" >"$STATE/feature-gates"
  say "restarting ${restart[*]} with feature gates: ${FEATURE_GATES:-none (controller defaults)}"
  apply_deployments "${restart[@]}" || { log_tail deployments; die "updating the Deployments failed"; }
  deployment_status starting "${restart[@]}" || { log_tail deployments; die "writing the Deployments' status failed"; }
  stop_group alive "${restart[@]}"
  for name in "${restart[@]}"; do
    mapfile -t args < <(flux_args "$name")
    start "$name" KUBECONFIG="$(client_kubeconfig "$name")" RUNTIME_NAMESPACE="$FLUX_NAMESPACE" -- "${args[@]}"
  done
  for name in "${restart[@]}"; do
    wait_until "$name" "$name /readyz" curl -fsS "http://$(flux_health "$name")/readyz"
  done
  deployment_status running "${restart[@]}" || { log_tail deployments; die "writing the Deployments' status failed"; }
  say "feature gates of ${restart[*]}: ${FEATURE_GATES:-none}; Deployments updated"
}
