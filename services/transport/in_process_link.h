// Links between stages that run as threads of one process. A sent tensor is
// copied out (as a network link serializes it) and the receiver gets its own
// copy, so each stage's allocator counts exactly the memory it holds.
#ifndef GPIPE_SERVICES_TRANSPORT_IN_PROCESS_LINK_H_
#define GPIPE_SERVICES_TRANSPORT_IN_PROCESS_LINK_H_

#include <memory>
#include <utility>

#include "services/transport/link.h"

namespace gpipe {

// Two connected ends; each direction holds at most `capacity` messages.
std::pair<std::unique_ptr<Link>, std::unique_ptr<Link>> MakeInProcessLinkPair(
    size_t capacity);

}  // namespace gpipe

#endif  // GPIPE_SERVICES_TRANSPORT_IN_PROCESS_LINK_H_
