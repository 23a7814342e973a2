#!/usr/bin/env bash
# Using a trained model file: `gpipectl eval` prints what the training run
# printed for the same split (Fashion-MNIST MLP, two stages); `generate`
# continues a text with a char model; `predict`
# classifies test images given as PGM files and as a uint8 .npy array alike,
# mostly right; a CSV model predicts from a table whose columns come in
# another order (found by name); a model file of a newer format, a stage
# file and an LM are refused naming why.
#   model_use_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
bin="$(cd "$1" && pwd)/bin"
src=$2
[[ -x "$bin/gpipectl" ]] || { echo "SKIP: $bin/gpipectl is not built"; echo "0 passed, 0 failed"; exit 0; }
fmnist=/usr/share/datasets/fashion-mnist
[[ -f "$fmnist/t10k-images-idx3-ubyte.gz" ]] || { echo "SKIP: no $fmnist"; echo "0 passed, 0 failed"; exit 0; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
passed=0
fail() { echo "FAIL: $*"; exit 1; }
ok() { echo "ok: $*"; passed=$((passed + 1)); }
g() { "$bin/gpipectl" "$@"; }
# write_npy PATH DESCR SHAPE: an .npy file of that dtype and shape whose data
# is the bytes on stdin (no numpy needed).
write_npy() {
  python3 -c '
import sys
path, descr, shape = sys.argv[1:4]
header = "{%r: %r, %r: False, %r: %s, }" % ("descr", descr, "fortran_order", "shape", shape)
header += " " * (63 - (10 + len(header)) % 64) + "\n"
with open(path, "wb") as f:
    f.write(b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode())
    f.write(sys.stdin.buffer.read())' "$@"
}

cat >"$work/mlp.json" <<'JSON'
{
  "name": "mlp",
  "model": {
    "input": {"dtype": "FLOAT32", "shape": {"dims": [784]}},
    "layers": [
      {"linear": {"inFeatures": 784, "outFeatures": 64}},
      {"relu": {}},
      {"linear": {"inFeatures": 64, "outFeatures": 10}}
    ],
    "loss": {"softmaxCrossEntropy": {}}
  },
  "optimizer": {"lr": 0.002, "adamw": {}},
  "data": {"fashionMnist": {}, "normalize": {"mean": [0.2860], "std": [0.3530]}},
  "pipeline": {"stages": 2, "microBatches": 4},
  "batchSize": 64,
  "steps": 200,
  "seed": 4,
  "eval": {"maxSamples": 2000}
}
JSON
g train "$work/mlp.json" --threads 2 --out "$work/mlp" >"$work/train.txt" 2>&1 ||
  fail "train: $(tail -n 3 "$work/train.txt")"
want=$(sed -n 's/^final: //p' "$work/train.txt")
got=$(g eval "$work/mlp/model.safetensors" --threads 2 | tail -n 1)
[[ -n "$want" && "$got" == "$want" ]] || fail "eval printed '$got', the training run '$want'"
g eval "$work/mlp/model.safetensors" --threads 2 --json | python3 -c '
import json, sys
e = json.load(sys.stdin)
assert e["split"] == "test" and e["counted"] == 2000 and 0.5 < e["accuracy"] <= 1, e'
ok "eval reproduces the run's final evaluation: $got"

# Eight test images as PGM files and as one uint8 array, with their labels.
python3 - "$fmnist" "$work" <<'PY'
import gzip, struct, sys
src, out = sys.argv[1], sys.argv[2]
images = gzip.open(src + "/t10k-images-idx3-ubyte.gz").read()[16:]
labels = gzip.open(src + "/t10k-labels-idx1-ubyte.gz").read()[8:]
n = 8
import zlib
def png(pixels, channels):  # 28 x 28, 8-bit grey (1) or RGB (3)
    chunk = lambda kind, body: (struct.pack(">I", len(body)) + kind + body +
                                struct.pack(">I", zlib.crc32(kind + body)))
    rows = b"".join(b"\0" + pixels[r * 28 * channels:(r + 1) * 28 * channels]
                    for r in range(28))
    return (b"\x89PNG\r\n\x1a\n" +
            chunk(b"IHDR", struct.pack(">IIBBBBB", 28, 28, 8, 2 if channels == 3 else 0, 0, 0, 0)) +
            chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))
