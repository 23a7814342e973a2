#include "services/transport/shm_ring.h"

#include <iterator>

#include "absl/strings/str_cat.h"

namespace gpipe {
ShmRingWriter::ShmRingWriter(int64_t capacity, int64_t max_in_use)
    : capacity_(capacity / kShmAlignment * kShmAlignment),
      max_in_use_(max_in_use) {
  if (capacity_ > 0) free_[0] = capacity_;
}

std::optional<ShmChunk> ShmRingWriter::TryReserve(int64_t length) {
  if (length <= 0 || length > capacity_) return std::nullopt;
  if (chunks_in_use() >= max_in_use_) return std::nullopt;
  const int64_t need = ShmAlignUp(length);
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < need) continue;
    const int64_t offset = it->first, left = it->second - need;
    free_.erase(it);
    if (left > 0) free_[offset + need] = left;
    ShmChunk c;
    c.sequence = next_sequence_++;
    c.offset = offset;
    c.length = length;
    used_[c.sequence] = {offset, need};
    bytes_in_use_ += need;
    return c;
  }
  return std::nullopt;
}

absl::Status ShmRingWriter::Release(int64_t sequence) {
  auto u = used_.find(sequence);
  if (u == used_.end()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shared memory: release of chunk ", sequence, ", which is not in use (",
        used_.empty() ? std::string("none is")
                      : absl::StrCat(used_.size(), " are"),
        ")"));
  }
  int64_t offset = u->second.offset, length = u->second.length;
  bytes_in_use_ -= length;
  used_.erase(u);
  // Coalesce with the free neighbours, so a large chunk fits again.
  auto next = free_.lower_bound(offset);
  if (next != free_.end() && next->first == offset + length) {
    length += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == offset) {
      offset = prev->first;
      length += prev->second;
      free_.erase(prev);
    }
  }
  free_[offset] = length;
  return absl::OkStatus();
}

ShmRingReader::ShmRingReader(int64_t capacity, int64_t max_chunk,
                             int64_t max_in_use)
    : capacity_(capacity), max_chunk_(max_chunk), max_in_use_(max_in_use) {}

absl::Status ShmRingReader::Accept(const ShmChunk& c) {
  if (c.sequence != next_sequence_) {
    return absl::InvalidArgumentError(
        absl::StrCat("shared memory: descriptor of chunk ", c.sequence,
                     " where chunk ", next_sequence_, " comes next"));
  }
  if (c.length <= 0 || c.length > max_chunk_) {
    return absl::InvalidArgumentError(
        absl::StrCat("shared memory: chunk length ", c.length,
                     " is not in (0, ", max_chunk_, "]"));
  }
  // Written so that no sum can overflow: length is in (0, max_chunk].
  if (c.offset < 0 || c.offset > capacity_ - c.length) {
    return absl::InvalidArgumentError(
        absl::StrCat("shared memory: chunk [", c.offset, ", +", c.length,
                     ") lies outside the ring of ", capacity_, " bytes"));
  }
  if (c.offset % kShmAlignment != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("shared memory: chunk at offset ", c.offset,
                     " is not aligned to ", kShmAlignment, " bytes"));
  }
  if (c.header_bytes <= 0 || c.header_bytes > c.length ||
      c.header_bytes > kMaxShmHeaderBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("shared memory: chunk ", c.sequence, " announces ",
                     c.header_bytes, " header bytes in a chunk of ", c.length,
                     " (at most ", kMaxShmHeaderBytes, ")"));
  }
  if (chunks_in_use() >= max_in_use_) {
    return absl::InvalidArgumentError(
        absl::StrCat("shared memory: chunk ", c.sequence, " posted while ",
                     max_in_use_, " chunks are still in use"));
  }
  const int64_t end = c.offset + c.length;
  auto next = by_offset_.lower_bound(c.offset);
  const bool hits_next = next != by_offset_.end() && next->first < end;
  const bool hits_prev =
      next != by_offset_.begin() && std::prev(next)->second > c.offset;
  if (hits_next || hits_prev) {
    return absl::InvalidArgumentError(
        absl::StrCat("shared memory: chunk ", c.sequence, " [", c.offset, ", +",
                     c.length, ") overlaps a chunk still in use"));
  }
  by_offset_[c.offset] = end;
  by_sequence_[c.sequence] = c.offset;
  ++next_sequence_;
  return absl::OkStatus();
}

absl::Status ShmRingReader::Release(int64_t sequence) {
  auto s = by_sequence_.find(sequence);
  if (s == by_sequence_.end()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shared memory: chunk ", sequence, " given back but not in use"));
  }
  by_offset_.erase(s->second);
  by_sequence_.erase(s);
  return absl::OkStatus();
}

}  // namespace gpipe
