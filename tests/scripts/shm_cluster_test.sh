#!/usr/bin/env bash
# The shared-memory data plane on local clusters (real processes on one
# host): a 2-worker and a 3-stage cluster with --data_plane shm end with
# parameters bitwise equal to the same cluster on gRPC frames, the workers
# say in their logs and metrics that shared memory carried the tensors (and
# the job status says so per stage, and why a link is on frames), a peer
# killed with -9 is noticed, and nothing is left in /dev/shm. Also: local
# --json names the model where it is once the command has ended.
# GPIPE_SHM_STEPS changes the step count.
#   shm_cluster_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1
src=$2
bin="$build/bin"
steps=${GPIPE_SHM_STEPS:-6}
source "$src/tests/scripts/processes_lib.sh"
skip_unless_built gpipectl gpipe-controller gpipe-worker
fail() { echo "FAIL: $*" >&2; exit 1; }
same() { python3 "$src/tests/scripts/same_tensors.py" "$1" "$2" || fail "$3"; }

touch "$work/start"
passed=0
# example stages micro-batches
for run in "fashion_mnist_mlp 2 4" "char_transformer 3 3"; do
  read -r example stages mbs <<<"$run"
  spec="$src/examples/$example.json"
  for plane in grpc shm; do
    "$bin/gpipectl" local "$spec" --workers "$stages" --stages "$stages" \
      --micro-batches "$mbs" --steps "$steps" --threads 2 --data_plane "$plane" --json \
      --keep "$work/$example-$plane" --out "$work/$example-$plane-out" \
      >"$work/$example-$plane.log" 2>&1 ||
      { tail -30 "$work/$example-$plane.log"; fail "$example on $plane"; }
  done
  same "$work/$example-shm-out/model.safetensors" \
    "$work/$example-grpc-out/model.safetensors" \
    "$example: shared memory and gRPC frames give different parameters"
  # Every stage but the last says which plane carried its tensors onward.
  for plane in grpc shm; do
    n=$(cat "$work/$example-$plane"/worker-*.log |
      grep -c "data plane to stage [0-9]* is $plane (--data_plane $plane)" || true)
    [[ "$n" == $((stages - 1)) ]] ||
      fail "$example: $n of $((stages - 1)) links logged data plane $plane"
  done
  # The controller shows it per stage too (gpipectl status, --json events).
  grep -q '"dataPlane":"shm"' "$work/$example-shm.log" ||
    fail "$example: no job status shows a stage with dataPlane shm"
  # ...and why a link runs on frames when it could have shared memory.
  grep -q '"dataPlaneReason":"the sending worker runs --data_plane grpc"' "$work/$example-grpc.log" ||
    fail "$example: no job status says why a stage runs on grpc"
  echo "ok: $example, $stages stages: shm bitwise equal to grpc frames"
  passed=$((passed + 1))
done

# --json without --keep: an event names the model where it is once the
# command has ended (its --out), or nowhere (it went with the cluster),
# not in the run directory the command removes.
spec="$src/examples/fashion_mnist_mlp.json"
"$bin/gpipectl" local "$spec" --workers 2 --stages 2 --steps "$steps" --json \
  --out "$work/json-out" >"$work/json-out.log" 2>&1 ||
  { tail -5 "$work/json-out.log"; fail "local --json --out"; }
