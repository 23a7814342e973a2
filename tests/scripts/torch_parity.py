"""gpipe's optimizers, learning-rate schedule and clipping against PyTorch's.

Trains one small model (Linear, GELU, LayerNorm, Linear) from the same
weights (gpipe.from_torch) on the same batches (gpipe.batch_indices, the
sampler's order: 16 of 40 samples a step, across epochs) with `gpipectl
train` and with a torch.optim loop written from docs/training.md, then
compares the weights.
Each optimizer runs under both weight-decay rules, and each rule is also
compared with the other rule's PyTorch loop, which must differ: a parity
check that could not tell the rules apart would prove nothing.

  torch_parity.py GPIPECTL WORK
"""

import json
import math
import os
import subprocess
import sys

import numpy as np
import torch

import gpipe

GPIPECTL, WORK = sys.argv[1], sys.argv[2]
STEPS = 12
# Float32 rounding over 12 steps, measured at 1e-6 at most; a wrong rule or
# schedule moves the weights by 1e-3 or more.
SAME = 2e-5
DIFFERENT = 1e-3


def model():
    torch.manual_seed(7)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.GELU(),
                               torch.nn.LayerNorm(8), torch.nn.Linear(8, 4))


def learning_rate(o, step, total):
    """docs/training.md's schedule, in float64 as gpipe computes it."""
    lr, min_lr = float(np.float32(o["lr"])), float(np.float32(o.get("minLr", 0)))
    warmup = o.get("warmupSteps", 0)
    if step < warmup:
        return lr * (step + 1) / warmup
    span = total - warmup
    t = (step - warmup) / (span - 1) if span > 1 else 1.0
    decay = o.get("decay", "LR_DECAY_NONE")
    if decay == "LR_DECAY_COSINE":
        return min_lr + (lr - min_lr) * 0.5 * (1 + math.cos(math.pi * t))
    if decay == "LR_DECAY_LINEAR":
        return lr + (min_lr - lr) * t
    return lr


SAMPLES, BATCH, SEED = 40, 16, 3


def train_torch(o, x, y, decay_all):
    m = model()
    params = list(m.named_parameters())
    # WEIGHT_DECAY_ON_WEIGHTS: Linear weights only, not biases or norms.
    decayed = [p for n, p in params
               if decay_all or (n.endswith("weight") and not n.startswith("2."))]
    kept = [p for n, p in params if not any(p is d for d in decayed)]
    if "sgd" in o:
        s = o["sgd"]
        groups = [{"params": decayed, "weight_decay": s.get("weightDecay", 0)}]
        if kept:
            groups.append({"params": kept, "weight_decay": 0.0})
        opt = torch.optim.SGD(groups, lr=o["lr"], momentum=s.get("momentum", 0),
                              nesterov=s.get("nesterov", False))
    else:
        a = o["adamw"]
        groups = [{"params": decayed, "weight_decay": a.get("weightDecay", 0.01)}]
        if kept:
            groups.append({"params": kept, "weight_decay": 0.0})
        opt = torch.optim.AdamW(groups, lr=o["lr"],
                                betas=(a.get("beta1", 0.9), a.get("beta2", 0.999)),
                                eps=a.get("eps", 1e-8))
    for step in range(STEPS):
        opt.zero_grad()
        rows = torch.tensor(gpipe.batch_indices(SEED, SAMPLES, BATCH, step))
        torch.nn.functional.cross_entropy(m(x[rows]), y[rows]).backward()
        if o.get("clipNorm", 0) > 0:
            torch.nn.utils.clip_grad_norm_(m.parameters(), o["clipNorm"])
        for g in opt.param_groups:
            g["lr"] = learning_rate(o, step, STEPS)
        opt.step()
    return {"layers." + k: v.detach().numpy() for k, v in m.state_dict().items()}


def train_gpipe(name, spec, extra):
    path = os.path.join(WORK, name + ".json")
    with open(path, "w") as f:
        json.dump(spec, f)
    out = os.path.join(WORK, "out_" + name)
    run = subprocess.run([GPIPECTL, "train", path, "--out", out, "--threads",
                          "1"] + extra, capture_output=True, text=True,
                         timeout=300)
    if run.returncode != 0:
        sys.exit(f"FAIL: gpipectl train {name}: {run.stderr}{run.stdout}")
    tensors, _ = gpipe.load_safetensors(os.path.join(out, "model.safetensors"))
    return tensors


def largest_difference(a, b):
    assert sorted(a) == sorted(b), (sorted(a), sorted(b))
    return max(float(np.abs(a[k] - b[k]).max()) for k in a)


def main():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((SAMPLES, 6)).astype(np.float32)
    y = rng.integers(0, 4, SAMPLES).astype(np.int64)
    np.save(os.path.join(WORK, "x.npy"), x)
    np.save(os.path.join(WORK, "y.npy"), y)
    init = os.path.join(WORK, "init.safetensors")
    spec_model = gpipe.from_torch(model(), torch.from_numpy(x), init)

    optimizers = {
        "sgd": {"lr": 0.5, "sgd": {"momentum": 0.9, "weightDecay": 0.05,
                                   "nesterov": True},
                "warmupSteps": 3, "decay": "LR_DECAY_COSINE", "minLr": 0.01,
                "clipNorm": 0.3},
        "adamw": {"lr": 0.05, "adamw": {"beta1": 0.8, "beta2": 0.99,
                                        "eps": 1e-6, "weightDecay": 0.2},
                  "warmupSteps": 2, "decay": "LR_DECAY_LINEAR", "minLr": 0.001,
                  "clipNorm": 1.0},
    }
    passed = 0
    for kind, o in optimizers.items():
        for rule in ("WEIGHT_DECAY_ON_WEIGHTS", "WEIGHT_DECAY_ON_ALL"):
            spec = {
                "model": spec_model,
                "data": {"tensors": {"inputs": os.path.join(WORK, "x.npy"),
                                     "targets": os.path.join(WORK, "y.npy"),
                                     "testInputs": os.path.join(WORK, "x.npy"),
                                     "testTargets": os.path.join(WORK, "y.npy")}},
                "initFrom": {"path": init},
                "optimizer": dict(o, weightDecayOn=rule),
                "batchSize": BATCH, "steps": STEPS, "seed": SEED,
            }
            decay_all = rule == "WEIGHT_DECAY_ON_ALL"
            torch_same = train_torch(o, torch.from_numpy(x),
                                     torch.from_numpy(y), decay_all)
            torch_other = train_torch(o, torch.from_numpy(x),
                                      torch.from_numpy(y), not decay_all)
            runs = [("", [])]
            if kind == "sgd":
                # Through a pipeline too: 2 stages, 4 micro-batches.
                runs.append(("_k2", ["--stages", "2", "--micro-batches", "4"]))
            for suffix, extra in runs:
                ours = train_gpipe(f"{kind}_{rule}{suffix}", spec, extra)
                same = largest_difference(ours, torch_same)
                other = largest_difference(ours, torch_other)
                what = f"{kind} {rule}{' ' + ' '.join(extra) if extra else ''}"
                print(f"{what}: weights differ from PyTorch's by {same:.2e} "
                      f"(the other rule's loop: {other:.2e})")
                if not same < SAME:
                    sys.exit(f"FAIL: {what}: {same:.2e} from PyTorch, want < {SAME}")
                if not other > DIFFERENT:
                    sys.exit(f"FAIL: {what}: the other rule's loop is only "
                             f"{other:.2e} away: the rules do not differ here")
                passed += 1
    print(f"{passed} passed, 0 failed")


main()
