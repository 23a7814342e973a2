"""NumpyModel and its layers against cases computed by hand (or by plain
float64 loops written from docs/model-format.md), the preprocessing groups,
the loss, the job spec's JSON forms and the test splits. Needs no C++ build.
"""

import json
import math
import os
import sys
import tempfile
import unittest

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                os.pardir))

from gpipe import datasets, job_spec  # noqa: E402
from gpipe import numpy_layers as nl  # noqa: E402
from gpipe.numpy_model import (NumpyModel, cross_entropy_totals,  # noqa: E402
                               loss_and_accuracy, normalize)
from gpipe.safetensors_io import save_safetensors  # noqa: E402

F32 = np.float32


def sigmoid(z):
    return 1.0 / (1.0 + math.exp(-z))


def spec_of(input_dtype, dims, layers, data=None):
    spec = {"model": {"input": {"dtype": input_dtype,
                                "shape": {"dims": [str(d) for d in dims]}},
                      "layers": layers,
                      "loss": {"softmaxCrossEntropy": {}}}}
    if data is not None:
        spec["data"] = data
    return spec


class LayerMathTest(unittest.TestCase):
    def test_linear(self):
        x = np.array([[1, 2]], F32)
        w = np.array([[1, 0], [2, -1], [0.5, 0.5]], F32)
        b = np.array([0, 1, -1], F32)
        np.testing.assert_array_equal(nl.linear(x, w, b), [[1, 1, 0.5]])
        np.testing.assert_array_equal(nl.linear(x, w), [[1, 0, 1.5]])

    def test_activations(self):
        x = np.array([-1, 0, 1, 3], F32)
        np.testing.assert_array_equal(nl.relu(x), [0, 0, 1, 3])
        # The exact GELU: x * Phi(x).
        np.testing.assert_allclose(
            nl.gelu(x), [-0.15865525393145707, 0, 0.8413447460685429,
                         2.99595030590511], rtol=1e-7)
        self.assertEqual(nl.gelu(x).dtype, F32)
        np.testing.assert_allclose(nl.tanh(x), np.tanh(x.astype(float)),
                                   rtol=1e-6)

    def test_layer_norm(self):
        x = np.array([[1, 2, 3]], F32)
        w = np.array([1, 2, 1], F32)
        b = np.array([0, 0, 1], F32)
        s = 1 / math.sqrt(2 / 3 + 1e-5)
        np.testing.assert_allclose(nl.layer_norm(x, w, b, F32(1e-5)),
                                   [[-s, 0, s + 1]], rtol=1e-6)

    def test_batch_norm_eval_uses_running_stats_per_channel(self):
        x = np.arange(8, dtype=F32).reshape(1, 2, 2, 2)
        y = nl.batch_norm_eval(x, np.array([1, 2], F32),
                               np.array([0, 1], F32), np.array([1, 4], F32),
                               np.array([4, 1], F32), F32(0))
        want = np.empty_like(x)
        want[0, 0] = (x[0, 0] - 1) / 2
        want[0, 1] = (x[0, 1] - 4) * 2 + 1
        np.testing.assert_allclose(y, want, rtol=1e-6)
        # [B, F] features.
        y = nl.batch_norm_eval(np.array([[3, 3]], F32), np.ones(2, F32),
                               np.zeros(2, F32), np.array([1, 2], F32),
                               np.array([4, 1], F32), F32(0))
        np.testing.assert_allclose(y, [[1, 1]])

    def test_conv2d_against_loops(self):
        rng = np.random.default_rng(0)
        x = rng.standard_normal((2, 3, 5, 6)).astype(F32)
        w = rng.standard_normal((4, 3, 3, 3)).astype(F32)
        b = rng.standard_normal(4).astype(F32)
        for stride, pad in ((1, 0), (2, 1), (1, 2)):
            y = nl.conv2d(x, w, b, stride, pad)
            xp = np.pad(x.astype(float), ((0, 0), (0, 0), (pad, pad),
                                          (pad, pad)))
            oh = (5 + 2 * pad - 3) // stride + 1
            ow = (6 + 2 * pad - 3) // stride + 1
            want = np.zeros((2, 4, oh, ow))
            for n in range(2):
                for o in range(4):
                    for i in range(oh):
                        for j in range(ow):
                            patch = xp[n, :, i * stride:i * stride + 3,
                                       j * stride:j * stride + 3]
                            want[n, o, i, j] = (patch * w[o]).sum() + b[o]
            self.assertEqual(y.shape, want.shape)
            np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
        self.assertEqual(nl.conv2d(x, w, None, 1, 1).dtype, F32)

    def test_max_pool_and_global_avg_pool(self):
        x = np.array([[1, 2, 5, 0],
                      [3, 4, 1, 1],
                      [0, 0, 9, 8],
                      [7, 0, 8, 9]], F32).reshape(1, 1, 4, 4)
        np.testing.assert_array_equal(nl.max_pool2d(x, 2, 2)[0, 0],
                                      [[4, 5], [7, 9]])
        # Overlapping windows; the output size rounds down.
        np.testing.assert_array_equal(nl.max_pool2d(x, 3, 1)[0, 0],
                                      [[9, 9], [9, 9]])
        np.testing.assert_array_equal(nl.max_pool2d(x, 3, 2)[0, 0], [[9]])
        np.testing.assert_allclose(nl.global_avg_pool(x), [[58 / 16]])
        self.assertEqual(nl.flatten(x).shape, (1, 16))

    def test_embedding(self):
        tok = np.array([[0, 0], [1, 10], [2, 20]], F32)
        pos = np.array([[0.5, 0], [0, 0.5], [9, 9]], F32)
        y = nl.embedding(np.array([[2, 1]]), tok, pos)
        np.testing.assert_array_equal(y, [[[2.5, 20], [1, 10.5]]])
        with self.assertRaisesRegex(ValueError, "outside"):
            nl.embedding(np.array([[3]]), tok, pos)

    def _identity_attention(self, x, heads, causal):
        eye = np.eye(2, dtype=F32)
        return nl.self_attention(x, np.concatenate([eye, eye, eye]),
                                 np.zeros(6, F32), eye, np.zeros(2, F32),
                                 heads, causal)

    def test_attention_one_head_two_positions_by_hand(self):
        # q = k = v = x; dh = 2, scale 1/sqrt(2).
        x = np.array([[[1, 0], [0, 1]]], F32)
        p = sigmoid(1 / math.sqrt(2))  # softmax([0, 1/sqrt 2])[1]
        causal = self._identity_attention(x, 1, True)
        # Position 0 sees only itself; position 1 weighs v0 and v1.
        np.testing.assert_allclose(causal, [[[1, 0], [1 - p, p]]], rtol=1e-6)
        full = self._identity_attention(x, 1, False)
        np.testing.assert_allclose(full, [[[p, 1 - p], [1 - p, p]]],
                                   rtol=1e-6)

    def test_attention_heads_are_column_blocks(self):
        # dh = 1: head 0 attends with column 0 only, head 1 with column 1.
        x = np.array([[[1, 0], [0, 1]]], F32)
        y = self._identity_attention(x, 2, True)
        e = math.e
        np.testing.assert_allclose(y, [[[1, 0], [0.5, e / (1 + e)]]],
                                   rtol=1e-6)

    def test_attention_projections_and_q_k_v_order(self):
        # v's rows are the last third of qkv.weight; q and k zero give
        # uniform attention, so position 1 outputs the mean of v0 and v1.
        x = np.array([[[1, 2], [3, 4]]], F32)
        w = np.zeros((6, 2), F32)
        w[4:] = [[1, 0], [0, 1]]
        bias = np.array([0, 0, 0, 0, 10, 0], F32)
        proj = np.array([[0, 1], [1, 0]], F32)  # swaps the two columns
        y = nl.self_attention(x, w, bias, proj, np.array([1, 0], F32), 1,
                              True)
        np.testing.assert_allclose(y, [[[2 + 1, 11], [3 + 1, 12]]], rtol=1e-6)


