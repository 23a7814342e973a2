#!/usr/bin/python3
"""torch_step: the same training step as step_bench, in PyTorch.

Builds the model of a gpipe job spec (protobuf JSON) in PyTorch with the
same layers, loss, optimizer, batch size and micro-batches, and times its
training steps after a warm-up. Prints the same `ms/step:` line as
step_bench, so bench/compare_torch.sh can put the two side by side.

    bench/torch_step.py SPEC.json [--steps N] [--warmup W] [--threads T]
                        [--micro-batches M] [--profile]

The inputs are one random batch of the right shape and dtype, generated once:
unlike step_bench, no data is gathered per step, so this is a lower bound
for a PyTorch loop over real data.
"""

import argparse
import json
import math
import os
import statistics
import sys
import time


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("spec", help="job spec JSON (examples/*.json)")
    p.add_argument("--steps", type=int, default=20, help="timed steps (default 20)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first (default 3)")
    p.add_argument("--threads", type=int, default=0, help="threads (default: all cores)")
    p.add_argument("--micro-batches", type=int, default=0,
                   help="micro-batches per step (default: the spec's)")
    p.add_argument("--profile", action="store_true",
                   help="then profile 5 more steps with torch.profiler")
    return p.parse_args()


ARGS = parse_args()
THREADS = ARGS.threads if ARGS.threads > 0 else (os.cpu_count() or 1)
# Before importing torch: its OpenMP pool and OpenBLAS read these at load.
for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[var] = str(THREADS)

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402


def field(msg, name, default=None):
    """A field of a protobuf-JSON object by its lowerCamelCase name; the
    original snake_case spelling is accepted too, as protobuf does."""
    if name in msg:
        return msg[name]
    snake = "".join("_" + c.lower() if c.isupper() else c for c in name)
    return msg.get(snake, default)


class SelfAttention(nn.Module):
    """One qkv projection, softmax(QK^T / sqrt(dh)) V per head with a causal
    mask, and the output projection: explicit matmuls, as ours computes."""

    def __init__(self, dim, heads, causal=True):
        super().__init__()
        self.dim, self.heads, self.causal = dim, heads, causal
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        b, t, d = x.shape
        h, dh = self.heads, d // self.heads
        qkv = self.qkv(x).view(b, t, 3, h, dh).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]  # [B, H, T, dh]
        scores = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(dh))
        if self.causal:
            mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
            scores = scores.masked_fill(mask, float("-inf"))
        out = torch.matmul(torch.softmax(scores, dim=-1), v)
        return self.proj(out.transpose(1, 2).reshape(b, t, d))


class TransformerBlock(nn.Module):
    """Pre-LN: x + Dropout(Attn(LN1 x)); x + Dropout(FC2(GELU(FC1(LN2 x))))."""

    def __init__(self, dim, heads, hidden, dropout, causal):
        super().__init__()
        self.ln1 = nn.LayerNorm(dim, eps=1e-5)
        self.attn = SelfAttention(dim, heads, causal)
        self.drop1 = nn.Dropout(dropout)
        self.ln2 = nn.LayerNorm(dim, eps=1e-5)
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)
        self.drop2 = nn.Dropout(dropout)

    def forward(self, x):
        x = x + self.drop1(self.attn(self.ln1(x)))
        return x + self.drop2(self.fc2(F.gelu(self.fc1(self.ln2(x)))))


class Embedding(nn.Module):
    """Token embedding plus a learned position embedding: [B, T] -> [B, T, dim]."""

    def __init__(self, vocab, dim, max_positions):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(max_positions, dim)

    def forward(self, ids):
        positions = torch.arange(ids.shape[1], device=ids.device)
        return self.tok(ids) + self.pos(positions)


class GlobalAvgPool(nn.Module):
    def forward(self, x):  # [B, C, H, W] -> [B, C]
        return x.mean(dim=(2, 3))


def make_layer(spec, input_rank):
    """One layer of a LayerSpec; `input_rank` is the per-sample input rank."""
    (kind, s), = spec.items()
    if kind == "linear":
        return nn.Linear(field(s, "inFeatures"), field(s, "outFeatures"),
                         bias=field(s, "bias", True))
    if kind == "relu":
        return nn.ReLU()
    if kind == "gelu":
        return nn.GELU()  # exact (erf)
    if kind == "tanh":
        return nn.Tanh()
    if kind == "dropout":
        return nn.Dropout(field(s, "p", 0.0))
    if kind == "layerNorm":
        return nn.LayerNorm(field(s, "features"), eps=field(s, "eps", 1e-5))
    if kind == "embedding":
        return Embedding(field(s, "vocabSize"), field(s, "dim"), field(s, "maxPositions"))
    if kind == "selfAttention":
        return SelfAttention(field(s, "dim"), field(s, "heads"), field(s, "causal", True))
    if kind == "transformerBlock":
        dim = field(s, "dim")
        hidden = field(s, "mlpHidden", 0) or 4 * dim
        return TransformerBlock(dim, field(s, "heads"), hidden,
                                field(s, "dropout", 0.0), field(s, "causal", True))
    if kind == "conv2d":
        return nn.Conv2d(field(s, "inChannels"), field(s, "outChannels"),
                         field(s, "kernelSize"), stride=field(s, "stride", 1),
                         padding=field(s, "padding", 0), bias=field(s, "bias", True))
    if kind == "maxPool2d":
        k = field(s, "kernelSize")
        return nn.MaxPool2d(k, stride=field(s, "stride", k))
    if kind == "globalAvgPool":
        return GlobalAvgPool()
    if kind == "flatten":
        return nn.Flatten()
    if kind == "batchNorm":
        norm = nn.BatchNorm2d if input_rank == 3 else nn.BatchNorm1d
        return norm(field(s, "features"), eps=field(s, "eps", 1e-5),
                    momentum=field(s, "momentum", 0.1))
    raise SystemExit(f"torch_step: layer kind '{kind}' is not supported")


