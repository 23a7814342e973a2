#!/usr/bin/env bash
# A soak on one job: SOAK_KILLS random kill -9s of busy workers (a fresh
# worker started for each) and SOAK_CONTROLLER_KILLS kill -9s of the
# controller (restarted on the same --store), interleaved, against a real
# controller and worker processes on loopback (workers in their own mount
# namespaces with the files through the controller; CHECKPOINT_TRANSPORT as
# in recovery_lib.sh). The job must end SUCCEEDED, bitwise equal to the
# uninterrupted single-process run.
# CI runs it small (6 worker kills, 1 controller kill); the soak the
# reliability issue asks for is
#   SOAK_KILLS=50 SOAK_CONTROLLER_KILLS=3 soak_test.sh BUILD_DIR SOURCE_DIR
# Knobs: SOAK_KILLS, SOAK_CONTROLLER_KILLS, KEEP_WORK=1.
set -euo pipefail
bin="$1/bin"
src=$2
for b in gpipectl gpipe-controller gpipe-worker; do
  [[ -x "$bin/$b" ]] || { echo "SKIP: $bin/$b is not built"; echo "0 passed, 0 failed"; exit 0; }
done
work=$(mktemp -d)
source "$src/tests/scripts/recovery_lib.sh"
trap cleanup EXIT

kills=${SOAK_KILLS:-6}
controller_kills=${SOAK_CONTROLLER_KILLS:-1}
((kills >= 0 && kills <= 1000 && controller_kills >= 0 && controller_kills <= 100)) ||
  fail "SOAK_KILLS must be 0..1000 and SOAK_CONTROLLER_KILLS 0..100"
cport=$(free_port)
start_controller
for _ in 1 2 3 4; do start_worker; done
wait_workers 4
# Long enough to outlast every kill: each costs a restart and a replay of
# at most 10 steps, and on shared memory the job runs several hundred
# steps/s between them.
steps=$((2000 + 1000 * (kills + controller_kills)))
write_spec "$work/soak.json" soak "$steps" 3 0 "$ADAMW"
# Restarts enough for every kill (the default is 10).
python3 - "$work/soak.json" "$((kills + controller_kills + 10))" <<'PY'
import json, sys
spec = json.load(open(sys.argv[1]))
spec["maxRestarts"] = int(sys.argv[2])
json.dump(spec, open(sys.argv[1], "w"))
PY
job=$(submit "$work/soak.json")
wait_step "$job" 1

# The controller kills fall at even intervals among the worker kills.
total=$((kills + controller_kills))
landed=0 landed_controller=0 deadline=$((SECONDS + 60 + 20 * total))
for i in $(seq "$total"); do
  ((SECONDS < deadline)) || fail "the soak ran out of time after $landed kills"
  sleep "0.$((2 + RANDOM % 5))"
  # Wait until the job runs again (it may still be restarting).
  for _ in $(seq 200); do
    st=$(job_field "$job" "s.get('state','')")
    [[ "$st" == RUNNING || "$st" == SUCCEEDED ]] && break
    sleep 0.05
  done
  [[ "$st" == SUCCEEDED ]] && break
  if ((controller_kills > 0 && landed_controller < controller_kills &&
       i * (controller_kills + 1) / (total + 1) > landed_controller)); then
    kill -9 "$controller_pid"
    wait "$controller_pid" 2>/dev/null || true
    start_controller
    landed_controller=$((landed_controller + 1))
    echo "kill -9 controller ($landed_controller of $controller_kills)"
    continue
  fi
  mapfile -t busy < <(busy_workers "$job")
  ((${#busy[@]} > 0)) || continue
  victim=${busy[RANDOM % ${#busy[@]}]}
  kill -9 "${worker_pid[$victim]}"
  unset "worker_port[$victim]"
  start_worker
  landed=$((landed + 1))
done
echo "soak: $landed worker kills and $landed_controller controller kills landed"
DONE_TIMEOUT=$((120 + 10 * total)) wait_done "$job"
same_as_reference "$job" "$work/soak.json" 4
restarts=$(job_field "$job" "s.get('restarts', 0)")
echo "soak ($transport): job $job survived $landed worker kills and $landed_controller controller kills ($restarts restarts counted), bitwise the uninterrupted run"
echo "1 passed, 0 failed"