def _reference_block(x, t, heads):
    """A transformer block in float64 loops, from the doc's formulas."""
    def ln(v, w, b):
        m = v.mean(-1, keepdims=True)
        s = ((v - m) ** 2).mean(-1, keepdims=True)
        return (v - m) / np.sqrt(s + 1e-5) * w + b

    def attn(v):
        n, d = v.shape
        dh = d // heads
        qkv = v @ t["attn.qkv.weight"].T + t["attn.qkv.bias"]
        out = np.zeros((n, d))
        for h in range(heads):
            cols = slice(h * dh, (h + 1) * dh)
            q, k, vv = (qkv[:, cols], qkv[:, d:][:, cols], qkv[:, 2 * d:][:,
                                                                       cols])
            for i in range(n):
                s = np.array([q[i] @ k[j] / math.sqrt(dh)
                              for j in range(i + 1)])
                p = np.exp(s - s.max())
                p /= p.sum()
                out[i, cols] = sum(p[j] * vv[j] for j in range(i + 1))
        return out @ t["attn.proj.weight"].T + t["attn.proj.bias"]

    erf = np.vectorize(math.erf)
    x1 = x + attn(ln(x, t["ln1.weight"], t["ln1.bias"]))
    h = ln(x1, t["ln2.weight"], t["ln2.bias"]) @ t["mlp.fc1.weight"].T \
        + t["mlp.fc1.bias"]
    h = 0.5 * h * (1 + erf(h / math.sqrt(2)))
    return x1 + h @ t["mlp.fc2.weight"].T + t["mlp.fc2.bias"]


