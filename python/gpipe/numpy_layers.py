"""The evaluation arithmetic of every layer kind, in numpy float32.

Each function follows docs/model-format.md and the C++ kernels it documents
(services/nn/layers/*.cc, services/tensor/cpu/*.cc), in the same order of
float32 operations where that order is cheap to keep, so the outputs agree
with the product's to float32 rounding. Inputs carry the batch dimension
first. Statistics (layer norm means and variances) are reduced in float64
and rounded once: closer to the exact value than any float32 summation
order, hence within rounding of the C++ sequential sums.
"""

import math

import numpy as np

F32 = np.float32


def linear(x, weight, bias=None):
    """nn.Linear on the last dimension: x W^T + b."""
    y = np.matmul(x, weight.T)
    if bias is not None:
        y += bias
    return y


def relu(x):
    return np.maximum(x, F32(0))


_erf = np.vectorize(math.erf, otypes=[np.float64])


def gelu(x):
    """The exact GELU, 0.5 x (1 + erf(x / sqrt 2)) (nn.GELU(), not the tanh
    approximation). numpy has no erf: math.erf element by element, in
    float64, rounded once to float32."""
    x64 = x.astype(np.float64)
    return (0.5 * x64 * (1.0 + _erf(x64 / math.sqrt(2.0)))).astype(F32)


def tanh(x):
    return np.tanh(x)


def layer_norm(x, weight, bias, eps):
    """nn.LayerNorm over the last dimension (biased variance)."""
    x64 = x.astype(np.float64)
    mean = x64.mean(axis=-1, keepdims=True)
    var = np.square(x64 - mean).mean(axis=-1, keepdims=True)
    mean = mean.astype(F32)
    rstd = F32(1) / np.sqrt(var.astype(F32) + F32(eps))
    return (x - mean) * rstd * weight + bias


def batch_norm_eval(x, weight, bias, running_mean, running_var, eps):
    """BatchNorm1d/2d in evaluation: the running statistics normalize the
    channel axis (1) of [B, C, H, W] or [B, F]."""
    shape = (1, -1) + (1,) * (x.ndim - 2)
    rstd = F32(1) / np.sqrt(running_var + F32(eps))
    return ((x - running_mean.reshape(shape)) * rstd.reshape(shape)
            * weight.reshape(shape) + bias.reshape(shape))


def _windows(x, kernel, stride):
    """[B, C, OH, OW, k, k] view of the k x k windows of [B, C, H, W] taken
    every `stride` pixels (the output size rounds down, as the C++ does)."""
    view = np.lib.stride_tricks.sliding_window_view(x, (kernel, kernel),
                                                    axis=(2, 3))
    return view[:, :, ::stride, ::stride]


def conv2d(x, weight, bias, stride, padding):
    """nn.Conv2d with square kernels and zero padding: im2col, then one
    matrix product per batch."""
    if padding:
        x = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    k = weight.shape[-1]
    cols = _windows(x, k, stride)  # [B, C, OH, OW, k, k]
    # Sum over channels and the window: weight is [O, C, k, k].
    y = np.einsum("bchwij,ocij->bohw", cols, weight, optimize=True)
    y = np.ascontiguousarray(y, dtype=F32)
    if bias is not None:
        y += bias.reshape(1, -1, 1, 1)
    return y


def max_pool2d(x, kernel, stride):
    """nn.MaxPool2d without padding, rounding the output size down."""
    return np.ascontiguousarray(_windows(x, kernel, stride).max(axis=(-2, -1)))


def global_avg_pool(x):
    """[B, C, H, W] -> [B, C]: each plane's mean (the C++ divides the float32
    sum by H*W)."""
    inner = x.shape[2] * x.shape[3]
    total = x.reshape(x.shape[0], x.shape[1], inner).sum(axis=-1,
                                                        dtype=np.float64)
    return total.astype(F32) / F32(inner)


def flatten(x):
    return x.reshape(x.shape[0], -1)


def embedding(ids, token_weight, position_weight):
    """[B, T] ids -> [B, T, dim]: token row plus the row of its position."""
    t = ids.shape[1]
    vocab = token_weight.shape[0]
    if ids.size and (ids.min() < 0 or ids.max() >= vocab):
        bad = ids[(ids < 0) | (ids >= vocab)]
        raise ValueError(f"{bad.size} token id(s) are outside the embedding's "
                         f"vocabulary of {vocab} (the first: {bad.flat[0]})")
    if t > position_weight.shape[0]:
        raise ValueError(f"sequence length {t} exceeds the embedding's "
                         f"{position_weight.shape[0]} positions")
    return token_weight[ids] + position_weight[:t]


def self_attention(x, qkv_weight, qkv_bias, proj_weight, proj_bias, heads,
                   causal):
    """Multi-head self-attention on [B, T, dim]: the fused projection gives
    [q | k | v] per position; head h takes columns [h*dh, (h+1)*dh) of each;
    softmax(q k^T / sqrt(dh)) v, causal if asked; heads concatenated in
    order, then the output projection."""
    b, t, d = x.shape
    dh = d // heads
    qkv = linear(x, qkv_weight, qkv_bias)  # [B, T, 3d]

    def split(part):  # [B, T, d] -> [B, H, T, dh]
        cols = qkv[:, :, part * d:(part + 1) * d]
        return cols.reshape(b, t, heads, dh).transpose(0, 2, 1, 3)

    q, k, v = split(0), split(1), split(2)
    scale = F32(1) / np.sqrt(F32(dh))
    scores = np.matmul(q, k.transpose(0, 1, 3, 2)) * scale  # [B, H, T, T]
    if causal:
        future = np.triu(np.ones((t, t), dtype=bool), k=1)
        scores[:, :, future] = -np.inf
    probs = np.exp(scores - scores.max(axis=-1, keepdims=True))
    probs *= F32(1) / probs.sum(axis=-1, keepdims=True)
    out = np.matmul(probs, v)  # [B, H, T, dh]
    out = out.transpose(0, 2, 1, 3).reshape(b, t, d)
    return linear(out, proj_weight, proj_bias)
