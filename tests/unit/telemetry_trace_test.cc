// The timeline exporters: Chrome trace JSON (parsed back with protobuf's
// JSON parser into a Struct) and SVG, on hand-made records and on the
// timelines of a real in-process pipeline.
#include <algorithm>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "services/pipeline/in_process_pipeline.h"
#include "services/pipeline/job_spec.h"
#include "services/telemetry/chrome_trace.h"
#include "services/telemetry/step_trace.h"
#include "services/telemetry/timeline_svg.h"
#include "services/telemetry/trace_files.h"

namespace gpipe {
namespace {

namespace v1 = gpipe::v1;
using ::google::protobuf::Struct;
using ::google::protobuf::Value;
using ::testing::HasSubstr;
using ::testing::Not;

Struct Parse(const std::string& json) {
  Struct doc;
  const auto status = google::protobuf::util::JsonStringToMessage(json, &doc);
  EXPECT_TRUE(status.ok()) << status.ToString() << "\n" << json;
  return doc;
}

// The "X" events of a parsed trace by tid, as (ts, end, cat, name).
struct Slice {
  double ts, end;
  std::string cat, name;
};
std::map<int, std::vector<Slice>> Slices(const Struct& doc) {
  std::map<int, std::vector<Slice>> by_tid;
  for (const Value& v : doc.fields().at("traceEvents").list_value().values()) {
    const auto& f = v.struct_value().fields();
    if (f.at("ph").string_value() != "X") continue;
    const double ts = f.at("ts").number_value();
    by_tid[static_cast<int>(f.at("tid").number_value())].push_back(
        {ts, ts + f.at("dur").number_value(), f.at("cat").string_value(),
         f.at("name").string_value()});
  }
  return by_tid;
}

std::map<int, std::string> ThreadNames(const Struct& doc) {
  std::map<int, std::string> names;
  for (const Value& v : doc.fields().at("traceEvents").list_value().values()) {
    const auto& f = v.struct_value().fields();
    if (f.at("ph").string_value() == "M" &&
        f.at("name").string_value() == "thread_name") {
      names[static_cast<int>(f.at("tid").number_value())] =
          f.at("args").struct_value().fields().at("name").string_value();
    }
  }
  return names;
}

v1::GetTraceResponse HandMade(const std::string& job_id) {
  v1::GetTraceResponse trace;
  trace.set_job_id(job_id);
  trace.set_stages(2);
  trace.set_micro_batches(1);
  trace.set_schedule(v1::GPIPE);
  const int64_t t0 = 1'700'000'000'000'000'000;
  for (int64_t stage = 0; stage < 2; ++stage) {
    v1::StepTrace* s = trace.add_steps();
    s->set_stage(stage);
    s->set_step(7);
    s->set_start_unix_ns(t0);
    s->set_end_unix_ns(t0 + 4'000'000);
    const int64_t f = t0 + stage * 1'000'000;  // stage 1 waits a 1 ms bubble
    const std::vector<std::pair<v1::OpTrace::Phase, int64_t>> ops = {
        {v1::OpTrace::FORWARD, f},
        {v1::OpTrace::BACKWARD, f + 1'000'000},
        {v1::OpTrace::OPTIMIZER, t0 + 3'500'000}};
    for (const auto& [phase, start] : ops) {
      v1::OpTrace* op = s->add_ops();
      op->set_phase(phase);
      op->set_micro_batch(phase == v1::OpTrace::OPTIMIZER ? -1 : 0);
      op->set_start_unix_ns(start);
      op->set_end_unix_ns(start + 500'000);
    }
  }
  return trace;
}

TEST(ChromeTraceTest, OneTrackPerStageWithTimesFromTheEarliestRecord) {
  const Struct doc = Parse(ChromeTraceJson(HandMade("job-1")));
  EXPECT_EQ(ThreadNames(doc),
            (std::map<int, std::string>{{0, "stage 0"}, {1, "stage 1"}}));
  const auto slices = Slices(doc);
  ASSERT_EQ(slices.size(), 2u);
  const std::vector<Slice>& s1 = slices.at(1);
  ASSERT_EQ(s1.size(), 4u);  // the step and three ops
  EXPECT_EQ(s1[0].cat, "step");
  EXPECT_EQ(s1[0].name, "step 7");
  EXPECT_DOUBLE_EQ(s1[0].ts, 0);
  EXPECT_DOUBLE_EQ(s1[0].end, 4000);
  EXPECT_EQ(s1[1].name, "F0");
  EXPECT_DOUBLE_EQ(s1[1].ts, 1000);  // after the bubble
  EXPECT_DOUBLE_EQ(s1[1].end, 1500);
  EXPECT_EQ(s1[2].name, "B0");
  EXPECT_EQ(s1[3].name, "optimizer");
  EXPECT_EQ(s1[3].cat, "optimizer");
}

// Replicas: one track per (replica, stage), replica by replica, each named
// for both; the SVG draws a row for each.
TEST(ChromeTraceTest, OneTrackPerReplicaAndStage) {
  v1::GetTraceResponse trace = HandMade("job-r");
  trace.set_replicas(2);
  // Replica 1's records, added before replica 0's are all there: the tracks
  // are ordered by (replica, stage), not by arrival.
  v1::GetTraceResponse mixed = trace;
  mixed.clear_steps();
  for (int64_t replica : {1, 0}) {
    for (const v1::StepTrace& s : trace.steps()) {
      v1::StepTrace* t = mixed.add_steps();
      *t = s;
      t->set_replica(replica);
    }
  }
  const Struct doc = Parse(ChromeTraceJson(mixed));
  EXPECT_EQ(ThreadNames(doc),
            (std::map<int, std::string>{{0, "replica 0 stage 0"},
                                        {1, "replica 0 stage 1"},
                                        {2, "replica 1 stage 0"},
                                        {3, "replica 1 stage 1"}}));
  const auto slices = Slices(doc);
  ASSERT_EQ(slices.size(), 4u);
  for (const auto& [tid, track] : slices) EXPECT_EQ(track.size(), 4u) << tid;
  EXPECT_EQ(doc.fields()
                .at("otherData")
                .struct_value()
                .fields()
                .at("replicas")
                .number_value(),
            2);
  const std::vector<TraceTrack> tracks = ByTrack(mixed);
  ASSERT_EQ(tracks.size(), 4u);
  EXPECT_EQ(tracks[3].replica, 1);
  EXPECT_EQ(tracks[3].stage, 1);
  EXPECT_TRUE(HasReplicas(tracks));
  const std::string svg = TimelineSvg(mixed);
  EXPECT_THAT(svg, HasSubstr("R=2 replicas"));
  EXPECT_THAT(svg, HasSubstr("id=\"replica-1-stage-0\""));
  EXPECT_THAT(svg, HasSubstr(">replica 1 stage 1</text>"));
  // A record of a negative replica (a hostile or broken sender) is dropped:
  // replica 1's stage 0 had only that one.
  ASSERT_EQ(mixed.steps(0).replica(), 1);
  ASSERT_EQ(mixed.steps(0).stage(), 0);
  mixed.mutable_steps(0)->set_replica(-3);
  const std::vector<TraceTrack> left = ByTrack(mixed);
  ASSERT_EQ(left.size(), 3u);
  EXPECT_EQ(left[2].replica, 1);
  EXPECT_EQ(left[2].stage, 1);
}

TEST(ChromeTraceTest, EscapesStrings) {
  EXPECT_EQ(JsonString("a\"b\\c\nd\x01"), "\"a\\\"b\\\\c\\nd\\u0001\"");
  const std::string odd = "job \"<&>\"\\\n\t\x02 ünï";
  const Struct doc = Parse(ChromeTraceJson(HandMade(odd)));
  EXPECT_EQ(doc.fields()
                .at("otherData")
                .struct_value()
                .fields()
                .at("job")
                .string_value(),
            odd);
}

TEST(TimelineSvgTest, WellFormedWithEscapedTextAndABoxPerOp) {
  const std::string svg = TimelineSvg(HandMade("job <&\"'>"));
  EXPECT_THAT(svg, HasSubstr("job &lt;&amp;&quot;&apos;&gt;"));
  EXPECT_THAT(svg, Not(HasSubstr("job <&")));
  EXPECT_THAT(svg, HasSubstr("<svg xmlns=\"http://www.w3.org/2000/svg\""));
  auto count = [&](const std::string& needle) {
    size_t n = 0;
    for (size_t at = svg.find(needle); at != std::string::npos;
         at = svg.find(needle, at + 1))
      ++n;
    return n;
  };
  EXPECT_EQ(count("<rect class=\"forward\""), 2u);
  EXPECT_EQ(count("<rect class=\"backward\""), 2u);
  EXPECT_EQ(count("<rect class=\"optimizer\""), 2u);
  EXPECT_EQ(count("<g class=\"stage\""), 2u);
  EXPECT_THAT(svg, HasSubstr("idle (bubble)"));
  EXPECT_THAT(svg, HasSubstr("time (ms)"));
  EXPECT_THAT(svg, HasSubstr("busy 38%"));  // 1.5 ms of ops in a 4 ms step
  EXPECT_EQ(XmlEscape("a\x01<"), "a\xEF\xBF\xBD&lt;");
}

TEST(TraceFilesTest, FormatByExtensionAndClearErrors) {
  const v1::GetTraceResponse trace = HandMade("job-f");
  const std::string dir = ::testing::TempDir() + "/trace-files-test";
  ASSERT_TRUE(WriteTraceDir(trace, dir).ok());
  std::ifstream json(dir + "/trace.json"), svg(dir + "/timeline.svg");
  std::string first_json, first_svg;
  std::getline(json, first_json);
  std::getline(svg, first_svg);
  EXPECT_EQ(first_json, "{\"traceEvents\":[");
  EXPECT_EQ(first_svg, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>");
  const absl::Status txt = WriteTraceFile(trace, dir + "/trace.txt");
  EXPECT_TRUE(absl::IsInvalidArgument(txt)) << txt;
  EXPECT_THAT(std::string(txt.message()), HasSubstr(".json"));
  const absl::Status missing =
      WriteTraceFile(trace, dir + "/no/such/dir/trace.svg");
  EXPECT_TRUE(absl::IsUnavailable(missing)) << missing;
  EXPECT_TRUE(WriteTraceFile(trace, dir + "/UPPER.SVG").ok());
}

// The timelines of K=3 real stages, M=4, remat except_last, 2 steps.
TEST(ChromeTraceTest, RealPipelineHasEverySliceOnceAndNoOverlap) {
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpecJson(R"({
    "model": {"input": {"dtype": "FLOAT32", "shape": {"dims": [8]}},
              "layers": [{"linear": {"inFeatures": 8, "outFeatures": 8}},
                         {"relu": {}},
                         {"linear": {"inFeatures": 8, "outFeatures": 3}}],
              "loss": {"softmaxCrossEntropy": {}}},
    "optimizer": {"lr": 0.1, "sgd": {}},
    "data": {"synthetic": {"task": "CLASSES", "features": 8, "classes": 3,
                           "trainSamples": 128, "testSamples": 32}},
    "pipeline": {"stages": 3, "microBatches": 4, "remat": "EXCEPT_LAST"},
    "batchSize": 16, "steps": 2})");
  ASSERT_TRUE(spec.ok()) << spec.status();
  absl::StatusOr<std::unique_ptr<InProcessPipeline>> p =
      InProcessPipeline::Create(*spec, OptionsFromSpec(*spec));
  ASSERT_TRUE(p.ok()) << p.status();
  for (int s = 0; s < 2; ++s) ASSERT_TRUE((*p)->Step().ok());
  v1::GetTraceResponse trace;
  trace.set_job_id("in-process");
  trace.set_stages(3);
  trace.set_micro_batches(4);
  for (int64_t i = 0; i < 3; ++i)
    AppendTimeline((*p)->stage(i).timeline(), i, &trace);
  ASSERT_EQ(trace.steps_size(), 6);

  const Struct doc = Parse(ChromeTraceJson(trace));
  EXPECT_EQ(ThreadNames(doc).size(), 3u);
  const auto slices = Slices(doc);
  for (int stage = 0; stage < 3; ++stage) {
    std::map<std::string, int> per_cat;
    std::vector<Slice> ops;
    for (const Slice& s : slices.at(stage)) {
      ++per_cat[s.cat];
      if (s.cat != "step") ops.push_back(s);
    }
    const int recompute = stage < 2 ? 4 : 0;
    EXPECT_EQ(per_cat["step"], 2) << stage;
    EXPECT_EQ(per_cat["forward"], 2 * 4) << stage;
    EXPECT_EQ(per_cat["backward"], 2 * 4) << stage;
    EXPECT_EQ(per_cat["recompute"], 2 * recompute) << stage;
    EXPECT_EQ(per_cat["optimizer"], 2) << stage;
    std::sort(ops.begin(), ops.end(),
              [](const Slice& a, const Slice& b) { return a.ts < b.ts; });
    for (size_t i = 1; i < ops.size(); ++i) {
      EXPECT_GE(ops[i].ts, ops[i - 1].end - 0.002)
          << "stage " << stage << ": " << ops[i - 1].name << " and "
          << ops[i].name << " overlap";
    }
  }
  // One process, one clock: stage 1 starts forward 0 after stage 0 began
  // it (it may start before stage 0's op ends, which includes the send).
  double f0_start = 0, f1_start = 0;
  for (const Slice& s : slices.at(0))
    if (s.name == "F0") f0_start = s.ts;  // the last step's
  for (const Slice& s : slices.at(1))
    if (s.name == "F0") f1_start = s.ts;
  EXPECT_GT(f1_start, f0_start);
}

}  // namespace
}  // namespace gpipe
