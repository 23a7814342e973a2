#!/usr/bin/env python3
"""PyTorch's own GPipe, torch.distributed.pipeline.sync.Pipe, on the model of
bench/cluster_bench.sh: 8 x (Linear W + ReLU) + a 16-class head, cut into two
partitions of 4 blocks (the head on the second), `chunks` micro-batches,
SGD with momentum, on CPU in one process.

Usage: torch_pipe.py [--width 1024] [--batch 256] [--chunks 8] [--steps 40]
                     [--warmup 3] [--threads 2]
Prints `samples/s: N` (median step).
"""

import argparse
import os
import statistics
import time


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--chunks", type=int, default=8)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(a.threads)
    import torch
    import torch.distributed.rpc as rpc
    import torch.nn as nn
    from torch.distributed.pipeline.sync import Pipe

    torch.set_num_threads(a.threads)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    rpc.init_rpc("bench", rank=0, world_size=1)  # Pipe needs the RPC framework

    def blocks(n):
        layers = []
        for _ in range(n):
            layers += [nn.Linear(a.width, a.width), nn.ReLU()]
        return layers

    model = nn.Sequential(nn.Sequential(*blocks(4)),
                          nn.Sequential(*blocks(4), nn.Linear(a.width, 16)))
    pipe = Pipe(model, chunks=a.chunks)
    opt = torch.optim.SGD(pipe.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(a.batch, a.width)
    y = torch.randint(0, 16, (a.batch,))
    times = []
    for step in range(a.warmup + a.steps):
        start = time.perf_counter()
        opt.zero_grad()
        loss = nn.functional.cross_entropy(pipe(x).local_value(), y)
        loss.backward()
        opt.step()
        if step >= a.warmup:
            times.append(time.perf_counter() - start)
    print("partitions: %d, chunks: %d" % (len(pipe.partitions), a.chunks))
    print("samples/s: %.0f" % (a.batch / statistics.median(times)))
    rpc.shutdown()


if __name__ == "__main__":
    main()
