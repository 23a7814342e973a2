// Links gpipe_metrics and nothing else, and uses it: the stage metrics a
// worker exports must not bring the kernels (OpenBLAS, OpenMP, CUDA) with
// them. tests/scripts/link_deps_test.sh checks this binary's link line and
// its shared libraries, as it does gpipe-controller's.
#include <cstdio>

#include "prometheus/registry.h"
#include "services/pipeline/timeline.h"
#include "services/telemetry/stage_metrics.h"

int main() {
  prometheus::Registry registry;
  gpipe::PipelineMetrics metrics(registry);
  std::shared_ptr<gpipe::StageMetrics> stage =
      metrics.ForStage("probe", 0, /*replica=*/0, 1, 1, /*last=*/true);
  stage->ObserveSend(1024, 0.001);
  stage->SetDataPlane("grpc");
  metrics.Finish("probe", 0);
  std::printf("%zu metric families\n", registry.Collect().size());
  return 0;
}
