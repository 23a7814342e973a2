#include "worker/controller_file_store.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <optional>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "grpcpp/client_context.h"
#include "services/core/log.h"
#include "services/core/status.h"
#include "services/pipeline/stage_checkpoint.h"
#include "services/storage/manifest.h"
#include "services/storage/safetensors_stream.h"
#include "services/storage/sha256.h"

namespace gpipe {
namespace {

namespace v1 = gpipe::v1;

constexpr size_t kChunkBytes = size_t{1} << 20;
constexpr int kUploadAttempts = 3;

// Generous for a loaded controller, short of forever: a minute plus the
// file at 4 MB/s.
std::chrono::system_clock::time_point TransferDeadline(int64_t bytes) {
  return std::chrono::system_clock::now() + std::chrono::seconds(60) +
         std::chrono::milliseconds(bytes / 4000);
}

absl::Status FromGrpc(const grpc::Status& s, absl::string_view what) {
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      absl::StrCat(what, ": ", s.error_message()));
}

// `attempt` until it succeeds or fails otherwise than UNAVAILABLE, at most
// kUploadAttempts times, 1, 2, 4 ... s apart: only an unreachable
// controller is retried (it may be restarting, or this channel still
// waiting out the reconnect backoff a cut upload left).
template <typename T, typename Attempt>
absl::StatusOr<T> RetryWhileUnavailable(absl::string_view what,
                                        Attempt attempt) {
  absl::Status last;
  for (int i = 0; i < kUploadAttempts; ++i) {
    if (i > 0) std::this_thread::sleep_for(std::chrono::milliseconds(500 << i));
    absl::StatusOr<T> result = attempt();
    if (result.ok() || !absl::IsUnavailable(result.status())) return result;
    last = result.status();
    LogWarning("%s failed (attempt %d of %d): %s", what, i + 1, kUploadAttempts,
               last.ToString());
  }
  return last;
}

}  // namespace

v1::StageFileHeader UploadHeader(const v1::Assignment& a, int64_t step,
                                 bool final, int64_t bytes) {
  v1::StageFileHeader header;
  header.set_job_id(a.job_id());
  header.set_epoch(a.epoch());
  header.set_stage(a.stage());
  header.set_step(step);
  header.set_final(final);
  header.set_bytes(bytes);
  header.set_stream_key(a.stream_key());
  return header;
}

ControllerFileStore::ControllerFileStore(
    std::shared_ptr<grpc::ChannelInterface> channel,
    security::ClientSecurity security)
    : stub_(v1::Controller::NewStub(std::move(channel))),
      security_(std::move(security)) {}

absl::StatusOr<StageFileStore::Stored> ControllerFileStore::SaveCheckpoint(
    const v1::Assignment& a, Stage& stage, int64_t step) {
  return Upload(a, stage, step, /*final=*/false);
}

absl::StatusOr<StageFileStore::Stored> ControllerFileStore::SaveFinal(
    const v1::Assignment& a, Stage& stage) {
  return Upload(a, stage, a.spec().steps(), /*final=*/true);
}

absl::StatusOr<StageFileStore::Stored> ControllerFileStore::Upload(
    const v1::Assignment& a, Stage& stage, int64_t step, bool final) {
  const StageFileContent content =
      final ? FinalParametersContent(stage) : CheckpointContent(stage, step);
  ASSIGN_OR_RETURN(
      SafetensorsEncoder encoder,
      SafetensorsEncoder::Create(content.tensors, content.metadata));
  const std::string what =
      final ? absl::StrCat("uploading stage ", a.stage(), "'s final parameters")
            : absl::StrCat("uploading stage ", a.stage(),
                           "'s checkpoint of step ", step);
  return RetryWhileUnavailable<Stored>(what, [&]() -> absl::StatusOr<Stored> {
    grpc::ClientContext context;
    security_.ApplyTo(&context);
    context.set_deadline(TransferDeadline(encoder.size()));
    v1::UploadStageFileResponse response;
    std::unique_ptr<grpc::ClientWriter<v1::UploadStageFileRequest>> writer =
        stub_->UploadStageFile(&context, &response);
    v1::UploadStageFileRequest message;
    *message.mutable_header() =
        UploadHeader(a, step, final, static_cast<int64_t>(encoder.size()));
    bool open = writer->Write(message);
    storage::Sha256 digest;
    std::string chunk;
    chunk.reserve(kChunkBytes);
    const auto flush = [&] {
      if (chunk.empty() || !open) return;
      message.set_chunk(std::move(chunk));
      open = writer->Write(message);
      chunk = std::move(*message.mutable_chunk());
      chunk.clear();
    };
    absl::Status encoded = encoder.Encode(
        [&](std::string_view bytes) {
          digest.Update(bytes);
          while (!bytes.empty() && open) {
            const size_t n = std::min(kChunkBytes - chunk.size(), bytes.size());
            chunk.append(bytes.data(), n);
            bytes.remove_prefix(n);
            if (chunk.size() == kChunkBytes) flush();
          }
          // A broken stream stops the encoding; Finish says why.
          return open ? absl::OkStatus()
                      : absl::UnavailableError("the upload stream broke");
        },
        kChunkBytes);
    flush();
    const std::string sha256 = digest.Finish();
    if (open && encoded.ok()) {
      message.set_sha256(sha256);
      open = writer->Write(message);
    }
    if (open) writer->WritesDone();
    const grpc::Status finished = writer->Finish();
    if (finished.ok()) {
      if (response.sha256() != sha256 ||
          response.bytes() != static_cast<int64_t>(encoder.size())) {
        return absl::DataLossError(
            absl::StrCat(what, ": the controller kept ", response.bytes(),
                         " bytes with sha256 ", response.sha256(), "; sent ",
                         encoder.size(), " with ", sha256));
      }
      Stored stored;
      stored.path = response.path();
      stored.sha256 = sha256;
      stored.bytes = response.bytes();
      return stored;
    }
    return FromGrpc(finished, what);
  });
}

