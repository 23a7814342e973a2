"""Client.submit's path resolution: relative data and initFrom paths mean
the base directory, whether the spec names its fields as JSON does
("fashionMnist", "testPath") or as protobuf does ("fashion_mnist")."""

import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                os.pardir))

try:
    from google.protobuf import json_format  # noqa
    from gpipe import client  # noqa
    from gpipe.v1 import job_pb2  # noqa
except ImportError as e:  # grpc or the generated code not installed here
    client = None
    _missing = str(e)


@unittest.skipIf(client is None, "needs grpc and gpipe.v1")
class SpecPathsTest(unittest.TestCase):
    def resolved(self, spec):
        message = json_format.ParseDict(spec, job_pb2.JobSpec())
        client._resolve_paths(message, "/base")
        return message

    def test_json_and_protobuf_names_alike(self):
        for data in ({"fashionMnist": {"dir": "fm"}},
                     {"fashion_mnist": {"dir": "fm"}}):
            self.assertEqual(self.resolved({"data": data}).data.fashion_mnist.dir,
                             "/base/fm")
        for name in ("testPath", "test_path"):
            m = self.resolved({"data": {"csv": {"path": "t.csv",
                                                name: "../v.csv"}}})
            self.assertEqual(m.data.csv.path, "/base/t.csv")
            self.assertEqual(m.data.csv.test_path, "/v.csv")
        for init in ("initFrom", "init_from"):
            m = self.resolved({init: {"path": "run/model.safetensors"}})
            self.assertEqual(m.init_from.path, "/base/run/model.safetensors")

    def test_absolute_and_empty_paths_stay(self):
        m = self.resolved({"data": {"tensors": {"inputs": "/abs/x.npy"}}})
        self.assertEqual(m.data.tensors.inputs, "/abs/x.npy")
        self.assertEqual(m.data.tensors.targets, "")
        self.assertFalse(self.resolved({}).HasField("init_from"))


if __name__ == "__main__":
    unittest.main()
