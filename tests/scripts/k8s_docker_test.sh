#!/usr/bin/env bash
# The Dockerfiles, checked without a container engine: hadolint when it is
# installed, always tests/scripts/k8s_dockerfile_check.py (pinned bases,
# non-root runtime, COPY sources and scripts that exist, binaries that the
# build makes); the checker catches a broken Dockerfile; the entrypoint turns
# environment into flags; runtime-packages.sh finds the packages of the
# binaries' shared libraries.
#   k8s_docker_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
bin="$1/bin"
src=$(cd "$2" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
passed=0
dockerfiles=("$src/deploy/docker/Dockerfile" "$src/deploy/docker/Dockerfile.cuda")

python3 "$src/tests/scripts/k8s_dockerfile_check.py" "$src" "${dockerfiles[@]}" ||
  fail "the Dockerfiles"
if command -v hadolint >/dev/null; then
  hadolint "${dockerfiles[@]}" || fail "hadolint"
else
  echo "(hadolint is not installed: Debian 12 does not package it)"
fi
passed=$((passed + 1))

# A Dockerfile with every mistake the checker looks for.
cat >"$work/Dockerfile" <<'DOCKER'
FROM debian:latest AS build
RUN scripts/no-such-setup.sh && cmake --build build --target no-such-binary
FROM debian
COPY --from=nowhere /src/build/bin/gpipe-worker /usr/local/bin/
COPY no/such/file /x
RUN apt-get install -y curl
DOCKER
if python3 "$src/tests/scripts/k8s_dockerfile_check.py" "$src" "$work/Dockerfile" >"$work/out" 2>&1; then
  fail "the checker passed a broken Dockerfile"
fi
for want in "latest" "no pinned tag" "no-such-setup.sh" "no-such-binary" \
  "nowhere" "no/such/file" "no-install-recommends" "USER" "gpipe-entrypoint"; do
  grep -q -- "$want" "$work/out" || fail "the checker missed: $want"$'\n'"$(cat "$work/out")"
done
passed=$((passed + 1))

# The entrypoint: GPIPE_WORKER_<FLAG> becomes --<flag>; the command line
# comes last (it wins); other binaries' variables are not passed.
mkdir -p "$work/path"
printf '#!/bin/sh\nfor a in "$@"; do echo "$a"; done\n' >"$work/path/gpipe-worker"
chmod +x "$work/path/gpipe-worker"
# Kubernetes' service links for a Service gpipe-worker share the prefix
# and are no flags.
got=$(env -i PATH="$work/path:/usr/bin:/bin" GPIPE_WORKER_THREADS=4 \
  GPIPE_WORKER_LINK_WAIT_MS=500 GPIPE_CONTROLLER_LISTEN=x:1 \
  GPIPE_WORKER_SERVICE_HOST=10.96.0.9 GPIPE_WORKER_SERVICE_PORT=7071 \
  GPIPE_WORKER_SERVICE_PORT_STAGES=7071 GPIPE_WORKER_PORT=tcp://10.96.0.9:7071 \
  GPIPE_WORKER_PORT_7071_TCP=tcp://10.96.0.9:7071 GPIPE_WORKER_PORT_7071_TCP_PROTO=tcp \
  GPIPE_WORKER_PORT_7071_TCP_ADDR=10.96.0.9 \
  sh "$src/deploy/docker/entrypoint.sh" gpipe-worker --threads=2 --advertise=10.0.0.7:7071 | tr '\n' ' ')
want="--link_wait_ms=500 --threads=4 --threads=2 --advertise=10.0.0.7:7071 "
[[ "$got" == "$want" ]] || fail "entrypoint passed [$got], want [$want]"
if sh "$src/deploy/docker/entrypoint.sh" >/dev/null 2>&1; then
  fail "the entrypoint without a binary exited 0"
fi
passed=$((passed + 1))

# runtime-packages.sh on the binaries built here (Debian 12 is the CPU
# image's base): known packages, gRPC among them, and no BLAS (our GEMM is
# our own).
if [[ -x "$bin/gpipe-worker" && -x "$bin/gpipe-controller" && -x "$bin/gpipectl" ]]; then
  "$src/deploy/docker/runtime-packages.sh" "$bin/gpipe-controller" "$bin/gpipe-worker" \
    "$bin/gpipectl" >"$work/packages" || fail "runtime-packages.sh"
  grep -q '^libgrpc++' "$work/packages" || fail "no gRPC runtime package in $(cat "$work/packages")"
  if grep -q 'blas' "$work/packages"; then fail "a BLAS in the runtime: $(cat "$work/packages")"; fi
  if grep -q -- '-dev$' "$work/packages"; then fail "a -dev package in the runtime: $(cat "$work/packages")"; fi
  echo "runtime packages: $(tr '\n' ' ' <"$work/packages")"
  passed=$((passed + 1))
fi
echo "$passed passed, 0 failed"
