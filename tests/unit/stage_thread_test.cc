#include "services/pipeline/stage_thread.h"

#include <new>

#include "gtest/gtest.h"
#include "services/core/memory.h"

namespace gpipe {
namespace {

TEST(StageThreadTest, RunsItsWorkInOrder) {
  StageThread thread(1);
  int seen = 0;
  std::future<void> a = thread.Post([&] { seen = seen * 10 + 1; });
  std::future<void> b = thread.Post([&] { seen = seen * 10 + 2; });
  b.wait();
  a.wait();
  EXPECT_EQ(seen, 12);
}

// A stage that runs out of memory ends the process as one on the main
// thread does (status 3, the message), not in a future nobody reads while
// its neighbours wait on its links: `gpipectl train --stages 2` hung.
TEST(StageThreadDeathTest, RunningOutOfMemoryEndsTheProcessWithItsMessage) {
  EXPECT_EXIT(
      {
        ExplainOutOfMemory();
        StageThread thread(1);
        thread.Post([] { throw std::bad_alloc(); }).wait();
        std::_Exit(0);  // not reached
      },
      testing::ExitedWithCode(3), "out of memory: an allocation failed");
}

}  // namespace
}  // namespace gpipe
