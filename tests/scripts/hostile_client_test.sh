#!/usr/bin/env bash
# The hostile-client suite: one real controller and two real workers on
# loopback, and a client that means harm or makes every mistake (#14). Each
# check says what was tried and what the cluster did; at the end both
# workers and the controller are the same processes, alive, and every job
# that should have run did.
#  1. forged hellos under each live worker's id: refused (ALREADY_EXISTS);
#  2. bytes that are no request: INVALID_ARGUMENT naming the method;
#  3. API limits: a name with a newline, 2^62 steps, a negative grace, a
#     spec of 200,000 layers: refused naming the field; the controller's
#     memory stays put;
#  4. a job too large for any worker: refused with the figures;
#  5. poison data (a text with bytes its given vocabulary of 10 lacks, which
#     only the workers read): the job fails
#     as InvalidData without a restart; the workers live;
#  6. a worker that takes a stage and then only sends heartbeats: the job
#     restarts elsewhere (StageStalled) and the staller gets nothing more;
#  7. a full checkpoint disk (as root: the controller's checkpoint directory
#     on a 512 KiB tmpfs): the job waits (CheckpointStoreFull) without
#     spending restarts;
#  8. cancelling a ~280 MB job gives the worker's memory back.
#   hostile_client_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
bin="$1/bin"
src=$2
for b in gpipectl gpipe-controller gpipe-worker hostile_client; do
  [[ -x "$bin/$b" ]] || { echo "SKIP: $bin/$b is not built"; echo "0 passed, 0 failed"; exit 0; }
done
work=$(mktemp -d)
source "$src/tests/scripts/recovery_lib.sh"
trap cleanup EXIT
hostile() { "$bin/hostile_client" "$@"; }
# json FILE PYTHON: writes a spec made by editing the small spec in Python
# (`s` is the dict).
json() {
  python3 - "$work/small.json" "$1" "$2" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
exec(sys.argv[3])
json.dump(s, open(sys.argv[2], "w"))
PY
}

write_spec "$work/small.json" small 40 1 1 "$SGD"
write_spec "$work/long.json" long 1000000 2 2 "$SGD"

cport=$(free_port)
tmpfs=""
if [[ $(id -u) == 0 ]] && unshare --mount true 2>/dev/null; then
  # The controller alone sees its checkpoint directory as a small tmpfs.
  mkdir -p "$work/ckpt"
  unshare --mount --propagation private sh -c \
    'mount -t tmpfs -o size=512k gpipe-small "$0" && exec "$@"' \
    "$work/ckpt" "$bin/gpipe-controller" --listen "127.0.0.1:$cport" \
    --checkpoint_dir "$work/ckpt" --store "$work/jobs.db" --metrics_listen "" \
    --heartbeat_timeout_ms 1500 --heartbeat_interval_ms 100 \
    >>"$work/controller.log" 2>&1 &
  controller_pid=$!
  pids+=("$controller_pid")
  for _ in $(seq 100); do ctl list >/dev/null 2>&1 && break; sleep 0.1; done
  tmpfs=yes
else
  start_controller
fi
# 2 GiB each, whatever this machine has, so "too large" is the same
# everywhere.
worker_args=(--memory_limit 2GiB)
start_worker
start_worker
wait_workers 2
w0=${worker_pid[w0]}
w1=${worker_pid[w1]}
# Sorted: a worker that reattached (on a loaded machine a heartbeat can
# miss the controller's 1.5 s timeout) is listed after the others, and is
# still the same worker.
ids=$(ctl workers --json | python3 -c 'import json,sys; print(" ".join(sorted(w["workerId"] for w in json.load(sys.stdin)["workers"])))')

# 1. Forged hellos.
for id in $ids; do
  out=$(hostile forge-hello "127.0.0.1:$cport" "$id") || fail "a forged hello under $id was taken: $out"
  [[ "$out" == ALREADY_EXISTS* ]] || fail "forged hello: $out"
done
now=$(ctl workers --json | python3 -c 'import json,sys; print(" ".join(sorted(w["workerId"] for w in json.load(sys.stdin)["workers"])))')
[[ "$now" == "$ids" ]] || fail "the workers changed after forged hellos: '$ids' -> '$now'"
ok "forged hellos refused: $out"