def _random_tensors(rng, shapes, prefix):
    return {f"{prefix}{name}": (rng.standard_normal(shape) * 0.5).astype(F32)
            for name, shape in shapes.items()}


class NumpyModelTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.path = os.path.join(self.dir.name, "model.safetensors")
        self.rng = np.random.default_rng(1)

    def tearDown(self):
        self.dir.cleanup()

    def save(self, spec, tensors, extra_metadata=None):
        metadata = {"format": "pt", "gpipe.format_version": "1",
                    "gpipe.job": json.dumps(spec), "gpipe.step": "0"}
        metadata.update(extra_metadata or {})
        save_safetensors(self.path, tensors, metadata)
        return NumpyModel.load(self.path)

    def test_char_transformer_matches_float64_reference(self):
        dim, heads, hidden, vocab, t = 8, 2, 12, 5, 4
        block = {
            "ln1.weight": (dim,), "ln1.bias": (dim,),
            "attn.qkv.weight": (3 * dim, dim), "attn.qkv.bias": (3 * dim,),
            "attn.proj.weight": (dim, dim), "attn.proj.bias": (dim,),
            "ln2.weight": (dim,), "ln2.bias": (dim,),
            "mlp.fc1.weight": (hidden, dim), "mlp.fc1.bias": (hidden,),
            "mlp.fc2.weight": (dim, hidden), "mlp.fc2.bias": (dim,),
        }
        tensors = {}
        tensors.update(_random_tensors(self.rng, {
            "token_weight": (vocab, dim), "position_weight": (6, dim)},
            "layers.0."))
        tensors.update(_random_tensors(self.rng, block, "layers.1."))
        tensors.update(_random_tensors(self.rng, {
            "weight": (vocab, dim), "bias": (vocab,)}, "layers.2."))
        # protobuf JSON: camelCase and int64 as strings; snake_case and
        # numbers are accepted too.
        spec = spec_of("INT32", [t], [
            {"embedding": {"vocabSize": str(vocab), "dim": str(dim),
                           "max_positions": 6}},
            {"transformerBlock": {"dim": str(dim), "heads": heads,
                                  "mlpHidden": str(hidden), "dropout": 0.1}},
            {"linear": {"in_features": dim, "outFeatures": str(vocab)}},
        ])
        model = self.save(spec, tensors)
        ids = np.array([[0, 4, 2, 2], [1, 1, 3, 0]], np.int32)
        logits = model.forward(ids)
        self.assertEqual(logits.shape, (2, t, vocab))
        self.assertEqual(logits.dtype, F32)
        for b in range(2):
            x = (tensors["layers.0.token_weight"][ids[b]].astype(float)
                 + tensors["layers.0.position_weight"][:t])
            blk = {k[len("layers.1."):]: v.astype(float)
                   for k, v in tensors.items() if k.startswith("layers.1.")}
            y = _reference_block(x, blk, heads)
            want = y @ tensors["layers.2.weight"].T + tensors["layers.2.bias"]
            np.testing.assert_allclose(logits[b], want, rtol=1e-4, atol=1e-5)

    def test_cnn_layers_and_shapes(self):
        tensors = {}
        tensors.update(_random_tensors(self.rng, {
            "weight": (3, 1, 3, 3), "bias": (3,)}, "layers.0."))
        tensors.update(_random_tensors(self.rng, {
            "weight": (3,), "bias": (3,), "running_mean": (3,)}, "layers.1."))
        tensors["layers.1.running_var"] = np.array([0.5, 1, 2], F32)
        tensors.update(_random_tensors(self.rng, {
            "weight": (2, 3, 2, 2)}, "layers.4."))
        tensors.update(_random_tensors(self.rng, {
            "weight": (4, 2), "bias": (4,)}, "layers.6."))
        spec = spec_of("FLOAT32", [1, 8, 8], [
            {"conv2d": {"inChannels": "1", "outChannels": "3",
                        "kernelSize": "3", "padding": "1"}},
            {"batchNorm": {"features": "3", "eps": 0.001}},
            {"relu": {}},
            {"maxPool2d": {"kernelSize": "2"}},
            {"conv2d": {"inChannels": "3", "outChannels": "2",
                        "kernelSize": "2", "stride": "2", "bias": False}},
            {"globalAvgPool": {}},
            {"linear": {"inFeatures": "2", "outFeatures": "4"}},
        ])
        model = self.save(spec, tensors)
        self.assertEqual([tuple(l.out_shape) for l in model.layers],
                         [(3, 8, 8), (3, 8, 8), (3, 8, 8), (3, 4, 4),
                          (2, 2, 2), (2,), (4,)])
        x = self.rng.standard_normal((3, 64)).astype(F32)  # [B, 64] reshaped
        y = model.forward(x)
        t = {k: v.astype(float) for k, v in tensors.items()}
        h = nl.conv2d(x.reshape(3, 1, 8, 8), tensors["layers.0.weight"],
                      tensors["layers.0.bias"], 1, 1).astype(float)
        h = ((h - t["layers.1.running_mean"][:, None, None])
             / np.sqrt(t["layers.1.running_var"][:, None, None] + 0.001)
             * t["layers.1.weight"][:, None, None]
             + t["layers.1.bias"][:, None, None])
        h = np.maximum(h, 0).reshape(3, 3, 4, 2, 4, 2).max(axis=(3, 5))
        h = nl.conv2d(h.astype(F32), tensors["layers.4.weight"], None, 2, 0)
        h = h.astype(float).mean(axis=(2, 3))
        want = h @ t["layers.6.weight"].T + t["layers.6.bias"]
        np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)

    def test_mlp_with_dropout_tanh_gelu_layer_norm(self):
        tensors = _random_tensors(self.rng, {"weight": (3, 4)}, "layers.0.")
        tensors.update(_random_tensors(self.rng, {
            "weight": (3,), "bias": (3,)}, "layers.3."))
        spec = spec_of("FLOAT32", [4], [
            {"linear": {"inFeatures": "4", "outFeatures": "3",
                        "bias": False}},
            {"dropout": {"p": 0.5}}, {"tanh": {}},
            {"layerNorm": {"features": "3", "eps": 0.5}}, {"gelu": {}},
        ])
        model = self.save(spec, tensors)
        x = self.rng.standard_normal((2, 4)).astype(F32)
        h = np.tanh(x.astype(float) @ tensors["layers.0.weight"].T)
        m = h.mean(-1, keepdims=True)
        h = ((h - m) / np.sqrt(((h - m) ** 2).mean(-1, keepdims=True) + 0.5)
             * tensors["layers.3.weight"] + tensors["layers.3.bias"])
        want = 0.5 * h * (1 + np.vectorize(math.erf)(h / math.sqrt(2)))
        np.testing.assert_allclose(model(x), want, rtol=1e-5, atol=1e-6)

    def test_load_errors_name_what_is_wrong(self):
        spec = spec_of("FLOAT32", [4], [
            {"linear": {"inFeatures": "4", "outFeatures": "3"}}])
        w = np.zeros((3, 4), F32)
        with self.assertRaisesRegex(ValueError, "missing tensor layers.0.bias"):
            self.save(spec, {"layers.0.weight": w})
        with self.assertRaisesRegex(ValueError, r"layers.0.bias is \[4\]"):
            self.save(spec, {"layers.0.weight": w,
                             "layers.0.bias": np.zeros(4, F32)})
        with self.assertRaisesRegex(ValueError, "layers.7.weight"):
            self.save(spec, {"layers.0.weight": w, "layers.0.bias":
                             np.zeros(3, F32), "layers.7.weight": w})
        with self.assertRaisesRegex(ValueError, "newer"):
            self.save(spec, {"layers.0.weight": w,
                             "layers.0.bias": np.zeros(3, F32)},
                      {"gpipe.format_version": "2"})
        save_safetensors(self.path, {"a": w}, {"format": "pt"})
        with self.assertRaisesRegex(ValueError, "no gpipe.job"):
            NumpyModel.load(self.path)
        bad = spec_of("FLOAT32", [4], [{"softmax": {}}])
        with self.assertRaisesRegex(ValueError, "unknown layer kind"):
            self.save(bad, {})

    def test_input_checks(self):
        spec = spec_of("FLOAT32", [4], [{"relu": {}}])
        model = self.save(spec, {})
        with self.assertRaisesRegex(ValueError, r"\[2, 5\]"):
            model.forward(np.zeros((2, 5), F32))
        spec = spec_of("INT32", [2], [
            {"embedding": {"vocabSize": 2, "dim": 1, "maxPositions": 2}}])
        model = self.save(spec, {
            "layers.0.token_weight": np.zeros((2, 1), F32),
            "layers.0.position_weight": np.zeros((2, 1), F32)})
        with self.assertRaisesRegex(ValueError, "integer token ids"):
            model.forward(np.zeros((1, 2), F32))
        with self.assertRaisesRegex(ValueError, r"model.layers\[0\]"):
            model.forward(np.array([[0, 2]]))


