#!/usr/bin/env bash
# gpipectl train end to end: trains a small synthetic job, writes
# model.safetensors, and an independent reader (Python's standard library
# only) reads it back; bad input gets a clear message and exit code 1.
#   cli_train_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1
src=$2
gpipectl="$build/bin/gpipectl"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

fail() { echo "FAIL: $*" >&2; exit 1; }
# The same parameters, bit for bit; the files' metadata records each run's
# own pipeline flags.
same_tensors() { python3 "$src/tests/scripts/same_tensors.py" "$1" "$2" >/dev/null 2>&1; }

cat >"$work/job.json" <<'JSON'
{
  "name": "cli-test",
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
  "batchSize": 32,
  "steps": 150,
  "seed": 11,
  "eval": {"every": 50}
}
JSON

out=$("$gpipectl" train "$work/job.json" --micro-batches 4 --out "$work/model" --threads 1 2>"$work/stderr")
echo "$out"
grep -q "step 150/150" "$work/stderr" || fail "no progress line for the last step"
grep -q "step 50: test loss" <<<"$out" || fail "no periodic evaluation"
acc=$(sed -n 's/^final: .*test accuracy \([0-9.]*\).*/\1/p' <<<"$out")
[[ -n "$acc" ]] || fail "no final accuracy line"
python3 -c "import sys; sys.exit(0 if float('$acc') >= 0.9 else 1)" ||
  fail "accuracy $acc below 0.9 on separable clusters"

names="layers.0.weight,layers.0.bias,layers.1.weight,layers.1.bias,layers.1.running_mean,layers.1.running_var,layers.3.weight,layers.3.bias"
python3 "$src/tests/scripts/read_safetensors.py" "$work/model/model.safetensors" \
  --expect-names "$names" --print >"$work/read.txt" || fail "independent reader rejected the file"
grep -q "layers.0.weight" "$work/read.txt" || fail "reader did not list layers.0.weight"
grep -q "\[16, 8\]" "$work/read.txt" || fail "layers.0.weight is not [16, 8]"

# The model file records the run's flags in its spec (it recorded the
# file's pipeline, none here, for --micro-batches 4).
recorded_pipeline() {
  python3 - "$1" <<'PY'
import json, struct, sys
data = open(sys.argv[1], "rb").read()
(n,) = struct.unpack("<Q", data[:8])
job = json.loads(json.loads(data[8:8 + n])["__metadata__"]["gpipe.job"])
p = job.get("pipeline", {})
print(" ".join(f"{k}={p[k]}" for k in sorted(p)))
PY
}
[[ "$(recorded_pipeline "$work/model/model.safetensors")" == "microBatches=4" ]] ||
  fail "the model file records pipeline {$(recorded_pipeline "$work/model/model.safetensors")}, not the run's --micro-batches 4"

# The same job with the same flags gives the same bytes.
"$gpipectl" train "$work/job.json" --micro-batches 4 --out "$work/again" --threads 2 >/dev/null 2>&1
cmp -s "$work/model/model.safetensors" "$work/again/model.safetensors" ||
  fail "two identical runs (1 and 2 threads) wrote different parameters"

# The in-process pipeline writes bitwise the reference trainer's parameters,
# whatever the schedule, re-materialization and partition.
for flags in "--stages 2 --schedule gpipe --remat never" \
             "--stages 3 --schedule 1f1b --remat always --balance 1,2,1" \
             "--stages 2 --schedule 1f1b --remat except_last --balance measured"; do
  # shellcheck disable=SC2086
  "$gpipectl" train "$work/job.json" --micro-batches 4 $flags --out "$work/pipe" >"$work/pipe.txt" 2>&1 ||
    fail "pipeline run ($flags) failed: $(cat "$work/pipe.txt")"
  grep -q "in-process pipeline" "$work/pipe.txt" || fail "($flags) did not run the pipeline"
  # Each stage's utilization and bubble, the schedule's theory for K and
  # M = 4 (GPipe's and 1F1B's (K-1)/(M+K-1), 20% at K=2 and 33% at K=3)
  # and each stage's for this cut, by the cost model.
  want="gpipe theory 20%, this cut [0-9]+% [0-9]+%"
  [[ $flags == *"--stages 3"* ]] && want="1f1b theory 33%, this cut [0-9]+% [0-9]+% [0-9]+%"
  [[ $flags == *"--stages 2 --schedule 1f1b"* ]] && want="1f1b theory 20%, this cut [0-9]+% [0-9]+%"
  grep -Eq "util ([0-9]+% )+ bubble ([0-9]+% ?)+ \($want\)" "$work/pipe.txt" ||
    fail "($flags) shows no stage figures with ($want): $(tail -3 "$work/pipe.txt")"
  same_tensors "$work/model/model.safetensors" "$work/pipe/model.safetensors" ||
    fail "pipeline ($flags) parameters differ from the reference trainer's"
