#!/usr/bin/env python3
"""Checks that two safetensors files hold the same tensors, bit for bit.

Metadata may differ (it records the job spec, which command-line overrides
change). Standard library only. Usage: same_tensors.py A B
"""

import json
import struct
import sys


def tensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    header.pop("__metadata__", None)
    base = 8 + n
    out = {}
    for name, info in header.items():
        begin, end = info["data_offsets"]
        out[name] = (info["dtype"], info["shape"], data[base + begin:base + end])
    return out


def main():
    a, b = tensors(sys.argv[1]), tensors(sys.argv[2])
    if sorted(a) != sorted(b):
        print("different tensor names: %s vs %s" % (sorted(a), sorted(b)))
        return 1
    differing = [name for name in a if a[name] != b[name]]
    if differing:
        print("%d of %d tensors differ, e.g. %s" % (len(differing), len(a), differing[:3]))
        return 1
    print("%d tensors bitwise equal" % len(a))
    return 0


if __name__ == "__main__":
    sys.exit(main())