grep -q "\"modelPath\":\"$work/json-out/model.safetensors\"" "$work/json-out.log" ||
  fail "local --json --out names another model path: $(grep -o '"modelPath":"[^"]*"' "$work/json-out.log" | tail -1)"
[[ -f "$work/json-out/model.safetensors" ]] || fail "local --out wrote no model"
"$bin/gpipectl" local "$spec" --workers 2 --stages 2 --steps "$steps" --json \
  >"$work/json-gone.log" 2>&1 || { tail -5 "$work/json-gone.log"; fail "local --json"; }
! grep -qE '"modelPath":"[^"]+"' "$work/json-gone.log" ||
  fail "local --json names a model path it removes: $(grep -o '"modelPath":"[^"]*"' "$work/json-gone.log" | tail -1)"
grep -q "removed with it (--out DIR keeps the model)" "$work/json-gone.log" ||
  fail "local --json does not say where the model went"
echo "ok: local --json names the model where it is after the command"
passed=$((passed + 1))

# The gauge, read from a live worker: a longer shm run, scraped while it
# trains.
"$bin/gpipectl" local "$spec" --workers 2 --stages 2 --micro-batches 4 \
  --steps 100000 --threads 2 --data_plane shm --keep "$work/gauge" \
  >"$work/gauge.log" 2>&1 &
pids+=($!)
found=""
for _ in $(seq 300); do  # 60 s: start-up is slow on a loaded machine
  for f in "$work"/gauge/worker-*.metrics.port; do
    [[ -s "$f" ]] || continue
    if curl -sf "http://127.0.0.1:$(cat "$f")/metrics" 2>/dev/null |
      grep -q '^gpipe_transport_data_plane{.*plane="shm".*} 1'; then
      found=yes
      break 2
    fi
  done
  sleep 0.2
done
[[ -n "$found" ]] || { tail -20 "$work/gauge.log"; fail "no worker exported gpipe_transport_data_plane{plane=\"shm\"} 1"; }
echo "ok: gpipe_transport_data_plane{plane=\"shm\"} is 1 on a running worker"
passed=$((passed + 1))

# A peer killed with -9 mid-training is noticed through the stream's end,
# though the tensors travel in shared memory: the surviving stage ends its
# step within seconds instead of waiting on the segment forever (its link
# fails, or the controller, which saw the Attach stream end first, cancels
# it: either way nothing hangs).
victim=$(pgrep -P "${pids[-1]}" gpipe-worker | tail -1 || true)
[[ -n "$victim" ]] || fail "no gpipe-worker child of gpipectl to kill"
kill -9 "$victim"
noticed=""
for _ in $(seq 50); do  # 10 s
  for f in "$work"/gauge/worker-*.log; do
    if grep -Eq "stage [0-9]+ of .* failed: |cancelling stage [0-9]+ of " "$f"; then
      noticed=$f
      break 2
    fi
  done
  sleep 0.2
done
[[ -n "$noticed" ]] || { tail -n 8 "$work"/gauge/*.log; fail "nobody noticed the killed shm peer within 10 s"; }
echo "ok: a peer killed with -9 is noticed on shm ($(grep -Eh "failed: |cancelling stage" "$noticed" | head -1 | cut -c1-120))"
passed=$((passed + 1))
kill "${pids[-1]}" 2>/dev/null || true
wait "${pids[-1]}" 2>/dev/null || true

# Forcing shm between stages that cannot share memory is a clear error: a
# ring below the minimum is refused at start-up.
if "$bin/gpipe-worker" --data_plane shm --shm_ring_bytes 1000 >"$work/bad.log" 2>&1; then
  fail "gpipe-worker accepted --shm_ring_bytes 1000"
fi
grep -q "shm_ring_bytes 1000 is outside" "$work/bad.log" || { cat "$work/bad.log"; fail "no clear error for a tiny ring"; }
if "$bin/gpipe-worker" --data_plane fast >"$work/bad.log" 2>&1; then
  fail "gpipe-worker accepted --data_plane fast"
fi
grep -q "must be auto, grpc or shm" "$work/bad.log" || { cat "$work/bad.log"; fail "no clear error for --data_plane fast"; }
echo "ok: bad --data_plane flags are refused"
passed=$((passed + 1))

# memfd segments have no name: nothing of ours may appear in /dev/shm (other
# tests running beside this one may put their own files there).
left=$(find /dev/shm -newer "$work/start" -iname '*gpipe*' 2>/dev/null)
[[ -z "$left" ]] || fail "files left in /dev/shm: $left"
echo "$passed passed, 0 failed"
