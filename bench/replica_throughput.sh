#!/usr/bin/env bash
# Data-parallel replicas on worker processes against one pipeline, in one
# run on loopback: the width-1024 MLP (784 -> 7 x 1024 -> 10, synthetic
# data, SGD with momentum, batch 256, M = 8, two gradient groups so both
# runs train the same bits) on 2 stages,
#   R=1: `gpipectl local --replicas 1`, 2 worker processes;
#   R=2: `gpipectl local --replicas 2`, 4 worker processes, the replicas of
#        each stage summing their gradients over their own links (shared
#        memory on one host; in buckets during the last backward);
# each with one compute thread per worker. From each run's timeline
# (`--trace`, the last steps the controller keeps): the median step time,
# samples/s, and what R=1's per-stage busy times (two processes on the
# cores, uncontended on two or more) allow R replicas on this machine's
# cores: max(R=1's busiest stage / R, R=1's busy time of all stages /
# min(cores, 2R)). R=2's own busy times are longer on 2 cores (four
# processes share them), so they are shown, not used. From the R=2 workers' logs: the gradient sums' seconds and bytes
# (their GB/s), against the raw links' GB/s (gRPC and shared memory) for
# messages of a bucket and of a stage's gradient slice
# (build/bench/stream_bench) in the same run. Then both
# runs' models are compared bitwise.
# Usage: bench/replica_throughput.sh [STEPS] [BUILD_DIR]  (defaults 40, build)
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
steps=${1:-40}
build=$(cd "${2:-$src/build}" && pwd)
bin=$build/bin
for b in gpipectl gpipe-controller gpipe-worker; do
  [[ -x "$bin/$b" ]] || { echo "$bin/$b is not built (scripts/build.sh $b)" >&2; exit 1; }
