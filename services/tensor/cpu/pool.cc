#include "services/tensor/cpu/pool.h"

#include "services/tensor/cpu/vector_clones.h"

namespace gpipe::cpu {

namespace {

// The 2 x 2 windows of stride 2 most CNNs use, one output row at a time:
// the general loop's index arithmetic per candidate cost more than the
// comparisons (1 ns per input float). The candidates are taken in the same
// order with the same test, so the same maximum and index win.
[[gnu::always_inline]] inline void MaxPool2x2Row(const float* r0,
                                                 const float* r1, int32_t at0,
                                                 int32_t at1, int64_t ow,
                                                 float* y, int32_t* argmax) {
#pragma omp simd
  for (int64_t j = 0; j < ow; ++j) {
    float best = r0[2 * j];
    int32_t at = at0 + static_cast<int32_t>(2 * j);
    const float b = r0[2 * j + 1], c = r1[2 * j], d = r1[2 * j + 1];
    if (b > best) {
      best = b;
      at = at0 + static_cast<int32_t>(2 * j + 1);
    }
    if (c > best) {
      best = c;
      at = at1 + static_cast<int32_t>(2 * j);
    }
    if (d > best) {
      best = d;
      at = at1 + static_cast<int32_t>(2 * j + 1);
    }
    y[j] = best;
    argmax[j] = at;
  }
}

}  // namespace

GPIPE_VECTOR_CLONES
void MaxPool2dForward(int64_t planes, int64_t h, int64_t w, int64_t kernel,
                      int64_t stride, const float* x, float* y,
                      int32_t* argmax) {
  const int64_t oh = (h - kernel) / stride + 1, ow = (w - kernel) / stride + 1;
#pragma omp parallel for if (planes * h * w > (1 << 15))
  for (int64_t p = 0; p < planes; ++p) {
    const float* in = x + p * h * w;
    // Rows of fewer outputs than a vector's lanes ran slower through the
    // vector loop's scalar tail (7 a row: 2.5 ms against 1.5 for 256 x 32
    // planes) than through the general loop.
    if (kernel == 2 && stride == 2 && ow >= 8) {
      for (int64_t i = 0; i < oh; ++i) {
        const int64_t o = (p * oh + i) * ow;
        MaxPool2x2Row(in + 2 * i * w, in + (2 * i + 1) * w,
                      static_cast<int32_t>(2 * i * w),
                      static_cast<int32_t>((2 * i + 1) * w), ow, y + o,
                      argmax + o);
      }
      continue;
    }
    for (int64_t i = 0; i < oh; ++i) {
      for (int64_t j = 0; j < ow; ++j) {
        int64_t best = (i * stride) * w + j * stride;
        for (int64_t ki = 0; ki < kernel; ++ki)
          for (int64_t kj = 0; kj < kernel; ++kj) {
            const int64_t at = (i * stride + ki) * w + j * stride + kj;
            if (in[at] > in[best]) best = at;
          }
        const int64_t o = (p * oh + i) * ow + j;
        y[o] = in[best];
        argmax[o] = static_cast<int32_t>(best);
      }
    }
  }
}

void MaxPool2dBackward(int64_t planes, int64_t h, int64_t w, int64_t oh,
                       int64_t ow, const float* dy, const int32_t* argmax,
                       float* dx) {
#pragma omp parallel for if (planes * h * w > (1 << 15))
  for (int64_t p = 0; p < planes; ++p) {
    float* out = dx + p * h * w;
    for (int64_t i = 0; i < h * w; ++i) out[i] = 0.0f;
    for (int64_t o = p * oh * ow; o < (p + 1) * oh * ow; ++o)
      out[argmax[o]] += dy[o];
  }
}

void GlobalAvgPoolForward(int64_t planes, int64_t inner, const float* x,
                          float* y) {
  for (int64_t p = 0; p < planes; ++p) {
    float s = 0.0f;
    for (int64_t i = 0; i < inner; ++i) s += x[p * inner + i];
    y[p] = s / inner;
  }
}

void GlobalAvgPoolBackward(int64_t planes, int64_t inner, const float* dy,
                           float* dx) {
  for (int64_t p = 0; p < planes; ++p) {
    const float g = dy[p] / inner;
    for (int64_t i = 0; i < inner; ++i) dx[p * inner + i] = g;
  }
}

}  // namespace gpipe::cpu
