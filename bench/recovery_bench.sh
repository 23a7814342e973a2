#!/usr/bin/env bash
# Recovery time on loopback: a controller and K+1 = 4 workers (3 stages and a
# spare), a job that checkpoints every CKPT_EVERY steps, and KILLS kill -9's
# of a busy worker at random moments (a fresh worker replaces each victim).
# For every kill it measures, from the kill:
#   noticed    the controller's first event that the job lost a stage
#              (RESTARTING, or a new epoch);
#   running    the job RUNNING again in the new epoch;
#   first step the first step completed in the new epoch;
#   caught up  the first step past the one the job had reached at the kill;
# and the steps replayed (reached at the kill - restored checkpoint) and the
# per-step time before the kill, so that "caught up" can be held against the
# goal: under 2 s plus the replayed steps.
# Timestamps: the kill's from bash ($EPOCHREALTIME, just before kill -9), the
# others are the `time` of the controller's WatchJob events (stamped when the
# controller publishes the change, on the same clock), read through
# `gpipectl watch --json`.
# Usage: bench/recovery_bench.sh [KILLS] [BUILD_DIR]   (defaults 5, build)
# Knobs: CKPT_EVERY (10), LEASE_MS (heartbeat lease, 1500), STEPS (job length,
# 20000; the job is cancelled after the last kill), KEEP_WORK=1.
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
kills=${1:-5}
bin=$(cd "${2:-$src/build}" && pwd)/bin
for b in gpipectl gpipe-controller gpipe-worker; do
  [[ -x "$bin/$b" ]] || { echo "$bin/$b is not built (scripts/build.sh $b)" >&2; exit 1; }
done
((kills >= 1 && kills <= 50)) || { echo "KILLS must be 1..50, not $kills" >&2; exit 1; }
every=${CKPT_EVERY:-10}
steps=${STEPS:-20000}
work=$(mktemp -d)
source "$src/tests/scripts/recovery_lib.sh"
watch_pid=""
bench_cleanup() {
  [[ -z "$watch_pid" ]] || kill "$watch_pid" 2>/dev/null || true
  cleanup
}
trap bench_cleanup EXIT

cport=$(free_port)
start_controller
for _ in 1 2 3 4; do start_worker; done
wait_workers 4
write_spec "$work/job.json" recovery-bench "$steps" 3 0 "$SGD"
sed -i "s/\"every\": 10/\"every\": $every/" "$work/job.json"
job=$(submit "$work/job.json")
"$bin/gpipectl" --controller "127.0.0.1:$cport" watch "$job" --json >"$work/events.jsonl" 2>"$work/watch.log" &
watch_pid=$!
pids+=("$watch_pid")
wait_step "$job" $((2 * every))

: >"$work/kills.txt"
done_kills=0
for i in $(seq "$kills"); do
  # A random point of a step: forward, backward or a checkpoint write.
  sleep "0.$((2 + RANDOM % 6))"
  [[ "$(job_field "$job" "s.get('state','')")" == RUNNING ]] || break
  mapfile -t busy < <(busy_workers "$job")
  ((${#busy[@]} > 0)) || break
  victim=${busy[RANDOM % ${#busy[@]}]}
  at=$EPOCHREALTIME
  kill -9 "${worker_pid[$victim]}"
  echo "$at $victim" >>"$work/kills.txt"
  unset "worker_port[$victim]"
  start_worker
  done_kills=$((done_kills + 1))
  # Until the job has restarted and run a checkpoint interval past the
  # restore point (so the next kill has steps to lose, and this one caught up).
  ok=""
  for _ in $(seq 300); do
    st=$(job_field "$job" "'%s %d %d' % (s.get('state',''), int(s.get('restarts',0)), int(s.get('step',0)))")
    read -r state restarts step <<<"$st"
    [[ "$state" == RUNNING && "$restarts" -ge "$done_kills" ]] && { ok=1; break; }
    [[ "$state" == SUCCEEDED || "$state" == FAILED || "$state" == CANCELLED ]] && break
    sleep 0.1
  done
  [[ -n "$ok" ]] || fail "job $job did not run again within 30 s of kill $i (last: $st)"
  before=$step
  wait_step "$job" $((before + 2 * every))
done
"$bin/gpipectl" --controller "127.0.0.1:$cport" cancel "$job" >/dev/null 2>&1 || true
for _ in $(seq 50); do kill -0 "$watch_pid" 2>/dev/null || break; sleep 0.1; done
((done_kills >= 1)) || fail "no kill landed while job $job was running"

echo "recovery: $done_kills kill -9s of a busy worker, 3 stages + 1 spare, checkpoint every $every steps," \
  "lease ${LEASE_MS:-1500} ms, $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
python3 "$src/bench/recovery_times.py" "$work/events.jsonl" "$work/kills.txt"
