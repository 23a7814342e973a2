#!/usr/bin/env bash
# The GPU checks in one run, as the first command on a GPU machine that has
# none of our dependencies (see bench/device_pack.sh): unpack the carried
# binaries and libraries, find cuBLAS (and cuDNN, optional) and the driver
# there, then, most important first:
#   1. a 2-stage local cluster on CUDA IPC, bitwise equal to gRPC frames;
#   3. five `gpipectl train --stages 2 --schedule 1f1b --device cuda` runs
#      of an MLP and a Transformer, each bitwise equal to `--stages 1`; the
#      MLP with 2 data-parallel replicas (their sum through the host)
#      bitwise equal to 1 replica of the same groups;
#   4. kill -9 of a worker mid-job on CUDA IPC: nothing hangs, the job
#      recovers on a replacement and ends bitwise where the run without a
#      kill ends;
#   5. the CUDA tests (the CNN ones with and without cuDNN when it is
#      there), compute-sanitizer (memcheck, racecheck, synccheck) on the
#      CUDA unit tests where the tool is present (2), a K=4 pipeline of stage processes on the one GPU (CUDA IPC,
#      then gRPC frames) against torch.distributed.pipelining with the same
#      model, partition and micro-batches, gpu_bench (sgemm against cuBLAS's
#      peak, convolutions, training steps) and the same steps in PyTorch;
#   6. with what is left, not a GPU check: pipeline_bench's schedules at
#      K=2 and K=4 on the machine's CPU cores (informational);
# and print PASS/FAIL per item. Every part has a timeout and the whole run
# a budget of 8 minutes. Logs go to $OUT.
#   bash .devcarry/device_check.sh      (from the checkout's root)
# Without a GPU it says so and fails at once; to check the script itself,
# GPIPE_DEVICE_CHECK_CPU=1 then runs only the pipeline part's plumbing on
# the CPU (carried loader, wrappers, timing) with --device cpu, and
# GPIPE_DEVICE_CHECK_FAKE=1 runs checks 1-4 on the fake device
# (GPIPE_FAKE_DEVICE=1, services/tensor/fake_device.h) with shared memory
# where CUDA IPC would be.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-/tmp/gpipe-device-out}
mkdir -p "$out"
work=$(mktemp -d)
# The workers' and controller's logs of every kept run go to $out/runs.
keep_logs() {
  local d
  for d in "$work"/*-run; do
    [[ -d $d ]] || continue
    mkdir -p "$out/runs/${d##*/}"
    cp "$d"/*.log "$out/runs/${d##*/}/" 2>/dev/null
  done
  rm -rf "$work"
}
trap keep_logs EXIT
tar -C "$work" -xJf "$here/gpipe-device.tar.xz" || { echo "FAIL: unpack"; exit 1; }
exec > >(tee "$out/device_check.log") 2>&1
# Seconds left of the budget (8 minutes unless GPIPE_DEVICE_BUDGET says),
# at most $1, at least 1.
budget=${GPIPE_DEVICE_BUDGET:-470}
left() {
  local l=$((budget - SECONDS))
  ((l > $1)) && l=$1
  ((l < 1)) && l=1
  echo "$l"
}
echo "== machine [${SECONDS} s]"
cpu_only=
fake=
ipc=cuda_ipc
if ! nvidia-smi -L >/dev/null 2>&1; then
  echo "no GPU here: nvidia-smi -L failed (device_check runs on a GPU machine)"
  if [[ ${GPIPE_DEVICE_CHECK_FAKE:-} == 1 ]]; then
    export GPIPE_FAKE_DEVICE=1
    fake=1
    ipc=shm
  elif [[ ${GPIPE_DEVICE_CHECK_CPU:-} == 1 ]]; then
    cpu_only=1
  else
    echo "overall: FAIL (no GPU)"
    exit 1
  fi
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null
uname -srm
ls -d /usr/local/cuda*/ 2>/dev/null
find /usr/local /usr/lib /opt -name 'libcublas.so*' -o -name 'libcudnn.so*' \
  2>/dev/null | head -12
