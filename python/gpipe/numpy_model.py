"""A model file evaluated with numpy alone.

NumpyModel rebuilds the layers a model file describes (its tensors plus the
job spec in its metadata, docs/model-format.md) and computes the evaluation
forward pass in float32, independently of the C++ product: a reference to
check the product's figures against, and a way to use a trained model where
nothing but numpy is installed.
"""

import json
import math

import numpy as np

from gpipe import job_spec as js
from gpipe import numpy_layers as nl
from gpipe.safetensors_io import load_safetensors

# The model format version this reader understands (gpipe.format_version).
FORMAT_VERSION = 1

# Optimizer state that checkpoint files hold next to the weights.
_OPTIMIZER_SUFFIXES = (".momentum", ".exp_avg", ".exp_avg_sq")


def expected_tensors(kind, p, in_shape, what):
    """{name: shape} of the tensors a layer holds, per docs/model-format.md."""
    if kind == "linear":
        n_in = js.int_field(p, "in_features", what)
        n_out = js.int_field(p, "out_features", what)
        out = {"weight": (n_out, n_in)}
        if js.bool_field(p, "bias", True):
            out["bias"] = (n_out,)
        return out
    if kind == "conv2d":
        c_in = js.int_field(p, "in_channels", what)
        c_out = js.int_field(p, "out_channels", what)
        k = js.int_field(p, "kernel_size", what)
        out = {"weight": (c_out, c_in, k, k)}
        if js.bool_field(p, "bias", True):
            out["bias"] = (c_out,)
        return out
    if kind == "batch_norm":
        c = (js.int_field(p, "features", what),)
        return {"weight": c, "bias": c, "running_mean": c, "running_var": c}
    if kind == "layer_norm":
        f = (js.int_field(p, "features", what),)
        return {"weight": f, "bias": f}
    if kind == "embedding":
        dim = js.int_field(p, "dim", what)
        return {
            "token_weight": (js.int_field(p, "vocab_size", what), dim),
            "position_weight": (js.int_field(p, "max_positions", what), dim),
        }
    if kind == "self_attention":
        return _attention_tensors(js.int_field(p, "dim", what), "")
    if kind == "transformer_block":
        dim = js.int_field(p, "dim", what)
        hidden = js.int_field(p, "mlp_hidden", what) or 4 * dim
        out = _attention_tensors(dim, "attn.")
        for ln in ("ln1", "ln2"):
            out[f"{ln}.weight"] = (dim,)
            out[f"{ln}.bias"] = (dim,)
        out.update({
            "mlp.fc1.weight": (hidden, dim), "mlp.fc1.bias": (hidden,),
            "mlp.fc2.weight": (dim, hidden), "mlp.fc2.bias": (dim,),
        })
        return out
    return {}


def _attention_tensors(dim, prefix):
    return {
        f"{prefix}qkv.weight": (3 * dim, dim), f"{prefix}qkv.bias": (3 * dim,),
        f"{prefix}proj.weight": (dim, dim), f"{prefix}proj.bias": (dim,),
    }