for i in range(n):
    grey = images[i * 784:(i + 1) * 784]
    with open("%s/img%d.pgm" % (out, i), "wb") as f:
        f.write(b"P5\n# a test image\n28 28\n255\n" + grey)
    # As a PNG too: grey, or grey repeated as RGB for odd images.
    rgb = bytes(v for v in grey for _ in range(3))
    open("%s/img%d.png" % (out, i), "wb").write(png(rgb, 3) if i % 2 else png(grey, 1))
header = "{'descr': '|u1', 'fortran_order': False, 'shape': (%d, 784), }" % n
header += " " * (63 - (10 + len(header)) % 64) + "\n"
with open(out + "/imgs.npy", "wb") as f:
    f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode())
    f.write(images[:n * 784])
open(out + "/labels.txt", "w").write(" ".join(str(b) for b in labels[:n]))
PY
g predict "$work/mlp/model.safetensors" "$work/imgs.npy" --json >"$work/npy.json"
right=0
for i in $(seq 0 7); do
  cls=$(g predict "$work/mlp/model.safetensors" "$work/img$i.pgm" --json |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["predictions"][0]["class"])')
  from_npy=$(python3 -c "import json; print(json.load(open('$work/npy.json'))['predictions'][$i]['class'])")
  [[ "$cls" == "$from_npy" ]] || fail "image $i: the PGM says class $cls, the .npy $from_npy"
  from_png=$(g predict "$work/mlp/model.safetensors" "$work/img$i.png" --json |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["predictions"][0]["class"])')
  [[ "$from_png" == "$cls" ]] || fail "image $i: the PNG says class $from_png, the PGM $cls"
  label=$(cut -d' ' -f$((i + 1)) "$work/labels.txt")
  [[ "$cls" == "$label" ]] && right=$((right + 1))
done
((right >= 6)) || fail "only $right of 8 test images were classified right"
g predict "$work/mlp/model.safetensors" "$work/img0.pgm" | grep -q "img0.pgm\[0\]: class [0-9] (" ||
  fail "predict's text output: $(g predict "$work/mlp/model.safetensors" "$work/img0.pgm")"
# The same bytes as float32 are taken as they are, 255 times too bright:
# predict says so instead of answering with certainty in silence.
python3 - "$work/imgs.npy" "$work/imgs_f32.npy" <<'PY'
import struct, sys
raw = open(sys.argv[1], "rb").read()
n = (len(raw) - 128) // 784
header = "{'descr': '<f4', 'fortran_order': False, 'shape': (%d, 784), }" % n
header += " " * (63 - (10 + len(header)) % 64) + "\n"
with open(sys.argv[2], "wb") as f:
    f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode())
    f.write(struct.pack("<%df" % (n * 784), *raw[128:]))
PY
warned=$(g predict "$work/mlp/model.safetensors" "$work/imgs_f32.npy" 2>&1 >/dev/null)
grep -q "holds values up to 255, .*divide them by 255" <<<"$warned" ||
  fail "no warning for pixels of 0-255 as floats: $warned"
g predict "$work/mlp/model.safetensors" "$work/imgs.npy" --json --stages 2 >"$work/npy2.json"
python3 - "$work/npy.json" "$work/npy2.json" <<'PY'
import json, sys
one, two = (json.load(open(p))["predictions"] for p in sys.argv[1:3])
assert [p["class"] for p in one] == [p["class"] for p in two], (one, two)
assert all(abs(a["probability"] - b["probability"]) < 1e-4 for a, b in zip(one, two))
PY
ok "predict: PGM images, grey and RGB PNGs and a uint8 .npy give the same classes, $right of 8 right; so do 2 stages"
# --logits: the scores themselves, the same bits through 2 stages, and the
# printed probabilities their softmax.
g predict "$work/mlp/model.safetensors" "$work/imgs.npy" --json --logits "$work/logits1.npy" >"$work/l1.json"
g predict "$work/mlp/model.safetensors" "$work/imgs.npy" --json --stages 2 --logits "$work/logits2.npy" >/dev/null
/usr/bin/python3 - "$work/logits1.npy" "$work/logits2.npy" "$work/l1.json" <<'PY'
import json, sys
import numpy as np
one, two = np.load(sys.argv[1]), np.load(sys.argv[2])
printed = json.load(open(sys.argv[3]))["predictions"]
assert one.dtype == np.float32 and one.shape == (len(printed), 10), (one.dtype, one.shape)
assert one.tobytes() == two.tobytes(), np.abs(one - two).max()
p = np.exp(one - one.max(axis=1, keepdims=True))
p /= p.sum(axis=1, keepdims=True)
for row, want in zip(p, printed):
    assert row.argmax() == want["class"], (row, want)
    assert abs(row[want["class"]] - want["probability"]) < 1e-5, (row, want)
