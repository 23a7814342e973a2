"""torch_bridge: a model file's Sequential computes what NumpyModel does,
and from_torch writes a spec and weights that read back to the same outputs.
Skipped where PyTorch is not installed.
"""

import importlib.util
import json
import os
import sys
import tempfile
import unittest

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                os.pardir))

HAVE_TORCH = importlib.util.find_spec("torch") is not None

if HAVE_TORCH:
    import torch

    from gpipe import torch_bridge
    from gpipe.numpy_model import NumpyModel
    from gpipe.safetensors_io import load_safetensors, save_safetensors


def _as_model_file(path, model_spec, weights_path):
    """A model file from from_torch's spec and initial weights, as gpipectl
    would write it before any step."""
    tensors, _ = load_safetensors(weights_path)
    save_safetensors(path, tensors, {
        "format": "pt", "gpipe.format_version": "1",
        "gpipe.job": json.dumps({"model": model_spec}), "gpipe.step": "0"})


@unittest.skipUnless(HAVE_TORCH, "PyTorch is not installed")
class TorchBridgeTest(unittest.TestCase):
    def setUp(self):
        torch.manual_seed(0)
        self.dir = tempfile.TemporaryDirectory()
        self.weights = os.path.join(self.dir.name, "init.safetensors")
        self.model = os.path.join(self.dir.name, "model.safetensors")

    def tearDown(self):
        self.dir.cleanup()

    def round_trip(self, seq, x):
        """from_torch, then NumpyModel and to_torch on the result; the three
        must agree with `seq` itself."""
        seq.eval()
        with torch.no_grad():
            want = seq(x).numpy()
        spec = torch_bridge.from_torch(seq, x, self.weights)
        _as_model_file(self.model, spec, self.weights)
        got_np = NumpyModel.load(self.model).forward(x.numpy())
        np.testing.assert_allclose(got_np, want, rtol=1e-4, atol=1e-5)
        back = torch_bridge.to_torch(self.model)
        self.assertFalse(back.training)
        with torch.no_grad():
            got_torch = back(x).numpy()
        np.testing.assert_allclose(got_torch, want, rtol=1e-5, atol=1e-6)
        return spec

    def test_mlp(self):
        nn = torch.nn
        seq = nn.Sequential(nn.Linear(6, 8), nn.GELU(), nn.Dropout(0.2),
                            nn.LayerNorm(8, eps=1e-3), nn.Tanh(),
                            nn.BatchNorm1d(8), nn.ReLU(),
                            nn.Linear(8, 3, bias=False))
        # Running statistics that are not the identity.
        seq[5].running_mean.uniform_(-1, 1)
        seq[5].running_var.uniform_(0.5, 2)
        spec = self.round_trip(seq, torch.randn(4, 6))
        self.assertEqual(spec["input"], {"dtype": "FLOAT32",
                                         "shape": {"dims": [6]}})
        self.assertEqual(spec["layers"][7], {"linear": {
            "inFeatures": 8, "outFeatures": 3, "bias": False}})
        names = sorted(load_safetensors(self.weights)[0])
        self.assertIn("layers.5.running_var", names)
        self.assertNotIn("layers.5.num_batches_tracked", names)

    def test_cnn(self):
        nn = torch.nn
        seq = nn.Sequential(
            nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
            nn.MaxPool2d(2), nn.Conv2d(4, 6, 3, stride=2, bias=False),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(6, 10))
        seq[1].running_mean.uniform_(-1, 1)
        spec = self.round_trip(seq, torch.randn(2, 1, 12, 12))
        kinds = [next(iter(layer)) for layer in spec["layers"]]
        self.assertEqual(kinds, ["conv2d", "batchNorm", "relu", "maxPool2d",
                                 "conv2d", "globalAvgPool", "linear"])
        # The pool + flatten pair became one layer: the linear is layer 6.
        self.assertIn("layers.6.weight", load_safetensors(self.weights)[0])

    def test_char_transformer(self):
        m = torch_bridge.modules()
        nn = torch.nn
        seq = nn.Sequential(m.Embedding(11, 16, 8),
                            m.TransformerBlock(16, 4, dropout=0.1),
                            m.SelfAttention(16, 2, causal=False),
                            m.TransformerBlock(16, 2, mlp_hidden=24),
                            nn.LayerNorm(16), nn.Linear(16, 11))
        for p in seq.parameters():  # larger than the 0.02 init, to matter
            p.data.normal_(0, 0.3)
        ids = torch.randint(0, 11, (3, 8))
        spec = self.round_trip(seq, ids)
        self.assertEqual(spec["input"]["dtype"], "INT32")
        self.assertEqual(spec["layers"][2]["selfAttention"]["causal"], False)
        names = load_safetensors(self.weights)[0]
        for name in ("layers.0.token_weight", "layers.1.attn.qkv.weight",
                     "layers.1.mlp.fc2.bias", "layers.2.proj.weight",
                     "layers.3.ln2.weight"):
            self.assertIn(name, names)
        self.assertEqual(names["layers.3.mlp.fc1.weight"].shape, (24, 16))

    def test_causal_attention_matches_multihead_attention(self):
        # The documented equivalence: nn.MultiheadAttention with its in_proj
        # split q, k, v in that order.
        m = torch_bridge.modules()
        attn = m.SelfAttention(8, 2)
        mha = torch.nn.MultiheadAttention(8, 2, batch_first=True)
        with torch.no_grad():
            mha.in_proj_weight.copy_(attn.qkv.weight)
            mha.in_proj_bias.copy_(attn.qkv.bias)
            mha.out_proj.weight.copy_(attn.proj.weight)
            mha.out_proj.bias.copy_(attn.proj.bias)
            x = torch.randn(2, 5, 8)
            mask = torch.ones(5, 5, dtype=torch.bool).triu(1)
            want, _ = mha(x, x, x, attn_mask=mask, need_weights=False)
            torch.testing.assert_close(attn(x), want, rtol=1e-5, atol=1e-6)

    def test_unsupported_module_is_named(self):
        nn = torch.nn
        seq = nn.Sequential(nn.Linear(4, 4), nn.Sigmoid())
        with self.assertRaisesRegex(ValueError, r"module 1 \(Sigmoid\)"):
            torch_bridge.from_torch(seq, torch.randn(2, 4), self.weights)
        seq = nn.Sequential(nn.GELU(approximate="tanh"))
        with self.assertRaisesRegex(ValueError, "exact"):
            torch_bridge.from_torch(seq, torch.randn(2, 4), self.weights)
        self.assertFalse(os.path.exists(self.weights))

    def test_norms_without_learned_parameters_are_refused(self):
        # gpipe's norms learn a weight and a bias: written as ones and zeros,
        # they trained where PyTorch's stay fixed.
        nn = torch.nn
        for seq, flag in [
                (nn.Sequential(nn.Linear(4, 4),
                               nn.LayerNorm(4, elementwise_affine=False)),
                 "elementwise_affine=False"),
                (nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4, affine=False)),
                 "affine=False")]:
            with self.assertRaisesRegex(ValueError,
                                        r"module 1 .*" + flag + ".*not supported"):
                torch_bridge.from_torch(seq, torch.randn(2, 4), self.weights)
        self.assertFalse(os.path.exists(self.weights))


if __name__ == "__main__":
    unittest.main()
