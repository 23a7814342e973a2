#!/usr/bin/env bash
# Configures and builds into build/ (Release, ccache when present).
#   scripts/build.sh [TARGET...]
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
if (($#)); then
  cmake --build build -j"$jobs" --target "$@"
else
  cmake --build build -j"$jobs"
fi
