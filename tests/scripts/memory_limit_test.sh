#!/usr/bin/env bash
# A job too large for the cluster's workers costs no worker: real controller
# and worker processes on loopback, the worker started with --memory_limit.
#  - the worker advertises what its stages may hold (gpipectl workers);
#  - a job whose stage needs more than any worker has is refused at
#    submission with the figures (FAILED_PRECONDITION);
#  - a job submitted before the worker attached waits, saying which stage
#    needs what and what the worker has, and never reaches the worker;
#  - the worker stays alive and idle, and runs a job that fits.
#   memory_limit_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
bin="$1/bin"
src=$2
for b in gpipectl gpipe-controller gpipe-worker; do
  [[ -x "$bin/$b" ]] || { echo "SKIP: $bin/$b is not built"; echo "0 passed, 0 failed"; exit 0; }
done
work=$(mktemp -d)
source "$src/tests/scripts/recovery_lib.sh"
trap cleanup EXIT

# A Linear of 784 x 200,000: 157M parameters, 627 MB, and as much again
# for gradients. A 400 MiB worker holds about 300 MiB of stages.
cat >"$work/huge.json" <<'JSON'
{
  "name": "too-large",
  "model": {
    "input": {"dtype": "FLOAT32", "shape": {"dims": [784]}},
    "layers": [{"linear": {"inFeatures": 784, "outFeatures": 200000}},
               {"relu": {}},
               {"linear": {"inFeatures": 200000, "outFeatures": 10}}],
    "loss": {"softmaxCrossEntropy": {}}
  },
  "optimizer": {"lr": 0.01, "sgd": {}},
  "data": {"synthetic": {"task": "CLASSES", "features": 784, "classes": 10,
                         "trainSamples": 64, "testSamples": 16}},
  "batchSize": 16, "steps": 2, "seed": 1
}
JSON
write_spec "$work/small.json" fits 20 1 1 "$SGD"

cport=$(free_port)
start_controller
# Submitted while no worker is attached: accepted, it waits.
waiting=$(submit "$work/huge.json")
worker_args=(--memory_limit 400MiB)
start_worker
wait_workers 1
pid=${worker_pid[$last_worker]}

memory=$(ctl workers --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["workers"][0]["resources"].get("memoryBytes", "0"))')
((memory > 250 * 1048576 && memory < 400 * 1048576)) ||
  fail "the worker advertises $memory bytes for stages with --memory_limit 400MiB"
ctl workers | grep -q "MEMORY" || fail "gpipectl workers shows no MEMORY column"
echo "worker advertises $((memory / 1048576)) MiB for stages"

# The waiting job says why, and the worker stays idle.
message=""
for _ in $(seq 50); do
  message=$(job_field "$waiting" "' '.join(c.get('message','') for c in s.get('conditions', []) if c.get('type') == 'Scheduled')")
  [[ "$message" == *"the largest free worker left has"* ]] && break
  sleep 0.1
done
[[ "$message" == *"stage 0 needs"*"the largest free worker left has"* ]] ||
  fail "the waiting job's condition does not give the figures: '$message'"
echo "waiting: $message"
state=$(job_field "$waiting" "s.get('state','')")
[[ "$state" == PENDING ]] || fail "the too-large job is $state, not PENDING"
ctl cancel "$waiting" >/dev/null

# Submitted now: refused at once, with the figures.
set +e
refused=$(ctl submit "$work/huge.json" 2>&1)
rc=$?
set -e
((rc != 0)) || fail "a job no worker can hold was accepted: $refused"
[[ "$refused" == *"stage 0 needs"*"the largest worker has"*"for stages"* ]] ||
  fail "the refusal does not give the figures: $refused"
echo "refused: $refused"

kill -0 "$pid" 2>/dev/null || fail "the worker died"
job=$(submit "$work/small.json")
wait_done "$job"
echo "a job that fits ran on the same worker"
echo "1 passed, 0 failed"