class Layer:
    """One layer: its kind, its spec fields, its tensors (names without the
    `layers.<i>.` prefix) and the shapes of one sample in and out."""

    def __init__(self, index, kind, params, tensors, in_shape, out_shape):
        self.index = index
        self.kind = kind
        self.params = params
        self.tensors = tensors
        self.in_shape = in_shape
        self.out_shape = out_shape
        self._what = f"model.layers[{index}].{js.camel(kind)}"

    def __repr__(self):
        return (f"Layer({self.index}, {self.kind}, in={list(self.in_shape)}, "
                f"out={list(self.out_shape)})")

    def _int(self, name, default=0):
        return js.int_field(self.params, name, self._what, default)

    def _eps(self):
        return js.float32_field(self.params, "eps", self._what, 1e-5)

    def forward(self, x):
        """This layer's evaluation output for a batch `x`."""
        t = self.tensors
        k = self.kind
        if k == "linear":
            return nl.linear(x, t["weight"], t.get("bias"))
        if k == "relu":
            return nl.relu(x)
        if k == "gelu":
            return nl.gelu(x)
        if k == "tanh":
            return nl.tanh(x)
        if k == "dropout":
            return x  # identity in evaluation
        if k == "layer_norm":
            return nl.layer_norm(x, t["weight"], t["bias"], self._eps())
        if k == "batch_norm":
            return nl.batch_norm_eval(x, t["weight"], t["bias"],
                                      t["running_mean"], t["running_var"],
                                      self._eps())
        if k == "conv2d":
            return nl.conv2d(x, t["weight"], t.get("bias"),
                             self._int("stride", 1), self._int("padding"))
        if k == "max_pool2d":
            kernel = self._int("kernel_size")
            return nl.max_pool2d(x, kernel, self._int("stride", kernel))
        if k == "global_avg_pool":
            return nl.global_avg_pool(x)
        if k == "flatten":
            return nl.flatten(x)
        if k == "embedding":
            try:
                return nl.embedding(x, t["token_weight"], t["position_weight"])
            except ValueError as e:
                raise ValueError(f"{self._what}: {e}") from None
        if k == "self_attention":
            return self._attention(x, "")
        if k == "transformer_block":
            return self._block(x)
        raise ValueError(f"{self._what}: no forward for layer kind {k!r}")

    def _causal(self):
        return js.bool_field(self.params, "causal", True)

    def _attention(self, x, prefix):
        t = self.tensors
        return nl.self_attention(
            x, t[prefix + "qkv.weight"], t[prefix + "qkv.bias"],
            t[prefix + "proj.weight"], t[prefix + "proj.bias"],
            self._int("heads"), self._causal())

    def _block(self, x):
        """Pre-LN: x1 = x + attn(ln1(x)); y = x1 + fc2(gelu(fc1(ln2(x1)))).
        The block's norms use eps 1e-5 whatever the spec says elsewhere."""
        t = self.tensors
        eps = np.float32(1e-5)
        x1 = x + self._attention(
            nl.layer_norm(x, t["ln1.weight"], t["ln1.bias"], eps), "attn.")
        h = nl.linear(nl.layer_norm(x1, t["ln2.weight"], t["ln2.bias"], eps),
                      t["mlp.fc1.weight"], t["mlp.fc1.bias"])
        return x1 + nl.linear(nl.gelu(h), t["mlp.fc2.weight"],
                              t["mlp.fc2.bias"])


def _normalize_from(metadata, spec):
    """(mean, std) float32 arrays of the input normalization, or None: the
    model file's gpipe.preprocessing, else the spec's data.normalize."""
    text = metadata.get("gpipe.preprocessing")
    if text:
        try:
            norm = json.loads(text).get("normalize")
        except (ValueError, AttributeError):
            raise ValueError(f"gpipe.preprocessing is not a JSON object: "
                             f"{text[:200]!r}") from None
    else:
        norm = js.field(js.field(spec, "data"), "normalize")
    if not norm:
        return None
    mean = np.asarray(js.field(norm, "mean", []), dtype=np.float32)
    std = np.asarray(js.field(norm, "std", []), dtype=np.float32)
    if mean.ndim != 1 or mean.size == 0 or mean.shape != std.shape:
        raise ValueError(f"normalize: mean has {mean.size} values and std "
                         f"{std.size}; want one pair per group")
    if not np.all(std > 0):
        raise ValueError("normalize: every std must be positive")
    return mean, std


