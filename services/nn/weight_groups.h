// How many micro-batches' weight halves a trainer groups into one product
// (Layer::BackwardWeights), one rule for the trainers that group and the
// memory model that counts what a group holds.
#ifndef GPIPE_SERVICES_NN_WEIGHT_GROUPS_H_
#define GPIPE_SERVICES_NN_WEIGHT_GROUPS_H_

#include <algorithm>
#include <cstdint>
#include <span>

namespace gpipe {

// What one micro-batch brings to a group, for a layer that groups its
// weight halves: the rows of its product onto the weight gradient, the
// bytes it holds until the group runs (the product's two operands: the
// layer's input and output gradient) and the bytes of the gradients the
// product adds into.
struct WeightGroupCost {
  int64_t rows = 0;
  int64_t held_bytes = 0;
  int64_t gradient_bytes = 0;
};

// A product onto a weight gradient over k rows does k / 4 FLOP for each
// byte of the gradient it reads and writes: 64 at 256 rows, where a 32-row
// micro-batch's 8 is what one core of 200 GFLOP/s needs from 25 GB/s of
// memory with nothing else on the bus. Past 256 rows a group gains little.
constexpr int64_t kWeightGroupRows = 256;
// A group holds its micro-batches' operands for the time between their
// backwards, memory the trainer would not hold otherwise: at most half the
// bytes of the gradients it saves reading. Beside the parameters, their
// gradients, the optimizer's state and (on the CPU) the two packed copies
// of each weight, which every stage holds, that is a tenth or less; and
// layers whose activations outweigh their weights are not grouped.
constexpr int64_t kWeightGroupHeldShare = 2;  // held <= gradients / 2
// Gradients a core's caches keep between one micro-batch's product and the
// next (a megabyte or two of L2 and its share of L3) are not read from
// memory again: grouping them gains nothing.
constexpr int64_t kWeightGroupMinGradientBytes = int64_t{4} << 20;

// Micro-batches to group for layers of these costs (each one micro-batch's):
// enough for kWeightGroupRows rows in the smallest product, no more than the
// held share allows; 1 (no grouping) for none, or for gradients the caches
// keep.
inline int64_t WeightGroupSize(std::span<const WeightGroupCost> layers) {
  int64_t rows = 0, held = 0, gradients = 0;
  for (const WeightGroupCost& c : layers) {
    if (c.rows <= 0) continue;
    rows = rows == 0 ? c.rows : std::min(rows, c.rows);
    held += c.held_bytes;
    gradients += c.gradient_bytes;
  }
  if (rows == 0 || held <= 0 || gradients < kWeightGroupMinGradientBytes)
    return 1;
  const int64_t for_rows = (kWeightGroupRows + rows - 1) / rows;
  const int64_t for_memory = gradients / (kWeightGroupHeldShare * held);
  return std::max<int64_t>(1, std::min(for_rows, for_memory));
}

// A pipeline stage running whole backwards (GPipe, 1F1B, interleaved)
// holds a group's weight halves until its last backward: a group that
// ends before the gradient group does puts its products on the path the
// other stages wait on (the next backward's gradient comes after them).
// A group of all of a gradient group's `per_group` micro-batches ends with
// it: with one gradient group a stage (no more groups than replicas) in the
// drain, where the stages wait anyway; with several, at each group's end,
// where its sum is pushed (not measured). With `size` from
// WeightGroupSize, the group such a stage makes. (Measured on the
// width-1024 MLP at K=2: groups of 7 and 1 of 8 micro-batches made GPipe's
// and 1F1B's steps 4-11% longer, the bubble 13-15% -> 22-26%; one group
// of 4, 2-9% shorter by the medians of two noisy runs.)
inline int64_t WholeBackwardsGroupSize(int64_t size, int64_t per_group) {
  return size >= per_group ? per_group : 1;
}

}  // namespace gpipe

#endif  // GPIPE_SERVICES_NN_WEIGHT_GROUPS_H_
