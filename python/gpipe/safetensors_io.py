"""Reading and writing safetensors files with numpy alone.

The product's model and checkpoint files are safetensors files
(docs/model-format.md). This module reads any well-formed file (so files
written by other tools load too) and writes the exact layout of the C++
writer (services/storage/safetensors_header.cc), so a file written here is
accepted by the C++ ReadSafetensors and is byte-identical to what the product
would write for the same tensors and metadata.
"""

import json
import os
import struct
import tempfile

import numpy as np

# The 8-byte little-endian header length that starts every file.
HEADER_LENGTH_BYTES = 8
# The C++ reader refuses longer headers (kMaxHeaderBytes); so do we, so a
# corrupt length cannot make us allocate gigabytes.
MAX_HEADER_BYTES = 100_000_000

# Every dtype the format defines, with its element size. Knowing the sizes
# of those numpy cannot hold lets us tell a valid file we refuse from a
# corrupt one.
_DTYPE_SIZES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4,
    "F64": 8, "I64": 8, "U64": 8,
}

# The dtypes numpy holds natively; the format stores them little-endian.
_NUMPY_DTYPES = {
    "BOOL": np.dtype(np.bool_),
    "U8": np.dtype("u1"), "I8": np.dtype("i1"),
    "U16": np.dtype("<u2"), "I16": np.dtype("<i2"), "F16": np.dtype("<f2"),
    "U32": np.dtype("<u4"), "I32": np.dtype("<i4"), "F32": np.dtype("<f4"),
    "U64": np.dtype("<u8"), "I64": np.dtype("<i8"), "F64": np.dtype("<f8"),
}

# What save_safetensors writes: the only dtypes the product's tensors hold.
_WRITABLE = {np.dtype(np.float32): "F32", np.dtype(np.int32): "I32"}


def _fail(path, message):
    return ValueError(f"{path}: {message}")


def _no_duplicate_keys(pairs):
    """json object hook: a repeated key is an error, not a silent overwrite
    (the C++ reader refuses it too)."""
    out = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"key {json.dumps(key)} appears twice")
        out[key] = value
    return out


def _is_count(v):
    # bool is an int subclass in Python; JSON true is not a size.
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _parse_entry(path, name, entry, data_size):
    """Checks one tensor's header entry; returns (dtype name, shape, begin, end)."""
    where = f"tensor {json.dumps(name)}"
    if not name:
        raise _fail(path, "empty tensor name")
    if not isinstance(entry, dict):
        raise _fail(path, f"{where}: not an object")
    for key in entry:
        if key not in ("dtype", "shape", "data_offsets"):
            raise _fail(path, f"{where}: unexpected key {json.dumps(key)}")
    for key in ("dtype", "shape", "data_offsets"):
        if key not in entry:
            raise _fail(path, f"{where}: missing {json.dumps(key)}")
    dtype = entry["dtype"]
    if not isinstance(dtype, str):
        raise _fail(path, f'{where}: "dtype" is not a string')
    if dtype not in _DTYPE_SIZES:
        raise _fail(path, f"{where}: unknown dtype {json.dumps(dtype)}")
    shape = entry["shape"]
    if not isinstance(shape, list) or not all(_is_count(d) for d in shape):
        raise _fail(path, f'{where}: "shape" is not an array of '
                          f"non-negative integers: {shape!r}")
    offsets = entry["data_offsets"]
    if (not isinstance(offsets, list) or len(offsets) != 2
            or not all(_is_count(o) for o in offsets)):
        raise _fail(path, f'{where}: "data_offsets" is not an array of two '
                          f"non-negative integers: {offsets!r}")
    begin, end = offsets
    if begin > end or end > data_size:
        raise _fail(path, f"{where}: data_offsets [{begin}, {end}] out of "
                          f"range for a data buffer of {data_size} bytes")
    numel = 1
    for d in shape:
        numel *= d
    want = numel * _DTYPE_SIZES[dtype]
    if want != end - begin:
        raise _fail(path, f"{where}: data_offsets [{begin}, {end}] do not "
                          f"match shape {shape} ({want} bytes of {dtype})")
    return dtype, tuple(shape), begin, end


