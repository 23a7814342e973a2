#!/usr/bin/env bash
# The Kubernetes manifests of deploy/k8s run as real pods on one machine
# with podman (4.3, as root), no cluster needed (docs/deploy.md, "Try it
# with podman"):
#   deploy/podman/play.sh build             base images, then the CPU image
#   deploy/podman/play.sh up [OVERLAY]      controller and workers (cpu)
#   deploy/podman/play.sh submit            the examples/submit-job Job
#   deploy/podman/play.sh down              removes what up and submit made
# Environment: GPIPE_PODMAN_STATE (default /var/tmp/gpipe-podman: the
# certificates, the rendered and transformed manifests), GPIPE_PODMAN_NETWORK
# (default gpipe), GPIPE_IMAGE (default localhost/gpipe:dev),
# GPIPE_PODMAN_WORKERS (worker pods; default: the overlay's), CONTAINERS_CONF
# (default: $STATE/containers.conf, written here: runc, no default ulimits).
# The manifests are the ones users apply to a cluster, rendered with
# kubectl kustomize and rewritten for what podman kube play lacks by
# kube_play_transform.py (which says what and why).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)
state=${GPIPE_PODMAN_STATE:-/var/tmp/gpipe-podman}
network=${GPIPE_PODMAN_NETWORK:-gpipe}
image=${GPIPE_IMAGE:-localhost/gpipe:dev}
mkdir -p "$state"
if [[ -z "${CONTAINERS_CONF:-}" ]]; then
  # crun refuses some hosts' cgroups and podman's default ulimits cannot
  # always be raised: runc, and the limits the engine itself has.
  printf '[containers]\ndefault_ulimits = []\n[engine]\nruntime = "runc"\n' >"$state/containers.conf"
  export CONTAINERS_CONF=$state/containers.conf
fi
command -v podman >/dev/null || { echo "play.sh: needs podman (scripts/setup.sh installs it)" >&2; exit 2; }

render() {  # render KUSTOMIZATION OUT: rendered and transformed manifests
  local scale=()
  [[ -n "${GPIPE_PODMAN_WORKERS:-}" ]] && scale=(--replicas "gpipe-worker=$GPIPE_PODMAN_WORKERS")
  kubectl kustomize "$1" 2>/dev/null >"$2.rendered.yaml"
  python3 "$here/kube_play_transform.py" "$2.rendered.yaml" "${scale[@]}" \
    --secrets "$state/secrets.yaml" --state "$state" >"$2"
}

