#!/usr/bin/env bash
# A K-stage job across worker pods (podman, deploy/podman/play.sh) whose
# links are shaped like a real network, against `gpipectl plan`'s prediction
# for the same link model: is the planner's communication model right on a
# real network stack (veth pairs, a bridge, TCP, gRPC, TLS)?
# Each worker pod's egress is shaped inside its network namespace: the rate
# with tbf, the delay with netem where the kernel has it (sch_netem; without
# it the delays are skipped and said so). For every link model the job runs
# STEPS steps; the figures are medians over the steps after the third of
# the stages' own reports (step time, bubble = 1 - busy / step), next to the
# plan row of the same K, M and schedule, its layer costs measured in the
# same image (the same OpenBLAS kernel as the workers).
# Usage: bench/pods_network_bench.sh [K] [STEPS] [M]   (defaults 4, 30, 8)
#   RATES (default "10gbit 1gbit"), DELAYS (default "0 100us 1ms").
# Needs the CPU image (deploy/podman/play.sh build) and build/bin/gpipectl.
# K worker pods compute on one thread each: on a machine with fewer than K
# cores the stages share them and the measured step includes that wait.
set -euo pipefail
cd "$(dirname "$0")/.."
src=$PWD
k=${1:-4}
steps=${2:-30}
m=${3:-8}
rates=${RATES:-10gbit 1gbit}
delays=${DELAYS:-0 100us 1ms}
bin=$src/build/bin
image=localhost/gpipe:dev
work=$(mktemp -d /var/tmp/gpipe-net-bench.XXXXXX)
export GPIPE_PODMAN_STATE=$work/state GPIPE_PODMAN_NETWORK=gpipe-bench GPIPE_PODMAN_WORKERS=$k
printf '[containers]\ndefault_ulimits = []\n[engine]\nruntime = "runc"\n' >"$work/containers.conf"
export CONTAINERS_CONF=$work/containers.conf
play=$src/deploy/podman/play.sh
trap '"$play" down >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
podman image exists "$image" || { echo "no $image: run deploy/podman/play.sh build" >&2; exit 2; }

# Two equal blocks per stage: Linear 1024 + ReLU, batch 256 (a micro-batch
# of 32 sends 128 KiB each way per link).
source bench/mlp_spec.sh
write_mlp_spec "$work/job.json" pods-network-bench $((2 * k)) \
  "{\"stages\": ${k}, \"microBatches\": ${m}, \"schedule\": \"ONE_F_ONE_B\", \"remat\": \"NEVER\"}" "$steps"
chmod a+r "$work/job.json"

"$play" up >/dev/null
ip_of() { podman inspect "$1" --format "{{(index .NetworkSettings.Networks \"$GPIPE_PODMAN_NETWORK\").IPAddress}}"; }
ctl() {
  GPIPE_TOKEN=$(cat "$GPIPE_PODMAN_STATE/pki/client.token") timeout 600 "$bin/gpipectl" "$@" \
    --controller "$(ip_of gpipe-controller-controller):7070" --tls_server_name gpipe-controller \
    --tls_ca "$GPIPE_PODMAN_STATE/pki/ca.crt" --tls_cert "$GPIPE_PODMAN_STATE/pki/client.crt" \
    --tls_key "$GPIPE_PODMAN_STATE/pki/client.key"
}
workers=$(podman pod ps --filter label=app.kubernetes.io/component=worker --format '{{.Name}}' | sort)
for _ in $(seq 60); do
  n=$(ctl workers --json 2>/dev/null | python3 -c 'import json, sys; print(len(json.load(sys.stdin).get("workers", [])))' 2>/dev/null || echo 0)
  ((n >= k)) && break
  sleep 1
done
((n >= k)) || { echo "only $n of $k workers attached" >&2; exit 1; }

netns_of() { podman inspect "$1-infra" --format '{{.NetworkSettings.SandboxKey}}' 2>/dev/null ||
  podman pod inspect "$1" --format '{{.InfraContainerID}}' | xargs podman inspect --format '{{.NetworkSettings.SandboxKey}}'; }
have_netem=1
shape() {  # shape RATE DELAY: every worker pod's egress
  local w ns
  for w in $workers; do
    ns=$(netns_of "$w")
    nsenter --net="$ns" tc qdisc del dev eth0 root >/dev/null 2>&1 || true
    if [[ "$2" != 0 ]]; then
      nsenter --net="$ns" tc qdisc add dev eth0 root handle 1: netem delay "$2" rate "$1" 2>/dev/null || return 1
    else
      nsenter --net="$ns" tc qdisc add dev eth0 root tbf rate "$1" burst 32kb latency 100ms
    fi
  done
}
unit_gbps() { python3 -c 'import re, sys; v, u = re.fullmatch(r"([0-9.]+)(gbit|mbit)", sys.argv[1]).groups(); print(float(v) / (1 if u == "gbit" else 1000))' "$1"; }
unit_us() { python3 -c 'import re, sys; v, u = re.fullmatch(r"([0-9.]+)(us|ms|)", sys.argv[1]).groups(); print(float(v) * (1000 if u == "ms" else 1))' "$1"; }

echo "K=$k worker pods (1 thread each), M=$m, 1F1B, $steps steps, $(nproc) cores; model: $((2 * k)) x (Linear 1024 + ReLU) + head, batch 256"
printf '%-8s %-6s %10s %10s %7s %9s %9s\n' link delay "step ms" "plan ms" ratio "bubble" "plan"
for rate in $rates; do
  for delay in $delays; do
    if ! shape "$rate" "$delay"; then
      have_netem=0
      continue
    fi
    gbps=$(unit_gbps "$rate")
    us=$(unit_us "$delay")
    job=$(ctl submit "$work/job.json" 2>/dev/null)
    ctl watch "$job" --json >"$work/$job.json" 2>/dev/null || { echo "$job failed" >&2; exit 1; }
    podman run --rm -v "$work/job.json:/job.json:ro" "$image" gpipectl plan /job.json --measure \
      --stages "$k" --micro-batches "$m" --schedule 1f1b --remat never \
      --link-gbps "$gbps" --link-latency-us "$us" >"$work/plan.txt" 2>&1
    PYTHONPATH=bench python3 - "$work/$job.json" "$k" "$work/plan.txt" "$rate" "$delay" <<'PY'
import re, statistics, sys
from cluster_reports import plan_bubble, step_reports
path, k, plan, rate, delay = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
steps, bubbles = [], []
for stages in step_reports(path, k):
    steps.append(max(s["stepSeconds"] for s in stages))
    bubbles.append(statistics.mean(1 - s.get("busySeconds", 0) / s["stepSeconds"] for s in stages))
if not steps:
    sys.exit("no per-stage reports")
row = [l for l in open(plan) if re.match(r"^[=* ]\s+%d\s" % k, l)]
if not row:
    sys.exit("no plan row: " + open(plan).read())
f = row[0].split()
f = f[1:] if f[0] in ("=", "*") else f
plan_ms = float(f[4])
# The stages' mean bubble, as measured.
planned_bubble = plan_bubble(plan, k)
if planned_bubble is None:
    sys.exit("no per-stage plan: " + open(plan).read())
ms = 1e3 * statistics.median(steps)
print("%-8s %-6s %10.1f %10.1f %7.2f %8.1f%% %8.1f%%" % (
    rate, delay, ms, plan_ms, ms / plan_ms, 100 * statistics.median(bubbles), planned_bubble))
PY
  done
done
((have_netem)) || echo "(delays other than 0 skipped: this kernel has no netem qdisc; rates shaped with tbf)"
