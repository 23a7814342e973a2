// The shared-memory plane's pieces without a network: the ring bookkeeping
// (first-fit placement, back-pressure, releases in any order, coalescing),
// the reader's checks of every posted chunk (garbage, out-of-range,
// overflowing, misaligned, replayed, overlapping one still in use), the
// memfd segment (mapped twice in one process through /proc, the nonces
// proving it is the same memory), the channel's notifications through the
// segment (futex wake, blocking, close), and the selection rules (modes,
// bounds, host identity).
#include "services/transport/shm_ring.h"

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <deque>
#include <limits>
#include <random>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/transport/data_plane.h"
#include "services/transport/shm_channel.h"
#include "services/transport/shm_segment.h"

namespace gpipe {
namespace {

using ::testing::HasSubstr;

ShmChunk Chunk(int64_t offset, int64_t length, int64_t sequence,
               int64_t header = 8) {
  ShmChunk c;
  c.offset = offset;
  c.length = length;
  c.sequence = sequence;
  c.header_bytes = header;
  return c;
}

// A worker fits the segment it creates in what its memory leaves: the
// largest power-of-two ring, within the rule's, whose segment fits.
TEST(ShmRingTest, TheFittingRingIsTheLargestWhoseSegmentFits) {
  constexpr int64_t kMiB = int64_t{1} << 20;
  EXPECT_EQ(ShmRingFitting(ShmSegmentBytes(8 * kMiB), 32 * kMiB), 8 * kMiB);
  EXPECT_EQ(ShmRingFitting(ShmSegmentBytes(8 * kMiB) - 1, 32 * kMiB), 4 * kMiB);
  // Never past the rule's ring, however much room there is.
  EXPECT_EQ(ShmRingFitting(int64_t{1} << 40, 2 * kMiB), 2 * kMiB);
  EXPECT_EQ(ShmRingFitting(ShmSegmentBytes(kMinShmRingBytes), 32 * kMiB),
            kMinShmRingBytes);
  // Not even the smallest segment: none.
  EXPECT_EQ(ShmRingFitting(ShmSegmentBytes(kMinShmRingBytes) - 1, 32 * kMiB),
            0);
  EXPECT_EQ(ShmRingFitting(0, 32 * kMiB), 0);
  EXPECT_EQ(ShmRingFitting(int64_t{1} << 40, kMinShmRingBytes - 1), 0);
}

TEST(ShmRingTest, PlacesFirstFitAlignedAndFreesInAnyOrder) {
  ShmRingWriter w(1024, 8);
  std::optional<ShmChunk> a = w.TryReserve(100), b = w.TryReserve(300),
                          c = w.TryReserve(500);
  ASSERT_TRUE(a && b && c);
  EXPECT_EQ(a->offset, 0);
  EXPECT_EQ(b->offset, 128);  // 64-byte aligned
  EXPECT_EQ(c->offset, 448);
  EXPECT_EQ(c->sequence, 2);
  EXPECT_FALSE(w.TryReserve(128).has_value());  // 64 bytes left
  // Freeing the middle chunk first: its space is reused while the first
  // is still held (a receiver keeping an activation).
  ASSERT_TRUE(w.Release(b->sequence).ok());
  std::optional<ShmChunk> d = w.TryReserve(200);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->offset, 128);
  ASSERT_TRUE(w.Release(c->sequence).ok());
  ASSERT_TRUE(w.Release(d->sequence).ok());
  // Everything after the first chunk coalesced into one range again.
  std::optional<ShmChunk> e = w.TryReserve(1024 - 128);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->offset, 128);
  absl::Status twice = w.Release(b->sequence);
  EXPECT_TRUE(absl::IsInvalidArgument(twice));
  EXPECT_THAT(twice.message(), HasSubstr("not in use"));
  ASSERT_TRUE(w.Release(a->sequence).ok());
  ASSERT_TRUE(w.Release(e->sequence).ok());
  EXPECT_EQ(w.bytes_in_use(), 0);
  EXPECT_TRUE(w.TryReserve(1024).has_value());
}

TEST(ShmRingTest, AtMostMaxInUseChunksAndNothingLargerThanTheRing) {
  ShmRingWriter w(1 << 20, 2);
  EXPECT_FALSE(w.TryReserve(0).has_value());
  EXPECT_FALSE(w.TryReserve((1 << 20) + 1).has_value());
  ASSERT_TRUE(w.TryReserve(10).has_value());
  ASSERT_TRUE(w.TryReserve(10).has_value());
  EXPECT_FALSE(w.TryReserve(10).has_value());  // two in use already
  ASSERT_TRUE(w.Release(1).ok());
  EXPECT_TRUE(w.TryReserve(10).has_value());
}

