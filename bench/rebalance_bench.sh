#!/usr/bin/env bash
# The self-balancing pipeline on the three examples (MLP, CNN, Transformer),
# each on K worker processes of equal speed and then with one worker
# standing for a machine SLOWDOWN times slower (gpipe-worker
# --compute_slowdown): the cut the cost model started from, every
# re-partition (cut, step time before, the step time the balancer expected,
# the step time measured after), or none. Each job checkpoints every 20
# steps and may re-partition after 20, at most once per 60.
# Usage: bench/rebalance_bench.sh [STEPS] [SLOWDOWN] [K]   (defaults 200, 3, 2)
# Needs build/bin (scripts/build.sh) and the examples' data (scripts/setup.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-200}
slowdown=${2:-3}
k=${3:-2}
bin=$(realpath build/bin)
work=$(mktemp -d)
pids=()
cleanup() {
  local pid
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  [[ -n "${KEEP_WORK:-}" ]] && echo "kept $work" >&2 || rm -rf "$work"
}
trap cleanup EXIT

port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
cport=$(port)
"$bin/gpipe-controller" --listen "127.0.0.1:$cport" --checkpoint_dir "$work/ckpt" \
  --metrics_listen "" >"$work/controller.log" 2>&1 &
pids+=($!)
ctl() { "$bin/gpipectl" --controller "127.0.0.1:$cport" "$@"; }
for _ in $(seq 100); do ctl list >/dev/null 2>&1 && break; sleep 0.1; done

# start_workers SLOW_FACTOR: K fresh workers (the previous ones stopped),
# the second of them SLOW_FACTOR times slower; attach order places stages.
workers=()
start_workers() {
  local i pid f
  for pid in "${workers[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${workers[@]}"; do wait "$pid" 2>/dev/null || true; done
  workers=()
  for ((i = 0; i < k; i++)); do
    f=1
    ((i == 1)) && f=$1
    "$bin/gpipe-worker" --controller "127.0.0.1:$cport" --listen "127.0.0.1:$(port)" \
      --threads 1 --compute_slowdown "$f" >>"$work/w$i.log" 2>&1 &
    workers+=($!)
    pids+=($!)
    # One at a time, so that attach order is stage order.
    for _ in $(seq 100); do
      n=$(ctl workers --json 2>/dev/null | /usr/bin/python3 -c 'import json,sys; print(sum(1 for w in json.load(sys.stdin).get("workers", []) if w.get("state") == "IDLE"))' 2>/dev/null || echo 0)
      ((n >= i + 1)) && break
      sleep 0.1
    done
  done
}

# run EXAMPLE LABEL: one job of the example with the bench's settings.
run() {
  local spec="$work/$(basename "$1" .json)-$2.json" job
  /usr/bin/python3 - "$1" "$spec" "$steps" "$k" <<'PY'
import json, sys
spec = json.load(open(sys.argv[1]))
spec["steps"] = int(sys.argv[3])
spec["pipeline"]["stages"] = int(sys.argv[4])
spec["pipeline"]["rebalance"] = {"afterSteps": 20, "everySteps": 60}
spec["checkpoint"] = {"every": 20, "keep": 2}
spec["eval"] = {"every": 0, "maxSamples": 100}
json.dump(spec, open(sys.argv[2], "w"))
PY
  job=$(ctl submit "$spec" | tail -n 1)
  ctl watch "$job" >/dev/null 2>&1 || true
  ctl status "$job" --json >"$work/status.json"
  /usr/bin/python3 - "$work/status.json" "$2" "$(basename "$1" .json)" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))["status"]
label, name = sys.argv[2], sys.argv[3]
r = s.get("repartitions", [])
if not r:
    cut = ",".join(str(int(st.get("layerEnd", 0)) - int(st.get("layerBegin", 0)))
                   for st in s.get("stages", []))
    print(f"| {name} | {label} | none ({s.get('state')}) | | | | |")
for x in r:
    old, new = x["predictedOldSeconds"], x["predictedNewSeconds"]
    m_old = x["measuredOldSeconds"]
    gain = min(1 - new / old, (old - new) / m_old) if old > 0 and m_old > 0 else 0
    after = x.get("measuredNewSeconds", 0)
    ratio = f"{after / m_old:.2f}" if after else "-"
    expected = f"{m_old * (1 - gain) * 1e3:.1f}" if old > 0 else "-"
    print(f"| {name} | {label} | step {x['step']}: {','.join(x['oldBalance'])} -> "
          f"{','.join(x['newBalance'])} ({x['reason']}) | {m_old * 1e3:.1f} | "
          f"{expected} | {after * 1e3:.1f} | {ratio} |")
PY
}

echo "K=$k workers, $steps steps, one worker ${slowdown}x slower in the unequal rows; $(nproc) cores"
echo "| example | workers | re-partition | ms/step before | expected | measured after | after/before |"
echo "|---|---|---|---|---|---|---|"
for example in ${EXAMPLES:-examples/fashion_mnist_deep_mlp.json examples/fashion_mnist_cnn.json examples/char_transformer.json}; do
  start_workers 1
  run "$example" equal
  start_workers "$slowdown"
  run "$example" "1 of $k at ${slowdown}x"
done
