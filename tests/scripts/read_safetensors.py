#!/usr/bin/env python3
"""An independent reader of safetensors files, using only the standard library.

It checks a file the way Hugging Face's reader does, without sharing any code
with ours, so a bug in our writer cannot hide behind the same bug in our reader:
  8-byte little-endian header length N, N bytes of UTF-8 JSON, then the data;
  each tensor {"dtype", "shape", "data_offsets": [begin, end]} with
  end - begin == numel * itemsize and the ranges tiling the data exactly.

Usage: read_safetensors.py FILE [--expect-names n1,n2] [--print]
Exits 1 (with a message on stderr) on any inconsistency.
"""

import argparse
import array
import json
import math
import struct
import sys

MAX_HEADER_BYTES = 100_000_000

# dtype -> (itemsize, struct/array code or None when we only check sizes).
DTYPES = {
    "BOOL": (1, "?"), "U8": (1, "B"), "I8": (1, "b"),
    "F8_E5M2": (1, None), "F8_E4M3": (1, None),
    "I16": (2, "h"), "U16": (2, "H"), "F16": (2, "e"), "BF16": (2, None),
    "I32": (4, "i"), "U32": (4, "I"), "F32": (4, "f"),
    "I64": (8, "q"), "U64": (8, "Q"), "F64": (8, "d"),
}


class Inconsistent(Exception):
    pass


def _no_duplicates(pairs):
    out = {}
    for key, value in pairs:
        if key in out:
            raise Inconsistent(f"duplicate key {key!r} in header")
        out[key] = value
    return out


def _reject_constant(name):
    raise Inconsistent(f"non-standard JSON constant {name} in header")


def _is_uint(v):
    # bool is an int in Python; JSON true/false must not pass as 1/0.
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def parse(blob):
    """Returns (metadata, [(name, dtype, shape, data bytes)]) in data order."""
    if len(blob) < 8:
        raise Inconsistent(f"file is {len(blob)} bytes, too short")
    (n,) = struct.unpack("<Q", blob[:8])
    if n > MAX_HEADER_BYTES or n > len(blob) - 8:
        raise Inconsistent(f"header length {n} does not fit a {len(blob)}-byte file")
    try:
        text = blob[8:8 + n].decode("utf-8")
    except UnicodeDecodeError as e:
        raise Inconsistent(f"header is not UTF-8: {e}")
    try:
        header = json.loads(text, object_pairs_hook=_no_duplicates,
                            parse_constant=_reject_constant)
    except json.JSONDecodeError as e:
        raise Inconsistent(f"header is not JSON: {e}")
    if not isinstance(header, dict):
        raise Inconsistent("header is not a JSON object")
    data = blob[8 + n:]

    metadata = header.pop("__metadata__", {})
    if not isinstance(metadata, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
        raise Inconsistent("__metadata__ is not an object of strings")

    entries = []
    for name, info in header.items():
        if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
            raise Inconsistent(f"tensor {name!r}: want exactly dtype, shape, data_offsets")
        dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
        if dtype not in DTYPES:
            raise Inconsistent(f"tensor {name!r}: unknown dtype {dtype!r}")
        if not isinstance(shape, list) or not all(_is_uint(d) for d in shape):
            raise Inconsistent(f"tensor {name!r}: bad shape {shape!r}")
        if (not isinstance(offsets, list) or len(offsets) != 2
                or not all(_is_uint(o) for o in offsets)):
            raise Inconsistent(f"tensor {name!r}: bad data_offsets {offsets!r}")
        begin, end = offsets
        if begin > end or end > len(data):
            raise Inconsistent(f"tensor {name!r}: data_offsets {offsets} out of "
                               f"range for {len(data)} data bytes")
        nbytes = math.prod(shape) * DTYPES[dtype][0]
        if end - begin != nbytes:
            raise Inconsistent(f"tensor {name!r}: data_offsets {offsets} do not "
                               f"match shape {shape} ({nbytes} bytes)")
        entries.append((begin, end, name, dtype, shape))

    entries.sort()
    covered = 0
    for begin, end, name, _, _ in entries:
        if begin != covered:
            raise Inconsistent(f"tensor {name!r} starts at {begin}, expected {covered} "
                               "(gap or overlap)")
        covered = end
    if covered != len(data):
        raise Inconsistent(f"tensors cover {covered} of {len(data)} data bytes")
    return metadata, [(name, dtype, shape, data[begin:end])
                      for begin, end, name, dtype, shape in entries]


def total(dtype, raw):
    """The sum of a tensor's elements: exact for integers, fsum for floats."""
    code = DTYPES[dtype][1]
    if dtype == "BF16":
        # bfloat16 is the high half of a float32.
        halves = array.array("H", raw)
        if sys.byteorder == "big":
            halves.byteswap()
        values = struct.unpack(f"<{len(halves)}f",
                               b"".join(struct.pack("<I", h << 16) for h in halves))
    elif code is None:
        return "n/a"
    elif code in "?e":
        values = struct.unpack(f"<{len(raw) // DTYPES[dtype][0]}{code}", raw)
    else:
        values = array.array(code, raw)
        if sys.byteorder == "big":
            values.byteswap()
    if dtype.startswith(("F", "BF")):
        return repr(math.fsum(values))
    return str(sum(int(v) for v in values))


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file")
    parser.add_argument("--expect-names",
                        help="comma-separated names the file must hold, no more")
    parser.add_argument("--print", action="store_true",
                        help="print each tensor's name, dtype, shape and sum")
    args = parser.parse_args(argv)

    try:
        with open(args.file, "rb") as f:
            blob = f.read()
        metadata, tensors = parse(blob)
        if args.expect_names is not None:
            want = set(filter(None, args.expect_names.split(",")))
            have = {name for name, _, _, _ in tensors}
            if want != have:
                raise Inconsistent(f"names {sorted(have)} differ from expected "
                                   f"{sorted(want)}")
    except (OSError, Inconsistent) as e:
        print(f"read_safetensors.py: {args.file}: {e}", file=sys.stderr)
        return 1

    if args.print:
        for key, value in sorted(metadata.items()):
            print(f"metadata {json.dumps(key)} = {json.dumps(value)}")
        for name, dtype, shape, raw in sorted(tensors):
            print(f"{name} {dtype} {json.dumps(shape)} sum={total(dtype, raw)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