# cuBLAS 13 and cuDNN 9 (optional): the toolkit's, or python's nvidia
# packages'. The first cuDNN directory found is the one used.
libdirs=()
cudnn_dir=
for d in /usr/local/cuda/lib64 /usr/local/cuda*/lib64 /usr/local/cuda*/lib \
         /usr/local/cuda*/targets/x86_64-linux/lib /usr/lib/x86_64-linux-gnu \
         /opt/torch/.venv/lib/python3*/site-packages/nvidia/*/lib \
         /usr/local/lib/python3*/dist-packages/nvidia/*/lib; do
  [[ -d $d ]] || continue
  ls "$d"/libcublas.so.13* >/dev/null 2>&1 && libdirs+=("$d")
  if [[ -z $cudnn_dir ]] && ls "$d"/libcudnn.so.9* >/dev/null 2>&1; then
    cudnn_dir=$d
    [[ " ${libdirs[*]} " == *" $d "* ]] || libdirs+=("$d")
  fi
done
echo "cuDNN: ${cudnn_dir:-none found (convolutions use our im2col path)}"
driver=$(ldconfig -p | awk '/libcuda.so.1 / {print $NF; exit}')
[[ -n $driver ]] && libdirs+=("$(dirname "$driver")")
path="$work/lib"
for d in "${libdirs[@]}"; do path="$path:$d"; done
echo "library path: $path"
run() {
  local secs=$1
  shift
  timeout "$secs" "$work/lib/ld-linux-x86-64.so.2" --library-path "$path" \
    "$work/bin/$1" "${@:2}"
}
export GPIPE_EXAMPLES="$work/bench"
declare -A result
py=python3
[[ -x /opt/torch/.venv/bin/python3 ]] && py=/opt/torch/.venv/bin/python3

# gpipectl local finds gpipe-controller and gpipe-worker next to itself
# (that is the carried loader here) or on PATH: wrappers that run them
# through the loader go first on PATH.
mkdir -p "$work/wrap"
for b in gpipectl gpipe-controller gpipe-worker; do
  printf '#!/bin/sh\nexec "%s" --library-path "%s" "%s" "$@"\n' \
    "$work/lib/ld-linux-x86-64.so.2" "$path" "$work/bin/$b" >"$work/wrap/$b"
  chmod +x "$work/wrap/$b"
done
ctl() { PATH="$work/wrap:$PATH" timeout "$1" gpipectl "${@:2}"; }

# The pipeline on one GPU: K=4 gpipe-worker processes started by gpipectl
# local, CUDA IPC between them, then gRPC frames; ms/step from the
# controller's start and end times of a short and a long run (the difference
# leaves out start-up, the first step's cuBLAS load and the final
# evaluation); then PyTorch's pipelining on the same model and partition.
pipeline_check() {
  local device=$1 planes=($2)
  echo "== pipeline: K=4 stage processes on one device ($device), M=8 [${SECONDS} s]"
  local spec="$work/bench/gpu_pipe_mlp.json" short=20 long=120 plane steps
  [[ $device == cpu ]] && short=2 long=6  # the plumbing check: keep it short
  local -A secs
  for plane in "${planes[@]}"; do
    for steps in $short $long; do
      PATH="$work/wrap:$PATH" timeout "$(left 60)" gpipectl local "$spec" \
        --workers 4 --stages 4 --balance 4,4,4,3 --micro-batches 8 \
        --steps "$steps" --threads 2 --device "$device" --data_plane "$plane" \
        --json --out "$work/pipe-$plane-$steps" \
        --keep "$work/pipe-$plane-$steps-run" \
        >"$out/pipe-$plane-$steps.log" 2>&1
      local rc=$?
      secs[$plane-$steps]=$(job_seconds "$out/pipe-$plane-$steps.log")
      if ((rc != 0)) || [[ -z ${secs[$plane-$steps]} ]]; then
        tail -15 "$out/pipe-$plane-$steps.log"
        result[pipeline_$plane]="FAIL (rc $rc, $steps steps)"
        continue 2
      fi
    done
    local n
    n=$(grep -h -c "data plane to stage [0-9]* is $plane (--data_plane $plane)" \
      "$work/pipe-$plane-$long-run"/worker-*.log 2>/dev/null | awk '{s += $1} END {print s + 0}')
    local ms
    ms=$(awk -v a="${secs[$plane-$short]}" -v b="${secs[$plane-$long]}" \
      -v n=$((long - short)) 'BEGIN {printf "%.2f", 1000 * (b - a) / n}')
    echo "ours, $plane between the stages: ${ms} ms/step ($n of 3 links logged $plane)"
    pipe_ms[$plane]=$ms
    result[pipeline_$plane]=$([[ $n == 3 ]] && echo PASS || echo "FAIL ($n of 3 links on $plane)")
  done
  if [[ $device == cuda && -n ${pipe_ms[cuda_ipc]:-} ]]; then
    # Informational: where a CUDA IPC hop's time goes. Each link logs at its
    # end how long its stage waited for the sender's copies and for its own
    # copies out; then the same job with the stage waiting for every copy
    # out itself (the plane's first design) against the releasing thread.
    grep -h "cuda_ipc link:" "$work/pipe-cuda_ipc-$long-run"/worker-*.log 2>/dev/null | sed 's/^/  /'
    local sync_secs=()
    for steps in $short $long; do
      GPIPE_CUDA_IPC_SYNC_RELEASE=1 PATH="$work/wrap:$PATH" timeout "$(left 60)" \
        gpipectl local "$spec" --workers 4 --stages 4 --balance 4,4,4,3 \
        --micro-batches 8 --steps "$steps" --threads 2 --device cuda \
        --data_plane cuda_ipc --json --out "$work/pipe-ipcsync-$steps" \
        --keep "$work/pipe-ipcsync-$steps-run" >"$out/pipe-ipcsync-$steps.log" 2>&1 || break
      sync_secs+=("$(job_seconds "$out/pipe-ipcsync-$steps.log")")
    done
    if ((${#sync_secs[@]} == 2)) && [[ -n ${sync_secs[0]} && -n ${sync_secs[1]} ]]; then
      awk -v a="${sync_secs[0]}" -v b="${sync_secs[1]}" -v n=$((long - short)) \
        -v r="${pipe_ms[cuda_ipc]}" 'BEGIN {printf "cuda_ipc, each copy out waited for on the stage (GPIPE_CUDA_IPC_SYNC_RELEASE=1): %.2f ms/step, against %s with the releasing thread (informational)\n", 1000 * (b - a) / n, r}'
      grep -h "cuda_ipc link:" "$work/pipe-ipcsync-$long-run"/worker-*.log 2>/dev/null | sed 's/^/  /'
      cmp -s "$work/pipe-ipcsync-$long/model.safetensors" "$work/pipe-cuda_ipc-$long/model.safetensors" ||
        echo "  (its parameters DIFFER from the releasing thread's run)"
    else
      echo "cuda_ipc with GPIPE_CUDA_IPC_SYNC_RELEASE=1 did not finish (informational): $out/pipe-ipcsync-*.log"
    fi
  fi
  if [[ -n ${pipe_ms[${planes[0]}]:-} && -n ${pipe_ms[${planes[1]}]:-} ]]; then
    if cmp -s "$work/pipe-${planes[0]}-$long/model.safetensors" \
      "$work/pipe-${planes[1]}-$long/model.safetensors"; then
      echo "parameters after $long steps: bitwise equal on ${planes[0]} and ${planes[1]}"
    else
      echo "parameters after $long steps DIFFER between ${planes[0]} and ${planes[1]}"
      result[pipeline_${planes[0]}]="FAIL (parameters differ from ${planes[1]})"
    fi
  fi
}
declare -A pipe_ms
# Seconds between the job's "started" and "finished" in gpipectl's --json.
job_seconds() {
  local line s f
  line=$(grep '"finished"' "$1" | tail -1)
  s=$(sed -n 's/.*"started":"\([^"]*\)".*/\1/p' <<<"$line")
  f=$(sed -n 's/.*"finished":"\([^"]*\)".*/\1/p' <<<"$line")
  [[ -n $s && -n $f ]] || return 0
  awk -v s="$(date -d "$s" +%s.%N)" -v f="$(date -d "$f" +%s.%N)" \
    'BEGIN {printf "%.4f", f - s}'
}
# Not a GPU check: the schedules' bubbles at K=4 need a core per stage,
# which this machine has and the development VMs (2 cores) do not.
# pipeline_bench compares GPipe, 1F1B, ZB-H1, interleaved and ZB-V on CPU
# threads at K=2 and K=4 with what is left of the budget; informational, so
# it never fails the check.
cpu_schedules() {
  echo "== CPU schedules at K=2 and K=4 (pipeline_bench, informational) [${SECONDS} s]"
  if ((budget - SECONDS < 40)); then
    result[cpu_schedules]="skipped (under 40 s of the budget left)"
    return
  fi
  run "$(left 120)" pipeline_bench --only schedules --steps 4 --warmup 1 \
    | tee "$out/pipeline_bench.log"
  if [[ ${PIPESTATUS[0]} == 0 ]]; then
    result[cpu_schedules]="ran ($(nproc) cores)"
  else
    result[cpu_schedules]="cut short (see pipeline_bench.log)"
  fi
}
if [[ -n $cpu_only ]]; then
  pipeline_check cpu "shm grpc"
  cpu_schedules
  for k in pipeline_shm pipeline_grpc; do echo "$k: ${result[$k]:-FAIL (not run)}"; done
  echo "cpu_schedules: ${result[cpu_schedules]}"
  echo "overall: FAIL (no GPU; the CPU plumbing above ran)"
  exit 1
