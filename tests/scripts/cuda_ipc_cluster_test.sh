#!/usr/bin/env bash
# The CUDA IPC data plane on local clusters of GPU stages (real processes on
# one host and one GPU): a 2- and a 3-stage cluster with --device cuda
# --data_plane cuda_ipc end with parameters bitwise equal to the same cluster
# on gRPC frames, and the workers say in their logs (and the job status per
# stage) that CUDA IPC carried the tensors. Skipped without a GPU.
# GPIPE_CUDA_IPC_STEPS changes the step count.
#   cuda_ipc_cluster_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1
src=$2
bin="$build/bin"
steps=${GPIPE_CUDA_IPC_STEPS:-6}
source "$src/tests/scripts/processes_lib.sh"
skip_unless_built gpipectl gpipe-controller gpipe-worker
fail() { echo "FAIL: $*" >&2; exit 1; }
same() { python3 "$src/tests/scripts/same_tensors.py" "$1" "$2" || fail "$3"; }

passed=0
# Forcing CUDA IPC on CPU stages is refused at start-up, clearly.
if "$bin/gpipe-worker" --data_plane cuda_ipc --device cpu >"$work/bad.log" 2>&1; then
  fail "gpipe-worker accepted --data_plane cuda_ipc on the CPU"
fi
grep -q "cuda_ipc needs the stages on the GPU" "$work/bad.log" ||
  { cat "$work/bad.log"; fail "no clear error for cuda_ipc on the CPU"; }
echo "ok: --data_plane cuda_ipc with --device cpu is refused"
passed=$((passed + 1))

if ! nvidia-smi -L >/dev/null 2>&1; then
  echo "SKIP: the clusters on the GPU: no GPU (nvidia-smi -L failed)"
  echo "$passed passed, 0 failed"
  exit 0
fi
# spec stages micro-batches
for run in "bench/gpu_mlp.json 2 4" "examples/char_transformer.json 3 3"; do
  read -r spec stages mbs <<<"$run"
  name=$(basename "$spec" .json)
  for plane in grpc cuda_ipc; do
    "$bin/gpipectl" local "$src/$spec" --workers "$stages" --stages "$stages" \
      --micro-batches "$mbs" --steps "$steps" --threads 2 --device cuda \
      --data_plane "$plane" --json --keep "$work/$name-$plane" \
      --out "$work/$name-$plane-out" >"$work/$name-$plane.log" 2>&1 ||
      { tail -30 "$work/$name-$plane.log"; fail "$name on $plane"; }
  done
  same "$work/$name-cuda_ipc-out/model.safetensors" \
    "$work/$name-grpc-out/model.safetensors" \
    "$name: CUDA IPC and gRPC frames give different parameters on the GPU"
  for plane in grpc cuda_ipc; do
    n=$(cat "$work/$name-$plane"/worker-*.log |
      grep -c "data plane to stage [0-9]* is $plane (--data_plane $plane)" || true)
    [[ "$n" == $((stages - 1)) ]] ||
      fail "$name: $n of $((stages - 1)) links logged data plane $plane"
  done
  grep -q '"dataPlane":"cuda_ipc"' "$work/$name-cuda_ipc.log" ||
    fail "$name: no job status shows a stage with dataPlane cuda_ipc"
  echo "ok: $name, $stages stages on the GPU: cuda_ipc bitwise equal to grpc frames"
  passed=$((passed + 1))
done

echo "$passed passed, 0 failed"
