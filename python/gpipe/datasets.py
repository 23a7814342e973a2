"""The test splits the C++ product evaluates on, rebuilt in Python.

Just enough of services/data to compare a NumpyModel's figures with
`gpipectl eval`'s: the same samples, in the same order, with the same
float32 values. Evaluation takes the first `max_samples` of the split
(services/pipeline/reference_trainer.cc Evaluate), so max_samples > 0 here
cuts the split the same way.
"""

import gzip
import math
import os
import struct

import numpy as np

from gpipe import job_spec as js

FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"
# data.text.test_fraction's default when the spec leaves it 0
# (kDefaultTestFraction).
DEFAULT_TEST_FRACTION = 0.1


def _read_idx(path, rank):
    """The values and dims of a gzipped IDX file of unsigned bytes."""
    try:
        with gzip.open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise ValueError(f"{path}: cannot read: {e}") from None
    if len(data) < 4 + 4 * rank:
        raise ValueError(f"{path}: too short for an IDX header")
    zero, dtype, ndim = struct.unpack(">HBB", data[:4])
    if zero != 0 or dtype != 0x08 or ndim != rank:
        raise ValueError(f"{path}: not an IDX file of unsigned bytes with "
                         f"{rank} dimension(s) (magic {data[:4].hex()})")
    dims = struct.unpack(f">{rank}I", data[4:4 + 4 * rank])
    values = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * rank)
    if values.size != math.prod(dims):
        raise ValueError(f"{path}: holds {values.size} values, its header "
                         f"says {list(dims)}")
    return values.reshape(dims), dims


def fashion_mnist_test(dir=FASHION_MNIST_DIR, max_samples=0):
    """The 10000 Fashion-MNIST test images (t10k-*) as x float32 [N, 784]
    = byte / 255 (a float32 division, as the product scales them) and labels
    y int64 [N]; the first `max_samples` when it is positive."""
    images, dims = _read_idx(os.path.join(dir, "t10k-images-idx3-ubyte.gz"), 3)
    labels, _ = _read_idx(os.path.join(dir, "t10k-labels-idx1-ubyte.gz"), 1)
    if dims[1:] != (28, 28):
        raise ValueError(f"{dir}: images are {dims[1]}x{dims[2]}, want 28x28")
    if labels.shape[0] != images.shape[0]:
        raise ValueError(f"{dir}: {labels.shape[0]} labels for "
                         f"{images.shape[0]} images")
    n = images.shape[0] if max_samples <= 0 else min(max_samples,
                                                     images.shape[0])
    x = images[:n].reshape(n, 784).astype(np.float32) / np.float32(255)
    return x, labels[:n].astype(np.int64)


def text_test(path, seq_len, test_fraction=DEFAULT_TEST_FRACTION,
              vocabulary=b"", max_samples=0):
    """The test windows of a text file, as services/data/text.cc cuts them.

    The last floor(n * test_fraction) bytes are the test split; window i is
    its ids [i*T, i*T + T) and the targets are the ids one later, so the
    split holds (bytes - 1) // T windows. `test_fraction` is rounded to
    float32 first (the proto field is a float the C++ widens to double);
    0 means 0.1. `vocabulary` is the byte of each token id (ascending); empty:
    the distinct bytes of the file. Returns (ids, targets), int32 [N, T].
    """
    if seq_len <= 0:
        raise ValueError(f"{path}: seq_len must be positive, got {seq_len}")
    fraction = float(np.float32(test_fraction))
    if fraction == 0:
        fraction = DEFAULT_TEST_FRACTION
    if not 0 < fraction < 1:
        raise ValueError(f"{path}: test_fraction must be in (0, 1), got "
                         f"{test_fraction}")
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise ValueError(f"{path}: cannot read: {e}") from None
    n = len(data)
    if n == 0:
        raise ValueError(f"{path}: file is empty")
    test_bytes = math.floor(n * fraction)
    train_bytes = n - test_bytes
    for name, have in (("train", train_bytes), ("test", test_bytes)):
        if have < seq_len + 1:
            raise ValueError(f"{path}: the {name} split has {have} bytes, "
                             f"fewer than seq_len + 1 = {seq_len + 1}")

    raw = np.frombuffer(data, dtype=np.uint8)
    if vocabulary:
        vocab = np.frombuffer(bytes(vocabulary), dtype=np.uint8)
        if vocab.size > 1 and not np.all(vocab[1:] > vocab[:-1]):
            raise ValueError(f"{path}: the vocabulary must hold distinct "
                             "bytes in ascending order")
    else:
        vocab = np.unique(raw)
    token_of = np.full(256, -1, dtype=np.int32)
    token_of[vocab] = np.arange(vocab.size, dtype=np.int32)
    ids = token_of[raw]
    if (ids < 0).any():
        at = int(np.argmax(ids < 0))
        raise ValueError(f"{path}: byte {raw[at]} at offset {at} is not in "
                         f"the vocabulary ({vocab.size} bytes)")

    split = ids[train_bytes:]
    windows = (split.size - 1) // seq_len
    if max_samples > 0:
        windows = min(windows, max_samples)
    span = windows * seq_len
    x = split[:span].reshape(windows, seq_len)
    y = split[1:span + 1].reshape(windows, seq_len)
    return x.astype(np.int32), y.astype(np.int32)


def test_split(spec, max_samples=0):
    """(inputs, targets) of the test split of a job spec's data, before
    data.normalize (NumpyModel.preprocess applies it): Fashion-MNIST or a
    text file. Other sources raise ValueError."""
    data = js.field(spec, "data") or {}
    if js.has_field(data, "fashion_mnist"):
        dir = js.field(js.field(data, "fashion_mnist"), "dir") or \
            FASHION_MNIST_DIR
        return fashion_mnist_test(dir, max_samples)
    if js.has_field(data, "text"):
        text = js.field(data, "text")
        return text_test(
            js.field(text, "path", ""),
            js.int_field(text, "seq_len", "data.text"),
            js.float32_field(text, "test_fraction", "data.text"),
            js.bytes_field(text, "vocabulary", "data.text"),
            max_samples)
    sources = [k for k in data if k != "normalize"]
    raise ValueError(f"data: source {sources[0] if sources else 'none'!r} "
                     "is not rebuilt in Python (fashionMnist and text are)")