def _check_layout(path, entries, data_size):
    """The byte ranges must tile the data buffer: no overlap, no gap, nothing
    after the last tensor (as the C++ reader demands)."""
    covered = 0
    previous = None
    for name, (_, _, begin, end) in sorted(
            entries.items(), key=lambda kv: (kv[1][2], kv[1][3])):
        if begin < covered:
            raise _fail(path, f"tensors {json.dumps(previous)} and "
                              f"{json.dumps(name)} overlap")
        if begin > covered:
            raise _fail(path, f"gap in the data buffer: bytes [{covered}, "
                              f"{begin}) belong to no tensor (next is "
                              f"{json.dumps(name)})")
        covered = end
        previous = name
    if covered != data_size:
        raise _fail(path, f"data buffer has {data_size} bytes but the tensors "
                          f"cover only {covered}")


def load_safetensors(path):
    """Reads a safetensors file.

    Returns (tensors, metadata): tensors by name as C-contiguous, writable
    numpy arrays in native byte order, and the ``__metadata__`` dict of
    strings ({} when the file has none). A malformed file, or a dtype numpy
    cannot hold (BF16, F8_*), raises ValueError("PATH: ...").
    """
    path = os.fspath(path)
    with open(path, "rb") as f:
        data = f.read()
    size = len(data)
    if size < HEADER_LENGTH_BYTES:
        raise _fail(path, f"file is {size} bytes, too short for the 8-byte "
                          "header length")
    (n,) = struct.unpack("<Q", data[:HEADER_LENGTH_BYTES])
    if n > MAX_HEADER_BYTES:
        raise _fail(path, f"header length {n} exceeds the limit of "
                          f"{MAX_HEADER_BYTES} bytes")
    if n > size - HEADER_LENGTH_BYTES:
        raise _fail(path, f"header length {n} is more than the "
                          f"{size - HEADER_LENGTH_BYTES} bytes that follow it "
                          "(file truncated?)")
    raw = data[HEADER_LENGTH_BYTES:HEADER_LENGTH_BYTES + n]
    try:
        header = json.loads(raw.decode("utf-8"),
                            object_pairs_hook=_no_duplicate_keys)
    except (UnicodeDecodeError, ValueError) as e:
        raise _fail(path, f"header is not valid JSON: {e}") from None
    if not isinstance(header, dict):
        raise _fail(path, "header is not a JSON object")
    data_start = HEADER_LENGTH_BYTES + n
    data_size = size - data_start

    metadata = header.pop("__metadata__", {})
    if not isinstance(metadata, dict) or not all(
            isinstance(v, str) for v in metadata.values()):
        raise _fail(path, '"__metadata__" is not an object of strings')

    entries = {name: _parse_entry(path, name, entry, data_size)
               for name, entry in header.items()}
    _check_layout(path, entries, data_size)

    tensors = {}
    for name, (dtype, shape, begin, end) in entries.items():
        if dtype not in _NUMPY_DTYPES:
            raise _fail(path, f"tensor {json.dumps(name)}: dtype {dtype} is "
                              "not supported (numpy has no such type)")
        np_dtype = _NUMPY_DTYPES[dtype]
        count = (end - begin) // np_dtype.itemsize
        array = np.frombuffer(data, dtype=np_dtype, count=count,
                              offset=data_start + begin)
        # astype copies: the result owns its memory, is writable and
        # C-contiguous, and is in the machine's byte order.
        tensors[name] = array.astype(np_dtype.newbyteorder("="),
                                     copy=True).reshape(shape)
    return tensors, dict(metadata)