absl::StatusOr<int64_t> ControllerFileStore::Restore(const v1::Assignment& a,
                                                     Stage& stage) {
  // The controller that assigned the restore is up, but this channel may
  // still be waiting out its reconnect backoff from an upload the
  // controller's restart cut: UNAVAILABLE then means "not yet", and each
  // such failure spent one of the job's restarts.
  return RetryWhileUnavailable<int64_t>(
      absl::StrCat("fetching the checkpoint of step ", a.restore_step(), " of ",
                   a.job_id()),
      [&] { return RestoreOnce(a, stage); });
}

absl::StatusOr<int64_t> ControllerFileStore::RestoreOnce(
    const v1::Assignment& a, Stage& stage) {
  const std::string what =
      absl::StrCat("checkpoint of step ", a.restore_step(), " of ", a.job_id());
  v1::FetchCheckpointRequest request;
  request.set_job_id(a.job_id());
  request.set_epoch(a.epoch());
  request.set_stage(a.stage());
  request.set_stream_key(a.stream_key());
  request.set_step(a.restore_step());
  request.set_layer_begin(a.layer_begin());
  request.set_layer_end(a.layer_end());
  grpc::ClientContext context;
  security_.ApplyTo(&context);
  // The deadline for the whole fetch is set before its size is known: a
  // stage that holds more than a few GB restores on a slow link at its
  // peril, and says so.
  context.set_deadline(TransferDeadline(int64_t{16} << 30));
  std::unique_ptr<grpc::ClientReader<v1::FetchCheckpointResponse>> reader =
      stub_->FetchCheckpoint(&context, request);

  std::optional<v1::CheckpointManifest> manifest;
  std::map<std::string, Tensor> found;
  std::map<std::string, bool> received;  // path -> complete
  std::optional<v1::CheckpointFile> file;
  std::optional<SafetensorsDecoder> decoder;
  storage::Sha256 digest;
  // Checks the file received so far and keeps its tensors.
  const auto finish_file = [&]() -> absl::Status {
    if (!file.has_value()) return absl::OkStatus();
    ASSIGN_OR_RETURN(SafetensorsFile read, decoder->Finish());
    const std::string sha256 = digest.Finish();
    digest = storage::Sha256();
    if (sha256 != file->sha256()) {
      return absl::DataLossError(
          absl::StrCat(what, ": ", file->path(), " arrived with sha256 ",
                       sha256, "; its manifest says ", file->sha256()));
    }
    RETURN_IF_ERROR(
        storage::CheckFileStep(absl::StrCat(what, ": ", file->path()),
                               read.metadata, manifest->step()));
    for (auto& [name, tensor] : read.tensors) {
      found.insert_or_assign(name, std::move(tensor));
    }
    received[file->path()] = true;
    file.reset();
    decoder.reset();
    return absl::OkStatus();
  };
  // On any error the call is cancelled before Finish.
  const auto abandon = [&](absl::Status s) {
    context.TryCancel();
    reader->Finish();
    return s;
  };
  v1::FetchCheckpointResponse message;
  while (reader->Read(&message)) {
    switch (message.kind_case()) {
      case v1::FetchCheckpointResponse::kManifest:
        if (manifest.has_value()) {
          return abandon(absl::DataLossError(
              absl::StrCat(what, ": the controller sent two manifests")));
        }
        manifest = message.manifest();
        if (manifest->step() != a.restore_step()) {
          return abandon(absl::DataLossError(
              absl::StrCat(what, ": the controller sent the manifest of step ",
                           manifest->step())));
        }
        for (const v1::CheckpointFile& f : manifest->files()) {
          if (StageNeedsFile(stage.placement(), f)) received[f.path()] = false;
        }
        break;
      case v1::FetchCheckpointResponse::kFile: {
        if (absl::Status s = finish_file(); !s.ok()) return abandon(s);
        auto it = received.find(message.file().path());
        if (!manifest.has_value() || it == received.end() || it->second) {
          return abandon(absl::DataLossError(
              absl::StrCat(what, ": the controller sent ",
                           message.file().path(), ", not a file it needs")));
        }
        for (const v1::CheckpointFile& f : manifest->files()) {
          if (f.path() == message.file().path()) file = f;
        }
        decoder.emplace(
            static_cast<uint64_t>(std::max<int64_t>(file->bytes(), 0)),
            absl::StrCat(what, ": ", file->path()));
        break;
      }
      case v1::FetchCheckpointResponse::kChunk:
        if (!decoder.has_value()) {
          return abandon(absl::DataLossError(
              absl::StrCat(what, ": bytes before their file's entry")));
        }
        digest.Update(message.chunk());
        if (absl::Status s = decoder->Consume(message.chunk()); !s.ok()) {
          return abandon(s);
        }
        break;
      default:
        return abandon(absl::DataLossError(
            absl::StrCat(what, ": an empty message from the controller")));
    }
  }
  const grpc::Status finished = reader->Finish();
  if (!finished.ok()) {
    return FromGrpc(finished, absl::StrCat("fetching the ", what));
  }
  RETURN_IF_ERROR(finish_file());
  if (!manifest.has_value()) {
    return absl::DataLossError(absl::StrCat(what, ": no manifest arrived"));
  }
  for (const auto& [path, complete] : received) {
    if (!complete) {
      return absl::DataLossError(
          absl::StrCat(what, ": ", path, " did not arrive"));
    }
  }
  RETURN_IF_ERROR(LoadStageState(stage, found, what));
  return manifest->step();
}

}  // namespace gpipe
