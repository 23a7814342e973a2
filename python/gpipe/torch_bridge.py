"""Model files to and from PyTorch.

to_torch() turns a model file into an nn.Sequential whose module i is the
spec's layer i, so the file's `layers.<i>.<name>` tensors load as the state
dict keys `<i>.<name>`. Standard modules are used where PyTorch has the same
arithmetic (Linear, Conv2d, BatchNorm, LayerNorm, ...); the embedding, the
attention, the Transformer block and the global average pool are small
modules here that hold their tensors under the names of
docs/model-format.md. from_torch() goes the other way: the job spec's
"model" for such a Sequential plus an initFrom file of its weights.

torch is imported when first needed, so the rest of the package works
without it.
"""

import math
import types

import numpy as np

from gpipe import job_spec as js
from gpipe.numpy_model import NumpyModel
from gpipe.safetensors_io import save_safetensors

_MODULES = None


def _torch():
    try:
        import torch
    except ImportError as e:
        raise ImportError("gpipe.torch_bridge needs PyTorch: "
                          "pip install torch") from e
    return torch


def modules():
    """The bridge's own nn.Module classes (Embedding, SelfAttention,
    TransformerBlock, GlobalAvgPool), defined on first use because their
    base class comes from torch."""
    global _MODULES
    if _MODULES is None:
        _MODULES = _define_modules(_torch())
    return _MODULES


def _define_modules(torch):
    nn = torch.nn

    class Embedding(nn.Module):
        """Token plus learned position embedding: [B, T] ids -> [B, T, dim]."""

        def __init__(self, vocab_size, dim, max_positions):
            super().__init__()
            self.vocab_size = vocab_size
            self.dim = dim
            self.max_positions = max_positions
            self.token_weight = nn.Parameter(torch.randn(vocab_size, dim) * 0.02)
            self.position_weight = nn.Parameter(
                torch.randn(max_positions, dim) * 0.02)

        def forward(self, ids):
            t = ids.shape[-1]
            return self.token_weight[ids.long()] + self.position_weight[:t]

    class SelfAttention(nn.Module):
        """Multi-head self-attention with a fused q|k|v projection
        (`qkv`) and an output projection (`proj`), heads as contiguous
        column blocks, scores scaled by 1/sqrt(dh), causal by default."""

        def __init__(self, dim, heads, causal=True):
            super().__init__()
            if dim % heads:
                raise ValueError(f"dim {dim} is not divisible by {heads} heads")
            self.dim = dim
            self.heads = heads
            self.causal = causal
            self.qkv = nn.Linear(dim, 3 * dim)
            self.proj = nn.Linear(dim, dim)

        def forward(self, x):
            b, t, d = x.shape
            dh = d // self.heads
            q, k, v = self.qkv(x).split(d, dim=-1)

            def heads(z):  # [B, T, d] -> [B, H, T, dh]
                return z.reshape(b, t, self.heads, dh).transpose(1, 2)

            q, k, v = heads(q), heads(k), heads(v)
            scores = q @ k.transpose(-2, -1) * (1.0 / math.sqrt(dh))
            if self.causal:
                future = torch.ones(t, t, dtype=torch.bool,
                                    device=x.device).triu(1)
                scores = scores.masked_fill(future, float("-inf"))
            out = scores.softmax(dim=-1) @ v
            return self.proj(out.transpose(1, 2).reshape(b, t, d))

    class Mlp(nn.Module):
        """fc1, exact GELU, fc2: the block's feed-forward part."""

        def __init__(self, dim, hidden):
            super().__init__()
            self.fc1 = nn.Linear(dim, hidden)
            self.act = nn.GELU()
            self.fc2 = nn.Linear(hidden, dim)

        def forward(self, x):
            return self.fc2(self.act(self.fc1(x)))

    class TransformerBlock(nn.Module):
        """Pre-LN block, residuals inside: x1 = x + attn(ln1(x)),
        y = x1 + mlp(ln2(x1)), dropout on both branches in training."""

        def __init__(self, dim, heads, mlp_hidden=0, dropout=0.0, causal=True):
            super().__init__()
            self.dim = dim
            self.heads = heads
            self.mlp_hidden = mlp_hidden or 4 * dim
            self.dropout = dropout
            self.causal = causal
            self.ln1 = nn.LayerNorm(dim, eps=1e-5)
            self.attn = SelfAttention(dim, heads, causal)
            self.drop1 = nn.Dropout(dropout)
            self.ln2 = nn.LayerNorm(dim, eps=1e-5)
            self.mlp = Mlp(dim, self.mlp_hidden)
            self.drop2 = nn.Dropout(dropout)

        def forward(self, x):
            x1 = x + self.drop1(self.attn(self.ln1(x)))
            return x1 + self.drop2(self.mlp(self.ln2(x1)))

    class GlobalAvgPool(nn.Module):
        """[B, C, H, W] -> [B, C]: each channel's mean."""

        def forward(self, x):
            return x.mean(dim=(-2, -1))

    return types.SimpleNamespace(
        Embedding=Embedding, SelfAttention=SelfAttention, Mlp=Mlp,
        TransformerBlock=TransformerBlock, GlobalAvgPool=GlobalAvgPool)


