#!/usr/bin/env bash
# A stage reaches a neighbour that advertises a DNS name as fast as one that
# advertises its IP, behind a DNS server that answers A questions and never
# AAAA ones (as container DNS servers do that forward AAAA to an upstream
# they cannot reach; gRPC's resolver waits for both answers, and a named
# neighbour took 25 s to connect that way), and still connects when the
# name's record appears only seconds after the job starts.
# Real processes: the workers run in a mount namespace of their own whose
# /etc/resolv.conf points at tests/scripts/fake_dns.py on a loopback
# address. Needs root (unshare, port 53); skips otherwise.
#   named_neighbour_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
bin="$1/bin"
src=$2
for b in gpipectl gpipe-controller gpipe-worker; do
  [[ -x "$bin/$b" ]] || { echo "SKIP: $bin/$b is not built"; echo "0 passed, 0 failed"; exit 0; }
done
unshare --mount --propagation private true 2>/dev/null ||
  { echo "SKIP: unshare --mount needs root"; echo "0 passed, 0 failed"; exit 0; }
work=$(mktemp -d)
source "$src/tests/scripts/recovery_lib.sh"
trap cleanup EXIT

dns_ip=127.53.$((RANDOM % 200 + 1)).$((RANDOM % 200 + 1))
printf 'nameserver %s\noptions timeout:5 attempts:2\n' "$dns_ip" >"$work/resolv.conf"

# start_dns DELAY NAME=IP: the fake DNS server, fresh.
dns_pid=""
start_dns() {
  [[ -z "$dns_pid" ]] || { kill "$dns_pid" 2>/dev/null || true; wait "$dns_pid" 2>/dev/null || true; }
  rm -f "$work/dns.port"
  python3 "$src/tests/scripts/fake_dns.py" "$dns_ip" "$work/dns.port" "$@" >>"$work/dns.log" 2>&1 &
  dns_pid=$!
  pids+=("$dns_pid")
  local _
  for _ in $(seq 50); do [[ -s "$work/dns.port" ]] && return 0; sleep 0.1; done
  fail "the fake DNS server did not start (port 53 taken?): $(cat "$work/dns.log")"
}

# named_worker NAME ADVERTISE PORT: a worker behind the fake DNS.
named_worker() {
  (cd "$work" && exec unshare --mount --propagation private \
    sh -c 'mount --bind "$0" /etc/resolv.conf && exec "$@"' "$work/resolv.conf" \
    "$bin/gpipe-worker" --controller "127.0.0.1:$cport" --listen "127.0.0.1:$3" \
    --advertise "$2" --threads 1) >"$work/$1.log" 2>&1 &
  worker_pid[$1]=$!
  worker_port[$1]=$3
  pids+=($!)
}

cport=$(free_port)
start_controller
write_spec "$work/job.json" named-neighbour 60 2 0 "$SGD"

# run CASE DELAY [ADVERTISE]: a fresh pair of workers, the second
# advertising a name (ADVERTISE, default stage-b.gpipe.test:PORT) whose A
# record appears DELAY seconds after the DNS server starts; sets $ms to how
# long stage 0 took to reach stage 1, from its log.
run() {
  local case=$1 delay=$2 up_port down_port job n advertise
  up_port=$(free_port)
  down_port=$(free_port)
  named_worker "$case-up" "127.0.0.1:$up_port" "$up_port"
  wait_workers 1
  start_dns "$delay" "stage-b.gpipe.test=127.0.0.1"
  advertise=${3:-stage-b.gpipe.test:$down_port}
  named_worker "$case-down" "$advertise" "$down_port"
  wait_workers 2
  job=$(submit "$work/job.json")
  wait_done "$job"
  same_as_reference "$job" "$work/job.json" 4
  ms=$(sed -n 's/.*reached stage 1 at stage-b\.gpipe\.test:[0-9]* (127\.0\.0\.1) in \([0-9]*\) ms.*/\1/p' "$work/$case-up.log" | head -n 1)
  [[ -n "$ms" ]] || fail "$case: stage 0 logged no connection to stage-b.gpipe.test"
  kill "${worker_pid[$case-up]}" "${worker_pid[$case-down]}" 2>/dev/null || true
  wait "${worker_pid[$case-up]}" "${worker_pid[$case-down]}" 2>/dev/null || true
  unset "worker_port[$case-up]" "worker_port[$case-down]"
  for _ in $(seq 50); do
    n=$("$bin/gpipectl" --controller "127.0.0.1:$cport" workers --json 2>/dev/null |
      python3 -c 'import json,sys; print(len(json.load(sys.stdin).get("workers", [])))' 2>/dev/null || echo 9)
    ((n == 0)) && break
    sleep 0.1
  done
}

# What the name costs with both families asked at once (getaddrinfo as gRPC
# and most clients ask): the AAAA question hangs until the resolver gives up.
start_dns 0 "stage-b.gpipe.test=127.0.0.1"
# lookup WHAT: ms for getent WHAT of the name behind the fake DNS (at most 3 s).
lookup() {
  local start end
  start=$(date +%s%N)
  unshare --mount --propagation private sh -c \
    'mount --bind "$0" /etc/resolv.conf && exec timeout 3 getent "$1" stage-b.gpipe.test' \
    "$work/resolv.conf" "$1" >/dev/null 2>&1 || true
  end=$(date +%s%N)
  echo $(((end - start) / 1000000))
}
both=$(lookup ahosts)
v4=$(lookup ahostsv4)
echo "behind this DNS server: IPv4 and IPv6 asked together take $both ms (given up at 3000), IPv4 alone $v4 ms"
# gRPC's own resolver dialling the name (what stages did before): the
# controller's health service by name, with a 3 s deadline.
if [[ -x "$1/bin/grpc_health_probe" ]]; then
  if unshare --mount --propagation private sh -c \
    'mount --bind "$0" /etc/resolv.conf && exec "$@"' "$work/resolv.conf" \
    "$1/bin/grpc_health_probe" "stage-b.gpipe.test:$cport" --timeout_ms 3000 >/dev/null 2>&1; then
    echo "gRPC's resolver reached the name within 3 s here (this DNS server does not reproduce the hang)"
  else
    echo "gRPC's resolver dialling the name: not connected within 3 s"
  fi
fi

# A worker refuses an advertised address with an unexpanded $(VAR) (a
# manifest whose variable the runtime did not fill), naming the flag.
if "$bin/gpipe-worker" --controller "127.0.0.1:$cport" --listen 127.0.0.1:0 \
  --advertise '$(POD_IP):7071' --threads 1 >"$work/unexpanded.log" 2>&1; then
  fail "a worker started with --advertise=\$(POD_IP):7071"
fi
grep -q "advertise=\$(POD_IP):7071 holds an unexpanded variable" "$work/unexpanded.log" ||
  fail "the unexpanded advertise was not named: $(cat "$work/unexpanded.log")"

# The name alone (a pod's name from the downward API): the worker adds the
# port it is bound to.
run now 0 stage-b.gpipe.test
at_once=$ms
echo "named neighbour, record there from the start: connected in $at_once ms"
((at_once < 2000)) || fail "a named neighbour took $at_once ms to connect (want < 2000)"

run late 3
late=$ms
echo "named neighbour, record appearing after 3 s: connected in $late ms"
((late >= 1000 && late < 8000)) || fail "a late name connected in $late ms (want 1000..8000)"
echo "1 passed, 0 failed"
