#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz/) with Debian's clang into
# build-fuzz/, apart from the gcc build in build/: every library the targets
# link is compiled with ASan + UBSan and libFuzzer's coverage hooks.
#   scripts/build-fuzz.sh [TARGET...]   (default: the three fuzz targets and
#                                        the controller library)
# Fails when clang or libFuzzer is missing (scripts/setup.sh installs them).
set -euo pipefail
cd "$(dirname "$0")/.."
for tool in clang clang++; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "build-fuzz: $tool not found (run scripts/setup.sh)" >&2
    exit 1
  fi
done
if ! clang++ -print-file-name=libclang_rt.fuzzer-x86_64.a | grep -q /; then
  echo "build-fuzz: libFuzzer (libclang_rt.fuzzer) not found: install libclang-rt-dev" >&2
  exit 1
fi
# vptr is left out: protobuf and gRPC are gcc-built without the type info
# UBSan's dynamic-type check expects. Any other UBSan finding aborts.
san="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize=vptr"
san+=" -fno-sanitize-recover=undefined -fno-omit-frame-pointer -g"
cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DCMAKE_C_FLAGS="$san" -DCMAKE_CXX_FLAGS="$san" \
  -DGPIPE_FUZZ=ON -DGPIPE_CUDA=OFF -DGPIPE_BUILD_BENCH=OFF >/dev/null
if (($#)); then
  targets=("$@")
else
  # The controller too: it runs no fuzzer, but clang checks its lock
  # annotations (-Wthread-safety) only where it compiles it.
  targets=(frame_fuzzer job_spec_fuzzer checkpoint_fuzzer data_file_fuzzer
    gpipe_controller)
fi
cmake --build build-fuzz -j"$(nproc)" --target "${targets[@]}"
