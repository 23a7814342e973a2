#!/usr/bin/env bash
# Workers killed -9 exactly while they write their checkpoint files: inotify
# reports each new file under the job's checkpoint directory; when a
# temporary stage file (<stage file>.tmp.<pid>) appears, the worker writing
# it is killed at once: on a shared path that pid itself; through the
# controller (CHECKPOINT_TRANSPORT, default) the temporary file is the
# controller's and the victim is the worker uploading it, the one that runs
# that stage of that epoch. The job must still SUCCEED bitwise equal to the
# uninterrupted run, no committed manifest may list a partial file, no
# temporary file of a cut upload may remain, and the periodic evaluations it
# reports (replays included) must be exactly those `gpipectl train` prints
# at the same steps.
# Knobs: RECOVERY_KILLS (default 3), RECOVERY_STEPS (default 80), KEEP_WORK=1.
#   recovery_checkpoint_kill_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
bin="$1/bin"
src=$2
for b in gpipectl gpipe-controller gpipe-worker; do
  [[ -x "$bin/$b" ]] || { echo "SKIP: $bin/$b is not built"; echo "0 passed, 0 failed"; exit 0; }
done
command -v inotifywait >/dev/null || { echo "SKIP: inotifywait (inotify-tools) is not installed"; echo "0 passed, 0 failed"; exit 0; }
work=$(mktemp -d)
source "$src/tests/scripts/recovery_lib.sh"
watcher=""
mapper=""
stop_watcher() {
  [[ -z "$watcher" ]] || kill "$watcher" 2>/dev/null || true
  [[ -z "$mapper" ]] || kill "$mapper" 2>/dev/null || true
}
trap 'stop_watcher; cleanup' EXIT

kills=${RECOVERY_KILLS:-3}
steps=${RECOVERY_STEPS:-80}
cport=$(free_port)
start_controller
for _ in 1 2 3 4; do start_worker; done
wait_workers 4
# Wide layers inside each stage (a stage file with its Adam moments is about
# 1.5 MB), so that writing and fsyncing it takes long enough for the kill to
# land inside; narrow ones between stages, since wide activations on the
# gRPC links are slow (about 50 ms a frame of 16 KB on loopback).
# A small learning rate keeps the test loss moving over the whole run, so
# that comparing evaluations step by step means something.
spec="$work/ckpt-kill.json"
cat >"$spec" <<JSON
{
  "name": "checkpoint-kill",
  "model": {
    "input": {"dtype": "FLOAT32", "shape": {"dims": [8]}},
    "layers": [
      {"linear": {"inFeatures": 8, "outFeatures": 32}},
      {"linear": {"inFeatures": 32, "outFeatures": 2048}},
      {"relu": {}},
      {"linear": {"inFeatures": 2048, "outFeatures": 32}},
      {"linear": {"inFeatures": 32, "outFeatures": 2048}},
      {"relu": {}},
      {"linear": {"inFeatures": 2048, "outFeatures": 32}},
      {"linear": {"inFeatures": 32, "outFeatures": 2048}},
      {"relu": {}},
      {"linear": {"inFeatures": 2048, "outFeatures": 3}}
    ],
    "loss": {"softmaxCrossEntropy": {}}
  },
  "optimizer": {"lr": 0.0001, "adamw": {}, "clipNorm": 1.0},
  "data": {"synthetic": {"task": "CLASSES", "features": 8, "classes": 3,
                         "trainSamples": 512, "testSamples": 96}},
  "pipeline": {"stages": 3, "microBatches": 4, "balance": [4, 3, 3]},
  "checkpoint": {"every": 5, "keep": 3},
  "eval": {"every": 5, "maxSamples": 64},
  "batchSize": 32,
  "steps": $steps,
  "seed": 11,
  "maxRestarts": 100
}
JSON
mkdir -p "$work/ckpt"
events="$work/events"
mkfifo "$events"
inotifywait -m -r -q -e create --format '%w%f' "$work/ckpt" >"$events" 2>"$work/inotify.log" &
watcher=$!
exec 3<"$events"
sleep 0.3  # the watches are in place

