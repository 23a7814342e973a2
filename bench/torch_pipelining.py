#!/usr/bin/env python3
"""PyTorch's own multi-process GPipe, torch.distributed.pipelining
(PipelineStage + ScheduleGPipe), on one GPU: one process per stage spawned
with torch.multiprocessing (no torchrun), the model of a job spec (linear,
relu, gelu, tanh, layerNorm, dropout layers), cut by the same balance into
the same stages, the same micro-batches, AdamW as the spec, synthetic inputs.

NCCL refuses two ranks on one GPU, so the stages talk over gloo, which sends
host tensors only: each stage is a PipelineStage on the CPU whose module
moves its input to the GPU, computes there and moves its output back (the
same hops through the host as our --data_plane grpc, and what PyTorch
offers for several stage processes on one GPU).

Usage: torch_pipelining.py SPEC.json --balance 4,4,4,5 [--micro-batches M]
                           [--steps N] [--warmup W]
Prints `ms/step: median X` (rank 0, from a barrier to the end of the step).
"""

import argparse
import inspect
import json
import os
import socket
import statistics
import sys
import time


def build_layers(spec):
    import torch.nn as nn

    acts = {"relu": nn.ReLU, "gelu": nn.GELU, "tanh": nn.Tanh}
    layers = []
    for layer in spec["model"]["layers"]:
        (kind, a), = layer.items()
        if kind == "linear":
            layers.append(nn.Linear(a["inFeatures"], a["outFeatures"]))
        elif kind == "layerNorm":
            layers.append(nn.LayerNorm(a["features"]))
        elif kind == "dropout":
            layers.append(nn.Dropout(a["p"]))
        elif kind in acts:
            layers.append(acts[kind]())
        else:
            raise SystemExit(f"torch_pipelining: layer {kind} is not supported")
    return layers


def run(rank, world, a, port):
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.backends.cuda.matmul.allow_tf32 = False
    spec = json.load(open(a.spec))
    torch.manual_seed(spec.get("seed", 1))
    layers = build_layers(spec)  # the same initial model in every process
    balance = [int(b) for b in a.balance.split(",")]
    lo = sum(balance[:rank])
    hi = lo + balance[rank]
    dev = torch.device("cuda")
    features = spec["model"]["input"]["shape"]["dims"][0]
    batch = spec["batchSize"]
    mb = batch // a.micro_batches
    classes = spec["data"]["synthetic"].get("classes", 10)

    class OnGpu(nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            return self.inner(x.to(dev)).cpu()

    example = torch.randn(mb, features)
    with torch.no_grad():
        for layer in layers[:lo]:
            example = layer(example)
    module = OnGpu(nn.Sequential(*layers[lo:hi]).to(dev))
    kwargs = {}
    if (not a.runtime_shapes and "input_args" in
            inspect.signature(PipelineStage.__init__).parameters):
        kwargs["input_args"] = (example,)
    stage = PipelineStage(module, rank, world, torch.device("cpu"), **kwargs)
    last = rank == world - 1

    def loss_fn(out, target):
        return nn.functional.cross_entropy(out, target)

    schedule = ScheduleGPipe(stage, n_microbatches=a.micro_batches,
                             loss_fn=loss_fn if last else None)
    opt = torch.optim.AdamW(module.parameters(), lr=1e-3, weight_decay=1e-4)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(batch, features, generator=g)
    y = torch.randint(0, classes, (batch,), generator=g)

    def step():
        opt.zero_grad(set_to_none=True)
        if rank == 0:
            schedule.step(x)
        elif last:
            schedule.step(target=y)
        else:
            schedule.step()
        opt.step()
        torch.cuda.synchronize()

    # The timing barriers go through a group of their own, not the one the
    # schedule sends on (torch 2.11 with gloo on an H200 hung after the
    # warm-up steps when they shared it).
    timing = dist.new_group(backend="gloo")
    verbose = os.environ.get("GPIPE_TORCH_PIPE_VERBOSE") == "1"

    def note(what):
        if verbose:
            print(f"rank {rank}: {what}", file=sys.stderr, flush=True)

    for i in range(a.warmup):
        step()
        note(f"warm-up step {i} done")
    secs = []
    for i in range(a.steps):
        dist.barrier(group=timing)
        t = time.perf_counter()
        step()
        dist.barrier(group=timing)  # the step ends when every stage is done
        secs.append(time.perf_counter() - t)
        note(f"step {i} done")
    if rank == 0:
        print(f"ms/step: median {1e3 * statistics.median(secs):.3f} "
              f"(K={world}, M={a.micro_batches}, torch {torch.__version__}, "
              f"gloo between stages)", flush=True)
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("spec")
    p.add_argument("--balance", required=True)
    p.add_argument("--micro-batches", type=int, default=8)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--runtime-shapes", action="store_true",
                   help="no input_args: shapes inferred at the first step")
    a = p.parse_args()
    import torch
    import torch.multiprocessing as mp

    if not torch.cuda.is_available():
        print("SKIP: torch sees no GPU")
        return 0
    try:
        import torch.distributed.pipelining  # noqa: F401
    except ImportError:
        print(f"SKIP: torch {torch.__version__} has no "
              "torch.distributed.pipelining")
        return 0
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    world = len(a.balance.split(","))
    mp.spawn(run, args=(world, a, port), nprocs=world, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
