#!/usr/bin/env bash
# The cluster with TLS and tokens on (docs/security.md), on loopback: a CA
# and controller, worker and client certificates and tokens made by
# deploy/k8s/make-secrets.sh (the openssl CLI),
# a controller with mutual TLS, job API and worker tokens and a plaintext
# health port, three workers with certificates and the worker token.
#   1. bad security flags: each binary refuses to start / gpipectl refuses to
#      call, exit 2, the message naming the flag and the file;
#   2. gpipectl without a token, with a wrong one, in plaintext, without a
#      client certificate: refused with a clear message and a non-zero exit;
#   3. workers with a wrong token or a certificate of another CA: never
#      attached; probes get answers on the plaintext health ports;
#   4. a job runs to SUCCEEDED while a stranger (rogue_exchange) pushes
#      frames into its second stage with no stream key, a made-up one and no
#      certificate: each refused (logged, and counted in
#      gpipe_stage_rejected_streams_total), the job not restarted, and its
#      parameters bitwise the single-process reference run's;
#   5. no token or key in any log or in `status --json`;
#   6. a worker id belongs to the client certificate it attached with: the
#      same id and session key from another certificate is refused.
# Knob: SECURITY_STEPS (default 1500), KEEP_WORK=1.
#   security_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
bin="$1/bin"
src=$2
for b in gpipectl gpipe-controller gpipe-worker grpc_health_probe rogue_exchange hostile_client; do
  [[ -x "$bin/$b" ]] || { echo "SKIP: $bin/$b is not built"; echo "0 passed, 0 failed"; exit 0; }
done
command -v openssl >/dev/null || { echo "SKIP: no openssl CLI (scripts/setup.sh installs it)"; echo "0 passed, 0 failed"; exit 0; }
work=$(mktemp -d)
source "$src/tests/scripts/recovery_lib.sh"
trap cleanup EXIT
steps=${SECURITY_STEPS:-1500}
pki="$work/pki"
mkdir -p "$pki"

# --- certificates and tokens, made as docs/security.md makes them ----------
"$src/deploy/k8s/make-secrets.sh" "$pki" --days 2 >/dev/null
# A second CA with its own certificates: a stranger's.
"$src/deploy/k8s/make-secrets.sh" "$pki/other" --days 2 >/dev/null
# A second job API token (rotation: both are good).
openssl rand -hex 32 >>"$pki/api.tokens"
openssl rand -hex 32 >"$pki/wrong.token"
api_token=$(cat "$pki/client.token")

passed=0
ok() { echo "ok: $*"; passed=$((passed + 1)); }

# expect_refusal EXPECTED_TEXT COMMAND...: fails unless the command exits
# non-zero and prints EXPECTED_TEXT.
expect_refusal() {
  local want=$1 out rc
  shift
  set +e
  out=$("$@" 2>&1)
  rc=$?
  set -e
  ((rc != 0)) || fail "exit 0 from: $* (wanted a refusal: $want)"
  grep -qF -- "$want" <<<"$out" || fail "no \"$want\" from: $*: $out"
}

# --- 1. bad security flags ---------------------------------------------------
cport=$(free_port)
ctl_flags=(--listen "127.0.0.1:$cport" --checkpoint_dir "$work/ckpt" --metrics_listen "")
expect_refusal "--tls_cert is given without --tls_key" \
  "$bin/gpipe-controller" "${ctl_flags[@]}" --tls_cert "$pki/controller.crt"
expect_refusal "--tls_key=$pki/worker.key is not the private key of the certificate" \
  "$bin/gpipe-controller" "${ctl_flags[@]}" --tls_cert "$pki/controller.crt" --tls_key "$pki/worker.key"
expect_refusal "--tls_ca=$work/none.pem: no such file" \
  "$bin/gpipe-controller" "${ctl_flags[@]}" --tls_cert "$pki/controller.crt" --tls_key "$pki/controller.key" --tls_ca "$work/none.pem"
expect_refusal "--tls_cert=$pki/controller.key: holds a private key, not a certificate" \
  "$bin/gpipe-controller" "${ctl_flags[@]}" --tls_cert "$pki/controller.key" --tls_key "$pki/controller.key"
