#!/usr/bin/env bash
# Recovery of data-parallel replicas against the checkpoint path, in one run
# on loopback: a controller and 5 workers; the same model (recovery_lib's MLP
# without its batch norm, AdamW with clipping), 2 stages, checkpoints every
# CKPT_EVERY steps, trained
#   checkpoint: with one replica: a lost worker restarts the job from its
#               last checkpoint and replays the steps since;
#   memory:     with two replicas: the job resumes from the step its
#               surviving workers hold in memory (no checkpoint, no replay).
# In each, KILLS kill -9's of a busy worker (a fresh worker replaces each),
# timed as bench/recovery_bench.sh does (bench/recovery_times.py: from the
# kill to noticed, running again, first step, caught up with the step reached
# at the kill). Ends with the ratio of the medians of "caught up".
# Usage: bench/replica_bench.sh [KILLS] [BUILD_DIR]   (defaults 5, build)
# Knobs: CKPT_EVERY (50), LEASE_MS (1500), STEPS (20000), KEEP_WORK=1.
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
kills=${1:-5}
bin=$(cd "${2:-$src/build}" && pwd)/bin
for b in gpipectl gpipe-controller gpipe-worker; do
  [[ -x "$bin/$b" ]] || { echo "$bin/$b is not built (scripts/build.sh $b)" >&2; exit 1; }
done
((kills >= 1 && kills <= 50)) || { echo "KILLS must be 1..50, not $kills" >&2; exit 1; }
every=${CKPT_EVERY:-50}
steps=${STEPS:-20000}
work=$(mktemp -d)
source "$src/tests/scripts/recovery_lib.sh"
watch_pid=""
bench_cleanup() {
  [[ -z "$watch_pid" ]] || kill "$watch_pid" 2>/dev/null || true
  cleanup
}
trap bench_cleanup EXIT

# The workers running JOB now, every replica's.
job_workers() {
  local addrs name
  addrs=$(job_field "$1" "' '.join(x.get('address','') for x in s.get('stages', []) + s.get('replicaStages', []))")
  for name in "${!worker_port[@]}"; do
    [[ " $addrs " == *" 127.0.0.1:${worker_port[$name]} "* ]] && echo "$name"
  done
  return 0
}

# run_mode NAME REPLICAS: a job, KILLS kills, its timeline.
run_mode() {
  local name=$1 replicas=$2 job i victim at st state restarts step ok before done_kills=0
  write_replica_spec "$work/$name.json" "replica-bench-$name" "$steps" "$replicas" 2 "$every"
  job=$(submit "$work/$name.json")
  "$bin/gpipectl" --controller "127.0.0.1:$cport" watch "$job" --json >"$work/$name-events.jsonl" 2>"$work/$name-watch.log" &
  watch_pid=$!
  pids+=("$watch_pid")
  wait_step "$job" $((2 * every))
  : >"$work/$name-kills.txt"
  for i in $(seq "$kills"); do
    sleep "0.$((2 + RANDOM % 6))"
    [[ "$(job_field "$job" "s.get('state','')")" == RUNNING ]] || break
    mapfile -t busy < <(job_workers "$job")
    ((${#busy[@]} > 0)) || break
    victim=${busy[RANDOM % ${#busy[@]}]}
    at=$EPOCHREALTIME
    kill -9 "${worker_pid[$victim]}"
    echo "$at $victim" >>"$work/$name-kills.txt"
    unset "worker_port[$victim]"
    start_worker
    done_kills=$((done_kills + 1))
    ok=""
    for _ in $(seq 300); do
      st=$(job_field "$job" "'%s %d %d %d' % (s.get('state',''), int(s.get('restarts',0)), int(s.get('step',0)), int(s.get('runningReplicas',0)))")
      read -r state restarts step running <<<"$st"
      [[ "$state" == RUNNING && "$restarts" -ge "$done_kills" && "$running" -ge "$replicas" ]] && { ok=1; break; }
      [[ "$state" == SUCCEEDED || "$state" == FAILED || "$state" == CANCELLED ]] && break
      sleep 0.1
    done
    [[ -n "$ok" ]] || fail "$name: job $job did not run again within 30 s of kill $i (last: $st)"
    before=$step
    wait_step "$job" $((before + 2 * every))
  done
  "$bin/gpipectl" --controller "127.0.0.1:$cport" cancel "$job" >/dev/null 2>&1 || true
  for _ in $(seq 50); do kill -0 "$watch_pid" 2>/dev/null || break; sleep 0.1; done
  watch_pid=""
  ((done_kills >= 1)) || fail "$name: no kill landed while job $job was running"
  echo "== $name: $replicas replica(s) x 2 stages, $done_kills kill -9s, checkpoint every $every steps"
  python3 "$src/bench/recovery_times.py" "$work/$name-events.jsonl" "$work/$name-kills.txt" |
    tee "$work/$name-times.txt"
}

cport=$(free_port)
start_controller
for _ in 1 2 3 4 5; do start_worker; done
wait_workers 5
echo "replica recovery: lease ${LEASE_MS:-1500} ms, $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
run_mode checkpoint 1
run_mode memory 2
restores=$(cat "$work"/w*.log | grep -c "job-.* restored step" || true)
resumes=$(cat "$work"/w*.log | grep -c "memory, no checkpoint" || true)
echo "worker logs: $restores checkpoint restores, $resumes stage starts from memory"
python3 - "$work/checkpoint-times.txt" "$work/memory-times.txt" <<'PY'
import re, sys
def median(path, name):
    for line in open(path):
        m = re.match(r"%s:\s+median\s+([-0-9.]+)" % re.escape(name), line)
        if m:
            return float(m.group(1))
    return None
for name in ("caught up", "first step after", "steps replayed"):
    c, m = median(sys.argv[1], name), median(sys.argv[2], name)
    if c is None or m is None:
        continue
    ratio = "%.1fx" % (c / m) if m > 0 else "-"
    print("%-17s checkpoint %8.3f  memory %8.3f  ratio %s" % (name + ":", c, m, ratio))
PY
