#!/usr/bin/env bash
# gpipectl against real processes. `gpipectl local` runs a small job on a
# controller and two workers it starts itself and writes bitwise the
# parameters of the single-process reference trainer, leaving no process
# behind; then the client commands against a controller started by hand: a
# missing job, a malformed spec, an unreachable controller, submit / status /
# cancel / watch of a job that no worker runs, and valid JSON for scripts.
# Skips (and passes) while gpipe-controller or gpipe-worker is not built.
#   cli_cluster_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1
src=$2
bin="$build/bin"
gpipectl="$bin/gpipectl"

source "$(dirname "$0")/processes_lib.sh"
skip_unless_built gpipe-controller gpipe-worker

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

# Runs a command with a bound; sets $rc and $out (stdout and stderr).
run() {
  set +e
  out=$(timeout -k 5 60 "$@" 2>&1)
  rc=$?
  set -e
}

# Prints the tails of the logs of a local run, for a failure's context.
show_logs() {
  local f
  for f in "$1"/*.log; do
    [[ -f "$f" ]] || continue
    echo "--- $f" >&2
    tail -n 20 "$f" >&2
  done
}

cat >"$work/job.json" <<'JSON'
{
  "name": "cli-cluster-test",
  "model": {
    "input": {"dtype": "FLOAT32", "shape": {"dims": [8]}},
    "layers": [
      {"linear": {"inFeatures": 8, "outFeatures": 16}},
      {"batchNorm": {"features": 16}},
      {"relu": {}},
      {"linear": {"inFeatures": 16, "outFeatures": 3}}
    ],
    "loss": {"softmaxCrossEntropy": {}}
  },
  "optimizer": {"lr": 0.05, "sgd": {"momentum": 0.9}},
  "data": {"synthetic": {"task": "CLASSES", "features": 8, "classes": 3,
                         "trainSamples": 600, "testSamples": 300}},
  "pipeline": {"stages": 2, "microBatches": 4},
  "batchSize": 32,
  "steps": 60,
  "eval": {"every": 20},
  "seed": 11
}
JSON

# --- gpipectl local: where its results cannot go, refused before it starts -
run "$gpipectl" local "$work/job.json" --metrics-targets "$work/no/such/dir/t.json" \
  --keep "$work/refused-run"
[[ $rc -eq 2 ]] || fail "local with an unwritable --metrics-targets exited $rc: $out"
grep -q -- "--metrics-targets: cannot create" <<<"$out" || fail "local --metrics-targets: $out"
! grep -q "local cluster:" <<<"$out" || fail "local started its processes before refusing --metrics-targets: $out"
# A targets file in the --keep directory it makes is fine (it is made first).
touch "$work/afile"
run "$gpipectl" local "$work/job.json" --out "$work/afile" --keep "$work/kept-run" \
  --metrics-targets "$work/kept-run/targets.json"
[[ $rc -ne 0 ]] || fail "local --out FILE was accepted: $out"
grep -q -- "--out: cannot make" <<<"$out" || fail "local --out FILE: $out"

# A device the workers do not take, and data train would refuse (a NaN
# feature): refused before any process starts, as train refuses them (the job failed on the controller after the cluster had
# started, and left its run directory).
run "$gpipectl" local "$work/job.json" --device foo
[[ $rc -eq 2 ]] || fail "local --device foo exited $rc, want 2: $out"
grep -q -- "--device: 'foo' is not one of" <<<"$out" || fail "local --device foo: $out"
! grep -q "local cluster:" <<<"$out" || fail "local started its processes before refusing --device: $out"
python3 - "$work" <<'PY'
import json, struct, sys
work = sys.argv[1]
def npy(path, descr, shape, fmt, values):
    header = "{'descr': '%s', 'fortran_order': False, 'shape': %s, }" % (descr, shape)
    header += " " * (63 - (10 + len(header)) % 64) + "\n"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode())
        f.write(struct.pack("<%d%s" % (len(values), fmt), *values))
features = [((i * 7) % 10) / 10 for i in range(80)]
features[35] = float("nan")
npy(f"{work}/x.npy", "<f4", "(40, 2)", "f", features)
npy(f"{work}/y.npy", "<i8", "(40,)", "q", [i % 3 for i in range(40)])
d = json.load(open(f"{work}/job.json"))
d["model"]["input"]["shape"]["dims"] = [2]
d["model"]["layers"][0]["linear"]["inFeatures"] = 2
d["data"] = {"tensors": {"inputs": f"{work}/x.npy", "targets": f"{work}/y.npy"}}
json.dump(d, open(f"{work}/nan-data.json", "w"))
PY
run "$gpipectl" local "$work/nan-data.json" --keep "$work/nan-run"
[[ $rc -eq 1 ]] || fail "local with a NaN feature exited $rc, want 1: $out"
grep -qi "nan" <<<"$out" || fail "local does not name the NaN: $out"
! grep -q "local cluster:" <<<"$out" || fail "local started its processes before checking the data: $out"
[[ ! -e $work/nan-run ]] || fail "local refused its data and left $work/nan-run"
train_out=$(timeout -k 5 60 "$gpipectl" train "$work/nan-data.json" --steps 1 2>&1) &&
  fail "train took a NaN feature: $train_out"
[[ "$(grep -o "x.npy.*" <<<"$out")" == "$(grep -o "x.npy.*" <<<"$train_out")" ]] ||
  fail "local and train name the NaN differently: $out / $train_out"

# --- gpipectl local: a controller and two workers, to the end -------------
set +e
# Without a wait policy of the user's, the workers sleep at barriers.
timeout -k 10 300 env -u OMP_WAIT_POLICY "$gpipectl" local "$work/job.json" --workers 2 --micro-batches 4 \
  --threads 2 --out "$work/local" --keep "$work/run" >"$work/local.txt" 2>&1
rc=$?
set -e
cat "$work/local.txt"
if [[ $rc -ne 0 ]]; then
  show_logs "$work/run"
  fail "gpipectl local exited $rc, want 0"
fi
grep -q "SUCCEEDED" "$work/local.txt" || fail "gpipectl local printed no SUCCEEDED"
passive=$(cat "$work"/run/worker*.log | grep -c "OMP_WAIT_POLICY=PASSIVE" || true)
[[ $passive -eq 2 ]] || fail "$passive of 2 workers of gpipectl local wait passively at barriers"
grep -q "^final: test loss" "$work/local.txt" || fail "gpipectl local printed no final evaluation"
[[ -f "$work/local/model.safetensors" ]] || fail "gpipectl local wrote no model.safetensors"
# The controller's model path is printed only where it outlives the run
# (--keep); without --keep the local cluster's folder goes with it.
kept_model=$(sed -n 's/^model: //p' "$work/local.txt")
[[ -n "$kept_model" && -f "$kept_model" ]] || fail "gpipectl local --keep printed model '$kept_model', which is not there"

# Nothing it started is left running.
port=$(tr -d '[:space:]' <"$work/run/controller.port")
port=${port##*:}
for _ in $(seq 50); do
  pgrep -f -- "127.0.0.1:$port" >/dev/null || break
  sleep 0.1
done
if pgrep -f -- "127.0.0.1:$port" >/dev/null; then
  pgrep -af -- "127.0.0.1:$port" >&2 || true
  fail "processes of the local cluster (port $port) outlived gpipectl local"
fi

# A loss that is not finite fails the job, naming it: the last stage
# reports it before closing its links, and the controller takes it even
# when its neighbour's "link closed" restarted the job first.
python3 - "$work/job.json" "$work/nan.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
d["optimizer"]["lr"] = 1e30
d["steps"] = 5
json.dump(d, open(sys.argv[2], "w"))
PY
run "$gpipectl" local "$work/nan.json" --workers 2 --threads 1
[[ $rc -eq 1 ]] || fail "a job whose loss is not finite: local exited $rc, want 1: $out"
grep -q "FAILED: .*loss is not finite" <<<"$out" || fail "no non-finite loss named: $out"
# The neighbour's "link closed" travels on its own Attach stream and can
# still arrive first (about one run in five here): then one restart is
# begun, and the failure of the epoch it left ends the job (before, it
# replayed into the same failure 1-5 times).
(($(grep -c "RESTARTING" <<<"$out") <= 1)) || fail "a non-finite loss restarted the job more than once: $out"
# The step named is counted as the progress bar counts (it named the step
# the bar had just shown with a finite loss), the same in one process.
local_out=$out
run "$gpipectl" train "$work/nan.json" --stages 1 --threads 1
n=$(sed -n 's/.*loss is not finite (nan) at step \([0-9]*\).*/\1/p' <<<"$out" | tail -n 1)
[[ -n "$n" ]] || fail "train named no step: $out"
grep -q "loss is not finite (nan) at step $n" <<<"$local_out" || fail "local and train name different steps: $local_out"
grep -q "step $n/5 " <<<"$out" && fail "the bar showed step $n with a finite loss, and step $n is named as failing: $out"

# Bitwise the reference trainer's parameters over the same micro-batches.
"$gpipectl" train "$work/job.json" --stages 1 --micro-batches 4 --threads 1 \
  --out "$work/ref" >"$work/ref.txt" 2>&1 || fail "reference run failed: $(cat "$work/ref.txt")"
# The cluster's periodic evaluations print as the reference's, figure for
# figure (steps 20 and 40; the final one at 60).
evals_local=$(grep -E '^(step [0-9]+|final): test loss' "$work/local.txt" || true)
evals_ref=$(grep -E '^(step [0-9]+|final): test loss' "$work/ref.txt" || true)
[[ $(grep -c '^step' <<<"$evals_ref") -eq 2 ]] || fail "gpipectl train printed no periodic evaluations: $evals_ref"
[[ "$evals_local" == "$evals_ref" ]] ||
  fail "the cluster's evaluations differ from gpipectl train's: $evals_local / $evals_ref"
if ! python3 "$src/tests/scripts/same_tensors.py" "$work/ref/model.safetensors" "$work/local/model.safetensors" >/dev/null 2>&1; then
  python3 "$src/tests/scripts/read_safetensors.py" "$work/ref/model.safetensors" --print >"$work/ref.read" 2>&1 || true
  python3 "$src/tests/scripts/read_safetensors.py" "$work/local/model.safetensors" --print >"$work/local.read" 2>&1 || true
  diff "$work/ref.read" "$work/local.read" >&2 || true
  fail "gpipectl local's model.safetensors differs from gpipectl train --stages 1's"
fi
# With local's own flags, train writes the same file byte for byte: the
# metadata records the flags both ran with (train left --micro-batches out).
"$gpipectl" train "$work/job.json" --micro-batches 4 --threads 2 \
  --out "$work/same_flags" >"$work/same_flags.txt" 2>&1 || fail "train with local's flags failed: $(cat "$work/same_flags.txt")"
cmp -s "$work/same_flags/model.safetensors" "$work/local/model.safetensors" ||
  fail "gpipectl train --micro-batches 4 and gpipectl local --micro-batches 4 wrote different files"

# --- the client commands against a controller started by hand -------------
# (Its flags spelt with dashes, as a manifest may: every binary takes both.)
(cd "$work" && exec "$bin/gpipe-controller" --listen=127.0.0.1:0 --metrics-listen= \
  --port-file="$work/controller.port" --checkpoint-dir "$work/checkpoints" \
  >"$work/controller.log" 2>&1) &
pids+=($!)
for _ in $(seq 200); do
  [[ -s "$work/controller.port" ]] && break
  kill -0 "${pids[0]}" 2>/dev/null || fail "gpipe-controller exited: $(tail -n 20 "$work/controller.log")"
  sleep 0.1
done
[[ -s "$work/controller.port" ]] || fail "gpipe-controller wrote no port file within 20s"
port=$(tr -d '[:space:]' <"$work/controller.port")
addr="127.0.0.1:${port##*:}"

run "$gpipectl" --controller "$addr" status job-nope
[[ $rc -eq 1 ]] || fail "status of a missing job exited $rc, want 1: $out"
grep -qi "not found" <<<"$out" || fail "status of a missing job: $out"
grep -q "job-nope" <<<"$out" || fail "status of a missing job does not name it: $out"
# An id far longer than any: still "not found", not a transport error (the
# echoed id outgrew gRPC's metadata limit).
run "$gpipectl" --controller "$addr" status "$(head -c 100000 /dev/zero | tr '\0' x)"
[[ $rc -eq 1 ]] || fail "status of a 100 KB id exited $rc, want 1: ${out:0:300}"
grep -q "not found" <<<"$out" || fail "status of a 100 KB id: ${out:0:300}"

run "$gpipectl" --controller "$addr" watch job-nope
[[ $rc -eq 1 ]] || fail "watch of a missing job exited $rc, want 1: $out"
grep -qi "not found" <<<"$out" || fail "watch of a missing job: $out"

sed 's/"inFeatures": 16, "outFeatures": 3/"inFeatures": 15, "outFeatures": 3/' \
  "$work/job.json" >"$work/bad.json"
run "$gpipectl" --controller "$addr" submit "$work/bad.json"
[[ $rc -eq 1 ]] || fail "submit of a malformed spec exited $rc, want 1: $out"
grep -q "model.layers\[3\].linear.in_features: 15" <<<"$out" ||
  fail "submit of a malformed spec does not name the field: $out"

run "$gpipectl" --controller 127.0.0.1:1 list
[[ $rc -eq 1 ]] || fail "list against no controller exited $rc, want 1: $out"
grep -q "cannot reach the controller at 127.0.0.1:1" <<<"$out" ||
  fail "list against no controller: $out"
run env GPIPE_CONTROLLER=127.0.0.1:1 "$gpipectl" workers
grep -q "cannot reach the controller at 127.0.0.1:1" <<<"$out" ||
  fail "GPIPE_CONTROLLER is not used: $out"

# Every --json response is one JSON document on one line, whichever command
# printed it (submit and status were pretty-printed where list was not).
json_line() {
  [[ $rc -eq 0 ]] || fail "$1 exited $rc: $out"
  [[ $(wc -l <<<"$out") -eq 1 ]] || fail "$1 is not one line: $out"
  python3 -m json.tool <<<"$out" >/dev/null || fail "$1 is not JSON: $out"
}
run "$gpipectl" --controller "$addr" workers --json
json_line "workers --json"
run "$gpipectl" --controller "$addr" list --json
json_line "list --json"

# A job that no worker runs: submitted, listed, pending, cancelled; watching
# it ends with exit code 1.
run "$gpipectl" --controller "$addr" submit "$work/job.json"
[[ $rc -eq 0 ]] || fail "submit exited $rc: $out"
job=$(tail -n 1 <<<"$out")
[[ -n "$job" && "$job" != *" "* ]] || fail "submit did not print a job id: $out"
run "$gpipectl" --controller "$addr" list
grep -q "^$job .*cli-cluster-test" <<<"$out" || fail "list does not show $job: $out"
# A summary's spec holds what ListJobs keeps, no seed of 0 beside it.
run "$gpipectl" --controller "$addr" list --json
python3 -c 'import json, sys
jobs = json.loads(sys.stdin.read())["jobs"]
assert jobs and all(set(j["spec"]) == {"name", "steps", "batchSize", "pipeline"} and
                   "schedule" in j["spec"]["pipeline"] and "status" in j for j in jobs), jobs' <<<"$out" ||
  fail "list --json: $out"
run "$gpipectl" --controller "$addr" status "$job"
[[ $rc -eq 0 ]] || fail "status $job exited $rc: $out"
grep -q "PENDING" <<<"$out" || fail "a job without workers is not PENDING: $out"
run "$gpipectl" --controller "$addr" status "$job" --json
json_line "status --json"
run "$gpipectl" --controller "$addr" cancel "$job" --json
json_line "cancel --json"
run "$gpipectl" --controller "$addr" watch "$job"
[[ $rc -eq 1 ]] || fail "watch of a cancelled job exited $rc, want 1: $out"
grep -q "CANCELLED" <<<"$out" || fail "watch of a cancelled job: $out"
# delete: JSON for scripts too, and the job is gone.
run "$gpipectl" --controller "$addr" delete "$job" --json
json_line "delete --json"
[[ "$(python3 -c 'import json,sys; print(json.load(sys.stdin)["jobId"])' <<<"$out")" == "$job" ]] ||
  fail "delete --json is not the job's JSON: $out"
run "$gpipectl" --controller "$addr" status "$job"
[[ $rc -eq 1 ]] && grep -q "not found" <<<"$out" || fail "a deleted job's status: $out"
run "$gpipectl" --controller "$addr" submit "$work/job.json" --json
json_line "submit --json"
job=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])' <<<"$out")
run "$gpipectl" --controller "$addr" cancel "$job"
[[ $rc -eq 0 ]] || fail "cancel $job exited $rc: $out"

echo "1 passed, 0 failed"
