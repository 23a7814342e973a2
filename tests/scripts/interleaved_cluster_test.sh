#!/usr/bin/env bash
# The schedules with chunks on worker processes (real controller and
# workers, gRPC and shared memory on loopback): K workers each run v chunks
# of the model on one thread. Interleaved 1F1B places stage i on worker
# i % K (Megatron's order); ZB-V places worker w's two chunks at stages w
# and 2K-1-w, so worker K-1 links to itself (stage K-1 to K).
#   1. gpipectl local, K=2 and 3 x v=2 (deep MLP) and K=2 x v=2 (char
#      Transformer, AdamW with clipping), each schedule: bitwise the
#      single-process reference trainer and `gpipectl train` with the same
#      schedule; the trace has a track per chunk, each with every
#      micro-batch; the events name the chunks' workers;
#   2. for each schedule, a controller with a spare worker: kill -9 a busy
#      worker after a checkpoint; the job restarts on the spare from the
#      checkpoint (every chunk restored by its layers) and ends bitwise the
#      reference;
#   3. for each schedule, no spare: with min_stages 1 the job goes on with
#      one worker running every stage (K' = 1 x v = 2 chunks) after the
#      grace period, grows back to two workers at a checkpoint once a new
#      one attaches, and ends bitwise the reference.
#   interleaved_cluster_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
bin="$1/bin"
src=$2
for b in gpipectl gpipe-controller gpipe-worker; do
  [[ -x "$bin/$b" ]] || { echo "SKIP: $bin/$b is not built"; echo "0 passed, 0 failed"; exit 0; }
done
work=$(mktemp -d)
source "$src/tests/scripts/recovery_lib.sh"
trap cleanup EXIT
steps=${GPIPE_INTERLEAVED_STEPS:-6}
passed=0
same() { python3 "$src/tests/scripts/same_tensors.py" "$1" "$2" || fail "$3"; }
# interleaved_spec FILE NAME MIN_STAGES SCHEDULE [STEPS]: write_spec's model,
# 2000 steps, on 2 workers of 2 chunks.
interleaved_spec() {
  write_spec "$1" "$2" "${5:-2000}" 2 "$3" "$SGD"
  python3 - "$1" "$4" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
d["pipeline"].update(schedule=sys.argv[2], virtualStages=2)
json.dump(d, open(sys.argv[1], "w"))
PY
}