echo "not a token" >"$work/short.token"
expect_refusal "--api_token_file=$work/short.token line 1: a token may hold only printable ASCII without spaces" \
  "$bin/gpipe-controller" "${ctl_flags[@]}" --api_token_file "$work/short.token"
expect_refusal "--tls_ca is given without --tls_cert and --tls_key" \
  "$bin/gpipe-worker" --controller "127.0.0.1:$cport" --tls_ca "$pki/ca.crt"
expect_refusal "--token_file=$work/none: no such file" \
  "$bin/gpipe-worker" --controller "127.0.0.1:$cport" --token_file "$work/none"
expect_refusal "TLS needs --tls_ca" \
  "$bin/gpipectl" --controller "127.0.0.1:$cport" list --tls_cert "$pki/client.crt" --tls_key "$pki/client.key"
ok "bad certificate, key and token flags are refused, naming the flag and the file"

# --- the secured cluster -----------------------------------------------------
hport=$(free_port)
"$bin/gpipe-controller" "${ctl_flags[@]}" --heartbeat_timeout_ms 3000 --heartbeat_interval_ms 100 \
  --tls_cert "$pki/controller.crt" --tls_key "$pki/controller.key" --tls_ca "$pki/ca.crt" \
  --api_token_file "$pki/api.tokens" --worker_token_file "$pki/worker.token" \
  --health_listen "127.0.0.1:$hport" >"$work/controller.log" 2>&1 &
pids+=($!)
tls_client=(--tls_ca "$pki/ca.crt" --tls_cert "$pki/client.crt" --tls_key "$pki/client.key")
ctl() { GPIPE_TOKEN=$api_token "$bin/gpipectl" --controller "127.0.0.1:$cport" "${tls_client[@]}" "$@"; }
for _ in $(seq 100); do ctl list >/dev/null 2>&1 && break; sleep 0.1; done
ctl list >/dev/null || fail "the secured controller did not come up within 10 s"

worker_tls=(--tls_cert "$pki/worker.crt" --tls_key "$pki/worker.key" --tls_ca "$pki/ca.crt")
declare -A whealth
for name in w0 w1 w2; do
  port=$(free_port)
  whealth[$name]=$(free_port)
  "$bin/gpipe-worker" --controller "127.0.0.1:$cport" --listen "127.0.0.1:$port" \
    --threads 1 --link_wait_ms 2000 "${worker_tls[@]}" --tls_peer_name gpipe-worker \
    --token_file "$pki/worker.token" \
    --health_listen "127.0.0.1:${whealth[$name]}" \
    --metrics_listen 127.0.0.1:0 --metrics_port_file "$work/$name.metrics_port" \
    >"$work/$name.log" 2>&1 &
  pids+=($!)
  worker_port[$name]=$port
done
# Two that must never attach: a wrong token; a certificate of another CA.
"$bin/gpipe-worker" --controller "127.0.0.1:$cport" --listen "127.0.0.1:0" --threads 1 \
  "${worker_tls[@]}" --token_file "$pki/wrong.token" >"$work/wrong-token.log" 2>&1 &
pids+=($!)
"$bin/gpipe-worker" --controller "127.0.0.1:$cport" --listen "127.0.0.1:0" --threads 1 \
  --tls_cert "$pki/other/worker.crt" --tls_key "$pki/other/worker.key" --tls_ca "$pki/ca.crt" \
  --token_file "$pki/worker.token" >"$work/stranger.log" 2>&1 &
pids+=($!)

# --- 2. gpipectl refused ------------------------------------------------------
expect_refusal "the controller refused the token (UNAUTHENTICATED): missing bearer token" \
  env -u GPIPE_TOKEN "$bin/gpipectl" --controller "127.0.0.1:$cport" "${tls_client[@]}" list
expect_refusal "the controller refused the token (UNAUTHENTICATED): invalid bearer token" \
  "$bin/gpipectl" --controller "127.0.0.1:$cport" "${tls_client[@]}" --token_file "$pki/wrong.token" workers
expect_refusal "is the controller using TLS? (--tls_ca" env GPIPE_TOKEN="$api_token" \
  "$bin/gpipectl" --controller "127.0.0.1:$cport" list
expect_refusal "does it require a client certificate (--tls_cert, --tls_key)?" env GPIPE_TOKEN="$api_token" \
  "$bin/gpipectl" --controller "127.0.0.1:$cport" --tls_ca "$pki/ca.crt" list
