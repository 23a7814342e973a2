#!/usr/bin/env bash
# The metrics against a real Prometheus. `gpipectl local` runs a long job of
# 2 stages x 2 data-parallel replicas on a controller and four workers with
# metrics on free loopback ports and writes their file_sd targets; a Prometheus (Debian's, on a free loopback port,
# generated config: 1 s scrapes, the shipped alert rules) scrapes them. Then:
# `promtool check metrics` on every endpoint's output, every (replica, stage)
# exported with a gradient reduction that moved bytes, the controller's loss
# of the whole job, `promtool check rules`
# and `check config` on deploy/prometheus/, and every PromQL expression of
# every dashboard panel and alert rule evaluated through the HTTP API must
# return data (tests/scripts/prometheus_queries.py). Bounded: about 30 s;
# everything started is killed at the end, also on failure.
#   prometheus_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1
src=$(cd "$2" && pwd)
bin="$build/bin"

for b in gpipectl gpipe-controller gpipe-worker; do
  if [[ ! -x "$bin/$b" ]]; then
    echo "SKIP: $bin/$b is not built yet (scripts/build.sh builds it)"
    exit 0
  fi
done

fail() {
  echo "FAIL: $*" >&2
  exit 1
}
for b in prometheus promtool; do
  command -v "$b" >/dev/null || fail "$b is not installed (scripts/setup.sh installs Debian's prometheus)"
done

source "$(dirname "$0")/processes_lib.sh"

