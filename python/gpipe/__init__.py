"""gpipe from Python: a client of the controller's job API, model files as
numpy arrays, a numpy forward pass from the documented format, and a bridge
to PyTorch (docs in python/README.md).

The job API's messages are generated from proto/ at build time into
<build>/python/gpipe/v1; with that directory's parent on sys.path
(PYTHONPATH=python:build/python) it joins this package.
"""

import pkgutil

__path__ = pkgutil.extend_path(__path__, __name__)


def __getattr__(name):
    # Imported when first used, so reading a model file needs neither gRPC
    # nor the generated messages.
    if name in ("Client", "GpipeError"):
        from gpipe import client
        return getattr(client, name)
    if name in ("load_safetensors", "save_safetensors"):
        from gpipe import safetensors_io
        return getattr(safetensors_io, name)
    if name == "NumpyModel":
        from gpipe.numpy_model import NumpyModel
        return NumpyModel
    if name in ("batch_indices", "epoch_order", "micro_batch_ranges"):
        from gpipe import sampler
        return getattr(sampler, name)
    if name in ("to_torch", "from_torch"):
        from gpipe import torch_bridge
        return getattr(torch_bridge, name)
    raise AttributeError(name)
