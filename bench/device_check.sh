#!/usr/bin/env bash
# The GPU checks in one run, as the first command on a GPU machine that has
# none of our dependencies (see bench/device_pack.sh): unpack the carried
# binaries and libraries, find cuBLAS and the driver there, run the CUDA
# tests, gpu_bench (sgemm against cuBLAS's peak, training steps), the same
# training step in PyTorch, and print a PASS/FAIL summary. Logs go to $OUT.
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
find /usr/local /usr/lib /opt -name 'libcublas.so*' 2>/dev/null | head -8
# cuBLAS 13: the toolkit's, or python's nvidia packages'.
libdirs=()
for d in /usr/local/cuda/lib64 /usr/local/cuda*/lib64 \
         /usr/local/cuda*/targets/x86_64-linux/lib \
         /opt/torch/.venv/lib/python3*/site-packages/nvidia/*/lib \
         /usr/local/lib/python3*/dist-packages/nvidia/*/lib; do
  [[ -d $d ]] && ls "$d"/libcublas.so.13* >/dev/null 2>&1 && libdirs+=("$d")
done
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
for t in tensor_caching_allocator_test cuda_kernels_test cuda_layers_test; do
  run 180 "$t" --gtest_brief=0 > "$out/$t.log" 2>&1
  rc=$?
  skipped=$(grep -c '^\[  SKIPPED' "$out/$t.log")
  tail -4 "$out/$t.log"
  if ((rc == 0 && skipped == 0)); then result[$t]=PASS; else
    result[$t]="FAIL (rc $rc, $skipped skipped)"; grep -B2 -A8 'Failure\|SKIPPED\|error' "$out/$t.log" | head -60; fi
done
echo "== gpu_bench"
run 200 gpu_bench "$work/bench/gpu_mlp.json" "$work/bench/gpu_wide_mlp.json" \
  --steps 50 | tee "$out/gpu_bench.log"
result[gpu_bench]=$([[ ${PIPESTATUS[0]} == 0 ]] && echo PASS || echo FAIL)
echo "== torch (same models, same batch, AdamW, one CUDA device)"
py=python3
[[ -x /opt/torch/.venv/bin/python3 ]] && py=/opt/torch/.venv/bin/python3
cat > "$work/torch_gpu_step.py" <<'PY'
import json, statistics, sys, time
import torch, torch.nn as nn
torch.backends.cuda.matmul.allow_tf32 = False
dev = torch.device("cuda")
for path in sys.argv[1:]:
    spec = json.load(open(path))
    layers, acts = [], {"relu": nn.ReLU, "gelu": nn.GELU, "tanh": nn.Tanh}
    for l in spec["model"]["layers"]:
        (kind, a), = l.items()
        if kind == "linear": layers.append(nn.Linear(a["inFeatures"], a["outFeatures"]))
        elif kind == "layerNorm": layers.append(nn.LayerNorm(a["features"]))
        else: layers.append(acts[kind]())
    model = nn.Sequential(*layers).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=1e-4)
    b, f = spec["batchSize"], spec["model"]["input"]["shape"]["dims"][0]
    x = torch.randn(b, f, device=dev)
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
  "$work/bench/gpu_wide_mlp.json" | tee "$out/torch.log"
result[torch]=$([[ ${PIPESTATUS[0]} == 0 ]] && echo PASS || echo FAIL)
echo "== summary"
status=0
for k in tensor_caching_allocator_test cuda_kernels_test cuda_layers_test gpu_bench torch; do
  echo "$k: ${result[$k]:-FAIL (not run)}"
  [[ ${result[$k]:-} == PASS ]] || status=1
done
echo "overall: $([[ $status == 0 ]] && echo PASS || echo FAIL)"
exit $status
