# Shared by tests/scripts/k8s_*_test.sh (sourced, not run): finds kubectl
# and yamllint and renders every kustomization offline.

# kubectl: $KUBECTL if set, else the one on PATH (Debian's kubernetes-client
# in CI: kubectl 1.20 with kustomize v2).
k8s_find_tools() {
  kubectl=${KUBECTL:-$(command -v kubectl || true)}
  [[ -n "$kubectl" && -x "$kubectl" ]] ||
    fail "kubectl not found (scripts/setup.sh installs Debian's kubernetes-client)"
  command -v yamllint >/dev/null ||
    fail "yamllint not found (scripts/setup.sh installs it)"
  # The interpreter yamllint runs on has PyYAML (Debian python3-yaml).
  yaml_python=$(sed -n '1s/^#! *//p' "$(command -v yamllint)")
  [[ -n "$yaml_python" ]] && "$yaml_python" -c 'import yaml' 2>/dev/null ||
    yaml_python=python3
  "$yaml_python" -c 'import yaml' 2>/dev/null ||
    fail "no python with PyYAML (Debian python3-yaml)"
}

# The kustomizations users apply, relative to the source root.
K8S_KUSTOMIZATIONS=(deploy/k8s/base deploy/k8s/overlays/cpu
  deploy/k8s/overlays/gpu deploy/k8s/examples/submit-job)

# k8s_render SOURCE_DIR OUT_DIR: OUT_DIR/<name>.yaml for each kustomization.
k8s_render() {
  local src=$1 out=$2 k name
  mkdir -p "$out"
  for k in "${K8S_KUSTOMIZATIONS[@]}"; do
    name=$(basename "$k")
    "$kubectl" kustomize "$src/$k" >"$out/$name.yaml" 2>"$out/$name.err" ||
      fail "kubectl kustomize $k failed: $(cat "$out/$name.err")"
    [[ -s "$out/$name.yaml" ]] || fail "kubectl kustomize $k rendered nothing"
  done
}