fi
# --- 1. CUDA IPC on a 2-stage cluster, bitwise gRPC frames ------------------
ipc_steps=300
echo "== 1. 2-stage cluster: $ipc against gRPC frames ($ipc_steps steps) [${SECONDS} s]"
for plane in $ipc grpc; do
  ctl "$(left 90)" local "$work/bench/gpu_mlp.json" --workers 2 --stages 2 \
    --micro-batches 4 --steps $ipc_steps --threads 2 --device cuda \
    --data_plane $plane --out "$work/ipc2-$plane" --keep "$work/ipc2-$plane-run" \
    >"$out/ipc2-$plane.log" 2>&1 || { tail -15 "$out/ipc2-$plane.log"; break; }
done
n=$(grep -h -c "data plane to stage [0-9]* is $ipc (--data_plane $ipc)" \
  "$work/ipc2-$ipc-run"/worker-*.log 2>/dev/null | awk '{s += $1} END {print s + 0}')
if [[ ! -f $work/ipc2-grpc/model.safetensors ]]; then
  result[ipc_cluster]="FAIL (a run failed: $out/ipc2-*.log)"
elif [[ $n != 1 ]]; then
  result[ipc_cluster]="FAIL ($n of 1 links logged $ipc)"
elif cmp -s "$work/ipc2-$ipc/model.safetensors" "$work/ipc2-grpc/model.safetensors"; then
  result[ipc_cluster]=PASS
