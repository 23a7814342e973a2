#!/usr/bin/env bash
# End-to-end step time of a 2-worker local cluster (2 processes, gRPC over
# loopback) against the in-process engine with the same K=2 and M, and
# against PyTorch (torch.distributed.pipeline.sync.Pipe with the same two
# partitions and chunks, and plain single-process PyTorch), on the same model
# and the same 2 cores. The engine and the cluster run in PAIRS alternating
# pairs (engine, cluster, engine, cluster, ...) so that load drifting on a
# shared machine hits both sides alike; each pair gives an overhead, and the
# median pair is the figure to read.
# PLANE is the workers' --data_plane (grpc: frames over loopback TCP; shm:
# the shared-memory plane that auto picks on one host).
# Then each schedule of SCHEDULES (default "1f1b zb-h1 interleaved zb-v") on the same
# cluster: step time and measured bubble against the schedule's formula.
# Usage: bench/cluster_bench.sh [M] [STEPS] [PAIRS] [PLANE]   (defaults 8, 40, 3, grpc)
#   K=4 (default 2) for the schedules' part: K workers of one thread each.
# Needs build/bin (scripts/build.sh) and, for the PyTorch row, python3-torch
# (scripts/setup.sh --bench).
set -euo pipefail
cd "$(dirname "$0")/.."
m=${1:-8}
steps=${2:-40}
pairs=${3:-3}
plane=${4:-grpc}
bin=build/bin
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# A balanced MLP: 8 x (Linear 1024 + ReLU) and a 16-class head, batch 256.
source bench/mlp_spec.sh
write_mlp_spec "$work/job.json" cluster-bench 8 "{\"stages\": 2, \"microBatches\": ${m}}" "$steps"

rate() { sed -n 's/.* steps in \([0-9.]*\)s (\([0-9]*\) samples\/s).*/\2/p' | tail -1; }
echo "model: MLP 8 x (Linear 1024 + ReLU) + head, batch 256, K=2, M=$m, $steps steps, 2 cores"
overheads=()
for ((i = 1; i <= pairs; i++)); do
  inproc=$("$bin/gpipectl" train "$work/job.json" --stages 2 --threads 2 2>&1 | rate)
  cluster=$("$bin/gpipectl" local "$work/job.json" --workers 2 --stages 2 --threads 2 --data_plane "$plane" 2>&1 | rate)
  [[ -n "$inproc" && -n "$cluster" ]] || { echo "pair $i: a run failed" >&2; exit 1; }
  o=$(python3 -c "print('%.1f' % (100.0 * ($inproc / $cluster - 1)))")
  overheads+=("$o")
  echo "pair $i: in-process pipeline (2 stage threads) $inproc samples/s, local cluster (2 worker processes, $plane) $cluster samples/s, overhead $o%"
done
python3 -c "import statistics, sys; v = [float(x) for x in sys.argv[1:]]; print('cluster overhead: median %.1f%% over %d pairs (min %.1f%%, max %.1f%%; goal <= 10%% at M=8)' % (statistics.median(v), len(v), min(v), max(v)))" "${overheads[@]}"

# Against the ideal: GPipe's step on K stages and M micro-batches takes
# (M + K - 1) / M times the busiest stage's compute, so the same run's
# per-stage busy times say how far the cluster is from what its schedule
# allows (transport, waiting, the optimizer step). From the stages' reports
# of each step after the third (gpipectl local --json), medians over steps.
"$bin/gpipectl" local "$work/job.json" --workers 2 --stages 2 --threads 2 \
  --data_plane "$plane" --json >"$work/ideal.json" 2>/dev/null
PYTHONPATH=bench python3 - "$work/ideal.json" "$m" <<'PY'
import statistics, sys
from cluster_reports import step_reports
m, k = int(sys.argv[2]), 2
actual, ideal, busy = [], [], []
for stages in step_reports(sys.argv[1], k):
    b = [s.get("busySeconds", 0) for s in stages]
    busy.append(b)
    actual.append(max(s["stepSeconds"] for s in stages))
    ideal.append(max(b) * (m + k - 1) / m)
if not actual:
    sys.exit("no per-stage reports in the cluster's --json output")
a, i = statistics.median(actual), statistics.median(ideal)
per_stage = ", ".join("%.1f" % (1e3 * statistics.median(x[j] for x in busy)) for j in range(k))
print("cluster step %.1f ms against the ideal %.1f ms ((M+K-1)/M x the busiest "
      "stage; stages busy %s ms per step; medians of %d steps): %.1f%% above "
      "(goal <= 10%%)" % (1e3 * a, 1e3 * i, per_stage, len(actual), 100 * (a / i - 1)))
PY