class PreprocessTest(unittest.TestCase):
    def test_groups(self):
        x = np.arange(8, dtype=F32).reshape(1, 2, 2, 2)
        # One pair: the whole sample.
        np.testing.assert_allclose(normalize(x, [1], [2]), (x - 1) / 2)
        # The first dimension: channels of [C, H, W].
        y = normalize(x, [0, 4], [1, 2])
        np.testing.assert_allclose(y[0, 0], x[0, 0])
        np.testing.assert_allclose(y[0, 1], (x[0, 1] - 4) / 2)
        # Each element.
        f = np.array([[1, 2, 3], [4, 5, 6]], F32)
        np.testing.assert_allclose(normalize(f, [1, 2, 3], [1, 2, 3]),
                                   [[0, 0, 0], [3, 1.5, 1]])
        with self.assertRaisesRegex(ValueError, "takes 1"):
            normalize(x, [0, 0, 0], [1, 1, 1])

    def test_float32_subtract_then_divide(self):
        x = np.array([[0.1, 0.7]], F32)
        mean, std = F32(0.2860), F32(0.3530)
        want = (x - mean) / std  # float32 throughout, as PyTorch does
        self.assertEqual(normalize(x, [0.2860], [0.3530]).tobytes(),
                         want.tobytes())

    def test_model_preprocess_from_metadata(self):
        spec = spec_of("FLOAT32", [2], [{"relu": {}}])
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "m.safetensors")
            save_safetensors(path, {}, {
                "gpipe.job": json.dumps(spec),
                "gpipe.preprocessing":
                    '{"normalize": {"mean": [1, 2], "std": [2, 4]}}'})
            model = NumpyModel.load(path)
        np.testing.assert_allclose(model.preprocess(np.array([[3, 3]], F32)),
                                   [[1, 0.25]])


