#!/usr/bin/env bash
# Workers die during a job and the job still ends bitwise where an
# uninterrupted run ends (the single-process reference trainer over the same
# micro-batches), on a real controller and worker processes on loopback:
#   1. kill -9 a random busy worker at random steps, RECOVERY_KILLS times
#      (default 3), starting a fresh worker each time;
#   2. SIGSTOP a worker past its lease; the job recovers on another; SIGCONT
#      it: whatever it still sends belongs to a dead epoch and is rejected;
#   3. corrupt the newest committed checkpoint, then kill the workers (frozen
#      first, so that nothing moves meanwhile): recovery falls back to the
#      checkpoint before.
# Knobs: RECOVERY_KILLS, RECOVERY_STEPS (default 800), KEEP_WORK=1.
#   recovery_workers_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
bin="$1/bin"
src=$2
for b in gpipectl gpipe-controller gpipe-worker; do
  [[ -x "$bin/$b" ]] || { echo "SKIP: $bin/$b is not built"; echo "0 passed, 0 failed"; exit 0; }
done
work=$(mktemp -d)
source "$src/tests/scripts/recovery_lib.sh"
trap cleanup EXIT

kills=${RECOVERY_KILLS:-3}
steps=${RECOVERY_STEPS:-800}
cport=$(free_port)
start_controller
for _ in 1 2 3 4; do start_worker; done
wait_workers 4
# The kills need the longest job: each one waits for the job to run again.
write_spec "$work/kill.json" recovery-kill "$((2 * steps))" 3 0 "$SGD"
# 2x: on shared memory the steps are quick enough that a job of RECOVERY_STEPS
# could end between reaching steps/9 and the SIGSTOP landing.
write_spec "$work/sgd.json" recovery-pause "$((2 * steps))" 3 0 "$SGD"
# Long enough that it is still running when the poll below sees its second
# checkpoint: each poll is a gpipectl and a python3 process, and in CI (two
# tests at a time on two cores) polls took seconds while the job ran at
# ~180 steps/s.
write_spec "$work/short.json" recovery-corrupt "$((2 * steps))" 3 0 "$SGD"

# --- 1. kill -9 busy workers at random moments -----------------------------
job=$(submit "$work/kill.json")
wait_step "$job" 1
survived=0
for i in $(seq "$kills"); do
  sleep "0.$((1 + RANDOM % 5))"
  [[ "$(job_field "$job" "s.get('state','')")" == RUNNING ]] || break
  mapfile -t busy < <(busy_workers "$job")
  ((${#busy[@]} > 0)) || break
  victim=${busy[RANDOM % ${#busy[@]}]}
  kill -9 "${worker_pid[$victim]}"
  at=$(job_field "$job" "s.get('state','') + ' at step ' + str(s.get('step', 0))")
  echo "kill -9 $victim ($at)"
  unset "worker_port[$victim]"
  # Replace the victim even when the kill came too late: the next case pauses
  # one of the job's workers and needs a spare to recover on.
  start_worker
  [[ "$at" == SUCCEEDED* ]] && break
  survived=$((survived + 1))
  # The next kill hits the job once it runs again.
  for _ in $(seq 300); do
    [[ "$(job_field "$job" "s.get('state','') + str(int(s.get('restarts', 0)) >= $survived)")" =~ ^(RUNNING|SUCCEEDED)True$ ]] && break
    sleep 0.1
  done
done
wait_done "$job"
same_as_reference "$job" "$work/kill.json" 4
((survived >= 1)) || fail "no kill landed while job $job was running"
restarts=$(job_field "$job" "s.get('restarts', 0)")
((restarts >= survived)) || fail "job $job counts $restarts restarts for $survived kills"
echo "kill -9: the job survived $survived kills of busy workers ($restarts restarts), bitwise the uninterrupted run"

# --- 2. SIGSTOP past the lease, then SIGCONT --------------------------------
wait_workers 4
job=$(submit "$work/sgd.json")
wait_step "$job" $((steps / 9))
mapfile -t busy < <(running_busy_workers "$job")
((${#busy[@]} > 0)) || fail "job $job has no busy workers at step $((steps / 9))"
paused=${busy[0]}
epoch=$(job_field "$job" "s.get('epoch', 0)")
kill -STOP "${worker_pid[$paused]}"
for _ in $(seq 200); do  # 20 s: the lease (1.5 s) expires, the job moves on
  st=$(job_field "$job" "s.get('state','') + (' new' if int(s.get('epoch',0)) > $epoch else '')")
  [[ "$st" == "RUNNING new" || "$st" == SUCCEEDED* ]] && break
  sleep 0.1
done
[[ "$st" != "SUCCEEDED" ]] || fail "job $job ended before worker $paused was paused; raise RECOVERY_STEPS"
[[ "$(job_field "$job" "int(s.get('epoch',0)) > $epoch")" == True ]] ||
  fail "job $job did not recover from the paused worker $paused"
[[ "$(job_field "$job" "' '.join(x.get('address','') for x in s.get('stages', []))")" != *":${worker_port[$paused]}"* ]] ||
  fail "the paused worker $paused still holds a stage"
kill -CONT "${worker_pid[$paused]}"
wait_done "$job"
same_as_reference "$job" "$work/sgd.json" 4
echo "SIGSTOP: recovered without $paused, which woke at a dead epoch; bitwise the uninterrupted run"

# --- 3. a corrupt newest checkpoint -------------------------------------------
job=$(submit "$work/short.json")
for _ in $(seq 300); do
  n=$(job_field "$job" "len(s.get('checkpoints', []))")
  ((${n:-0} >= 2)) && break
  sleep 0.05
done
((${n:-0} >= 2)) || fail "job $job committed fewer than 2 checkpoints"
# Freeze every worker at once, so that no newer checkpoint commits and no
# restart chooses its restore point before the corruption is in place; only
# then ask whether the job is still running (asking first left a window of
# one slow poll in which the job could end).
stopped=()
for name in "${!worker_port[@]}"; do
  kill -STOP "${worker_pid[$name]}"
  stopped+=("$name")
done
# RESTARTING too: a slow poll may outlast the frozen workers' lease.
[[ "$(job_field "$job" "s.get('state','')")" =~ ^(RUNNING|RESTARTING)$ ]] ||
  fail "job $job ended before its workers were frozen; raise RECOVERY_STEPS"
sleep 0.5
read -r newest manifest < <(job_field "$job" "s['checkpoints'][-1]['step'] + ' ' + s['checkpoints'][-1]['manifestPath']")
stage_file=$(dirname "$manifest")/$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["files"][0]["path"])' "$manifest")
python3 - "$stage_file" <<'PY'
import sys
p = sys.argv[1]
data = bytearray(open(p, "rb").read())
data[len(data) // 2] ^= 0xFF  # one flipped byte in the tensor data
open(p, "wb").write(bytes(data))
PY
before=$(grep -c "unusable, falling back" "$work/controller.log" || true)
for name in "${stopped[@]}"; do
  kill -9 "${worker_pid[$name]}"
  unset "worker_port[$name]"
done
for _ in 1 2 3; do start_worker; done
wait_done "$job"
after=$(grep -c "unusable, falling back" "$work/controller.log" || true)
((after > before)) || fail "the controller did not report the corrupt checkpoint of step $newest"
same_as_reference "$job" "$work/short.json" 4
echo "corrupt checkpoint: step $newest was detected (DataLoss) and the one before used; bitwise the uninterrupted run"
echo "1 passed, 0 failed"