PY
out=$(g predict "$work/mlp/model.safetensors" "$work/imgs.npy" --logits "$work/no/such/dir/l.npy" 2>&1) &&
  fail "predict --logits into a missing folder exited 0"
grep -q "no/such/dir" <<<"$out" || fail "predict --logits' error does not name the path: $out"
ok "predict --logits: float32 scores, bitwise the same through 2 stages, whose softmax is the printed probability"
# Samples of another size are refused, not regrouped: 8 rows of 392 bytes
# hold as many values as 4 images and were read as 4.
python3 -c 'import sys; sys.stdout.buffer.write(bytes(8 * 392))' |
  write_npy "$work/halves.npy" '|u1' '(8, 392)'
set +e
out=$(g predict "$work/mlp/model.safetensors" "$work/halves.npy" 2>&1)
set -e
[[ "$out" == *"an array of [8, 392] is neither one sample nor [N, ...] samples of the model's input of 784 values"* ]] ||
  fail "samples of another size: $out"
# An array of no samples says so.
python3 -c 'import sys' | write_npy "$work/none.npy" '|u1' '(0, 784)'
set +e
out=$(g predict "$work/mlp/model.safetensors" "$work/none.npy" 2>&1)
set -e
[[ "$out" == *"an array of [0, 784] holds no samples: nothing to predict"* ]] ||
  fail "an array of no samples: $out"
ok "predict refuses an array whose samples are not the model's input, or that holds none"
python3 -c '
import struct, sys
values = [0.0] * (2 * 784)
values[900] = float("nan")
sys.stdout.buffer.write(struct.pack("<%df" % len(values), *values))' |
  write_npy "$work/nan.npy" '<f4' '(2, 784)'
set +e
out=$(g predict "$work/mlp/model.safetensors" "$work/nan.npy" 2>&1)
set -e
[[ "$out" == *"nan.npy: value nan is not finite at flat index 900 (sample 1)"* ]] ||
  fail "a NaN in an .npy: $out"
ok "predict names the .npy file holding a value that is not finite"
set +e
out=$(g generate "$work/mlp/model.safetensors" --prompt hi 2>&1)
set -e
# A text prompt too: the model is named, not the prompt.
[[ "$out" == *"generation needs a language model"*"this model's input is FLOAT32"* ]] ||
  fail "generate on a classifier with a text prompt: $out"

# A table with a header; predict finds the features by name.
python3 - "$work" <<'PY'
import random, sys
out = sys.argv[1]
random.seed(2)
with open(out + "/t.csv", "w") as f:
    f.write("x,label,y\n")
    for i in range(400):
        c = i % 2
        f.write("%.4f,%d,%.4f\n" % (c * 3 + random.gauss(0, 1), c, 100 * c + random.gauss(0, 30)))
with open(out + "/ask.csv", "w") as f:
    f.write("y,x\n100,3\n0,0\n")
PY
cat >"$work/csv.json" <<JSON
{
  "model": {
    "input": {"dtype": "FLOAT32", "shape": {"dims": [2]}},
    "layers": [{"linear": {"inFeatures": 2, "outFeatures": 8}}, {"relu": {}},
               {"linear": {"inFeatures": 8, "outFeatures": 0}}],
    "loss": {"softmaxCrossEntropy": {}}
  },
  "optimizer": {"lr": 0.05, "sgd": {"momentum": 0.9}},
  "data": {"csv": {"path": "t.csv", "target": "label", "standardize": true}},
  "batchSize": 32,
  "steps": 100
}
JSON
(cd "$work" && g train csv.json --out csv >csv.txt 2>&1) || fail "csv train: $(tail -n 3 "$work/csv.txt")"
classes=$(g predict "$work/csv/model.safetensors" "$work/ask.csv" --json |
  python3 -c 'import json,sys; print(" ".join(str(p["class"]) for p in json.load(sys.stdin)["predictions"]))')
