#!/usr/bin/env bash
# Every kustomization under deploy/k8s renders offline with kubectl (no
# cluster), the sources and the rendered YAML pass yamllint (.yamllint), and
# each overlay says what it is for.
#   k8s_render_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
src=$(cd "$2" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
source "$src/tests/scripts/k8s_lib.sh"
k8s_find_tools
passed=0

"$kubectl" version --client 2>/dev/null | head -2 || true
k8s_render "$src" "$work"
passed=$((passed + 1))

(cd "$src" && yamllint -c .yamllint .yamllint deploy/k8s dashboards/grafana/kustomization.yaml) ||
  fail "yamllint: the manifests' sources"
(cd "$work" && yamllint -c "$src/.yamllint" ./*.yaml) || fail "yamllint: the rendered manifests"
passed=$((passed + 1))

# What each overlay is for, read from the render (PyYAML, not grep).
"$yaml_python" - "$work" <<'PY' || fail "overlay contents"
import sys, yaml
out = sys.argv[1]
def load(name):
    return list(d for d in yaml.safe_load_all(open("%s/%s.yaml" % (out, name))) if d)
def find(docs, kind, name):
    for d in docs:
        if d["kind"] == kind and d["metadata"]["name"] == name:
            return d
    sys.exit("%s/%s missing" % (kind, name))
problems = []
for name in ("base", "cpu", "gpu"):
    docs = load(name)
    for d in docs:
        labels = d["metadata"].get("labels", {})
        for key in ("app.kubernetes.io/part-of", "app.kubernetes.io/managed-by"):
            if key not in labels:
                problems.append("%s: %s/%s has no %s" % (name, d["kind"], d["metadata"]["name"], key))
        if d["kind"] != "Namespace" and d["metadata"].get("namespace") != "gpipe":
            problems.append("%s: %s/%s is not in namespace gpipe" % (name, d["kind"], d["metadata"]["name"]))
    ctl = find(docs, "Deployment", "gpipe-controller")
    if ctl["spec"]["replicas"] != 1 or ctl["spec"]["strategy"]["type"] != "Recreate":
        problems.append("%s: the controller is not one replica with Recreate" % name)
    for kind in ("PodDisruptionBudget", "NetworkPolicy", "ServiceMonitor", "PersistentVolumeClaim"):
        if not any(d["kind"] == kind for d in docs):
            problems.append("%s: no %s" % (name, kind))
    svc = find(docs, "Service", "gpipe-worker")
    if svc["spec"].get("clusterIP") != "None":
        problems.append("%s: the worker Service is not headless" % name)
    for d in docs:
        if d["kind"] in ("Deployment",):
            for c in d["spec"]["template"]["spec"]["containers"]:
                if "resources" not in c or not c["resources"].get("limits"):
                    problems.append("%s: %s has no resource limits" % (name, c["name"]))
                ctx = d["spec"]["template"]["spec"].get("securityContext", {})
                if not ctx.get("runAsNonRoot"):
                    problems.append("%s: %s may run as root" % (name, c["name"]))
gpu = find(load("gpu"), "Deployment", "gpipe-worker")["spec"]["template"]["spec"]
worker = gpu["containers"][0]
if worker["resources"]["limits"].get("nvidia.com/gpu") != 1:
    problems.append("gpu: a worker does not take nvidia.com/gpu: 1")
if "gpipe-cuda" not in worker["image"]:
    problems.append("gpu: the worker image is %s, not the CUDA one" % worker["image"])
if not gpu.get("nodeSelector") or not gpu.get("tolerations"):
    problems.append("gpu: no node selector or tolerations")
cpu = find(load("cpu"), "Deployment", "gpipe-worker")["spec"]["template"]["spec"]
if "nvidia.com/gpu" in str(cpu):
    problems.append("cpu: asks for a GPU")
job = find(load("submit-job"), "Job", "gpipe-submit-char-transformer")
args = job["spec"]["template"]["spec"]["containers"][0]["args"]
if args[0] != "submit" or "--watch" not in args or not any(a.startswith("--controller=gpipe-controller") for a in args):
    problems.append("submit-job: does not submit and watch against the controller Service: %s" % args)
for p in problems:
    print("FAIL:", p)
sys.exit(1 if problems else 0)
PY
passed=$((passed + 1))
echo "$passed passed, 0 failed"
