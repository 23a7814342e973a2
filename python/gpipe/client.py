"""A client of the gpipe controller's job API (the gRPC service gpipectl
uses): submit a job spec, follow it, fetch its model.

Messages come back as dicts in protobuf's JSON mapping, the same as
`gpipectl ... --json` prints (camelCase keys; 64-bit integers as strings).
"""

import hashlib
import json
import os
import time

import grpc
from google.protobuf import json_format

from gpipe.v1 import controller_pb2, controller_pb2_grpc, job_pb2


class GpipeError(Exception):
    """A call the controller refused or could not serve: `code` is the gRPC
    status name (INVALID_ARGUMENT, NOT_FOUND, ...), `message` says why."""

    def __init__(self, code, message):
        super().__init__("%s: %s" % (code, message))
        self.code = code
        self.message = message


# The spec's paths a worker reads, made absolute against the submitter's
# directory as `gpipectl submit` does: a worker elsewhere would resolve a
# relative one against its own.
# The path fields of each data source, by their protobuf names: resolved on
# the parsed JobSpec, so a spec written with JSON names ("fashionMnist",
# "testPath") or protobuf ones ("fashion_mnist", "test_path") alike.
_PATH_FIELDS = {
    "text": ("path",),
    "tokens": ("path", "test_path"),
    "fashion_mnist": ("dir",),
    "tensors": ("inputs", "targets", "test_inputs", "test_targets"),
    "csv": ("path", "test_path"),
}


# What ListJobs keeps of a spec (controller.proto's ListJobsRequest).
_SUMMARY_SPEC_FIELDS = ("name", "steps", "batchSize", "pipeline")


def _resolve_paths(message, base):
    def absolute(path):
        return path if not path or os.path.isabs(path) else os.path.normpath(
            os.path.join(base, path))

    data = message.data
    for source, fields in _PATH_FIELDS.items():
        if data.HasField(source):
            block = getattr(data, source)
            for field in fields:
                setattr(block, field, absolute(getattr(block, field)))
    if message.HasField("init_from"):
        message.init_from.path = absolute(message.init_from.path)


def _read(path):
    with open(path, "rb") as f:
        return f.read()


_INT64_TYPES = None


def _ints(descriptor, value):
    """The protobuf JSON form's 64-bit integers (strings there, as JSON
    numbers lose precision past 2**53) as Python ints, which have none to
    lose: status["step"] == 30, not "30"."""
    global _INT64_TYPES
    if _INT64_TYPES is None:
        from google.protobuf.descriptor import FieldDescriptor as F
        _INT64_TYPES = {F.TYPE_INT64, F.TYPE_UINT64, F.TYPE_SINT64,
                        F.TYPE_FIXED64, F.TYPE_SFIXED64}
    if not isinstance(value, dict) or \
            descriptor.full_name.startswith("google.protobuf."):
        return value  # a well-known type's own JSON form (a Timestamp's text)
    for field in descriptor.fields:
        key = field.json_name
        if key not in value:
            continue
        if field.message_type is not None:
            entry = field.message_type
            if entry.GetOptions().map_entry:
                inner = entry.fields_by_name["value"]
                if inner.message_type is not None:
                    for v in value[key].values():
                        _ints(inner.message_type, v)
                elif inner.type in _INT64_TYPES:
                    value[key] = {k: int(v) for k, v in value[key].items()}
            elif field.label == field.LABEL_REPEATED:
                for v in value[key]:
                    _ints(entry, v)
            else:
                _ints(entry, value[key])
        elif field.type in _INT64_TYPES:
            if field.label == field.LABEL_REPEATED:
                value[key] = [int(v) for v in value[key]]
            else:
                value[key] = int(value[key])
    return value


def _to_dict(message):
    """The message as protobuf's JSON form with its numbers, strings, enums
    and lists present at their defaults too (stage 0 had no "stage" key;
    an unset message field stays out), and 64-bit integers as ints."""
    try:
        d = json_format.MessageToDict(message,
                                      including_default_value_fields=True)
    except TypeError:  # protobuf 26 and later renamed it
        d = json_format.MessageToDict(
            message, always_print_fields_with_no_presence=True)
    return _ints(message.DESCRIPTOR, d)


