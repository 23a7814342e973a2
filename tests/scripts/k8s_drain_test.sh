#!/usr/bin/env bash
# What Kubernetes relies on in a worker, against a real controller:
#   - health (grpc.health.v1 on the Stage port): "gpipe.v1.Stage" SERVING as
#     soon as the worker serves; "" (readiness) NOT_SERVING until the
#     controller has welcomed it, SERVING once attached;
#   - SIGTERM mid-job drains: the worker exits 0 within a bound, and the
#     controller counts it gone at once (a goodbye), not when its lease of
#     --heartbeat_timeout_ms (60 s here) would run out.
#   k8s_drain_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
bin="$1/bin"
for b in gpipectl gpipe-controller gpipe-worker grpc_health_probe; do
  [[ -x "$bin/$b" ]] || { echo "SKIP: $bin/$b is not built"; echo "0 passed, 0 failed"; exit 0; }
done
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; tail -n 8 "$work"/*.log >&2 || true; exit 1; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
probe() { "$bin/grpc_health_probe" "127.0.0.1:$1" "$2" --timeout_ms 2000 || true; }
# Polls `probe PORT SERVICE` until it prints WANT; bounded to ~10 s.
wait_probe() {
  for _ in $(seq 1 50); do
    [[ "$(probe "$1" "$2")" == *": $3" ]] && return 0
    sleep 0.2
  done
  fail "health of 127.0.0.1:$1 service \"$2\" never became $3 (last: $(probe "$1" "$2"))"
}
passed=0

cport=$(free_port)
w0=$(free_port)
w1=$(free_port)
# Worker 0 first, with no controller yet: alive but not ready.
"$bin/gpipe-worker" --controller "127.0.0.1:$cport" --listen "127.0.0.1:$w0" \
  --threads 1 --drain_timeout_ms 8000 >"$work/worker0.log" 2>&1 &
pids+=($!)
wait_probe "$w0" gpipe.v1.Stage SERVING
[[ "$(probe "$w0" "")" == *": NOT_SERVING" ]] ||
  fail "a worker without a controller is ready: $(probe "$w0" "")"
passed=$((passed + 1))

"$bin/gpipe-controller" --listen "127.0.0.1:$cport" --checkpoint_dir "$work/ckpt" --metrics_listen "" \
  --heartbeat_timeout_ms 60000 --heartbeat_interval_ms 500 >"$work/controller.log" 2>&1 &
pids+=($!)
"$bin/gpipe-worker" --controller "127.0.0.1:$cport" --listen "127.0.0.1:$w1" \
  --threads 1 --drain_timeout_ms 8000 >"$work/worker1.log" 2>&1 &
w1pid=$!
pids+=($w1pid)
wait_probe "$w0" "" SERVING
wait_probe "$w1" "" SERVING
passed=$((passed + 1))

# A job long enough to be mid-step when the signal comes.
sed -e 's/"steps": [0-9]*/"steps": 100000/' \
  "$2/examples/char_transformer.json" >"$work/job.json"
job=$("$bin/gpipectl" --controller "127.0.0.1:$cport" submit "$work/job.json")
[[ "$job" == job-* ]] || fail "submit printed $job"
step=0
for _ in $(seq 1 150); do  # bounded: 30 s
  step=$("$bin/gpipectl" --controller "127.0.0.1:$cport" status "$job" --json |
    python3 -c 'import json,sys; j=json.load(sys.stdin); print(int(j.get("status",{}).get("step","0")))')
  ((step >= 2)) && break
  sleep 0.2
done
((step >= 2)) || fail "the job made no progress in 30 s"

start=$(date +%s.%N)
kill -TERM "$w1pid"
rc=0
# The worker must be gone within its drain timeout (8 s) plus slack.
for _ in $(seq 1 100); do kill -0 "$w1pid" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$w1pid" 2>/dev/null; then fail "the worker still runs 10 s after SIGTERM"; fi
wait "$w1pid" || rc=$?
exit_s=$(python3 -c "import time; print('%.2f' % (time.time() - $start))")
[[ $rc -eq 0 ]] || fail "the drained worker exited $rc, want 0"
grep -q "said goodbye" "$work/worker1.log" || fail "the worker did not say goodbye"
passed=$((passed + 1))

# The controller saw it leave: the job is no longer RUNNING and the worker
# is not listed, long before the 60 s lease.
state=""
for _ in $(seq 1 25); do  # bounded: 5 s
  state=$("$bin/gpipectl" --controller "127.0.0.1:$cport" status "$job" --json |
    python3 -c 'import json,sys; print(json.load(sys.stdin).get("status",{}).get("state",""))')
  [[ "$state" != "RUNNING" ]] && break
  sleep 0.2
done
seen_s=$(python3 -c "import time; print('%.2f' % (time.time() - $start))")
[[ "$state" != "RUNNING" ]] || fail "the job still RUNNING 5 s after its worker left (lease 60 s)"
"$bin/gpipectl" --controller "127.0.0.1:$cport" workers --json | grep -q "127.0.0.1:$w1" &&
  fail "the controller still lists the drained worker"
grep -q "said goodbye" "$work/controller.log" ||
  fail "the controller's log does not say the worker said goodbye"
passed=$((passed + 1))
# The same from the processes' own log clocks: SIGTERM to exit, and SIGTERM
# to the controller detaching the worker.
read -r drain_ms detach_ms < <(python3 - "$work/worker1.log" "$work/controller.log" <<'PY'
import re, sys
def ms(path, pattern):
    for line in open(path):
        if re.search(pattern, line):
            h, m, s = re.match(r"\S+ (\d+):(\d+):([\d.]+)", line).groups()
            return (int(h) * 3600 + int(m) * 60 + float(s)) * 1000
    sys.exit("no line matching %r in %s" % (pattern, path))
term = ms(sys.argv[1], "SIGTERM: draining")
print("%.0f %.0f" % (ms(sys.argv[1], "gpipe-worker stopped") - term,
                     ms(sys.argv[2], "detached: it said goodbye") - term))
PY
)
echo "SIGTERM -> worker exit ${drain_ms} ms, -> controller detached it ${detach_ms} ms" \
  "(log clocks); as the test saw it: exit ${exit_s} s, job $state ${seen_s} s"
[[ -n "$detach_ms" ]] && ((detach_ms < 2000)) ||
  fail "the controller detached the worker ${detach_ms} ms after SIGTERM"
((drain_ms < 8000)) || fail "the drain took ${drain_ms} ms"
passed=$((passed + 1))

# The other worker still serves and is ready for the next assignment.
[[ "$(probe "$w0" gpipe.v1.Stage)" == *": SERVING" ]] || fail "worker 0 stopped serving"
passed=$((passed + 1))
echo "$passed passed, 0 failed"
