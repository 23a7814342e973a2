#!/usr/bin/env bash
# A checkpoint store with room for exactly the checkpoints a job keeps: the
# next checkpoint's upload fails with "No space left on device", and the job
# must make room (drop its oldest checkpoint, keep one fewer), remove the
# failed write's files at its restart, and finish bitwise equal to the
# single-process reference without spending a restart (also when its
# neighbour's report of the broken link comes first). Before, it failed
# every checkpoint after the first `keep` and never finished. The store is a
# tmpfs sized from a first run of the same job on an unlimited one (root
# only: mounting needs it).
#   recovery_checkpoint_store_full_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
bin="$1/bin"
src=$2
for b in gpipectl gpipe-controller gpipe-worker; do
  [[ -x "$bin/$b" ]] || { echo "SKIP: $bin/$b is not built"; echo "0 passed, 0 failed"; exit 0; }
done
work=$(mktemp -d)
mkdir -p "$work/ckpt"
if ! mount -t tmpfs -o size=64m gpipe-store-full "$work/ckpt" 2>/dev/null; then
  rm -rf "$work"
  echo "SKIP: cannot mount a tmpfs here (needs root)"; echo "0 passed, 0 failed"; exit 0
fi
source "$src/tests/scripts/recovery_lib.sh"
# Detached at once (lazily, while the controller may still hold a file), so
# that recovery_lib's cleanup removes an ordinary folder.
trap 'umount -l "$work/ckpt" 2>/dev/null || true; cleanup' EXIT

# Wide enough that a checkpoint (parameters and momentum) is a few hundred
# KB, far more than the filesystem's pages and the manifest.
spec="$work/store-full.json"
cat >"$spec" <<JSON
{
  "name": "store-full",
  "model": {
    "input": {"dtype": "FLOAT32", "shape": {"dims": [8]}},
    "layers": [
      {"linear": {"inFeatures": 8, "outFeatures": 256}},
      {"relu": {}},
      {"linear": {"inFeatures": 256, "outFeatures": 256}},
      {"relu": {}},
      {"linear": {"inFeatures": 256, "outFeatures": 3}}
    ],
    "loss": {"softmaxCrossEntropy": {}}
  },
  "optimizer": {"lr": 0.01, "sgd": {"momentum": 0.9}},
  "data": {"synthetic": {"task": "CLASSES", "features": 8, "classes": 3,
                         "trainSamples": 512, "testSamples": 96}},
  "pipeline": {"stages": 2, "microBatches": 4, "balance": [3, 2]},
  "checkpoint": {"every": 10, "keep": 2},
  "batchSize": 32,
  "steps": 60,
  "seed": 5,
  "maxRestarts": 5
}
JSON

cport=$(free_port)
start_controller
start_worker
start_worker
wait_workers 2
first=$(submit "$spec")
wait_done "$first"
step_kb=$(du -sk "$work/ckpt/$first/step-50" | cut -f1)
((step_kb > 100)) || fail "a checkpoint of $step_kb KB is too small to size the store by"
ok "an unlimited store: one checkpoint is $step_kb KB"

# Room for the job's 2 checkpoints and half of a third, beside nothing else.
kill "$controller_pid"
wait "$controller_pid" 2>/dev/null || true
umount "$work/ckpt"
mount -t tmpfs -o size=$((2 * step_kb + step_kb / 2))k gpipe-store-full "$work/ckpt"
rm -f "$work/jobs.db"
start_controller
wait_workers 2
job=$(submit "$spec")
wait_done "$job"
grep -q "job $job: the checkpoint store is full: dropped the checkpoint of step" "$work/controller.log" ||
  fail "the job did not drop a checkpoint to make room"
ok "a full store: $(grep -o 'dropped the checkpoint of step [0-9]* and keeping [0-9]*' "$work/controller.log" | head -1)"
restarts=$(job_field "$job" "s.get('restarts', 0)")
[[ "$restarts" == 0 ]] || fail "a full store spent restarts: $restarts"
for dir in "$work/ckpt/$job"/step-*; do
  [[ -f "$dir/MANIFEST.json" ]] || fail "an uncommitted checkpoint's files remain: $(ls "$dir")"
done
same_as_reference "$job" "$spec" 4
ok "bitwise the reference, no restart spent, no stale file"
echo "$passed passed, 0 failed"