show_logs() {
  local f
  for f in "$work"/*.log "$work"/run/*.log; do
    [[ -f "$f" ]] || continue
    echo "--- $f" >&2
    tail -n 15 "$f" >&2
  done
}

# --- a malformed metrics address is refused with the flag's name ----------
for b in gpipe-controller gpipe-worker; do
  set +e
  msg=$(timeout -k 5 20 "$bin/$b" --metrics_listen=localhost 2>&1)
  rc=$?
  set -e
  [[ $rc == 2 ]] || fail "$b --metrics_listen=localhost exited $rc, want 2: $msg"
  grep -q -- "--metrics_listen: 'localhost' is not HOST:PORT" <<<"$msg" ||
    fail "$b --metrics_listen=localhost said: $msg"
done

# --- the shipped config and rules -----------------------------------------
promtool check rules "$src/deploy/prometheus/gpipe-rules.yml" ||
  fail "promtool check rules"
promtool check config "$src/deploy/prometheus/prometheus.yml" ||
  fail "promtool check config"
# GpipeLossNotFinite fires for 15 minutes after the loss turns NaN, or
# after a job's loss series appears as NaN (it failed at its first report),
# whatever its step counter does (a resumed job fails before it reports a
# step; a step can take longer than 15 minutes), and then stops: a failed
# job's NaN loss stays exported until the job is deleted (a week by
# default), and paged critical all that time.
# An alert's description as the rule file has it, for promtool's tests.
alert_description() {
  python3 -c "import yaml,sys; r=yaml.safe_load(open(sys.argv[1])); print([a for g in r['groups'] for a in g['rules'] if a.get('alert')==sys.argv[2]][0]['annotations']['description'])" \
    "$src/deploy/prometheus/gpipe-rules.yml" "$1"
}
description="$(alert_description GpipeLossNotFinite)"
nans="$(printf 'NaN %.0s' {1..40})"
cat >"$work/rule_test.yml" <<YAML
rule_files: [$src/deploy/prometheus/gpipe-rules.yml]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: 'gpipe_job_loss{job="job-1"}'
        values: '2.3 $nans'
      - series: 'gpipe_job_step{job="job-1"}'
        values: '250 250x40'
      - series: 'gpipe_job_loss{job="job-2"}'
        values: '$nans'
    alert_rule_test:
      - eval_time: 5m
        alertname: GpipeLossNotFinite
        exp_alerts:
          - exp_labels: {job: job-1, severity: critical}
            exp_annotations:
              summary: the loss of job-1 is not finite
              description: "$description"
              signal: gpipe_job_loss
          - exp_labels: {job: job-2, severity: critical}
            exp_annotations:
              summary: the loss of job-2 is not finite
              description: "$description"
              signal: gpipe_job_loss
      - eval_time: 30m
        alertname: GpipeLossNotFinite
        exp_alerts: []
YAML
promtool test rules "$work/rule_test.yml" || fail "promtool test rules: GpipeLossNotFinite"
# GpipeCheckpointStoreFull fires for a counter that rose, and for one whose
# first sample was already 1 (the store filled before the first scrape:
# increase() alone never saw it rise); not for one at 0.
full_description="$(alert_description GpipeCheckpointStoreFull)"
full_signal='increase(gpipe_checkpoint_failures_total{reason="store_full"}[15m])'
cat >"$work/store_full_test.yml" <<YAML
rule_files: [$src/deploy/prometheus/gpipe-rules.yml]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: 'gpipe_checkpoint_failures_total{job="rose",reason="store_full"}'
        values: '0 0 1x40'
      - series: 'gpipe_checkpoint_failures_total{job="born",reason="store_full"}'
        values: '1x40'
      - series: 'gpipe_checkpoint_failures_total{job="fine",reason="store_full"}'
        values: '0x40'
    alert_rule_test:
      - eval_time: 5m
        alertname: GpipeCheckpointStoreFull
        exp_alerts:
          - exp_labels: {job: rose, reason: store_full, severity: critical}
            exp_annotations:
              summary: "rose cannot write its checkpoints: the store is full"
              description: "$full_description"
              signal: '$full_signal'
          - exp_labels: {job: born, reason: store_full, severity: critical}
            exp_annotations:
              summary: "born cannot write its checkpoints: the store is full"
              description: "$full_description"
              signal: '$full_signal'
      - eval_time: 30m
        alertname: GpipeCheckpointStoreFull
        exp_alerts: []
YAML
promtool test rules "$work/store_full_test.yml" >"$work/store_full.out" 2>&1 ||
  { cat "$work/store_full.out"; fail "promtool test rules: GpipeCheckpointStoreFull"; }

# --- a local cluster with metrics: a job long enough to scrape ------------
cat >"$work/job.json" <<'JSON'
{
  "name": "prometheus-test",
  "model": {
    "input": {"dtype": "FLOAT32", "shape": {"dims": [8]}},
    "layers": [
      {"linear": {"inFeatures": 8, "outFeatures": 16}},
      {"relu": {}},
      {"linear": {"inFeatures": 16, "outFeatures": 3}}
    ],
    "loss": {"softmaxCrossEntropy": {}}
  },
  "optimizer": {"lr": 0.05, "sgd": {"momentum": 0.9}},
  "data": {"synthetic": {"task": "CLASSES", "features": 8, "classes": 3,
                         "trainSamples": 600, "testSamples": 60}},
  "pipeline": {"stages": 2, "microBatches": 4},
  "batchSize": 32,
  "steps": 1000000,
  "seed": 3
}
JSON
targets="$work/targets.json"
"$bin/gpipectl" local "$work/job.json" --workers 4 --replicas 2 --threads 2 \
  --keep "$work/run" --metrics_targets "$targets" >"$work/local.log" 2>&1 &
pids+=($!)
for _ in $(seq 300); do
  [[ -s "$targets" ]] && break
  kill -0 "${pids[0]}" 2>/dev/null || { show_logs; fail "gpipectl local exited"; }
  sleep 0.1
done
[[ -s "$targets" ]] || { show_logs; fail "gpipectl local wrote no $targets within 30 s"; }
endpoints=$(python3 -c '
import json, sys
for group in json.load(open(sys.argv[1])):
    for t in group["targets"]:
        print(t)' "$targets")
[[ $(wc -l <<<"$endpoints") -eq 5 ]] ||
  fail "want 5 metrics endpoints (controller, 4 workers), got: $endpoints"
for e in $endpoints; do
  [[ $e == 127.0.0.1:* ]] || fail "endpoint $e is not on loopback"
done

# --- Prometheus on a free loopback port ------------------------------------
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
cat >"$work/prometheus.yml" <<YAML
global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files:
  - $src/deploy/prometheus/gpipe-rules.yml
scrape_configs:
  - job_name: gpipe
    honor_labels: true
    file_sd_configs:
      - files: ["$targets"]
        refresh_interval: 1s
YAML
prometheus --config.file="$work/prometheus.yml" \
  --web.listen-address="127.0.0.1:$port" --storage.tsdb.path="$work/tsdb" \
  >"$work/prometheus.log" 2>&1 &
pids+=($!)
url="http://127.0.0.1:$port"
for _ in $(seq 100); do
  python3 -c 'import urllib.request, sys; urllib.request.urlopen(sys.argv[1] + "/-/ready", timeout=1)' "$url" 2>/dev/null && break
  kill -0 "${pids[1]}" 2>/dev/null || { show_logs; fail "prometheus exited"; }
  sleep 0.2
done

# --- every endpoint's exposition passes promtool's lint ----------------------
# The workers export their stage's series once the job runs: wait for them.
for e in $endpoints; do
  ok=0
  for _ in $(seq 100); do
    python3 -c 'import urllib.request, sys; sys.stdout.write(urllib.request.urlopen("http://" + sys.argv[1] + "/metrics", timeout=2).read().decode())' "$e" >"$work/scrape.txt" 2>/dev/null || true
    if grep -q '^gpipe_job_step\|^gpipe_jobs' "$work/scrape.txt" && ! grep -q 'gpipe_job_step.* 0$' "$work/scrape.txt"; then ok=1; break; fi
    sleep 0.2
  done
  [[ $ok == 1 ]] || { show_logs; fail "$e exported no gpipe series within 20 s"; }
  promtool check metrics <"$work/scrape.txt" || fail "promtool check metrics on $e"
  # A worker's refused streams are series from the start, at 0: absent,
  # a rate() or an alert on them had no data until the first refusal.
  if grep -q '^gpipe_stage_' "$work/scrape.txt"; then
    for reason in stream_key fenced other; do
      grep -q "^gpipe_stage_rejected_streams_total{reason=\"$reason\"} 0" "$work/scrape.txt" ||
        fail "$e has no gpipe_stage_rejected_streams_total{reason=\"$reason\"} 0"
    done
  fi
done
# Every stage of both replicas on its own series, each replica's stage
# summing gradients with the other (bytes moved), and the job's loss.
python3 - $endpoints <<'PY' || { show_logs; fail "replica series"; }
import re, sys, time, urllib.request
deadline = time.time() + 20
while True:
    text = "".join(urllib.request.urlopen("http://%s/metrics" % e, timeout=2).read().decode()
                   for e in sys.argv[1:])
    grid = set(re.findall(r'^gpipe_job_step\{job="[^"]+",replica="(\d+)",stage="(\d+)"\}', text, re.M))
    moved = {m[0]: float(m[1]) for m in re.findall(r'^gpipe_stage_allreduce_bytes_total\{job="[^"]+",(replica="\d+",stage="\d+")\} (\S+)', text, re.M)}
    loss = re.search(r'^gpipe_job_loss\{job="[^"]+"\} \d', text, re.M)
    # Each replica runs M/R = 2 of the step's micro-batches: its theory is
    # that pipeline's, (K-1)/(M/R+K-1) = 1/3, not M's 1/5.
    theory = [float(v) for v in re.findall(r'^gpipe_pipeline_bubble_theoretical_ratio\{[^}]*\} (\S+)', text, re.M)]
    problems = []
    if len(theory) != 4 or any(abs(t - 1 / 3) > 1e-6 for t in theory):
        problems.append(f"gpipe_pipeline_bubble_theoretical_ratio {theory}, want 1/3 on each of 4")
    # The cost model's bubble for the cut that runs, from the controller.
    predicted = [float(v) for v in re.findall(r'^gpipe_stage_bubble_predicted_ratio\{[^}]*\} (\S+)', text, re.M)]
    if len(predicted) != 4 or not all(0 < p < 1 for p in predicted):
        problems.append(f"gpipe_stage_bubble_predicted_ratio {predicted}, want a share on each of 4")
    want = {(r, s) for r in "01" for s in "01"}
    if grid != want:
        problems.append(f"gpipe_job_step series for (replica, stage) {sorted(grid)}, want {sorted(want)}")
    if len(moved) != 4 or not all(v > 0 for v in moved.values()):
        problems.append(f"gpipe_stage_allreduce_bytes_total {moved}")
    if not loss:
        problems.append("no gpipe_job_loss on the controller")
    if not problems:
        break
    if time.time() > deadline:
        sys.exit("; ".join(problems))
    time.sleep(0.5)
print("ok: replica x stage series, reduction bytes", sorted(moved.values()), "and the job's loss")
PY

# --- every dashboard and rule expression returns data ---------------------
python3 "$src/tests/scripts/prometheus_queries.py" "$url" \
  "$src/dashboards/grafana" --deadline "${PROMETHEUS_TEST_DEADLINE:-40}" ||
  { show_logs; fail "dashboard or rule expressions"; }
kill -0 "${pids[0]}" 2>/dev/null || fail "gpipectl local ended before the checks were done"

# --- the progress lines carry each stage's utilization and bubble ----------
# (plain lines off a terminal: at least one every 10 s)
for _ in $(seq 120); do
  grep -Eq 'util [0-9]+% [0-9]+%  bubble [0-9]+% [0-9]+%' "$work/local.log" && break
  sleep 0.1
done
grep -Eq 'util [0-9]+% [0-9]+%  bubble [0-9]+% [0-9]+%' "$work/local.log" ||
  { show_logs; fail "gpipectl local's progress lines show no per-stage util and bubble"; }
# ... next to the schedule's theory for what each replica runs: K=2 and
# M/R = 2 micro-batches under GPipe, (K-1)/(M+K-1) = 1/3.
grep -Eq 'bubble [0-9% ]+ \(gpipe theory 33%, this cut [0-9]+% [0-9]+%\)' "$work/local.log" ||
  { show_logs; fail "gpipectl local's progress lines do not show GPipe's theory of 33%"; }
echo "PASS"
