#include "services/tensor/cpu/conv.h"

#include <algorithm>

#include "services/tensor/cpu/vector_clones.h"

namespace gpipe::cpu {

namespace {

// The output columns [first, last) whose input column j*stride - padding + kj
// lies inside the image: computed once per kernel column, so the copies
// below have no test per element.
struct ColumnRange {
  int64_t first, last;
};

ColumnRange InsideColumns(const ConvGeometry& g, int64_t kj) {
  const int64_t ow = g.out_width(), s = g.stride, shift = kj - g.padding;
  // j*s + shift >= 0 and j*s + shift <= width - 1.
  const int64_t first =
      shift >= 0 ? 0 : std::min<int64_t>(ow, (-shift + s - 1) / s);
  const int64_t bound = g.width - 1 - shift;
  const int64_t last = bound < 0 ? 0 : std::min<int64_t>(ow, bound / s + 1);
  return {first, std::max(first, last)};
}

// Rows are short (an output row: tens of floats) and there are many: a
// call to memset or memcpy per piece cost more than the copying (a third
// of a CNN step went to memmove), so the pieces are inline vector loops.
[[gnu::always_inline]] inline void Zero(int64_t from, int64_t to, float* out) {
#pragma omp simd
  for (int64_t j = from; j < to; ++j) out[j] = 0.0f;
}

// One row of im2col's output for kernel offset (ki, kj) when the stride is
// 1 and output rows are as wide as input rows (the usual "same" padding):
// the row is then the input plane shifted by one offset, so it is one long
// copy, with the columns that wrapped around an edge zeroed afterwards. Row
// by row, a 14- or 28-float copy ran mostly in the loop's scalar tail.
[[gnu::always_inline]] inline void ShiftedPlane(const ConvGeometry& g,
                                                const float* plane, int64_t ki,
                                                int64_t kj,
                                                const ColumnRange& inside,
                                                float* row) {
  const int64_t oh = g.out_height(), ow = g.out_width();
  // Output rows [i0, i1) read input rows inside the image.
  const int64_t i0 = std::max<int64_t>(0, g.padding - ki);
  const int64_t i1 = std::min<int64_t>(oh, g.height + g.padding - ki);
  if (i0 >= i1) {
    Zero(0, oh * ow, row);
    return;
  }
  const int64_t offset = (ki - g.padding) * g.width + kj - g.padding;
  const int64_t from = i0 * ow + inside.first;
  const int64_t to = (i1 - 1) * ow + inside.last;
  Zero(0, from, row);
#pragma omp simd
  for (int64_t t = from; t < to; ++t) row[t] = plane[t + offset];
  Zero(to, oh * ow, row);
  for (int64_t i = i0; i < i1; ++i) {
    Zero(i * ow, i * ow + inside.first, row);
    Zero(i * ow + inside.last, (i + 1) * ow, row);
  }
}

}  // namespace

GPIPE_VECTOR_CLONES
void Im2Col(const ConvGeometry& g, const float* x, float* col, int64_t ld) {
  const int64_t oh = g.out_height(), ow = g.out_width(), k = g.kernel;
  const int64_t s = g.stride;
  for (int64_t kj = 0; kj < k; ++kj) {
    const ColumnRange inside = InsideColumns(g, kj);
    const int64_t shift = kj - g.padding;
    for (int64_t c = 0; c < g.channels; ++c) {
      const float* plane = x + c * g.height * g.width;
      for (int64_t ki = 0; ki < k; ++ki) {
        float* row = col + ((c * k + ki) * k + kj) * ld;
        if (s == 1 && ow == g.width && inside.first < inside.last) {
          ShiftedPlane(g, plane, ki, kj, inside, row);
          continue;
        }
        for (int64_t i = 0; i < oh; ++i) {
          const int64_t y = i * s - g.padding + ki;
          float* out = row + i * ow;
          if (y < 0 || y >= g.height) {
            Zero(0, ow, out);
            continue;
          }
          const float* in = plane + y * g.width + shift;
          Zero(0, inside.first, out);
          if (s == 1) {
#pragma omp simd
            for (int64_t j = inside.first; j < inside.last; ++j) out[j] = in[j];
          } else {
#pragma omp simd
            for (int64_t j = inside.first; j < inside.last; ++j)
              out[j] = in[j * s];
          }
          Zero(inside.last, ow, out);
        }
      }
    }
  }
}

// Each element of dx gains its terms in the order (ki, kj) of the kernel,
// as a loop over col's rows in order would add them: the loops run kj inside
// ki per channel for that reason.
GPIPE_VECTOR_CLONES
void Col2Im(const ConvGeometry& g, const float* col, int64_t ld, float* dx) {
  const int64_t oh = g.out_height(), ow = g.out_width(), k = g.kernel;
  const int64_t s = g.stride;
  for (int64_t c = 0; c < g.channels; ++c) {
    float* plane = dx + c * g.height * g.width;
    for (int64_t ki = 0; ki < k; ++ki) {
      for (int64_t kj = 0; kj < k; ++kj) {
        const ColumnRange inside = InsideColumns(g, kj);
        const int64_t shift = kj - g.padding;
        const float* row = col + ((c * k + ki) * k + kj) * ld;
        for (int64_t i = 0; i < oh; ++i) {
          const int64_t y = i * s - g.padding + ki;
          if (y < 0 || y >= g.height) continue;
          float* out = plane + y * g.width + shift;
          const float* in = row + i * ow;
          if (s == 1) {
#pragma omp simd
            for (int64_t j = inside.first; j < inside.last; ++j)
              out[j] += in[j];
          } else {
#pragma omp simd
            for (int64_t j = inside.first; j < inside.last; ++j)
              out[j * s] += in[j];
          }
        }
      }
    }
  }
}

}  // namespace gpipe::cpu
