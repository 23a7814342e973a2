#!/usr/bin/env bash
# gpipectl fetch against a real controller and workers on loopback (files
# through the controller, workers in their own directories): the final
# model and a committed checkpoint's files arrive byte-identical to the
# controller's; the final parameters are not listed as a checkpoint; a job
# without a model yet, a step not kept and an unknown job are refused with
# what there is; a fetch started while the controller
# is down is retried and succeeds once it is back.
#   fetch_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
bin="$1/bin"
src=$2
for b in gpipectl gpipe-controller gpipe-worker; do
  [[ -x "$bin/$b" ]] || { echo "SKIP: $bin/$b is not built"; echo "0 passed, 0 failed"; exit 0; }
done
work=$(mktemp -d)
source "$src/tests/scripts/recovery_lib.sh"
trap cleanup EXIT

write_spec "$work/job.json" fetched 40 2 2 "$SGD"
# Evaluated every 10 steps: status shows the earlier evaluations too.
python3 - "$work/job.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
s["eval"] = {"every": 10}
json.dump(s, open(sys.argv[1], "w"))
PY
write_spec "$work/long.json" long 1000000 2 2 "$SGD"
cport=$(free_port)
start_controller
start_worker
start_worker
wait_workers 2
long=$(submit "$work/long.json")
wait_step "$long" 12
# RUNNING, or RESTARTING where CI's load let a lease lapse: either way no
# model yet.
refused ": its model is written when it succeeds" ctl fetch "$long" -o "$work/early"
[[ ! -e "$work/early/model.safetensors" ]] || fail "a model appeared before the job succeeded"
ctl cancel "$long" >/dev/null
kept=$(job_field "$long" "s['checkpoints'][-1]['step']")
ctl fetch "$long" --step "$kept" -o "$work/cancelled" >/dev/null
[[ -s "$work/cancelled/MANIFEST.json" ]] || fail "the cancelled job's checkpoint of step $kept did not arrive"
refused "is CANCELLED: its model is written when it succeeds" ctl fetch "$long" -o "$work/early"
ok "a running or cancelled job has no model; its newest checkpoint (step $kept) was fetched"
job=$(submit "$work/job.json")
wait_done "$job"

ctl fetch "$job" -o "$work/got" >"$work/fetch.txt"
cmp "$work/got/model.safetensors" "$work/ckpt/$job/model.safetensors" ||
  fail "the fetched model differs from the controller's"
grep -q "model.safetensors" "$work/fetch.txt" || fail "fetch did not say what it wrote: $(cat "$work/fetch.txt")"
ls "$work/got" | grep -q '\.part$' && fail "a .part file was left"
ok "the final model, byte-identical ($(cut -c1-120 "$work/fetch.txt"))"
# A model damaged on the controller's disk is refused against the digest
# written with it, not delivered (it arrived with a new sha256 and rc 0).
cp "$work/ckpt/$job/model.safetensors" "$work/model.good"
truncate -s 5000 "$work/ckpt/$job/model.safetensors"
refused "no longer matches the sha256 recorded when it was written" ctl fetch "$job" -o "$work/damaged"
[[ ! -e "$work/damaged/model.safetensors" ]] || fail "a damaged model was delivered"
cp "$work/model.good" "$work/ckpt/$job/model.safetensors"
ok "a model damaged on the controller's disk is refused"

# The final parameters are the model, not a checkpoint: the last kept is
# step 30 of 40, and step 40 is refused naming what is kept.
kept_steps=$(job_field "$job" "' '.join(c['step'] for c in s['checkpoints'])")
[[ "$kept_steps" == "10 20 30" ]] || fail "kept checkpoints: $kept_steps, not 10 20 30"
# status shows the simulator's step from the stages' layer times beside
# the measured one.
ctl status "$job" >"$work/status.txt"
grep -Eq '^step time: +[0-9.]+ ms \(last step\), [0-9.]+ ms predicted from the stages. layer times' "$work/status.txt" ||
  fail "status has no predicted step: $(cat "$work/status.txt")"
grep -Eq '^earlier: +step 10: [0-9.]+, [0-9.]+%, step 20: .*, step 30: .* \(test loss, accuracy\)$' "$work/status.txt" ||
  fail "status does not show the periodic evaluations: $(cat "$work/status.txt")"
