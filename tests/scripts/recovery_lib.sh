# Helpers for the recovery tests (sourced, not a test): a controller with a
# job store on a fixed loopback port, workers on known ports, job status
# polling, and the comparison with the single-process reference trainer.
# The caller sets $bin, $src and $work and sources this file.
#
# CHECKPOINT_TRANSPORT (default controller) is the controller's
# --checkpoint_transport. Every worker runs in a directory of its own; with
# the files through the controller, each also runs (where unshare works:
# root) in a mount namespace of its own in which the controller's
# checkpoint directory is an empty tmpfs, so a file a stage needs can only
# have come through the controller's API.
# Workers start in directories of their own: the binaries by absolute path.
bin=$(realpath "$bin")
transport=${CHECKPOINT_TRANSPORT:-controller}
isolate=""
if [[ "$transport" == controller ]] && unshare --mount --propagation private true 2>/dev/null; then
  isolate=yes
fi

pids=()
worker_args=()         # more flags for every worker start_worker starts
declare -A worker_pid   # worker name -> pid
declare -A worker_port  # worker name -> Stage service port
controller_pid=""
next_worker=0

cleanup() {
  local pid
  for pid in "${pids[@]}"; do kill -CONT "$pid" 2>/dev/null || true; kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do
    for _ in $(seq 30); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  done
  wait 2>/dev/null || true
  [[ -n "${KEEP_WORK:-}" ]] || rm -rf "$work"
}