expect_refusal "TLS handshake with 127.0.0.1:$cport failed" env GPIPE_TOKEN="$api_token" \
  "$bin/gpipectl" --controller "127.0.0.1:$cport" --tls_ca "$pki/other/ca.crt" \
  --tls_cert "$pki/client.crt" --tls_key "$pki/client.key" list
# The file's other token works too (rotation).
GPIPE_TOKEN=$(tail -n 1 "$pki/api.tokens") "$bin/gpipectl" --controller "127.0.0.1:$cport" \
  "${tls_client[@]}" list >/dev/null || fail "the file's second token was refused"
grep -q "refused ListJobs from" "$work/controller.log" || fail "the controller did not log the refused call"
ok "gpipectl without or with a wrong token, in plaintext, without a client certificate or trusting another CA: refused, exit non-zero, and said why"

# --- 3. workers, probes ------------------------------------------------------
n=0
for _ in $(seq 100); do
  n=$(ctl workers --json | python3 -c 'import json,sys; print(len(json.load(sys.stdin).get("workers", [])))')
  ((n >= 3)) && break
  sleep 0.1
done
((n == 3)) || fail "$n workers attached, expected exactly the 3 with the token and certificate"
sleep 0.5
n=$(ctl workers --json | python3 -c 'import json,sys; print(len(json.load(sys.stdin).get("workers", [])))')
((n == 3)) || fail "$n workers attached after a while: a worker without the token or the CA's certificate got in"
grep -q "UNAUTHENTICATED: check --token_file" "$work/wrong-token.log" || fail "the worker with a wrong token did not say why it cannot attach"
grep -q "cannot attach to the controller" "$work/stranger.log" || fail "the worker with another CA's certificate did not say it cannot attach"
grep -q "refused a worker's Attach" "$work/controller.log" || fail "the controller did not log the refused Attach"
"$bin/grpc_health_probe" "127.0.0.1:$hport" >/dev/null || fail "the controller's health port does not answer SERVING"
"$bin/grpc_health_probe" "127.0.0.1:${whealth[w0]}" gpipe.v1.Stage >/dev/null || fail "a worker's health port: liveness not SERVING"
"$bin/grpc_health_probe" "127.0.0.1:${whealth[w0]}" "" >/dev/null || fail "an attached worker's health port: readiness not SERVING"
if "$bin/grpc_health_probe" "127.0.0.1:$cport" >/dev/null 2>&1; then
  fail "a plaintext probe got an answer from the controller's TLS port"
fi
ok "only workers with the token and the CA's certificate attach; plaintext probes answer on --health_listen only"

# --- 4. a job, and a stranger pushing frames into it -------------------------
write_spec "$work/job.json" secure "$steps" 2 0 "$SGD"
# No self-balancing: on a busy machine the workers' step times can ask for
# a new cut, and its restart (a new epoch) would answer the stranger's
# streams with "older than this worker's epoch" before any key is checked.
python3 - "$work/job.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
d["pipeline"]["rebalance"] = {"enabled": False}
json.dump(d, open(sys.argv[1], "w"))
PY
job=$(ctl submit "$work/job.json" | tail -n 1)
st=""
for _ in $(seq 200); do
  st=$(ctl status "$job" --json | python3 -c "import json,sys; s=json.load(sys.stdin)['status']; print(s.get('state',''), s.get('epoch', 0), s['stages'][1]['address'] if len(s.get('stages', [])) > 1 else '', s.get('step', 0))")
  [[ "$st" == RUNNING* && "${st##* }" -ge 1 ]] && break
  sleep 0.05
done
read -r state epoch stage1 _ <<<"$st"
[[ "$state" == RUNNING ]] || fail "job $job is not running (status: $st)"
rogue=("$bin/rogue_exchange" "$stage1" "$job" "$epoch" 0)
out=$("${rogue[@]}" "${worker_tls[@]}") || fail "a stream without a key was taken: $out"
grep -q "^PERMISSION_DENIED: the stream carries no stream key" <<<"$out" || fail "no key: $out"
out=$("${rogue[@]}" "${worker_tls[@]}" --stream_key "$(openssl rand -hex 32)") || fail "a stream with a made-up key was taken: $out"
grep -q "^PERMISSION_DENIED: wrong stream key" <<<"$out" || fail "made-up key: $out"
out=$("${rogue[@]}" --tls_ca "$pki/ca.crt") || fail "a stream without a client certificate was taken: $out"
grep -q "^UNAVAILABLE" <<<"$out" || fail "no certificate: $out"
[[ "$(ctl status "$job" --json | python3 -c "import json,sys; print(json.load(sys.stdin)['status'].get('state',''))")" =~ ^(RUNNING|SUCCEEDED)$ ]] ||
  fail "the job did not survive the stranger's streams"
