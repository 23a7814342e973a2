#!/usr/bin/env bash
# The controller and the stage count change under a running job, which still
# ends bitwise where the single-process reference trainer ends:
#   1. kill -9 the controller mid-job and start it again on the same --store:
#      the workers re-attach by themselves and the job completes;
#   2. elastic: a 4-stage job (min_stages 2) loses two workers, runs on two
#      after its grace period, and grows back to four at the next checkpoint
#      once two workers return.
# Knobs: RECOVERY_STEPS (default 600), KEEP_WORK=1.
#   recovery_controller_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
bin="$1/bin"
src=$2
for b in gpipectl gpipe-controller gpipe-worker; do
  [[ -x "$bin/$b" ]] || { echo "SKIP: $bin/$b is not built"; echo "0 passed, 0 failed"; exit 0; }
done
work=$(mktemp -d)
source "$src/tests/scripts/recovery_lib.sh"
trap cleanup EXIT

steps=${RECOVERY_STEPS:-600}
cport=$(free_port)
start_controller
for _ in 1 2 3 4; do start_worker; done
wait_workers 4

# --- 1. kill -9 the controller ------------------------------------------------
write_spec "$work/adamw.json" recovery-controller "$steps" 3 0 "$ADAMW"
job=$(submit "$work/adamw.json")
# Early, so that most of the job is left to run after the restart.
wait_step "$job" $((steps / 5))
kill -9 "$controller_pid"
wait "$controller_pid" 2>/dev/null || true
start_controller
[[ "$(job_field "$job" "s.get('state','')")" =~ ^(RESTARTING|RUNNING)$ ]] ||
  fail "job $job was not resumed from the store: $(job_field "$job" "s.get('state','')")"
wait_done "$job"
same_as_reference "$job" "$work/adamw.json" 4
echo "controller kill -9: job $job resumed from the store and completed; bitwise the uninterrupted run"

# --- 2. shrink from 4 stages to 2 and grow back -------------------------------
wait_workers 4
# Eight times as long: on 2 stages it must outlast the start of two new
# workers (up to 5-7 s on a loaded machine) and reach a checkpoint after
# them; on the shared-memory plane 2 stages run ~250 steps/s, so 3x (what
# it was with frames) ended before the second worker attached.
write_spec "$work/elastic.json" recovery-elastic "$((8 * steps))" 4 2 "$SGD"
job=$(submit "$work/elastic.json")
wait_step "$job" $((steps / 20))
mapfile -t busy < <(running_busy_workers "$job")
((${#busy[@]} == 4)) || fail "job $job runs on ${#busy[@]} workers, want 4"
for victim in "${busy[@]:0:2}"; do
  kill -9 "${worker_pid[$victim]}"
  unset "worker_port[$victim]"
done
shrunk=""
for _ in $(seq 150); do  # the grace period is 1 s
  [[ "$(job_field "$job" "s.get('state','') + str(s.get('runningStages', 0))")" == RUNNING2 ]] && { shrunk=1; break; }
  sleep 0.1
done
[[ -n "$shrunk" ]] || fail "job $job did not shrink to 2 stages"
echo "elastic: job $job runs on 2 of 4 stages"
start_worker
start_worker
grown=""
for _ in $(seq 600); do
  st=$(job_field "$job" "s.get('state','') + str(s.get('runningStages', 0))")
  [[ "$st" == RUNNING4 || "$st" == SUCCEEDED4 ]] && { grown=1; break; }
  [[ "$st" == SUCCEEDED* ]] && break
  sleep 0.1
done
[[ -n "$grown" ]] || fail "job $job did not grow back to 4 stages (last: $st)"
wait_done "$job"
same_as_reference "$job" "$work/elastic.json" 4
echo "elastic: shrank to 2 stages and grew back to 4; bitwise the uninterrupted run"
echo "1 passed, 0 failed"