done
recorded=$(recorded_pipeline "$work/pipe/model.safetensors")
cut=$(sed -n "s/.*K=2 stages (layers \([0-9]*\)+\([0-9]*\)).*/balance=['\1', '\2']/p" "$work/pipe.txt" | head -1)
[[ "$recorded" == "$cut microBatches=4 remat=EXCEPT_LAST schedule=ONE_F_ONE_B stages=2" ]] ||
  fail "the last pipeline run's file records {$recorded}, not its measured cut ($cut)"

# A spec cut for its own stages and schedule runs under other flags, cut
# afresh: the reference trainer, measured cuts, interleaving and back.
python3 - "$work/job.json" "$work/cut.json" "$work/chunked.json" <<'PY'
import json, sys
spec = json.load(open(sys.argv[1]))
spec["pipeline"] = {"stages": 2, "microBatches": 4, "balance": [2, 2]}
json.dump(spec, open(sys.argv[2], "w"))
spec["pipeline"] = {"stages": 2, "microBatches": 4,
                    "schedule": "INTERLEAVED_1F1B", "virtualStages": 2}
json.dump(spec, open(sys.argv[3], "w"))
PY
for run in "cut.json --stages 1" "cut.json --stages 1 --balance measured" \
           "cut.json --stages 4 --balance measured" "cut.json --schedule interleaved" \
           "cut.json --schedule zb-v" "chunked.json --schedule 1f1b"; do
  # shellcheck disable=SC2086
  "$gpipectl" train "$work"/$run --steps 3 --out "$work/flags" >"$work/flags.txt" 2>&1 ||
    fail "train $run: $(tail -n 2 "$work/flags.txt")"
done

# Bad input: a clear message naming the field, exit code 1, no crash.
sed 's/"inFeatures": 16, "outFeatures": 3/"inFeatures": 15, "outFeatures": 3/' \
  "$work/job.json" >"$work/bad.json"
set +e
msg=$("$gpipectl" train "$work/bad.json" 2>&1)
rc=$?
set -e
[[ $rc -eq 1 ]] || fail "bad spec exited $rc, want 1"
grep -q "model.layers\[3\].linear.in_features: 15 does not match the previous layer's output 16" <<<"$msg" ||
  fail "bad spec message: $msg"

set +e
msg=$("$gpipectl" train "$work/missing.json" 2>&1)
rc=$?
set -e
[[ $rc -eq 1 ]] || fail "missing spec exited $rc, want 1"
grep -q "missing.json" <<<"$msg" || fail "missing spec message does not name the file: $msg"

set +e
msg=$("$gpipectl" train "$work/job.json" --stages 2 --balance 1,1 2>&1)
rc=$?
set -e
# The flags made the spec invalid: a usage error (it exited 1).
[[ $rc -eq 2 ]] || fail "bad balance exited $rc, want 2"
grep -q "^gpipectl train: --stages 2 --balance 1,1: pipeline.balance: sums to 2 but the model has 4 layers" <<<"$msg" || fail "bad balance message: $msg"