[[ "$classes" == "1 0" ]] || fail "the CSV model predicted '$classes' for (x=3, y=100) and (0, 0)"
ok "a CSV model predicts from columns given in another order"
# As training reads a table: a spreadsheet's byte order mark is no part of
# the first column's name, and a blank line inside the table is refused
# (skipped, it shifted every later line number).
printf '\xef\xbb\xbfy,x\n100,3\n0,0\n' >"$work/bom.csv"
classes=$(g predict "$work/csv/model.safetensors" "$work/bom.csv" --json |
  python3 -c 'import json,sys; print(" ".join(str(p["class"]) for p in json.load(sys.stdin)["predictions"]))')
[[ "$classes" == "1 0" ]] || fail "a CSV with a byte order mark predicted '$classes'"
printf 'y,x\n100,3\n\n0,0\n' >"$work/gap.csv"
set +e
out=$(g predict "$work/csv/model.safetensors" "$work/gap.csv" 2>&1)
set -e
[[ "$out" == *"gap.csv:3: empty line"* ]] || fail "a blank line inside a CSV: $out"
# A bad cell is named by its column; a column the model does not take (an
# id, the label) is not read.
printf 'id,y,x
row-a,100,3
row-b,0,0
' >"$work/ids.csv"
classes=$(g predict "$work/csv/model.safetensors" "$work/ids.csv" --json |
  python3 -c 'import json,sys; print(" ".join(str(p["class"]) for p in json.load(sys.stdin)["predictions"]))')
[[ "$classes" == "1 0" ]] || fail "a CSV with an id column predicted '$classes'"
printf 'y,x
100,abc
' >"$work/bad_cell.csv"
set +e
out=$(g predict "$work/csv/model.safetensors" "$work/bad_cell.csv" 2>&1)
set -e
[[ "$out" == *'bad_cell.csv:2: column "x": "abc" is not a finite number'* ]] || fail "a bad cell: $out"
ok "predict reads a CSV as training does: byte order mark, blank lines, cells named by column"

# Column names that are numbers (years) make a header of numbers: it is
# still the header, and the columns are found by name (it was read as a
# sample, and the rows' columns taken by position). A table trained
# without a header is read by its column numbers, laid out as it was or as
# the features alone; and a table split by another delimiter is named.
python3 - "$work" <<'PY'
import random, sys
out = sys.argv[1]
random.seed(3)
with open(out + "/years.csv", "w") as f, open(out + "/nohdr.csv", "w") as g, \
     open(out + "/semi.csv", "w") as h, open(out + "/nohdr_semi.csv", "w") as k:
    f.write("2001,label,2002\n")
    h.write("x;label;y\n")
    for i in range(400):
        c = i % 2
        x, y = c * 3 + random.gauss(0, 1), 100 * c + random.gauss(0, 30)
        f.write("%.4f,%d,%.4f\n" % (x, c, y))
        g.write("%.4f,%d,%.4f\n" % (x, c, y))
        h.write("%.4f;%d;%.4f\n" % (x, c, y))
        k.write("%.4f;%d;%.4f\n" % (x, c, y))
PY
python3 - "$work/csv.json" "$work" <<'PY'
import json, sys
spec = json.load(open(sys.argv[1]))
spec["data"]["csv"]["path"] = "years.csv"
json.dump(spec, open(sys.argv[2] + "/years.json", "w"))
spec["data"]["csv"] = {"path": "nohdr.csv", "header": False, "target": "1",
                       "standardize": True}
json.dump(spec, open(sys.argv[2] + "/nohdr.json", "w"))
spec["data"]["csv"] = {"path": "semi.csv", "delimiter": ";", "target": "label",
                       "standardize": True}
json.dump(spec, open(sys.argv[2] + "/semi.json", "w"))
spec["data"]["csv"] = {"path": "nohdr_semi.csv", "header": False,
                       "delimiter": ";", "target": "1", "standardize": True}
json.dump(spec, open(sys.argv[2] + "/nohdr_semi.json", "w"))
PY
for m in years nohdr semi nohdr_semi; do
  (cd "$work" && g train $m.json --out $m >$m.txt 2>&1) || fail "$m train: $(tail -n 3 "$work/$m.txt")"
done
classes_of() { g predict "$work/$1/model.safetensors" "$work/$2" --json |
  python3 -c 'import json,sys; print(" ".join(str(p["class"]) for p in json.load(sys.stdin)["predictions"]))'; }
