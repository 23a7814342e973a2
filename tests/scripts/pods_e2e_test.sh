#!/usr/bin/env bash
# The images built and the manifests run as real pods (podman kube play,
# deploy/podman/play.sh): the CPU image from the local Debian base
# (cached: a second run takes seconds), the cpu overlay with TLS and tokens,
# no volume shared between pods, the image's own command on its exposed
# ports, the example job submitted from the submit Job's pod and its model bitwise
# that of `gpipectl train`; a worker container killed mid-job, restarted by
# its restart policy, the job recovered and bitwise again; workers in
# separate pods on the gRPC data plane; the probes' health ports; Prometheus
# in a container scraping as the ServiceMonitors say (the Operator's
# relabelling, tests/scripts/servicemonitor_prometheus.py), the
# PrometheusRule loaded, every dashboard and alert expression returning data.
# Skips (exit 77) only where podman cannot start a container. Everything it
# made is removed at the end. Bounded: each wait has a deadline.
#   pods_e2e_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1
src=$(cd "$2" && pwd)
bin="$build/bin"
skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*" >&2; exit 1; }
for b in gpipectl grpc_health_probe; do
  [[ -x "$bin/$b" ]] || fail "$bin/$b is not built"
done
command -v podman >/dev/null || skip "podman is not installed (scripts/setup.sh installs it)"

# The manifests name their pods and volumes, so two runs on one machine
# (a developer's and CI's) would take each other's: the second one's
# `play.sh up` met the first one's store volume, and its cleanup would have
# removed the first one's cluster. One run at a time, the next one waits.
lock=/var/tmp/gpipe-pods-e2e.lock
exec 9>>"$lock"
if ! flock -n 9; then
  echo "waiting for the pods_e2e_test already running on this machine ($lock)"
  flock -w 1500 9 || fail "another pods_e2e_test held $lock for 1500 s"
fi
work=$(mktemp -d /var/tmp/gpipe-pods-e2e.XXXXXX)
export GPIPE_PODMAN_STATE=$work/state
export GPIPE_PODMAN_NETWORK=gpipe-e2e
play="$src/deploy/podman/play.sh"
prometheus=gpipe-e2e-prometheus
plain=gpipe-e2e-plain
mkdir -p "$GPIPE_PODMAN_STATE"
printf '[containers]\ndefault_ulimits = []\n[engine]\nruntime = "runc"\n' >"$work/containers.conf"
export CONTAINERS_CONF=$work/containers.conf
cleanup() {
  local rc=$?
  if ((rc != 0 && rc != 77)); then
    for c in $(podman ps -a --format '{{.Names}}' 2>/dev/null | grep -E '^gpipe-' || true); do
      echo "--- podman logs $c (last 15 lines)" >&2
      podman logs --tail 15 "$c" >&2 2>&1 || true
    done
  fi
  podman rm -f "$prometheus" "$plain" >/dev/null 2>&1 || true
  "$play" down >/dev/null 2>&1 || true
  rm -rf "$work"
  exit $rc
}
trap cleanup EXIT
# Pods of an earlier run that did not end (the names are the manifests').
podman pod rm -f $(podman pod ps -q --filter label=app.kubernetes.io/part-of=gpipe) >/dev/null 2>&1 || true
podman rm -f "$prometheus" "$plain" >/dev/null 2>&1 || true
passed=0

# Deadline for a wait: seconds from now.
deadline() { echo $((SECONDS + $1)); }
ip_of() { podman inspect "$1" --format "{{(index .NetworkSettings.Networks \"$GPIPE_PODMAN_NETWORK\").IPAddress}}"; }

# ---- images ----
"$src/deploy/docker/base-image.sh" >"$work/base.log" 2>&1 || { cat "$work/base.log"; fail "the base images"; }
podman run --rm --network none localhost/gpipe-base/debian:12-slim true >"$work/run.log" 2>&1 ||
  skip "podman cannot start a container here: $(tail -3 "$work/run.log")"
start=$SECONDS
"$play" build >"$work/build.log" 2>&1 || { tail -30 "$work/build.log"; fail "the CPU image build"; }
echo "image: $(tail -1 "$work/build.log" | sed 's/^play.sh: //'), built in $((SECONDS - start)) s"
image=localhost/gpipe:dev
[[ "$(podman image inspect "$image" --format '{{.Config.User}}')" == 10001:10001 ]] ||
  fail "the image does not run as the non-root user 10001"
if podman run --rm --entrypoint sh "$image" -c 'command -v g++ || command -v cmake || command -v protoc' >/dev/null 2>&1; then
  fail "the runtime image carries build tools"
