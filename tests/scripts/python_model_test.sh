#!/usr/bin/env bash
# docs/model-format.md, proved: a numpy forward pass written from it alone
# (python/gpipe/numpy_model.py) reproduces `gpipectl eval`'s test loss to
# 1e-5 relative on a Fashion-MNIST MLP and on a character Transformer
# trained here by gpipectl.
#   python_model_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
bin="$(cd "$1" && pwd)/bin"
src=$(cd "$2" && pwd)
py=/usr/bin/python3
[[ -x "$bin/gpipectl" ]] || { echo "SKIP: $bin/gpipectl is not built"; echo "0 passed, 0 failed"; exit 0; }
"$py" -c 'import numpy' 2>/dev/null || { echo "FAIL: $py lacks numpy: run scripts/setup.sh"; exit 1; }
export PYTHONPATH="$src/python"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
passed=0
fail() { echo "FAIL: $*"; exit 1; }
ok() { echo "ok: $*"; passed=$((passed + 1)); }

# same_loss MODEL WHAT: eval's loss and numpy's agree to 1e-5 relative.
same_loss() {
  "$bin/gpipectl" eval "$1" --threads 1 --stages 1 --json >"$work/eval.json" ||
    fail "gpipectl eval $1"
  "$py" "$src/python/tests/eval_model.py" "$1" >"$work/numpy.json" ||
    fail "eval_model.py $1"
  "$py" - "$work/eval.json" "$work/numpy.json" "$2" <<'PY'
import json, sys
ours, theirs, what = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), sys.argv[3]
rel = abs(ours["loss"] - theirs["loss"]) / abs(ours["loss"])
print("%s: gpipectl eval loss %.9g, numpy %.9g (relative %.2e), %d targets" %
      (what, ours["loss"], theirs["loss"], rel, ours["counted"]))
assert ours["counted"] == theirs["counted"], (ours, theirs)
assert rel < 1e-5, rel
PY
}

if [[ -f /usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz ]]; then
  cat >"$work/mlp.json" <<'JSON'
{
  "model": {
    "input": {"dtype": "FLOAT32", "shape": {"dims": [784]}},
    "layers": [
      {"linear": {"inFeatures": 784, "outFeatures": 64}}, {"relu": {}},
      {"linear": {"inFeatures": 64, "outFeatures": 32}}, {"gelu": {}},
      {"layerNorm": {"features": 32}},
      {"linear": {"inFeatures": 32, "outFeatures": 10}}
    ],
    "loss": {"softmaxCrossEntropy": {}}
  },
  "optimizer": {"lr": 0.002, "adamw": {}},
  "data": {"fashionMnist": {}, "normalize": {"mean": [0.2860], "std": [0.3530]}},
  "batchSize": 64,
  "steps": 60,
  "eval": {"maxSamples": 1000}
}
JSON
  "$bin/gpipectl" train "$work/mlp.json" --threads 1 --out "$work/mlp" >"$work/mlp.txt" 2>&1 ||
    fail "train mlp: $(tail -n 3 "$work/mlp.txt")"
  same_loss "$work/mlp/model.safetensors" "Fashion-MNIST MLP" || fail "the MLP's losses differ"
  ok "the MLP (linear, relu, gelu, layer norm, normalized inputs)"
fi

"$py" -c "
import random
random.seed(1)
words = ['pipe', 'stage', 'bubble', 'micro', 'batch', 'worker', 'grad']
open('$work/words.txt', 'w').write(' '.join(random.choice(words) for _ in range(3000)))"
cat >"$work/char.json" <<'JSON'
{
  "model": {
    "input": {"dtype": "INT32", "shape": {"dims": [24]}},
    "layers": [
      {"embedding": {"vocabSize": 0, "dim": 32, "maxPositions": 24}},
      {"transformerBlock": {"dim": 32, "heads": 4}},
      {"transformerBlock": {"dim": 32, "heads": 2, "mlpHidden": 48}},
      {"layerNorm": {"features": 32}},
      {"linear": {"inFeatures": 32, "outFeatures": 0}}
    ],
    "loss": {"softmaxCrossEntropy": {}}
  },
  "optimizer": {"lr": 0.003, "adamw": {}},
  "data": {"text": {"path": "words.txt", "seqLen": 24}},
  "batchSize": 16,
  "steps": 30
}
JSON
(cd "$work" && "$bin/gpipectl" train char.json --threads 1 --out char >char.txt 2>&1) ||
  fail "train char: $(tail -n 3 "$work/char.txt")"
same_loss "$work/char/model.safetensors" "char Transformer" || fail "the Transformer's losses differ"
ok "the Transformer (embedding, attention, blocks, layer norm, head)"
echo "$passed passed, 0 failed"