class NumpyModel:
    """A trained model as numpy arrays and its evaluation forward pass.

    `spec` is the job spec dict (protobuf JSON), `tensors` the model file's
    tensors (`layers.<i>.<name>`), `metadata` its safetensors metadata.
    """

    def __init__(self, spec, tensors, metadata=None, path="model"):
        self.path = path
        self.spec = spec
        self.metadata = dict(metadata or {})
        self.tensors = tensors
        self.input_dtype, self.input_shape = js.input_header(spec, path)
        self.normalize = _normalize_from(self.metadata, spec)
        self.layers = []
        used = set()
        problems = []
        for i, (kind, params, in_shape, out_shape) in enumerate(
                js.model_shapes(spec, path)):
            what = f"{path}: model.layers[{i}].{js.camel(kind)}"
            mine = {}
            for name, shape in expected_tensors(kind, params, in_shape,
                                                what).items():
                full = f"layers.{i}.{name}"
                if full not in tensors:
                    problems.append(f"missing tensor {full} {list(shape)}")
                    continue
                array = tensors[full]
                if tuple(array.shape) != tuple(shape):
                    problems.append(f"tensor {full} is {list(array.shape)}, "
                                    f"the spec wants {list(shape)}")
                elif array.dtype != np.float32:
                    problems.append(f"tensor {full} is {array.dtype}, not "
                                    "float32")
                mine[name] = array
                used.add(full)
            self.layers.append(Layer(i, kind, params, mine, in_shape,
                                     out_shape))
        extra = sorted(n for n in tensors if n not in used
                       and not n.endswith(_OPTIMIZER_SUFFIXES))
        if extra:
            problems.append("tensors no layer holds: " + ", ".join(extra[:10])
                            + (" ..." if len(extra) > 10 else ""))
        if problems:
            raise ValueError(f"{path}: " + "; ".join(problems))

    @classmethod
    def load(cls, path):
        """Reads a model file (`gpipectl train --out`'s model.safetensors)."""
        tensors, metadata = load_safetensors(path)
        version = metadata.get("gpipe.format_version")
        if version is not None:
            try:
                v = int(version)
            except ValueError:
                v = 0
            if v < 1:
                raise ValueError(f"{path}: gpipe.format_version is "
                                 f"{version!r}")
            if v > FORMAT_VERSION:
                raise ValueError(f"{path}: model format version {v} is newer "
                                 f"than this reader ({FORMAT_VERSION})")
        if "gpipe.job" not in metadata:
            raise ValueError(f"{path}: no gpipe.job in its metadata: not a "
                             "model file gpipe wrote")
        spec = js.parse_job(metadata["gpipe.job"], f"{path}: gpipe.job")
        return cls(spec, tensors, metadata, path)

    @property
    def vocabulary(self):
        """A text model's byte for each token id, or None. The file records
        it twice (gpipe.job and gpipe.vocabulary); two records that
        disagree are refused, as gpipectl refuses them, rather than mapping
        text to ids one way here and another there."""
        recorded = js.bytes_field(
            js.field(js.field(self.spec, "data"), "text"), "vocabulary",
            "data.text")
        text = self.metadata.get("gpipe.vocabulary")
        if text:
            # As gpipectl reads it: distinct bytes 0-255 in ascending order.
            entries = json.loads(text)
            if (not isinstance(entries, list) or
                    any(not isinstance(b, int) or isinstance(b, bool) or
                        not 0 <= b <= 255 for b in entries) or
                    any(b <= a for a, b in zip(entries, entries[1:]))):
                raise ValueError(
                    f"{self.path}: gpipe.vocabulary: {text!r} is not a list "
                    "of distinct bytes 0-255 in ascending order")
            listed = bytes(entries)
            if not listed:
                return recorded or None
            if recorded and recorded != listed:
                raise ValueError(
                    f"{self.path}: gpipe.vocabulary ({len(listed)} bytes) "
                    f"and gpipe.job's data.text.vocabulary ({len(recorded)} "
                    "bytes) disagree: the metadata was edited")
            return listed
        return recorded or None

    def preprocess(self, x):
        """The inputs the first layer sees: `x` ([B, ...] raw samples, e.g.
        pixels / 255) normalized as the job did, (x - mean[g]) / std[g] in
        float32. The group g is the whole sample (one pair), the entry of
        the sample's first dimension, or each element (docs/data.md)."""
        if self.normalize is None:
            return x
        x = np.asarray(x, dtype=np.float32)
        return normalize(x, *self.normalize, sample_shape=self.input_shape)

    def _check_input(self, x):
        x = np.asarray(x)
        shape = tuple(self.input_shape)
        if x.ndim < 1:
            raise ValueError(f"{self.path}: input must have a batch "
                             "dimension")
        if tuple(x.shape[1:]) != shape:
            # [B, 784] pixels for a [1, 28, 28] model: the same elements.
            if math.prod(x.shape[1:]) != math.prod(shape):
                raise ValueError(f"{self.path}: input {list(x.shape)} does "
                                 f"not hold samples of {list(shape)}")
            x = x.reshape((x.shape[0],) + shape)
        if self.input_dtype == "INT32":
            if not np.issubdtype(x.dtype, np.integer):
                raise ValueError(f"{self.path}: the model takes integer token "
                                 f"ids, got {x.dtype}")
            return x.astype(np.int64)
        return np.ascontiguousarray(x, dtype=np.float32)

    def forward(self, x, upto=None):
        """The evaluation outputs (logits) for a batch of preprocessed
        inputs `x` of [B, *input shape] (float32, or integer ids for a text
        model); `upto` stops after that many layers."""
        x = self._check_input(x)
        for layer in self.layers[:upto]:
            x = layer.forward(x)
        return x

    __call__ = forward

    @staticmethod
    def loss_and_accuracy(logits, targets):
        """(mean loss, accuracy) as the C++ softmax cross-entropy computes
        them; see loss_and_accuracy()."""
        return loss_and_accuracy(logits, targets)