refused "has no checkpoint of step 40; it keeps the checkpoints of steps 10, 20, 30" ctl fetch "$job" --step 40 -o "$work/none"
# --step 0 is no checkpoint (it fetched the final model, read as no --step).
refused "--step: must be a step a committed checkpoint follows, >= 1" ctl fetch "$job" --step 0 -o "$work/none"
[[ ! -e $work/none ]] || fail "a refused fetch wrote $work/none"
kept=$(job_field "$job" "s['checkpoints'][-1]['step']")
kept_dir=$(dirname "$(job_field "$job" "s['checkpoints'][-1]['manifestPath']")")
ctl fetch "$job" --step "$kept" -o "$work/step" >/dev/null
n=0
for f in "$kept_dir"/*; do
  [[ -f "$f" ]] || fail "no files in $kept_dir"
  cmp "$f" "$work/step/$(basename "$f")" || fail "$(basename "$f") of step $kept differs"
  n=$((n + 1))
done
((n >= 3)) || fail "step $kept had only $n files"
ok "the checkpoint of step $kept: $n files (manifest and stages), byte-identical"
# A checkpoint folder holds its job's spec (JOB.json, beside the manifest):
# it evaluates on its own as with the job's spec given. One without it (an
# earlier gpipe's) is refused without the spec, naming what to give.
"$bin/gpipectl" eval "$work/step" "$work/job.json" --json >"$work/ckeval.json" 2>&1 ||
  fail "eval of the checkpoint of step $kept: $(cat "$work/ckeval.json")"
grep -q '"loss"' "$work/ckeval.json" || fail "eval of a checkpoint printed no loss: $(cat "$work/ckeval.json")"
"$bin/gpipectl" eval "$work/step" --json >"$work/ckeval_alone.json" 2>&1 ||
  fail "eval of the checkpoint of step $kept without the job's spec: $(cat "$work/ckeval_alone.json")"
cmp -s "$work/ckeval.json" "$work/ckeval_alone.json" ||
  fail "the checkpoint evaluated differently on its own: $(cat "$work/ckeval_alone.json") against $(cat "$work/ckeval.json")"
cp -r "$work/step" "$work/older"
[[ -f "$work/older/JOB.json" ]] || fail "the checkpoint came without its job's spec (JOB.json)"
rm "$work/older/JOB.json"
refused "a checkpoint without its job's spec beside it (JOB.json: one an earlier gpipe wrote): eval takes it with the job's spec" \
  "$bin/gpipectl" eval "$work/older"
ok "eval of a checkpoint folder on its own, and with the job's spec"

refused "has no checkpoint of step 7; it keeps the checkpoints of steps" ctl fetch "$job" --step 7 -o "$work/none"
refused "job-nope" ctl fetch job-nope -o "$work/none"
[[ ! -e "$work/none" ]] || fail "a refused fetch made its folder"
# Our own side's failure is named, not "interrupted".
touch "$work/afile"
refused "afile: is not a directory" ctl fetch "$job" -o "$work/afile"
refused "cannot create $work/afile/sub" ctl fetch "$job" -o "$work/afile/sub"
ok "a step not kept, an unknown job and a destination that is a file are refused, naming what there is"

# Down, then back: the fetch retries (1 s, then 2 s later).
kill "$controller_pid"
wait "$controller_pid" 2>/dev/null || true
# Down for good: the retries give up within --timeout (they took 23 s).
began=$SECONDS
refused "cannot reach the controller" ctl fetch "$job" --timeout 2s -o "$work/down"
((SECONDS - began <= 6)) || fail "a fetch with --timeout 2s gave up after $((SECONDS - began)) s"
ok "a fetch with the controller down gives up within its --timeout"
ctl fetch "$job" -o "$work/retried" >"$work/retry.txt" 2>&1 &
fetcher=$!
sleep 0.3
start_controller
wait "$fetcher" || fail "the fetch did not survive the controller's restart: $(cat "$work/retry.txt")"
cmp "$work/retried/model.safetensors" "$work/ckpt/$job/model.safetensors" ||
  fail "the retried fetch differs"
ok "a fetch while the controller was down was retried and completed"

# A watch outlives the controller's graceful restart: its stream ends
# CANCELLED by the server's shutdown, which is no Ctrl-C (it said "stopped
# watching" and exited).
long2=$(submit "$work/long.json")
wait_step "$long2" 3
ctl watch "$long2" >"$work/watch.txt" 2>&1 &
watcher=$!
sleep 0.5
kill "$controller_pid"
wait "$controller_pid" 2>/dev/null || true
start_controller
before=$(job_field "$long2" "s.get('step', 0)")
wait_step "$long2" $((before + 12))
ctl cancel "$long2" >/dev/null
set +e
wait "$watcher"
rc=$?
set -e
((rc == 1)) || fail "watch of a cancelled job exited $rc: $(tail -3 "$work/watch.txt")"
grep -q "stopped watching" "$work/watch.txt" && fail "the watch gave up at the restart: $(tail -3 "$work/watch.txt")"
grep -q "CANCELLED" "$work/watch.txt" || fail "the watch did not follow the job to its end: $(tail -3 "$work/watch.txt")"
# And it says so: the restarted controller resumes from a checkpoint, so
# the step a watch shows may go back.
grep -q "the watch of $long2 resumed after .* without the controller" "$work/watch.txt" ||
  fail "the watch did not say it lost the controller: $(tail -5 "$work/watch.txt")"
ok "a watch followed its job across the controller's graceful restart"

# A watch that comes back after the job has restarted and evaluated without
# it says so and shows the evaluations it missed (their events went with
# the old controller). The watch is frozen across the restart so that it
# comes back late for certain.
python3 - "$work/long.json" "$work/evals.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
d["eval"] = {"every": 20, "maxSamples": 64}
json.dump(d, open(sys.argv[2], "w"))
PY
long4=$(submit "$work/evals.json")
wait_step "$long4" 25
# gpipectl itself, not a subshell around it, is what SIGSTOP must freeze.
"$bin/gpipectl" --controller "127.0.0.1:$cport" watch "$long4" >"$work/away.txt" 2>&1 &
watcher=$!
for _ in $(seq 100); do grep -q "^step 20: " "$work/away.txt" && break; sleep 0.1; done
kill -STOP "$watcher"
kill "$controller_pid"
wait "$controller_pid" 2>/dev/null || true
start_controller
# Running again in its next epoch, and three evaluations past the step
# it restored.
first=""
for _ in $(seq 300); do
  now=$(job_field "$long4" "s.get('state', '') + ' ' + str(s.get('epoch', 0)) + ' ' + str(s.get('latestEvaluation', {}).get('step', 0))" 2>/dev/null || true)
  read -r state epoch evaluated <<<"$now"
  if [[ "$state" == RUNNING ]] && ((epoch >= 2)); then
    first=${first:-$evaluated}
    ((evaluated >= first + 60)) && break
  fi
  sleep 0.1
done
kill -CONT "$watcher"
for _ in $(seq 100); do grep -q "restarted while the watch was away" "$work/away.txt" && break; sleep 0.1; done
ctl cancel "$long4" >/dev/null
wait "$watcher" || true
restored=$(sed -n "s/^$long4 RUNNING: restarted while the watch was away (epoch [2-9]): restored the checkpoint of step \([0-9]*\)\$/\1/p" "$work/away.txt")
[[ -n "$restored" ]] ||
  fail "the watch did not say the job restarted while it was away: $(tr '\r' '\n' <"$work/away.txt" | grep -v '^ *$' | tail -8)"
# The evaluations of the new epoch it missed, from the one the loop above
# first saw to the one it waited for.
for e in $first $((first + 20)) $((first + 40)) $((first + 60)); do
  grep -q "^step $e: " "$work/away.txt" ||
    fail "the watch did not show the evaluation of step $e it missed: $(tr '\r' '\n' <"$work/away.txt" | grep -v '^ *$' | grep -v committed | tail -8)"
done
ok "a watch back after the job restarted without it says so and shows the evaluations it missed"

# A frozen controller closes nothing: the watch's pings find it (every
# 10 s, 10 s to answer), then it gives up after 30 s without it (it hung
# for good, pinging every 5.5 minutes).
long3=$(submit "$work/long.json")
ctl watch "$long3" >"$work/frozen.txt" 2>&1 &
watcher=$!
sleep 1
kill -STOP "$controller_pid"
# New calls to the frozen controller: no first answer within --timeout is
# the answer (the pings alone took 20 s, whatever --timeout said).
for call in "fetch $job -o $work/frozen-fetch" "watch $job"; do
  began=$SECONDS
  # shellcheck disable=SC2086  # the call's words
  refused "did not answer within 2s" ctl $call --timeout 2s
  ((SECONDS - began <= 6)) || fail "$call with --timeout 2s on a frozen controller took $((SECONDS - began)) s"
done
[[ ! -e "$work/frozen-fetch" ]] || fail "a fetch that had no answer made its folder"
ok "fetch and watch of a frozen controller give up after their --timeout"
for _ in $(seq 1 900); do
  kill -0 "$watcher" 2>/dev/null || break
  sleep 0.1
done
kill -CONT "$controller_pid"
if kill -0 "$watcher" 2>/dev/null; then
  kill "$watcher"
  fail "the watch still waits on a controller frozen for 90 s"
fi
grep -q "lost the controller" "$work/frozen.txt" || fail "the watch of a frozen controller: $(tail -3 "$work/frozen.txt")"
ctl cancel "$long3" >/dev/null
ok "a watch of a frozen controller gives up"

echo "$passed passed, 0 failed"