# The schedules on the same cluster (remat never, so the stages are equal:
# stages that re-materialize do more): each worker's bubble per step (1 -
# busy / step, from the stages' reports) against the schedule's formula, and
# step and bubble against `gpipectl plan --measure` for the same K, M,
# schedule and remat (its layer costs measured here, one thread, as the
# workers run). Under the interleaved schedule (v=2, M a multiple of K) and
# ZB-V each worker runs two chunks: its bubble is 1 - its chunks' busy time
# together / step.
# K (default 2) workers of one thread each: K=4 needs 4 cores to measure
# the schedules rather than the cores' sharing.
k=${K:-2}
for schedule in ${SCHEDULES:-1f1b zb-h1 interleaved zb-v}; do
  "$bin/gpipectl" local "$work/job.json" --workers "$k" --stages "$k" --threads "$k" \
    --data_plane "$plane" --schedule "$schedule" --remat never \
    --json >"$work/$schedule.json" 2>/dev/null
  # The plan of the cut the cluster ran (measured layer costs can tie and
  # cut otherwise). The shared-memory plane's ring takes a message at once;
  # frames over gRPC hold the sender until the bytes are through.
  v=1
  [[ $schedule == interleaved || $schedule == zb-v ]] && v=2
  python3 bench/cluster_reports.py with-cut "$work/$schedule.json" $((k * v)) "$schedule" \
    "$work/job.json" "$work/$schedule-cut.json"
  "$bin/gpipectl" plan "$work/$schedule-cut.json" --measure --stages "$k" --micro-batches "$m" \
    --schedule "$schedule" --remat never --blocking-sends="$([[ $plane == shm ]] && echo false || echo true)" \
    >"$work/$schedule.plan" 2>&1
  PYTHONPATH=bench python3 - "$work/$schedule.json" "$m" "$schedule" "$work/$schedule.plan" "$k" <<'PY'
import collections, re, statistics, sys
from cluster_reports import plan_bubble, step_reports
m, k, name = int(sys.argv[2]), int(sys.argv[5]), sys.argv[3]
v = 2 if name in ("interleaved", "zb-v") else 1
bubbles, steps = [], []
for stages in step_reports(sys.argv[1], k * v):
    step = max(s["stepSeconds"] for s in stages)
    steps.append(step)
    busy = collections.defaultdict(float)
    for s in stages:
        busy[s["workerId"]] += s.get("busySeconds", 0)
    bubbles.append(statistics.mean(1 - b / step for b in busy.values()))
if not steps:
    sys.exit("no per-stage reports in the cluster's --json output")
formula = {"zb-h1": (k - 1) / (3 * m + k - 1), "zb-v": (k - 1) / (6 * m + k - 1)}.get(
    name, (k - 1) / (v * m + k - 1))
best = [l for l in open(sys.argv[4]) if l.startswith("best:")]
if not best:
    sys.exit("no plan: " + open(sys.argv[4]).read())
plan_ms = float(re.search(r"([0-9.]+) ms a step", best[0]).group(1))
planned_bubble = plan_bubble(sys.argv[4], k)
if planned_bubble is None:
    sys.exit("no per-stage plan: " + open(sys.argv[4]).read())
ms = 1e3 * statistics.median(steps)
print("cluster %-11s step %.1f ms (plan %.1f ms, %.2fx), bubble %.1f%% (plan %.1f%%, formula %.1f%%; "
      "medians of %d steps)" % (name, ms, plan_ms, ms / plan_ms, 100 * statistics.median(bubbles),
                                planned_bubble, 100 * formula, len(steps)))
PY
done

python=""
for candidate in python3 /usr/bin/python3; do
  if "$candidate" -c 'import torch' 2>/dev/null; then python=$candidate; break; fi
done
if [[ -n "$python" ]]; then
  ms=$("$python" bench/torch_step.py "$work/job.json" --steps "$steps" --warmup 3 --threads 2 \
       --micro-batches 1 2>/dev/null | sed -n 's/^ms\/step: median \([0-9.]*\).*/\1/p')
  "$python" -c "r = 256 / ($ms / 1000); print('plain PyTorch, 1 process, 2 threads: %.0f samples/s (cluster / PyTorch: %.2f)' % (r, $cluster / r))"
  pipe=$("$python" bench/torch_pipe.py --chunks "$m" --steps "$steps" --threads 2 2>/dev/null |
         sed -n 's/^samples\/s: \([0-9]*\)/\1/p')
  "$python" -c "print('torch Pipe (2 partitions, chunks=$m), 1 process, 2 threads: $pipe samples/s (cluster / Pipe: %.2f)' % ($cluster / $pipe))"
else
  echo "plain PyTorch: skipped (no python3 with torch; scripts/setup.sh --bench)"
fi