# 2. Bytes that are no request.
for method in SubmitJob CancelJob GetJob; do
  out=$(hostile raw "127.0.0.1:$cport" "/gpipe.v1.Controller/$method" $'\xff\xff\xff\xff\x0f not a protobuf') ||
    fail "unparsable $method: $out"
  [[ "$out" == *"$method"* ]] || fail "the refusal does not name $method: $out"
done
ok "unparsable requests: $out"

# 3. API limits.
before=$(rss_mb "$controller_pid" 2>/dev/null || echo 0)
json "$work/newline.json" 's["name"] = "evil\n\x1b[31mname"'
refused "name" ctl submit "$work/newline.json"
json "$work/steps.json" 's["steps"] = 2**62'
refused "steps" ctl submit "$work/steps.json"
json "$work/grace.json" 's["pipeline"]["elasticGraceMs"] = -5'
refused "elastic_grace_ms" ctl submit "$work/grace.json"
json "$work/layers.json" 's["model"]["layers"] = s["model"]["layers"][:-1] + [{"relu": {}}] * 200000 + s["model"]["layers"][-1:]'
refused "too" ctl submit "$work/layers.json"
after=$(rss_mb "$controller_pid" 2>/dev/null || echo 0)
((after < before + 100)) || fail "the controller grew from $before to $after MB on refused specs"
ok "API limits (controller $before -> $after MB)"

# 4. Too large for any worker.
json "$work/huge.json" 's["optimizer"] = {"lr": 0.001, "adamw": {}}; s["model"]["layers"] = [{"linear": {"inFeatures": 8, "outFeatures": 100000}}, {"relu": {}}, {"linear": {"inFeatures": 100000, "outFeatures": 3000}}, {"linear": {"inFeatures": 3000, "outFeatures": 3}}]'
refused "the largest worker has" ctl submit "$work/huge.json"
ok "a job too large for every worker was refused with the figures"

# 5. Poison data.
python3 -c 'import string; open("'"$work"'/text.txt", "w").write((string.ascii_letters * 40 + "\n") * 20)'
cat >"$work/poison.json" <<JSON
{
  "name": "poison",
  "model": {
    "input": {"dtype": "INT32", "shape": {"dims": [16]}},
    "layers": [
      {"embedding": {"vocabSize": 10, "dim": 16, "maxPositions": 16}},
      {"linear": {"inFeatures": 16, "outFeatures": 10}}
    ],
    "loss": {"softmaxCrossEntropy": {}}
  },
  "optimizer": {"lr": 0.01, "sgd": {}},
  "data": {"text": {"path": "$work/text.txt", "seqLen": 16, "vocabulary": "YWJjZGVmZ2hpag=="}},
  "batchSize": 8, "steps": 10, "seed": 1
}
JSON
job=$(submit "$work/poison.json")
state=""
for _ in $(seq 100); do
  state=$(job_field "$job" "s.get('state','')")
  [[ "$state" == FAILED || "$state" == SUCCEEDED ]] && break
  sleep 0.1
done
[[ "$state" == FAILED ]] || fail "the poison job is $state"
why=$(job_field "$job" "' '.join(c.get('reason','') + ': ' + c.get('message','') for c in s.get('conditions', []) if c.get('type') == 'Failed')")
restarts=$(job_field "$job" "s.get('restarts', 0)")
[[ "$why" == InvalidData* ]] || fail "the poison job failed for '$why'"
((restarts == 0)) || fail "the poison job spent $restarts restarts"
kill -0 "$w0" && kill -0 "$w1" || fail "a worker died of the poison job"
ok "poison data: ${why:0:160}"

# 6. A stalling worker.
long=$(submit "$work/long.json")
wait_step "$long" 1
hostile stall "127.0.0.1:$cport" 20 >"$work/stall.txt" 2>&1 &
staller=$!
pids+=("$staller")
wait_workers 3
json "$work/stall.json" 's["name"] = "stalled"; s["pipeline"]["stallTimeoutMs"] = 1500'
stalled=$(submit "$work/stall.json")
for _ in $(seq 100); do
  grep -q "assigned" "$work/stall.txt" && break
  sleep 0.1