def _module_for(layer):
    """The nn.Module computing a NumpyModel layer."""
    torch = _torch()
    nn = torch.nn
    m = modules()
    p, what = layer.params, f"model.layers[{layer.index}]"

    def i(name, default=0):
        return js.int_field(p, name, what, default)

    def eps():
        return float(js.float32_field(p, "eps", what, 1e-5))

    kind = layer.kind
    if kind == "linear":
        return nn.Linear(i("in_features"), i("out_features"),
                         bias=js.bool_field(p, "bias", True))
    if kind == "relu":
        return nn.ReLU()
    if kind == "gelu":
        return nn.GELU()
    if kind == "tanh":
        return nn.Tanh()
    if kind == "dropout":
        return nn.Dropout(float(js.float32_field(p, "p", what)))
    if kind == "layer_norm":
        return nn.LayerNorm(i("features"), eps=eps())
    if kind == "batch_norm":
        cls = nn.BatchNorm1d if len(layer.in_shape) == 1 else nn.BatchNorm2d
        return cls(i("features"), eps=eps(),
                   momentum=float(js.float32_field(p, "momentum", what, 0.1)))
    if kind == "conv2d":
        return nn.Conv2d(i("in_channels"), i("out_channels"), i("kernel_size"),
                         stride=i("stride", 1), padding=i("padding"),
                         bias=js.bool_field(p, "bias", True))
    if kind == "max_pool2d":
        k = i("kernel_size")
        return nn.MaxPool2d(k, stride=i("stride", k))
    if kind == "global_avg_pool":
        return m.GlobalAvgPool()
    if kind == "flatten":
        return nn.Flatten()
    if kind == "embedding":
        return m.Embedding(i("vocab_size"), i("dim"), i("max_positions"))
    if kind == "self_attention":
        return m.SelfAttention(i("dim"), i("heads"),
                               js.bool_field(p, "causal", True))
    if kind == "transformer_block":
        return m.TransformerBlock(
            i("dim"), i("heads"), i("mlp_hidden"),
            float(js.float32_field(p, "dropout", what)),
            js.bool_field(p, "causal", True))
    raise ValueError(f"{what}: layer kind {kind!r} has no PyTorch module")


def to_torch(model_file):
    """An nn.Sequential in eval mode computing the model file's model (a
    path, or a NumpyModel), its weights loaded."""
    torch = _torch()
    model = (model_file if isinstance(model_file, NumpyModel)
             else NumpyModel.load(model_file))
    seq = torch.nn.Sequential(*[_module_for(layer) for layer in model.layers])
    state = {}
    for layer in model.layers:
        for name, array in layer.tensors.items():
            state[f"{layer.index}.{name}"] = torch.from_numpy(
                np.array(array, dtype=np.float32, copy=True))
    result = seq.load_state_dict(state, strict=False)
    missing = [k for k in result.missing_keys
               if not k.endswith("num_batches_tracked")]
    if missing or result.unexpected_keys:
        raise ValueError(f"{model.path}: the modules and the file disagree: "
                         f"missing {missing}, unexpected "
                         f"{list(result.unexpected_keys)}")
    return seq.eval()


# --- from_torch ------------------------------------------------------------

def _pair(value, what, name):
    """A square kernel/stride/padding: an int or two equal ints."""
    if isinstance(value, (tuple, list)):
        if len(value) != 2 or value[0] != value[1]:
            raise ValueError(f"{what}: {name} {tuple(value)} is not square "
                             "(gpipe layers take one size for both axes)")
        value = value[0]
    return int(value)


def _weight_and_bias(module, spec):
    """The tensors of a layer with a weight and an optional bias; a missing
    bias is said in its spec."""
    tensors = {"weight": _numpy(module.weight)}
    if module.bias is None:
        spec["bias"] = False
    else:
        tensors["bias"] = _numpy(module.bias)
    return tensors


def _numpy(t):
    # A copy: .numpy() would share the live parameter's memory.
    return np.array(t.detach().to("cpu", dtype=_torch().float32).numpy(),
                    dtype=np.float32, order="C", copy=True)