else
  result[ipc_cluster]="FAIL (parameters differ between $ipc and grpc)"
fi
echo "ipc_cluster: ${result[ipc_cluster]}"

# --- 2. compute-sanitizer on the CUDA unit tests ------------------------------
# Run after the tests (its runs are the slowest and the least certain to end
# in time); a run cut by its timeout counts when it reported no error.
sanitizer_check() {
  echo "== 2. compute-sanitizer [${SECONDS} s]"
  local san tool t rc
  san=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
  [[ -n $fake ]] && san=
  if [[ -z $san ]]; then
    result[sanitizer]="PASS (skipped: no compute-sanitizer here)"
    return
  fi
  result[sanitizer]=PASS
  # Long runs and bf16 (not our code) left out: the sanitizers slow kernels
  # down by 10-100x.
  for tool in memcheck racecheck synccheck; do
    for t in cuda_kernels_test cuda_layers_test; do
      timeout "$(left 40)" "$san" --tool $tool --error-exitcode 9 \
        "$work/lib/ld-linux-x86-64.so.2" --library-path "$path" "$work/bin/$t" \
        --gtest_filter='-*Training*:*Bf16*:*LongSequences*:*StepsTrack*' \
        >"$out/sanitizer-$tool-$t.log" 2>&1
      rc=$?
      tail -2 "$out/sanitizer-$tool-$t.log"
      if ((rc == 124)) && ! grep -q "^========= [A-Z]" "$out/sanitizer-$tool-$t.log"; then
        echo "$tool on $t: cut by its timeout, no error reported before"
        result[sanitizer]="PASS (some runs cut by their timeout)"
      elif ((rc != 0)); then
        grep -m 20 -B2 -A6 "Error\|ERROR\|Failure" "$out/sanitizer-$tool-$t.log"
        result[sanitizer]="FAIL ($tool on $t: rc $rc)"
      fi
    done
  done
  echo "sanitizer: ${result[sanitizer]}"
}

