#include "services/tensor/denormals.h"

#include <cstdint>

#if defined(__SSE2__)
#include <pmmintrin.h>
#include <xmmintrin.h>
#endif

namespace gpipe {

#if defined(__SSE2__)
void FlushDenormalsOnThisThread() {
  _MM_SET_FLUSH_ZERO_MODE(_MM_FLUSH_ZERO_ON);
  _MM_SET_DENORMALS_ZERO_MODE(_MM_DENORMALS_ZERO_ON);
}
bool DenormalsFlushedOnThisThread() {
  return _MM_GET_FLUSH_ZERO_MODE() == _MM_FLUSH_ZERO_ON &&
         _MM_GET_DENORMALS_ZERO_MODE() == _MM_DENORMALS_ZERO_ON;
}
#elif defined(__aarch64__)
// FPCR.FZ (bit 24) flushes both inputs and results for single precision.
constexpr uint64_t kFpcrFlushToZero = uint64_t{1} << 24;
void FlushDenormalsOnThisThread() {
  uint64_t fpcr;
  asm volatile("mrs %0, fpcr" : "=r"(fpcr));
  asm volatile("msr fpcr, %0" : : "r"(fpcr | kFpcrFlushToZero));
}
bool DenormalsFlushedOnThisThread() {
  uint64_t fpcr;
  asm volatile("mrs %0, fpcr" : "=r"(fpcr));
  return (fpcr & kFpcrFlushToZero) != 0;
}
#else
void FlushDenormalsOnThisThread() {}
bool DenormalsFlushedOnThisThread() { return false; }
#endif

}  // namespace gpipe