class VocabularyTest(unittest.TestCase):
    def test_the_two_records_must_agree(self):
        spec = spec_of("INT32", [2], [{"relu": {}}])
        spec["data"] = {"text": {"path": "t.txt", "seqLen": 2,
                                 "vocabulary": "CiBh"}}  # b"\n a"
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "m.safetensors")
            metadata = {"gpipe.job": json.dumps(spec),
                        "gpipe.vocabulary": "[10, 32, 97]"}
            save_safetensors(path, {}, metadata)
            self.assertEqual(NumpyModel.load(path).vocabulary, b"\n a")
            metadata["gpipe.vocabulary"] = "[10, 32, 98]"
            save_safetensors(path, {}, metadata)
            with self.assertRaisesRegex(ValueError, "disagree"):
                NumpyModel.load(path).vocabulary
            # The list alone serves a job that recorded none.
            del spec["data"]["text"]["vocabulary"]
            metadata["gpipe.job"] = json.dumps(spec)
            save_safetensors(path, {}, metadata)
            self.assertEqual(NumpyModel.load(path).vocabulary, b"\n b")
            # Read as gpipectl reads it: ascending bytes, or refused.
            metadata["gpipe.vocabulary"] = "[98, 97]"
            save_safetensors(path, {}, metadata)
            with self.assertRaisesRegex(ValueError, "ascending order"):
                NumpyModel.load(path).vocabulary
            metadata["gpipe.vocabulary"] = "[]"
            save_safetensors(path, {}, metadata)
            self.assertIsNone(NumpyModel.load(path).vocabulary)


