#include "worker/stage_file_store.h"

namespace gpipe {

gpipe::v1::WorkerMessage CheckpointedReport(const gpipe::v1::Assignment& a,
                                            int64_t step,
                                            const StageFileStore::Stored& s) {
  gpipe::v1::WorkerMessage m;
  gpipe::v1::StageCheckpointed& r = *m.mutable_checkpointed();
  r.set_job_id(a.job_id());
  r.set_epoch(a.epoch());
  r.set_stage(a.stage());
  r.set_step(step);
  r.set_path(s.path);
  r.set_sha256(s.sha256);
  r.set_bytes(s.bytes);
  r.set_layer_begin(a.layer_begin());
  r.set_layer_end(a.layer_end());
  return m;
}

}  // namespace gpipe