printf '2002,2001\n100,3\n0,0\n' >"$work/ask_years.csv"
[[ "$(classes_of years ask_years.csv)" == "1 0" ]] ||
  fail "a header of numbers: predicted '$(classes_of years ask_years.csv)' for (2001=3, 2002=100) and (0, 0)"
out=$(g predict "$work/years/model.safetensors" "$work/ask_years.csv" 2>&1 >/dev/null)
[[ "$out" == *"the first row's numbers are the model's feature names: read as the header"* ]] ||
  fail "a header of numbers was taken without saying so: $out"
# Read as data when asked: three rows, three predictions.
n=$(g predict "$work/years/model.safetensors" "$work/ask_years.csv" --csv-header no --json |
  python3 -c 'import json,sys; print(len(json.load(sys.stdin)["predictions"]))')
[[ "$n" == 3 ]] || fail "--csv-header no gave $n predictions for 3 rows"
printf '3,7,100\n0,7,0\n' >"$work/ask_table.csv"
printf '3,100\n0,0\n' >"$work/ask_features.csv"
[[ "$(classes_of nohdr ask_table.csv)" == "1 0" ]] || fail "rows laid out as the header-less training table"
[[ "$(classes_of nohdr ask_features.csv)" == "1 0" ]] || fail "the features of a header-less model alone"
set +e
out=$(g predict "$work/nohdr/model.safetensors" "$work/ask.csv" 2>&1)
set -e
[[ "$out" == *"trained on a table without a header (its features are columns 0, 2"* ]] ||
  fail "a header for a header-less model: $out"
set +e
out=$(g predict "$work/semi/model.safetensors" "$work/ask.csv" 2>&1)
set -e
[[ "$out" == *"no column"*"separated by ';'"* ]] || fail "a table split by another delimiter: $out"
# The same for a model trained on a header-less table: a row of the right
# numbers split by commas names the delimiter too.
set +e
out=$(g predict "$work/nohdr_semi/model.safetensors" "$work/ask_features.csv" 2>&1)
set -e
[[ "$out" == *"trained on a table without a header"*"separated by ';'"* ]] ||
  fail "a comma row for a header-less ';' model: $out"
ok "predict: a header of numbers, a table trained without a header, another delimiter named"

set +e
out=$(g predict "$work/csv/model.safetensors" "$work/img0.pgm" 2>&1)
set -e
[[ "$out" == *"a 28 x 28 image is not the model's input of 2 values"* ]] || fail "wrong-size input: $out"
# A model normalized for inputs far from 0-1 (the table's y, around 50)
# would read pixels / 255 as near-black: predict says so.
printf 'P5\n2 1\n255\n\x00\xff' >"$work/two.pgm"
out=$(g predict "$work/csv/model.safetensors" "$work/two.pgm" 2>&1)
[[ "$out" == *"warning: "*"two.pgm is read as pixel values / 255, but the model's normalization has a mean of"* ]] ||
  fail "no warning for an image given to a model of another scale: $out"
