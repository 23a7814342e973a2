// A weight kept packed for the CPU GEMM's tile (cpu::PackedB) while it is
// unchanged. A Linear layer multiplies every micro-batch of a step by the
// same weight, and at a micro-batch's few rows packing it anew for each
// product costs about as much as the product itself; packed once a step,
// the products skip that. Packing only moves floats: the results are the
// bits Gemm gives on the weight itself.
//
// The weight counts as changed when its storage is another tensor's or was
// handed out for writing since it was packed (Tensor::writes): an
// optimizer step, a restored checkpoint, weights loaded or moved all pack
// it again, with nobody having to say so.
//
// A copy pays only when the weight serves several products before it
// changes. One used once (a step of one micro-batch: a forward and an
// input gradient a step) costs a pass writing the whole copy to memory and
// a cold read back, where the product's own packing works block by block
// in cache: about 1.5 ms a step for a Linear 1024 at batch 256 on one
// thread. So a weight whose last version served fewer than two products is
// multiplied as it is (cpu::Gemm, the same bits) and holds no copy, until
// a version serves two again.
#ifndef GPIPE_SERVICES_TENSOR_PACKED_WEIGHT_H_
#define GPIPE_SERVICES_TENSOR_PACKED_WEIGHT_H_

#include <cstdint>
#include <mutex>

#include "services/tensor/cpu/gemm.h"
#include "services/tensor/tensor.h"

namespace gpipe {

class PackedWeight {
 public:
  // C[m, n] = A[m, k] op(W) on the CPU, C written (not accumulated): op(W)
  // is W^T with `trans` (W [n, k], a Linear's forward) or W (W [k, n], its
  // input gradient). W must be a CPU tensor of k * n floats. With `bias`
  // (n floats), C = A op(W) + bias on every row, added as C is stored.
  void Multiply(bool trans, int64_t m, int64_t n, int64_t k, const float* a,
                const Tensor& w, float* c, const float* bias = nullptr);

  // Packs W for op(W) now unless the copy is current or a copy does not
  // pay (see above), so that the first product after an update does not
  // pay for it (a stage packs in its update, while the stage downstream
  // waits for its first micro-batch).
  void Prepare(bool trans, int64_t n, int64_t k, const Tensor& w);

  // Drops the packed copy (a weight moved off the CPU).
  void Clear();

  // Bytes of the packed copy now held.
  int64_t bytes() const;
  // How many times the weight was packed, and the depth of the products'
  // passes on the copy (cpu::PackedB::depth_block; 0 with none), for tests.
  int64_t packs() const;
  int64_t depth_block() const;

 private:
  // Notes a new version of the weight, deciding whether to keep a copy of
  // it from how many products the last one served.
  void SeeLocked(bool trans, int64_t n, int64_t k, const Tensor& w);
  // Packs for products of `rows` rows (0: any) unless the copy is current.
  // A copy packed for other rows serves as well, the same bits a little
  // slower, until the next version.
  void PackLocked(bool trans, int64_t n, int64_t k, const Tensor& w,
                  int64_t rows);

  // A layer's products run on its stage's thread one at a time; the lock
  // keeps a repack from pulling the floats from under a product anyway.
  mutable std::mutex mu_;
  // The weight's version seen last (kept so its storage is not reused).
  Tensor source_;
  uint64_t source_writes_ = 0;
  bool trans_ = false;
  int64_t n_ = 0, k_ = 0;
  int64_t uses_ = 0;  // products on this version
  // Rows of the last product: a copy is packed for products of as many
  // (cpu::PackedB::Pack's `rows`), since a step's micro-batches are alike.
  int64_t rows_ = 0;
  bool pays_ = true;      // the last version served two or more
  bool current_ = false;  // packed_ holds this version
  cpu::PackedB packed_;
  int64_t packs_ = 0;
};

}  // namespace gpipe

#endif  // GPIPE_SERVICES_TENSOR_PACKED_WEIGHT_H_