def _json_string(s):
    """A JSON string exactly as the C++ AppendJsonString writes it: only the
    quote, backslash and control characters escaped, UTF-8 kept as is."""
    out = ['"']
    for ch in s:
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        elif ord(ch) < 0x20:
            out.append(f"\\u00{ord(ch):02x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def _utf8_key(s):
    # std::map and std::sort order std::string by their bytes.
    return s.encode("utf-8")


def _check_text(what, s):
    if not isinstance(s, str):
        raise ValueError(f"{what} is a {type(s).__name__}, not a str")
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{what} {s!r} is not valid UTF-8") from None


def encode_header(entries, metadata):
    """The header bytes (length prefix included) the C++ writer produces for
    `entries`, a list of (name, dtype name, shape, begin, end) in data order,
    and `metadata`: `__metadata__` first when not empty, its keys sorted,
    no spaces, then padding with spaces so the data starts 8-byte aligned."""
    parts = []
    if metadata:
        items = sorted(metadata.items(), key=lambda kv: _utf8_key(kv[0]))
        parts.append('"__metadata__":{' + ",".join(
            _json_string(k) + ":" + _json_string(v) for k, v in items) + "}")
    for name, dtype, shape, begin, end in entries:
        parts.append(
            _json_string(name) + ':{"dtype":"' + dtype + '","shape":['
            + ",".join(str(int(d)) for d in shape) + '],"data_offsets":['
            + f"{begin},{end}]}}")
    json_bytes = ("{" + ",".join(parts) + "}").encode("utf-8")
    unaligned = (HEADER_LENGTH_BYTES + len(json_bytes)) % 8
    if unaligned:
        json_bytes += b" " * (8 - unaligned)
    return struct.pack("<Q", len(json_bytes)) + json_bytes


def save_safetensors(path, tensors, metadata=None):
    """Writes `tensors` (name -> float32 or int32 numpy array) and
    `metadata` (str -> str) as a safetensors file in the C++ writer's layout:
    tensors sorted by name, laid out in that order, little-endian.

    The file appears atomically (a temporary file in the same directory,
    then os.replace), so a reader never sees half of it. Other dtypes raise
    ValueError: the product holds only F32 and I32 and would refuse them.
    """
    path = os.fspath(path)
    metadata = {} if metadata is None else metadata
    if not isinstance(metadata, dict):
        raise ValueError(f"{path}: metadata is a {type(metadata).__name__}, "
                         "not a dict of str")
    for key, value in metadata.items():
        _check_text(f"{path}: metadata key", key)
        _check_text(f"{path}: metadata {key!r}", value)
    if not isinstance(tensors, dict):
        raise ValueError(f"{path}: tensors is a {type(tensors).__name__}, "
                         "not a dict of numpy arrays")

    arrays = []
    for name, value in tensors.items():
        _check_text(f"{path}: tensor name", name)
        if not name:
            raise ValueError(f"{path}: empty tensor name")
        if name == "__metadata__":
            raise ValueError(f'{path}: "__metadata__" is reserved and cannot '
                             "name a tensor")
        if not isinstance(value, np.ndarray):
            raise ValueError(f"{path}: tensor {name!r} is a "
                             f"{type(value).__name__}, not a numpy array")
        dtype = _WRITABLE.get(value.dtype.newbyteorder("="))
        if dtype is None:
            raise ValueError(
                f"{path}: tensor {name!r} has dtype {value.dtype}; only "
                "float32 and int32 can be written (convert with "
                ".astype(numpy.float32) or .astype(numpy.int32))")
        # Little-endian, C order, whatever the array's own layout (not
        # ascontiguousarray: it turns a 0-d array into 1-d).
        arrays.append((name, dtype, np.array(
            value, dtype=value.dtype.newbyteorder("<"), order="C",
            copy=False)))
    arrays.sort(key=lambda t: _utf8_key(t[0]))

    entries = []
    offset = 0
    for name, dtype, array in arrays:
        entries.append((name, dtype, array.shape, offset, offset + array.nbytes))
        offset += array.nbytes
    header = encode_header(entries, metadata)

    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".safetensors",
                               dir=directory)
    try:
        # mkstemp makes the file private (0600); a model file is as readable
        # as any other file this process writes.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        with os.fdopen(fd, "wb") as f:
            f.write(header)
            for _, _, array in arrays:
                f.write(array.tobytes(order="C"))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