# --help lists each binary's own flags (absl alone would say "No flags
# matched": it looks for a file named after the binary), not absl's.
for pair in "gpipe-worker:--link_wait_ms" "gpipe-controller:--api_token_file"; do
  bin=${pair%%:*} flag=${pair#*:}
  help=$("$build/bin/$bin" --help 2>&1 || true)
  grep -q -- "$flag" <<<"$help" || fail "$bin --help does not list $flag"
  ! grep -q -- "--flagfile" <<<"$help" || fail "$bin --help lists absl's own flags"
  ! grep -qE -- "\.cc|/work/" <<<"$help" || fail "$bin --help names source files: $help"
done
# --version names the binary and its build, not absl's "Debug build
# (NDEBUG not #defined)" of a release build.
for bin in gpipectl gpipe-worker gpipe-controller; do
  version=$("$build/bin/$bin" --version 2>&1 || true)
  grep -q "^$bin (gpipe, \(release\|debug\) build)" <<<"$version" || fail "$bin --version: $version"
done
# gpipectl: an overview of the commands, and each command's own flags with
# their defaults, without the source files that define them.
help=$("$gpipectl" --help)
for word in train eval predict fetch "COMMAND --help"; do
  grep -q -- "$word" <<<"$help" || fail "gpipectl --help does not mention $word: $help"
done
help=$("$gpipectl" train --help)
grep -q -- "--micro-batches" <<<"$help" || fail "gpipectl train --help lacks --micro-batches: $help"
# The flags the README gives for train, local and submit are listed.
for command in train local submit; do
  help=$("$gpipectl" "$command" --help)
  for flag in --replicas --virtual-stages --balance --remat; do
    grep -q -- "$flag" <<<"$help" || fail "gpipectl $command --help lacks $flag"
  done
done
grep -q -- "--workers" <<<"$("$gpipectl" plan --help)" || fail "gpipectl plan --help lacks --workers"
help=$("$gpipectl" train --help)
grep -q -- "usage: gpipectl train JOB.json" <<<"$help" || fail "gpipectl train --help: $help"
! grep -q -- "--controller" <<<"$help" || fail "gpipectl train --help lists a client flag"
help=$("$gpipectl" help fetch)
grep -q -- "--step" <<<"$help" || fail "gpipectl help fetch lacks --step: $help"
# A one-letter flag is shown as it is written, "-o DIR", not "--o".
grep -qE -- "^  -o$" <<<"$help" || fail "gpipectl help fetch lacks -o: $help"
! grep -q -- "--o$" <<<"$help" || fail "gpipectl help fetch shows --o: $help"
# A flag's value before the command is no command ("unknown command
# '127.0.0.1:1'", exit 0); a command there is none of exits 2.
help=$("$gpipectl" --controller 127.0.0.1:1 status --help) ||
  fail "gpipectl --controller ADDR status --help exited $?"
grep -q -- "usage: gpipectl status" <<<"$help" || fail "gpipectl --controller ADDR status --help: $help"
# A flag several commands read shows each command its own part of its help.
help=$("$gpipectl" fetch --help)
grep -q -- "the directory to write into" <<<"$help" || fail "gpipectl fetch --help: $help"
! grep -q -- "Chrome trace\|trace:" <<<"$help" || fail "gpipectl fetch --help shows trace's -o: $help"
help=$("$gpipectl" plan --help)
grep -q -- "the cluster's workers" <<<"$help" || fail "gpipectl plan --help: $help"
! grep -q -- "worker processes to start\|plan: " <<<"$help" || fail "gpipectl plan --help shows local's --workers: $help"
help=$("$gpipectl" resume --help)
grep -q -- "the job's steps in all" <<<"$help" || fail "gpipectl resume --help: $help"
! grep -q -- "A..B" <<<"$help" || fail "gpipectl resume --help shows trace's --steps: $help"
# The same for a flag spelt with one dash and dashes, as absl takes it.
help=$("$gpipectl" -memory-budget 1G plan --help) ||
  fail "gpipectl -memory-budget 1G plan --help exited $?"
grep -q -- "usage: gpipectl plan" <<<"$help" || fail "gpipectl -memory-budget 1G plan --help: $help"
rc=0
"$gpipectl" nosuch --help >/dev/null 2>"$work/nosuch" || rc=$?
((rc == 2)) || fail "gpipectl nosuch --help exited $rc"
grep -q "unknown command 'nosuch'" "$work/nosuch" || fail "gpipectl nosuch --help: $(cat "$work/nosuch")"
! grep -qE -- "\.cc|\.h\b|/work/" <<<"$("$gpipectl" eval --help; "$gpipectl" --help)" ||
  fail "gpipectl help names source files"

# Replicas: the job above without its batch norm, M=4. With the spec's
# replicas at 2 and no gradient_groups, --replicas 1 sums as one group on
# one stage and on two alike (the flag's R is the run's, for both
# trainers); with gradient_groups pinned to 4, R = 1, 2, 3 (groups shared
# 1, 1, 2) and 4 give the same file, and 8 replicas of 4 groups are refused.
python3 - "$work/job.json" "$work/rep.json" "$work/rep4.json" <<'PY'
import json, sys
spec = json.load(open(sys.argv[1]))
spec["model"]["layers"] = [l for l in spec["model"]["layers"] if "batchNorm" not in l]
spec["pipeline"] = {"stages": 2, "microBatches": 4, "replicas": 2}
json.dump(spec, open(sys.argv[2], "w"))
spec["pipeline"]["gradientGroups"] = 4
json.dump(spec, open(sys.argv[3], "w"))
PY
for run in "1 1" "2 1"; do
  set -- $run
  "$gpipectl" train "$work/rep.json" --stages "$1" --replicas "$2" --steps 3 \
    --out "$work/rep-$1-$2" >"$work/rep.log" 2>&1 || { cat "$work/rep.log"; fail "train --stages $1 --replicas $2"; }
done
same_tensors "$work/rep-1-1/model.safetensors" "$work/rep-2-1/model.safetensors" ||
  fail "--replicas 1 on one stage and on two differ"
for r in 1 2 3 4; do
  "$gpipectl" train "$work/rep4.json" --stages 2 --replicas "$r" --steps 3 \
    --out "$work/g4-$r" >"$work/rep.log" 2>&1 || { cat "$work/rep.log"; fail "train --replicas $r"; }
  grep -q "x $r replicas\|K=2 stages (layers [0-9+]*), M=4" "$work/rep.log" ||
    { cat "$work/rep.log"; fail "the description does not name $r replicas"; }
  same_tensors "$work/g4-1/model.safetensors" "$work/g4-$r/model.safetensors" ||
    fail "gradient_groups 4: R=$r differs from R=1"
done
if "$gpipectl" train "$work/rep4.json" --replicas 8 --steps 1 >"$work/rep.log" 2>&1; then
  fail "8 replicas of 4 groups were taken"
fi
grep -q "pipeline.replicas: 8 replicas are more than gradient_groups 4" "$work/rep.log" ||
  { cat "$work/rep.log"; fail "the bad replica count was not named"; }

# The file alone need not be valid: gradient_groups 2 under ZB-H1 needs 2
# replicas, which --replicas gives (the file was checked before the flags,
# and refused). An error after the flags still names the file.
python3 - "$work/rep.json" "$work/zb2.json" <<'PY'
import json, sys
spec = json.load(open(sys.argv[1]))
spec["pipeline"] = {"stages": 2, "microBatches": 4, "gradientGroups": 2,
                    "schedule": "ZERO_BUBBLE_H1"}
json.dump(spec, open(sys.argv[2], "w"))
PY
"$gpipectl" train "$work/zb2.json" --replicas 2 --steps 2 --out "$work/zb2-r2" \
  >"$work/zb2.log" 2>&1 || { cat "$work/zb2.log"; fail "--replicas 2 did not make gradient_groups 2 runnable"; }
"$gpipectl" train "$work/zb2.json" --stages 1 --schedule gpipe --steps 2 \
  --out "$work/zb2-ref" >"$work/zb2.log" 2>&1 ||
  { cat "$work/zb2.log"; fail "--schedule gpipe did not make gradient_groups 2 on one replica runnable"; }
same_tensors "$work/zb2-ref/model.safetensors" "$work/zb2-r2/model.safetensors" ||
  fail "gradient_groups 2: 2 replicas under ZB-H1 differ from the reference"
if "$gpipectl" train "$work/zb2.json" --steps 1 >"$work/zb2.log" 2>&1; then
  fail "gradient_groups 2 under ZB-H1 on one replica was taken"
fi
grep -q "zb2.json with --steps 1: pipeline.gradient_groups: 2 groups on 1 replica" "$work/zb2.log" ||
  { cat "$work/zb2.log"; fail "the refusal does not name the file and the field"; }
# One the flags caused names them beside the file.
if "$gpipectl" train "$work/zb2.json" --stages 50 --steps 1 >"$work/zb2.log" 2>&1; then
  fail "--stages 50 on a small model was taken"
fi
grep -q "zb2.json with --stages 50 --steps 1: pipeline.stages" "$work/zb2.log" ||
  { cat "$work/zb2.log"; fail "a refusal the flags caused does not name them"; }

# Flags out of range are refused before anything runs, naming the flag and
# the value (a thread count no machine has crashed libgomp; negative counts
# were read as the default), and so is an --out that cannot be a directory,
# before the training whose model it was to keep.
expect_refused() {  # EXPECTED_CODE MESSAGE ARGS...
  local want=$1 message=$2
  shift 2
  set +e
  "$gpipectl" "$@" >"$work/flag.log" 2>&1
  local code=$?
  set -e
  [[ $code == "$want" ]] || { cat "$work/flag.log"; fail "$* exited $code, not $want"; }
  grep -qF -- "$message" "$work/flag.log" || { cat "$work/flag.log"; fail "$*: no '$message'"; }
  ! grep -q "^training " "$work/flag.log" || fail "$*: trained first"
}
# A value given apart keeps its dashes, and a one-dash flag is spelt as
# absl takes it.
expect_refused 2 "--seed: '--a-b' is not" train "$work/job.json" --seed --a-b
expect_refused 2 "-micro-batches: 'x' is not a whole number" \
  train "$work/job.json" -micro-batches x
expect_refused 2 "--threads: must be between 0 (the usable cores) and 1024, got 100000" \
  train "$work/job.json" --steps 1 --threads 100000
expect_refused 2 "--micro-batches: must be >= 0 (0: the default), got -1" \
  train "$work/job.json" --steps 1 --micro-batches -1
# A flag given an empty value (`--step=$STEP` with STEP unset) is refused:
# fetch read it as no --step and downloaded the final model.
expect_refused 2 "--step: an empty value (leave the flag out for its default)" \
  fetch job-1 --step=
expect_refused 2 "--out: an empty value" train "$work/job.json" --steps 1 --out ""
# Flags in range that make the spec invalid are usage errors too (found by
# the spec's checks, they exited 1); the file names itself valid.
expect_refused 2 "--micro-batches 200 --steps 1: pipeline.micro_batches: 200 is larger than batch_size 32" \
  train "$work/job.json" --steps 1 --micro-batches 200
expect_refused 2 "is valid without them" local "$work/job.json" --replicas 65
expect_refused 2 "--workers: must be at most 256" local "$work/job.json" --workers 100000
# More workers than the machine's memory gives 128 MiB each: refused before
# any starts (each was left to advertise the whole machine).
if (( $(awk '/^MemTotal:/ {print $2}' /proc/meminfo) * 1024 / 256 < 128 * 1024 * 1024 )); then
  expect_refused 2 "--workers: 256 workers would have" local "$work/job.json" --workers 256
fi
# A value of the wrong type and a flag that does not exist are usage errors
# too, named as typed (absl's parser exited 1 with "ERROR: Illegal value").
expect_refused 2 "--seed: '-1' is not a whole number >= 0" \
  generate "$work/job.json" --prompt a --seed -1
expect_refused 2 "--micro-batches: 'four' is not a whole number" \
  train "$work/job.json" --micro-batches=four
expect_refused 2 "--bogus: no such flag" train "$work/job.json" --bogus 3
# An argument past the command's own, named (it printed the usage alone).
expect_refused 2 "gpipectl train: unexpected argument 'extra' (usage: gpipectl train JOB.json)" \
  train "$work/job.json" extra
expect_refused 2 "--steps: missing its value" train "$work/job.json" --steps
# Another command's flag: plan printed its own cut under --balance (and
# ignored --out, --threads) without a word.
expect_refused 2 "--balance: plan does not take this flag" \
  plan "$work/job.json" --stages 2 --balance 2,3
expect_refused 2 "--memory-budget: train does not take this flag" \
  train "$work/job.json" --steps 1 --memory-budget 1GiB
# More threads than cores: allowed, but said (a typo of 1000 trained at a
# fiftieth of the speed without a word).
"$gpipectl" train "$work/job.json" --steps 1 --threads $(( $(nproc --all) + 1 )) >"$work/over.log" 2>&1 ||
  { cat "$work/over.log"; fail "train with more threads than cores"; }
grep -q "warning: --threads $(( $(nproc --all) + 1 )) is more than the" "$work/over.log" ||
  { cat "$work/over.log"; fail "no warning for more threads than cores"; }
# Starting weights that are no model file (a text file named by mistake)
# are refused before the local cluster starts, as data is, and named as
# what they are not (a header length read from text was all it said).
echo "not weights" >"$work/notes.txt"
python3 - "$work/job.json" "$work/text_init.json" "$work/notes.txt" <<'PY'
import json, sys
spec = json.load(open(sys.argv[1]))
spec["initFrom"] = {"path": sys.argv[3]}
json.dump(spec, open(sys.argv[2], "w"))
PY
expect_refused 1 "init_from.path: not a safetensors model file: $work/notes.txt" \
  local "$work/text_init.json" --ports 46900-46999
! grep -q "controller" "$work/flag.log" || fail "local started a cluster for weights it could check"
expect_refused 2 "--flops: must be a finite number >= 0" plan "$work/job.json" --flops nan
expect_refused 2 "--measure-under: must be a finite number of seconds >= 0" \
  plan "$work/job.json" --measure-under -1
expect_refused 2 "--out: cannot make $work/job.json a directory" \
  train "$work/job.json" --steps 1 --out "$work/job.json"
# Every flag's bad value is a usage error (2), as the cli README says;
# these were 1 where a command, not gpipectl's first check, found them.
expect_refused 2 "--steps: '0' is not a number of training steps" \
  train "$work/job.json" --steps 0
expect_refused 2 "--schedule: 'zbh1' is not one of" \
  train "$work/job.json" --steps 1 --schedule zbh1
expect_refused 2 "--stages-range: expected LO..HI" \
  plan "$work/job.json" --stages-range 0..3
# A model whose state alone outgrows the machine is refused before it is
# built (it was killed partway, at 24 GB, with no word). 3.2e9 parameters,
# their gradients, momentum and packed copies: 51 GB.
python3 - "$work/job.json" "$work/huge.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
layers = d["model"]["layers"]
layers[0]["linear"]["outFeatures"] = 100000000
layers[1]["batchNorm"]["features"] = 100000000
layers[3]["linear"]["inFeatures"] = 100000000
layers[3]["linear"]["outFeatures"] = 20
layers.append({"linear": {"inFeatures": 20, "outFeatures": 3}})
json.dump(d, open(sys.argv[2], "w"))
PY
if (( $(awk '/^MemTotal:/ {print $2}' /proc/meminfo) < 40 * 1024 * 1024 )); then
  expect_refused 1 "this run needs about" train "$work/huge.json" --steps 1 --stages 1
  # Every stage's share at once, by the memory model the workers and the
  # controller use: a 2-stage run that ran out of memory hung.
  expect_refused 1 "more than the" train "$work/huge.json" --steps 1 --stages 2
else
  echo "skip: this machine has room for the 51 GB model"
fi

# Activations past `ulimit -v` (the parameters fit) are refused before
# anything is built, as the workers refuse them, naming the parts: they
# were found only when an allocation failed (a 2-stage run hung then; that
# a stage's thread running out ends the process with status 3 and the
# message is stage_thread_test's).
cat >"$work/oom.json" <<'JSON'
{"model": {"input": {"dtype": "FLOAT32", "shape": {"dims": [256]}},
  "layers": [{"linear": {"inFeatures": 256, "outFeatures": 4096}}, {"relu": {}},
             {"linear": {"inFeatures": 4096, "outFeatures": 4096}}, {"relu": {}},
             {"linear": {"inFeatures": 4096, "outFeatures": 10}}],
  "loss": {"softmaxCrossEntropy": {}}},
 "optimizer": {"lr": 0.01, "sgd": {}},
 "data": {"synthetic": {"task": "CLASSES", "features": 256, "classes": 10,
                        "trainSamples": 65536, "testSamples": 64}},
 "batchSize": 65536, "steps": 1}
JSON
for stages in 1 2; do
  set +e
  (ulimit -c 0 -v 3000000; exec "$gpipectl" train "$work/oom.json" --threads 1 --stages $stages) >"$work/oom.log" 2>&1
  code=$?
  set -e
  [[ $code == 1 ]] || { cat "$work/oom.log"; fail "past ulimit -v, $stages stage(s) exited $code, not 1"; }
  grep -q "this run needs about .* more than the .* this machine lets the process use: .*activations" "$work/oom.log" ||
    { cat "$work/oom.log"; fail "past ulimit -v, $stages stage(s): no refusal naming the parts"; }
done

# Ctrl-C stops after the step under way and writes the model of the step
# reached (a run asking for checkpoints lost everything, in silence).
python3 - "$work/job.json" "$work/long.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
s["steps"] = 1000000
s["checkpoint"] = {"every": 50}
s.pop("eval", None)
json.dump(s, open(sys.argv[2], "w"))
PY
# A background job of a script inherits SIGINT ignored (and train leaves
# an ignored SIGINT ignored), so it starts with the default restored, as at
# a terminal.
python3 -c 'import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execv(sys.argv[1], sys.argv[1:])' \
  "$gpipectl" train "$work/long.json" --stages 1 --threads 1 --out "$work/stopped" >"$work/int.log" 2>&1 &
trainer=$!
for _ in $(seq 300); do
  grep -q "note: checkpoint.every 50 is for jobs on a cluster" "$work/int.log" 2>/dev/null && break
  sleep 0.1
done
grep -q "note: checkpoint.every 50 is for jobs on a cluster" "$work/int.log" ||
  { kill -9 "$trainer"; cat "$work/int.log"; fail "train did not say that it keeps no checkpoints"; }
sleep 1
# interrupt PID SECONDS LOG WHAT: Ctrl-C to PID, which must exit 130 within
# SECONDS.
interrupt() {
  local pid=$1 tenths=$(($2 * 10)) log=$3 what=$4 code=0
  kill -INT "$pid"
  for _ in $(seq "$tenths"); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$pid" 2>/dev/null; then
    kill -9 "$pid"
    fail "$what went on for $2 s after Ctrl-C"
  fi
  wait "$pid" || code=$?
  [[ $code == 130 ]] || { cat "$log"; fail "Ctrl-C in $what exited $code, not 130"; }
}
interrupt "$trainer" 60 "$work/int.log" "train"
step=$(sed -n 's/^interrupted at step \([0-9]*\) of 1000000; wrote the model of step \1 to .*$/\1/p' "$work/int.log")
[[ -n "$step" ]] || { cat "$work/int.log"; fail "no interrupted line with the model written"; }
python3 - "$work/stopped/model.safetensors" "$step" <<'PY' || fail "the interrupted model's step is not $step"
import json, struct, sys
data = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", data[:8])[0]
meta = json.loads(data[8:8 + n])["__metadata__"]
assert meta["gpipe.step"] == sys.argv[2], meta["gpipe.step"]
PY

# A Ctrl-C during the final evaluation ends it at once, the model already
# written (it was swallowed: the evaluation and the write went on).
python3 - "$work/job.json" "$work/evalslow.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
s["steps"] = 3
s["data"] = {"synthetic": {"task": "CLASSES", "features": 64, "classes": 10,
                           "trainSamples": 256, "testSamples": 400000}}
s["model"] = {"input": {"dtype": "FLOAT32", "shape": {"dims": [64]}},
              "layers": [{"linear": {"inFeatures": 64, "outFeatures": 1024}},
                         {"relu": {}},
                         {"linear": {"inFeatures": 1024, "outFeatures": 1024}},
                         {"relu": {}},
                         {"linear": {"inFeatures": 1024, "outFeatures": 10}}],
              "loss": {"softmaxCrossEntropy": {}}}
s.pop("eval", None)
s.pop("checkpoint", None)
json.dump(s, open(sys.argv[2], "w"))
PY
python3 -c 'import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execv(sys.argv[1], sys.argv[1:])' \
  "$gpipectl" train "$work/evalslow.json" --stages 1 --threads 1 --out "$work/evalslow" >"$work/evalint.log" 2>&1 &
trainer=$!
for _ in $(seq 600); do
  grep -q "^wrote .*evalslow/model.safetensors" "$work/evalint.log" && break
  kill -0 "$trainer" 2>/dev/null || break
  sleep 0.05
done
grep -q "^wrote .*evalslow/model.safetensors" "$work/evalint.log" ||
  { kill -9 "$trainer" 2>/dev/null; cat "$work/evalint.log"; fail "train wrote no model before its final evaluation"; }
interrupt "$trainer" 10 "$work/evalint.log" "train's final evaluation"
if grep -q "^final:" "$work/evalint.log"; then
  cat "$work/evalint.log"; fail "the final evaluation finished after Ctrl-C"
fi
python3 - "$work/evalslow/model.safetensors" <<'PY' || fail "the model written before the final evaluation is not step 3"
import json, struct, sys
data = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", data[:8])[0]
meta = json.loads(data[8:8 + n])["__metadata__"]
assert meta["gpipe.step"] == "3", meta["gpipe.step"]
PY

echo "1 passed, 0 failed"
