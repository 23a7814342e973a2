#!/usr/bin/env bash
# `gpipectl local` stands in for a Deployment: a worker killed -9 mid-job is
# replaced by a new process, the controller recovers the job onto it, and
# the run ends SUCCEEDED bitwise equal to `gpipectl train`; with
# --noreplace_workers the same kill ends the run, naming the dead worker.
# The first run listens on the ports --ports gives, the replacement on the
# ports of the worker it replaces.
#   local_replace_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
bin="$1/bin"
src=$2
for b in gpipectl gpipe-controller gpipe-worker; do
  [[ -x "$bin/$b" ]] || { echo "SKIP: $bin/$b is not built"; echo "0 passed, 0 failed"; exit 0; }
done
work=$(mktemp -d)
local_pid=""
cleanup() {
  [[ -z "$local_pid" ]] || kill "$local_pid" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; tail -n 20 "$work"/*.log >&2 2>/dev/null || true; exit 1; }

cat >"$work/job.json" <<'JSON'
{
  "name": "local-replace",
  "model": {
    "input": {"dtype": "FLOAT32", "shape": {"dims": [8]}},
    "layers": [
      {"linear": {"inFeatures": 8, "outFeatures": 32}}, {"relu": {}},
      {"linear": {"inFeatures": 32, "outFeatures": 32}}, {"relu": {}},
      {"linear": {"inFeatures": 32, "outFeatures": 3}}
    ],
    "loss": {"softmaxCrossEntropy": {}}
  },
  "optimizer": {"lr": 0.05, "sgd": {"momentum": 0.9}},
  "data": {"synthetic": {"task": "CLASSES", "features": 8, "classes": 3,
                         "trainSamples": 512, "testSamples": 128}},
  "pipeline": {"stages": 2, "microBatches": 4},
  "checkpoint": {"every": 10, "keep": 3},
  "batchSize": 32,
  "steps": 1500,
  "seed": 5
}
JSON

# run NAME [FLAGS...]: gpipectl local in the background, a worker killed -9
# once the job has run 50 steps; sets $rc.
run() {
  local name=$1 port="" step=0 pid _
  shift
  "$bin/gpipectl" local "$work/job.json" --keep "$work/$name" --threads 1 \
    --out "$work/$name-out" "$@" >"$work/$name.log" 2>&1 &
  local_pid=$!
  for _ in $(seq 300); do
    [[ -s "$work/$name/controller.port" ]] && port=$(tr -d '[:space:]' <"$work/$name/controller.port") && break
    sleep 0.1
  done
  [[ -n "$port" ]] || fail "$name: no controller port"
  port=${port##*:}
  for _ in $(seq 600); do
    step=$("$bin/gpipectl" --controller "127.0.0.1:$port" list --json 2>/dev/null |
      python3 -c 'import json,sys; j=json.load(sys.stdin).get("jobs",[]); print(int(j[0]["status"].get("step",0)) if j else 0)' 2>/dev/null || echo 0)
    ((step >= 50)) && break
    sleep 0.1
  done
  ((step >= 50)) || fail "$name: the job did not reach step 50"
  pid=$(pgrep -f "gpipe-worker --controller=127.0.0.1:$port" | head -n 1)
  [[ -n "$pid" ]] || fail "$name: no worker process found"
  kill -9 "$pid"
  echo "$name: kill -9 worker pid $pid at step $step"
  set +e
  timeout -k 5 120 tail --pid="$local_pid" -f /dev/null
  wait "$local_pid"
  rc=$?
  set -e
  local_pid=""
}

# Six free ports in a row (the controller and two workers, two each),
# checked by binding them, below the kernel's range for outgoing
# connections' ports (32768 and up: a connection could take one between
# the check and the bind).
free_ports() {
  python3 - <<'PY'
import random, socket
for _ in range(50):
    first = random.randrange(20000, 32000)
    socks = []
    try:
        for p in range(first, first + 6):
            s = socket.socket()
            s.bind(("127.0.0.1", p))
            socks.append(s)
        print(first)
        break
    except OSError:
        pass
    finally:
        for s in socks:
            s.close()
PY
}

# A range too small for the cluster is refused before anything starts.
set +e
small=$("$bin/gpipectl" local "$work/job.json" --ports 40000-40003 2>&1)
small_rc=$?
set -e
((small_rc != 0)) || fail "--ports with 4 ports for 3 processes was accepted"
[[ $small == *"holds 4 ports; the controller and 2 workers need 6"* ]] ||
  fail "the small --ports range's error: $small"
echo "ports: a range too small is refused: $small"

first=$(free_ports)
[[ -n "$first" ]] || fail "found no six free ports in a row"
run replace --ports "$first-$((first + 5))"
((rc == 0)) || fail "gpipectl local exited $rc after a worker was killed: $(tail -n 5 "$work/replace.log")"
grep -q "starting a replacement" "$work/replace.log" || fail "no replacement was started"
"$bin/gpipectl" train "$work/job.json" --stages 1 --micro-batches 4 --threads 1 \
  --out "$work/ref" >"$work/ref.log" 2>&1 || fail "the reference run failed"
python3 "$src/tests/scripts/same_tensors.py" "$work/ref/model.safetensors" \
  "$work/replace-out/model.safetensors" || fail "the recovered run differs from gpipectl train"
echo "replace: the killed worker was replaced and the job ended bitwise the reference"
# Ports: the controller's and the workers' from the range, the
# replacement's those of the worker it replaced.
controller_port=$(tr -d '[:space:]' <"$work/replace/controller.port")
[[ ${controller_port##*:} == "$first" ]] ||
  fail "the controller did not listen on $first: $(cat "$work/replace/controller.port")"
serving() { grep -ho 'serving stages on 127.0.0.1:[0-9]*' "$1" | head -n 1 | sed 's/.*://'; }
metrics() { grep -ho 'metrics on http://127.0.0.1:[0-9]*' "$1" | head -n 1 | sed 's/.*://'; }
w0=$(serving "$work/replace/worker-0.log")
w1=$(serving "$work/replace/worker-1.log")
r1=$(serving "$work/replace/worker-r1.log")
m0=$(metrics "$work/replace/worker-0.log")
m1=$(metrics "$work/replace/worker-1.log")
mr=$(metrics "$work/replace/worker-r1.log")
[[ "$w0 $m0 $w1 $m1" == "$((first + 2)) $((first + 3)) $((first + 4)) $((first + 5))" ]] ||
  fail "the workers' ports $w0 $m0 $w1 $m1 are not $((first + 2))-$((first + 5))"
[[ "$r1 $mr" == "$w0 $m0" || "$r1 $mr" == "$w1 $m1" ]] ||
  fail "the replacement listened on $r1 and $mr, not on the ports of the worker it replaced"
echo "replace: ports $first-$((first + 5)) as --ports gave them; the replacement took $r1 and $mr"
# The workers share the machine's memory: each is started with its share.
for log in "$work"/replace/worker-*.log; do
  grep -q "from --memory_limit" "$log" || fail "$(basename "$log") was not given its share of memory: $(grep memory: "$log")"
done
echo "replace: each worker had its share of the memory ($(grep -ho 'limit [0-9.]* [KMGT]*i*B from --memory_limit' "$work"/replace/worker-0.log))"

run noreplace --noreplace_workers
((rc != 0)) || fail "with --noreplace_workers a killed worker did not end the run"
grep -q "unexpectedly" "$work/noreplace.log" || fail "the run did not name the dead worker: $(tail -n 5 "$work/noreplace.log")"
echo "noreplace: the run ended (exit $rc), naming the dead worker"
echo "1 passed, 0 failed"
