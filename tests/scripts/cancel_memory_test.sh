#!/usr/bin/env bash
# Cancelling a large job gives the worker's memory back: a one-stage job
# with ~280 MB of parameters, gradients and AdamW state runs a few steps on
# a real worker; after `gpipectl cancel` the worker's resident memory falls
# back to near what it held before the job (within 10 s), and the worker is
# free again.
#   cancel_memory_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
bin="$1/bin"
src=$2
for b in gpipectl gpipe-controller gpipe-worker; do
  [[ -x "$bin/$b" ]] || { echo "SKIP: $bin/$b is not built"; echo "0 passed, 0 failed"; exit 0; }
done
work=$(mktemp -d)
source "$src/tests/scripts/recovery_lib.sh"
trap cleanup EXIT


cport=$(free_port)
start_controller
start_worker
wait_workers 1
pid=${worker_pid[$last_worker]}
# With the mount namespace the pid is the worker's after unshare's exec.
sleep 0.5
before=$(rss_mb "$pid")
cat >"$work/big.json" <<'JSON'
{
  "name": "cancel-memory",
  "model": {
    "input": {"dtype": "FLOAT32", "shape": {"dims": [1024]}},
    "layers": [
      {"linear": {"inFeatures": 1024, "outFeatures": 16384}}, {"relu": {}},
      {"linear": {"inFeatures": 16384, "outFeatures": 10}}
    ],
    "loss": {"softmaxCrossEntropy": {}}
  },
  "optimizer": {"lr": 0.001, "adamw": {}},
  "data": {"synthetic": {"task": "CLASSES", "features": 1024, "classes": 10,
                         "trainSamples": 256, "testSamples": 64}},
  "checkpoint": {"every": 0},
  "batchSize": 32,
  "steps": 1000000,
  "seed": 3
}
JSON
job=$(submit "$work/big.json")
wait_step "$job" 2
during=$(rss_mb "$pid")
((during > before + 200)) || fail "the job holds only $((during - before)) MB; the test expects ~280 MB"
"$bin/gpipectl" --controller "127.0.0.1:$cport" cancel "$job" >/dev/null
after=$during
for _ in $(seq 100); do
  after=$(rss_mb "$pid")
  ((after < before + 60)) && break
  sleep 0.1
done
echo "worker RSS: $before MB before the job, $during MB running it, $after MB after the cancel"
((after < before + 60)) || fail "after the cancel the worker still holds $((after - before)) MB more than before the job"
state=$("$bin/gpipectl" --controller "127.0.0.1:$cport" workers --json |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["workers"][0].get("state",""))')
[[ "$state" == IDLE ]] || fail "the worker is $state after the cancel"
echo "1 passed, 0 failed"