class LossTest(unittest.TestCase):
    def test_by_hand(self):
        logits = np.array([[0, math.log(3)], [5, 1], [0, 0]], F32)
        loss, acc = loss_and_accuracy(logits, np.array([1, 1, -1]))
        # Row 0: log(1 + 3) - log 3; row 1: log(e^5 + e) - 1; row 2 ignored.
        want = (math.log(4 / 3) + math.log(math.exp(5) + math.e) - 1) / 2
        self.assertAlmostEqual(loss, want, places=6)
        self.assertEqual(acc, 0.5)
        self.assertEqual(cross_entropy_totals(logits, [1, 1, -1])[1:], (1, 2))

    def test_ties_pick_the_first_class_and_per_token(self):
        logits = np.zeros((1, 2, 3), F32)  # [B, T, V]
        loss, acc = loss_and_accuracy(logits, np.array([[0, 2]]))
        self.assertAlmostEqual(loss, math.log(3))
        self.assertEqual(acc, 0.5)

    def test_no_targets_and_bad_targets(self):
        self.assertEqual(loss_and_accuracy(np.zeros((2, 3), F32), [-1, -1]),
                         (0.0, 0.0))
        with self.assertRaisesRegex(ValueError, "outside the 3 classes"):
            loss_and_accuracy(np.zeros((2, 3), F32), [3, -2])


class JobSpecTest(unittest.TestCase):
    def test_field_forms(self):
        p = {"inFeatures": "784", "out_features": 10, "kernelSize": 3.0}
        self.assertEqual(job_spec.int_field(p, "in_features", "x"), 784)
        self.assertEqual(job_spec.int_field(p, "out_features", "x"), 10)
        self.assertEqual(job_spec.int_field(p, "kernel_size", "x"), 3)
        self.assertEqual(job_spec.int_field(p, "stride", "x", 1), 1)
        self.assertEqual(job_spec.camel("max_pool2d"), "maxPool2d")
        with self.assertRaisesRegex(ValueError, "x.a"):
            job_spec.int_field({"a": "seven"}, "a", "x")
        self.assertEqual(job_spec.bytes_field({"vocabulary": "CiBh"},
                                              "vocabulary", "t"), b"\n a")


class DatasetsTest(unittest.TestCase):
    def test_text_split_and_windows(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "t.txt")
            data = b"abcdefghijklmnopqrstuvwxyz0123456789"  # 36 bytes
            with open(path, "wb") as f:
                f.write(data)
            # floor(36 * 0.25) = 9 test bytes: "123456789"... from offset 27.
            x, y = datasets.text_test(path, 4, 0.25)
            vocab = sorted(set(data))
            ids = [vocab.index(b) for b in data[27:]]
            self.assertEqual(x.dtype, np.int32)
            np.testing.assert_array_equal(x, [ids[0:4], ids[4:8]])
            np.testing.assert_array_equal(y, [ids[1:5], ids[5:9]])
            x, _ = datasets.text_test(path, 4, 0.25, max_samples=1)
            self.assertEqual(x.shape, (1, 4))
            # A given vocabulary fixes the ids.
            x, _ = datasets.text_test(path, 4, 0.25, bytes(range(256)))
            self.assertEqual(x[0, 0], ord("1"))

    def test_test_fraction_is_a_float32(self):
        # float32(0.7) is 0.699999988: floor(10 * it) = 6, where the double
        # 0.7 gives 7. The C++ widens the proto's float.
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "t.txt")
            with open(path, "wb") as f:
                f.write(b"abcdefghij")
            x, y = datasets.text_test(path, 1, 0.7)
            self.assertEqual(x.shape, (5, 1))
            self.assertEqual(int(x[0, 0]), 4)  # "e" starts the test split
            # 0 means the default 0.1: 1 test byte, too few for a window.
            with self.assertRaisesRegex(ValueError, "test split has 1"):
                datasets.text_test(path, 1, 0)

    @unittest.skipUnless(os.path.isdir(datasets.FASHION_MNIST_DIR),
                         "Fashion-MNIST is not installed")
    def test_fashion_mnist(self):
        x, y = datasets.fashion_mnist_test(max_samples=5)
        self.assertEqual((x.shape, x.dtype, y.shape), ((5, 784), F32, (5,)))
        self.assertTrue(0 <= x.min() and x.max() <= 1)
        self.assertEqual(x.max(), F32(1))


if __name__ == "__main__":
    unittest.main()
