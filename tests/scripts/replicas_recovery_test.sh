#!/usr/bin/env bash
# A worker of one replica dies mid-job (kill -9, real processes on loopback,
# stage files through the controller's API): the job restarts all K x R
# workers from replica 0's last checkpoint, every replica restoring the
# same files, and ends bitwise equal to the single-process reference
# trainer. While it runs, `gpipectl status` shows the replica x stage grid.
# Knobs: REPLICA_STEPS (default 3000), KEEP_WORK=1.
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

steps=${REPLICA_STEPS:-3000}
cport=$(free_port)
start_controller
for _ in 1 2 3 4 5; do start_worker; done
wait_workers 5

# recovery_lib's model without its batch norm (replicas refuse one), on
# 2 stages x 2 replicas with AdamW and clipping.
write_spec "$work/replicas.json" replicas-kill "$steps" 2 0 "$ADAMW"
python3 - "$work/replicas.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
d["model"]["layers"] = [l for l in d["model"]["layers"] if "batchNorm" not in l]
d["pipeline"]["replicas"] = 2
json.dump(d, open(sys.argv[1], "w"))
PY

job=$(submit "$work/replicas.json")
wait_step "$job" 15

# A worker of replica 1 (its stages are in replica_stages).
addrs=$(job_field "$job" "' '.join(x.get('address','') for x in s.get('replicaStages', []))")
victim=""
for name in "${!worker_port[@]}"; do
  [[ " $addrs " == *" 127.0.0.1:${worker_port[$name]} "* ]] && victim=$name && break
done
[[ -n "$victim" ]] || fail "no worker of replica 1 found among $addrs"
kill -9 "${worker_pid[$victim]}"
at=$(job_field "$job" "s.get('state','') + ' at step ' + str(s.get('step', 0))")
echo "kill -9 $victim of replica 1 ($at)"
[[ "$at" != SUCCEEDED* ]] || fail "the job ended before the kill: raise REPLICA_STEPS"
unset "worker_port[$victim]"
start_worker

# Running again on K x R workers: the grid.
for _ in $(seq 300); do
  [[ "$(job_field "$job" "str(s.get('restarts', 0)) + s.get('state', '')")" == [1-9]*RUNNING ]] && break
  sleep 0.1
done
status=$(ctl status "$job")
grep -q "stages (2 replicas)" <<<"$status" && grep -q "REPLICA" <<<"$status" ||
  fail "status shows no replica grid: $status"
ok "gpipectl status shows the 2 x 2 grid after the restart"
DONE_TIMEOUT=300 wait_done "$job"
restarts=$(job_field "$job" "s.get('restarts', 0)")
((restarts >= 1)) || fail "the kill did not restart the job"
ok "the job recovered from the kill ($restarts restart(s))"
same_as_reference "$job" "$work/replicas.json" 4
ok "the recovered replicas' model is bitwise the reference trainer's"
echo "$passed passed, 0 failed"