def build_model(model_spec, sample_shape):
    """nn.Sequential of the spec's layers; tracks the per-sample rank so that
    BatchNorm picks its 1-d or 2-d form."""
    layers, x = [], torch.zeros([2] + sample_shape)
    if field(field(model_spec, "input"), "dtype", "FLOAT32") == "INT32":
        x = x.long()
    for spec in field(model_spec, "layers"):
        layers.append(make_layer(spec, x.dim() - 1))
        with torch.no_grad():
            x = layers[-1](x)
    return nn.Sequential(*layers)


def loaded_blas():
    """The BLAS library(ies) this process has mapped: Debian's torch calls
    libblas.so.3, which the alternatives system points at some OpenBLAS."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "blas" in line.split()[-1]}
    except OSError:
        return "(unknown)"
    openblas = [p for p in paths if "libopenblas" in p]
    return ", ".join(sorted(openblas or paths)) or "(none mapped)"


def make_optimizer(spec, params):
    lr = field(spec, "lr", 0.0)
    if "adamw" in spec:
        a = spec["adamw"]
        return torch.optim.AdamW(params, lr=lr,
                                 betas=(field(a, "beta1", 0.9), field(a, "beta2", 0.999)),
                                 eps=field(a, "eps", 1e-8),
                                 weight_decay=field(a, "weightDecay", 0.01))
    s = field(spec, "sgd", {})
    return torch.optim.SGD(params, lr=lr, momentum=field(s, "momentum", 0.0),
                           weight_decay=field(s, "weightDecay", 0.0),
                           nesterov=field(s, "nesterov", False))


def main():
    path = ARGS.spec
    with open(path) as f:
        job = json.load(f)
    torch.set_num_threads(THREADS)
    torch.manual_seed(1)
    model_spec = field(job, "model")
    header = field(model_spec, "input")
    sample_shape = [int(d) for d in field(field(header, "shape"), "dims")]
    int_input = field(header, "dtype", "FLOAT32") == "INT32"
    batch = int(field(job, "batchSize"))
    micro = ARGS.micro_batches or int(field(field(job, "pipeline", {}), "microBatches", 0) or 1)

    model = build_model(model_spec, sample_shape)
    model.train()
    if int_input:
        vocab = next(field(l["embedding"], "vocabSize") for l in field(model_spec, "layers")
                     if "embedding" in l)
        inputs = torch.randint(0, vocab, [batch] + sample_shape, dtype=torch.long)
    else:
        inputs = torch.rand([batch] + sample_shape)
    with torch.no_grad():
        out_shape = list(model(inputs[:1]).shape[1:])
    classes = out_shape[-1]
    # [C] logits: one class per sample; [T, V]: one token per position. All
    # targets count here (the synthetic tasks mark some -1), which changes the
    # loss's cost by next to nothing.
    targets = torch.randint(0, classes, [batch] + out_shape[:-1], dtype=torch.long)
    optimizer = make_optimizer(field(job, "optimizer"), model.parameters())
    clip = field(field(job, "optimizer"), "clipNorm", 0.0)
    chunks = list(zip(inputs.tensor_split(micro), targets.tensor_split(micro)))
    total_targets = max(int((targets != -1).sum()), 1)

    def step():
        for x, t in chunks:
            logits = model(x)
            loss = F.cross_entropy(logits.reshape(-1, classes), t.reshape(-1),
                                   ignore_index=-1, reduction="sum") / total_targets
            loss.backward()
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
        optimizer.zero_grad()

    print(f"torch_step: {job.get('name', 'unnamed')} ({path})")
    print(f"  batch {batch} in {micro} micro-batches, --threads {THREADS}, "
          f"{ARGS.warmup} warm-up + {ARGS.steps} timed steps")
    print(f"  model: {len(model)} layers, {sum(p.numel() for p in model.parameters())} parameters")
    print(f"  OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '(unset)')} "
          f"OPENBLAS_L2_SIZE={os.environ.get('OPENBLAS_L2_SIZE', '(unset)')}")
    print(f"  torch {torch.__version__}, torch.get_num_threads() {torch.get_num_threads()}")
    print(f"  BLAS: {loaded_blas()}")
    sys.stdout.flush()
    for _ in range(ARGS.warmup):
        step()
    ms = []
    for _ in range(max(ARGS.steps, 1)):
        start = time.perf_counter()
        step()
        ms.append(1e3 * (time.perf_counter() - start))
    print(f"ms/step: median {statistics.median(ms):.3f}  mean {statistics.mean(ms):.3f}"
          f"  min {min(ms):.3f}  max {max(ms):.3f}")
    print("note: one random batch generated once, no data loading per step: a lower\n"
          "      bound for a PyTorch loop over real data.")
    sys.stdout.flush()

    if ARGS.profile:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            for _ in range(5):
                step()
        print("\nprofile (5 steps, torch.profiler, by self CPU time):")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=20))


if __name__ == "__main__":
    main()
