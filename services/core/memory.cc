#include "services/core/memory.h"

#include <malloc.h>

namespace gpipe {

void KeepFreedMemory() {
  ::mallopt(M_MMAP_THRESHOLD, 256 << 20);
  ::mallopt(M_TRIM_THRESHOLD, 1 << 30);
  ::mallopt(M_ARENA_MAX, 1);
}

void ReleaseFreedMemory() { ::malloc_trim(0); }

}  // namespace gpipe