set +e
out=$(g eval "$work/mlp.json" 2>&1)
set -e
[[ "$out" == *"not a safetensors model file: "*"mlp.json"* ]] || fail "eval of a JSON file: $out"
# The same model, its metadata saying a format version from the future.
python3 - "$work/mlp/model.safetensors" "$work/future.safetensors" <<'PY'
import json, struct, sys
data = open(sys.argv[1], "rb").read()
(n,) = struct.unpack("<Q", data[:8])
header = json.loads(data[8:8 + n])
header["__metadata__"]["gpipe.format_version"] = "2"
text = json.dumps(header).encode()
text += b" " * ((8 - len(text) % 8) % 8)
open(sys.argv[2], "wb").write(struct.pack("<Q", len(text)) + text + data[8 + n:])
PY
set +e
out=$(g predict "$work/future.safetensors" "$work/img0.pgm" 2>&1)
set -e
[[ "$out" == *"model format version 2 is newer than this gpipe reads (1)"* ]] || fail "a future format: $out"
# Weights that do not fit the model their file records: named in eval's
# words (it told the user of an init_from they never wrote, and to set its
# strict false).
python3 - "$work/mlp/model.safetensors" "$work/wider.safetensors" <<'PY'
import json, struct, sys
data = open(sys.argv[1], "rb").read()
(n,) = struct.unpack("<Q", data[:8])
header = json.loads(data[8:8 + n])
job = json.loads(header["__metadata__"]["gpipe.job"])
job["model"]["layers"][0]["linear"]["outFeatures"] = 65
job["model"]["layers"][2]["linear"]["inFeatures"] = 65
header["__metadata__"]["gpipe.job"] = json.dumps(job)
text = json.dumps(header).encode()
text += b" " * ((8 - len(text) % 8) % 8)
open(sys.argv[2], "wb").write(struct.pack("<Q", len(text)) + text + data[8 + n:])
PY
set +e
out=$(g eval "$work/wider.safetensors" --max-samples 10 2>&1)
set -e
[[ "$out" == "gpipectl eval: $work/wider.safetensors: "*"do not fit the model"* ]] || fail "weights of another shape: $out"
[[ "$out" != *"init_from"* ]] || fail "eval speaks of an init_from: $out"
ok "inputs and files that do not fit are refused naming why"
# A character model of a repeated sentence, with its vocabulary (0: from the
# file) recorded in the model file: it continues the sentence, the same
# seed samples the same text, a byte it never saw is refused.
python3 -c "open('$work/cat.txt', 'w').write('the cat sat on the mat. ' * 400)"
cat >"$work/cat.json" <<'JSON'
{
  "model": {
    "input": {"dtype": "INT32", "shape": {"dims": [16]}},
    "layers": [
      {"embedding": {"vocabSize": 0, "dim": 32, "maxPositions": 16}},
      {"transformerBlock": {"dim": 32, "heads": 2}},
      {"layerNorm": {"features": 32}},
      {"linear": {"inFeatures": 32, "outFeatures": 0}}
    ],
    "loss": {"softmaxCrossEntropy": {}}
  },
  "optimizer": {"lr": 0.01, "adamw": {}},
  "data": {"text": {"path": "cat.txt", "seqLen": 16}},
  "pipeline": {"stages": 2, "balance": [1, 3]},
  "batchSize": 32,
  "steps": 150,
  "seed": 1
}
JSON
(cd "$work" && g train cat.json --threads 2 --out cat >cat.txt.log 2>&1) ||
  fail "the char model did not train: $(tail -n 3 "$work/cat.txt.log")"
rm "$work/cat.txt"  # the vocabulary must come from the model file
out=$(g generate "$work/cat/model.safetensors" --prompt "the cat " --tokens 40 --temperature 0)
[[ "$out" == "the cat sat on the mat. the cat sat on the mat. " ]] ||
  fail "greedy generation: '$out'"
