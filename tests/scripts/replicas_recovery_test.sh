#!/usr/bin/env bash
# Elastic replicas on real processes (loopback, stage files through the
# controller's API), K=2 stages x R=2 replicas, checkpoints every 10 steps:
#   1. kill -9 a worker of replica 1 with no spare: the job goes on with one
#      replica from the step the survivors hold in memory;
#   2. two workers join: it grows back to two replicas, the new ones copying
#      their stages' states from the live replica;
#   3. kill -9 a worker of replica 0 with a spare free: still two replicas,
#      replica 0's stage now copied from replica 1's worker;
#   4. one stage x 4 replicas (4 gradient groups), the spare gone: kill -9 a
#      replica's worker and the job goes on with 3 replicas (the groups
#      shared 1, 1, 2: the same bits).
# No checkpoint is restored at any point (no worker logs a restore), every
# resume says it came from memory, `gpipectl status` shows the grid, and the
# model ends bitwise equal to the single-process reference trainer.
# Knobs: REPLICA_STEPS (default 4000), KEEP_WORK=1.
#   replicas_recovery_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
bin="$1/bin"
src=$2
for b in gpipectl gpipe-controller gpipe-worker; do
  [[ -x "$bin/$b" ]] || { echo "SKIP: $bin/$b is not built"; echo "0 passed, 0 failed"; exit 0; }
done
work=$(mktemp -d)
source "$src/tests/scripts/recovery_lib.sh"
trap cleanup EXIT

steps=${REPLICA_STEPS:-4000}
cport=$(free_port)
start_controller
for _ in 1 2 3 4; do start_worker; done
wait_workers 4

# recovery_lib's model (its batch norm too), on 2 stages x 2 replicas with
# AdamW and clipping.
write_replica_spec "$work/replicas.json" replicas-elastic "$steps" 2

job=$(submit "$work/replicas.json")
wait_step "$job" 15
EPOCH=$(job_field "$job" "s.get('epoch', 0)")
victim=$(kill_replica "$job" replicaStages)
echo "kill -9 $victim of replica 1 at step $(job_field "$job" "s.get('step', 0)")"
wait_replicas "$job" 1
ok "lost a worker of replica 1: the job runs on with 1 replica"

EPOCH=$(job_field "$job" "s.get('epoch', 0)")
start_worker
start_worker
wait_replicas "$job" 2
status=$(ctl status "$job")
grep -q "stages (2 replicas)" <<<"$status" && grep -q "REPLICA" <<<"$status" ||
  fail "status shows no replica grid: $status"
ok "two workers joined: back to 2 replicas, the grid in gpipectl status"

EPOCH=$(job_field "$job" "s.get('epoch', 0)")
start_worker
victim=$(kill_replica "$job" stages)
echo "kill -9 $victim of replica 0 at step $(job_field "$job" "s.get('step', 0)")"
wait_replicas "$job" 2
ok "lost a worker of replica 0 with a spare free: still 2 replicas"

DONE_TIMEOUT=300 wait_done "$job"
restored=$(cat "$work"/w*.log | grep -c "restored step" || true)
resumed=$(cat "$work"/w*.log | grep -c "from replica [0-9]*'s memory\|from its own memory" || true)
((restored == 0)) || fail "$restored checkpoint restores: $(grep -h "restored step" "$work"/w*.log | head -3)"
((resumed >= 6)) || fail "only $resumed stages resumed from memory"
grep -q "from the replicas' memory" "$work/controller.log" ||
  fail "the controller never resumed from memory"
ok "no checkpoint restored; $resumed stage starts resumed from memory"
same_as_reference "$job" "$work/replicas.json" 4
ok "the model is bitwise the reference trainer's"

python3 - "$work/replicas.json" "$work/four.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
d["name"] = "replicas-four"
d["pipeline"].update({"stages": 1, "replicas": 4, "gradientGroups": 4})
json.dump(d, open(sys.argv[2], "w"))
PY
EPOCH=0
job=$(submit "$work/four.json")
wait_step "$job" 15
# Every worker the job does not use goes, so that a loss shrinks it.
busy=" $(job_field "$job" "' '.join(x.get('address','') for x in s.get('stages', []) + s.get('replicaStages', []))") "
for name in "${!worker_port[@]}"; do
  if [[ "$busy" != *" 127.0.0.1:${worker_port[$name]} "* ]]; then
    kill -9 "${worker_pid[$name]}" 2>/dev/null || true
    unset "worker_port[$name]"
  fi
done
EPOCH=$(job_field "$job" "s.get('epoch', 0)")
victim=$(kill_replica "$job" replicaStages)
echo "kill -9 $victim of 4 replicas at step $(job_field "$job" "s.get('step', 0)")"
wait_replicas "$job" 3
ok "lost one of 4 replicas with no spare: the job runs on with 3"
DONE_TIMEOUT=300 wait_done "$job"
same_as_reference "$job" "$work/four.json" 4
ok "3 replicas sharing 4 groups: the model is bitwise the reference trainer's"
echo "$passed passed, 0 failed"
