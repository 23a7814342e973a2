#!/usr/bin/env bash
# The self-balancing pipeline on a real controller and worker processes on
# loopback (controller/balancer.h):
#   1. three workers, one standing for a machine 4x slower
#      (--compute_slowdown 4): a 3-stage job starts from the cost model's
#      cut, re-partitions at a checkpoint for the workers' speeds, moving
#      layers off the slow worker and expecting a step at least 20% faster,
#      measures the new cut's step, does not go back and forth (a revert
#      after a slower measurement aside) over REBALANCE_STEPS (500) steps,
#      and its parameters are bitwise those of the single-process reference
#      trainer;
#   2. three equal workers and a model of equal layers, whose cost-model cut
#      is already right: no re-partition.
# Knobs: REBALANCE_STEPS (default 500), KEEP_WORK=1.
#   rebalance_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
bin="$1/bin"
src=$2
for b in gpipectl gpipe-controller gpipe-worker; do
  [[ -x "$bin/$b" ]] || { echo "SKIP: $bin/$b is not built"; echo "0 passed, 0 failed"; exit 0; }
done
work=$(mktemp -d)
source "$src/tests/scripts/recovery_lib.sh"
trap cleanup EXIT
steps=${REBALANCE_STEPS:-500}

# rebalance_spec FILE NAME: 12 equal Linear 384 -> 384 layers (with ReLUs),
# 3 stages, M=4; checkpoints every 20 steps, re-partitions after 40, at
# most one per 100.
rebalance_spec() {
  local layers="" i
  for i in $(seq 12); do
    layers+='{"linear": {"inFeatures": 384, "outFeatures": 384}}, {"relu": {}}, '
  done
  cat >"$1" <<JSON
{
  "name": "$2",
  "model": {
    "input": {"dtype": "FLOAT32", "shape": {"dims": [384]}},
    "layers": [${layers}{"linear": {"inFeatures": 384, "outFeatures": 4}}],
    "loss": {"softmaxCrossEntropy": {}}
  },
  "optimizer": {"lr": 0.01, "sgd": {"momentum": 0.9}},
  "data": {"synthetic": {"task": "CLASSES", "features": 384, "classes": 4,
                         "trainSamples": 1024, "testSamples": 128}},
  "pipeline": {"stages": 3, "microBatches": 4, "remat": "NEVER",
               "rebalance": {"afterSteps": 40, "everySteps": 100}},
  "checkpoint": {"every": 20, "keep": 2},
  "batchSize": 64,
  "steps": $steps,
  "seed": 11
}
JSON
}

cport=$(free_port)
start_controller
# Attach order places the stages: the slow worker gets stage 1.
start_worker
wait_workers 1
worker_args=(--compute_slowdown 4)
start_worker
wait_workers 2
slow=$last_worker
worker_args=()
start_worker
wait_workers 3

# --- 1. a slow worker ------------------------------------------------------
rebalance_spec "$work/slow.json" rebalance-slow
job=$(submit "$work/slow.json")
timeout -k 5 300 "$bin/gpipectl" --controller "127.0.0.1:$cport" watch "$job" \
  >"$work/watch.txt" 2>/dev/null || true
grep -q "SUCCEEDED" "$work/watch.txt" || fail "job $job did not succeed: $(tail -n 5 "$work/watch.txt")"
# watch prints each re-partition as it starts and once it was measured.
# (No line is the check's below to report, not a silent exit of set -e.)
grep "re-partition" "$work/watch.txt" | cut -c1-200 || true
grep -q "RESTARTING: re-partitioning (" "$work/watch.txt" ||
  fail "gpipectl watch printed no re-partition"
grep -Eq "re-partition at step [0-9]+ \([0-9,]+ -> [0-9,]+\) measured [0-9.]+ ms -> [0-9.]+ ms a step \(expected [0-9.]+ ms\)" "$work/watch.txt" ||
  fail "gpipectl watch printed no measured step time after a re-partition"
ctl status "$job" | sed -n '/re-partitions:/,/conditions:/p' | sed '$d'
ctl status "$job" --json >"$work/slow-status.json"
slow_id=$(sed -n 's/.*attached to the controller at .* as \(w-[^;]*\);.*/\1/p' "$work/$slow.log" | head -n 1)
[[ -n $slow_id ]] || fail "no worker id in $work/$slow.log"
# The decision is checked, not the clock: on a loaded machine (CI runs other
# tests beside this one) the ten steps the controller measures a new cut
# over can come out slower, and then it reverts, as designed; the speed
# itself is bench/rebalance_bench.sh's to measure.
python3 - "$work/slow-status.json" "$slow_id" <<'PY' || fail "job $job: the re-partitions are not what they should be"
import json, sys
s = json.load(open(sys.argv[1]))["status"]
slow = sys.argv[2]
r = s.get("repartitions", [])
assert r, "never re-partitioned with a 4x slower worker"
first = r[0]
assert first["reason"] == "worker_speeds", f"first re-partition for {first['reason']}"
def layers_on(worker, balance, workers):
    return sum(int(n) for n, w in zip(balance, workers) if w == worker)
old_n = layers_on(slow, first["oldBalance"], first["oldWorkers"])
new_n = layers_on(slow, first["newBalance"], first["workers"])
print(f"first re-partition: the slow worker {slow} held {old_n} layers, now {new_n}")
assert new_n < old_n, "the slow worker did not lose layers"
assert first["predictedNewSeconds"] <= 0.8 * first["predictedOldSeconds"], \
    "the re-partition did not expect a step 20% faster"
before, after = first["measuredOldSeconds"], first.get("measuredNewSeconds", 0)
assert after > 0, "the new cut's step time was never measured"
print(f"measured: {before * 1e3:.1f} -> {after * 1e3:.1f} ms a step "
      f"({after / before:.2f}x; bench/rebalance_bench.sh measures this)")
# Never back and forth: every cut it moved to is new, and it settles.
# No cut twice, but for a revert to the cut just before a slower one.
def cut_of(balance, workers):  # int64s come as strings in proto JSON
    return (tuple(int(n) for n in balance), tuple(workers))
seen = [cut_of(first["oldBalance"], first["oldWorkers"])]
for x in r:
    cut = cut_of(x["newBalance"], x["workers"])
    if x["reason"] == "revert":
        assert cut == seen[-2], f"reverted to {cut}, not to {seen[-2]}"
        continue
    assert cut not in seen, f"went back to {cut}"
    seen.append(cut)
assert len(r) <= 3, f"{len(r)} re-partitions in one job"
PY
ok "a 4x slower worker: re-partitioned off it, expecting a step at most 0.8x the one before, no cut twice (but a revert) over $steps steps"
same_as_reference "$job" "$work/slow.json" 4
ok "bitwise the single-process reference trainer"

# --- 2. equal workers, the cut already right --------------------------------
kill "${worker_pid[$slow]}"
unset "worker_port[$slow]"
start_worker
wait_workers 3
rebalance_spec "$work/equal.json" rebalance-equal
job=$(submit "$work/equal.json")
DONE_TIMEOUT=300 wait_done "$job"
count=$(job_field "$job" "len(s.get('repartitions', []))")
[[ "$count" == 0 ]] || fail "job $job re-partitioned $count times on equal workers: $(ctl status "$job")"
ok "equal workers, equal layers: no re-partition"
echo "$passed passed, 0 failed"
