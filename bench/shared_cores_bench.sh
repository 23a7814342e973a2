#!/usr/bin/env bash
# Trainings that share this machine's cores, with libgomp's default waiting
# (threads spin at a barrier before they sleep) against OMP_WAIT_POLICY=PASSIVE
# (they sleep at once), the setting the images, `gpipectl local` and the test
# suite use. N processes of `gpipectl train` (T compute threads each, the
# Fashion-MNIST CNN for STEPS steps) start together; the figure is the wall
# time until the last ends. Rounds alternate default and passive so that load
# drifting on a shared machine hits both alike; read the median ratio.
# Usage: bench/shared_cores_bench.sh [N] [T] [STEPS] [ROUNDS]   (defaults 3, 2, 60, 3)
# Needs build/bin (scripts/build.sh) and the dataset (scripts/setup.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-3}
threads=${2:-2}
steps=${3:-60}
rounds=${4:-3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Wall seconds for N trainings started together under one wait policy
# ("" keeps libgomp's default).
together() {
  local policy=$1 start end i
  start=$(date +%s.%N)
  for ((i = 0; i < n; i++)); do
    if [[ -n $policy ]]; then
      OMP_WAIT_POLICY=$policy build/bin/gpipectl train examples/fashion_mnist_cnn.json \
        --stages 1 --steps "$steps" --threads "$threads" --out "$work/$i" >"$work/$i.log" 2>&1 &
    else
      env -u OMP_WAIT_POLICY build/bin/gpipectl train examples/fashion_mnist_cnn.json \
        --stages 1 --steps "$steps" --threads "$threads" --out "$work/$i" >"$work/$i.log" 2>&1 &
    fi
  done
  wait
  end=$(date +%s.%N)
  for ((i = 0; i < n; i++)); do
    if ! grep -q "^final:" "$work/$i.log"; then
      echo "training $i failed:" >&2
      cat "$work/$i.log" >&2
      exit 1
    fi
  done
  echo "$end - $start" | bc
}

echo "cores: $(nproc), $n trainings x $threads threads, $steps steps each"
# Alone, nobody waits for the spinning core: what passive costs at most.
alone_spin=$(n=1 together "")
alone_sleep=$(n=1 together PASSIVE)
printf "one training alone: default %.2f s, passive %.2f s\n" "$alone_spin" "$alone_sleep"
ratios=()
for ((r = 1; r <= rounds; r++)); do
  spin=$(together "")
  sleep_=$(together PASSIVE)
  ratio=$(echo "scale=3; $spin / $sleep_" | bc)
  ratios+=("$ratio")
  printf "round %d: default (spin) %.2f s, passive %.2f s, ratio %.2f\n" "$r" "$spin" "$sleep_" "$ratio"
done
median=$(printf "%s\n" "${ratios[@]}" | sort -n | sed -n "$(((rounds + 1) / 2))p")
printf "median default/passive: %.2f (above 1: passive is faster)\n" "$median"
