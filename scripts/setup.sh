#!/usr/bin/env bash
# Installs every Debian package the project builds, tests and runs with.
# Quick when all is present: it asks apt only for what is missing.
#   scripts/setup.sh           build, test and run
#   scripts/setup.sh --bench   the same (PyTorch, which the benchmarks run
#                              beside ours, is among the test packages)
#   scripts/setup.sh --image   what an image build needs (deploy/docker): not
#                              the offline Kubernetes checks' tools
set -euo pipefail

# What the three binaries are built from: all an image build needs
# (deploy/docker; --image installs only these).
image_packages=(
  build-essential cmake ccache pkg-config
  protobuf-compiler libprotobuf-dev libgrpc++-dev protobuf-compiler-grpc libgrpc-dev
  libabsl-dev libopenblas-pthread-dev libsqlite3-dev libssl-dev zlib1g-dev
  libpng-dev libjpeg62-turbo-dev prometheus-cpp-dev libjemalloc-dev
)
packages=(
  "${image_packages[@]}" git python3
  openssl
  libgtest-dev libgmock-dev libbenchmark-dev
  prometheus
  dataset-fashion-mnist
  inotify-tools
  # The Python package (python/): Debian's interpreter with gRPC, protobuf
  # and numpy; grpc_python_plugin comes with protobuf-compiler-grpc.
  python3-grpcio python3-protobuf python3-numpy
  # PyTorch (CPU): the parity test against torch.optim
  # (tests/scripts/torch_parity_test.sh), the torch bridge's tests and the
  # side-by-side benchmarks.
  python3-torch
  # The libFuzzer targets (tests/fuzz, scripts/build-fuzz.sh): clang, its
  # runtime (libFuzzer, ASan, UBSan) and its OpenMP.
  clang libclang-rt-dev libomp-dev
  # The pods e2e test (tests/scripts/pods_e2e_test.sh): podman with the runc
  # runtime (crun refuses some hosts' cgroups), netavark and aardvark-dns
  # for a bridge network with DNS, iptables for its rules, catatonit for
  # kube play's pause process, mmdebstrap for the base images
  # (deploy/docker/base-image.sh), iproute2's tc for the link shaping bench.
  podman runc netavark aardvark-dns iptables catatonit mmdebstrap iproute2
)
# The offline Kubernetes checks (tests/scripts/k8s_*): yamllint, and kubectl
# to render the manifests. Debian's kubernetes-client conflicts with other
# kubectl packages: only when there is no kubectl at all.
if [[ "${1:-}" == "--image" ]]; then
  packages=("${image_packages[@]}")
else
  packages+=(yamllint python3-yaml)
  if ! command -v kubectl >/dev/null 2>&1; then
    packages+=(kubernetes-client)
  fi
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=()
  if [[ $(id -u) -ne 0 ]]; then sudo_cmd=(sudo); fi
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -qq
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "setup: all packages present"
fi
