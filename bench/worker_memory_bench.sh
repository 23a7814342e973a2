#!/usr/bin/env bash
# Each worker's peak resident memory against its --memory_limit, on a real
# controller and workers on loopback: the CNN example (STEPS steps, default
# 200, and its final evaluation) on 4 workers, every worker's VmRSS and its
# anonymous part (RssAnon: the heap; VmRSS adds the binary's pages and the
# shared segments the worker maps, its own and its upstream's) sampled
# every 50 ms, once for each limit in LIMITS (default "256MiB 4GiB"),
# alternating ROUNDS times (default 2). Prints one line a run: the limit,
# the job's outcome, the wall time from submission to its end, each
# worker's peak VmRSS and RssAnon in MiB, the shared segments the workers
# created and how often each worker's heap handed its free memory back
# near the limit (both from their logs).
#
#   bench/worker_memory_bench.sh            # after scripts/build.sh
#   LIMITS="292MiB" STEPS=20 ROUNDS=1 bench/worker_memory_bench.sh
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
bin=$src/build/bin
STEPS=${STEPS:-200}
LIMITS=${LIMITS:-"256MiB 4GiB"}
ROUNDS=${ROUNDS:-2}

run_once() {
  local limit=$1 work
  work=$(mktemp -d)
  (
    source "$src/tests/scripts/recovery_lib.sh"
    trap cleanup EXIT
    python3 - "$src/examples/fashion_mnist_cnn.json" "$work/cnn.json" "$STEPS" <<'PY'
import json, sys
spec = json.load(open(sys.argv[1]))
spec["steps"] = int(sys.argv[3])
json.dump(spec, open(sys.argv[2], "w"))
PY
    cport=$(free_port)
    start_controller
    worker_args=(--memory_limit "$limit")
    for _ in 1 2 3 4; do start_worker; done
    wait_workers 4
    # Bounded: the sampler stops with the job or after 20 minutes.
    (
      end=$((SECONDS + 1200))
      while ((SECONDS < end)); do
        for w in w0 w1 w2 w3; do
          # VmRSS, and its anonymous part (the heap), in MiB.
          echo "$w $(awk '/^(VmRSS|RssAnon):/ {printf "%d ", $2 / 1024}' \
            "/proc/${worker_pid[$w]}/status" 2>/dev/null || echo "0 0")"
        done
        sleep 0.05
      done
    ) >"$work/rss.txt" &
    sampler=$!
    pids+=("$sampler")
    start=$(date +%s.%N)
    job=$(submit "$work/cnn.json")
    outcome=FAILED
    DONE_TIMEOUT=1200 wait_done "$job" && outcome=SUCCEEDED
    # A job whose final evaluation failed keeps its model and succeeds.
    if [[ $outcome == SUCCEEDED ]] && ctl status "$job" 2>/dev/null | grep -q "final evaluation failed"; then
      outcome="SUCCEEDED without its final evaluation"
    fi
    wall=$(echo "$(date +%s.%N) - $start" | bc)
    kill "$sampler" 2>/dev/null || true
    peaks="" anon=""
    for w in w0 w1 w2 w3; do
      peaks+="$(awk -v w="$w" '$1 == w && $2 > m {m = $2} END {print m + 0}' "$work/rss.txt") "
      anon+="$(awk -v w="$w" '$1 == w && $3 > m {m = $3} END {print m + 0}' "$work/rss.txt") "
    done
    segments=$(grep -ho "a segment of [0-9.]* [KMG]iB" "$work"/w*.log | awk '{print $4 $5}' | tr '\n' ' ')
    # How often each worker's heap handed its free memory back before it
    # would have grown past the limit (BeforeFirstTouch).
    releases=""
    for w in w0 w1 w2 w3; do
      releases+="$({ grep -hoE "handed its free memory back (once|[0-9]+ times)" "$work/$w.log" || true; } |
        awk '{s += ($6 == "once" ? 1 : $6)} END {print s + 0}') "
    done
    printf '%s: %s in %.1f s; peak VmRSS %sMiB, peak RssAnon %sMiB; segments created %s; heap handed back %stimes\n' \
      "$limit" "$outcome" "$wall" "$peaks" "$anon" "${segments:-none}" "$releases"
  )
}

for ((round = 1; round <= ROUNDS; ++round)); do
  for limit in $LIMITS; do run_once "$limit"; done
done
