#!/usr/bin/env bash
# The rendered manifests against the binaries they run
# (tests/scripts/k8s_manifests.py: flags, ports, Services, ServiceMonitors,
# NetworkPolicies, the dashboards ConfigMap), then every probe's health
# service name asked of the real binaries' --health_listen ports on
# loopback: the controller's and the worker's liveness/startup services
# SERVING, the worker's readiness service SERVING once it is attached.
#   k8s_manifests_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
bin="$1/bin"
src=$(cd "$2" && pwd)
for b in gpipectl gpipe-controller gpipe-worker grpc_health_probe; do
  [[ -x "$bin/$b" ]] || { echo "SKIP: $bin/$b is not built"; echo "0 passed, 0 failed"; exit 0; }
done
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; tail -n 5 "$work"/*.log >&2 2>/dev/null || true; exit 1; }
source "$src/tests/scripts/k8s_lib.sh"
k8s_find_tools
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
passed=0

k8s_render "$src" "$work/rendered"
"$yaml_python" "$src/tests/scripts/k8s_manifests.py" --bin "$bin" \
  --dashboards "$src/dashboards/grafana" --probe-services "$work/probes.txt" \
  --rules "$src/deploy/prometheus/gpipe-rules.yml" \
  "$work"/rendered/*.yaml || fail "the manifests do not match the binaries"
passed=$((passed + 1))

# The PrometheusRule must hold Prometheus's own rule file: a changed
# threshold there is caught here.
sed 's/increase(gpipe_job_restarts_total\[30m\]) > 3.5/increase(gpipe_job_restarts_total[30m]) > 4.5/' \
  "$src/deploy/prometheus/gpipe-rules.yml" >"$work/rules-changed.yml"
if "$yaml_python" "$src/tests/scripts/k8s_manifests.py" --bin "$bin" \
  --dashboards "$src/dashboards/grafana" --rules "$work/rules-changed.yml" \
  "$work/rendered/cpu.yaml" >"$work/rules.out" 2>&1; then
  fail "the checker passed a PrometheusRule that differs from the rule file"
fi
grep -q "groups differ" "$work/rules.out" || fail "the rules difference was not named: $(cat "$work/rules.out")"
passed=$((passed + 1))

# The checker must see what it checks: a flag no binary has is caught.
sed 's/--listen=0.0.0.0:7071/--listen_nowhere=0.0.0.0:7071/' \
  "$work/rendered/cpu.yaml" >"$work/broken.yaml"
if "$yaml_python" "$src/tests/scripts/k8s_manifests.py" --bin "$bin" \
  --dashboards "$src/dashboards/grafana" "$work/broken.yaml" >"$work/broken.out" 2>&1; then
  fail "the checker passed a worker flag --listen_nowhere"
fi
grep -q "listen_nowhere" "$work/broken.out" || fail "the checker did not name the bad flag: $(cat "$work/broken.out")"
passed=$((passed + 1))

# The probes' services, asked of the real binaries.
[[ -s "$work/probes.txt" ]] || fail "the manifests have no probes"
# The manifests probe the plaintext --health_listen ports (TLS is on in
# the base): the binaries run with one here (and plaintext gRPC, which the
# health ports do not depend on).
cport=$(free_port)
wport=$(free_port)
chealth=$(free_port)
whealth=$(free_port)
"$bin/gpipe-controller" --listen "127.0.0.1:$cport" --checkpoint_dir "$work/ckpt" --metrics_listen "" \
  --health_listen "127.0.0.1:$chealth" >"$work/controller.log" 2>&1 &
pids+=($!)
"$bin/gpipe-worker" --controller "127.0.0.1:$cport" --listen "127.0.0.1:$wport" \
  --health_listen "127.0.0.1:$whealth" --threads 1 >"$work/worker.log" 2>&1 &
pids+=($!)
while read -r binary kind service; do
  [[ "$service" == '""' ]] && service=""
  case "$binary" in
    gpipe-controller) port=$chealth ;;
    gpipe-worker) port=$whealth ;;
    *) fail "a probe on $binary" ;;
  esac
  ok=0
  for _ in $(seq 1 50); do  # bounded: 10 s (readiness waits for the attach)
    if "$bin/grpc_health_probe" "127.0.0.1:$port" "$service" >"$work/probe.out" 2>&1; then
      ok=1
      break
    fi
    sleep 0.2
  done
  ((ok)) || fail "$binary $kind: service \"$service\": $(cat "$work/probe.out")"
  echo "$binary $kind: $(cat "$work/probe.out")"
done <"$work/probes.txt"
# A name the binary does not register is not SERVING (the probe can fail).
if "$bin/grpc_health_probe" "127.0.0.1:$whealth" gpipe.v1.NoSuchService >/dev/null 2>&1; then
  fail "the worker reports an unknown service as SERVING"
fi
passed=$((passed + 1))
echo "$passed passed, 0 failed"
