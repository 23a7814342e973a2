#!/usr/bin/env bash
# Stage timelines end to end: workers send each step's op records to a
# controller started by hand, which keeps the last few steps; `gpipectl
# trace` fetches them as a summary, Chrome trace JSON and SVG, checked by an
# outside reader (check_trace.py: json and xml.etree); bad requests (unknown
# job, A > B, steps no longer kept, an unknown format, a job that has not
# run) get clear messages. Then `gpipectl local --trace DIR` and `gpipectl
# train --trace DIR` write the same files. Skips (and passes) while
# gpipe-controller or gpipe-worker is not built.
#   trace_cluster_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1
src=$2
bin="$build/bin"
gpipectl="$bin/gpipectl"
check="$src/tests/scripts/check_trace.py"

source "$(dirname "$0")/processes_lib.sh"
skip_unless_built gpipe-controller gpipe-worker gpipectl

fail() {
  echo "FAIL: $*" >&2
  for f in "$work"/*.log; do
    [[ -f "$f" ]] || continue
    echo "--- $f" >&2
    tail -n 15 "$f" >&2
  done
  exit 1
}

# Runs a command with a bound; sets $rc and $out (stdout and stderr).
run() {
  set +e
  out=$(timeout -k 5 120 "$@" 2>&1)
  rc=$?
  set -e
}

# K=3 stages, M=4 micro-batches, 12 steps; except_last re-materializes on
# stages 0 and 1.
cat >"$work/job.json" <<'JSON'
{
  "name": "trace-test <&\"'>",
  "model": {
    "input": {"dtype": "FLOAT32", "shape": {"dims": [8]}},
    "layers": [
      {"linear": {"inFeatures": 8, "outFeatures": 16}},
      {"relu": {}},
      {"linear": {"inFeatures": 16, "outFeatures": 16}},
      {"relu": {}},
      {"linear": {"inFeatures": 16, "outFeatures": 3}}
    ],
    "loss": {"softmaxCrossEntropy": {}}
  },
  "optimizer": {"lr": 0.05, "sgd": {"momentum": 0.9}},
  "data": {"synthetic": {"task": "CLASSES", "features": 8, "classes": 3,
                         "trainSamples": 600, "testSamples": 100}},
  "pipeline": {"stages": 3, "microBatches": 4, "remat": "EXCEPT_LAST"},
  "batchSize": 32,
  "steps": 12,
  "seed": 5
}
JSON

# --- a controller keeping 5 steps per stage, and three workers ------------
(cd "$work" && exec "$bin/gpipe-controller" --listen=127.0.0.1:0 --metrics_listen= \
  --port_file="$work/controller.port" --checkpoint_dir="$work/checkpoints" \
  --trace_steps=5 >"$work/controller.log" 2>&1) &
pids+=($!)
for _ in $(seq 200); do
  [[ -s "$work/controller.port" ]] && break
  kill -0 "${pids[0]}" 2>/dev/null || fail "gpipe-controller exited"
  sleep 0.1
done
[[ -s "$work/controller.port" ]] || fail "gpipe-controller wrote no port file within 20s"
port=$(tr -d '[:space:]' <"$work/controller.port")
addr="127.0.0.1:${port##*:}"

# A job that has not run has no timelines yet.
run "$gpipectl" --controller "$addr" submit "$work/job.json"
[[ $rc -eq 0 ]] || fail "submit exited $rc: $out"
pending=$(tail -n 1 <<<"$out")
run "$gpipectl" --controller "$addr" trace "$pending"
[[ $rc -eq 1 ]] || fail "trace of a pending job exited $rc, want 1: $out"
grep -q "no step timelines are stored for job $pending" <<<"$out" ||
  fail "trace of a pending job: $out"
"$gpipectl" --controller "$addr" cancel "$pending" >/dev/null

for i in 0 1 2; do
  "$bin/gpipe-worker" --controller="$addr" --listen=127.0.0.1:0 --threads=1 \
    >"$work/worker-$i.log" 2>&1 &
  pids+=($!)
done
run "$gpipectl" --controller "$addr" submit "$work/job.json" --watch
[[ $rc -eq 0 ]] || fail "submit --watch exited $rc: $out"
job=$(grep -o 'job-[0-9a-f]*' <<<"$out" | head -n 1)
[[ -n "$job" ]] || fail "no job id in: $out"

# The summary: every stage, the kept steps 7..11.
run "$gpipectl" --controller "$addr" trace "$job"
[[ $rc -eq 0 ]] || fail "trace $job exited $rc: $out"
echo "$out"
grep -q "steps 7..11 shown (the controller keeps 7..11)" <<<"$out" ||
  fail "trace summary does not show the kept steps 7..11: $out"
for s in 0 1 2; do
  grep -qE "^$s +5 " <<<"$out" || fail "trace summary lacks stage $s with 5 steps: $out"
done

# Both formats in one call, checked by an outside reader.
run "$gpipectl" --controller "$addr" trace "$job" -o "$work/t.json,$work/t.svg"
[[ $rc -eq 0 ]] || fail "trace -o exited $rc: $out"
python3 "$check" "$work/t.json" "$work/t.svg" --stages 3 --micro-batches 4 \
  --steps 5 --remat except_last || fail "the trace of $job does not check"
# The job's name is not in the trace, but ids are escaped all the same:
# the files parsed.

# A range: two steps.
run "$gpipectl" --controller "$addr" trace "$job" --steps 9..10 -o "$work/range/"
[[ $rc -eq 0 ]] || fail "trace --steps 9..10 -o DIR/ exited $rc: $out"
# It names the files as paths ("DIR//trace.json" before).
grep -qF "wrote $work/range/trace.json and $work/range/timeline.svg" <<<"$out" ||
  fail "trace -o DIR/ names its files: $out"
python3 "$check" "$work/range/trace.json" "$work/range/timeline.svg" \
  --stages 3 --micro-batches 4 --steps 2 || fail "the trace of steps 9..10 does not check"

# Bad requests.
run "$gpipectl" --controller "$addr" trace job-nope
[[ $rc -eq 1 ]] || fail "trace of a missing job exited $rc, want 1: $out"
grep -q "job job-nope not found" <<<"$out" || fail "trace of a missing job: $out"
run "$gpipectl" --controller "$addr" trace "$job" --steps 5..2
[[ $rc -eq 2 ]] || fail "trace --steps 5..2 exited $rc, want 2: $out"
grep -q "ends before it begins" <<<"$out" || fail "trace --steps 5..2: $out"
run "$gpipectl" --controller "$addr" trace "$job" --steps 0..3
[[ $rc -eq 1 ]] || fail "trace of steps no longer kept exited $rc, want 1: $out"
grep -q "steps 0..3 of job $job are not stored; the controller keeps steps 7..11" <<<"$out" ||
  fail "trace of steps no longer kept: $out"
run "$gpipectl" --controller "$addr" trace "$job" --steps x..3
[[ $rc -eq 2 ]] || fail "trace --steps x..3 exited $rc, want 2: $out"
run "$gpipectl" --controller "$addr" trace "$job" -o "$work/t.txt"
[[ $rc -eq 2 ]] || fail "trace -o t.txt exited $rc, want 2: $out"
grep -q "chosen by the extension" <<<"$out" || fail "trace -o t.txt: $out"
run "$gpipectl" --controller 127.0.0.1:1 trace "$job"
[[ $rc -eq 1 ]] || fail "trace against no controller exited $rc, want 1: $out"
grep -q "cannot reach the controller at 127.0.0.1:1" <<<"$out" || fail "trace against no controller: $out"
run "$gpipectl" --controller "$addr" trace "$job" --json
python3 -m json.tool <<<"$out" >/dev/null || fail "trace --json is not JSON: $out"

# --- gpipectl local --trace and gpipectl train --trace ---------------------
run "$gpipectl" local "$work/job.json" --threads 3 --trace "$work/local-trace"
[[ $rc -eq 0 ]] || fail "gpipectl local --trace exited $rc: $out"
python3 "$check" "$work/local-trace/trace.json" "$work/local-trace/timeline.svg" \
  --stages 3 --micro-batches 4 --steps 4 || fail "local --trace's files do not check"

run "$gpipectl" train "$work/job.json" --stages 2 --micro-batches 2 --remat never \
  --threads 2 --trace "$work/train-trace"
[[ $rc -eq 0 ]] || fail "gpipectl train --trace exited $rc: $out"
python3 "$check" "$work/train-trace/trace.json" "$work/train-trace/timeline.svg" \
  --stages 2 --micro-batches 2 --steps 4 --remat never || fail "train --trace's files do not check"
# ZB-H1: the split backward's halves in both formats, from the cluster's
# workers (through the controller) and from the in-process pipeline.
run "$gpipectl" local "$work/job.json" --threads 3 --schedule zb-h1 \
  --trace "$work/zb-local"
[[ $rc -eq 0 ]] || fail "gpipectl local --schedule zb-h1 --trace exited $rc: $out"
python3 "$check" "$work/zb-local/trace.json" "$work/zb-local/timeline.svg" \
  --stages 3 --micro-batches 4 --steps 4 --split-backward ||
  fail "local zb-h1 --trace's files do not check"
grep -q '"name":"W0"' "$work/zb-local/trace.json" ||
  fail "local zb-h1 --trace has no W0 slice"
run "$gpipectl" train "$work/job.json" --stages 2 --micro-batches 2 \
  --schedule zb-h1 --remat never --threads 2 --trace "$work/zb-train"
[[ $rc -eq 0 ]] || fail "gpipectl train --schedule zb-h1 --trace exited $rc: $out"
python3 "$check" "$work/zb-train/trace.json" "$work/zb-train/timeline.svg" \
  --stages 2 --micro-batches 2 --steps 4 --remat never --split-backward ||
  fail "train zb-h1 --trace's files do not check"

run "$gpipectl" train "$work/job.json" --stages 1 --trace "$work/ref-trace"
[[ $rc -eq 2 ]] || fail "train --stages 1 --trace exited $rc, want 2 (a flag's usage): $out"
grep -q "give --stages 2 or more" <<<"$out" || fail "train --stages 1 --trace: $out"

echo "1 passed, 0 failed"
