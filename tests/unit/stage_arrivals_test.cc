// What a stage takes from its neighbours: float32 tensors of its input
// (activations) or output (gradients) shape per sample, with the
// micro-batch's rows. A neighbour's tensor of another shape or dtype is
// refused naming both shapes (a worker read one of [16, 999] past its end
// and died of the corrupted heap); the right one is taken. In an
// evaluation a stage sends the next batch only once the stage after it took
// the one before off its queue.
#include <atomic>
#include <chrono>
#include <initializer_list>
#include <memory>
#include <thread>
#include <utility>

#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "services/pipeline/job_spec.h"
#include "services/pipeline/stage.h"
#include "services/tensor/allocator.h"
#include "services/transport/in_process_link.h"

namespace gpipe {
namespace {

using ::testing::HasSubstr;

constexpr char kSpec[] = R"({
  "model": {
    "input": {"dtype": "FLOAT32", "shape": {"dims": [8]}},
    "layers": [
      {"linear": {"inFeatures": 8, "outFeatures": 16}},
      {"relu": {}},
      {"linear": {"inFeatures": 16, "outFeatures": 3}}
    ],
    "loss": {"softmaxCrossEntropy": {}}
  },
  "optimizer": {"lr": 0.05, "sgd": {}},
  "data": {"synthetic": {"task": "CLASSES", "features": 8, "classes": 3,
                         "trainSamples": 64, "testSamples": 16}},
  "pipeline": {"microBatches": 1},
  "eval": {"batchSize": 2},
  "batchSize": 8, "steps": 10, "seed": 5
})";

class StageArrivalsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(
        google::protobuf::util::JsonStringToMessage(kSpec, &spec_).ok());
    auto dataset = OpenJobDataset(spec_);
    ASSERT_TRUE(dataset.ok()) << dataset.status();
    dataset_ = std::move(*dataset);
    auto links = MakeInProcessLinkPair(8);
    down_ = std::move(links.first);  // the first stage's end
    up_ = std::move(links.second);   // the last stage's end
  }
  // Stage 0 holds layers [0, 2), stage 1 layer 2. Stage 0 sends through
  // `sending` when given (a wrapper of down_).
  std::unique_ptr<Stage> Make(int index, Link* sending = nullptr) {
    StagePlacement p;
    p.count = 2;
    p.index = index;
    p.layer_begin = index == 0 ? 0 : 2;
    p.layer_end = index == 0 ? 2 : 3;
    p.micro_batches = 1;
    auto stage =
        Stage::Create(spec_, p, dataset_, index == 0 ? nullptr : up_.get(),
                      index == 0 ? (sending ? sending : down_.get()) : nullptr);
    EXPECT_TRUE(stage.ok()) << stage.status();
    return stage.ok() ? std::move(*stage) : nullptr;
  }
  static Message Arriving(MessageKind kind, Shape shape,
                          DType dtype = DType::kF32) {
    Message m;
    m.kind = kind;
    m.step = 0;
    m.micro_batch = 0;
    m.tensor = Tensor::Zeros(shape, dtype);
    return m;
  }

  gpipe::v1::JobSpec spec_;
  std::shared_ptr<const Dataset> dataset_;
  std::unique_ptr<Link> down_, up_;
};

TEST_F(StageArrivalsTest, AnActivationOfAnotherShapeOrDtypeIsRefused) {
  for (auto [shape, dtype, says] :
       {std::tuple{Shape{8, 999}, DType::kF32, "float32 [8, 999]"},
        std::tuple{Shape{16, 16}, DType::kF32, "float32 [16, 16]"},
        std::tuple{Shape{8, 4, 4}, DType::kF32, "float32 [8, 4, 4]"},
        std::tuple{Shape{8, 16}, DType::kI32, "int32 [8, 16]"}}) {
    SetUp();
    std::unique_ptr<Stage> last = Make(1);
    ASSERT_TRUE(
        down_->Send(Arriving(MessageKind::kActivation, shape, dtype)).ok());
    const absl::StatusOr<StageStepResult> r = last->RunStep(0);
    ASSERT_TRUE(absl::IsInvalidArgument(r.status())) << r.status();
    EXPECT_THAT(r.status().message(),
                HasSubstr(absl::StrCat(
                    "micro-batch 0's activation from the upstream stage is ",
                    says, "; this stage takes float32 [8, 16]")));
  }
}