declare -A victim_of  # pid -> worker name
for name in "${!worker_pid[@]}"; do victim_of[${worker_pid[$name]}]=$name; done
# The pid of the worker that runs `stage` of `epoch`, or nothing.
uploader() {
  local epoch=$1 stage=$2 line entry name
  [[ -f "$stage_map" ]] || return 0
  read -r line <"$stage_map" || return 0
  [[ "${line%% *}" == "$epoch" ]] || return 0
  for entry in ${line#* }; do
    [[ "${entry%%=*}" == "$stage" ]] || continue
    for name in "${!worker_port[@]}"; do
      [[ "${entry#*=}" == "127.0.0.1:${worker_port[$name]}" ]] && echo "${worker_pid[$name]}"
    done
  done
  return 0
}
# A loaded machine can finish a job before the stage map catches up with an
# upload (seen in CI beside a compiler): then a new job, at most 3.
for attempt in 1 2 3; do
  job=$(submit "$spec")
  # Through the controller: "<epoch> <stage>=<address> ..." of the running
  # epoch, kept fresh in the background, so that the kill needs no process
  # start between the temporary file appearing and the signal.
  stage_map="$work/stage_map"
  rm -f "$stage_map"  # an earlier attempt's job
  if [[ "$transport" == controller ]]; then
    (
      while :; do
        line=$(job_field "$job" "'%d %s' % (int(s.get('epoch', 0)), ' '.join('%d=%s' % (int(x.get('stage', 0)), x.get('address', '')) for x in s.get('stages', [])))") || true
        if [[ -n "$line" ]]; then echo "$line" >"$stage_map.tmp" && mv "$stage_map.tmp" "$stage_map"; fi
        sleep 0.05
      done
    ) &
    mapper=$!
  fi
  landed=0 writing=0 renamed=0 killed_epoch=0
  deadline=$((SECONDS + ${DONE_TIMEOUT:-120}))
  while ((landed < kills && SECONDS < deadline)); do
    read -r -t 1 path <&3 || { [[ "$(job_field "$job" "s.get('state','')")" == SUCCEEDED ]] && break; continue; }
    # One kill per epoch: the other stages' files of a checkpoint whose
    # epoch already lost a worker are part of the same failure.
    [[ "$path" =~ /e([0-9]+)-stage-([0-9]+)\.safetensors\.tmp\.([0-9]+)$ ]] || continue
    epoch=${BASH_REMATCH[1]} stage=${BASH_REMATCH[2]} pid=${BASH_REMATCH[3]}
    ((epoch > killed_epoch)) || continue
    if [[ "$transport" == controller ]]; then
      pid=$(uploader "$epoch" "$stage")
      [[ -n "$pid" ]] || continue
    fi
    victim=${victim_of[$pid]:-}
    [[ -n "$victim" && -n "${worker_port[$victim]:-}" ]] || continue
    kill -9 "$pid"
    killed_epoch=$epoch
    if [[ -e "$path" ]]; then
      phase="while writing"
      writing=$((writing + 1))
    else
      phase="just after the rename of its file"
      renamed=$((renamed + 1))
    fi
    landed=$((landed + 1))
    echo "kill -9 $victim (pid $pid) $phase: $(basename "$path")"
    unset "worker_port[$victim]"
    start_worker
    victim_of[${worker_pid[$last_worker]}]=$last_worker
  done
  ((landed >= 1)) && break
  [[ -z "$mapper" ]] || { kill "$mapper" 2>/dev/null || true; wait "$mapper" 2>/dev/null || true; mapper=""; }
  echo "no kill landed on a checkpoint write of job $job (attempt $attempt)"
done
exec 3<&-
stop_watcher
((landed >= 1)) || fail "no kill landed on a checkpoint write in 3 jobs"
wait_done "$job"
same_as_reference "$job" "$spec" 4
restarts=$(job_field "$job" "s.get('restarts', 0)")
((restarts >= 1)) || fail "job $job counts no restarts after $landed kills"

# No committed manifest lists a partial or damaged file.
python3 - "$work/ckpt/$job" <<'PY' || fail "a committed manifest of job $job lists a bad file"
import hashlib, json, os, sys
manifests = 0
for root, _, files in os.walk(sys.argv[1]):
    if "MANIFEST.json" not in files:
        continue
    manifests += 1
    m = json.load(open(os.path.join(root, "MANIFEST.json")))
    for f in m["files"]:
        path = os.path.join(root, f["path"])
        assert ".tmp" not in f["path"], f"{path}: a temporary file is listed"
        data = open(path, "rb").read()
        assert len(data) == int(f["bytes"]), f"{path}: {len(data)} bytes, manifest says {f['bytes']}"
        assert hashlib.sha256(data).hexdigest() == f["sha256"], f"{path}: sha256 differs"
assert manifests >= 2, f"only {manifests} committed manifests"
print(f"{manifests} committed manifests, every file whole")
PY

# Through the controller, an upload cut by its worker's death leaves no
# temporary file behind (on a shared path the dead writer's stays).
if [[ "$transport" == controller ]]; then
  left=$(find "$work/ckpt" -name '*.tmp.*' | head -n 3)
  [[ -z "$left" ]] || fail "cut uploads left temporary files: $left"
fi

# The evaluations, replays included, are gpipectl train's at the same steps.
"$bin/gpipectl" --controller "127.0.0.1:$cport" status "$job" --json >"$work/status.json"
python3 - "$work/status.json" "$work/ref.txt" "$steps" <<'PY' || fail "job $job's evaluations differ from gpipectl train's"
import json, re, sys
s = json.load(open(sys.argv[1]))["status"]
ref = open(sys.argv[2]).read()
steps = int(sys.argv[3])
def line(e):
    return "test loss %.4f, test accuracy %.4f (%d targets)" % (
        e.get("loss", 0.0), e.get("accuracy", 0.0), int(e.get("counted", 0)))
want = dict(re.findall(r"^step (\d+): (test loss .*)$", ref, re.M))
got = {e["step"]: line(e) for e in s.get("evaluations", []) if int(e["step"]) < steps}
assert want, "gpipectl train printed no periodic evaluations"
assert got == want, f"cluster {got} != train {want}"
final = re.search(r"^final: (.*)$", ref, re.M).group(1)
assert line(s["evaluation"]) == final, f"final {line(s['evaluation'])} != {final}"
assert int(s["latestEvaluation"]["step"]) == steps
print(f"{len(got)} periodic evaluations and the final one match gpipectl train")
PY
echo "checkpoint kills ($transport): the job survived $landed kills ($writing while writing, $renamed just after the rename; $restarts restarts), bitwise the uninterrupted run"
echo "1 passed, 0 failed"
