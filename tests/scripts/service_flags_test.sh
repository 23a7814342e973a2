#!/usr/bin/env bash
# The services refuse settings they cannot run with, at once (exit 2, no
# port taken), naming the flag: a --threads libgomp crashed on, a port past
# 65535 that gRPC took modulo 65536 (and so listened on or dialled another
# port), a heartbeat interval past the timeout that loses every idle
# worker, stray arguments.
#   service_flags_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
bin="$1/bin"
for b in gpipectl gpipe-controller gpipe-worker; do
  [[ -x "$bin/$b" ]] || { echo "SKIP: $bin/$b is not built"; echo "0 passed, 0 failed"; exit 0; }
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

refused() {  # MESSAGE BINARY ARGS...
  local message=$1 binary=$2
  shift 2
  set +e
  timeout -k 5 20 "$bin/$binary" "$@" >"$work/out" 2>&1
  local rc=$?
  set -e
  [[ $rc == 2 ]] || fail "$binary $* exited $rc, want 2: $(cat "$work/out")"
  grep -qF -- "$message" "$work/out" || fail "$binary $*: no '$message': $(cat "$work/out")"
  echo "$binary $*: $(head -n 1 "$work/out")"
}

# The worker: nothing here reaches a controller (127.0.0.1:1 refuses).
w=(--controller 127.0.0.1:1 --listen 127.0.0.1:0)
refused "--threads must be between 0 (the usable cores) and 1024, got 99999" \
  gpipe-worker "${w[@]}" --threads 99999
refused "--threads must be between 0" gpipe-worker "${w[@]}" --threads -1
refused "--link_wait_ms must be positive" gpipe-worker "${w[@]}" --link-wait-ms -1
refused "unexpected argument 'extra'" gpipe-worker "${w[@]}" extra
refused "--listen: port 108658 of '127.0.0.1:108658' is not in 0..65535" \
  gpipe-worker --controller 127.0.0.1:1 --listen 127.0.0.1:108658
refused "--controller: port 70000" gpipe-worker --controller 127.0.0.1:70000

c=(--checkpoint_dir "$work/ckpt")
refused "--listen: port 99999 of '127.0.0.1:99999' is not in 0..65535" \
  gpipe-controller "${c[@]}" --listen 127.0.0.1:99999
refused "unexpected argument 'extra'" gpipe-controller "${c[@]}" --listen 127.0.0.1:0 extra
refused "--job_retention must not be negative" \
  gpipe-controller "${c[@]}" --listen 127.0.0.1:0 --job_retention=-1h
refused "--heartbeat_interval_ms (20000) must be less than --heartbeat_timeout_ms (10000)" \
  gpipe-controller "${c[@]}" --listen 127.0.0.1:0 --heartbeat_interval_ms 20000

refused "--controller: port 108636" gpipectl list --controller 127.0.0.1:108636
GPIPE_CONTROLLER=127.0.0.1:99999 refused "\$GPIPE_CONTROLLER: port 99999" gpipectl list
[[ ! -e $work/ckpt ]] || fail "a refused controller made its checkpoint directory"

# A port another process holds: exit 1 with our line alone, not gRPC's chain
# of errors ("chttp2_server.cc ... errno:98") ahead of it.
python3 -c 'import socket,time; s=socket.socket(); s.bind(("127.0.0.1",0)); s.listen(); print(s.getsockname()[1], flush=True); time.sleep(30)' >"$work/port" &
holder=$!
trap 'kill $holder 2>/dev/null; rm -rf "$work"' EXIT
for _ in $(seq 100); do [[ -s $work/port ]] && break; sleep 0.1; done
taken="127.0.0.1:$(cat "$work/port")"
in_use() {  # BINARY ARGS...
  local binary=$1
  shift
  set +e
  timeout -k 5 20 "$bin/$binary" "$@" >"$work/out" 2>&1
  local rc=$?
  set -e
  [[ $rc == 1 ]] || fail "$binary on a taken port exited $rc, want 1: $(cat "$work/out")"
  grep -qF "cannot listen on $taken: in use by another process" "$work/out" ||
    fail "$binary on a taken port: $(cat "$work/out")"
  ! grep -q "chttp2\|errno" "$work/out" || fail "$binary on a taken port shows gRPC's errors: $(cat "$work/out")"
  echo "$binary on a taken port: $(grep -F "cannot listen" "$work/out")"
}
in_use gpipe-worker --controller 127.0.0.1:1 --listen "$taken"
in_use gpipe-worker --controller 127.0.0.1:1 --listen 127.0.0.1:0 --health_listen "$taken"
in_use gpipe-controller "${c[@]}" --listen "$taken" --metrics_listen ""
echo "1 passed, 0 failed"