fi
podman run --rm "$image" gpipectl --help >/dev/null 2>&1 || fail "gpipectl does not run in the image"
passed=$((passed + 1))
podman build -q -f "$src/deploy/podman/Containerfile.prometheus" -t localhost/gpipe-prometheus:dev \
  "$src/deploy/podman" >"$work/prom-build.log" 2>&1 || { cat "$work/prom-build.log"; fail "the Prometheus image"; }

# ---- the cluster ----
"$play" up cpu >"$work/up.log" 2>&1 || { cat "$work/up.log"; fail "play.sh up"; }
workers=$(podman pod ps --filter label=app.kubernetes.io/component=worker --format '{{.Name}}' | sort)
[[ $(wc -w <<<"$workers") -eq 2 ]] || fail "expected 2 worker pods, found: $workers"
# Health ports as the kubelet's probes ask them (gRPC, plaintext 7072):
# the controller as a whole; a worker's Stage service (liveness) and ""
# once attached to the controller (readiness).
probe() {  # probe ADDRESS SERVICE SECONDS
  local until
  until=$(deadline "$3")
  until "$bin/grpc_health_probe" "$1" "$2" >"$work/probe.out" 2>&1; do
    ((SECONDS < until)) || fail "health $1 $2: $(cat "$work/probe.out")"
    sleep 1
  done
}
probe "$(ip_of gpipe-controller-controller):7072" "" 60
for w in $workers; do
  probe "$(ip_of "$w-worker"):7072" gpipe.v1.Stage 60
  probe "$(ip_of "$w-worker"):7072" "" 60
done
echo "ok: controller and $(wc -w <<<"$workers") workers up, health ports answer"
passed=$((passed + 1))

# No filesystem shared between pods, as in a cluster: podman 4.3 made one
# volume of every pod's emptyDir `tmp` (kube_play_transform.py renames
# them per pod), which would let a worker read what another or the
# controller left in /tmp.
for p in $workers gpipe-controller; do podman ps -aq --filter "pod=$p"; done |
  xargs podman inspect --format json | python3 -c '
import collections, json, sys
owners = collections.defaultdict(set)
for c in json.load(sys.stdin):
    for m in c.get("Mounts") or []:
        owners[m.get("Name") or m["Source"]].add(c["Pod"])
shared = sorted(k for k, v in owners.items() if len(v) > 1)
sys.exit("mounted by more than one pod: %s" % shared if shared else 0)' || fail "pods share a volume"
first=$(sed -n 1p <<<"$workers")-worker
podman exec "$first" sh -c 'echo private >/tmp/gpipe-e2e-private' || fail "cannot write $first's /tmp"
for c in $(sed 1d <<<"$workers" | sed 's/$/-worker/') gpipe-controller-controller; do
  rc=0
  podman exec "$c" test -e /tmp/gpipe-e2e-private || rc=$?
  ((rc == 1)) || fail "$c sees the file $first wrote in its /tmp (or cannot be asked: exit $rc)"
done
podman exec "$first" rm -f /tmp/gpipe-e2e-private
echo "ok: no volume shared between pods, each /tmp its own"
passed=$((passed + 1))

# The image's own command (a plain `podman run IMAGE`): a controller on
# the ports the image exposes, its jobs in a store and its checkpoints in
# the directories the image makes.
podman run -d --name "$plain" --network "$GPIPE_PODMAN_NETWORK" "$image" >/dev/null
probe "$(ip_of "$plain"):7072" "" 60
python3 -c 'import sys, urllib.request
sys.exit(0 if b"gpipe_" in urllib.request.urlopen(sys.argv[1], timeout=5).read() else 1)' \
  "http://$(ip_of "$plain"):9464/metrics" || fail "the image's default command serves no metrics on 9464"
podman logs "$plain" >"$work/plain.log" 2>&1
grep -q "checkpoints in /var/lib/gpipe/checkpoints" "$work/plain.log" ||
  fail "the image's default command does not checkpoint to /var/lib/gpipe/checkpoints: $(tail -3 "$work/plain.log")"
podman exec "$plain" test -s /var/lib/gpipe/store/jobs.db || fail "the image's default command keeps no job store"
podman rm -f "$plain" >/dev/null
echo "ok: the image's default command answers on 7072 and 9464, store and checkpoints in /var/lib/gpipe"
passed=$((passed + 1))