done
grep -q "assigned stage 0 of $stalled" "$work/stall.txt" || fail "the staller was not given the job: $(cat "$work/stall.txt")"
for _ in $(seq 100); do
  grep -q "cancelled: $stalled" "$work/stall.txt" && break
  sleep 0.1
done
grep -q "cancelled: $stalled" "$work/stall.txt" || fail "the stalled stage was never taken back"
ctl cancel "$long" >/dev/null
wait_done "$stalled"
restarts=$(job_field "$stalled" "s.get('restarts', 0)")
((restarts == 1)) || fail "the stalled job restarted $restarts times"
grep -q "StageStalled\|stalled" "$work/controller.log" || fail "the controller's log does not say the stage stalled"
kill "$staller" 2>/dev/null || true
wait "$staller" 2>/dev/null || true
(($(grep -c assigned "$work/stall.txt") == 1)) || fail "the staller got another stage: $(cat "$work/stall.txt")"
ok "a stalled stage was taken back and its job ran elsewhere ($(tail -n 1 "$work/stall.txt"))"

# 7. A full checkpoint disk.
if [[ -n "$tmpfs" ]]; then
  json "$work/disk.json" 's["name"] = "disk-full"; s["steps"] = 1000000; s["checkpoint"] = {"every": 2, "keep": 3}; s["model"]["layers"] = [{"linear": {"inFeatures": 8, "outFeatures": 512}}, {"relu": {}}, {"linear": {"inFeatures": 512, "outFeatures": 512}}, {"relu": {}}, {"linear": {"inFeatures": 512, "outFeatures": 3}}]'
  disk=$(submit "$work/disk.json")
  why=""
  for _ in $(seq 150); do
    why=$(job_field "$disk" "' '.join(c.get('reason','') for c in s.get('conditions', []))")
    [[ "$why" == *CheckpointStoreFull* ]] && break
    sleep 0.1
  done
  [[ "$why" == *CheckpointStoreFull* ]] || fail "the full disk was not reported: '$why'"
  sleep 2
  restarts=$(job_field "$disk" "s.get('restarts', 0)")
  ((restarts == 0)) || fail "a full disk spent $restarts restarts"
  ctl cancel "$disk" >/dev/null
  ok "a full checkpoint disk: the job waited without spending restarts"
else
  echo "skip: the full-disk check needs root and unshare"
fi

# 8. Cancel of a large job gives the memory back.
json "$work/big.json" 's["name"] = "big"; s["steps"] = 1000000; s["optimizer"] = {"lr": 0.001, "adamw": {}}; s["checkpoint"] = {"every": 0}; s["model"]["input"]["shape"]["dims"] = [1024]; s["data"]["synthetic"]["features"] = 1024; s["model"]["layers"] = [{"linear": {"inFeatures": 1024, "outFeatures": 16384}}, {"relu": {}}, {"linear": {"inFeatures": 16384, "outFeatures": 3}}]'
before0=$(rss_mb "$w0")
before1=$(rss_mb "$w1")
big=$(submit "$work/big.json")
wait_step "$big" 2
during=$(( $(rss_mb "$w0") + $(rss_mb "$w1") ))
ctl cancel "$big" >/dev/null
after=$during
for _ in $(seq 100); do
  after=$(( $(rss_mb "$w0") + $(rss_mb "$w1") ))
  ((after < before0 + before1 + 60)) && break
  sleep 0.1
done
((during > before0 + before1 + 200)) || fail "the big job held only $((during - before0 - before1)) MB"
((after < before0 + before1 + 60)) || fail "after the cancel the workers hold $((after - before0 - before1)) MB more"
ok "cancel gave the memory back (workers $((before0 + before1)) -> $during -> $after MB)"

kill -0 "$w0" && kill -0 "$w1" && kill -0 "$controller_pid" || fail "a process died"
now=$(ctl workers --json | python3 -c 'import json,sys; print(" ".join(sorted(w["workerId"] for w in json.load(sys.stdin)["workers"] if w["workerId"] != "hostile-staller")))')
[[ "$now" == "$ids" ]] || fail "the workers are not the same: '$ids' -> '$now'"
echo "$passed passed, 0 failed"
