"""Reading the job spec that a model file carries in its metadata.

`gpipe.job` is protobuf JSON (docs/model-format.md): field names in
lowerCamelCase ("inFeatures"), int64 values as JSON strings ("784"), bytes as
base64, enums by name. Protobuf's own JSON parser also accepts the proto
field names ("in_features") and numbers for int64, so a hand-written spec may
use either: everything here accepts both.
"""

import base64
import json
import math

import numpy as np

# The layer kinds of proto/gpipe/v1/model.proto's LayerSpec, by the proto
# field name; protobuf JSON writes them in lowerCamelCase.
LAYER_KINDS = (
    "linear", "relu", "gelu", "tanh", "dropout", "layer_norm", "embedding",
    "self_attention", "transformer_block", "conv2d", "max_pool2d",
    "global_avg_pool", "flatten", "batch_norm",
)


def camel(name):
    """protobuf's JSON name of a field: max_pool2d -> maxPool2d."""
    head, *rest = name.split("_")
    return head + "".join(p[:1].upper() + p[1:] for p in rest)


def field(message, name, default=None):
    """The value of proto field `name` (snake_case) in a JSON message, under
    its JSON name or its proto name; `default` when absent."""
    if not isinstance(message, dict):
        return default
    for key in (camel(name), name):
        if key in message:
            return message[key]
    return default


def has_field(message, name):
    return isinstance(message, dict) and (camel(name) in message
                                          or name in message)


def to_int(value, what):
    """An int64 field: a JSON number or, as protobuf writes int64, a string."""
    if isinstance(value, bool):
        raise ValueError(f"{what}: {value!r} is not an integer")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            pass
    raise ValueError(f"{what}: {value!r} is not an integer")


def int_field(message, name, what, default=0):
    value = field(message, name)
    return default if value is None else to_int(value, f"{what}.{name}")


def float32_field(message, name, what, default=0.0):
    """A proto `float` field, as the float32 the C++ holds. protobuf JSON may
    write "NaN"/"Infinity" as strings; those are kept as such floats."""
    value = field(message, name)
    if value is None:
        value = default
    if isinstance(value, bool):
        raise ValueError(f"{what}.{name}: {value!r} is not a number")
    try:
        return np.float32(float(value))
    except (TypeError, ValueError):
        raise ValueError(f"{what}.{name}: {value!r} is not a number") from None


def bool_field(message, name, default):
    value = field(message, name)
    return default if value is None else bool(value)


def bytes_field(message, name, what):
    """A proto `bytes` field: base64 in protobuf JSON (standard or URL-safe
    alphabet, padding optional)."""
    value = field(message, name, "")
    if not isinstance(value, str):
        raise ValueError(f"{what}.{name}: {value!r} is not base64 text")
    text = value.replace("-", "+").replace("_", "/")
    text += "=" * (-len(text) % 4)
    try:
        return base64.b64decode(text, validate=True)
    except ValueError:
        raise ValueError(f"{what}.{name}: {value!r} is not base64") from None


def parse_job(text, what="gpipe.job"):
    """The job spec dict from its JSON text, with its model checked to be
    there."""
    try:
        spec = json.loads(text)
    except ValueError as e:
        raise ValueError(f"{what} is not valid JSON: {e}") from None
    if not isinstance(spec, dict):
        raise ValueError(f"{what} is not a JSON object")
    model = field(spec, "model")
    if not isinstance(model, dict):
        raise ValueError(f"{what} has no model")
    layers = field(model, "layers")
    if not isinstance(layers, list) or not layers:
        raise ValueError(f"{what}: model.layers is missing or empty")
    return spec


