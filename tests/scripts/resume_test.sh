#!/usr/bin/env bash
# gpipectl resume against a real controller and workers on loopback:
#  - a job cancelled mid-way, resumed, ends bitwise equal to the
#    single-process reference run of the same job;
#  - a job that FAILED (max_restarts 0 and a killed worker) resumes on a
#    new worker with a fresh restart budget and ends bitwise equal too;
#  - a job resumed with more steps runs them; a running or succeeded job,
#    or steps not past the newest checkpoint, are refused.
#   resume_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
bin="$1/bin"
src=$2
for b in gpipectl gpipe-controller gpipe-worker; do
  [[ -x "$bin/$b" ]] || { echo "SKIP: $bin/$b is not built"; echo "0 passed, 0 failed"; exit 0; }
done
work=$(mktemp -d)
source "$src/tests/scripts/recovery_lib.sh"
trap cleanup EXIT
state() { job_field "$1" "s.get('state','')"; }

cport=$(free_port)
start_controller
start_worker
start_worker
wait_workers 2

# 1. Cancelled at a step past a checkpoint, resumed.
write_spec "$work/job.json" resumed 3000 2 2 "$ADAMW"
job=$(submit "$work/job.json")
wait_step "$job" 45
# A live job is refused; it may be RESTARTING rather than RUNNING when the
# self-balancing pipeline re-cuts it on a loaded machine.
refused "only a cancelled or failed job resumes" ctl resume "$job"
ctl cancel "$job" >/dev/null
from=$(job_field "$job" "s['checkpoints'][-1]['step']")
refused "is not past the newest checkpoint" ctl resume "$job" --steps "$from"
refused "--steps: '0' is not a number of training steps" ctl resume "$job" --steps 0
cancelled_at=$SECONDS
sleep 2  # the time it sits cancelled is no part of its run
out=$(ctl resume "$job")
[[ "$out" == *"resumed"*"from the checkpoint of step $from"* ]] || fail "resume said: $out"
wait_done "$job"
same_as_reference "$job" "$work/job.json" 4
# Its run is the resumed one: it starts at the resume, from that step (it
# counted the steps before it and the time it sat cancelled).
[[ "$(job_field "$job" "s.get('runFromStep')")" == "$from" ]] || fail "runFromStep is not $from"
run=$(job_field "$job" "(__import__('datetime').datetime.fromisoformat(s['finished'].replace('Z', '+00:00')) - __import__('datetime').datetime.fromisoformat(s['started'].replace('Z', '+00:00'))).total_seconds()")
since_cancel=$((SECONDS - cancelled_at))
python3 -c "import sys; sys.exit(0 if float('$run') <= $since_cancel - 1 else 1)" ||
  fail "the resumed run took ${run}s of the ${since_cancel}s since the cancel: it counted the time it sat cancelled"

ok "cancelled mid-way, resumed from step $from: bitwise the reference ($out)"
refused "is SUCCEEDED: only a cancelled or failed job resumes" ctl resume "$job"

# 2. Failed (no restarts allowed, a worker killed), resumed on a new worker.
python3 - "$work/job.json" "$work/fragile.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
s["name"] = "fragile"
s["maxRestarts"] = 0
json.dump(s, open(sys.argv[2], "w"))
PY
fragile=$(submit "$work/fragile.json")
wait_step "$fragile" 45
# Under load the status may not list the stages' addresses yet: ask again.
victim=""
for _ in $(seq 100); do
  # sed, not head: head's early exit would SIGPIPE the listing, and under
  # pipefail the assignment would end the test without a word.
  victim=$(busy_workers "$fragile" | sed -n 1p)
  [[ -n "$victim" ]] && break
  sleep 0.1
done
[[ -n "$victim" ]] || fail "no worker runs the fragile job: $(ctl status "$fragile" 2>&1 | head -n 8)"
kill -9 "${worker_pid[$victim]}"
for _ in $(seq 100); do
  [[ "$(state "$fragile")" == FAILED ]] && break
  sleep 0.1
done
[[ "$(state "$fragile")" == FAILED ]] || fail "the fragile job is $(state "$fragile") after its worker died"
start_worker
wait_workers 2
ctl resume "$fragile" >/dev/null
wait_done "$fragile"
restarts=$(job_field "$fragile" "s.get('restarts', 0)")
((restarts == 0)) || fail "the resumed job counts $restarts restarts"
same_as_reference "$fragile" "$work/fragile.json" 4
ok "failed when its worker died (max_restarts 0), resumed on a new worker: bitwise the reference"

# 3. More steps.
write_spec "$work/short.json" longer 3000 2 2 "$SGD"
short=$(submit "$work/short.json")
wait_step "$short" 25
ctl cancel "$short" >/dev/null
ctl resume "$short" --steps 3200 >/dev/null
wait_done "$short"
steps=$(job_field "$short" "s.get('step', 0)")
((steps == 3200)) || fail "the longer job ended at step $steps"
ok "a cancelled 3000-step job resumed with --steps 3200 ran to step 3200"

# 4. No checkpoint: it starts again, and says so.
python3 - "$work/job.json" "$work/bare.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
s["name"] = "bare"
s["checkpoint"] = {"every": 0}
json.dump(s, open(sys.argv[2], "w"))
PY
bare=$(submit "$work/bare.json")
wait_step "$bare" 25
ctl cancel "$bare" >/dev/null
out=$(ctl resume "$bare")
[[ "$out" == *"resumed"*"from the beginning"* ]] || fail "resume without a checkpoint said: $out"
ctl cancel "$bare" >/dev/null || true
ok "a job without a checkpoint resumed from the beginning and said so ($(head -n 1 <<<"$out"))"
echo "$passed passed, 0 failed"
