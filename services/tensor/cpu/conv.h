// Convolution helpers: im2col turns a 2-D convolution into one GEMM.
#ifndef GPIPE_SERVICES_TENSOR_CPU_CONV_H_
#define GPIPE_SERVICES_TENSOR_CPU_CONV_H_

#include <cstdint>

namespace gpipe::cpu {

struct ConvGeometry {
  int64_t channels, height, width;  // input, one sample
  int64_t kernel, stride, padding;
  int64_t out_height() const {
    return (height + 2 * padding - kernel) / stride + 1;
  }
  int64_t out_width() const {
    return (width + 2 * padding - kernel) / stride + 1;
  }
  // Floats of one sample's input, and the shape of its columns (Im2Col):
  // channels x k^2 rows of one float per output position.
  int64_t input_size() const { return channels * height * width; }
  int64_t column_rows() const { return channels * kernel * kernel; }
  int64_t out_positions() const { return out_height() * out_width(); }
};

// col[(c*k + ki)*k + kj, oh*OW + ow] = x[c, oh*s - p + ki, ow*s - p + kj]
// (0 outside the image). `col` has channels*k*k rows of OH*OW; its row
// stride is `ld` so several samples can sit side by side.
void Im2Col(const ConvGeometry& g, const float* x, float* col, int64_t ld);
// The adjoint of Im2Col: accumulates col back into dx (dx is not cleared).
void Col2Im(const ConvGeometry& g, const float* col, int64_t ld, float* dx);

}  // namespace gpipe::cpu

#endif  // GPIPE_SERVICES_TENSOR_CPU_CONV_H_
