#!/usr/bin/env bash
# An evaluation stays within the workers' memory: real controller and
# worker processes on loopback, started with --memory_limit, running a job
# whose second stage evaluates eight times slower than its first, over 30
# evaluation batches of 16 MB each.
#  - the job succeeds (a stage that sent every batch at once piled them up
#    in the slower stage's queue, and the job failed out of memory at its
#    final evaluation);
#  - each worker's peak resident memory (VmHWM) stays under its
#    --memory_limit (glibc's heap grew to twice the live memory under such
#    batches; the workers link jemalloc).
#   eval_memory_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
bin="$1/bin"
src=$2
for b in gpipectl gpipe-controller gpipe-worker; do
  [[ -x "$bin/$b" ]] || { echo "SKIP: $bin/$b is not built"; echo "0 passed, 0 failed"; exit 0; }
done
work=$(mktemp -d)
source "$src/tests/scripts/recovery_lib.sh"
trap cleanup EXIT

limit_mib=192
cat >"$work/eval.json" <<'JSON'
{
  "name": "slow-evaluation",
  "model": {
    "input": {"dtype": "FLOAT32", "shape": {"dims": [64]}},
    "layers": [{"linear": {"inFeatures": 64, "outFeatures": 4096}},
               {"relu": {}},
               {"linear": {"inFeatures": 4096, "outFeatures": 512}},
               {"relu": {}},
               {"linear": {"inFeatures": 512, "outFeatures": 512}},
               {"relu": {}},
               {"linear": {"inFeatures": 512, "outFeatures": 10}}],
    "loss": {"softmaxCrossEntropy": {}}
  },
  "optimizer": {"lr": 0.01, "sgd": {}},
  "data": {"synthetic": {"task": "CLASSES", "features": 64, "classes": 10,
                         "trainSamples": 1000, "testSamples": 30000}},
  "pipeline": {"stages": 2, "microBatches": 2, "balance": [2, 5]},
  "batchSize": 100, "steps": 2, "seed": 3,
  "eval": {"batchSize": 1000}
}
JSON

cport=$(free_port)
start_controller
worker_args=(--memory_limit "${limit_mib}MiB")
start_worker
start_worker
wait_workers 2
job=$(submit "$work/eval.json")
DONE_TIMEOUT=120 wait_done "$job"
echo "the job succeeded"

for w in w0 w1; do
  pid=${worker_pid[$w]}
  peak=$(awk '/^VmHWM/ {print int($2 / 1024)}' "/proc/$pid/status")
  echo "$w: peak resident memory $peak MiB (--memory_limit ${limit_mib}MiB)"
  ((peak <= limit_mib)) ||
    fail "worker $w peaked at $peak MiB resident, over its --memory_limit ${limit_mib}MiB"
done
echo "2 passed, 0 failed"