grep -q "rejected a link from .*stream key" "$work"/w?.log || fail "no worker logged the rejected streams"
for name in "${!worker_port[@]}"; do
  [[ "127.0.0.1:${worker_port[$name]}" == "$stage1" ]] && victim=$name
done
rejected=$(python3 - "http://127.0.0.1:$(cat "$work/$victim.metrics_port")/metrics" <<'PY'
import sys, urllib.request
text = urllib.request.urlopen(sys.argv[1], timeout=5).read().decode()
print(sum(float(l.split()[-1]) for l in text.splitlines()
          if l.startswith('gpipe_stage_rejected_streams_total{reason="stream_key"}')))
PY
)
[[ "$rejected" == 2.0 ]] || fail "gpipe_stage_rejected_streams_total{reason=\"stream_key\"} of $victim is $rejected, expected 2"
out=$(ctl watch "$job" 2>&1) || fail "job $job did not succeed: $(tail -n 3 <<<"$out")"
restarts=$(ctl status "$job" --json | python3 -c "import json,sys; print(int(json.load(sys.stdin)['status'].get('restarts', 0)))")
((restarts == 0)) || fail "the job restarted $restarts times"
same_as_reference "$job" "$work/job.json" 4
ok "a stranger's streams (no key, a made-up key, no certificate) are refused; the job SUCCEEDED unrestarted, bitwise the reference run"

# --- 5. secrets stay secret --------------------------------------------------
ctl status "$job" --json >"$work/status.json"
! grep -qi "streamKey\|stream_key" "$work/status.json" || fail "status --json shows a stream key"
secrets=$(grep -hv '^#' "$pki/api.tokens" "$pki/worker.token" | grep . || true)
if grep -rqF -f <(echo "$secrets") "$work"/*.log "$work/status.json"; then
  fail "a token appears in a log or the job status"
fi
if grep -rqE '[0-9a-f]{64}' "$work"/*.log "$work/status.json"; then
  fail "a 64-hex-digit secret (a stream key?) appears in a log or the job status"
fi
ok "no token or stream key in the logs or the job status"

# --- 6. a worker id belongs to its certificate --------------------------------
# A worker (played by hostile_client, so the test knows its session key)
# attached with the workers' certificate; the same id and key from another
# certificate of the same CA (gpipectl's) is refused, the worker's own
# certificate may re-attach.
key=bound-worker-session
"$bin/hostile_client" stall "127.0.0.1:$cport" 20 --worker_id bound --session_key "$key" \
  "${worker_tls[@]}" --token_file "$pki/worker.token" >"$work/bound.txt" 2>&1 &
bound=$!
pids+=("$bound")
for _ in $(seq 100); do
  ctl workers --json | grep -q '"bound"' && break
  sleep 0.1
done
ctl workers --json | grep -q '"bound"' || fail "the bound worker did not attach: $(cat "$work/bound.txt")"
out=$("$bin/hostile_client" forge-hello "127.0.0.1:$cport" bound --session_key "$key" \
  "${tls_client[@]}" --token_file "$pki/worker.token") || fail "another certificate took the worker's id: $out"
[[ "$out" == "ALREADY_EXISTS: worker bound is attached with another client certificate" ]] ||
  fail "another certificate: $out"
set +e
again=$("$bin/hostile_client" forge-hello "127.0.0.1:$cport" bound --session_key "$key" \
  "${worker_tls[@]}" --token_file "$pki/worker.token")
set -e
[[ "$again" == "WELCOMED as bound" ]] || fail "the worker's own certificate could not re-attach: $again"
kill "$bound" 2>/dev/null || true
wait "$bound" 2>/dev/null || true
ok "a worker id is bound to its client certificate: $out"
echo "$passed passed, 0 failed"