# ---- Prometheus as the ServiceMonitors say ----
podman pod inspect $workers gpipe-controller --format json | python3 -c '
import json, sys
pods = json.load(sys.stdin)
pods = pods if isinstance(pods, list) else [pods]
print(json.dumps([{"name": p["Name"], "labels": p.get("Labels") or {}} for p in pods]))' >"$work/pods.json"
python3 "$src/tests/scripts/servicemonitor_prometheus.py" "$GPIPE_PODMAN_STATE/cluster.yaml.rendered.yaml" \
  --pods "$work/pods.json" --out "$work/prometheus" --interval 1s >/dev/null || fail "the Prometheus configuration"
chmod -R a+rX "$work/prometheus"
podman run -d --name "$prometheus" --network "$GPIPE_PODMAN_NETWORK" --network-alias prometheus \
  -v "$work/prometheus:/etc/prometheus:ro" localhost/gpipe-prometheus:dev \
  --config.file=/etc/prometheus/prometheus.yml --storage.tsdb.path=/prometheus \
  --web.listen-address=0.0.0.0:9090 >/dev/null
prom="http://$(ip_of "$prometheus"):9090"
# Grafana's provisioned data source, asked from another container on the
# network as Grafana would (dashboards/grafana/README.md's setup).
url=$(python3 -c 'import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))["datasources"][0]["url"])' \
  "$src/dashboards/grafana/provisioning/datasources.yml")
