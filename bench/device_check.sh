#!/usr/bin/env bash
# The GPU checks in one run, as the first command on a GPU machine that has
# none of our dependencies (see bench/device_pack.sh): unpack the carried
# binaries and libraries, find cuBLAS (and cuDNN, optional) and the driver
# there, run the CUDA tests (the CNN ones with and without cuDNN when it is
# there), gpu_bench (sgemm against cuBLAS's peak, convolutions, training
# steps), the same training steps in PyTorch, and print a PASS/FAIL summary.
# Logs go to $OUT.
#   bash .devcarry/device_check.sh      (from the checkout's root)
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-/tmp/gpipe-device-out}
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
tar -C "$work" -xJf "$here/gpipe-device.tar.xz" || { echo "FAIL: unpack"; exit 1; }
exec > >(tee "$out/device_check.log") 2>&1
echo "== machine"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
uname -srm
ls -d /usr/local/cuda*/ 2>/dev/null
find /usr/local /usr/lib /opt -name 'libcublas.so*' -o -name 'libcudnn.so*' \
  2>/dev/null | head -12
# cuBLAS 13 and cuDNN 9 (optional): the toolkit's, or python's nvidia
# packages'. The first cuDNN directory found is the one used.
libdirs=()
cudnn_dir=
for d in /usr/local/cuda/lib64 /usr/local/cuda*/lib64 /usr/local/cuda*/lib \
         /usr/local/cuda*/targets/x86_64-linux/lib /usr/lib/x86_64-linux-gnu \
         /opt/torch/.venv/lib/python3*/site-packages/nvidia/*/lib \
         /usr/local/lib/python3*/dist-packages/nvidia/*/lib; do
  [[ -d $d ]] || continue
  ls "$d"/libcublas.so.13* >/dev/null 2>&1 && libdirs+=("$d")
  if [[ -z $cudnn_dir ]] && ls "$d"/libcudnn.so.9* >/dev/null 2>&1; then
    cudnn_dir=$d
    [[ " ${libdirs[*]} " == *" $d "* ]] || libdirs+=("$d")
  fi
done
echo "cuDNN: ${cudnn_dir:-none found (convolutions use our im2col path)}"
driver=$(ldconfig -p | awk '/libcuda.so.1 / {print $NF; exit}')
[[ -n $driver ]] && libdirs+=("$(dirname "$driver")")
path="$work/lib"
for d in "${libdirs[@]}"; do path="$path:$d"; done
echo "library path: $path"
run() {
  local secs=$1
  shift
  timeout "$secs" "$work/lib/ld-linux-x86-64.so.2" --library-path "$path" \
    "$work/bin/$1" "${@:2}"
}
export GPIPE_EXAMPLES="$work/bench"
declare -A result
echo "== tests"
# check NAME LOG: PASS when the run exited 0 and skipped nothing.
check() {
  local name=$1 log=$2 rc=$3
  local skipped
  skipped=$(grep -c '^\[  SKIPPED' "$log")
  tail -4 "$log"
  if ((rc == 0 && skipped == 0)); then result[$name]=PASS; else
    result[$name]="FAIL (rc $rc, $skipped skipped)"; grep -B2 -A8 'Failure\|SKIPPED\|error' "$log" | head -60; fi
}
for t in tensor_caching_allocator_test cuda_kernels_test cuda_layers_test \
         cuda_cnn_test; do
  run 180 "$t" --gtest_brief=0 > "$out/$t.log" 2>&1
  check "$t" "$out/$t.log" $?
done
tests=(tensor_caching_allocator_test cuda_kernels_test cuda_layers_test
       cuda_cnn_test cuda_cudnn_test)
if [[ -n $cudnn_dir ]]; then
  # The layers went through cuDNN above; our own convolution path too.
  GPIPE_CUDNN=0 run 120 cuda_cnn_test --gtest_brief=0 \
    > "$out/cuda_cnn_test_own.log" 2>&1
  check cuda_cnn_test_own "$out/cuda_cnn_test_own.log" $?
  tests+=(cuda_cnn_test_own)
  run 120 cuda_cudnn_test --gtest_brief=0 > "$out/cuda_cudnn_test.log" 2>&1
  check cuda_cudnn_test "$out/cuda_cudnn_test.log" $?
else
  run 120 cuda_cudnn_test > "$out/cuda_cudnn_test.log" 2>&1
  rc=$?
  grep -h 'cuDNN' "$out/cuda_cudnn_test.log" | head -2
  result[cuda_cudnn_test]=$([[ $rc == 0 ]] && echo "PASS (skipped: no cuDNN here)" || echo "FAIL (rc $rc)")
fi
echo "== gpu_bench"
run 240 gpu_bench "$work/bench/gpu_mlp.json" "$work/bench/gpu_wide_mlp.json" \
  "$work/bench/gpu_cnn.json" --steps 50 | tee "$out/gpu_bench.log"
result[gpu_bench]=$([[ ${PIPESTATUS[0]} == 0 ]] && echo PASS || echo FAIL)
echo "== torch (same models, same batch, AdamW, one CUDA device)"
py=python3
[[ -x /opt/torch/.venv/bin/python3 ]] && py=/opt/torch/.venv/bin/python3
cat > "$work/torch_gpu_step.py" <<'PY'
import json, statistics, sys, time
import torch, torch.nn as nn
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
dev = torch.device("cuda")
for path in sys.argv[1:]:
    spec = json.load(open(path))
    layers, acts = [], {"relu": nn.ReLU, "gelu": nn.GELU, "tanh": nn.Tanh,
                        "flatten": nn.Flatten}
    dims = spec["model"]["input"]["shape"]["dims"]
    image = len(dims) == 3
    for l in spec["model"]["layers"]:
        (kind, a), = l.items()
        if kind == "linear": layers.append(nn.Linear(a["inFeatures"], a["outFeatures"]))
        elif kind == "layerNorm": layers.append(nn.LayerNorm(a["features"]))
        elif kind == "conv2d":
            layers.append(nn.Conv2d(a["inChannels"], a["outChannels"], a["kernelSize"],
                                    a.get("stride", 1), a.get("padding", 0)))
        elif kind == "batchNorm":
            layers.append((nn.BatchNorm2d if image else nn.BatchNorm1d)(a["features"]))
        elif kind == "maxPool2d":
            layers.append(nn.MaxPool2d(a["kernelSize"], a.get("stride", a["kernelSize"])))
        elif kind == "dropout": layers.append(nn.Dropout(a["p"]))
        else:
            layers.append(acts[kind]())
            image = image and kind != "flatten"
    model = nn.Sequential(*layers).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=1e-4)
    b = spec["batchSize"]
    x = torch.randn(b, *dims, device=dev)
    y = torch.randint(0, 10, (b,), device=dev)
    def step():
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss.item()  # one sync per step, as ours
    for _ in range(5): step()
    secs = []
    for _ in range(50):
        t = time.perf_counter(); step(); secs.append(time.perf_counter() - t)
    print(f"torch step {path}: ms/step {1e3 * statistics.median(secs):.3f}")
PY
timeout 200 "$py" "$work/torch_gpu_step.py" "$work/bench/gpu_mlp.json" \
  "$work/bench/gpu_wide_mlp.json" "$work/bench/gpu_cnn.json" | tee "$out/torch.log"
result[torch]=$([[ ${PIPESTATUS[0]} == 0 ]] && echo PASS || echo FAIL)
echo "== summary"
status=0
for k in "${tests[@]}" gpu_bench torch; do
  echo "$k: ${result[$k]:-FAIL (not run)}"
  [[ ${result[$k]:-} == PASS* ]] || status=1
done
echo "overall: $([[ $status == 0 ]] && echo PASS || echo FAIL)"
exit $status