TEST(ShmRingTest, RandomSizesAndReleaseOrdersAgreeBetweenWriterAndReader) {
  constexpr int64_t kRing = 1 << 16;
  ShmRingWriter w(kRing, 16);
  ShmRingReader r(kRing, kRing / 2, 16);
  std::mt19937 rng(7);
  std::deque<int64_t> in_use;
  int64_t placed = 0;
  for (int i = 0; i < 5000; ++i) {
    std::optional<ShmChunk> c =
        w.TryReserve(1 + static_cast<int64_t>(rng() % (kRing / 8)));
    if (!c) {
      ASSERT_FALSE(in_use.empty());
      // Give one back from anywhere: front, back or middle.
      const size_t k = rng() % in_use.size();
      ASSERT_TRUE(w.Release(in_use[k]).ok());
      ASSERT_TRUE(r.Release(in_use[k]).ok());
      in_use.erase(in_use.begin() + static_cast<std::ptrdiff_t>(k));
      continue;
    }
    c->header_bytes = 1;
    ASSERT_TRUE(r.Accept(*c).ok()) << r.Accept(*c);
    in_use.push_back(c->sequence);
    ++placed;
  }
  EXPECT_GT(placed, 1000);
}

TEST(ShmRingTest, TheReaderRejectsGarbageChunks) {
  constexpr int64_t kRing = 4096;
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  struct Case {
    const char* what;
    ShmChunk chunk;
    const char* message;
  } cases[] = {
      {"wrong sequence", Chunk(0, 16, 3), "chunk 3 where chunk 0 comes next"},
      {"negative sequence", Chunk(0, 16, -1), "where chunk 0 comes next"},
      {"zero length", Chunk(0, 0, 0), "chunk length 0"},
      {"negative length", Chunk(0, -5, 0), "chunk length -5"},
      {"longer than a chunk may be", Chunk(0, 2049, 0), "is not in (0, 2048]"},
      {"past the end", Chunk(4032, 128, 0), "outside the ring"},
      {"negative offset", Chunk(-64, 16, 0), "outside the ring"},
      {"overflowing offset", Chunk(kMax - 4, 16, 0), "outside the ring"},
      {"misaligned", Chunk(8, 16, 0), "not aligned"},
      {"no header", Chunk(0, 16, 0, 0), "announces 0 header bytes"},
      {"header longer than the chunk", Chunk(0, 16, 0, 17), "header bytes"},
  };
  for (const Case& c : cases) {
    ShmRingReader r(kRing, kRing / 2, 4);
    absl::Status s = r.Accept(c.chunk);
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << c.what;
    EXPECT_THAT(s.message(), HasSubstr(c.message)) << c.what;
    EXPECT_TRUE(r.Accept(Chunk(0, 16, 0)).ok()) << c.what;  // unmoved
  }
  // Replayed, overlapping one in use, and too many in use.
  ShmRingReader r(kRing, kRing / 2, 2);
  ASSERT_TRUE(r.Accept(Chunk(0, 100, 0)).ok());
  EXPECT_THAT(r.Accept(Chunk(0, 100, 0)).message(),
              HasSubstr("chunk 0 where chunk 1 comes next"));
  EXPECT_THAT(r.Accept(Chunk(64, 16, 1)).message(),
              HasSubstr("overlaps a chunk still in use"));
  ASSERT_TRUE(r.Accept(Chunk(128, 16, 1)).ok());
  EXPECT_THAT(r.Accept(Chunk(256, 16, 2)).message(),
              HasSubstr("while 2 chunks are still in use"));
  ASSERT_TRUE(r.Release(0).ok());
  EXPECT_TRUE(absl::IsInvalidArgument(r.Release(0)));
  EXPECT_TRUE(r.Accept(Chunk(0, 64, 2)).ok());  // its space is free again
}

// Two channels over one segment mapped twice, as two processes would.
struct ChannelPair {
  std::shared_ptr<ShmChannel> up, down;
  ShmQueues* up_queues;  // the ring `up` writes
};
ChannelPair MakePair(int64_t ring, int64_t chunk) {
  absl::StatusOr<std::unique_ptr<ShmSegment>> created =
      ShmSegment::Create(ring, 0x1234);
  EXPECT_TRUE(created.ok()) << created.status();
  absl::StatusOr<std::unique_ptr<ShmSegment>> opened =
      ShmSegment::OpenPeer(getpid(), (*created)->fd(), ring, 0x1234, 0x5678);
  EXPECT_TRUE(opened.ok()) << opened.status();
  (*created)->CloseFd();
  ShmQueues* up_queues = (*created)->queues(ShmSegment::kDownstream);
  return {std::make_shared<ShmChannel>(std::move(*created), true, chunk),
          std::make_shared<ShmChannel>(std::move(*opened), false, chunk),
          up_queues};
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
  a.queues(ShmSegment::kUpstream)->posted.store(7);
  EXPECT_EQ(b.queues(ShmSegment::kUpstream)->posted.load(), 7u);
}