[[ "$url" =~ ^http://([^:/]+):([0-9]+)$ ]] || fail "datasources.yml: url $url is not http://HOST:PORT"
until=$(deadline 60)
until podman run --rm --network "$GPIPE_PODMAN_NETWORK" localhost/gpipe-base/debian:12-slim bash -c \
  "exec 3<>/dev/tcp/${BASH_REMATCH[1]}/${BASH_REMATCH[2]} && printf 'GET /-/ready HTTP/1.0\r\n\r\n' >&3 && grep -q ' 200 ' <&3" \
  >/dev/null 2>&1; do
  ((SECONDS < until)) || fail "Grafana's data source $url does not answer from a container"
  sleep 1
done
echo "ok: Grafana's data source $url answers from a container on the network"

# ---- the example job from the submit Job's pod ----
# The reference: `gpipectl train` in a container of the same image, as a
# user would check a cluster's result (any CPU would do: docs/deploy.md,
# "Bitwise across nodes").
train() {  # train OUT [FLAG...]
  local out=$1
  shift
  mkdir -p "$work/$out"
  chown 10001:10001 "$work/$out"
  podman run --rm -v "$work/$out:/out" "$image" gpipectl train \
    /usr/share/gpipe/examples/char_transformer.json --out /out "$@" >"$work/$out.log" 2>&1 ||
    { tail "$work/$out.log"; fail "gpipectl train $*"; }
}
train reference
submitter=gpipe-submit-char-transformer-gpipectl
submit() {
  podman kube down "$GPIPE_PODMAN_STATE/submit.yaml" >/dev/null 2>&1 || true
  "$play" submit >"$work/submit.log" 2>&1 || { cat "$work/submit.log"; fail "play.sh submit"; }
}
job_id() {
  local until
  until=$(deadline 60)
  until [[ -n "$(podman logs "$submitter" 2>/dev/null | sed -n 1p)" ]]; do
    ((SECONDS < until)) || fail "the submit pod printed no job id"
    sleep 1
  done
  podman logs "$submitter" 2>/dev/null | sed -n 1p
}
finished() {  # finished JOB: the submit pod exits 0 having watched it succeed
  local code
  code=$(timeout 600 podman wait "$submitter") || fail "$1 did not finish in 10 min"
  podman logs "$submitter" >"$work/$1.log" 2>&1
  ((code == 0)) || { tail -20 "$work/$1.log"; fail "the submit pod exited $code"; }
  grep -q SUCCEEDED "$work/$1.log" || { tail "$work/$1.log"; fail "$1 did not succeed"; }
}
# gpipectl on this machine against the controller pod: TLS (the name its
# certificate lists) and the client token, as the submit pod does.
ctl() {
  GPIPE_TOKEN=$(cat "$GPIPE_PODMAN_STATE/pki/client.token") timeout "${CTL_TIMEOUT:-60}" "$bin/gpipectl" "$@" \
    --controller "$(ip_of gpipe-controller-controller):7070" --tls_server_name gpipe-controller \
    --tls_ca "$GPIPE_PODMAN_STATE/pki/ca.crt" --tls_cert "$GPIPE_PODMAN_STATE/pki/client.crt" \
    --tls_key "$GPIPE_PODMAN_STATE/pki/client.key"
}
fetch() {  # fetch JOB DIR: the model over the API
  ctl fetch "$1" -o "$2" >"$work/fetch.log" 2>&1 || { cat "$work/fetch.log"; fail "fetch $1"; }
}
same() { python3 "$src/tests/scripts/same_tensors.py" "$1" "$2" || fail "$3"; }

submit
job=$(job_id)
# While it trains: every dashboard and alert expression through Prometheus.
python3 "$src/tests/scripts/prometheus_queries.py" "$prom" "$src/dashboards/grafana" --deadline 120 ||
  fail "dashboard or rule expressions without data (ServiceMonitor labels?)"
# The ServiceMonitor's labels: our job label kept, up{job="gpipe"} by role.
python3 - "$prom" <<'PY' || fail "the scraped labels are not what the dashboards use"
import json, sys, urllib.parse, urllib.request
def q(expr):
    url = sys.argv[1] + "/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    return json.load(urllib.request.urlopen(url, timeout=5))["data"]["result"]
roles = sorted(r["metric"].get("role", "") for r in q('up{job="gpipe"}'))
assert roles == ["controller", "worker", "worker"], roles
assert not q("gpipe_job_step{exported_job!=\"\"}"), "job renamed exported_job"
planes = {r["metric"].get("plane") for r in q("gpipe_transport_data_plane")}
assert planes == {"grpc"}, planes
print("ok: up by role", roles, "; data plane", planes)
PY
passed=$((passed + 1))
# Separate pods have separate IPC namespaces: shared memory refused with
# the reason, frames used.
for w in $workers; do podman logs "$w-worker" 2>&1; done >"$work/workers.log"
grep -q "data plane to stage 1 is grpc (--data_plane auto): no shared memory: another IPC namespace" \
  "$work/workers.log" || fail "stage 0 did not log the gRPC plane chosen for another IPC namespace"
finished "$job"
fetch "$job" "$work/model1"
same "$work/model1/model.safetensors" "$work/reference/model.safetensors" \
  "the pods' model differs from gpipectl train"
echo "ok: $job SUCCEEDED from the submit pod, bitwise equal to gpipectl train"
passed=$((passed + 1))

# ---- a worker killed mid-job ----
# The same example cut to 200 steps (its reference too), submitted from
# here; a worker container killed at step 60.
steps=200
train reference2 --steps $steps
job=$(ctl submit "$src/examples/char_transformer.json" --steps $steps 2>"$work/submit2.log") ||
  { cat "$work/submit2.log"; fail "gpipectl submit from this machine"; }
victim=$(sed -n 1p <<<"$workers")-worker
restarts_before=$(podman inspect "$victim" --format '{{.RestartCount}}')
until=$(deadline 120)
until python3 -c '
import json, sys, urllib.parse, urllib.request
url = sys.argv[1] + "/api/v1/query?" + urllib.parse.urlencode({"query": "max(gpipe_job_step{job=\"%s\"})" % sys.argv[2]})
r = json.load(urllib.request.urlopen(url, timeout=5))["data"]["result"]
sys.exit(0 if r and float(r[0]["value"][1]) >= 60 else 1)' "$prom" "$job" 2>/dev/null; do
  ((SECONDS < until)) || fail "$job did not reach step 60"
  sleep 1
done
# SIGKILL to the container's process, as the kernel's OOM killer or a
# crash would end it: podman 4.3 counts `podman kill` as a stop by the user
# and does not apply the restart policy to it.
kill -KILL "$(podman inspect "$victim" --format '{{.State.Pid}}')"
until=$(deadline 60)
until [[ "$(podman inspect "$victim" --format '{{.RestartCount}} {{.State.Running}}')" == "$((restarts_before + 1)) true" ]]; do
  ((SECONDS < until)) || fail "$victim was not restarted: $(podman inspect "$victim" --format '{{.RestartCount}} {{.State.Status}}')"
  sleep 1
done
echo "ok: $victim killed at step >= 60 and restarted by its restart policy"
CTL_TIMEOUT=600 ctl watch "$job" >"$work/$job.log" 2>&1 || { tail "$work/$job.log"; fail "$job did not succeed"; }
grep -q SUCCEEDED "$work/$job.log" || { tail "$work/$job.log"; fail "$job did not succeed"; }
podman logs gpipe-controller-controller 2>&1 | grep -i "$job" | grep -qi "recover\|lost\|epoch 2" ||
  fail "the controller logged no recovery of $job"
fetch "$job" "$work/model2"
same "$work/model2/model.safetensors" "$work/reference2/model.safetensors" \
  "after a worker was killed the model differs from gpipectl train"
echo "ok: $job recovered and SUCCEEDED, bitwise equal to gpipectl train"
passed=$((passed + 1))
echo "$passed passed, 0 failed"