case "${1:-}" in
  build)
    "$src/deploy/docker/base-image.sh"
    # The build stage gets a name of its own, $image-build: unnamed, each
    # build left one behind (936 MB as podman counts it), yet it is the
    # cache that lets an unchanged source rebuild in seconds. The images
    # these two names held before, once nothing names them, are ours to
    # remove (podman rmi then drops their unnamed cache parents too, and
    # refuses an image a container still runs).
    builder=$image-build
    old=$(for name in "$builder" "$image"; do podman image inspect --format '{{.Id}}' "$name" 2>/dev/null; done || true)
    # Docker's image format: podman's default (OCI) has no SHELL, so it
    # would drop the Dockerfile's `SHELL [... -o pipefail ...]` with a
    # warning and run every RUN line under plain sh.
    args=(-f "$src/deploy/docker/Dockerfile" --format docker
      --build-arg DEBIAN_BUILD_IMAGE=localhost/gpipe-base/debian:12
      --build-arg DEBIAN_RUNTIME_IMAGE=localhost/gpipe-base/debian:12-slim)
    podman build "${args[@]}" --target build -t "$builder" "$src"
    podman build "${args[@]}" -t "$image" "$src"
    for id in $old; do
      [[ -z "$(podman image inspect --format '{{.RepoTags}}' "$id" 2>/dev/null | tr -d '[]')" ]] &&
        podman rmi "$id" >/dev/null 2>&1 || true
    done
    echo "play.sh: $image, $(podman image inspect "$image" --format '{{.Size}}' |
      awk '{printf "%.0f MB", $1 / 1e6}')"
    ;;
  up)
    overlay=${2:-cpu}
    podman image exists "$image" || { echo "play.sh: no image $image: run play.sh build" >&2; exit 2; }
    [[ -f "$state/pki/ca.key" ]] || "$src/deploy/k8s/make-secrets.sh" "$state/pki" --yaml "$state/secrets.yaml" >/dev/null
    [[ -f "$state/secrets.yaml" ]] || "$src/deploy/k8s/make-secrets.sh" "$state/pki" --yaml "$state/secrets.yaml" >/dev/null
    # The manifests name their pods and volumes: a second cluster on this
    # machine would meet the first one's (podman said only "volume already
    # exists").
    up=$(podman pod ps --filter "label=app.kubernetes.io/part-of=gpipe" --format '{{.Name}}' | tr '\n' ' ')
    [[ -z "$up" ]] || { echo "play.sh: a gpipe cluster is already up on this machine (pods: ${up% }); play.sh down removes it" >&2; exit 2; }
    for v in gpipe-checkpoints gpipe-controller-store; do
      if podman volume exists "$v"; then
        echo "play.sh: the volume $v of an earlier cluster is still here; play.sh down removes it (and the jobs and checkpoints it holds)" >&2
        exit 2
      fi
    done
    render "$src/deploy/k8s/overlays/$overlay" "$state/cluster.yaml"
    if [[ "$image" != localhost/gpipe:dev ]]; then
      sed -i "s|image: gpipe:dev|image: $image|" "$state/cluster.yaml"
    fi
    podman network exists "$network" || podman network create "$network" >/dev/null
    podman kube play --network "$network" "$state/cluster.yaml" >/dev/null
    podman pod ps --filter "label=app.kubernetes.io/part-of=gpipe" --format '{{.Name}} {{.Status}}'
    ;;
  submit)
    render "$src/deploy/k8s/examples/submit-job" "$state/submit.yaml"
    if [[ "$image" != localhost/gpipe:dev ]]; then
      sed -i "s|image: gpipe:dev|image: $image|" "$state/submit.yaml"
    fi
    # --replace: a second submit replaces the first one's pod (its job
    # goes on in the controller) instead of failing on the pod's name.
    podman kube play --replace --network "$network" "$state/submit.yaml" >/dev/null
    pod=$(python3 -c 'import sys, yaml; print([d for d in yaml.safe_load_all(open(sys.argv[1])) if d and d["kind"] == "Pod"][0]["metadata"]["name"])' "$state/submit.yaml")
    echo "play.sh: submitted from pod $pod; follow it with: podman logs -f $pod-gpipectl"
    ;;
  down)
    for f in submit cluster; do
      [[ -f "$state/$f.yaml" ]] && podman kube down "$state/$f.yaml" >/dev/null 2>&1 || true
    done
    # The per-pod emptyDir volumes (kube_play_transform.py) go with their
    # pods; any that a failed play left behind go here.
    emptydirs=$(python3 -c 'import os, sys, yaml
for f in sys.argv[1:]:
    for d in yaml.safe_load_all(open(f)) if os.path.exists(f) else []:
        if d and d["kind"] == "Pod":
            print(*[v["name"] for v in d["spec"].get("volumes") or [] if "emptyDir" in v])' \
      "$state/submit.yaml" "$state/cluster.yaml" || true)
    for v in gpipe-checkpoints gpipe-controller-store $emptydirs; do
      podman volume rm -f "$v" >/dev/null 2>&1 || true
    done
    podman network exists "$network" && podman network rm -f "$network" >/dev/null 2>&1 || true
    echo "play.sh: down (the certificates stay in $state/pki)"
    ;;
  *)
    sed -n '2,16p' "$0" >&2
    exit 2
    ;;
esac