show_logs() {
  local f
  echo "--- checkpoint transport: $transport${isolate:+ (workers in their own mount namespaces)}" >&2
  for f in "$work"/*.log; do
    [[ -f "$f" ]] || continue
    echo "--- $f" >&2
    tail -n 15 "$f" >&2
  done
}

fail() {
  echo "FAIL: $*" >&2
  show_logs
  exit 1
}

# ctl ARGS...: gpipectl against this test's controller.
ctl() { "$bin/gpipectl" --controller "127.0.0.1:$cport" "$@"; }

# rss_mb PID: the process's resident memory in MB.
rss_mb() { awk '/^VmRSS/ {print int($2 / 1024)}' "/proc/$1/status"; }

# ok WHAT: one check passed ($passed counts them).
passed=0
ok() {
  echo "ok: $*"
  passed=$((passed + 1))
}

# refused WORDS CMD...: CMD fails saying WORDS; prints what it said.
refused() {
  local words=$1 out rc
  shift
  set +e
  out=$("$@" 2>&1)
  rc=$?
  set -e
  ((rc != 0)) || fail "accepted: $* -> $out"
  [[ "$out" == *"$words"* ]] || fail "refused without '$words': $out"
  echo "   $out" | head -c 300
  echo
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# start_controller: on $cport (kept across restarts), same --store.
start_controller() {
  "$bin/gpipe-controller" --listen "127.0.0.1:$cport" \
    --checkpoint_dir "$work/ckpt" --checkpoint_transport "$transport" \
    --store "$work/jobs.db" --metrics_listen "" \
    --heartbeat_timeout_ms "${LEASE_MS:-1500}" --heartbeat_interval_ms 100 \
    >>"$work/controller.log" 2>&1 &
  controller_pid=$!
  pids+=("$controller_pid")
  local _
  for _ in $(seq 100); do
    "$bin/gpipectl" --controller "127.0.0.1:$cport" list >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  fail "the controller did not come up within 10 s"
}

# start_worker: a new worker process; prints nothing, sets $last_worker.
start_worker() {
  local name="w$next_worker" port
  next_worker=$((next_worker + 1))
  port=$(free_port)
  mkdir -p "$work/$name" "$work/ckpt"
  local args=(--controller "127.0.0.1:$cport" --listen "127.0.0.1:$port" --threads 1
    ${worker_args[@]+"${worker_args[@]}"})
  if [[ -n "$isolate" ]]; then
    (cd "$work/$name" && exec unshare --mount --propagation private \
      sh -c 'mount -t tmpfs -o size=1m gpipe-hidden "$0" && exec "$@"' \
      "$work/ckpt" "$bin/gpipe-worker" "${args[@]}") >"$work/$name.log" 2>&1 &
  else
    (cd "$work/$name" && exec "$bin/gpipe-worker" "${args[@]}") >"$work/$name.log" 2>&1 &
  fi
  worker_pid[$name]=$!
  worker_port[$name]=$port
  pids+=($!)
  last_worker=$name
}

# wait_workers N: until N workers are attached (10 s).
wait_workers() {
  local _ n
  for _ in $(seq 100); do
    n=$("$bin/gpipectl" --controller "127.0.0.1:$cport" workers --json 2>/dev/null |
      python3 -c 'import json,sys; print(len(json.load(sys.stdin).get("workers", [])))' 2>/dev/null || echo 0)
    ((n >= $1)) && return 0
    sleep 0.1
  done
  fail "only $n of $1 workers attached within 10 s"
}

# job_field JOB EXPR: a Python expression over the job status `s`.
job_field() {
  "$bin/gpipectl" --controller "127.0.0.1:$cport" status "$1" --json 2>/dev/null |
    python3 -c "import json,sys; s=json.load(sys.stdin).get('status', {}); print($2)" 2>/dev/null
}

# busy_workers JOB: names of the workers running stages of JOB now.
busy_workers() {
  local addrs name
  addrs=$(job_field "$1" "' '.join(x.get('address','') for x in s.get('stages', []))")
  for name in "${!worker_port[@]}"; do
    [[ " $addrs " == *" 127.0.0.1:${worker_port[$name]} "* ]] && echo "$name"
  done
  return 0
}

# running_busy_workers JOB: busy_workers once the job is RUNNING with its
# stages placed, waiting up to 10 s: between epochs (a re-partition from
# measured costs or speeds, which a loaded machine can set off, or a
# recovery) it lists no stages for a moment. Nothing when it never is.
running_busy_workers() {
  local _ names
  for _ in $(seq 100); do
    names=$(busy_workers "$1")
    [[ -n "$names" && "$(job_field "$1" "s.get('state','')")" == RUNNING ]] && {
      echo "$names"
      return 0
    }
    sleep 0.1
  done
  return 0
}

# wait_step JOB STEP: until the job has completed STEP steps (or ended).
wait_step() {
  local _ st
  for _ in $(seq 600); do
    st=$(job_field "$1" "s.get('state','') + ' ' + str(s.get('step', 0))")
    case "$st" in
      SUCCEEDED* | FAILED* | CANCELLED*) return 0 ;;
      RUNNING*) (("${st#* }" >= $2)) && return 0 ;;
    esac
    sleep 0.05
  done
  fail "job $1 did not reach step $2 within 30 s (last: $st)"
}

# wait_done JOB: until it ends; fails unless SUCCEEDED.
wait_done() {
  local out rc
  set +e
  out=$(timeout -k 5 "${DONE_TIMEOUT:-120}" "$bin/gpipectl" --controller "127.0.0.1:$cport" watch "$1" 2>&1)
  rc=$?
  set -e
  grep -q SUCCEEDED <<<"$out" || fail "job $1 did not succeed (watch exit $rc): $(tail -n 5 <<<"$out")"
}

submit() {
  "$bin/gpipectl" --controller "127.0.0.1:$cport" submit "$1" | tail -n 1
}

# same_as_reference JOB SPEC M: the job's model.safetensors is bitwise the
# single-process reference trainer's over the same M micro-batches.
same_as_reference() {
  local model="$work/ckpt/$1/model.safetensors" ref="$work/ref-$(basename "$2" .json)"
  [[ -f "$model" ]] || fail "job $1 wrote no $model"
  if [[ ! -f "$ref/model.safetensors" ]]; then
    "$bin/gpipectl" train "$2" --stages 1 --micro-batches "$3" --threads 1 \
      --out "$ref" >"$work/ref.txt" 2>&1 || fail "reference run failed: $(cat "$work/ref.txt")"
  fi
  python3 "$src/tests/scripts/same_tensors.py" "$ref/model.safetensors" "$model" ||
    fail "job $1's parameters differ from the uninterrupted reference run"
}

# write_spec FILE NAME STEPS STAGES MIN_STAGES OPTIMIZER_JSON
write_spec() {
  cat >"$1" <<JSON
{
  "name": "$2",
  "model": {
    "input": {"dtype": "FLOAT32", "shape": {"dims": [8]}},
    "layers": [
      {"linear": {"inFeatures": 8, "outFeatures": 32}},
      {"relu": {}},
      {"linear": {"inFeatures": 32, "outFeatures": 32}},
      {"batchNorm": {"features": 32}},
      {"relu": {}},
      {"linear": {"inFeatures": 32, "outFeatures": 32}},
      {"relu": {}},
      {"linear": {"inFeatures": 32, "outFeatures": 3}}
    ],
    "loss": {"softmaxCrossEntropy": {}}
  },
  "optimizer": $6,
  "data": {"synthetic": {"task": "CLASSES", "features": 8, "classes": 3,
                         "trainSamples": 512, "testSamples": 128}},
  "pipeline": {"stages": $4, "microBatches": 4, "minStages": $5,
               "elasticGraceMs": 1000},
  "checkpoint": {"every": 10, "keep": 3},
  "batchSize": 32,
  "steps": $3,
  "seed": 7,
  "maxRestarts": 100
}
JSON
}

# write_replica_spec FILE NAME STEPS REPLICAS [GRADIENT_GROUPS [CHECKPOINT_EVERY]]:
# write_spec's model (its batch norm's running averages move by every
# replica's micro-batches) on 2 stages x REPLICAS with AdamW and clipping.
write_replica_spec() {
  write_spec "$1" "$2" "$3" 2 0 "$ADAMW"
  python3 - "$1" "$4" "${5:-0}" "${6:-0}" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
d["pipeline"]["replicas"] = int(sys.argv[2])
if int(sys.argv[3]):
    d["pipeline"]["gradientGroups"] = int(sys.argv[3])
if int(sys.argv[4]):
    d["checkpoint"]["every"] = int(sys.argv[4])
json.dump(d, open(sys.argv[1], "w"))
PY
}

# kill_replica JOB FIELD: kill -9 a worker of the job listed in the status's
# FIELD (stages: replica 0, replicaStages: the others); prints its name.
kill_replica() {
  local addrs name
  addrs=$(job_field "$1" "' '.join(x.get('address','') for x in s.get('$2', []))")
  for name in "${!worker_port[@]}"; do
    if [[ " $addrs " == *" 127.0.0.1:${worker_port[$name]} "* ]]; then
      kill -9 "${worker_pid[$name]}"
      unset "worker_port[$name]"
      echo "$name"
      return 0
    fi
  done
  fail "no worker of $2 among $addrs"
}

# wait_replicas JOB R: until the job runs R replicas in an epoch after EPOCH.
wait_replicas() {
  local _ got
  for _ in $(seq 600); do
    got=$(job_field "$1" "s.get('state','') + ' ' + str(s.get('runningReplicas', 0)) + ' ' + str(s.get('epoch', 0))")
    [[ "$got" == SUCCEEDED* ]] && fail "the job ended before it ran $2 replicas: raise REPLICA_STEPS"
    read -r state replicas epoch <<<"$got"
    [[ "$state" == RUNNING && "$replicas" == "$2" && "$epoch" -gt "$EPOCH" ]] && return 0
    sleep 0.1
  done
  fail "job $1 did not run $2 replicas within 60 s (last: $got)"
}

# drop_batch_norm FILE: the spec without its batch norm (a GPU stage runs
# none under replicas: its averages move inside the CUDA kernel).
drop_batch_norm() {
  python3 - "$1" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
d["model"]["layers"] = [l for l in d["model"]["layers"] if "batchNorm" not in l]
json.dump(d, open(sys.argv[1], "w"))
PY
}

SGD='{"lr": 0.05, "sgd": {"momentum": 0.9}, "warmupSteps": 20, "decay": "LR_DECAY_COSINE", "minLr": 0.001}'
ADAMW='{"lr": 0.01, "adamw": {}, "clipNorm": 1.0, "decay": "LR_DECAY_LINEAR"}'
