"""safetensors_io: round trips, the C++ writer's layout, malformed files."""

import pathlib
import json
import os
import struct
import sys
import tempfile
import unittest

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                os.pardir))

from gpipe.safetensors_io import load_safetensors, save_safetensors  # noqa


def _raw_file(header, data=b"", length=None):
    """A safetensors file's bytes from a header dict (or raw JSON bytes)."""
    body = header if isinstance(header, bytes) else json.dumps(header).encode()
    n = len(body) if length is None else length
    return struct.pack("<Q", n) + body + data


class SafetensorsTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.path = os.path.join(self.dir.name, "m.safetensors")

    def tearDown(self):
        self.dir.cleanup()

    def write(self, raw):
        with open(self.path, "wb") as f:
            f.write(raw)

    def assert_refused(self, raw, fragment):
        self.write(raw)
        with self.assertRaises(ValueError) as cm:
            load_safetensors(self.path)
        message = str(cm.exception)
        self.assertTrue(message.startswith(self.path + ": "), message)
        self.assertIn(fragment, message)

    def test_round_trip(self):
        tensors = {
            "layers.1.weight": np.arange(12, dtype=np.float32).reshape(3, 4),
            "layers.0.bias": np.array([1.5, -2.25], dtype=np.float32),
            "ids": np.array([[1, -2], [3, 2**31 - 1]], dtype=np.int32),
            "scalar": np.array(7.0, dtype=np.float32),
            "empty": np.zeros((0, 5), dtype=np.float32),
        }
        metadata = {"format": "pt", "gpipe.job": '{"a": "\\u00e9\\n"}',
                    "ünïcode": "välue\t\x01"}
        save_safetensors(self.path, tensors, metadata)
        got, meta = load_safetensors(self.path)
        self.assertEqual(meta, metadata)
        self.assertEqual(sorted(got), sorted(tensors))
        for name, want in tensors.items():
            self.assertEqual(got[name].dtype, want.dtype, name)
            self.assertEqual(got[name].shape, want.shape, name)
            self.assertTrue(got[name].flags.c_contiguous)
            np.testing.assert_array_equal(got[name], want)

    def test_layout_matches_the_cpp_writer(self):
        # Sorted names, data in that order, __metadata__ first, no spaces,
        # padded with spaces to an 8-byte boundary.
        save_safetensors(self.path, {
            "b": np.array([1, 2], dtype=np.int32),
            "a": np.array([0.5], dtype=np.float32),
        }, {"z": "1", "format": "pt"})
        raw = pathlib.Path(self.path).read_bytes()
        (n,) = struct.unpack("<Q", raw[:8])
        self.assertEqual((8 + n) % 8, 0)
        header = raw[8:8 + n]
        want = (b'{"__metadata__":{"format":"pt","z":"1"},'
                b'"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},'
                b'"b":{"dtype":"I32","shape":[2],"data_offsets":[4,12]}}')
        self.assertEqual(header.rstrip(b" "), want)
        self.assertEqual(raw[8 + n:], struct.pack("<f2i", 0.5, 1, 2))

    def test_no_metadata_no_metadata_key(self):
        save_safetensors(self.path, {"a": np.zeros(2, np.float32)})
        raw = pathlib.Path(self.path).read_bytes()
        self.assertNotIn(b"__metadata__", raw)
        self.assertEqual(load_safetensors(self.path)[1], {})

    def test_non_contiguous_and_big_endian_are_written_as_values(self):
        a = np.arange(6, dtype=np.float32).reshape(2, 3).T
        b = np.arange(3, dtype=">i4")
        save_safetensors(self.path, {"a": a, "b": b})
        got, _ = load_safetensors(self.path)
        np.testing.assert_array_equal(got["a"], a)
        np.testing.assert_array_equal(got["b"], b)

    def test_other_dtypes_refused_on_write(self):
        for dtype in (np.float64, np.int64, np.float16, np.uint8, np.bool_):
            with self.assertRaises(ValueError) as cm:
                save_safetensors(self.path, {"t": np.zeros(2, dtype)})
            self.assertIn("'t'", str(cm.exception))
        self.assertFalse(os.path.exists(self.path))

    def test_bad_names_and_metadata_refused_on_write(self):
        x = np.zeros(1, np.float32)
        for tensors, meta in (({"": x}, None), ({"__metadata__": x}, None),
                              ({"a": [1.0]}, None), ({"a": x}, {"k": 1})):
            with self.assertRaises(ValueError):
                save_safetensors(self.path, tensors, meta)

    def test_write_is_atomic_and_leaves_no_temporary(self):
        save_safetensors(self.path, {"a": np.zeros(3, np.float32)})
        with self.assertRaises(ValueError):
            save_safetensors(self.path, {"a": np.zeros(3, np.float64)})
        self.assertEqual(os.listdir(self.dir.name), ["m.safetensors"])
        self.assertEqual(load_safetensors(self.path)[0]["a"].shape, (3,))

    def test_reads_other_dtypes(self):
        data = np.array([1, 2], "<i8").tobytes() + np.array([0.5], "<f8").tobytes()
        self.write(_raw_file({
            "i": {"dtype": "I64", "shape": [2], "data_offsets": [0, 16]},
            "f": {"dtype": "F64", "shape": [], "data_offsets": [16, 24]},
        }, data))
        got, _ = load_safetensors(self.path)
        np.testing.assert_array_equal(got["i"], [1, 2])
        self.assertEqual(got["f"].shape, ())
        self.assertEqual(float(got["f"]), 0.5)

    def test_bf16_refused_by_name(self):
        self.assert_refused(_raw_file(
            {"w": {"dtype": "BF16", "shape": [1], "data_offsets": [0, 2]}},
            b"\0\0"), "BF16")

    def test_truncated_files(self):
        self.assert_refused(b"", "too short")
        self.assert_refused(b"\x10\0\0", "too short")
        good = _raw_file(
            {"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}},
            b"\0" * 8)
        # Cut inside the data: the range no longer fits.
        self.assert_refused(good[:-4], "out of range")
        # Cut inside the header.
        self.assert_refused(good[:20], "truncated")

    def test_bad_header_length(self):
        self.assert_refused(_raw_file({}, length=10**12), "exceeds the limit")
        self.assert_refused(struct.pack("<Q", 50) + b"{}", "more than")

    def test_bad_header_json(self):
        self.assert_refused(_raw_file(b"{not json"), "not valid JSON")
        self.assert_refused(_raw_file(b"[1, 2]"), "not a JSON object")
        self.assert_refused(_raw_file(b'{"a": 1, "a": 2}'), "appears twice")
        self.assert_refused(_raw_file({"__metadata__": {"k": 5}}),
                            "__metadata__")

    def test_bad_entries(self):
        def entry(**kw):
            e = {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}
            e.update(kw)
            return _raw_file({"w": e}, b"\0" * 4)

        self.assert_refused(entry(dtype="F33"), "unknown dtype")
        self.assert_refused(entry(shape=[-1]), '"shape"')
        self.assert_refused(entry(shape=[True]), '"shape"')
        self.assert_refused(entry(shape=[2]), "do not match shape")
        self.assert_refused(entry(data_offsets=[0]), '"data_offsets"')
        self.assert_refused(entry(data_offsets=[4, 0]), "out of range")
        self.assert_refused(entry(extra=1), "unexpected key")
        self.assert_refused(_raw_file({"w": {"dtype": "F32", "shape": [1]}},
                                      b"\0" * 4), "missing")

    def test_range_outside_file(self):
        self.assert_refused(_raw_file(
            {"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}},
            b"\0" * 8), "out of range")

    def test_gaps_and_overlaps(self):
        self.assert_refused(_raw_file({
            "a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
            "b": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]},
        }, b"\0" * 12), "gap")
        self.assert_refused(_raw_file({
            "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
            "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]},
        }, b"\0" * 8), "overlap")
        self.assert_refused(_raw_file({
            "a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
        }, b"\0" * 8), "cover only")


if __name__ == "__main__":
    unittest.main()
