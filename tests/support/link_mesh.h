// In-process links between every pair of a stage's replicas, as the
// replicas' gradient sums and resumes from memory take them.
#ifndef GPIPE_TESTS_SUPPORT_LINK_MESH_H_
#define GPIPE_TESTS_SUPPORT_LINK_MESH_H_

#include <cstddef>
#include <memory>
#include <utility>
#include <vector>

#include "services/transport/in_process_link.h"

namespace gpipe::test_support {

// peers[a][b] is replica a's link to replica b (null for a itself); each
// queues `capacity` messages. The links live as long as the mesh.
struct LinkMesh {
  LinkMesh(int replicas, size_t capacity)
      : peers(replicas, std::vector<Link*>(replicas, nullptr)) {
    for (int a = 0; a < replicas; ++a) {
      for (int b = a + 1; b < replicas; ++b) {
        auto [to_b, to_a] = MakeInProcessLinkPair(capacity);
        peers[a][b] = to_b.get();
        peers[b][a] = to_a.get();
        links.push_back(std::move(to_b));
        links.push_back(std::move(to_a));
      }
    }
  }
  std::vector<std::unique_ptr<Link>> links;
  std::vector<std::vector<Link*>> peers;
};

}  // namespace gpipe::test_support

#endif  // GPIPE_TESTS_SUPPORT_LINK_MESH_H_