def _learned_scale_and_shift(module, what, flag):
    """A norm's weight and bias. gpipe's norms always learn both: a module
    without them would start from ones and zeros and then train them, where
    PyTorch's stay fixed, so it is refused."""
    if module.weight is None or module.bias is None:
        if module.weight is not None:
            flag = "bias=False"  # LayerNorm's, in PyTorch 2.1 and later
        raise ValueError(f"{what}: {type(module).__name__} without a learned "
                         f"weight or bias ({flag}) is not supported: gpipe's "
                         "norms learn both, so training would move what "
                         "PyTorch keeps fixed")
    return {"weight": _numpy(module.weight), "bias": _numpy(module.bias)}


def _is_pool_then_flatten(a, b):
    nn = _torch().nn
    return (isinstance(a, nn.AdaptiveAvgPool2d)
            and a.output_size in (1, (1, 1), [1, 1])
            and isinstance(b, nn.Flatten)
            and b.start_dim == 1 and b.end_dim == -1)


def _flat_modules(seq):
    """The modules in order, nested Sequentials inlined, an
    AdaptiveAvgPool2d(1) + Flatten pair made one global average pool."""
    nn = _torch().nn
    flat = []
    for child in seq.children():
        if isinstance(child, nn.Sequential):
            flat.extend(_flat_modules(child))
        else:
            flat.append(child)
    out = []
    i = 0
    while i < len(flat):
        if i + 1 < len(flat) and _is_pool_then_flatten(flat[i], flat[i + 1]):
            out.append(modules().GlobalAvgPool())
            i += 2
        else:
            out.append(flat[i])
            i += 1
    return out


def _layer_of(module, in_shape, what):
    """(LayerSpec dict, {name: float32 array}) of one module; ValueError
    naming the module when gpipe has no such layer."""
    nn = _torch().nn
    m = modules()
    name = type(module).__name__
    if isinstance(module, nn.Linear):
        spec = {"inFeatures": module.in_features,
                "outFeatures": module.out_features}
        tensors = _weight_and_bias(module, spec)
        return {"linear": spec}, tensors
    if isinstance(module, nn.ReLU):
        return {"relu": {}}, {}
    if isinstance(module, nn.GELU):
        if getattr(module, "approximate", "none") != "none":
            raise ValueError(f"{what}: nn.GELU(approximate="
                             f"{module.approximate!r}) is not supported; "
                             "gpipe's gelu is the exact one")
        return {"gelu": {}}, {}
    if isinstance(module, nn.Tanh):
        return {"tanh": {}}, {}
    if isinstance(module, nn.Dropout):
        return {"dropout": {"p": float(module.p)}}, {}
    if isinstance(module, nn.LayerNorm):
        if len(module.normalized_shape) != 1:
            raise ValueError(f"{what}: nn.LayerNorm over "
                             f"{tuple(module.normalized_shape)}: gpipe "
                             "normalizes the last dimension only")
        f = module.normalized_shape[0]
        return ({"layerNorm": {"features": f, "eps": float(module.eps)}},
                _learned_scale_and_shift(module, what,
                                         "elementwise_affine=False"))
    if isinstance(module, (nn.BatchNorm1d, nn.BatchNorm2d)):
        rank = 1 if isinstance(module, nn.BatchNorm1d) else 3
        if len(in_shape) != rank:
            raise ValueError(f"{what}: {name} on samples of {list(in_shape)}: "
                             "gpipe's batch_norm takes [F] (BatchNorm1d) or "
                             "[C, H, W] (BatchNorm2d)")
        if module.running_mean is None:
            raise ValueError(f"{what}: {name}(track_running_stats=False) is "
                             "not supported: evaluation uses running stats")
        if module.momentum is None:
            raise ValueError(f"{what}: {name}(momentum=None) (a cumulative "
                             "average) is not supported")
        c = module.num_features
        return ({"batchNorm": {"features": c, "eps": float(module.eps),
                               "momentum": float(module.momentum)}},
                {**_learned_scale_and_shift(module, what, "affine=False"),
                 "running_mean": _numpy(module.running_mean),
                 "running_var": _numpy(module.running_var)})
    if isinstance(module, nn.Conv2d):
        if module.groups != 1 or _pair(module.dilation, what,
                                       "dilation") != 1:
            raise ValueError(f"{what}: nn.Conv2d with groups or dilation is "
                             "not supported")
        if module.padding_mode != "zeros":
            raise ValueError(f"{what}: nn.Conv2d(padding_mode="
                             f"{module.padding_mode!r}): only zero padding")
        padding = module.padding
        if isinstance(padding, str):
            if padding != "valid":
                raise ValueError(f"{what}: nn.Conv2d(padding={padding!r}): "
                                 "give the padding as a number")
            padding = 0
        spec = {"inChannels": module.in_channels,
                "outChannels": module.out_channels,
                "kernelSize": _pair(module.kernel_size, what, "kernel_size"),
                "stride": _pair(module.stride, what, "stride"),
                "padding": _pair(padding, what, "padding")}
        tensors = _weight_and_bias(module, spec)
        return {"conv2d": spec}, tensors
    if isinstance(module, nn.MaxPool2d):
        if (_pair(module.padding, what, "padding") != 0
                or _pair(module.dilation, what, "dilation") != 1
                or module.ceil_mode or module.return_indices):
            raise ValueError(f"{what}: nn.MaxPool2d with padding, dilation, "
                             "ceil_mode or return_indices is not supported")
        k = _pair(module.kernel_size, what, "kernel_size")
        stride = module.stride if module.stride is not None else k
        return ({"maxPool2d": {"kernelSize": k,
                               "stride": _pair(stride, what, "stride")}}, {})
    if isinstance(module, m.GlobalAvgPool):
        return {"globalAvgPool": {}}, {}
    if isinstance(module, nn.Flatten):
        if module.start_dim != 1 or module.end_dim != -1:
            raise ValueError(f"{what}: nn.Flatten(start_dim="
                             f"{module.start_dim}, end_dim={module.end_dim}): "
                             "only the default (each sample to one dimension)")
        return {"flatten": {}}, {}
    if isinstance(module, m.Embedding):
        return ({"embedding": {"vocabSize": module.vocab_size,
                               "dim": module.dim,
                               "maxPositions": module.max_positions}},
                _state(module))
    if isinstance(module, m.SelfAttention):
        return ({"selfAttention": {"dim": module.dim, "heads": module.heads,
                                   "causal": bool(module.causal)}},
                _state(module))
    if isinstance(module, m.TransformerBlock):
        return ({"transformerBlock": {
                    "dim": module.dim, "heads": module.heads,
                    "mlpHidden": module.mlp_hidden,
                    "dropout": float(module.dropout),
                    "causal": bool(module.causal)}},
                _state(module))
    raise ValueError(f"{what}: {name} is not supported (gpipe has Linear, "
                     "ReLU, GELU, Tanh, Dropout, LayerNorm, BatchNorm1d/2d, "
                     "Conv2d, MaxPool2d, AdaptiveAvgPool2d(1)+Flatten, "
                     "Flatten and gpipe.torch_bridge.modules()'s Embedding, "
                     "SelfAttention, TransformerBlock, GlobalAvgPool)")


