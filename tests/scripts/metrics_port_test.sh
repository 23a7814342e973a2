#!/usr/bin/env bash
# A taken metrics port stops a service from starting, as a taken gRPC port
# does (exit 1, naming the address and how to run without metrics), unless
# --metrics_optional says metrics may be missing; the worker too.
#   metrics_port_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
bin="$1/bin"
for b in gpipectl gpipe-controller gpipe-worker; do
  [[ -x "$bin/$b" ]] || { echo "SKIP: $bin/$b is not built"; echo "0 passed, 0 failed"; exit 0; }
done
work=$(mktemp -d)
pids=()
cleanup() {
  local p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# Holds a loopback port for the whole test; prints it.
python3 -c '
import socket, sys, time
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(1)
print(s.getsockname()[1], flush=True)
time.sleep(120)
' >"$work/taken" &
pids+=($!)
for _ in $(seq 50); do [[ -s "$work/taken" ]] && break; sleep 0.1; done
taken=$(cat "$work/taken")

set +e
out=$(timeout -k 5 20 "$bin/gpipe-controller" --listen 127.0.0.1:0 \
  --checkpoint_dir "$work/ckpt" --metrics_listen "127.0.0.1:$taken" 2>&1)
rc=$?
set -e
[[ $rc == 1 ]] || fail "the controller on a taken metrics port exited $rc, want 1: $out"
grep -q "127.0.0.1:$taken" <<<"$out" || fail "the controller did not name the address: $out"
grep -q -- "--metrics_optional" <<<"$out" || fail "the controller did not say how to go on: $out"
echo "controller, taken metrics port: exit 1: $(grep -o 'cannot.*' <<<"$out" | head -n 1)"

"$bin/gpipe-controller" --listen 127.0.0.1:0 --port_file "$work/port" \
  --checkpoint_dir "$work/ckpt" --metrics_listen "127.0.0.1:$taken" \
  --metrics_optional >"$work/optional.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do [[ -s "$work/port" ]] && break; sleep 0.1; done
[[ -s "$work/port" ]] || fail "with --metrics_optional the controller did not serve: $(cat "$work/optional.log")"
"$bin/gpipectl" --controller "127.0.0.1:$(cat "$work/port")" list >/dev/null ||
  fail "with --metrics_optional the controller does not answer"
echo "controller, taken metrics port, --metrics_optional: serves the API"

set +e
out=$(timeout -k 5 20 "$bin/gpipe-worker" --controller "127.0.0.1:$(cat "$work/port")" \
  --listen 127.0.0.1:0 --metrics_listen "127.0.0.1:$taken" 2>&1)
rc=$?
set -e
((rc != 0 && rc != 124)) || fail "the worker on a taken metrics port exited $rc: $out"
echo "worker, taken metrics port: exit $rc"
echo "1 passed, 0 failed"
