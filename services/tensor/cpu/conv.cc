#include "services/tensor/cpu/conv.h"

namespace gpipe::cpu {

void Im2Col(const ConvGeometry& g, const float* x, float* col, int64_t ld) {
  const int64_t oh = g.out_height(), ow = g.out_width(), k = g.kernel;
  for (int64_t c = 0; c < g.channels; ++c) {
    const float* plane = x + c * g.height * g.width;
    for (int64_t ki = 0; ki < k; ++ki) {
      for (int64_t kj = 0; kj < k; ++kj) {
        float* row = col + ((c * k + ki) * k + kj) * ld;
        for (int64_t i = 0; i < oh; ++i) {
          const int64_t y = i * g.stride - g.padding + ki;
          float* out = row + i * ow;
          if (y < 0 || y >= g.height) {
            for (int64_t j = 0; j < ow; ++j) out[j] = 0.0f;
            continue;
          }
          const float* in = plane + y * g.width;
          for (int64_t j = 0; j < ow; ++j) {
            const int64_t xx = j * g.stride - g.padding + kj;
            out[j] = (xx >= 0 && xx < g.width) ? in[xx] : 0.0f;
          }
        }
      }
    }
  }
}

void Col2Im(const ConvGeometry& g, const float* col, int64_t ld, float* dx) {
  const int64_t oh = g.out_height(), ow = g.out_width(), k = g.kernel;
  for (int64_t c = 0; c < g.channels; ++c) {
    float* plane = dx + c * g.height * g.width;
    for (int64_t ki = 0; ki < k; ++ki) {
      for (int64_t kj = 0; kj < k; ++kj) {
        const float* row = col + ((c * k + ki) * k + kj) * ld;
        for (int64_t i = 0; i < oh; ++i) {
          const int64_t y = i * g.stride - g.padding + ki;
          if (y < 0 || y >= g.height) continue;
          float* out = plane + y * g.width;
          const float* in = row + i * ow;
          for (int64_t j = 0; j < ow; ++j) {
            const int64_t xx = j * g.stride - g.padding + kj;
            if (xx >= 0 && xx < g.width) out[xx] += in[j];
          }
        }
      }
    }
  }
}

}  // namespace gpipe::cpu
