#!/usr/bin/env bash
# End-to-end step time of a 2-worker local cluster (2 processes, gRPC over
# loopback) against the in-process engine with the same K=2 and M, and
# against PyTorch (torch.distributed.pipeline.sync.Pipe with the same two
# partitions and chunks, and plain single-process PyTorch), on the same model
# and the same 2 cores. Usage: bench/cluster_bench.sh [M] [STEPS]   (defaults 8, 40)
# Needs build/bin (scripts/build.sh) and, for the PyTorch row, python3-torch
# (scripts/setup.sh --bench).
set -euo pipefail
cd "$(dirname "$0")/.."
m=${1:-8}
steps=${2:-40}
bin=build/bin
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# A balanced MLP: 8 x (Linear 1024 + ReLU) and a 16-class head, batch 256.
layers=""
for _ in 1 2 3 4 5 6 7 8; do
  layers+='{"linear": {"inFeatures": 1024, "outFeatures": 1024}}, {"relu": {}}, '
done
cat >"$work/job.json" <<JSON
{"name": "cluster-bench",
 "model": {"input": {"dtype": "FLOAT32", "shape": {"dims": [1024]}},
           "layers": [${layers} {"linear": {"inFeatures": 1024, "outFeatures": 16}}],
           "loss": {"softmaxCrossEntropy": {}}},
 "optimizer": {"lr": 0.01, "sgd": {"momentum": 0.9}},
 "data": {"synthetic": {"task": "CLASSES", "features": 1024, "classes": 16,
                        "trainSamples": 4096, "testSamples": 16}},
 "pipeline": {"stages": 2, "microBatches": ${m}},
 "batchSize": 256, "steps": ${steps}, "seed": 1}
JSON

rate() { sed -n 's/.* steps in \([0-9.]*\)s (\([0-9]*\) samples\/s).*/\2/p' | tail -1; }
inproc=$("$bin/gpipectl" train "$work/job.json" --stages 2 --threads 2 2>&1 | rate)
cluster=$("$bin/gpipectl" local "$work/job.json" --workers 2 --stages 2 --threads 2 2>&1 | rate)
echo "model: MLP 8 x (Linear 1024 + ReLU) + head, batch 256, K=2, M=$m, $steps steps, 2 cores"
echo "in-process pipeline (2 stage threads):   $inproc samples/s"
echo "local cluster (2 worker processes, gRPC): $cluster samples/s"
python3 -c "print('cluster overhead: %.1f%% (goal <= 10%% at M=8)' % (100.0 * ($inproc / $cluster - 1)))"

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