TEST_F(StageArrivalsTest, AGradientOfAnotherShapeIsRefused) {
  std::unique_ptr<Stage> first = Make(0);
  ASSERT_TRUE(up_->Send(Arriving(MessageKind::kGradient, Shape{8, 3})).ok());
  const absl::StatusOr<StageStepResult> r = first->RunStep(0);
  ASSERT_TRUE(absl::IsInvalidArgument(r.status())) << r.status();
  EXPECT_THAT(r.status().message(),
              HasSubstr("micro-batch 0's gradient from the downstream stage is "
                        "float32 [8, 3]; this stage takes float32 [8, 16]"));
}

TEST_F(StageArrivalsTest, TheRightShapesAreTaken) {
  std::unique_ptr<Stage> first = Make(0), last = Make(1);
  absl::StatusOr<StageStepResult> a = absl::UnknownError("");
  std::thread t([&] { a = first->RunStep(0); });
  const absl::StatusOr<StageStepResult> b = last->RunStep(0);
  t.join();
  EXPECT_TRUE(a.ok()) << a.status();
  EXPECT_TRUE(b.ok()) << b.status();
}

// Counts what the first stage sends through it.
class CountingLink : public Link {
 public:
  explicit CountingLink(Link* inner) : inner_(inner) {}
  absl::Status Send(Message m) override {
    ++sent_;
    return inner_->Send(std::move(m));
  }
  absl::StatusOr<Message> Receive() override { return inner_->Receive(); }
  void Close() override { inner_->Close(); }
  int64_t bytes_sent() const override { return inner_->bytes_sent(); }
  int64_t bytes_received() const override { return inner_->bytes_received(); }
  int sent() const { return sent_; }

 private:
  Link* inner_;
  std::atomic<int> sent_{0};
};

Message Receipt(int64_t batch) {
  Message m;
  m.kind = MessageKind::kEvalTaken;
  m.step = kEvalStep;
  m.micro_batch = batch;
  return m;
}

// A slow stage downstream held every evaluation batch the stage before sent
// (a worker's RSS reached twice its memory limit, and a job failed out of
// memory in its final evaluation): now one at most waits for it.
TEST_F(StageArrivalsTest, AnEvaluationBatchWaitsForTheReceiptOfTheOneBefore) {
  CountingLink counting(down_.get());
  std::unique_ptr<Stage> first = Make(0, &counting);
  absl::StatusOr<LossResult> r = absl::UnknownError("");
  std::thread t([&] { r = first->RunEval(Split::kTest, 0); });
  // 16 test samples in batches of 2.
  for (int64_t b = 0; b < 8; ++b) {
    absl::StatusOr<Message> m = up_->Receive();
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ(m->kind, MessageKind::kActivation);
    EXPECT_EQ(m->micro_batch, b);
    if (b == 0) {
      // Time enough to send all eight were it not waiting.
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      EXPECT_EQ(counting.sent(), 1);
    }
    ASSERT_TRUE(up_->Send(Receipt(b)).ok());
  }
  absl::StatusOr<Message> end = up_->Receive();
  t.join();
  ASSERT_TRUE(end.ok()) << end.status();
  EXPECT_EQ(end->kind, MessageKind::kEvalEnd);
  EXPECT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(counting.sent(), 9);
}

TEST_F(StageArrivalsTest, AnythingButTheReceiptIsRefused) {
  std::unique_ptr<Stage> first = Make(0);
  absl::StatusOr<LossResult> r = absl::UnknownError("");
  std::thread t([&] { r = first->RunEval(Split::kTest, 0); });
  ASSERT_TRUE(up_->Receive().ok());
  ASSERT_TRUE(up_->Send(Receipt(3)).ok());
  t.join();
  EXPECT_TRUE(absl::IsInternal(r.status())) << r.status();
  EXPECT_THAT(r.status().message(),
              HasSubstr("expected the receipt of evaluation batch 0, received "
                        "receipt of evaluation batch 3"));
}

