// The CUDA IPC plane's ring bookkeeping on the CPU: placement, wrap,
// back-pressure, in-order release, and the reader's checks of every
// descriptor (garbage, truncated, out-of-range, overflowing, replayed).
#include "services/transport/cuda_ipc_ring.h"

#include <cstdint>
#include <limits>
#include <random>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gpipe {
namespace {

using gpipe::v1::ShmSlot;
using ::testing::HasSubstr;

ShmSlot Slot(int64_t offset, int64_t length, int64_t sequence) {
  ShmSlot s;
  s.set_offset(offset);
  s.set_length(length);
  s.set_sequence(sequence);
  return s;
}

TEST(CudaIpcRingTest, PlacesChunksInOrderAndWrapsWhenTheEndIsTooNear) {
  CudaIpcRingWriter w(100);
  CudaIpcRingReader r(100, 50);
  std::optional<ShmSlot> a = w.TryReserve(40);
  std::optional<ShmSlot> b = w.TryReserve(40);
  ASSERT_TRUE(a && b);
  EXPECT_EQ(a->offset(), 0);
  EXPECT_EQ(b->offset(), 40);
  EXPECT_EQ(b->sequence(), 1);
  // 20 bytes are left before the end, too few for 30: the chunk goes to
  // the start, which is still in use.
  EXPECT_FALSE(w.TryReserve(30).has_value());
  ASSERT_TRUE(w.Release(0).ok());
  std::optional<ShmSlot> c = w.TryReserve(30);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->offset(), 0);
  EXPECT_EQ(c->sequence(), 2);
  // The reader derives the same places.
  for (const ShmSlot& s : {*a, *b, *c}) {
    absl::StatusOr<int64_t> at = r.Accept(s);
    ASSERT_TRUE(at.ok()) << at.status();
    EXPECT_EQ(*at, s.offset());
  }
}

TEST(CudaIpcRingTest, AFullRingRefusesUntilReleasedAndReleasesGoInOrder) {
  CudaIpcRingWriter w(64);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(w.TryReserve(16).has_value());
  EXPECT_EQ(w.in_use(), 64);
  EXPECT_FALSE(w.TryReserve(1).has_value());
  EXPECT_FALSE(w.TryReserve(0).has_value());
  EXPECT_FALSE(w.TryReserve(65).has_value());
  absl::Status out_of_order = w.Release(1);
  EXPECT_TRUE(absl::IsInvalidArgument(out_of_order));
  EXPECT_THAT(out_of_order.message(), HasSubstr("oldest in use is 0"));
  EXPECT_EQ(w.in_use(), 64);  // nothing freed by a bad release
  ASSERT_TRUE(w.Release(0).ok());
  EXPECT_TRUE(w.TryReserve(16).has_value());
  EXPECT_TRUE(absl::IsInvalidArgument(w.Release(0)));  // released twice
}

TEST(CudaIpcRingTest, ManyLapsOfRandomSizesAgreeBetweenWriterAndReader) {
  CudaIpcRingWriter w(1 << 16);
  CudaIpcRingReader r(1 << 16, 1 << 15);
  std::mt19937 rng(7);
  std::deque<int64_t> in_flight;
  for (int i = 0; i < 5000; ++i) {
    const int64_t n = 1 + static_cast<int64_t>(rng() % (1 << 15));
    std::optional<ShmSlot> s = w.TryReserve(n);
    while (!s) {
      ASSERT_FALSE(in_flight.empty());
      ASSERT_TRUE(w.Release(in_flight.front()).ok());
      in_flight.pop_front();
      s = w.TryReserve(n);
    }
    ASSERT_LE(s->offset() + s->length(), 1 << 16);
    absl::StatusOr<int64_t> at = r.Accept(*s);
    ASSERT_TRUE(at.ok()) << at.status();
    in_flight.push_back(s->sequence());
  }
}

// Every descriptor a broken or hostile peer might send is refused with
// INVALID_ARGUMENT, and the reader stays where it was.
TEST(CudaIpcRingTest, TheReaderRejectsGarbageDescriptors) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  struct Case {
    const char* what;
    ShmSlot slot;
    const char* message;
  };
  const Case cases[] = {
      {"replayed or skipped", Slot(0, 16, 1), "comes next"},
      {"negative sequence", Slot(0, 16, -1), "comes next"},
      {"empty", Slot(0, 0, 0), "chunk length 0"},
      {"negative length", Slot(0, -16, 0), "chunk length -16"},
      {"longer than a chunk", Slot(0, 600, 0), "is not in (0, 512]"},
      {"negative offset", Slot(-8, 16, 0), "outside the ring"},
      {"past the end", Slot(1020, 16, 0), "outside the ring"},
      {"overflowing", Slot(kMax - 4, 16, 0), "outside the ring"},
      {"overflowing length", Slot(16, kMax, 0), "chunk length"},
      {"not where the writer puts it", Slot(64, 16, 0), "places it at 0"},
  };
  for (const Case& c : cases) {
    CudaIpcRingReader r(1024, 512);
    absl::StatusOr<int64_t> at = r.Accept(c.slot);
    EXPECT_TRUE(absl::IsInvalidArgument(at.status())) << c.what;
    EXPECT_THAT(at.status().message(), HasSubstr(c.message)) << c.what;
    // Still expects chunk 0 at offset 0.
    EXPECT_TRUE(r.Accept(Slot(0, 16, 0)).ok()) << c.what;
  }
  // A replay of an accepted descriptor.
  CudaIpcRingReader r(1024, 512);
  ASSERT_TRUE(r.Accept(Slot(0, 16, 0)).ok());
  EXPECT_TRUE(absl::IsInvalidArgument(r.Accept(Slot(0, 16, 0)).status()));
  EXPECT_TRUE(r.Accept(Slot(16, 16, 1)).ok());
}

}  // namespace
}  // namespace gpipe