a=$(g generate "$work/cat/model.safetensors" --prompt "on " --tokens 30 --seed 5 --top_k 3)
b=$(g generate "$work/cat/model.safetensors" --prompt "on " --tokens 30 --seed 5 --top_k 3)
[[ "$a" == "$b" && ${#a} -eq 33 ]] || fail "seed 5 sampled '$a', then '$b'"
# Served as 3 stages (the file records a balance for 2: not used for 3),
# and on the (fake) GPU as 2: the same text.
c=$(g generate "$work/cat/model.safetensors" --prompt "on " --tokens 30 --seed 5 --top_k 3 --stages 3)
[[ "$c" == "$a" ]] || fail "--stages 3 sampled '$c', one piece '$a'"
c=$(GPIPE_FAKE_DEVICE=1 g generate "$work/cat/model.safetensors" --prompt "on " --tokens 30 --seed 5 --top_k 3 --stages 2 --device cuda)
[[ "$c" == "$a" ]] || fail "--device cuda --stages 2 (fake GPU) sampled '$c', the CPU '$a'"
set +e
out=$(g generate "$work/cat/model.safetensors" --prompt "The" 2>&1)
set -e
[[ "$out" == *"byte 84 ('T') at offset 0 is not in the model's vocabulary of 11 bytes"* ]] ||
  fail "an unknown byte: $out"
# Their 0 is no default: the messages say what it is.
set +e
out=$(g generate "$work/cat/model.safetensors" --prompt "the" --tokens -5 2>&1)
out2=$(g generate "$work/cat/model.safetensors" --prompt "the" --top-k -1 2>&1)
set -e
[[ "$out" == *"--tokens: must be >= 0, got -5"* ]] || fail "--tokens -5: $out"
[[ "$out2" == *"--top-k: must be >= 0 (0: all tokens), got -1"* ]] || fail "--top-k -1: $out2"
set +e
out=$(g generate "$work/mlp/model.safetensors" --prompt "1 2" 2>&1)
set -e
[[ "$out" == *"generation needs a language model"* ]] || fail "generate on a classifier: $out"
ok "generate: a char model continues its sentence past its 16 positions; seeds repeat, in 3 stages and on the fake GPU too"

# A token-id model: the prompt's ids are checked against its vocabulary
# before anything is printed (one past it was echoed, then refused, and an
# id past int32 was "not a token id"), and echoed space-separated.
python3 -c "
import array
array.array('H', [(i * 7) % 13 for i in range(4000)]).tofile(open('$work/ids.bin', 'wb'))"
cat >"$work/ids.json" <<'JSON'
{
  "model": {
    "input": {"dtype": "INT32", "shape": {"dims": [8]}},
    "layers": [
      {"embedding": {"vocabSize": 13, "dim": 16, "maxPositions": 8}},
      {"transformerBlock": {"dim": 16, "heads": 2}},
      {"linear": {"inFeatures": 16, "outFeatures": 13}}
    ],
    "loss": {"softmaxCrossEntropy": {}}
  },
  "optimizer": {"lr": 0.01, "adamw": {}},
  "data": {"tokens": {"path": "ids.bin", "seqLen": 8}},
  "batchSize": 8,
  "steps": 5
}
JSON
(cd "$work" && g train ids.json --threads 1 --out ids >ids.log 2>&1) ||
  fail "the token model did not train: $(tail -n 3 "$work/ids.log")"
for prompt in "5 13" "5 99999999999" "-1"; do
  set +e
  out=$(g generate "$work/ids/model.safetensors" --prompt "$prompt" --tokens 2 2>/dev/null)
  err=$(g generate "$work/ids/model.safetensors" --prompt "$prompt" --tokens 2 2>&1 >/dev/null)
  set -e
  [[ -z "$out" ]] || fail "generate printed \"$out\" for a prompt it refused ($prompt)"
  [[ "$err" == *"is not one of the model's 13 ids (0 to 12)"* ]] || fail "prompt $prompt: $err"
done
out=$(g generate "$work/ids/model.safetensors" --prompt "5,12,3" --tokens 2)
[[ "$out" =~ ^"5 12 3 "[0-9]+" "[0-9]+$ ]] || fail "a comma-separated prompt echoed as: $out"
ok "generate on token ids: ids past the vocabulary refused before any output, echoed space-separated"

# eval on another job's text reads it with the model's ids: words of the
# sentence in another order score 1.46 (numbered afresh, its bytes were read
# as other tokens: 7.93), and a byte the model never saw is refused.
python3 -c "open('$work/mat.txt', 'w').write('on the mat. ' * 300); open('$work/caps.txt', 'w').write('ON THE MAT. ' * 300)"
sed 's/"cat.txt"/"mat.txt"/' "$work/cat.json" >"$work/mat.json"
sed 's/"cat.txt"/"caps.txt"/' "$work/cat.json" >"$work/caps.json"
loss=$(cd "$work" && g eval cat mat.json --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["loss"])')
python3 -c "import sys; sys.exit(0 if $loss < 3.0 else 1)" ||
  fail "eval on a part of the training text: loss $loss (its bytes numbered afresh?)"
set +e
out=$(cd "$work" && g eval cat caps.json 2>&1)
set -e
[[ "$out" == *"caps.txt: byte 79 ('O') at offset 0 is not in the vocabulary of"* ]] || fail "eval on bytes the model never saw: $out"
ok "eval on another job's text uses the model's vocabulary (loss $loss); unseen bytes are refused"

# A job that starts from the model file reads its text with the model's
# vocabulary too (numbered afresh, the ids shifted under the trained
# embedding: a first loss of 7.4 for a model at 0.6), and a byte the model
# never saw is refused.
for m in mat caps; do
  python3 - "$work/$m.json" "$work/cat/model.safetensors" "$work/ft_$m.json" <<'PY'
import json, sys
spec = json.load(open(sys.argv[1]))
spec["initFrom"] = {"path": sys.argv[2]}
spec["optimizer"]["lr"] = 1e-9
json.dump(spec, open(sys.argv[3], "w"))
PY
done
(cd "$work" && g train ft_mat.json --steps 1 >ft_mat.log 2>&1) ||
  fail "fine-tuning on part of the training text: $(tail -n 3 "$work/ft_mat.log")"
first=$(grep -o 'loss [0-9.]*' "$work/ft_mat.log" | head -n 1 | cut -d' ' -f2)
python3 -c "import sys; sys.exit(0 if 0 < $first < 3.0 else 1)" ||
  fail "fine-tuning from the model file: first loss $first (its bytes numbered afresh?)"
set +e
out=$(cd "$work" && g train ft_caps.json --steps 1 2>&1)
set -e
[[ "$out" == *"caps.txt: byte 79 ('O') at offset 0 is not in the vocabulary of"* ]] ||
  fail "fine-tuning on bytes the model never saw: $out"
# So is a table: its feature columns are the model's. The same columns in
# another order are found by name (the first loss is the original
# order's); one of other columns is refused (its weights would meet the
# wrong features, silently).
python3 - "$work" <<'PY'
import csv, json, sys
w = sys.argv[1]
rows = list(csv.reader(open(w + "/t.csv")))
with open(w + "/swapped.csv", "w") as f:
    csv.writer(f).writerows([[r[2], r[1], r[0]] for r in rows])
renamed = [list(r) for r in rows]
renamed[0][0] = "z"
with open(w + "/renamed.csv", "w") as f:
    csv.writer(f).writerows(renamed)
spec = json.load(open(w + "/csv.json"))
spec["initFrom"] = {"path": w + "/csv/model.safetensors"}
for name in ("t", "swapped", "renamed"):
    spec["data"]["csv"]["path"] = name + ".csv"
    json.dump(spec, open(w + "/ft_" + name + ".json", "w"))
PY
loss_of() { grep -o 'loss [0-9.]*' "$1" | head -n 1; }
(cd "$work" && g train ft_t.json --steps 1 >ft_t.log 2>&1) ||
  fail "fine-tuning on the table: $(tail -n 3 "$work/ft_t.log")"
(cd "$work" && g train ft_swapped.json --steps 1 >ft_swapped.log 2>&1) ||
  fail "fine-tuning on the table's columns in another order: $(tail -n 3 "$work/ft_swapped.log")"
[[ -n "$(loss_of "$work/ft_t.log")" && "$(loss_of "$work/ft_t.log")" == "$(loss_of "$work/ft_swapped.log")" ]] ||
  fail "reordered columns: $(loss_of "$work/ft_swapped.log"), the table's $(loss_of "$work/ft_t.log")"
set +e
out=$(cd "$work" && g train ft_renamed.json --steps 1 2>&1)
set -e
[[ "$out" == *"feature columns (z, y) are not those recorded"* ]] ||
  fail "fine-tuning on a table of other columns: $out"
# A model trained on in place names itself as its init_from: reading it
# (eval, predict, another run from it) reads that once, never recursing
# (the stack overflowed: gpipectl and the controller crashed).
# Raw features, so the spec records no normalization to stop the lookup.
python3 - "$work" <<'PY'
import json, sys
w = sys.argv[1]
spec = json.load(open(w + "/csv.json"))
spec["data"]["csv"]["standardize"] = False
json.dump(spec, open(w + "/raw.json", "w"))
spec["initFrom"] = {"path": w + "/inplace"}
json.dump(spec, open(w + "/inplace.json", "w"))
PY
(cd "$work" && g train raw.json --steps 2 --out inplace >inplace.log 2>&1) ||
  fail "training on raw features: $(tail -n 3 "$work/inplace.log")"
(cd "$work" && g train inplace.json --steps 2 --out inplace >inplace.log 2>&1) ||
  fail "training a model in place: $(tail -n 3 "$work/inplace.log")"
(cd "$work" && g train inplace.json --steps 2 >inplace.log 2>&1) ||
  fail "a run from a model trained in place: $(tail -n 3 "$work/inplace.log")"
g eval "$work/inplace" >"$work/inplace.log" 2>&1 || fail "eval of a model trained in place: $(tail -n 3 "$work/inplace.log")"
g predict "$work/inplace" "$work/ask.csv" >"$work/inplace.log" 2>&1 ||
  fail "predict with a model trained in place: $(tail -n 3 "$work/inplace.log")"
ok "init_from a model file reads the text with its vocabulary (first loss $first) and the table with its columns; a model trained in place reads"
echo "$passed passed, 0 failed"
