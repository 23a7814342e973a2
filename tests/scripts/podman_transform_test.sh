#!/usr/bin/env bash
# deploy/podman/kube_play_transform.py without podman: the cpu overlay
# (3 workers) and the submit Job, as play.sh renders them, become Pods only,
# and no two pods name one volume (podman 4.3 made one emptyDir `tmp` that
# every pod shared, where the cluster gives each pod its own) or one host
# directory. The e2e (pods_e2e_test.sh) checks the same on running pods.
#   podman_transform_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
src=$(cd "$2" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
source "$src/tests/scripts/k8s_lib.sh"
k8s_find_tools
k8s_render "$src" "$work/rendered"
"$src/deploy/k8s/make-secrets.sh" "$work/pki" --yaml "$work/secrets.yaml" >/dev/null ||
  fail "make-secrets.sh"
# The transform chowns the secret files to the pods' user: a no-op here,
# so that the test needs no root.
transform() {  # transform RENDERED [FLAG...]
  "$yaml_python" -c 'import os, runpy, sys
os.chown = lambda *a: None
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")' "$src/deploy/podman/kube_play_transform.py" "$@" \
    --secrets "$work/secrets.yaml" --state "$work/state"
}
transform "$work/rendered/cpu.yaml" --replicas gpipe-worker=3 >"$work/cluster.yaml" ||
  fail "the transform of the cpu overlay"
transform "$work/rendered/submit-job.yaml" >"$work/submit.yaml" || fail "the transform of the submit Job"

"$yaml_python" - "$work/cluster.yaml" "$work/submit.yaml" <<'PY' || fail "the transformed pods"
import collections, sys, yaml
docs = [d for f in sys.argv[1:] for d in yaml.safe_load_all(open(f)) if d]
kinds = collections.Counter(d["kind"] for d in docs)
assert set(kinds) <= {"Pod", "ConfigMap", "PersistentVolumeClaim"}, kinds
pods = [d for d in docs if d["kind"] == "Pod"]
names = sorted(p["metadata"]["name"] for p in pods)
assert names == ["gpipe-controller", "gpipe-submit-char-transformer", "gpipe-worker-pod-0",
                 "gpipe-worker-pod-1", "gpipe-worker-pod-2"], names
owners = collections.defaultdict(set)
for p in pods:
    spec = p["spec"]
    volumes = {v["name"]: v for v in spec.get("volumes") or []}
    for c in (spec.get("initContainers") or []) + spec["containers"]:
        for m in c.get("volumeMounts") or []:
            assert m["name"] in volumes, (p["metadata"]["name"], m["name"])
    for name, v in volumes.items():
        if "hostPath" in v:
            key = "host " + v["hostPath"]["path"]
        elif "persistentVolumeClaim" in v:
            key = "volume " + v["persistentVolumeClaim"]["claimName"]
        elif "configMap" in v:
            continue  # read-only, as in a cluster
        else:
            key = "volume " + name
        owners[key].add(p["metadata"]["name"])
shared = {k: sorted(v) for k, v in owners.items() if len(v) > 1}
assert not shared, "shared by pods: %s" % shared
workers = [p for p in pods if p["metadata"]["name"].startswith("gpipe-worker-pod-")]
for w in workers:
    assert w["metadata"]["labels"]["app.kubernetes.io/component"] == "worker", w["metadata"]
    tmp = [m for m in w["spec"]["containers"][0]["volumeMounts"] if m["mountPath"] == "/tmp"]
    assert tmp and tmp[0]["name"] == w["metadata"]["name"] + "-tmp", tmp
print("ok: %d pods, %d volumes, none shared" % (len(pods), len(owners)))
PY
echo "1 passed, 0 failed"
