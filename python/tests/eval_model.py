#!/usr/bin/python3
"""Evaluates a model file with numpy alone, as `gpipectl eval MODEL --json`
does with the C++ product, so a test can compare the two:

    /usr/bin/python3 python/tests/eval_model.py MODEL.safetensors [--max-samples N]

It reads the job from the model file, rebuilds the job's test split
(Fashion-MNIST or a text file), normalizes it as the job did, runs NumpyModel
and prints {"loss": ..., "accuracy": ..., "counted": ...}. Without
--max-samples it takes the job's eval.maxSamples (0: the whole split), as
gpipectl eval does; evaluation uses the split's first N samples.
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                os.pardir))

from gpipe import datasets, job_spec  # noqa: E402
from gpipe.numpy_model import NumpyModel, cross_entropy_totals  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="a model.safetensors gpipe wrote")
    parser.add_argument("--max-samples", "--max_samples", type=int,
                        default=-1, dest="max_samples",
                        help="at most this many test samples (-1: the job's "
                             "eval.maxSamples; 0: the whole split)")
    parser.add_argument("--batch", type=int, default=256,
                        help="samples per forward pass (memory only: the "
                             "figures do not depend on it)")
    args = parser.parse_args(argv)
    try:
        model = NumpyModel.load(args.model)
        max_samples = args.max_samples
        if max_samples < 0:
            max_samples = job_spec.int_field(
                job_spec.field(model.spec, "eval"), "max_samples", "eval")
        x, y = datasets.test_split(model.spec, max_samples)
        loss_sum, correct, counted = 0.0, 0, 0
        for begin in range(0, len(x), max(args.batch, 1)):
            xb = x[begin:begin + args.batch]
            if model.input_dtype == "FLOAT32":
                xb = model.preprocess(xb.reshape((len(xb),)
                                                 + model.input_shape))
            s, c, n = cross_entropy_totals(model.forward(xb),
                                           y[begin:begin + args.batch])
            loss_sum += s
            correct += c
            counted += n
    except ValueError as e:
        print(f"eval_model.py: {e}", file=sys.stderr)
        return 1
    result = {
        "loss": loss_sum / counted if counted else 0.0,
        "accuracy": correct / counted if counted else 0.0,
        "counted": counted,
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