# --- 3. 1F1B on 2 in-process GPU stages, bitwise 1 stage, five times ---------
echo "== 3. gpipectl train --stages 2 --schedule 1f1b --device cuda, 5 runs each [${SECONDS} s]"
result[repro]=PASS
for spec in gpu_mlp char_transformer; do
  ctl "$(left 60)" train "$work/bench/$spec.json" --stages 1 --steps 30 \
    --device cuda --out "$work/repro-$spec-1" >"$out/repro-$spec-1.log" 2>&1 ||
    { tail -5 "$out/repro-$spec-1.log"; result[repro]="FAIL ($spec --stages 1 failed)"; continue; }
  for i in 1 2 3 4 5; do
    ctl "$(left 60)" train "$work/bench/$spec.json" --stages 2 --schedule 1f1b \
      --steps 30 --device cuda --out "$work/repro-$spec-2-$i" \
      >"$out/repro-$spec-2-$i.log" 2>&1 ||
      { tail -5 "$out/repro-$spec-2-$i.log"; result[repro]="FAIL ($spec run $i failed)"; break; }
    cmp -s "$work/repro-$spec-1/model.safetensors" "$work/repro-$spec-2-$i/model.safetensors" ||
      { result[repro]="FAIL ($spec run $i differs from --stages 1)"; break; }
  done
  echo "$spec: $(ls -d "$work"/repro-$spec-2-* 2>/dev/null | wc -l) runs of 2 stages, ${result[repro]}"
done

# Data-parallel replicas on the GPU: gradients summed through the host, the
# same bits as one replica summing the same 2 groups.
python3 - "$work/bench/gpu_mlp.json" "$work/replicas.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
d.setdefault("pipeline", {}).update({"microBatches": 4, "gradientGroups": 2})
json.dump(d, open(sys.argv[2], "w"))
PY
for r in 1 2; do
  ctl "$(left 60)" train "$work/replicas.json" --stages 2 --replicas $r \
    --steps 30 --device cuda --out "$work/replicas-$r" >"$out/replicas-$r.log" 2>&1 ||
    { tail -5 "$out/replicas-$r.log"; result[repro]="FAIL (--replicas $r failed)"; }
done
cmp -s "$work/replicas-1/model.safetensors" "$work/replicas-2/model.safetensors" ||
  result[repro]="FAIL (2 replicas on the GPU differ from 1)"
echo "2 replicas on the GPU against 1: ${result[repro]}"

# Generation on the GPU (KV cache on the device): the same seed gives the
# same tokens in one piece and as 2 stages.
model="$work/repro-char_transformer-1/model.safetensors"
if [[ -f $model ]]; then
  g1=$(ctl 60 generate "$model" --prompt "1 2 3" --tokens 24 --seed 3 --device cuda 2>"$out/generate.log")
  g2=$(ctl 60 generate "$model" --prompt "1 2 3" --tokens 24 --seed 3 --device cuda --stages 2 2>>"$out/generate.log")
  echo "generate on the GPU: '$g1'"
  if [[ -z $g1 || $g1 != "$g2" ]]; then
    result[repro]="FAIL (generate --device cuda: '$g1', as 2 stages '$g2')"
  fi
fi

# --- 4. kill -9 of a worker mid-job on CUDA IPC -------------------------------
echo "== 4. kill -9 of a worker mid-transfer on $ipc [${SECONDS} s]"
PATH="$work/wrap:$PATH" timeout "$(left 150)" gpipectl local "$work/bench/gpu_mlp.json" \
  --workers 2 --stages 2 --micro-batches 4 --steps $ipc_steps --threads 2 \
  --device cuda --data_plane $ipc --out "$work/kill-out" --keep "$work/kill-run" \
  >"$out/kill.log" 2>&1 &
kill_pid=$!
port=""
for _ in $(seq 300); do
  [[ -s $work/kill-run/controller.port ]] && port=$(tr -d '[:space:]' <"$work/kill-run/controller.port") && break
  sleep 0.1
