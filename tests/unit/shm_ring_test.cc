// The shared-memory plane's pieces without a network: the ring bookkeeping
// (placement, wrap, back-pressure, in-order release), the reader's checks of
// every descriptor (garbage, truncated, out-of-range, overflowing, replayed),
// the memfd segment (mapped twice in one process through /proc, the nonces
// proving it is the same memory), and the selection rules (modes, bounds,
// host identity).
#include "services/transport/shm_ring.h"

#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <random>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/transport/data_plane.h"
#include "services/transport/shm_channel.h"
#include "services/transport/shm_segment.h"

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

TEST(ShmRingTest, PlacesChunksInOrderAndWrapsWhenTheEndIsTooNear) {
  ShmRingWriter w(100);
  ShmRingReader r(100, 50);
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

TEST(ShmRingTest, AFullRingRefusesUntilReleasedAndReleasesGoInOrder) {
  ShmRingWriter w(64);
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

TEST(ShmRingTest, ManyLapsOfRandomSizesAgreeBetweenWriterAndReader) {
  ShmRingWriter w(1 << 16);
  ShmRingReader r(1 << 16, 1 << 15);
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
TEST(ShmRingTest, TheReaderRejectsGarbageDescriptors) {
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
    ShmRingReader r(1024, 512);
    absl::StatusOr<int64_t> at = r.Accept(c.slot);
    EXPECT_TRUE(absl::IsInvalidArgument(at.status())) << c.what;
    EXPECT_THAT(at.status().message(), HasSubstr(c.message)) << c.what;
    // Still expects chunk 0 at offset 0.
    EXPECT_TRUE(r.Accept(Slot(0, 16, 0)).ok()) << c.what;
  }
  // A replay of an accepted descriptor.
  ShmRingReader r(1024, 512);
  ASSERT_TRUE(r.Accept(Slot(0, 16, 0)).ok());
  EXPECT_TRUE(absl::IsInvalidArgument(r.Accept(Slot(0, 16, 0)).status()));
  EXPECT_TRUE(r.Accept(Slot(16, 16, 1)).ok());
}

TEST(ShmSegmentTest, BothMappingsSeeTheSameBytesAndNonces) {
  absl::StatusOr<std::unique_ptr<ShmSegment>> created =
      ShmSegment::Create(kMinShmRingBytes, 0x1234);
  ASSERT_TRUE(created.ok()) << created.status();
  ShmSegment& a = **created;
  absl::StatusOr<std::unique_ptr<ShmSegment>> opened =
      ShmSegment::OpenPeer(getpid(), a.fd(), kMinShmRingBytes, 0x1234, 0x5678);
  ASSERT_TRUE(opened.ok()) << opened.status();
  ShmSegment& b = **opened;
  EXPECT_EQ(a.answer_nonce(), 0x5678u);
  a.CloseFd();  // both mapped: the memory lives on in the mappings
  std::memcpy(a.ring(ShmSegment::kDownstream), "down", 4);
  std::memcpy(b.ring(ShmSegment::kUpstream), "up", 2);
  EXPECT_EQ(std::memcmp(b.ring(ShmSegment::kDownstream), "down", 4), 0);
  EXPECT_EQ(std::memcmp(a.ring(ShmSegment::kUpstream), "up", 2), 0);

  // Each end writes its own ring and reads the other's.
  ShmChannel up(std::move(*created), /*creator=*/true, 4096);
  ShmChannel down(std::move(*opened), /*creator=*/false, 4096);
  absl::StatusOr<ShmSlot> slot = up.Reserve(5);
  ASSERT_TRUE(slot.ok());
  std::memcpy(up.Data(*slot), "hello", 5);
  absl::StatusOr<const char*> bytes = down.Accept(*slot);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ(std::string(*bytes, 5), "hello");
  EXPECT_TRUE(up.Release(slot->sequence()).ok());
}

TEST(ShmSegmentTest, TheWrongNonceSizeOrDescriptorIsRefused) {
  absl::StatusOr<std::unique_ptr<ShmSegment>> created =
      ShmSegment::Create(kMinShmRingBytes, 42);
  ASSERT_TRUE(created.ok()) << created.status();
  const int fd = (*created)->fd();
  absl::StatusOr<std::unique_ptr<ShmSegment>> s =
      ShmSegment::OpenPeer(getpid(), fd, kMinShmRingBytes, 43, 1);
  EXPECT_TRUE(absl::IsFailedPrecondition(s.status()));
  EXPECT_THAT(s.status().message(), HasSubstr("nonce"));
  s = ShmSegment::OpenPeer(getpid(), fd, 2 * kMinShmRingBytes, 42, 1);
  EXPECT_TRUE(absl::IsFailedPrecondition(s.status()));
  EXPECT_THAT(s.status().message(), HasSubstr("is not a segment of"));
  s = ShmSegment::OpenPeer(getpid(), 9999, kMinShmRingBytes, 42, 1);
  EXPECT_TRUE(absl::IsFailedPrecondition(s.status()));
  EXPECT_THAT(s.status().message(), HasSubstr("cannot open"));
  // Nothing answered the creator.
  EXPECT_EQ((*created)->answer_nonce(), 0u);
}

TEST(ShmChannelTest, AFullRingBlocksTheWriterUntilReleaseOrClose) {
  absl::StatusOr<std::unique_ptr<ShmSegment>> seg =
      ShmSegment::Create(kMinShmRingBytes, 1);
  ASSERT_TRUE(seg.ok());
  ShmChannel ch(std::move(*seg), true, kMinShmRingBytes / 2);
  ASSERT_TRUE(ch.Reserve(kMinShmRingBytes / 2).ok());
  ASSERT_TRUE(ch.Reserve(kMinShmRingBytes / 2).ok());
  std::atomic<bool> got{false};
  std::thread waiter([&] {
    absl::StatusOr<ShmSlot> s = ch.Reserve(100);
    got = s.ok();
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(got.load());  // still blocked: the ring is full
  ASSERT_TRUE(ch.Release(0).ok());
  waiter.join();
  EXPECT_TRUE(got.load());

  std::thread closed([&] {
    absl::StatusOr<ShmSlot> s = ch.Reserve(kMinShmRingBytes / 2);
    EXPECT_TRUE(absl::IsCancelled(s.status()));
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ch.Close(absl::CancelledError("link closed"));
  closed.join();
}

TEST(DataPlaneTest, ModesParseAndBadOnesAreNamed) {
  EXPECT_EQ(*ParseDataPlaneMode("auto"), DataPlaneMode::kAuto);
  EXPECT_EQ(*ParseDataPlaneMode("grpc"), DataPlaneMode::kGrpc);
  EXPECT_EQ(*ParseDataPlaneMode("shm"), DataPlaneMode::kShm);
  absl::StatusOr<DataPlaneMode> bad = ParseDataPlaneMode("SHM");
  EXPECT_TRUE(absl::IsInvalidArgument(bad.status()));
  EXPECT_THAT(bad.status().message(), HasSubstr("not 'SHM'"));
  EXPECT_STREQ(DataPlaneName(DataPlane::kShm), "shm");
}

TEST(DataPlaneTest, RingAndChunkSizesAreBounded) {
  DataPlaneOptions o;
  EXPECT_TRUE(ValidateDataPlaneOptions(o).ok());
  o.ring_bytes = 1000;
  EXPECT_THAT(ValidateDataPlaneOptions(o).message(),
              HasSubstr("--shm_ring_bytes 1000 is outside"));
  o.ring_bytes = int64_t{1} << 40;
  EXPECT_TRUE(absl::IsInvalidArgument(ValidateDataPlaneOptions(o)));
  o = DataPlaneOptions();
  o.chunk_bytes = o.ring_bytes;
  EXPECT_THAT(ValidateDataPlaneOptions(o).message(),
              HasSubstr("at most half the ring"));
}

gpipe::v1::ShmOffer GoodOffer(const HostIdentity& h) {
  gpipe::v1::ShmOffer o;
  o.set_pid(getpid());
  o.set_fd(3);
  o.set_ring_bytes(kMinShmRingBytes);
  o.set_segment_bytes(ShmSegmentBytes(kMinShmRingBytes));
  o.set_nonce(9);
  o.set_boot_id(h.boot_id);
  o.set_ipc_namespace(h.ipc_namespace);
  return o;
}

// Only an offer from this host and IPC namespace, with sizes that add up,
// is worth trying to map; anything else falls back to frames (auto) with
// the reason.
TEST(DataPlaneTest, OffersFromElsewhereOrOfBadSizesAreNotTried) {
  const HostIdentity here = ThisHost();
  ASSERT_FALSE(here.boot_id.empty());
  EXPECT_EQ(OfferMismatch(GoodOffer(here), here), "");
  gpipe::v1::ShmOffer o = GoodOffer(here);
  o.set_boot_id("another-boot");
  EXPECT_THAT(OfferMismatch(o, here), HasSubstr("another host"));
  o = GoodOffer(here);
  o.clear_boot_id();
  EXPECT_THAT(OfferMismatch(o, here), HasSubstr("another host"));
  o = GoodOffer(here);
  o.set_ipc_namespace("ipc:[1]");
  EXPECT_THAT(OfferMismatch(o, here), HasSubstr("another IPC namespace"));
  o = GoodOffer(here);
  o.set_ring_bytes(int64_t{1} << 50);
  EXPECT_THAT(OfferMismatch(o, here), HasSubstr("out of bounds"));
  o = GoodOffer(here);
  o.set_segment_bytes(o.segment_bytes() + 1);
  EXPECT_THAT(OfferMismatch(o, here), HasSubstr("does not hold two rings"));
  o = GoodOffer(here);
  o.set_pid(-1);
  EXPECT_THAT(OfferMismatch(o, here), HasSubstr("no such process"));
}

}  // namespace
}  // namespace gpipe
