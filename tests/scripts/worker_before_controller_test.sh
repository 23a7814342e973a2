#!/usr/bin/env bash
# A worker started before its controller keeps retrying (with backoff) and
# attaches once the controller is up.
#   worker_before_controller_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
bin="$1/bin"
for b in gpipectl gpipe-controller gpipe-worker; do
  [[ -x "$bin/$b" ]] || { echo "SKIP: $bin/$b is not built"; echo "0 passed, 0 failed"; exit 0; }
done
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; tail -5 "$work"/*.log >&2 || true; exit 1; }

# A free loopback port for the controller-to-be.
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$bin/gpipe-worker" --controller "127.0.0.1:$port" --threads 1 >"$work/worker.log" 2>&1 &
pids+=($!)
sleep 1.5  # the worker has failed to attach a few times by now
kill -0 "${pids[0]}" || fail "the worker gave up without a controller"

"$bin/gpipe-controller" --listen "127.0.0.1:$port" --checkpoint_dir "$work/ckpt" --metrics_listen "" \
  >"$work/controller.log" 2>&1 &
pids+=($!)

for _ in $(seq 1 50); do  # bounded: 10 s
  if "$bin/gpipectl" workers --controller "127.0.0.1:$port" 2>/dev/null | grep -q "127.0.0.1"; then
    grep -q "attached to the controller" "$work/worker.log" || fail "no attach line in the worker's log"
    echo "1 passed, 0 failed"
    exit 0
  fi
  sleep 0.2
done
fail "the worker did not attach within 10 s of the controller starting"
