"""Client's TLS and token arguments, as gpipectl takes them: a client
certificate, key or server name without the CA is refused (it was dropped,
and the token sent in the clear), a certificate without its key is refused
(it aborted the process), and a token's surrounding whitespace (a token
file's newline) is not part of it (gRPC refused the header, printing it)."""

import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                os.pardir))

try:
    from gpipe import client  # noqa
except ImportError as e:  # grpc or the generated code not installed here
    client = None
    _missing = str(e)


@unittest.skipIf(client is None, "needs grpc and gpipe.v1")
class ClientTlsTest(unittest.TestCase):
    def test_tls_without_the_ca_is_refused(self):
        with tempfile.NamedTemporaryFile("w", suffix=".pem") as pem:
            pem.write("not read")
            pem.flush()
            for kwargs in ({"tls_cert": pem.name, "tls_key": pem.name},
                           {"tls_server_name": "gpipe-controller"}):
                with self.assertRaises(client.GpipeError) as e:
                    client.Client("127.0.0.1:1", **kwargs)
                self.assertIn("TLS needs tls_ca", str(e.exception))

    def test_a_certificate_without_its_key_is_refused(self):
        with tempfile.NamedTemporaryFile("w", suffix=".pem") as pem:
            with self.assertRaises(client.GpipeError) as e:
                client.Client("127.0.0.1:1", tls_ca=pem.name,
                              tls_cert=pem.name)
            self.assertIn("tls_cert and tls_key go together",
                          str(e.exception))

    def test_a_token_files_newline_is_not_part_of_the_token(self):
        c = client.Client("127.0.0.1:1", token="abc123\n")
        self.assertEqual(c._metadata, (("authorization", "Bearer abc123"),))
        c.close()


if __name__ == "__main__":
    unittest.main()
