#!/usr/bin/env bash
# Each example on a local 4-worker cluster (real processes, gRPC on
# loopback), every schedule: the final parameters are bitwise those of
# `gpipectl train` in-process with the same K and M, and of the
# single-process reference trainer with the same M. Steps are cut to keep
# this a few minutes on 2 cores (GPIPE_CLUSTER_STEPS changes it).
#   cluster_examples_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1
src=$2
bin="$build/bin"
steps=${GPIPE_CLUSTER_STEPS:-12}
for b in gpipectl gpipe-controller gpipe-worker; do
  [[ -x "$bin/$b" ]] || { echo "SKIP: $bin/$b is not built"; echo "0 passed, 0 failed"; exit 0; }
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
same() { python3 "$src/tests/scripts/same_tensors.py" "$1" "$2" || fail "$3"; }

passed=0
for example in fashion_mnist_deep_mlp fashion_mnist_mlp fashion_mnist_cnn char_transformer; do
  spec="$src/examples/$example.json"
  common=(--stages 4 --micro-batches 4 --steps "$steps")
  "$bin/gpipectl" train "$spec" --stages 1 --micro-batches 4 --steps "$steps" \
    --out "$work/$example-reference" >"$work/log" 2>&1 || { cat "$work/log"; fail "$example: reference"; }
  for schedule in gpipe 1f1b zb-h1; do
    "$bin/gpipectl" train "$spec" "${common[@]}" --schedule "$schedule" \
      --out "$work/$example-$schedule-inprocess" >"$work/log" 2>&1 ||
      { cat "$work/log"; fail "$example $schedule: in-process"; }
    "$bin/gpipectl" local "$spec" --workers 4 "${common[@]}" --schedule "$schedule" \
      --threads 2 --out "$work/$example-$schedule-cluster" >"$work/log" 2>&1 ||
      { tail -30 "$work/log"; fail "$example $schedule: local cluster"; }
    same "$work/$example-$schedule-cluster/model.safetensors" \
      "$work/$example-$schedule-inprocess/model.safetensors" \
      "$example $schedule: cluster differs from the in-process pipeline"
    same "$work/$example-$schedule-cluster/model.safetensors" \
      "$work/$example-reference/model.safetensors" \
      "$example $schedule: cluster differs from the reference trainer"
    echo "ok: $example $schedule"
    passed=$((passed + 1))
  done
done
echo "$passed passed, 0 failed"
