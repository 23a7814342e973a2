#!/usr/bin/env bash
# gpipectl plan end to end: every schedule is simulated (interleaved where
# M is a multiple of K), the spec's own configuration is printed as a row,
# the default K range grows past 8 while the best K sits at its end, and a
# memory budget nothing fits is an error that names the smallest.
#   plan_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1
src=$2
gpipectl="$build/bin/gpipectl"
[[ -x "$gpipectl" ]] || { echo "SKIP: $gpipectl is not built"; exit 0; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
flops=(--flops 1e11 --memory-gbps 25)  # the same costs on any machine

# One K and M: a row per schedule, then the spec's own (K=4, M=8, zb-h1,
# remat never).
"$gpipectl" plan "$src/examples/fashion_mnist_deep_mlp.json" --stages 2 \
  --micro-batches 8 --remat never "${flops[@]}" >"$work/one" 2>&1 ||
  { cat "$work/one"; fail "plan --stages 2 --micro-batches 8"; }
for schedule in gpipe 1f1b zb-h1 interleaved/2 zb-v/2; do
  grep -Eq "^[ *]    2     8  $schedule +never " "$work/one" ||
    { cat "$work/one"; fail "no row for $schedule"; }
done
grep -Eq '^=    4     8  zb-h1 +never .*\(the job spec.s own\)' "$work/one" ||
  { cat "$work/one"; fail "the spec's own configuration is not a row"; }
# ZB-H1 has the least bubble of the four at M = 8 on equal stages.
grep -q '^best: K=2 M=8 schedule zb-h1 remat never' "$work/one" ||
  { cat "$work/one"; fail "zb-h1 is not the best at K=2, M=8"; }
grep -Eq '^    0/1  \[' <("$gpipectl" plan "$src/examples/fashion_mnist_deep_mlp.json" \
  --stages 2 --micro-batches 8 --schedule interleaved --remat never "${flops[@]}") ||
  fail "the interleaved plan does not list each stage's chunks"
echo "ok: one configuration, every schedule, the spec's row"

# A model deep enough that more than 8 stages pay: the default range grows.
layers=""
for i in $(seq 1 32); do
  layers+="${layers:+,}{\"linear\": {\"inFeatures\": 512, \"outFeatures\": 512}}, {\"relu\": {}}"
done
cat >"$work/deep.json" <<JSON
{"model": {"input": {"dtype": "FLOAT32", "shape": {"dims": [512]}},
           "layers": [$layers],
           "loss": {"softmaxCrossEntropy": {}}},
 "optimizer": {"lr": 0.01, "sgd": {}},
 "data": {"synthetic": {"task": "CLASSES", "features": 512, "classes": 512,
                        "trainSamples": 1024, "testSamples": 16}},
 "pipeline": {"stages": 2, "microBatches": 8},
 "batchSize": 1024, "steps": 10}
JSON
"$gpipectl" plan "$work/deep.json" --micro-batches 64 --remat never \
  "${flops[@]}" >"$work/deep" 2>&1 || { cat "$work/deep"; fail "plan deep.json"; }
grep -q '^K went past 8 to ' "$work/deep" ||
  { cat "$work/deep"; fail "the range did not grow past 8"; }
best_k=$(sed -n 's/^best: K=\([0-9]*\) .*/\1/p' "$work/deep")
((best_k > 8)) || { cat "$work/deep"; fail "best K $best_k is not past 8"; }
# Asked for 1..8, it stays there.
"$gpipectl" plan "$work/deep.json" --stages-range 1..8 --micro-batches 64 \
  --remat never "${flops[@]}" >"$work/capped" 2>&1 || fail "plan --stages-range 1..8"
grep -q '^best: K=8 ' "$work/capped" || { cat "$work/capped"; fail "1..8 went past 8"; }
! grep -q 'K went past' "$work/capped" || fail "an explicit range grew"
echo "ok: the default range grows to K=$best_k"

# A budget nothing fits: exit 1, naming the smallest configuration.
if "$gpipectl" plan "$src/examples/fashion_mnist_mlp.json" --memory-budget 1KiB \
  "${flops[@]}" >"$work/budget" 2>&1; then
  fail "a 1 KiB budget was met"
fi
grep -q 'no configuration fits the memory budget; the smallest needs' "$work/budget" ||
  { cat "$work/budget"; fail "no message for the budget"; }
# In its own unit (it read "budget 0.00 MiB").
grep -q 'budget 1.00 KiB$' "$work/budget" || { cat "$work/budget"; fail "the 1 KiB budget is not shown as such"; }
grep -q '^bubble: the share of the step the busiest stage idles' "$work/budget" ||
  { cat "$work/budget"; fail "the bubble and max columns are not explained"; }
echo "ok: a budget nothing fits"

# A budget the spec's own configuration is over, while others fit: the
# plan is printed, and the status is 3, as workers of that memory would
# refuse the spec at submit (it was 0).
"$gpipectl" plan "$src/examples/fashion_mnist_deep_mlp.json" "${flops[@]}" \
  >"$work/own" 2>&1 || { cat "$work/own"; fail "plan of the deep MLP"; }
# The rows' peak (MiB) is the column before the balance.
read -r own_mib between < <(python3 - "$work/own" <<'PY'
import re, sys
own, least = None, None
for line in open(sys.argv[1]):
    m = re.match(r"^([ *!=]) +\d+ +\d+ .* ([0-9.]+) +[0-9,]+(  \(the job spec's own\))?$", line.rstrip("\n"))
    if not m:
        continue
    peak = float(m.group(2))
    if m.group(3):
        own = m.group(2)
    least = peak if least is None else min(least, peak)
print(own or "", f"{(float(own) + least) / 2:.2f}MiB" if own and least < float(own) else "")
PY
)
[[ -n "$own_mib" ]] || { cat "$work/own"; fail "no own row"; }
if [[ -n "$between" ]]; then
  set +e
  "$gpipectl" plan "$src/examples/fashion_mnist_deep_mlp.json" "${flops[@]}" \
    --memory-budget "$between" >"$work/over" 2>&1
  over_rc=$?
  set -e
  ((over_rc == 3)) || { cat "$work/over"; fail "the spec's own over a $between budget: exit $over_rc, not 3"; }
  grep -q "the job spec's own configuration does not run: its largest stage needs $own_mib MiB, over" "$work/over" ||
    { cat "$work/over"; fail "the over-budget spec is not said"; }
  echo "ok: the spec's own configuration over a $between budget exits 3"
fi

# Link latency: every message pays it, so the spec's step grows by at least
# the latency of the messages on its critical path; a negative one is
# refused by name.
spec_ms() { sed -n 's/^=  *\([0-9]*\)  *\([0-9]*\)  *[a-z0-9-]*  *[a-z_]*  *\([0-9.]*\) .*/\3/p' "$1"; }
"$gpipectl" plan "$src/examples/fashion_mnist_mlp.json" "${flops[@]}" \
  >"$work/lat0" 2>&1 || { cat "$work/lat0"; fail "plan at 0 us"; }
"$gpipectl" plan "$src/examples/fashion_mnist_mlp.json" "${flops[@]}" --link-latency-us 1000 \
  >"$work/lat1" 2>&1 || { cat "$work/lat1"; fail "plan --link-latency-us 1000"; }
grep -q 'links 10 Gb/s, 1000 us' "$work/lat1" || { head -3 "$work/lat1"; fail "the latency is not printed"; }
a=$(spec_ms "$work/lat0")
b=$(spec_ms "$work/lat1")
[[ -n "$a" && -n "$b" ]] || { cat "$work/lat0"; fail "no spec row"; }
python3 -c 'import sys; a, b = map(float, sys.argv[1:]); sys.exit(0 if b >= a + 2 else 1)' "$a" "$b" ||
  fail "1 ms of link latency moved the spec's step from $a to $b ms (want >= 2 ms more)"
if "$gpipectl" plan "$src/examples/fashion_mnist_mlp.json" --link-latency-us -1 >"$work/neg" 2>&1; then
  fail "a negative latency was taken"
fi
grep -q -- '--link-latency-us: must be in' "$work/neg" || { cat "$work/neg"; fail "the bad latency was not named"; }
if "$gpipectl" plan "$src/examples/fashion_mnist_mlp.json" --link-gbps inf >"$work/inf" 2>&1; then
  fail "an infinite link was taken"
fi
grep -q -- '--link-gbps: must be in' "$work/inf" || { cat "$work/inf"; fail "the infinite link was not named"; }
echo "ok: link latency ($a ms a step at 0 us, $b ms at 1000 us)"
# --workers N: each K also with R replicas (K x R <= N); fast links make
# replicas worth it, a link of 1 Mb/s does not (the gradient sum costs
# seconds), and a model with batch norm gets them too (its running
# averages move by every micro-batch, gathered from the replicas).
"$gpipectl" plan "$src/examples/fashion_mnist_deep_mlp.json" "${flops[@]}" \
  --workers 8 --stages-range 1..4 >"$work/r" 2>&1 || { cat "$work/r"; fail "plan --workers 8"; }
grep -q '^     K   R     M  schedule' "$work/r" || { cat "$work/r"; fail "no R column"; }
grep -q '^best: K=[0-9]* R=[248] ' "$work/r" || { cat "$work/r"; fail "replicas do not win on 10 Gb/s links"; }
"$gpipectl" plan "$src/examples/fashion_mnist_deep_mlp.json" "${flops[@]}" \
  --workers 8 --stages-range 1..4 --link-gbps 0.001 >"$work/slow" 2>&1 ||
  { cat "$work/slow"; fail "plan --workers 8 --link-gbps 0.001"; }
grep -q '^best: K=[0-9]* R=1 ' "$work/slow" || { cat "$work/slow"; fail "replicas win over 1 Mb/s links"; }
# Each of the gradient sum's 2 (R-1) messages costs --message-us too, as a
# message between stages does (the sum ignored it, and favoured replicas).
sum_ms() {
  "$gpipectl" plan "$src/examples/fashion_mnist_deep_mlp.json" "${flops[@]}" \
    --workers 4 --stages 1 --replicas 4 --micro-batches 4 --message-us "$1" 2>&1 |
    sed -n 's/.*(gradient sum \([0-9.]*\) ms).*/\1/p'
}
sum0=$(sum_ms 0)
sum1000=$(sum_ms 1000)
python3 -c "import sys; a, b = float(sys.argv[1]), float(sys.argv[2]); sys.exit(abs(b - a - 6.0) > 1e-3)" "$sum0" "$sum1000" ||
  fail "the gradient sum of 4 replicas went from $sum0 ms to $sum1000 ms with --message-us 1000, not 6 ms more"
"$gpipectl" plan "$src/examples/fashion_mnist_cnn.json" "${flops[@]}" \
  --workers 8 --stages-range 1..2 >"$work/bn" 2>&1 || { cat "$work/bn"; fail "plan --workers 8 on the CNN"; }
grep -Eq '^[ *!=]    [0-9]   [2-9] ' "$work/bn" || { cat "$work/bn"; fail "no replicas planned with batch norm"; }
# The spec's own row is cut as train, local and submit cut it, not by the
# costs plan measured (it showed 1,2,1,9 and 191 MiB for this spec, which
# runs 1,1,2,9 and 167 MiB, and exited 3 under a budget the run fits).
run_cut=$("$gpipectl" train "$src/examples/fashion_mnist_cnn.json" --steps 1 2>&1 |
  sed -n 's/.*(layers \([0-9+]*\)).*/\1/p' | head -1 | tr + ,)
[[ -n "$run_cut" ]] || fail "train printed no cut for the CNN"
"$gpipectl" plan "$src/examples/fashion_mnist_cnn.json" --stages-range 4..4 >"$work/own" 2>&1 ||
  { cat "$work/own"; fail "plan of the CNN at K=4"; }
grep -Eq "^=.* $run_cut  \(the job spec.s own\)" "$work/own" ||
  { cat "$work/own"; fail "the spec's own row is not cut as train cuts it ($run_cut)"; }
if "$gpipectl" plan "$src/examples/fashion_mnist_mlp.json" --workers -2 >"$work/negw" 2>&1; then
  fail "a negative worker count was taken"
fi
grep -q -- '--workers: must be' "$work/negw" || { cat "$work/negw"; fail "the bad worker count was not named"; }
# --stages and --stages-range together: a usage error (K=3 was planned for
# --stages 3 --stages-range 1..2 in silence).
set +e
"$gpipectl" plan "$src/examples/fashion_mnist_mlp.json" --stages 3 --stages-range 1..2 >"$work/both" 2>&1
both_rc=$?
set -e
((both_rc == 2)) || { cat "$work/both"; fail "--stages with --stages-range: exit $both_rc, not 2"; }
grep -q -- '--stages: 3 and --stages-range 1..2 both say which K to plan' "$work/both" ||
  { cat "$work/both"; fail "--stages with --stages-range: no message"; }
# The plan picks the stages, schedule and replicas: a spec whose own choice
# of them is not runnable (gradient_groups 2 under ZB-H1 on one replica)
# is still planned, and only with the replicas its groups allow.
python3 - "$src/examples/fashion_mnist_deep_mlp.json" "$work/g2.json" <<'PY'
import json, sys
spec = json.load(open(sys.argv[1]))
spec["pipeline"]["gradientGroups"] = 2
spec["pipeline"]["schedule"] = "ZERO_BUBBLE_H1"
json.dump(spec, open(sys.argv[2], "w"))
PY
# Its own configuration (one replica) is refused: exit 3, the plan printed.
set +e
"$gpipectl" plan "$work/g2.json" "${flops[@]}" --workers 4 --stages-range 2 \
  >"$work/g2" 2>&1
g2_rc=$?
set -e
((g2_rc == 3)) || { cat "$work/g2"; fail "plan of a spec with gradient_groups 2 under ZB-H1 exited $g2_rc, not 3"; }
grep -q '^best: K=2 R=[12] ' "$work/g2" || { cat "$work/g2"; fail "no plan for gradient_groups 2"; }
# A spec's own choice out of range is named, not shown as a row.
python3 - "$src/examples/fashion_mnist_mlp.json" "$work/rep9.json" <<'PY'
import json, sys
spec = json.load(open(sys.argv[1]))
spec["pipeline"]["replicas"] = 1000000000
json.dump(spec, open(sys.argv[2], "w"))
PY
# The plan is printed, and the exit status is 3: the spec as written would
# be refused.
set +e
"$gpipectl" plan "$work/rep9.json" "${flops[@]}" --stages-range 1..2 >"$work/rep9" 2>&1
rep9_rc=$?
set -e
((rep9_rc == 3)) || { cat "$work/rep9"; fail "plan of a spec whose own replicas do not run exited $rep9_rc, not 3"; }
grep -q '^best: K=' "$work/rep9" || { cat "$work/rep9"; fail "no plan printed for a spec whose own replicas do not run"; }
grep -q "own configuration does not run: .*rep9.json: pipeline.replicas: must be in" "$work/rep9" ||
  { cat "$work/rep9"; fail "the spec's own replicas out of range were not named"; }
if grep -q "(the job spec's own)" "$work/rep9"; then fail "a row for a spec that does not run"; fi
# G=2 under a split backward needs 2 replicas: no ZB row on one replica
# (the plan recommended rows that train refuses).
if grep -Eq '^[ *!=] +[0-9]+ +1 +[0-9]+  zb-' "$work/g2"; then
  cat "$work/g2"; fail "a zb row on one replica with gradient_groups 2"
fi
echo "ok: replicas ($(grep '^best:' "$work/r" | cut -c1-40))"

# A stage is a worker: --workers 2 plans no K past 2. --replicas R and
# --virtual-stages V are the rows' own. A model with batch norm keeps the
# spec's M (another M trains another model) and says so.
"$gpipectl" plan "$src/examples/fashion_mnist_deep_mlp.json" "${flops[@]}" \
  --workers 2 >"$work/w2" 2>&1 || { cat "$work/w2"; fail "plan --workers 2"; }
grep -q '^best: K=[12] ' "$work/w2" || { cat "$work/w2"; fail "--workers 2 planned more stages than workers"; }
if grep -Eq '^[ *!] +([3-9]|[1-9][0-9]) +[0-9]+ ' "$work/w2"; then
  cat "$work/w2"; fail "a row of more stages than the 2 workers"
fi
"$gpipectl" plan "$src/examples/fashion_mnist_deep_mlp.json" "${flops[@]}" \
  --replicas 2 --stages-range 1..2 >"$work/r2" 2>&1 || { cat "$work/r2"; fail "plan --replicas 2"; }
rows=$(grep -Ec '^[ *!] +[0-9]+ +[0-9]+ +[0-9]+  ' "$work/r2")
r2=$(grep -Ec '^[ *!] +[0-9]+ +2 +[0-9]+  ' "$work/r2")
((rows > 0 && rows == r2)) || { cat "$work/r2"; fail "--replicas 2: $r2 of $rows rows have R=2"; }
"$gpipectl" plan "$src/examples/fashion_mnist_deep_mlp.json" "${flops[@]}" \
  --schedule interleaved --virtual-stages 3 --stages 2 >"$work/v3" 2>&1 ||
  { cat "$work/v3"; fail "plan --virtual-stages 3"; }
grep -q 'interleaved/3' "$work/v3" || { cat "$work/v3"; fail "--virtual-stages 3 was not planned"; }
if grep -q 'interleaved/2' "$work/v3"; then cat "$work/v3"; fail "--virtual-stages 3 planned v=2"; fi
grep -q "M stays at the spec's 4: batch norm" "$work/bn" || { cat "$work/bn"; fail "the batch norm note is missing"; }
if grep -Eq '^[ *!] +[0-9]+ +[0-9]+ +([0-35-9]|[0-9]{2,}) ' "$work/bn"; then
  cat "$work/bn"; fail "a batch norm model was planned at another M"
fi
echo "ok: workers, --replicas, --virtual-stages, batch norm's M"

# Micro-batches of one sample cost what reading the weights costs: the deep
# MLP's 128 micro-batches were planned at 1.3x the step of 8, and measured
# at 6-7x (gpipectl train --stages 1 --threads 1: 31 ms against 182-242 ms).
step_ms() {
  "$gpipectl" plan "$src/examples/fashion_mnist_deep_mlp.json" "${flops[@]}"     --stages 1 --micro-batches "$1" --schedule gpipe --remat never 2>&1 |
    sed -n 's/^best: .* \([0-9.]*\) ms a step.*/\1/p'
}
m8=$(step_ms 8) m128=$(step_ms 128)
[[ -n "$m8" && -n "$m128" ]] || fail "no step in plan's best line"
awk -v a="$m8" -v b="$m128" 'BEGIN { exit !(b > 4 * a) }' ||
  fail "128 micro-batches of one sample planned at $m128 ms a step against $m8 ms for 8 of 16"
echo "ok: the weights' reads (M=8: $m8 ms a step, M=128: $m128 ms)"

# What plan refuses, it refuses as train does and names the reason.
refused() {  # WANT ARGS...
  local want=$1
  shift
  if "$gpipectl" plan "$src/examples/fashion_mnist_deep_mlp.json" "${flops[@]}" "$@" >"$work/refused" 2>&1; then
    cat "$work/refused"; fail "plan $* exited 0"
  fi
  grep -q -- "$want" "$work/refused" || { cat "$work/refused"; fail "plan $*: no '$want'"; }
}
refused "zb-v needs 10 chunks of at least one layer for K=5 (2 a stage); the model has 9" \
  --schedule zb-v --stages-range 5
refused "--replicas 3 does not fit: the gradient groups G (the spec's gradientGroups, else R) must divide M" \
  --replicas 3 --workers 6 --stages 2
refused "the zb-v schedule places exactly 2 virtual stages (chunks) per worker, got 3" \
  --schedule zb-v --virtual-stages 3 --stages-range 2
refused "--virtual-stages 2 with --replicas 2: replicas run gpipe, 1f1b and zb-h1" \
  --replicas 2 --virtual-stages 2 --stages-range 2
# Every replica count, not only powers of two: 6 workers run K=2 with 3.
"$gpipectl" plan "$src/examples/fashion_mnist_deep_mlp.json" "${flops[@]}" \
  --workers 6 --stages 2 --micro-batches 6 >"$work/r3" 2>&1 || { cat "$work/r3"; fail "plan --workers 6"; }
grep -Eq '^[ *] +2 +3 +6  ' "$work/r3" || { cat "$work/r3"; fail "no K=2 R=3 row with 6 workers"; }
# The best needs K x R cores: on fewer, the plan says so. Pinned to one CPU
# (the first this shell may use), the machine has one, whatever its size.
cpu=$(taskset -pc $$ | sed 's/.*: //; s/[-,].*//')
taskset -c "$cpu" "$gpipectl" plan "$src/examples/fashion_mnist_deep_mlp.json" "${flops[@]}" \
  --workers 6 --stages 2 --micro-batches 6 >"$work/r3one" 2>&1 || { cat "$work/r3one"; fail "plan on one CPU"; }
workers=$(sed -n 's/^best: K=\([0-9]*\) R=\([0-9]*\) .*/\1 * \2/p' "$work/r3one")
grep -q "^note: the figures give each of the $(($workers)) workers (K x R) a core of its own; this machine has 1," "$work/r3one" ||
  { cat "$work/r3one"; fail "no note that $(($workers)) workers share 1 core"; }
taskset -c "$cpu" "$gpipectl" plan "$src/examples/fashion_mnist_deep_mlp.json" "${flops[@]}" \
  --stages 1 --micro-batches 8 >"$work/k1one" 2>&1 || { cat "$work/k1one"; fail "plan --stages 1 on one CPU"; }
if grep -q "^note: the figures give" "$work/k1one"; then
  cat "$work/k1one"; fail "a note about cores for one stage on one core"
fi
# 4 gradient groups over 3 replicas: one runs 2 groups, 4 micro-batches,
# and sets the pace; the R=3 row was simulated at 3 a replica, faster than
# R=2's 4.
python3 - "$src/examples/fashion_mnist_deep_mlp.json" "$work/g4.json" <<'PY'
import json, sys
spec = json.load(open(sys.argv[1]))
spec["pipeline"]["gradientGroups"] = 4
json.dump(spec, open(sys.argv[2], "w"))
PY
stage0() {  # R: plan's first stage line for R replicas
  "$gpipectl" plan "$work/g4.json" "${flops[@]}" --workers 6 --stages 2 --micro-batches 8 \
    --schedule gpipe --remat never --replicas "$1" 2>&1 | grep -E '^      0  \[' || true
}
s2=$(stage0 2) s3=$(stage0 3)
b2=$(grep -o 'batch [0-9.]* [KMG]*i*B' <<<"$s2") b3=$(grep -o 'batch [0-9.]* [KMG]*i*B' <<<"$s3")
[[ -n "$b2" && "$b3" == "$b2" ]] ||
  fail "R=3 over 4 groups holds '$b3' of the batch, R=2 '$b2': the largest replica's share is 2 groups either way"
echo "ok: refusals name their reason; R=3; the cores the best needs; uneven groups"

# A small model is timed without --measure (the cost model is optimistic
# for small layers), unless a rate is given or --measure-under is 0; a
# model too large to time quickly says how long --measure would take.
costs() { "$gpipectl" plan "$@" --stages 2 --micro-batches 2 --remat never 2>&1 | grep '^costs: '; }
costs "$src/examples/fashion_mnist_mlp.json" |
  grep -q '^costs: measured per layer .*timed as the cost model puts that at' ||
  fail "the small MLP was not timed: $(costs "$src/examples/fashion_mnist_mlp.json")"
costs "$src/examples/fashion_mnist_mlp.json" --measure-under 0 | grep -q '^costs: cost model at' ||
  fail "--measure-under 0 timed the layers"
costs "$src/examples/fashion_mnist_mlp.json" "${flops[@]}" | grep -q '^costs: cost model at 100.0 GFLOP/s' ||
  fail "given rates did not keep the cost model"
costs "$src/examples/fashion_mnist_mlp.json" --measure-under 1e-9 |
  grep -q 'timing the layers would take about .* s: --measure does' ||
  fail "no word of what timing the layers would take"
# More memory than a quarter of any machine this runs on (six Linear layers
# of 60000 x 60000 and their gradients, 161 GiB): the cost model, not a
# timing that would allocate them, whatever the FLOPs.
layers=""
for i in $(seq 1 6); do
  layers+="${layers:+,}{\"linear\": {\"inFeatures\": 60000, \"outFeatures\": 60000}}"
done
cat >"$work/huge.json" <<JSON
{"model": {"input": {"dtype": "FLOAT32", "shape": {"dims": [60000]}},
           "layers": [$layers],
           "loss": {"softmaxCrossEntropy": {}}},
 "optimizer": {"lr": 0.01, "sgd": {}},
 "data": {"synthetic": {"task": "CLASSES", "features": 60000, "classes": 60000,
                        "trainSamples": 16, "testSamples": 4}},
 "batchSize": 4, "steps": 1}
JSON
costs "$work/huge.json" --measure-under 1e9 | grep -q 'timing the layers would hold about .*, more than is left to a plan here (--measure times them anyway)' ||
  fail "a model of 161 GiB was timed: $(costs "$work/huge.json" --measure-under 1e9)"
echo "ok: small models timed by default"

# Without --memory-budget nothing is ruled out, but a best that this
# machine could not hold under `gpipectl local` is said (the huge model's
# stages need about 170 GiB each); a budget that holds it says nothing.
mem_kib=$(awk '/^MemTotal/ {print $2}' /proc/meminfo)
if ((mem_kib < 256 * 1024 * 1024)); then
  "$gpipectl" plan "$work/huge.json" --stages 2 --micro-batches 4 "${flops[@]}" \
    >"$work/no_budget" 2>&1 || { cat "$work/no_budget"; fail "plan huge.json"; }
  grep -q "^note: no --memory-budget, so no configuration was ruled out; the best needs .* a stage, more than the .* each of its 2 workers would have of this machine's memory" "$work/no_budget" ||
    { cat "$work/no_budget"; fail "no word that the best does not fit this machine"; }
  "$gpipectl" plan "$work/huge.json" --stages 2 --micro-batches 4 "${flops[@]}" \
    --memory-budget 1TiB >"$work/big_budget" 2>&1 || { cat "$work/big_budget"; fail "plan --memory-budget 1TiB"; }
  ! grep -q "no --memory-budget" "$work/big_budget" || fail "the note came with a budget"
fi
echo "ok: a best this machine cannot hold is said without a budget"
echo "10 passed, 0 failed"