done
[[ -x "$build/bench/stream_bench" ]] || { echo "$build/bench/stream_bench is not built" >&2; exit 1; }
((steps >= 8 && steps <= 1000)) || { echo "STEPS must be 8..1000, not $steps" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

python3 - "$work/spec.json" "$steps" <<'PY'
import json, sys
layers = [{"linear": {"inFeatures": 784, "outFeatures": 1024}}, {"relu": {}}]
for _ in range(6):
    layers += [{"linear": {"inFeatures": 1024, "outFeatures": 1024}}, {"relu": {}}]
layers.append({"linear": {"inFeatures": 1024, "outFeatures": 10}})
spec = {
    "name": "replica-throughput",
    "model": {"input": {"dtype": "FLOAT32", "shape": {"dims": [784]}},
              "layers": layers, "loss": {"softmaxCrossEntropy": {}}},
    "optimizer": {"lr": 0.01, "sgd": {"momentum": 0.9}},
    "data": {"synthetic": {"task": "CLASSES", "features": 784, "classes": 10,
                           "trainSamples": 4096, "testSamples": 256}},
    "pipeline": {"stages": 2, "microBatches": 8, "gradientGroups": 2},
    "batchSize": 256, "steps": int(sys.argv[2]), "seed": 5,
}
json.dump(spec, open(sys.argv[1], "w"))
PY

for r in 1 2; do
  "$bin/gpipectl" local "$work/spec.json" --stages 2 --replicas "$r" \
    --workers $((2 * r)) --threads 1 --keep "$work/run$r" --trace "$work/trace$r" \
    --out "$work/out$r" >"$work/local$r.log" 2>&1 ||
    { tail -20 "$work/local$r.log"; echo "R=$r: gpipectl local failed" >&2; exit 1; }
done

# The gradient slice a replica sends per bucket message is about a bucket
# over R; the stage's whole gradient over R is the upper end: measure the
# link at 1 MiB (the bucket) and at that size.
slice=$(python3 -c 'print(max(1, round((784*1024 + 3*1024*1024 + 4*1024) * 4 / 2 / 2**20)))')
"$build/bench/stream_bench" --sizes "512K,${slice}M" --seconds 1 >"$work/stream.log" 2>&1 ||
  { tail -20 "$work/stream.log"; echo "stream_bench failed" >&2; exit 1; }

python3 "$src/tests/scripts/same_tensors.py" "$work/out1/model.safetensors" \
  "$work/out2/model.safetensors" >/dev/null ||
  { echo "R=2 did not train the bits R=1 did" >&2; exit 1; }

python3 - "$work" "$(nproc)" <<'PY'
import glob, json, re, statistics, sys
work, cores = sys.argv[1], int(sys.argv[2])

def figures(r):
    doc = json.load(open(f"{work}/trace{r}/trace.json"))
    names = {e["tid"]: e["args"]["name"] for e in doc["traceEvents"]
             if e.get("ph") == "M" and e.get("name") == "thread_name"}
    steps, busy = {}, {}
    for e in doc["traceEvents"]:
        if e.get("ph") != "X":
            continue
        key = (e["tid"], e["args"]["step"])
        if e["cat"] == "step":
            steps[key] = e["dur"] / 1e3
        else:
            busy[key] = busy.get(key, 0) + e["dur"] / 1e3
    # A step's time: the slowest track's (every track ends it together).
    by_step = {}
    for (tid, step), ms in steps.items():
        by_step[step] = max(by_step.get(step, 0), ms)
    step_ms = statistics.median(by_step.values())
    track_busy = {names[tid]: statistics.median(
        [b for (t, s), b in busy.items() if t == tid]) for tid in names}
    return step_ms, track_busy, len(by_step)

batch = 256
rows = []
base = None
for r in (1, 2):
    step_ms, track_busy, n = figures(r)
    if base is None:
        base = track_busy
    allowed = max(max(base.values()) / r, sum(base.values()) / min(cores, 2 * r))
    rows.append((r, step_ms, allowed))
    print(f"R={r}: {2 * r} workers, median step {step_ms:.1f} ms over {n} steps "
          f"({batch / step_ms * 1e3:.0f} samples/s); allowed by R=1's busy times on "
          f"{cores} cores {allowed:.1f} ms; step / allowed {step_ms / allowed:.2f}")
    print("      busy per step: " + ", ".join(
        f"{k} {v:.1f} ms" for k, v in sorted(track_busy.items())))
(_, s1, a1), (_, s2, a2) = rows
print(f"R=2 against R=1: {s1 / s2:.2f}x the samples/s (allowed: {a1 / a2:.2f}x)")

sums = []
for log in glob.glob(f"{work}/run2/*.log"):
    for m in re.finditer(r"stage (\d+) of \S+ \(replica (\d+) of 2\): (\d+) gradient sums "
                         r"with the other replicas, ([0-9.]+) s, ([0-9.]+) (\w+) sent and "
                         r"received \(([0-9.]+) GB/s\)", open(log).read()):
        sums.append((int(m[1]), int(m[2]), int(m[3]), float(m[4]), m[5] + " " + m[6], float(m[7])))
for stage, replica, n, sec, moved, gbs in sorted(sums):
    print(f"stage {stage} replica {replica}: {n} sums, {sec / n * 1e3:.2f} ms each "
          f"(the sums' own time, on the reduction's thread during the last backward; waits for the "
          f"other replica included), {moved} moved: {gbs:.2f} GB/s")
# The links each run accepted: the pipeline's and, with replicas, the
# reduction's; on one host `--data_plane auto` puts them on shared memory.
planes = []
for log in glob.glob(f"{work}/run2/*.log"):
    planes += re.findall(r"link of \S+ epoch \d+ from stage \d+: data plane (\w+)", open(log).read())
print(f"R=2's accepted links (2 pipeline, 2 reduction): {', '.join(sorted(planes))}")
grpc, shm = {}, {}
for line in open(f"{work}/stream.log"):
    f = line.split()
    if len(f) >= 10 and re.fullmatch(r"\d+", f[0]) and f[1] in ("KiB", "MiB") and f[2] != "grpc":
        grpc[f"{f[0]} {f[1]}"] = float(f[2])
        shm[f"{f[0]} {f[1]}"] = float(f[8])
print("raw links, one direction (stream_bench): " + ", ".join(
    f"{k} messages gRPC {grpc[k]:.2f} GB/s, shm {shm[k]:.2f} GB/s" for k in grpc))
if sums and shm:
    mean = statistics.mean(s[5] for s in sums)
    print(f"reduction / raw shm link: {mean / max(shm.values()):.3f}, / raw gRPC link: "
          f"{mean / max(grpc.values()):.2f} (the sum waits for the other replica's slices, its bytes go both ways at once, and it "
          f"also packs, adds and copies, on the same cores as the other stage's compute)")
print("models of R=1 and R=2: bitwise equal")
PY