# --- 1. gpipectl local --------------------------------------------------------
for config in "fashion_mnist_deep_mlp 2 2 4 interleaved" \
  "fashion_mnist_deep_mlp 3 2 6 interleaved" "char_transformer 2 2 4 interleaved" \
  "fashion_mnist_deep_mlp 2 2 4 zb-v" "fashion_mnist_deep_mlp 3 2 5 zb-v" \
  "char_transformer 2 2 4 zb-v"; do
  read -r example k v m schedule <<<"$config"
  spec="$src/examples/$example.json"
  name="$example-k$k-v$v-$schedule"
  split=()
  [[ $schedule == zb-v ]] && split=(--split-backward)
  # The spec's remat mode says which stages the trace shows recomputing.
  remat=$(python3 -c 'import json, sys
print(json.load(open(sys.argv[1]))["pipeline"].get("remat", "EXCEPT_LAST").lower())' "$spec")
  common=(--micro-batches "$m" --steps "$steps")
  "$bin/gpipectl" train "$spec" --stages 1 --schedule gpipe "${common[@]}" \
    --threads 1 --out "$work/$name-reference" >"$work/log" 2>&1 ||
    { cat "$work/log"; fail "$name: reference"; }
  "$bin/gpipectl" train "$spec" --stages "$k" --schedule "$schedule" \
    --virtual-stages "$v" "${common[@]}" --threads 1 \
    --out "$work/$name-inprocess" >"$work/log" 2>&1 ||
    { cat "$work/log"; fail "$name: gpipectl train --schedule $schedule"; }
  "$bin/gpipectl" local "$spec" --stages "$k" --schedule "$schedule" \
    --virtual-stages "$v" "${common[@]}" --threads 2 --out "$work/$name-cluster" \
    --trace "$work/$name-trace" >"$work/log" 2>&1 ||
    { tail -30 "$work/log"; fail "$name: local cluster"; }
  same "$work/$name-cluster/model.safetensors" "$work/$name-reference/model.safetensors" \
    "$name: the cluster differs from the reference trainer"
  same "$work/$name-cluster/model.safetensors" "$work/$name-inprocess/model.safetensors" \
    "$name: the cluster differs from gpipectl train --schedule $schedule"
  # Interleaved: stage i on worker i % K. ZB-V: stages w and 2K-1-w on
  # worker w.
  python3 - "$work/log" "$k" "$v" "$schedule" <<'PY' || fail "$name: the events do not place the stages as $schedule does, or the progress shows other than K workers"
import re, sys
text = open(sys.argv[1]).read()
k, v = int(sys.argv[2]), int(sys.argv[3])
worker = (lambda s: s % k) if sys.argv[4] == "interleaved" else \
    (lambda s: s if s < k else 2 * k - 1 - s)
line = next(l for l in text.splitlines() if "RUNNING: " in l and " chunks, epoch 1" in l)
# The spec's stages, each of v chunks: not K x v stages.
assert f"RUNNING: {k} stages x {v} chunks, epoch 1" in line, line
on = dict((int(s), w) for s, w in re.findall(r"stage (\d+) \(layers [0-9.]+\) on (\S+?)[,\s]", line + " "))
assert len(on) == k * v, (line, on)
for s in range(k * v):
    assert on[s] == on[worker(s)], (s, on)
assert len(set(on.values())) == k, on
# The progress shows each worker's utilization (its chunks together).
util = [l for l in text.splitlines() if " util " in l][-1]
shares = re.search(r" util ((?:\d+% ?)+) bubble", util).group(1).split()
assert len(shares) == k, util
PY
  python3 "$src/tests/scripts/check_trace.py" "$work/$name-trace/trace.json" \
    "$work/$name-trace/timeline.svg" --stages "$((k * v))" --micro-batches "$m" \
    --remat "$remat" ${split[@]+"${split[@]}"} ||
    fail "$name: the trace does not show every chunk"
  echo "ok: $name on $k workers, bitwise the reference trainer and gpipectl train"
  passed=$((passed + 1))
done

# --- 2. a worker killed mid-job ----------------------------------------------
kill_case() {
  interleaved_spec "$work/kill-$1.json" "kill-$1" 0 "$1"
  job=$(submit "$work/kill-$1.json")
  for _ in $(seq 300); do
    [[ "$(job_field "$job" "len(s.get('checkpoints', [])) >= 1 or s.get('state') != 'RUNNING'")" == True ]] && break
    sleep 0.1
  done
  [[ "$(job_field "$job" "s.get('state','')")" == RUNNING ]] ||
    fail "job $job ended before its first checkpoint: $(job_field "$job" "s.get('state','')")"
  mapfile -t busy < <(running_busy_workers "$job")
  ((${#busy[@]} == 2)) || fail "job $job runs on ${#busy[@]} workers, not 2: ${busy[*]}"
  victim=${busy[RANDOM % 2]}
  at=$(job_field "$job" "str(s.get('step', 0))")
  kill -9 "${worker_pid[$victim]}"
  unset "worker_port[$victim]"
  echo "kill -9 $victim at step $at"
  wait_done "$job"
  restarts=$(job_field "$job" "s.get('restarts', 0)")
  ((restarts >= 1)) || fail "job $job counts no restart after the kill"
  same_as_reference "$job" "$work/kill-$1.json" 4
  # Its status counts the spec's stages and their chunks.
  ctl status "$job" >"$work/status.txt"
  grep -q "K=2 stages of 2 chunks each" "$work/status.txt" ||
    fail "job $job's status: $(cat "$work/status.txt")"
  echo "ok: $1, a worker of 2 x 2 chunks killed at step $at: restored on the spare, bitwise the reference"
  passed=$((passed + 1))
}

# --- 3. no spare: the job shrinks to one worker of two chunks and grows back -
# (two idle workers; min_stages 1, a grace period of 1 s)
shrink_case() {
  # Long enough that one worker does not finish it before a second attaches
  # (its two chunks talk in process: about 1 ms a step).
  interleaved_spec "$work/shrink-$1.json" "shrink-$1" 1 "$1" 6000
  job=$(submit "$work/shrink-$1.json")
  wait_step "$job" 30
  mapfile -t busy < <(running_busy_workers "$job")
  ((${#busy[@]} == 2)) || fail "job $job runs on ${#busy[@]} workers, not 2: ${busy[*]}"
  victim=${busy[0]}
  kill -9 "${worker_pid[$victim]}"
  unset "worker_port[$victim]"
  for _ in $(seq 300); do
    [[ "$(job_field "$job" "s.get('state') + str(len(s.get('stages', [])))")" =~ ^(RUNNING2|SUCCEEDED) ]] && break
    sleep 0.1
  done
  [[ "$(job_field "$job" "s.get('state') + str(len(s.get('stages', [])))")" == RUNNING2 ]] ||
    fail "job $job did not go on with one worker of two chunks: $(job_field "$job" "s.get('state')")"
  echo "kill -9 $victim: the job runs on one worker, two chunks"
  start_worker
  for _ in $(seq 300); do
    [[ "$(job_field "$job" "s.get('state') + str(len(s.get('stages', [])))")" =~ ^(RUNNING4|SUCCEEDED) ]] && break
    sleep 0.1
  done
  [[ "$(job_field "$job" "s.get('state') + str(len(s.get('stages', [])))")" =~ ^(RUNNING4|SUCCEEDED) ]] ||
    fail "job $job did not grow back to two workers"
  wait_done "$job"
  same_as_reference "$job" "$work/shrink-$1.json" 4
  [[ $(grep -c "growing back from 1 to 2 workers of 2 chunks" "$work/controller.log") -ge "$2" ]] ||
    { grep -E "shrink|grow|RUNNING|SUCCEEDED" "$work/controller.log" | tail -20; fail "$1: the controller did not say it grew back"; }
  echo "ok: $1, shrunk to 1 worker x 2 chunks and grown back to 2 x 2: bitwise the reference"
  passed=$((passed + 1))
}

# A spare makes 3 workers; the kill leaves 2 for the shrink, which ends
# with 2 again (one killed, one started).
cport=$(free_port)
start_controller
for _ in 1 2 3; do start_worker; done
wait_workers 3
kill_case INTERLEAVED_1F1B
shrink_case INTERLEAVED_1F1B 1
start_worker
wait_workers 3
kill_case ZERO_BUBBLE_V
shrink_case ZERO_BUBBLE_V 2
echo "$passed passed, 0 failed"
