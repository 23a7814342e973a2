#!/usr/bin/env bash
# Our reference trainer against PyTorch on the example models, same steps,
# warm-up, threads and micro-batches on both sides; then the GEMM benchmark.
#   bench/compare_torch.sh [THREADS]       (default: all cores)
#   SIZES=1 bench/compare_torch.sh 1       the sizes users train instead,
#     where fixed overheads do not flatter us:
#     bench/mlp_1024.json (784 -> 7 x 1024 -> 10, batch 256, SGD),
#     bench/mlp_4096.json (784 -> 3 x 4096 -> 10, batch 256, SGD),
#     bench/transformer_lm.json (4 blocks of dim 256, 4 heads, sequence 128,
#     batch 32, AdamW with clipping),
#     bench/transformer_lm_512.json (8 blocks of dim 512, 8 heads, sequence
#     256, batch 16, AdamW with clipping; ~10 s a step on one core),
#     bench/transformer_lm_32k.json (transformer_lm.json with a 32000-token
#     vocabulary: the head and the loss at a real language model's width),
#     bench/cnn_256.json (the CNN example at batch 256)
#     each at MICRO micro-batches (default "1 8": the whole batch, and the
#     eighth a stage of an 8-micro-batch pipeline sees); SPECS="a.json b.json"
#     picks some of them
# Environment: STEPS (default 20; 4 with SIZES), WARMUP (default 3; 2 with
# SIZES), ROUNDS (default 2), PYTHON (a python3 that can import torch).
# Builds nothing: run scripts/setup.sh --bench && scripts/build.sh first.
set -euo pipefail
cd "$(dirname "$0")/.."

threads=${1:-$(nproc)}
steps=${STEPS:-$([[ ${SIZES:-} == 1 ]] && echo 4 || echo 20)}
warmup=${WARMUP:-$([[ ${SIZES:-} == 1 ]] && echo 2 || echo 3)}
rounds=${ROUNDS:-2}
specs=(examples/fashion_mnist_mlp.json examples/char_transformer.json
       examples/fashion_mnist_cnn.json)
micros=(0)  # 0: the spec's own micro-batches
if [[ ${SIZES:-} == 1 ]]; then
  specs=(bench/mlp_1024.json bench/mlp_4096.json bench/transformer_lm.json
         bench/transformer_lm_512.json bench/transformer_lm_32k.json
         bench/cnn_256.json)
  read -r -a micros <<< "${MICRO:-1 8}"
fi
if [[ -n ${SPECS:-} ]]; then read -r -a specs <<< "$SPECS"; fi

for bin in build/bench/step_bench build/bench/gemm_bench; do
  if [[ ! -x $bin ]]; then
    echo "compare_torch: $bin is missing; run scripts/build.sh first" >&2
    exit 1
  fi
done
python=${PYTHON:-}
if [[ -z $python ]]; then
  # Debian's python3-torch lives in /usr/bin/python3's dist-packages; a
  # python3 earlier on PATH (pyenv, venv) may not see it.
  for candidate in python3 /usr/bin/python3; do
    if "$candidate" -c 'import torch' 2>/dev/null; then python=$candidate; break; fi
  done
fi
if [[ -z $python ]]; then
  echo "compare_torch: no python3 can import torch; run scripts/setup.sh --bench" >&2
  exit 1
fi

logs=$(mktemp -d /tmp/compare_torch.XXXXXX)
echo "compare_torch: $threads threads, $warmup warm-up + $steps timed steps, best median of $rounds rounds"
echo "  environment (left as it is for both sides): OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE-(unset)}" \
     "OPENBLAS_L2_SIZE=${OPENBLAS_L2_SIZE-(unset)}"
echo "  python: $python; full outputs in $logs"
echo "  load average at start: $(cut -d' ' -f1-3 /proc/loadavg) (other work on the cores skews both sides)"
echo

median() { awk '/^ms\/step:/ { print $3 }' "$1"; }
best() { if [[ -z $1 ]] || awk -v a="$2" -v b="$1" 'BEGIN { exit !(a < b) }'; then echo "$2"; else echo "$1"; fi; }

rows=()
for spec in "${specs[@]}"; do
 for micro in "${micros[@]}"; do
  name=$(basename "$spec" .json)
  if [[ $micro != 0 ]]; then name="$name M=$micro"; fi
  log=${name// /.}
  ours_best="" torch_best=""
  for ((r = 1; r <= rounds; ++r)); do
    build/bench/step_bench "$spec" --steps "$steps" --warmup "$warmup" \
      --threads "$threads" --micro-batches "$micro" > "$logs/$log.ours.$r.txt"
    ours_best=$(best "$ours_best" "$(median "$logs/$log.ours.$r.txt")")
    "$python" bench/torch_step.py "$spec" --steps "$steps" --warmup "$warmup" \
      --threads "$threads" --micro-batches "$micro" > "$logs/$log.torch.$r.txt"
    torch_best=$(best "$torch_best" "$(median "$logs/$log.torch.$r.txt")")
  done
  echo "== $name: last round"
  sed -n '/^ms\/step:/,/^peak:/p' "$logs/$log.ours.$rounds.txt" | sed 's/^/  ours   /'
  grep '^ms/step:' "$logs/$log.torch.$rounds.txt" | sed 's/^/  torch  /'
  grep -h '^warning:' "$logs/$log.ours.$rounds.txt" || true
  rows+=("$log $ours_best $torch_best")
 done
done

echo
suite=$([[ ${SIZES:-} == 1 ]] && echo sizes || echo examples)
echo "== gemm_bench --threads $threads --suite $suite"
build/bench/gemm_bench --threads "$threads" --suite "$suite" | tee "$logs/gemm_bench.txt"

echo
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== step time, best median of $rounds rounds ($threads threads; goal: ours/torch <= 0.8)"
printf '%-26s %14s %14s %11s\n' model "ours ms/step" "torch ms/step" ours/torch
for row in "${rows[@]}"; do
  read -r name ours torch <<< "$row"
  printf '%-26s %14.2f %14.2f %11.2f\n' "${name//./ }" "$ours" "$torch" \
    "$(awk -v a="$ours" -v b="$torch" 'BEGIN { print a / b }')"
done
echo
echo "ours gathers each batch from the dataset on a thread of its own during the"
echo "step before; torch reuses one random batch (no data loading), so its figure"
echo "is a lower bound for a PyTorch loop."
