#!/usr/bin/env bash
# Data-parallel replicas on a local cluster (real processes, gRPC on
# loopback): K stages x R replicas on K x R workers, the replicas of each
# stage summing their gradients over their own links. With the gradient
# groups pinned in the spec (4), the final parameters are bitwise those of
# the single-process reference trainer and of `gpipectl train --replicas R`
# for every K in 1..3 x R in {1, 2, 4} x GPipe and 1F1B (the CNN too:
# batch norm's running averages move by every replica's micro-batches in
# order); the job's events name the grid; the traces of both (`--trace`)
# have a track per replica and stage; a cluster short of workers says how
# many it needs.
#   replicas_cluster_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1
src=$2
bin="$build/bin"
steps=${GPIPE_REPLICA_STEPS:-8}
for b in gpipectl gpipe-controller gpipe-worker; do
  [[ -x "$bin/$b" ]] || { echo "SKIP: $bin/$b is not built"; echo "0 passed, 0 failed"; exit 0; }
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
same() { python3 "$src/tests/scripts/same_tensors.py" "$1" "$2" || fail "$3"; }

# The main job's deep MLP with four gradient groups in its spec: the tree
# every R in {1, 2, 4} sums in. Its own schedule (ZB-H1) runs one group a
# replica only, so the spec says 1F1B (each run below names its schedule),
# and it re-materializes as the traces below expect.
with_groups() {
  python3 - "$1" "$2" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
d["pipeline"]["gradientGroups"] = 4
d["pipeline"]["schedule"] = "ONE_F_ONE_B"
d["pipeline"]["remat"] = "EXCEPT_LAST"
json.dump(d, open(sys.argv[2], "w"))
PY
}
spec="$work/deep_mlp_groups.json"
with_groups "$src/examples/fashion_mnist_deep_mlp.json" "$spec"
common=(--micro-batches 4 --steps "$steps")
"$bin/gpipectl" train "$spec" --stages 1 "${common[@]}" \
  --out "$work/reference" >"$work/log" 2>&1 || { cat "$work/log"; fail "reference"; }

passed=0
# Every K in 1..3 x R in {1, 2, 4} x both schedules (up to 12 workers).
configs=()
for k in 1 2 3; do
  for r in 1 2 4; do
    for schedule in 1f1b gpipe; do configs+=("$k $r $schedule"); done
  done
done
for config in "${configs[@]}"; do
  read -r k r schedule <<<"$config"
  name="k$k-r$r-$schedule"
  # One stage of one replica in process is the reference trainer itself.
  runs=(cluster)
  if ((k > 1 || r > 1)); then
    "$bin/gpipectl" train "$spec" --stages "$k" --replicas "$r" "${common[@]}" \
      --schedule "$schedule" --out "$work/$name-inprocess" \
      --trace "$work/$name-inprocess-trace" >"$work/log" 2>&1 ||
      { cat "$work/log"; fail "$name: in-process"; }
    runs+=(inprocess)
  fi
  "$bin/gpipectl" local "$spec" --stages "$k" --replicas "$r" "${common[@]}" \
    --schedule "$schedule" --threads 2 --out "$work/$name-cluster" \
    --trace "$work/$name-cluster-trace" \
    >"$work/log" 2>&1 || { tail -30 "$work/log"; fail "$name: local cluster"; }
  # One track per (replica, stage), each with its share of the micro-batches.
  for run in "${runs[@]}"; do
    python3 "$src/tests/scripts/check_trace.py" "$work/$name-$run-trace/trace.json" \
      "$work/$name-$run-trace/timeline.svg" --stages "$k" --replicas "$r" \
      --micro-batches 4 ||
      fail "$name: the $run trace does not show every replica's stages"
  done
  if ((r > 1)); then
    grep -qE "$k stages? x $r replicas" "$work/log" ||
      { tail -30 "$work/log"; fail "$name: the job's events do not name the grid"; }
  fi
  same "$work/$name-cluster/model.safetensors" "$work/reference/model.safetensors" \
    "$name: cluster differs from the reference trainer"
  if [[ -d "$work/$name-inprocess" ]]; then
    same "$work/$name-cluster/model.safetensors" "$work/$name-inprocess/model.safetensors" \
      "$name: cluster differs from gpipectl train --replicas $r"
  fi
  echo "ok: $name bitwise equal to the reference"
  passed=$((passed + 1))
done

# The CNN (two batch norms) on 2 x 2: the running averages, which the
# snapshot holds, move by all four micro-batches in order on both
# replicas; replica 0 writes them.
cnn="$work/cnn_groups.json"
with_groups "$src/examples/fashion_mnist_cnn.json" "$cnn"
"$bin/gpipectl" train "$cnn" --stages 1 --micro-batches 4 --steps 4 \
  --out "$work/cnn-reference" >"$work/log" 2>&1 || { cat "$work/log"; fail "CNN reference"; }
"$bin/gpipectl" local "$cnn" --stages 2 --replicas 2 --micro-batches 4 --steps 4 \
  --threads 2 --out "$work/cnn-cluster" >"$work/log" 2>&1 ||
  { tail -30 "$work/log"; fail "CNN on 2 stages x 2 replicas"; }
same "$work/cnn-cluster/model.safetensors" "$work/cnn-reference/model.safetensors" \
  "CNN 2 x 2: cluster differs from the reference trainer (batch norm)"
echo "ok: CNN with batch norm on 2 x 2 bitwise equal to the reference"
passed=$((passed + 1))

# Fewer workers than K x R: refused before anything starts, by count.
if "$bin/gpipectl" local "$spec" --stages 2 --replicas 2 --workers 3 \
  "${common[@]}" >"$work/log" 2>&1; then
  fail "3 workers for 2 stages x 2 replicas were accepted"
fi
grep -q "fewer than the job's 4 workers (2 stages x 2 replicas)" "$work/log" ||
  { cat "$work/log"; fail "the refusal does not say what the job needs"; }
echo "ok: too few workers refused by name"
passed=$((passed + 1))
echo "$passed passed, 0 failed"