// The receipts leave nothing on the link: a training step follows.
TEST_F(StageArrivalsTest, AnEvaluationLeavesTheLinkClearForTheNextStep) {
  std::unique_ptr<Stage> first = Make(0), last = Make(1);
  absl::StatusOr<LossResult> a = absl::UnknownError("");
  std::thread t([&] { a = first->RunEval(Split::kTest, 0); });
  const absl::StatusOr<LossResult> b = last->RunEval(Split::kTest, 0);
  t.join();
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->counted, 16);
  absl::StatusOr<StageStepResult> sa = absl::UnknownError("");
  std::thread u([&] {
    sa = first->RunStep(0);
    // A failed first stage would leave the last waiting.
    if (!sa.ok()) down_->Close();
  });
  const absl::StatusOr<StageStepResult> sb = last->RunStep(0);
  u.join();
  EXPECT_TRUE(sa.ok()) << sa.status();
  EXPECT_TRUE(sb.ok()) << sb.status();
}

// Waits up to 20 s for `done`; then closes `links` so that a stage still
// waiting returns, and says it had to.
bool JoinedInTime(std::thread& t, const std::atomic<bool>& done,
                  std::initializer_list<Link*> links) {
  for (int i = 0; i < 400 && !done.load(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const bool in_time = done.load();
  if (!in_time)
    for (Link* l : links) l->Close();
  t.join();
  return in_time;
}

// A stage that runs out of memory in an evaluation tells the next one,
// which ends its own at once (it waited for a batch that never came, and
// the job lost its trained model to its last step).
TEST_F(StageArrivalsTest, AStageOutOfMemoryInAnEvaluationEndsTheNext) {
  std::unique_ptr<Stage> first = Make(0), last = Make(1);
  absl::StatusOr<LossResult> b = absl::UnknownError("");
  std::atomic<bool> done{false};
  std::thread t([&] {
    b = last->RunEval(Split::kTest, 0);
    done = true;
  });
  {
    TensorMemoryLimit limit(1);
    EXPECT_THROW(first->RunEval(Split::kTest, 0), TensorMemoryExhausted);
  }
  ASSERT_TRUE(JoinedInTime(t, done, {down_.get(), up_.get()}));
  EXPECT_TRUE(EvalEndedElsewhere(b.status())) << b.status();
  EXPECT_FALSE(EvalFailedHere(b.status()));
  EXPECT_THAT(b.status().message(),
              HasSubstr("stage 1: the evaluation ended: failure of stage 0's "
                        "part of the evaluation"));
}

// Three stages, the last failing: the middle one passes it on upstream.
TEST_F(StageArrivalsTest, AFailedEvaluationIsPassedOnThroughTheMiddleStage) {
  auto [d0, u1] = MakeInProcessLinkPair(8);
  auto [d1, u2] = MakeInProcessLinkPair(8);
  const auto make = [&](int index, Link* up, Link* down) {
    StagePlacement p;
    p.count = 3;
    p.index = index;
    p.layer_begin = index;
    p.layer_end = index + 1;
    p.micro_batches = 1;
    auto stage = Stage::Create(spec_, p, dataset_, up, down);
    EXPECT_TRUE(stage.ok()) << stage.status();
    return stage.ok() ? std::move(*stage) : nullptr;
  };
  std::unique_ptr<Stage> s0 = make(0, nullptr, d0.get());
  std::unique_ptr<Stage> s1 = make(1, u1.get(), d1.get());
  std::unique_ptr<Stage> s2 = make(2, u2.get(), nullptr);
  ASSERT_TRUE(s0 && s1 && s2);
  absl::StatusOr<LossResult> r0 = absl::UnknownError("");
  absl::StatusOr<LossResult> r1 = absl::UnknownError("");
  std::atomic<int> ended{0};
  std::atomic<bool> done{false};
  std::thread t([&] {
    std::thread t0([&] {
      r0 = s0->RunEval(Split::kTest, 0);
      ++ended;
    });
    r1 = s1->RunEval(Split::kTest, 0);
    ++ended;
    t0.join();
    done = true;
  });
  {
    TensorMemoryLimit limit(1);
    EXPECT_THROW(s2->RunEval(Split::kTest, 0), TensorMemoryExhausted);
  }
  ASSERT_TRUE(JoinedInTime(t, done, {d0.get(), u1.get(), d1.get(), u2.get()}))
      << ended.load() << " of 2 stages ended";
  for (const auto* r : {&r0, &r1}) {
    EXPECT_TRUE(EvalEndedElsewhere(r->status())) << r->status();
    EXPECT_THAT(r->status().message(),
                HasSubstr("failure of stage 2's part of the evaluation"));
  }
}

}  // namespace
}  // namespace gpipe