def layer_kind(layer, what):
    """(kind, its fields) of one LayerSpec: exactly one kind must be set."""
    if not isinstance(layer, dict):
        raise ValueError(f"{what}: not an object")
    found = [k for k in LAYER_KINDS if has_field(layer, k)]
    unknown = [k for k in layer
               if k not in {camel(x) for x in LAYER_KINDS} | set(LAYER_KINDS)]
    if unknown:
        raise ValueError(f"{what}: unknown layer kind {unknown[0]!r} (known: "
                         f"{', '.join(camel(k) for k in LAYER_KINDS)})")
    if len(found) != 1:
        raise ValueError(f"{what}: needs exactly one layer kind, got "
                         f"{len(found)}")
    params = field(layer, found[0]) or {}
    if not isinstance(params, dict):
        raise ValueError(f"{what}.{camel(found[0])}: not an object")
    return found[0], params


def input_header(spec, what="gpipe.job"):
    """(dtype name, per-sample shape) of model.input."""
    model = field(spec, "model")
    header = field(model, "input")
    if not isinstance(header, dict):
        raise ValueError(f"{what}: model.input is missing")
    dtype = field(header, "dtype", "DTYPE_UNSPECIFIED")
    dtype = {1: "FLOAT32", 2: "INT32"}.get(dtype, dtype)
    if dtype not in ("FLOAT32", "INT32"):
        raise ValueError(f"{what}: model.input.dtype must be FLOAT32 or "
                         f"INT32, got {dtype!r}")
    dims = field(field(header, "shape", {}), "dims", [])
    shape = tuple(to_int(d, f"{what}: model.input.shape.dims[{i}]")
                  for i, d in enumerate(dims))
    if not shape or min(shape) <= 0:
        raise ValueError(f"{what}: model.input.shape.dims must be positive, "
                         f"got {list(shape)}")
    return dtype, shape


def infer_output_shape(kind, p, shape, what):
    """The per-sample output shape of a layer for a per-sample input
    `shape`, as services/nn/layer_spec.cc infers it (a shorter check: the C++
    product validated the spec when it trained the model)."""
    def need_rank(rank, layout):
        if len(shape) != rank:
            raise ValueError(f"{what}: needs an input of {layout}, got "
                             f"{list(shape)}")

    if kind == "linear":
        return shape[:-1] + (int_field(p, "out_features", what),)
    if kind == "embedding":
        need_rank(1, "[T] token ids")
        return (shape[0], int_field(p, "dim", what))
    if kind in ("conv2d", "max_pool2d"):
        need_rank(3, "[C, H, W]")
        k = int_field(p, "kernel_size", what)
        if kind == "conv2d":
            stride = int_field(p, "stride", what, 1)
            pad = int_field(p, "padding", what)
            channels = int_field(p, "out_channels", what)
        else:
            stride = int_field(p, "stride", what, k)
            pad = 0
            channels = shape[0]
        h, w = shape[1] + 2 * pad, shape[2] + 2 * pad
        if k <= 0 or stride <= 0 or h < k or w < k:
            raise ValueError(f"{what}: kernel {k}, stride {stride} do not fit "
                             f"the input {list(shape)}")
        return (channels, (h - k) // stride + 1, (w - k) // stride + 1)
    if kind == "global_avg_pool":
        need_rank(3, "[C, H, W]")
        return (shape[0],)
    if kind == "flatten":
        return (math.prod(shape),)
    if kind == "batch_norm" and len(shape) not in (1, 3):
        raise ValueError(f"{what}: needs an input of [C, H, W] or [F], got "
                         f"{list(shape)}")
    return shape


def model_shapes(spec, what="gpipe.job"):
    """[(kind, fields, input shape, output shape)] for every layer."""
    _, shape = input_header(spec, what)
    out = []
    for i, layer in enumerate(field(field(spec, "model"), "layers")):
        where = f"{what}: model.layers[{i}]"
        kind, params = layer_kind(layer, where)
        next_shape = infer_output_shape(kind, params, shape,
                                        f"{where}.{camel(kind)}")
        out.append((kind, params, shape, next_shape))
        shape = next_shape
    return out
