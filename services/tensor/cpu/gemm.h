// Dense matrix products on the CPU (row-major), our own blocked GEMM
// (gemm.cc) over the widest register tile the CPU has (gemm_tiles.h). Every
// element of C is one chain of fused multiply-adds over k in order, so
// results are bitwise the same whatever the number of compute threads, the
// CPU's vector width (AVX-512, AVX2 or none) or the number of rows m.
#ifndef GPIPE_SERVICES_TENSOR_CPU_GEMM_H_
#define GPIPE_SERVICES_TENSOR_CPU_GEMM_H_

#include <cstdint>
#include <vector>

#include "services/tensor/cpu/gemm_tiles.h"

namespace gpipe::cpu {

// C[m,n] = alpha * op(A)[m,k] * op(B)[k,n] + beta * C, all row-major and
// packed (leading dimensions follow from the shapes). With alpha = beta = 1
// (accumulating a gradient) each element's chain starts from C's value; with
// beta = 0, C is only written.
void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
          float alpha, const float* a, const float* b, float beta, float* c);

// The same with explicit leading dimensions, for strided sub-matrices.
void GemmStrided(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                 float alpha, const float* a, int64_t lda, const float* b,
                 int64_t ldb, float beta, float* c, int64_t ldc);

// The same on a given tile, for tests and benchmarks that compare tiles:
// every one of SupportedGemmTiles() gives the same bits.
void GemmStridedOn(const GemmTile& tile, bool trans_a, bool trans_b, int64_t m,
                   int64_t n, int64_t k, float alpha, const float* a,
                   int64_t lda, const float* b, int64_t ldb, float beta,
                   float* c, int64_t ldc);

// The products of causal attention, where half of a square operand is
// zeros or half of the result is thrown away: the tiles wholly in the
// half that does not count are not run, or run over part of the depth.
enum class GemmTriangle {
  kFull,
  // Only C[i][j] with j <= i is wanted; the tiles wholly above the diagonal
  // are not computed and C there is left as it was, or partly written.
  kLowerOutput,
  // op(A)[i][p] is zero for p > i: each tile stops its chain past its last
  // row. A chain that starts at +0 and adds products of +-0 never reaches
  // -0, so dropping its zero terms changes no bit: the result is the full
  // product's, bit for bit, wherever op(B) is finite.
  kLowerA,
  // op(A)[i][p] is zero for p < i: each tile starts its chain at its first
  // row. The same bits, for the same reason.
  kUpperA,
};

// C = alpha * op(A) op(B) (beta = 0: C is only written) computing only the
// triangle asked for, otherwise as GemmStrided.
void GemmTriangular(GemmTriangle triangle, bool trans_a, bool trans_b,
                    int64_t m, int64_t n, int64_t k, float alpha,
                    const float* a, int64_t lda, const float* b, int64_t ldb,
                    float* c, int64_t ldc);
void GemmTriangularOn(const GemmTile& tile, GemmTriangle triangle, bool trans_a,
                      bool trans_b, int64_t m, int64_t n, int64_t k,
                      float alpha, const float* a, int64_t lda, const float* b,
                      int64_t ldb, float* c, int64_t ldc);

// op(B) of products packed ahead for the tile Gemm runs, for an operand that
// many products share unchanged (a Linear layer's weight over a step's
// micro-batches). At a micro-batch's few rows, packing B costs as much as
// multiplying; packed once, the products that share it skip that. Packing
// only moves floats, so GemmPackedB gives the bits of the same Gemm.
class PackedB {
 public:
  // op(B) is k x n: B itself, or B^T with trans_b (B then n x k), rows
  // `ldb` floats apart. `rows`, where known, is how many rows of A the
  // products on it will have: the depth of their passes follows from it
  // (a few rows take deeper ones), and the bits from none of it.
  void Pack(bool trans_b, int64_t k, int64_t n, const float* b, int64_t ldb,
            int64_t rows = 0);
  void PackOn(const GemmTile& tile, bool trans_b, int64_t k, int64_t n,
              const float* b, int64_t ldb, int64_t rows = 0);
  // Drops the packed floats (and their memory).
  void Clear() { *this = PackedB(); }

  bool packed() const { return tile_ != nullptr; }
  const GemmTile& tile() const { return *tile_; }
  int64_t k() const { return k_; }
  int64_t n() const { return n_; }
  // The depth of the products' passes over it.
  int64_t depth_block() const { return kc_; }
  const float* data() const { return data_.data(); }
  int64_t bytes() const {
    return static_cast<int64_t>(data_.size() * sizeof(float));
  }

 private:
  const GemmTile* tile_ = nullptr;
  int64_t k_ = 0, n_ = 0, kc_ = 0;
  std::vector<float> data_;
};

// The most bytes PackedB holds for a k x n op(B), on any tile: its columns
// padded to whole slivers.
inline int64_t PackedBBytesBound(int64_t k, int64_t n) {
  return (n + kMaxGemmTileColumns - 1) / kMaxGemmTileColumns *
         kMaxGemmTileColumns * k * static_cast<int64_t>(sizeof(float));
}

// C[m,n] = alpha * A[m,k] * op(B) + beta * C with op(B) packed ahead, A's
// rows `lda` floats apart: the bits of GemmStrided on the same operands.
void GemmPackedB(int64_t m, float alpha, const float* a, int64_t lda,
                 const PackedB& b, float beta, float* c, int64_t ldc);

// C[m,n] = A[m,k] * op(B) + bias, bias[j] added to every row of column j
// as the product stores C: the bits of the product and then a pass adding
// the bias, without the pass. A null bias adds nothing (the plain product).
void GemmAddBias(bool trans_b, int64_t m, int64_t n, int64_t k, const float* a,
                 int64_t lda, const float* b, int64_t ldb, const float* bias,
                 float* c, int64_t ldc);
void GemmPackedBAddBias(int64_t m, const float* a, int64_t lda,
                        const PackedB& b, const float* bias, float* c,
                        int64_t ldc);

// C[m,n] = A[m,k] * W[n,k]^T (a Linear layer's product), named for the
// property incremental decoding relies on: each row of C is a function of
// its row of A alone, so decoding one row where a whole-sequence forward ran
// T agrees bitwise. Every Gemm has it; this says so where it matters.
void GemmRowStable(int64_t m, int64_t n, int64_t k, const float* a,
                   const float* w, float* c);

// Whether an m x n product takes fewer padded register tiles of the tile
// Gemm runs when computed as its n x m transpose. A product whose factors
// are swapped (C^T = op(B)^T op(A)^T) is the same bits: each element is the
// same chain of fused multiply-adds with the two factors exchanged.
bool TransposeFillsTilesBetter(int64_t m, int64_t n);

// The tile Gemm runs on this CPU ("avx512", "avx2", "portable"), for logs.
const char* GemmKernelName();

}  // namespace gpipe::cpu

#endif  // GPIPE_SERVICES_TENSOR_CPU_GEMM_H_
