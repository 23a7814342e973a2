#!/usr/bin/env bash
# init_from on a real controller and workers on loopback: a job continued
# from a fetched checkpoint (relative path, optimizer state carried) ends
# with parameters bitwise equal to one uninterrupted run, on the cluster and
# in process; a model file of another model fails the job naming the
# tensors before it is scheduled; a path the controller cannot see is
# refused at submit.
#   init_from_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
bin="$1/bin"
src=$2
for b in gpipectl gpipe-controller gpipe-worker; do
  [[ -x "$bin/$b" ]] || { echo "SKIP: $bin/$b is not built"; echo "0 passed, 0 failed"; exit 0; }
done
work=$(mktemp -d)
source "$src/tests/scripts/recovery_lib.sh"
trap cleanup EXIT

write_spec "$work/whole.json" whole 40 2 2 "$ADAMW"
cport=$(free_port)
start_controller
start_worker
start_worker
wait_workers 2
whole=$(submit "$work/whole.json")
wait_done "$whole"
ctl fetch "$whole" --step 20 -o "$work/step20" >/dev/null
ok "a 40-step run, and its checkpoint of step 20 fetched"

# The same spec continuing from the fetched directory, named relative to
# where it is submitted.
python3 - "$work/whole.json" "$work/cont.json" <<'PY'
import json, sys
spec = json.load(open(sys.argv[1]))
spec["name"] = "continued"
spec["initFrom"] = {"path": "step20", "optimizerState": True}
json.dump(spec, open(sys.argv[2], "w"))
PY
cont=$(cd "$work" && submit cont.json)
[[ "$(job_field "$cont" "s.get('totalSteps')")" == 40 ]] || fail "the continued job lost its step count"
wait_done "$cont"
# Its run began at step 20: its time and rate count the 20 steps it ran.
[[ "$(job_field "$cont" "s.get('runFromStep')")" == 20 ]] ||
  fail "the continued job's run_from_step is $(job_field "$cont" "s.get('runFromStep')"), not 20"
python3 "$src/tests/scripts/same_tensors.py" "$work/ckpt/$whole/model.safetensors" \
  "$work/ckpt/$cont/model.safetensors" ||
  fail "steps 21-40 continued from step 20 differ from the uninterrupted run"
grep -q "init_from $work/step20: loaded" "$work"/w*.log ||
  fail "no worker logged what init_from loaded: $(grep -h init_from "$work"/w*.log | head -3)"
ok "continued from step 20 on the cluster: bitwise the uninterrupted run"

(cd "$work" && "$bin/gpipectl" train cont.json --stages 2 --threads 1 --out "$work/local") >"$work/train.txt" 2>&1 ||
  fail "gpipectl train with init_from failed: $(tail -n 3 "$work/train.txt")"
grep -q "continuing from step 20" "$work/train.txt" || fail "train did not say where it continued: $(head -n 3 "$work/train.txt")"
# It counts the steps it ran, not the checkpoint's (it said "trained 40
# steps" of a run that trained 20).
grep -q "^trained 20 steps in" "$work/train.txt" || fail "train miscounted its steps: $(grep trained "$work/train.txt")"
python3 "$src/tests/scripts/same_tensors.py" "$work/ckpt/$whole/model.safetensors" \
  "$work/local/model.safetensors" || fail "the in-process continuation differs"
ok "the same in process (gpipectl train --stages 2)"

# A model file of a narrower model: the job fails, naming the tensors.
ctl fetch "$whole" -o "$work/final" >/dev/null
python3 - "$work/whole.json" "$work/narrow.json" "$work/final/model.safetensors" <<'PY'
import json, sys
spec = json.load(open(sys.argv[1]))
spec["name"] = "narrow"
layers = spec["model"]["layers"]
layers[0]["linear"]["outFeatures"] = 16
layers[2]["linear"]["inFeatures"] = 16
spec["initFrom"] = {"path": sys.argv[3]}
json.dump(spec, open(sys.argv[2], "w"))
PY
narrow=$(submit "$work/narrow.json")
for _ in $(seq 200); do
  state=$(job_field "$narrow" "s.get('state', '')")
  [[ "$state" == FAILED ]] && break
  sleep 0.05
done
[[ "$state" == FAILED ]] || fail "a job whose init_from does not fit ended $state"
why=$(ctl status "$narrow" 2>&1)
grep -q "layers.0.weight is float32 \[32, 8\] in the file, float32 \[16, 8\] in the model" <<<"$why" ||
  fail "the failure does not name the tensor: $(grep -i init_from <<<"$why" | head -3)"
# The controller read the file before it scheduled the job: no worker ran it.
[[ "$(job_field "$narrow" "s.get('epoch', '0')")" == 0 ]] ||
  fail "the job was scheduled before its weights were checked: $why"
grep -q "InvalidData" <<<"$why" || fail "the failure is not InvalidData: $why"
ok "init_from of another model's file fails the job at submit, naming the tensors"

python3 - "$work/whole.json" "$work/missing.json" <<'PY'
import json, sys
spec = json.load(open(sys.argv[1]))
spec["initFrom"] = {"path": "/nonexistent/weights.safetensors"}
json.dump(spec, open(sys.argv[2], "w"))
PY
refused "init_from.path: /nonexistent/weights.safetensors does not exist on the controller" \
  ctl submit "$work/missing.json"
ok "a path the controller cannot see is refused at submit"
echo "$passed passed, 0 failed"