class Client:
    """Talks to one controller.

    address: host:port; default $GPIPE_CONTROLLER, else 127.0.0.1:7070.
    tls_ca, tls_cert, tls_key: PEM files for a controller with TLS (the CA
      that signed its certificate; a client certificate and key when it
      asks for one). tls_server_name: the name its certificate carries when
      it is not the host in `address`.
    token: the API token; default $GPIPE_TOKEN.
    timeout: seconds each unary call may take.
    """

    def __init__(self, address=None, *, tls_ca=None, tls_cert=None,
                 tls_key=None, tls_server_name=None, token=None,
                 timeout=10.0):
        self.address = address or os.environ.get("GPIPE_CONTROLLER",
                                                  "127.0.0.1:7070")
        token = token if token is not None else os.environ.get("GPIPE_TOKEN")
        # A token file ends in a newline (make-secrets.sh's do, and a
        # Secret's value keeps it): gRPC refused the header, printing the
        # token. Surrounding whitespace is never part of one, as gpipectl
        # reads it.
        token = token.strip() if token else token
        # As gpipectl refuses them: without the CA, a client certificate,
        # key or server name would be dropped and the token sent in the
        # clear; a certificate without its key aborted the process.
        if (tls_cert or tls_key or tls_server_name) and not tls_ca:
            raise GpipeError(
                "INVALID_ARGUMENT",
                "TLS needs tls_ca: the CA certificate that the controller's "
                "certificate is verified against")
        if bool(tls_cert) != bool(tls_key):
            raise GpipeError(
                "INVALID_ARGUMENT",
                "tls_cert and tls_key go together: a client certificate "
                "and its private key")
        # A controller that restarts is back within seconds: the channel
        # tries to connect once a second, as watch and fetch retry (gRPC's
        # backoff grew to tens of seconds: a watch resumed 20 s after a 3 s
        # restart, and one gave up at 30 s with the controller back at 14).
        options = [("grpc.initial_reconnect_backoff_ms", 1000),
                   ("grpc.max_reconnect_backoff_ms", 1000)]
        if tls_ca:
            credentials = grpc.ssl_channel_credentials(
                root_certificates=_read(tls_ca),
                private_key=_read(tls_key) if tls_key else None,
                certificate_chain=_read(tls_cert) if tls_cert else None)
            if tls_server_name:
                options.append(("grpc.ssl_target_name_override",
                                tls_server_name))
            self._channel = grpc.secure_channel(self.address, credentials,
                                                options)
        else:
            self._channel = grpc.insecure_channel(self.address, options)
        self._stub = controller_pb2_grpc.ControllerStub(self._channel)
        self._metadata = (("authorization", "Bearer " + token),) if token else ()
        self._timeout = timeout

    def close(self):
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _call(self, method, request, timeout=None):
        try:
            return method(request, timeout=timeout or self._timeout,
                          metadata=self._metadata)
        except grpc.RpcError as e:
            raise GpipeError(e.code().name, e.details()) from None

    # ---- Jobs -------------------------------------------------------------

    def submit(self, spec, base_dir=None):
        """Submits a job and returns its id. `spec` is a dict in the JSON
        form of JobSpec, or the path of a JSON file; relative data and
        initFrom paths mean `base_dir` (default: this process's directory).
        The controller validates it: a bad spec raises GpipeError
        INVALID_ARGUMENT naming the field."""
        if isinstance(spec, (str, os.PathLike)):
            with open(spec) as f:
                try:
                    spec = json.load(f)
                except ValueError as e:  # not JSON, or not UTF-8
                    raise GpipeError("INVALID_ARGUMENT",
                                     "%s: job spec: %s" % (spec, e)) from None
        else:
            spec = json.loads(json.dumps(spec))  # ours to change
        try:
            message = json_format.ParseDict(spec, job_pb2.JobSpec())
        except json_format.ParseError as e:
            raise GpipeError("INVALID_ARGUMENT", "job spec: %s" % e) from None
        _resolve_paths(message, base_dir or os.getcwd())
        job = self._call(self._stub.SubmitJob,
                         controller_pb2.SubmitJobRequest(spec=message))
        return job.id

    def job(self, job_id):
        """The whole job: {"id", "spec", "status"}."""
        return _to_dict(self._call(self._stub.GetJob,
                                   controller_pb2.GetJobRequest(job_id=job_id)))

    def status(self, job_id):
        """The job's status: state, step, loss, conditions, evaluation..."""
        return self.job(job_id).get("status", {})

    def jobs(self):
        """Every job the controller keeps, newest first, as summaries: the
        spec's name, steps, batchSize and pipeline only (job(id) has the
        whole spec), and the status without its evaluations."""
        out, token = [], ""
        while True:
            page = self._call(self._stub.ListJobs, controller_pb2.ListJobsRequest(
                page_size=1000, page_token=token))
            for j in page.jobs:
                job = _to_dict(j)
                # The summary leaves the rest of the spec out; filled in at
                # 0 it read as a seed of 0 for a job of seed 1.
                job["spec"] = {k: v for k, v in job.get("spec", {}).items()
                               if k in _SUMMARY_SPEC_FIELDS}
                out.append(job)
            token = page.next_page_token
            if not token:
                return out

    def watch(self, job_id, reconnect_for=30.0):
        """Yields the job's events as they happen ({"time", "job",
        "message"}), and ends after its terminal state.

        A controller that restarts (it keeps its jobs in its store) ends the
        stream UNAVAILABLE or CANCELLED: the watch connects again, once a
        second for up to `reconnect_for` seconds, as `gpipectl watch` does,
        and goes on from the job's state then (its step may go back to a
        checkpoint). Anything else raises GpipeError."""
        connected = False
        lost_since = None
        while True:
            terminal = False
            call = self._stub.WatchJob(
                controller_pb2.WatchJobRequest(job_id=job_id),
                metadata=self._metadata)
            try:
                for event in call:
                    connected = True
                    lost_since = None
                    event = _to_dict(event)
                    yield event
                    state = event.get("job", {}).get("status", {}).get("state")
                    if state in ("SUCCEEDED", "FAILED", "CANCELLED"):
                        terminal = True
                        break
                if terminal:
                    return
                code, details = "UNAVAILABLE", (
                    "the controller ended the watch before the job finished")
            except grpc.RpcError as e:
                code, details = e.code().name, e.details()
            finally:
                call.cancel()  # a consumer that stops early ends the call
            if not connected or code not in ("UNAVAILABLE", "CANCELLED"):
                raise GpipeError(code, details)
            now = time.monotonic()
            if lost_since is None:
                lost_since = now
            if now - lost_since > reconnect_for:
                raise GpipeError(
                    "UNAVAILABLE",
                    "lost the controller at %s for more than %g s while "
                    "watching %s (%s)" % (self.address, reconnect_for,
                                          job_id, details))
            time.sleep(1.0)

    def wait(self, job_id):
        """Follows the job to its end and returns its final status."""
        last = None
        for event in self.watch(job_id):
            last = event
        if last is None:
            return self.status(job_id)
        return last.get("job", {}).get("status", {})

    def cancel(self, job_id):
        return _to_dict(self._call(
            self._stub.CancelJob, controller_pb2.CancelJobRequest(job_id=job_id)))

    def resume(self, job_id, steps=0):
        """Continues a cancelled or failed job from its newest checkpoint
        (with `steps` as its new step count when not 0)."""
        return _to_dict(self._call(
            self._stub.ResumeJob,
            controller_pb2.ResumeJobRequest(job_id=job_id, steps=steps)))

    def delete(self, job_id):
        self._call(self._stub.DeleteJob,
                   controller_pb2.DeleteJobRequest(job_id=job_id))

    def workers(self):
        response = self._call(self._stub.ListWorkers,
                              controller_pb2.ListWorkersRequest())
        return [_to_dict(w) for w in response.workers]

    # ---- Files -------------------------------------------------------------

    def fetch(self, job_id, out_dir=".", step=0, reconnect_for=30.0,
              attempts=None):
        """Downloads the job's model.safetensors (or, with `step`, the files
        of that kept checkpoint) into `out_dir` and returns their paths.
        Each file is written as NAME.part and checked against its length
        and sha256; once the whole stream has ended well, all are renamed
        into place. A download the controller's absence interrupts
        (UNAVAILABLE or CANCELLED: it restarts) is tried again once a
        second for up to `reconnect_for` seconds from the first failure, as
        `watch` rides it out (three tries gave up 3 s into a restart); a
        failed one leaves neither a file nor a folder it made. `attempts`
        (the old limit) is accepted and ignored."""
        made = []  # the folders made for out_dir, deepest first
        path = os.path.abspath(out_dir)
        while not os.path.exists(path):
            made.append(path)
            path = os.path.dirname(path)
        os.makedirs(out_dir, exist_ok=True)
        try:
            lost_since = None  # the first failure of this outage
            while True:
                try:
                    return self._fetch_once(job_id, out_dir, step)
                except GpipeError as e:
                    now = time.monotonic()
                    if lost_since is None:
                        lost_since = now
                    # A restarting controller ends the stream with
                    # CANCELLED as it shuts down, UNAVAILABLE while it is
                    # away, as the watch sees it.
                    if (e.code not in ("UNAVAILABLE", "CANCELLED") or
                            now - lost_since > reconnect_for):
                        raise
                    time.sleep(1.0)
        except BaseException:
            for folder in made:
                try:
                    os.rmdir(folder)  # only when empty
                except OSError:
                    break
            raise

    def _fetch_once(self, job_id, out_dir, step):
        parts = []  # (part, final) of each file checked so far
        current = None  # [name, file, expected bytes, sha256, got bytes]
        request = controller_pb2.FetchModelRequest(job_id=job_id, step=step)
        try:
            for response in self._stub.FetchModel(request,
                                                  metadata=self._metadata):
                kind = response.WhichOneof("kind")
                if kind == "header":
                    name = response.header.name
                    if (not name or os.path.basename(name) != name or
                            name in (".", "..")):
                        raise GpipeError("DATA_LOSS",
                                         "the controller sent a file named %r"
                                         % name)
                    part = os.path.join(out_dir, name + ".part")
                    current = [name, open(part, "wb"), response.header.bytes,
                               hashlib.sha256(), 0]
                elif kind == "chunk" and current is not None:
                    current[1].write(response.chunk)
                    current[3].update(response.chunk)
                    current[4] += len(response.chunk)
                elif kind == "sha256" and current is not None:
                    name, f, expected, digest, got = current
                    f.close()
                    part = os.path.join(out_dir, name + ".part")
                    current = None
                    parts.append((part, os.path.join(out_dir, name)))
                    if got != expected or digest.hexdigest() != response.sha256:
                        raise GpipeError(
                            "DATA_LOSS",
                            "%s: %d of %d bytes, sha256 %s, the controller "
                            "read %s" % (name, got, expected,
                                         digest.hexdigest(), response.sha256))
            if current is not None:
                raise GpipeError("ABORTED", "the stream ended inside %s"
                                 % current[0])
            # All arrived whole: now they take their names, together.
            written = []
            for part, final in parts:
                os.replace(part, final)
                written.append(final)
            parts = []
            return written
        except grpc.RpcError as e:
            raise GpipeError(e.code().name, e.details()) from None
        finally:
            if current is not None:
                current[1].close()
                parts.append((os.path.join(out_dir, current[0] + ".part"),
                              None))
            for part, _ in parts:
                try:
                    os.remove(part)
                except OSError:
                    pass
