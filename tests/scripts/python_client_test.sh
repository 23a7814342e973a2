#!/usr/bin/env bash
# The Python package against a real controller and workers on loopback:
# Client.submit (a spec dict with a relative data path), watch to
# SUCCEEDED, fetch (sha256-checked) gives parameters bitwise equal to
# `gpipectl train`; a bad spec raises GpipeError naming the field; a watch
# rides through the controller's restart; then the package's own unit
# tests (no C++ needed) run.
#   python_client_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
bin="$(cd "$1" && pwd)/bin"
src=$(cd "$2" && pwd)
py=/usr/bin/python3  # Debian's, with python3-grpcio and python3-numpy
for b in gpipectl gpipe-controller gpipe-worker; do
  [[ -x "$bin/$b" ]] || { echo "SKIP: $bin/$b is not built"; echo "0 passed, 0 failed"; exit 0; }
done
[[ -f "$1/python/gpipe/v1/controller_pb2_grpc.py" ]] ||
  { echo "FAIL: $1/python/gpipe/v1 was not generated (grpc_python_plugin?)"; exit 1; }
"$py" -c 'import grpc, numpy' 2>/dev/null ||
  { echo "FAIL: $py lacks grpc or numpy: run scripts/setup.sh"; exit 1; }
export PYTHONPATH="$src/python:$(cd "$1" && pwd)/python"
work=$(mktemp -d)
source "$src/tests/scripts/recovery_lib.sh"
trap cleanup EXIT

write_spec "$work/job.json" python 30 2 2 "$ADAMW"
cport=$(free_port)
start_controller
start_worker
start_worker
wait_workers 2

cat >"$work/client.py" <<'PY'
import json, os, sys
import gpipe
from gpipe import Client, GpipeError

address, spec_path, out = sys.argv[1:4]
spec = json.load(open(spec_path))
with Client(address) as c:
    assert len(c.workers()) == 2, c.workers()
    job = c.submit(spec)
    states = [e["job"]["status"].get("state") for e in c.watch(job)]
    assert states[-1] == "SUCCEEDED", states
    status = c.status(job)
    # 64-bit integers as ints, and fields at 0 present.
    assert status["step"] == 30, status
    assert status["restarts"] == 0, status
    # The simulator's step from the stages' layer times, every 20 steps.
    assert 0 < status["predictedStepSeconds"] < 10, status
    assert all("stage" in w for w in c.workers()), c.workers()
    files = c.fetch(job, out)
    assert files == [os.path.join(out, "model.safetensors")], files
    listed = [j for j in c.jobs() if j["id"] == job]
    assert len(listed) == 1, c.jobs()
    # A summary's spec is the fields ListJobs keeps: no seed read as 0.
    assert set(listed[0]["spec"]) <= {"name", "steps", "batchSize", "pipeline"}, listed
    assert listed[0]["spec"]["steps"] == 30, listed
    try:
        c.fetch(job, out, step=7)
        raise AssertionError("a step not kept was fetched")
    except GpipeError as e:
        assert e.code == "NOT_FOUND", e
    try:
        c.fetch(job, out + "-none", step=7)
        raise AssertionError("a step not kept was fetched")
    except GpipeError as e:
        assert not os.path.exists(out + "-none"), "a failed fetch made its folder"
    bad = json.loads(json.dumps(spec))
    bad["optimizer"]["lr"] = -1
    try:
        c.submit(bad)
        raise AssertionError("a negative lr was accepted")
    except GpipeError as e:
        assert e.code == "INVALID_ARGUMENT" and "optimizer.lr" in e.message, e
    tensors, meta = gpipe.load_safetensors(files[0])
    assert json.loads(meta["gpipe.job"])["name"] == "python"
    print("job %s: %d events, %d tensors" % (job, len(states), len(tensors)))
PY
"$py" "$work/client.py" "127.0.0.1:$cport" "$work/job.json" "$work/got" >"$work/client.txt" ||
  fail "the Python client run failed: $(tail -n 5 "$work/client.txt")"
succeeded=$(awk '/^job /{print $2; exit}' "$work/client.txt" | tr -d ':')
[[ -n "$succeeded" ]] || fail "the Python client printed no job: $(cat "$work/client.txt")"
"$bin/gpipectl" train "$work/job.json" --stages 1 --micro-batches 4 --threads 1 \
  --out "$work/ref" >"$work/ref.txt" 2>&1 || fail "reference: $(tail -n 3 "$work/ref.txt")"
"$py" "$src/tests/scripts/same_tensors.py" "$work/ref/model.safetensors" \
  "$work/got/model.safetensors" || fail "the fetched model differs from gpipectl train's"
ok "submit, watch, fetch from Python: bitwise the reference run; errors raise GpipeError"

# A watch outlives a controller killed and restarted (its store keeps the
# job), as gpipectl watch does: it raised UNAVAILABLE at once.
write_spec "$work/long.json" pywatch 100000 2 2 "$ADAMW"
long=$(submit "$work/long.json")
wait_step "$long" 3
cat >"$work/watch.py" <<'PY'
import sys
from gpipe import Client
with Client(sys.argv[1]) as c:
    last = None
    for event in c.watch(sys.argv[2]):
        if last is None:
            print("watching", flush=True)
        last = event["job"]["status"].get("state")
    print("final", last)
PY
timeout 120 "$py" "$work/watch.py" "127.0.0.1:$cport" "$long" >"$work/pywatch.txt" 2>&1 &
watcher=$!
# Killed only once the watch has its stream (else it rightly fails at once).
for _ in $(seq 300); do
  grep -q watching "$work/pywatch.txt" && break
  sleep 0.1
done
grep -q watching "$work/pywatch.txt" || fail "the Python watch never started: $(cat "$work/pywatch.txt")"
kill -9 "$controller_pid"
wait "$controller_pid" 2>/dev/null || true
# A fetch asked while the controller is down waits for it, as the watch
# does (three tries gave up 3 s into a restart).
cat >"$work/fetch.py" <<'PY'
import sys
from gpipe import Client
with Client(sys.argv[1]) as c:
    print(c.fetch(sys.argv[2], sys.argv[3]))
PY
timeout 60 "$py" "$work/fetch.py" "127.0.0.1:$cport" "$succeeded" "$work/refetched" >"$work/pyfetch.txt" 2>&1 &
fetcher=$!
sleep 4
start_controller
wait "$fetcher" || fail "the Python fetch gave up while the controller restarted: $(tail -3 "$work/pyfetch.txt")"
cmp -s "$work/refetched/model.safetensors" "$work/got/model.safetensors" ||
  fail "the Python fetch across the restart wrote another model"
sleep 1.5
"$bin/gpipectl" --controller "127.0.0.1:$cport" cancel "$long" >/dev/null
wait "$watcher" || fail "the Python watch failed across the restart: $(tail -3 "$work/pywatch.txt")"
grep -q "final CANCELLED" "$work/pywatch.txt" ||
  fail "the Python watch did not follow the job to its end: $(tail -3 "$work/pywatch.txt")"
ok "a Python watch followed its job, and a fetch waited for the controller, across its kill -9 and restart"

(cd "$src/python" && "$py" -m unittest discover -s tests 2>&1) >"$work/unit.txt" ||
  fail "the package's unit tests: $(tail -n 20 "$work/unit.txt")"
ok "the package's unit tests: $(tail -n 1 "$work/unit.txt")"
echo "$passed passed, 0 failed"