def normalize(x, mean, std, sample_shape=None):
    """(x - mean[g]) / std[g] over [B, ...] samples in float32, the groups
    being contiguous equal runs of each sample (services/data/normalize.cc)."""
    x = np.asarray(x, dtype=np.float32)
    mean = np.asarray(mean, dtype=np.float32).reshape(-1)
    std = np.asarray(std, dtype=np.float32).reshape(-1)
    groups = mean.size
    shape = tuple(sample_shape) if sample_shape is not None else x.shape[1:]
    numel = math.prod(shape)
    first = shape[0] if shape else 1
    if groups not in (1, first, numel) or std.size != groups:
        raise ValueError(
            f"normalize: {groups} means and {std.size} stds; a sample of "
            f"{list(shape)} takes 1 (the whole sample), {first} (its first "
            f"dimension) or {numel} (each element)")
    flat = x.reshape(x.shape[0], groups, -1)
    out = (flat - mean[:, None]) / std[:, None]
    return out.reshape(x.shape)


def cross_entropy_totals(logits, targets):
    """(loss sum, correct, counted) of softmax cross-entropy over the rows
    of `logits` ([B, C] or [B, T, V]: each position a row), computed in
    float64. Targets of -1 are ignored; any other id outside the classes is
    an error, as in services/tensor/cpu/softmax.cc. A prediction is correct
    when the first maximal logit is the target's."""
    logits = np.asarray(logits)
    classes = logits.shape[-1]
    z = logits.reshape(-1, classes).astype(np.float64)
    t = np.asarray(targets).reshape(-1).astype(np.int64)
    if t.size != z.shape[0]:
        raise ValueError(f"{t.size} targets for {z.shape[0]} rows of logits "
                         f"{list(logits.shape)}")
    bad = (t != -1) & ((t < 0) | (t >= classes))
    if bad.any():
        raise ValueError(f"{int(bad.sum())} target(s) are outside the "
                         f"{classes} classes (the first: {int(t[bad][0])})")
    keep = t >= 0
    z, t = z[keep], t[keep]
    if t.size == 0:
        return 0.0, 0, 0
    m = z.max(axis=1)
    log_sum = np.log(np.exp(z - m[:, None]).sum(axis=1))
    rows = np.arange(t.size)
    loss = log_sum - (z[rows, t] - m)
    correct = int((z.argmax(axis=1) == t).sum())
    return float(loss.sum()), correct, int(t.size)


def loss_and_accuracy(logits, targets):
    """(mean loss, accuracy) over the counted targets (0.0, 0.0 when none
    counts): what `gpipectl eval` reports for the same logits."""
    loss_sum, correct, counted = cross_entropy_totals(logits, targets)
    if counted == 0:
        return 0.0, 0.0
    return loss_sum / counted, correct / counted