// A peer that shrank the file would make every access past the new end
// (held tensors included) SIGBUS: segments are sealed, and an unsealed file
// is refused.
TEST(ShmSegmentTest, SegmentsAreSealedAndUnsealedFilesAreRefused) {
  absl::StatusOr<std::unique_ptr<ShmSegment>> created =
      ShmSegment::Create(kMinShmRingBytes, 7);
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_NE(ftruncate((*created)->fd(), 4096), 0);
  EXPECT_NE(ftruncate((*created)->fd(), 2 * ShmSegmentBytes(kMinShmRingBytes)),
            0);

  const int plain = memfd_create("not-sealed", MFD_CLOEXEC);
  ASSERT_GE(plain, 0);
  ASSERT_EQ(ftruncate(plain, ShmSegmentBytes(kMinShmRingBytes)), 0);
  absl::StatusOr<std::unique_ptr<ShmSegment>> opened =
      ShmSegment::OpenPeer(getpid(), plain, kMinShmRingBytes, 7, 8);
  close(plain);
  EXPECT_EQ(opened.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(opened.status().message(), HasSubstr("not sealed"));
}

TEST(ShmChannelTest, ChunksArePostedAndGivenBackThroughTheSegment) {
  ChannelPair p = MakePair(kMinShmRingBytes, 4096);
  absl::StatusOr<ShmChunk> c = p.up->Reserve(5);
  ASSERT_TRUE(c.ok());
  std::memcpy(p.up->Data(*c), "hello", 5);
  c->header_bytes = 5;
  // The reader sleeps until the writer posts (a futex wake, not a poll).
  std::thread reader([&] {
    absl::StatusOr<std::optional<ShmChunk>> got = p.down->Next();
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_TRUE(got->has_value());
    EXPECT_EQ(std::string(p.down->InData(**got), 5), "hello");
    p.down->GiveBack((*got)->sequence, 0);
  });
  // Asleep on the futex (past its spin), counted as a sleeper in the
  // segment, so the post below wakes it with a system call.
  ShmQueues* q = p.up_queues;
  for (int i = 0; i < 200 && q->posted_sleepers.load() == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(q->posted_sleepers.load(), 1u);
  p.up->Post(*c);
  reader.join();
  // The release arrives through the segment too: the whole ring is free.
  EXPECT_TRUE(p.up->Reserve(kMinShmRingBytes).ok());
}

TEST(ShmChannelTest, AFullRingBlocksTheWriterUntilGivenBackOrClosed) {
  ChannelPair p = MakePair(kMinShmRingBytes, kMinShmRingBytes / 2);
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<ShmChunk> c = p.up->Reserve(kMinShmRingBytes / 2);
    ASSERT_TRUE(c.ok());
    c->header_bytes = 1;
    p.up->Post(*c);
  }
  std::atomic<bool> got{false};
  std::thread waiter([&] { got = p.up->Reserve(100).ok(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(got.load());  // still blocked: the ring is full
  absl::StatusOr<std::optional<ShmChunk>> first = p.down->Next();
  ASSERT_TRUE(first.ok() && first->has_value());
  p.down->GiveBack((*first)->sequence, 0);
  waiter.join();
  EXPECT_TRUE(got.load());

  std::thread closed([&] {
    absl::StatusOr<ShmChunk> s = p.up->Reserve(kMinShmRingBytes / 2);
    EXPECT_TRUE(absl::IsCancelled(s.status())) << s.status();
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  p.up->Close(absl::CancelledError("link closed"), /*drain=*/false);
  closed.join();
}

TEST(ShmChannelTest, CloseWithDrainReturnsWhatWasPostedFirst) {
  ChannelPair p = MakePair(kMinShmRingBytes, 4096);
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<ShmChunk> c = p.up->Reserve(64);
    ASSERT_TRUE(c.ok());
    c->header_bytes = 1;
    p.up->Post(*c);
  }
  p.down->Close(absl::UnavailableError("peer finished"), /*drain=*/true);
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<std::optional<ShmChunk>> c = p.down->Next();
    ASSERT_TRUE(c.ok() && c->has_value()) << i;
    EXPECT_EQ((*c)->sequence, i);
  }
  absl::StatusOr<std::optional<ShmChunk>> end = p.down->Next();
  ASSERT_TRUE(end.ok());
  EXPECT_FALSE(end->has_value());
}

TEST(ShmChannelTest, AtMostFourChunksOrAQuarterOfTheRingAreHeld) {
  ChannelPair p = MakePair(kMinShmRingBytes, 4096);
  EXPECT_FALSE(p.down->TryHold(kMinShmRingBytes / 4 + 1));
  for (int i = 0; i < ShmChannel::kMaxHeldChunks; ++i) {
    EXPECT_TRUE(p.down->TryHold(100)) << i;
  }
  EXPECT_FALSE(p.down->TryHold(100));
}

TEST(ShmChannelTest, GarbageReleasesFailTheWriter) {
  absl::StatusOr<std::unique_ptr<ShmSegment>> created =
      ShmSegment::Create(kMinShmRingBytes, 5);
  ASSERT_TRUE(created.ok());
  ShmQueues* down = (*created)->queues(ShmSegment::kDownstream);
  ShmChannel up(std::move(*created), /*creator=*/true, 4096);
  // The peer gives back chunk 9, which was never posted.
  down->releases[0].store(9);
  down->released.store(1);
  absl::StatusOr<ShmChunk> c = up.Reserve(64);
  EXPECT_TRUE(absl::IsInvalidArgument(c.status())) << c.status();
  EXPECT_THAT(c.status().message(), HasSubstr("release of chunk 9"));
  // And more releases than chunks can be in use.
  absl::StatusOr<std::unique_ptr<ShmSegment>> other =
      ShmSegment::Create(kMinShmRingBytes, 6);
  ASSERT_TRUE(other.ok());
  (*other)->queues(ShmSegment::kDownstream)->released.store(1000);
  ShmChannel up2(std::move(*other), /*creator=*/true, 4096);
  c = up2.Reserve(64);
  EXPECT_THAT(c.status().message(), HasSubstr("1000 releases at once"));
}

TEST(DataPlaneTest, ModesParseAndBadOnesAreNamed) {
  EXPECT_EQ(*ParseDataPlaneMode("auto"), DataPlaneMode::kAuto);
  EXPECT_EQ(*ParseDataPlaneMode("grpc"), DataPlaneMode::kGrpc);
  EXPECT_EQ(*ParseDataPlaneMode("shm"), DataPlaneMode::kShm);
  absl::StatusOr<DataPlaneMode> bad = ParseDataPlaneMode("SHM");
  EXPECT_TRUE(absl::IsInvalidArgument(bad.status()));
  EXPECT_THAT(bad.status().message(), HasSubstr("not 'SHM'"));
  EXPECT_STREQ(DataPlaneName(DataPlaneKind::kShm), "shm");
}

TEST(DataPlaneTest, RingAndChunkSizesAreBounded) {
  DataPlaneOptions o;
  EXPECT_TRUE(ValidateDataPlaneOptions(o).ok());
  o.ring_bytes = 1000;
  EXPECT_THAT(ValidateDataPlaneOptions(o).message(),
              HasSubstr("--shm_ring_bytes 1000 is outside"));
  o.ring_bytes = int64_t{1} << 40;
  EXPECT_TRUE(absl::IsInvalidArgument(ValidateDataPlaneOptions(o)));
  // The upstream ring starts right after the downstream one: an odd size
  // would leave tensors held in it misaligned.
  o = DataPlaneOptions();
  o.ring_bytes = kMinShmRingBytes + 100;
  o.chunk_bytes = 4096;
  EXPECT_THAT(ValidateDataPlaneOptions(o).message(),
              HasSubstr("not a multiple of 4096"));
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
  o.set_ring_bytes(kMinShmRingBytes + 64);
  o.set_segment_bytes(ShmSegmentBytes(o.ring_bytes()));
  EXPECT_THAT(OfferMismatch(o, here), HasSubstr("not a multiple of 4096"));
  o = GoodOffer(here);
  o.set_segment_bytes(o.segment_bytes() + 1);
  EXPECT_THAT(OfferMismatch(o, here), HasSubstr("does not hold two rings"));
  o = GoodOffer(here);
  o.set_pid(-1);
  EXPECT_THAT(OfferMismatch(o, here), HasSubstr("no such process"));
}

}  // namespace
}  // namespace gpipe