def _state(module):
    return {k: _numpy(v) for k, v in module.state_dict().items()}


def from_torch(sequential, example_input, path):
    """The job spec's "model" for `sequential` (input dtype and shape from
    `example_input` without its batch dimension, softmax cross-entropy
    loss), its weights written to `path` as an initFrom file (tensors
    layers.<i>.<name>, metadata {"format": "pt"}). A module gpipe has no
    layer for raises ValueError naming it.

    The example is run through the modules (in eval mode, without
    gradients; their modes are restored) to learn each layer's input shape.
    """
    torch = _torch()
    if not isinstance(sequential, torch.nn.Sequential):
        raise ValueError(f"from_torch takes an nn.Sequential, got "
                         f"{type(sequential).__name__}")
    if not isinstance(example_input, torch.Tensor) or example_input.dim() < 2:
        raise ValueError("example_input must be a tensor of [B, ...] with a "
                         "batch dimension")
    if example_input.is_floating_point():
        dtype = "FLOAT32"
        x = example_input.float()
    elif not example_input.dtype.is_complex and example_input.dtype != torch.bool:
        dtype = "INT32"
        x = example_input.long()
    else:
        raise ValueError(f"example_input has dtype {example_input.dtype}; "
                         "want floating point or integer ids")
    mods = _flat_modules(sequential)
    if not mods:
        raise ValueError("from_torch: the Sequential is empty")

    layers, tensors = [], {}
    training = [m.training for m in mods]
    try:
        with torch.no_grad():
            for i, module in enumerate(mods):
                what = f"module {i} ({type(module).__name__})"
                spec, params = _layer_of(module, tuple(x.shape[1:]), what)
                layers.append(spec)
                for name, array in params.items():
                    tensors[f"layers.{i}.{name}"] = np.ascontiguousarray(
                        array, dtype=np.float32)
                module.eval()
                x = module(x)
    finally:
        for module, mode in zip(mods, training):
            module.train(mode)

    model = {
        "input": {"dtype": dtype,
                  "shape": {"dims": [int(d) for d in example_input.shape[1:]]}},
        "layers": layers,
        "loss": {"softmaxCrossEntropy": {}},
    }
    save_safetensors(path, tensors, {"format": "pt"})
    return model