done
port=${port##*:}
step=0
for _ in $(seq 300); do
  step=$(ctl 10 --controller "127.0.0.1:$port" list --json 2>/dev/null |
    "$py" -c 'import json,sys; j=json.load(sys.stdin).get("jobs",[]); print(int(j[0]["status"].get("step",0)) if j else 0)' 2>/dev/null || echo 0)
  ((step >= 30)) && break
  sleep 0.1
done
victim=$(pgrep -f "gpipe-worker --controller=127.0.0.1:$port" | tail -n 1)
if [[ -z $port || -z $victim ]] || ((step < 30)); then
  result[kill]="FAIL (no running job to kill a worker of: port '$port', step $step)"
else
  kill -9 "$victim"
  echo "kill -9 worker pid $victim at step $step"
  wait "$kill_pid"
  rc=$?
  if ((rc != 0)); then
    tail -10 "$out/kill.log"
    result[kill]="FAIL (gpipectl local exited $rc: a hang ends in its timeout, 124)"
  elif ! cmp -s "$work/kill-out/model.safetensors" "$work/ipc2-$ipc/model.safetensors"; then
    result[kill]="FAIL (recovered, but the parameters differ from the run without a kill)"
  else
    result[kill]="PASS"
  fi
fi
wait "$kill_pid" 2>/dev/null
echo "kill: ${result[kill]}"
if [[ -n $fake ]]; then
  for k in ipc_cluster repro kill; do echo "$k: ${result[$k]:-FAIL (not run)}"; done
  echo "overall: FAIL (no GPU; checks 1-4 above ran on the fake device)"
  exit 1
fi

echo "== 5. tests [${SECONDS} s]"
# check NAME LOG: PASS when the run exited 0 and skipped nothing.
check() {
  local name=$1 log=$2 rc=$3
  local skipped
  skipped=$(grep -c '^\[  SKIPPED' "$log")
  tail -4 "$log"
  if ((rc == 0 && skipped == 0)); then result[$name]=PASS; else
    result[$name]="FAIL (rc $rc, $skipped skipped)"; grep -B2 -A8 'Failure\|SKIPPED\|error' "$log" | head -60; fi
}
for t in tensor_caching_allocator_test cuda_kernels_test cuda_layers_test \
         cuda_cnn_test cuda_ipc_link_test cuda_ipc_plane_test; do
  run "$(left 180)" "$t" --gtest_brief=0 > "$out/$t.log" 2>&1
  check "$t" "$out/$t.log" $?
done
tests=(tensor_caching_allocator_test cuda_kernels_test cuda_layers_test
       cuda_cnn_test cuda_ipc_link_test cuda_ipc_plane_test cuda_cudnn_test)
if [[ -n $cudnn_dir ]]; then
  # The layers went through cuDNN above; our own convolution path too.
  GPIPE_CUDNN=0 run 120 cuda_cnn_test --gtest_brief=0 \
    > "$out/cuda_cnn_test_own.log" 2>&1
  check cuda_cnn_test_own "$out/cuda_cnn_test_own.log" $?
  tests+=(cuda_cnn_test_own)
  run 120 cuda_cudnn_test --gtest_brief=0 > "$out/cuda_cudnn_test.log" 2>&1
  check cuda_cudnn_test "$out/cuda_cudnn_test.log" $?
else
  run 120 cuda_cudnn_test > "$out/cuda_cudnn_test.log" 2>&1
  rc=$?
  grep -h 'cuDNN' "$out/cuda_cudnn_test.log" | head -2
  result[cuda_cudnn_test]=$([[ $rc == 0 ]] && echo "PASS (skipped: no cuDNN here)" || echo "FAIL (rc $rc)")
fi
sanitizer_check
# The pipeline first: it is the newest part (the figures below have been
# measured before).
pipeline_check cuda "cuda_ipc grpc"
echo "== torch.distributed.pipelining (PipelineStage + ScheduleGPipe), K=4 processes, same model, balance and M [${SECONDS} s]"
GPIPE_TORCH_PIPE_VERBOSE=1 timeout "$(left 90)" "$py" "$work/bench/torch_pipelining.py" \
  "$work/bench/gpu_pipe_mlp.json" --balance 4,4,4,3 --micro-batches 8 \
  --steps 30 --warmup 5 2>&1 | tail -20 | tee "$out/torch_pipelining.log"
torch_ms=$(sed -n 's/^ms\/step: median \([0-9.]*\).*/\1/p' "$out/torch_pipelining.log")
if [[ -n $torch_ms ]]; then
  result[torch_pipelining]=PASS
  for plane in cuda_ipc grpc; do
    [[ -n ${pipe_ms[$plane]:-} ]] && awk -v o="${pipe_ms[$plane]}" -v t="$torch_ms" -v p="$plane" \
      'BEGIN {printf "ours (%s) / torch pipelining: %.2f (ms/step %s against %s)\n", p, o / t, o, t}'
  done
elif grep -q '^SKIP' "$out/torch_pipelining.log"; then
  result[torch_pipelining]="PASS (skipped: $(grep -m1 '^SKIP' "$out/torch_pipelining.log"))"
else
  result[torch_pipelining]=FAIL
fi
echo "== gpu_bench [${SECONDS} s]"
run "$(left 240)" gpu_bench "$work/bench/gpu_mlp.json" "$work/bench/gpu_wide_mlp.json" \
  "$work/bench/gpu_cnn.json" "$work/bench/char_transformer.json" --steps 50 \
  --profile | tee "$out/gpu_bench.log"
result[gpu_bench]=$([[ ${PIPESTATUS[0]} == 0 ]] && echo PASS || echo FAIL)
echo "== torch (same models, same batch, AdamW, one CUDA device) [${SECONDS} s]"
cat > "$work/torch_gpu_step.py" <<'PY'
import json, statistics, sys, time
import torch, torch.nn as nn
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
dev = torch.device("cuda")
for path in sys.argv[1:]:
    spec = json.load(open(path))
    layers, acts = [], {"relu": nn.ReLU, "gelu": nn.GELU, "tanh": nn.Tanh,
                        "flatten": nn.Flatten}
    dims = spec["model"]["input"]["shape"]["dims"]
    image = len(dims) == 3
    for l in spec["model"]["layers"]:
        (kind, a), = l.items()
        if kind == "linear": layers.append(nn.Linear(a["inFeatures"], a["outFeatures"]))
        elif kind == "layerNorm": layers.append(nn.LayerNorm(a["features"]))
        elif kind == "conv2d":
            layers.append(nn.Conv2d(a["inChannels"], a["outChannels"], a["kernelSize"],
                                    a.get("stride", 1), a.get("padding", 0)))
        elif kind == "batchNorm":
            layers.append((nn.BatchNorm2d if image else nn.BatchNorm1d)(a["features"]))
        elif kind == "maxPool2d":
            layers.append(nn.MaxPool2d(a["kernelSize"], a.get("stride", a["kernelSize"])))
        elif kind == "dropout": layers.append(nn.Dropout(a["p"]))
        else:
            layers.append(acts[kind]())
            image = image and kind != "flatten"
    model = nn.Sequential(*layers).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=1e-4)
    b = spec["batchSize"]
    x = torch.randn(b, *dims, device=dev)
    y = torch.randint(0, 10, (b,), device=dev)
    def step():
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss.item()  # one sync per step, as ours
    for _ in range(5): step()
    secs = []
    for _ in range(50):
        t = time.perf_counter(); step(); secs.append(time.perf_counter() - t)
    print(f"torch step {path}: ms/step {1e3 * statistics.median(secs):.3f}")
PY
timeout "$(left 200)" "$py" "$work/torch_gpu_step.py" "$work/bench/gpu_mlp.json" \
  "$work/bench/gpu_wide_mlp.json" "$work/bench/gpu_cnn.json" | tee "$out/torch.log"
result[torch]=$([[ ${PIPESTATUS[0]} == 0 ]] && echo PASS || echo FAIL)
cpu_schedules
echo "whole check: $SECONDS s"
echo "== summary [${SECONDS} s]"
status=0
for k in ipc_cluster sanitizer repro kill "${tests[@]}" gpu_bench torch \
         pipeline_cuda_ipc pipeline_grpc torch_pipelining; do
  echo "$k: ${result[$k]:-FAIL (not run)}"
  [[ ${result[$k]:-} == PASS* ]] || status=1
done
echo "cpu_schedules (informational): ${result[cpu_schedules]:-not run}"
echo "overall: $([[ $status == 0 ]] && echo PASS || echo FAIL)"
exit $status
