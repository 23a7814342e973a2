#!/usr/bin/env bash
# docs/training.md, proved against PyTorch: SGD (momentum, weight decay,
# Nesterov) and AdamW under both weight-decay rules, with warm-up, cosine
# and linear decay and global-norm clipping, in one process and through a
# 2-stage pipeline, end at PyTorch's weights (tests/scripts/torch_parity.py).
#   torch_parity_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
bin="$(cd "$1" && pwd)/bin"
src=$(cd "$2" && pwd)
py=/usr/bin/python3
[[ -x "$bin/gpipectl" ]] || { echo "SKIP: $bin/gpipectl is not built"; echo "0 passed, 0 failed"; exit 0; }
"$py" -c 'import numpy, torch' 2>/dev/null ||
  { echo "FAIL: $py lacks numpy or torch (python3-torch): run scripts/setup.sh"; exit 1; }
export PYTHONPATH="$src/python"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
exec "$py" "$src/tests/scripts/torch_parity.py" "$bin/gpipectl" "$work"
