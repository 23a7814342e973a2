// gpipectl submit / status / list / watch / cancel / workers: the controller
// API for people (tables, a progress bar) and for scripts (--json).
#include <signal.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cli/commands.h"
#include "cli/controller_client.h"
#include "cli/flag_checks.h"
#include "cli/job_text.h"
#include "cli/progress.h"
#include "cli/security_flags.h"
#include "cli/stage_figures.h"
#include "google/protobuf/util/json_util.h"
#include "google/protobuf/wrappers.pb.h"
#include "services/core/bytes.h"
#include "services/core/host_port.h"
#include "services/core/status.h"
#include "services/core/strings.h"
#include "services/pipeline/data_resolution.h"
#include "services/pipeline/job_spec.h"
#include "services/pipeline/remat.h"
#include "services/pipeline/schedule.h"
#include "services/pipeline/simulator.h"

ABSL_FLAG(std::string, controller, "",
          "the controller's address host:port (default: $GPIPE_CONTROLLER, "
          "else 127.0.0.1:7070)");
ABSL_FLAG(bool, json, false,
          "print the responses as protobuf JSON (one event per line for "
          "watch) instead of tables, for scripts");
ABSL_FLAG(bool, watch, false, "submit, resume: then watch the job to its end");
ABSL_FLAG(absl::Duration, timeout, absl::Seconds(10),
          "how long to wait for the controller's answer to each request");
// Defined with `gpipectl train`; submit and local apply them to the spec.
ABSL_DECLARE_FLAG(int64_t, stages);
ABSL_DECLARE_FLAG(int64_t, micro_batches);
ABSL_DECLARE_FLAG(int64_t, replicas);
ABSL_DECLARE_FLAG(int64_t, virtual_stages);
ABSL_DECLARE_FLAG(std::string, steps);
ABSL_DECLARE_FLAG(std::string, schedule);
ABSL_DECLARE_FLAG(std::string, remat);
ABSL_DECLARE_FLAG(std::string, balance);
ABSL_DECLARE_FLAG(std::vector<std::string>, o);
ABSL_FLAG(std::string, step, "",
          "fetch: the committed checkpoint after this many steps (its "
          "manifest and every stage's file) instead of the final model");

namespace gpipe::cli {
namespace {

volatile std::sig_atomic_t g_interrupted = 0;

void OnInterrupt(int) { g_interrupted = 1; }

std::string ControllerAddress() {
  std::string address = absl::GetFlag(FLAGS_controller);
  if (address.empty()) {
    const char* env = std::getenv("GPIPE_CONTROLLER");
    address = env != nullptr && env[0] != '\0' ? env : "127.0.0.1:7070";
  }
  return address;
}

ControllerClient MakeClient() {
  // gpipectl's main has checked the security flags before any command.
  return ControllerClient(
      ControllerAddress(), absl::GetFlag(FLAGS_timeout),
      ClientSecurityFromFlags().value_or(security::ClientSecurity()));
}

int Fail(const char* command, const absl::Status& status) {
  return FailCommand(command, status);
}

int Usage(const char* usage) {
  std::fprintf(stderr, "usage: gpipectl %s\n", usage);
  return 2;
}

std::string JsonOf(const google::protobuf::Message& message,
                   bool with_defaults) {
  google::protobuf::util::JsonPrintOptions options;
  options.always_print_primitive_fields = with_defaults;
  std::string json;
  (void)google::protobuf::util::MessageToJsonString(message, &json, options);
  return json;
}

// ListJobs' summaries, as PrintJson prints messages (fields at 0
// included), but each spec with only the fields the summary keeps: filled in
// at 0, the rest read as a seed of 0 for a job of seed 1.
void PrintListJson(const gpipe::v1::ListJobsResponse& list) {
  std::vector<std::string> jobs;
  for (const gpipe::v1::Job& job : list.jobs()) {
    const gpipe::v1::JobSpec& spec = job.spec();
    google::protobuf::StringValue name;
    name.set_value(spec.name());
    const std::string summary =
        absl::StrCat("{\"name\":", JsonOf(name, true), ",\"steps\":\"",
                     spec.steps(), "\",\"batchSize\":\"", spec.batch_size(),
                     "\",\"pipeline\":", JsonOf(spec.pipeline(), true), "}");
    gpipe::v1::Job rest = job;
    rest.clear_spec();
    const std::string others = JsonOf(rest, /*with_defaults=*/true);
    // "{...}" with its fields after the summary's spec; "{}" (or nothing,
    // had printing failed) adds none.
    jobs.push_back(absl::StrCat(
        "{\"spec\":", summary,
        others.size() > 2 ? absl::StrCat(",", others.substr(1)) : "}"));
  }
  gpipe::v1::ListJobsResponse page;
  page.set_next_page_token(list.next_page_token());
  std::string json = JsonOf(page, /*with_defaults=*/true);
  const std::string empty = "\"jobs\":[]";
  if (const size_t at = json.find(empty); at != std::string::npos) {
    json.replace(at, empty.size(),
                 absl::StrCat("\"jobs\":[", absl::StrJoin(jobs, ","), "]"));
  } else {
    json = absl::StrCat("{\"jobs\":[", absl::StrJoin(jobs, ","), "]}");
  }
  std::printf("%s\n", json.c_str());
  std::fflush(stdout);
}

// One line per response, whichever command printed it, so scripts can read
// every --json output the same way (a line a document; watch prints many).
void PrintJson(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.always_print_primitive_fields = true;
  std::string json;
  (void)google::protobuf::util::MessageToJsonString(message, &json, options);
  if (!json.empty() && json.back() == '\n') json.pop_back();
  std::printf("%s\n", json.c_str());
  std::fflush(stdout);
}

bool IsSet(const google::protobuf::Timestamp& t) {
  return t.seconds() != 0 || t.nanos() != 0;
}

absl::Time ToTime(const google::protobuf::Timestamp& t) {
  return absl::FromUnixSeconds(t.seconds()) + absl::Nanoseconds(t.nanos());
}

// "45s", "3m", "5h", "2d" as kubectl prints ages.
std::string Age(const google::protobuf::Timestamp& t) {
  if (!IsSet(t)) return "-";
  const int64_t s =
      std::max<int64_t>(0, absl::ToInt64Seconds(absl::Now() - ToTime(t)));
  if (s < 120) return absl::StrCat(s, "s");
  if (s < 120 * 60) return absl::StrCat(s / 60, "m");
  if (s < 48 * 3600) return absl::StrCat(s / 3600, "h");
  return absl::StrCat(s / 86400, "d");
}

// As `gpipectl train` prints it: "test loss 0.1234, test accuracy 0.9567
// (300 targets)".
std::string EvaluationText(const gpipe::v1::Job& job,
                           const gpipe::v1::Evaluation& e) {
  const bool classification =
      job.spec().model().input().dtype() == gpipe::v1::FLOAT32;
  return absl::StrFormat("test loss %.4f, test %saccuracy %.4f (%d targets)",
                         e.loss(), classification ? "" : "token ", e.accuracy(),
                         e.counted());
}

// The message of the newest condition of `type` that holds, if any.
std::string ConditionMessage(const gpipe::v1::JobStatus& s,
                             const std::string& type) {
  for (int i = s.conditions_size() - 1; i >= 0; --i) {
    const gpipe::v1::Condition& c = s.conditions(i);
    if (c.type() == type && c.status() && !c.message().empty())
      return c.message();
  }
  return "";
}

// Left-aligned columns two spaces apart; the first row is the header.
void PrintTable(const std::vector<std::vector<std::string>>& rows,
                const char* indent = "") {
  std::vector<size_t> width;
  for (const auto& row : rows) {
    if (width.size() < row.size()) width.resize(row.size(), 0);
    for (size_t i = 0; i < row.size(); ++i)
      width[i] = std::max(width[i], row[i].size());
  }
  for (const auto& row : rows) {
    std::string line = indent;
    for (size_t i = 0; i < row.size(); ++i) {
      line += row[i];
      if (i + 1 < row.size()) line.append(width[i] - row[i].size() + 2, ' ');
    }
    std::printf("%s\n", line.c_str());
  }
  std::fflush(stdout);
}

void PrintJobTable(const gpipe::v1::ListJobsResponse& list) {
  if (list.jobs().empty()) {
    std::printf("no jobs\n");
    return;
  }
  std::vector<std::vector<std::string>> rows = {
      {"ID", "NAME", "STATE", "STEP", "LOSS", "AGE"}};
  for (const gpipe::v1::Job& job : list.jobs()) {
    rows.push_back({job.id(),
                    job.spec().name().empty() ? "-" : job.spec().name(),
                    StateName(job.status().state()), StepText(job.status()),
                    LossText(job.status()), Age(job.status().created())});
  }
  PrintTable(rows);
}

std::string ScheduleText(const gpipe::v1::JobSpec& spec) {
  return std::string(
      ScheduleName(ScheduleFromSpec(spec.pipeline().schedule())));
}

// From a run's start to its end, in seconds (a resumed job's last run);
// 0 while it has not ended.
double RunSeconds(const gpipe::v1::JobStatus& s) {
  if (!IsSet(s.started()) || !IsSet(s.finished())) return 0;
  return absl::ToDoubleSeconds(ToTime(s.finished()) - ToTime(s.started()));
}

// Samples a second over the whole run (time lost to restarts included;
// a resumed job's steps from where it resumed); 0 without a finished run or
// a step.
double RunAverageRate(const gpipe::v1::Job& job) {
  const double seconds = RunSeconds(job.status());
  const int64_t steps = job.status().step() - job.status().run_from_step();
  if (seconds <= 0 || steps <= 0) return 0;
  return static_cast<double>(steps) * job.spec().batch_size() / seconds;
}

void PrintJobDetail(const gpipe::v1::Job& job) {
  const gpipe::v1::JobStatus& s = job.status();
  const gpipe::v1::JobSpec& spec = job.spec();
  std::vector<std::vector<std::string>> rows;
  rows.push_back({"job:", job.id()});
  if (!spec.name().empty()) rows.push_back({"name:", spec.name()});
  rows.push_back(
      {"state:", absl::StrCat(StateName(s.state()), " (epoch ", s.epoch(), ", ",
                              s.restarts(),
                              s.restarts() == 1 ? " restart)" : " restarts)")});
  rows.push_back({"step:", StepText(s)});
  rows.push_back({"loss:", LossText(s)});
  // What `gpipectl fetch --step N` and `resume` can start from.
  if (!s.checkpoints().empty()) {
    std::vector<std::string> steps;
    for (const gpipe::v1::CheckpointRef& c : s.checkpoints()) {
      steps.push_back(absl::StrCat(c.step()));
    }
    rows.push_back(
        {"checkpoints:", absl::StrCat("steps ", absl::StrJoin(steps, ", "))});
  }
  // The status's rate is the last step's; an ended job's own figure is
  // its average from start to end (time lost to restarts included).
  std::string rate =
      s.samples_per_second() > 0
          ? absl::StrFormat("%.0f (last step)", s.samples_per_second())
          : "-";
  if (const double average = RunAverageRate(job);
      IsTerminal(s.state()) && average > 0) {
    rate = absl::StrFormat(
        "%.0f on average over %.1fs%s", average, RunSeconds(s),
        s.samples_per_second() > 0
            ? absl::StrFormat(" (last step %.0f)", s.samples_per_second())
            : "");
  }
  rows.push_back({"samples/s:", rate});
  // The simulator's step for the running cut from the stages' own layer
  // times: far below the measured one, the pipeline waits on something
  // other than its stages' work (links, a busy machine).
  if (s.predicted_step_seconds() > 0) {
    std::string step =
        s.samples_per_second() > 0 && spec.batch_size() > 0
            ? absl::StrFormat("%.1f ms (last step), ",
                              1e3 * spec.batch_size() / s.samples_per_second())
            : "";
    absl::StrAppend(&step, absl::StrFormat("%.1f ms predicted from the stages' "
                                           "layer times",
                                           1e3 * s.predicted_step_seconds()));
    rows.push_back({"step time:", step});
  }
  rows.push_back(
      {"pipeline:",
       absl::StrCat(
           "K=", StageCount(spec), StageCount(spec) == 1 ? " stage" : " stages",
           VirtualStageCount(spec) > 1
               ? absl::StrCat(" of ", VirtualStageCount(spec), " chunks each")
               : "",
           ", ",
           ReplicaCount(spec) > 1
               ? absl::StrCat(
                     "R=", ReplicaCount(spec), " replicas",
                     s.running_replicas() > 0 &&
                             s.running_replicas() < ReplicaCount(spec)
                         ? absl::StrCat(" (", s.running_replicas(), " running)")
                         : "",
                     ", ")
               : "",
           "M=", MicroBatchCount(spec), " micro-batches, ", ScheduleText(spec),
           ", remat ",
           AsAbsl(RematName(RematFromSpec(spec.pipeline().remat()))),
           ", batch ", spec.batch_size())});
  rows.push_back({"created:", IsSet(s.created())
                                  ? absl::StrCat(Age(s.created()), " ago")
                                  : "-"});
  rows.push_back({"started:", IsSet(s.started())
                                  ? absl::StrCat(Age(s.started()), " ago")
                                  : "-"});
  rows.push_back({"finished:", IsSet(s.finished())
                                   ? absl::StrCat(Age(s.finished()), " ago")
                                   : "-"});
  if (s.evaluation().counted() > 0) {
    rows.push_back({"evaluation:", EvaluationText(job, s.evaluation())});
  } else if (!s.evaluation_error().empty()) {
    rows.push_back({"evaluation:", absl::StrCat("the final evaluation failed: ",
                                                s.evaluation_error())});
  } else if (s.latest_evaluation().counted() > 0) {
    rows.push_back({"evaluation:",
                    absl::StrCat(EvaluationText(job, s.latest_evaluation()),
                                 " at step ", s.latest_evaluation().step())});
  }
  // The periodic evaluations before the last one (which the row above
  // shows), as the JSON lists them: how the test loss went.
  {
    constexpr size_t kShown = 8;  // the newest, on one line
    std::vector<std::string> earlier;
    for (const gpipe::v1::Evaluation& e : s.evaluations()) {
      if (e.step() == s.latest_evaluation().step() || e.counted() == 0)
        continue;
      earlier.push_back(absl::StrFormat("step %d: %.4f, %.1f%%", e.step(),
                                        e.loss(), 100 * e.accuracy()));
    }
    if (!earlier.empty()) {
      const size_t skipped =
          earlier.size() > kShown ? earlier.size() - kShown : 0;
      rows.push_back(
          {"earlier:",
           absl::StrCat(
               skipped > 0 ? absl::StrCat("(", skipped, " more) ") : "",
               absl::StrJoin(earlier.begin() + skipped, earlier.end(), ", "),
               " (test loss, accuracy)")});
    }
  }
  if (!s.model_path().empty()) rows.push_back({"model:", s.model_path()});
  PrintTable(rows);

  if (s.stages_size() > 0) {
    // With replicas the grid: a row per (replica, stage), replica 0 first.
    const bool replicas = s.replica_stages_size() > 0;
    std::printf(replicas ? "stages (%lld replicas):\n" : "stages:\n",
                static_cast<long long>(s.running_replicas()));
    std::vector<std::string> header = {"STAGE", "WORKER", "ADDRESS", "LAYERS",
                                       "DATA PLANE"};
    if (replicas) header.insert(header.begin(), "REPLICA");
    std::vector<std::vector<std::string>> t = {header};
    const auto add = [&](const gpipe::v1::StageStatus& st) {
      const std::string layers =
          st.layer_end() > st.layer_begin()
              ? absl::StrCat(st.layer_begin(), "..", st.layer_end() - 1)
              : "-";
      std::vector<std::string> row = {
          absl::StrCat(st.stage()),
          st.worker_id().empty() ? "-" : st.worker_id(),
          st.address().empty() ? "-" : st.address(), layers,
          st.data_plane().empty() ? "-"
          : st.segment_bytes() > 0
              ? absl::StrCat(st.data_plane(), " (",
                             FormatBytes(st.segment_bytes()), ")")
              : st.data_plane()};
      if (replicas) row.insert(row.begin(), absl::StrCat(st.replica()));
      t.push_back(std::move(row));
    };
    for (const gpipe::v1::StageStatus& st : s.stages()) add(st);
    for (const gpipe::v1::StageStatus& st : s.replica_stages()) add(st);
    PrintTable(t, "  ");
    // Why a link runs on a slower plane than it could: its worker's log
    // said so, and only there.
    const auto refused = [&](const gpipe::v1::StageStatus& st) {
      if (st.data_plane_reason().empty()) return;
      std::printf(
          "  stage %lld%s to %lld on %s: %s\n",
          static_cast<long long>(st.stage()),
          replicas ? absl::StrCat(" (replica ", st.replica(), ")").c_str() : "",
          static_cast<long long>(st.stage() + 1), st.data_plane().c_str(),
          st.data_plane_reason().c_str());
    };
    for (const gpipe::v1::StageStatus& st : s.stages()) refused(st);
    for (const gpipe::v1::StageStatus& st : s.replica_stages()) refused(st);
  }
  if (s.repartitions_size() > 0) {
    // Expected: the step measured before, less what the simulator says
    // the new cut saves (its own figures are compute only).
    std::printf("re-partitions:\n");
    std::vector<std::vector<std::string>> t = {{"STEP", "LAYERS PER STAGE",
                                                "REASON", "MS/STEP BEFORE",
                                                "EXPECTED", "MEASURED"}};
    for (const gpipe::v1::Repartition& r : s.repartitions()) {
      const double predicted = ExpectedStepSeconds(r.predicted_old_seconds(),
                                                   r.predicted_new_seconds(),
                                                   r.measured_old_seconds());
      t.push_back({absl::StrCat(r.step()),
                   absl::StrCat(absl::StrJoin(r.old_balance(), ","), " -> ",
                                absl::StrJoin(r.new_balance(), ",")),
                   r.reason(),
                   absl::StrFormat("%.1f", r.measured_old_seconds() * 1e3),
                   r.predicted_old_seconds() > 0
                       ? absl::StrFormat("%.1f", predicted * 1e3)
                       : "-",
                   r.measured_new_seconds() > 0
                       ? absl::StrFormat("%.1f", r.measured_new_seconds() * 1e3)
                       : "-"});
    }
    PrintTable(t, "  ");
  }
  if (s.conditions_size() > 0) {
    std::printf("conditions:\n");
    std::vector<std::vector<std::string>> t = {
        {"TYPE", "STATUS", "REASON", "AGE", "MESSAGE"}};
    for (const gpipe::v1::Condition& c : s.conditions()) {
      t.push_back({c.type(), c.status() ? "True" : "False",
                   c.reason().empty() ? "-" : c.reason(), Age(c.time()),
                   c.message()});
    }
    PrintTable(t, "  ");
  }
}

// The bubble the job's schedule has in theory, and each worker's for the
// cut it runs, for the K stages and the micro-batches each replica runs now
// (an elastic job may run fewer stages or replicas than its spec): the
// controller's from the stages' measured times once it has them, before
// that the cost model's, simulated once per cut (`cut` keeps the last).
struct CutFigures {
  std::vector<int64_t> balance;
  int64_t micro_batches = 0;
  int64_t replicas = 0;
  std::vector<double> bubbles;
};
std::string TheoryText(const gpipe::v1::JobSpec& spec,
                       const gpipe::v1::JobStatus& s, CutFigures& cut) {
  const ScheduleKind kind = ScheduleFromSpec(spec.pipeline().schedule());
  const int64_t v =
      std::max<int64_t>(1, ChunksPerWorker(kind, VirtualStageCount(spec)));
  // stages: replica 0's; replica_stages: the other replicas', each with its
  // share of the micro-batches.
  int64_t replicas = 1;
  for (const gpipe::v1::StageStatus& st : s.replica_stages())
    replicas = std::max(replicas, st.replica() + 1);
  const int64_t m = MicroBatchCount(spec) / replicas;
  // The controller's figures from the stages' measured times, once it has
  // them; the cost model's on its nominal machine before.
  const int64_t k = s.stages_size() / v;
  if (s.cut_bubbles_size() == k && k > 0) {
    return BubbleTheoryText(kind, k, m, v,
                            {s.cut_bubbles().begin(), s.cut_bubbles().end()});
  }
  // The status lists the stages in model order.
  std::vector<int64_t> balance;
  for (const gpipe::v1::StageStatus& st : s.stages())
    balance.push_back(st.layer_end() - st.layer_begin());
  if (balance != cut.balance || m != cut.micro_batches ||
      replicas != cut.replicas) {
    cut.balance = balance;
    cut.micro_batches = m;
    cut.replicas = replicas;
    cut.bubbles = CutBubbles(spec, kind, RematFromSpec(spec.pipeline().remat()),
                             balance, m, v, spec.batch_size() / replicas);
  }
  return BubbleTheoryText(kind, k, m, v, cut.bubbles);
}

// Per-worker utilization and bubble of the last step, for the progress bar
// (StageFiguresLine); empty before any report. A worker of several stages
// (an interleaved schedule's chunks) is busy for their busy time together,
// and idle for the rest of its step.
std::string StageFiguresText(const gpipe::v1::JobSpec& spec,
                             const gpipe::v1::JobStatus& s, CutFigures& cut) {
  struct Worker {
    std::string id;
    double busy = 0, bubble = 0, step = 0;
    int stages = 0;
  };
  std::vector<Worker> workers;
  for (const gpipe::v1::StageStatus& st : s.stages()) {
    if (st.step_seconds() <= 0) return "";
    auto it =
        std::find_if(workers.begin(), workers.end(),
                     [&](const Worker& w) { return w.id == st.worker_id(); });
    if (it == workers.end() || st.worker_id().empty()) {
      workers.push_back({st.worker_id()});
      it = std::prev(workers.end());
    }
    it->busy += st.busy_seconds();
    it->bubble += st.bubble_seconds();
    it->step = std::max(it->step, st.step_seconds());
    ++it->stages;
  }
  std::vector<WorkerFigures> figures;
  for (const Worker& w : workers) {
    const double u = std::clamp(w.busy / w.step, 0.0, 1.0);
    figures.push_back(
        {u, w.stages == 1 ? std::clamp(w.bubble / w.step, 0.0, 1.0) : 1.0 - u});
  }
  return StageFiguresLine(figures, TheoryText(spec, s, cut));
}

std::string WorkerStateName(gpipe::v1::WorkerState state) {
  if (state == gpipe::v1::WORKER_STATE_UNSPECIFIED) return "UNKNOWN";
  return gpipe::v1::WorkerState_Name(state);
}

// Draws a watched job: the progress bar while it trains, a line whenever
// its state changes or something happens to it, a summary at the end.
class JobFollower {
 public:
  JobFollower(bool json, std::optional<std::string> model_path)
      : json_(json), model_path_(std::move(model_path)) {}

  // The watch is back after losing its controller: the time away is no
  // part of the job's rate.
  void OnResumed() {
    if (progress_ != nullptr) progress_->RestartRate();
    resumed_ = true;
  }

  void OnEvent(const gpipe::v1::JobEvent& event) {
    job_ = event.job();
    if (json_) {
      PrintJson(model_path_ ? WithModelPath(event, *model_path_) : event);
      return;
    }
    const gpipe::v1::JobStatus& s = job_.status();
    const bool state_changed = !seen_ || s.state() != state_;
    const bool epoch_changed = seen_ && s.epoch() != epoch_;
    // Progress reports move the step, the loss or the rate, and the bar
    // shows them; other messages (assignments, a lost worker, a finished
    // stage) are news worth a line of their own.
    const bool progress = seen_ && (s.step() != step_ || s.loss() != loss_ ||
                                    s.samples_per_second() != rate_);
    const bool news = !event.message().empty() &&
                      event.message() != last_message_ && !progress;
    const bool terminal = IsTerminal(s.state());
    // Back from a controller restart, what happened meanwhile: the job
    // restarted from a checkpoint (its events went with the old
    // controller, and the step going back was a silent surprise).
    const bool restarted_away = resumed_ && seen_ && !terminal &&
                                (s.restarts() > restarts_ || epoch_changed);
    if (restarted_away) {
      if (progress_ != nullptr) progress_->Finish();
      // The running condition says where the new epoch began.
      const std::string running = ConditionMessage(s, "Running");
      size_t at = running.find("restored the checkpoint");
      if (at == std::string::npos) at = running.find("resumed step");
      std::string line = absl::StrCat(
          job_.id(), " ", StateName(s.state()),
          ": restarted while the watch was away (epoch ", s.epoch(),
          s.restarts() > 0
              ? absl::StrCat(", ", s.restarts(),
                             s.restarts() == 1 ? " restart" : " restarts",
                             " in all")
              : "",
          ")");
      if (at != std::string::npos) {
        absl::StrAppend(&line, ": ",
                        running.substr(at, running.find(';', at) - at));
      }
      std::printf("%s\n", line.c_str());
      std::fflush(stdout);
    }
    resumed_ = false;
    // A periodic evaluation reads as `gpipectl train` prints it:
    // "step 20: test loss ...". The final one is in the summary. Every one
    // not yet shown, from the status's history: a watch away while the
    // controller restarted missed their events.
    std::vector<const gpipe::v1::Evaluation*> unseen;
    for (const gpipe::v1::Evaluation& e : s.evaluations()) unseen.push_back(&e);
    unseen.push_back(&s.latest_evaluation());
    std::sort(unseen.begin(), unseen.end(), [](const auto* a, const auto* b) {
      return a->step() < b->step();
    });
    bool evaluated = false;
    for (const gpipe::v1::Evaluation* e : unseen) {
      if (e->counted() == 0 || e->step() <= eval_step_ ||
          e->step() >= s.total_steps()) {
        continue;
      }
      if (progress_ != nullptr) progress_->Finish();
      std::printf("step %lld: %s\n", static_cast<long long>(e->step()),
                  EvaluationText(job_, *e).c_str());
      std::fflush(stdout);
      eval_step_ = e->step();
      evaluated = true;
    }
    if (evaluated && news) last_message_ = event.message();
    // The summary reports the terminal state.
    if (!terminal && !restarted_away &&
        (state_changed || epoch_changed || (news && !evaluated))) {
      if (progress_ != nullptr) progress_->Finish();
      std::string line = absl::StrCat(job_.id(), " ", StateName(s.state()));
      if (!event.message().empty())
        absl::StrAppend(&line, ": ", event.message());
      std::printf("%s\n", line.c_str());
      std::fflush(stdout);
      last_message_ = event.message();
    }
    // The bar's clock starts when training does (or when the watch begins,
    // for a job that already runs), so samples/s counts training time only.
    if (progress_ == nullptr && s.total_steps() > 0 && !terminal &&
        s.state() != gpipe::v1::PENDING &&
        s.state() != gpipe::v1::JOB_STATE_UNSPECIFIED) {
      progress_ = std::make_unique<Progress>(s.total_steps(), stderr, s.step());
    }
    if (progress_ != nullptr && seen_ && s.step() > step_) {
      progress_->SetSuffix(StageFiguresText(job_.spec(), s, cut_));
      progress_->Update(s.step(), s.loss(),
                        s.step() * job_.spec().batch_size());
    }
    if (!event.message().empty()) final_message_ = event.message();
    seen_ = true;
    state_ = s.state();
    epoch_ = s.epoch();
    step_ = s.step();
    loss_ = s.loss();
    rate_ = s.samples_per_second();
    restarts_ = s.restarts();
  }

  void EndBar() {
    if (progress_ != nullptr) progress_->Finish();
  }

  // The final state, evaluation and model path.
  void PrintSummary() const {
    if (json_) return;
    const gpipe::v1::JobStatus& s = job_.status();
    std::string line = absl::StrCat(job_.id(), " ", StateName(s.state()), ": ",
                                    StepText(s), " steps");
    if (IsSet(s.started()) && IsSet(s.finished())) {
      absl::StrAppend(&line, " in ", absl::StrFormat("%.1fs", RunSeconds(s)));
      if (s.run_from_step() > 0) {
        absl::StrAppend(&line, " from step ", s.run_from_step());
      }
      // The average over that time, as the line reads (the status's rate
      // is the last step's alone).
      if (const double average = RunAverageRate(job_); average > 0) {
        absl::StrAppend(&line, absl::StrFormat(" (%.0f samples/s)", average));
      }
    }
    if (s.restarts() > 0)
      absl::StrAppend(&line, ", ", s.restarts(),
                      s.restarts() == 1 ? " restart" : " restarts");
    const std::string why =
        s.state() == gpipe::v1::FAILED      ? ConditionMessage(s, "Failed")
        : s.state() == gpipe::v1::CANCELLED ? ConditionMessage(s, "Cancelled")
                                            : "";
    if (!why.empty()) {
      absl::StrAppend(&line, ": ", why);
    } else if (s.state() != gpipe::v1::SUCCEEDED && !final_message_.empty()) {
      absl::StrAppend(&line, ": ", final_message_);
    }
    std::printf("%s\n", line.c_str());
    if (s.evaluation().counted() > 0)
      std::printf("final: %s\n", EvaluationText(job_, s.evaluation()).c_str());
    if (!s.evaluation_error().empty()) {
      std::printf("final: no evaluation: it failed after the training: %s\n",
                  s.evaluation_error().c_str());
    }
    if (!model_path_ && !s.model_path().empty())
      std::printf("model: %s\n", s.model_path().c_str());
    std::fflush(stdout);
  }

  const gpipe::v1::Job& job() const { return job_; }

 private:
  // `event` naming `path` for the controller's model path (its field, and
  // wherever its message and conditions say it); "" when the model is gone.
  static gpipe::v1::JobEvent WithModelPath(const gpipe::v1::JobEvent& event,
                                           const std::string& path) {
    const std::string from = event.job().status().model_path();
    if (from.empty()) return event;
    const std::string to =
        path.empty() ? "the local cluster's run directory, removed with it "
                       "(--out DIR keeps the model)"
                     : path;
    gpipe::v1::JobEvent shown = event;
    gpipe::v1::JobStatus& s = *shown.mutable_job()->mutable_status();
    s.set_model_path(path);
    shown.set_message(absl::StrReplaceAll(event.message(), {{from, to}}));
    for (gpipe::v1::Condition& c : *s.mutable_conditions())
      c.set_message(absl::StrReplaceAll(c.message(), {{from, to}}));
    return shown;
  }

  bool json_;
  std::optional<std::string> model_path_;
  gpipe::v1::Job job_;
  bool seen_ = false;
  gpipe::v1::JobState state_ = gpipe::v1::JOB_STATE_UNSPECIFIED;
  int64_t epoch_ = 0;
  int64_t eval_step_ = 0;  // of the last evaluation printed
  int64_t restarts_ = 0;
  bool resumed_ = false;  // the next event is the first after a reconnect
  double loss_ = 0;
  double rate_ = 0;
  int64_t step_ = 0;
  std::string last_message_;   // of the last line printed
  std::string final_message_;  // of the last event
  std::unique_ptr<Progress> progress_;
  CutFigures cut_;
};

int ExitCodeFor(const gpipe::v1::Job& job) {
  return job.status().state() == gpipe::v1::SUCCEEDED ? 0 : 1;
}

// Follows a job for `watch` and `submit --watch`.
int WatchToEnd(const char* command, ControllerClient& client,
               const std::string& job_id) {
  InstallInterruptHandlers();
  absl::StatusOr<gpipe::v1::Job> job =
      FollowJob(client, job_id, absl::GetFlag(FLAGS_json), &Interrupted);
  if (!job.ok()) {
    if (absl::IsCancelled(job.status())) {
      std::fprintf(stderr,
                   "gpipectl %s: stopped watching %s; it keeps running "
                   "(gpipectl cancel %s stops it)\n",
                   command, job_id.c_str(), job_id.c_str());
      return 1;
    }
    return Fail(command, job.status());
  }
  return ExitCodeFor(*job);
}

}  // namespace

void InstallInterruptHandlers() {
  struct sigaction action = {};
  action.sa_handler = OnInterrupt;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESETHAND;  // a second Ctrl-C kills at once
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
}

bool Interrupted() { return g_interrupted != 0; }

ControllerClient MakeControllerClient() { return MakeClient(); }

absl::Status CheckControllerAddress() {
  return CheckPortInRange(absl::GetFlag(FLAGS_controller).empty()
                              ? "$GPIPE_CONTROLLER"
                              : "--controller",
                          ControllerAddress());
}

namespace {

// `given` collects the flags that changed the spec, as typed
// ("--stages 50 --micro-batches 8").
absl::Status ApplySpecFlags(gpipe::v1::JobSpec& spec, bool measured_balance,
                            std::string* given) {
  const auto note = [&](absl::string_view flag, const auto& value) {
    absl::StrAppend(given, given->empty() ? "" : " ", "--", flag, " ", value);
  };
  gpipe::v1::PipelineSpec& p = *spec.mutable_pipeline();
  const int64_t chunks_before = ChunkCount(spec);
  if (absl::GetFlag(FLAGS_stages) > 0) {
    p.set_stages(absl::GetFlag(FLAGS_stages));
    note("stages", absl::GetFlag(FLAGS_stages));
    // `train` runs no elastic cluster: a floor for shrinking one is moot,
    // and above the K asked for it would refuse the reference run.
    if (measured_balance && p.min_stages() > p.stages())
      p.set_min_stages(p.stages());
  }
  if (absl::GetFlag(FLAGS_micro_batches) > 0) {
    p.set_micro_batches(absl::GetFlag(FLAGS_micro_batches));
    note("micro-batches", absl::GetFlag(FLAGS_micro_batches));
  }
  if (absl::GetFlag(FLAGS_replicas) > 0) {
    p.set_replicas(absl::GetFlag(FLAGS_replicas));
    note("replicas", absl::GetFlag(FLAGS_replicas));
  }
  absl::StatusOr<int64_t> steps = StepCountFlag();
  if (!steps.ok()) return steps.status();
  if (*steps > 0) {
    spec.set_steps(*steps);
    note("steps", *steps);
  }
  if (!absl::GetFlag(FLAGS_schedule).empty()) {
    absl::StatusOr<ScheduleKind> s =
        ParseScheduleName(absl::GetFlag(FLAGS_schedule));
    if (!s.ok())
      return absl::InvalidArgumentError(
          absl::StrCat("--", s.status().message()));
    p.set_schedule(ScheduleToSpec(*s));
    note("schedule", absl::GetFlag(FLAGS_schedule));
    // A schedule of one chunk per worker has no virtual stages to keep.
    if (!Interleaves(*s)) p.clear_virtual_stages();
  }
  if (absl::GetFlag(FLAGS_virtual_stages) > 0) {
    if (!Interleaves(ScheduleFromSpec(p.schedule()))) {
      return absl::InvalidArgumentError(
          "--virtual-stages: only the interleaved and zb-v schedules hold "
          "several chunks per worker (--schedule interleaved or zb-v)");
    }
    p.set_virtual_stages(absl::GetFlag(FLAGS_virtual_stages));
    note("virtual-stages", absl::GetFlag(FLAGS_virtual_stages));
  } else if (!absl::GetFlag(FLAGS_schedule).empty() &&
             Interleaves(ScheduleFromSpec(p.schedule())) &&
             p.virtual_stages() == 0) {
    p.set_virtual_stages(2);  // --schedule interleaved alone, as train takes it
  }
  if (!absl::GetFlag(FLAGS_remat).empty()) {
    absl::StatusOr<RematMode> r = ParseRematName(absl::GetFlag(FLAGS_remat));
    if (!r.ok())
      return absl::InvalidArgumentError(
          absl::StrCat("--", r.status().message()));
    p.set_remat(RematToSpec(*r));
    note("remat", absl::GetFlag(FLAGS_remat));
  }
  const std::string balance = absl::GetFlag(FLAGS_balance);
  if (balance == "measured" && !measured_balance) {
    return absl::InvalidArgumentError(
        "--balance measured works with `gpipectl train` only; give a list "
        "of layer counts such as 2,3,1");
  }
  // The spec's balance cuts the model into its own number of chunks: other
  // stages or schedule flags (--stages 1 for the reference trainer,
  // --schedule interleaved) cut it afresh unless --balance lists the cut.
  if ((balance.empty() || balance == "measured") &&
      ChunkCount(spec) != chunks_before) {
    p.clear_balance();
  }
  if (!balance.empty() && balance != "measured") {
    p.clear_balance();
    note("balance", balance);
    for (absl::string_view part : absl::StrSplit(balance, ',')) {
      int64_t n = 0;
      if (!absl::SimpleAtoi(part, &n)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--balance: '", balance, "' is not a list of layer counts"));
      }
      p.add_balance(n);
    }
  }
  return absl::OkStatus();
}

// The file's spec with its data paths made absolute, not yet checked.
absl::StatusOr<gpipe::v1::JobSpec> LoadResolved(const std::string& path) {
  absl::StatusOr<gpipe::v1::JobSpec> spec =
      LoadJobSpecFile(path, SpecCheck::kJsonOnly);
  if (!spec.ok()) return spec.status();
  std::error_code cwd_error;
  ResolveDataPaths(std::filesystem::current_path(cwd_error).string(), &*spec);
  return spec;
}

// The file as it is, without the flags, checked as LoadSpecWithFlags
// checks it.
bool ChecksWithoutFlags(const std::string& path) {
  absl::StatusOr<gpipe::v1::JobSpec> spec = LoadResolved(path);
  if (!spec.ok() || !AdoptInitFromPreprocessing(&*spec).ok()) return false;
  return CheckJobSpec(&*spec).ok();
}

}  // namespace

absl::StatusOr<gpipe::v1::JobSpec> LoadSpecWithFlags(const std::string& path,
                                                     bool measured_balance) {
  absl::StatusOr<gpipe::v1::JobSpec> spec = LoadResolved(path);
  if (!spec.ok()) return spec.status();
  std::string flags;  // as given, for errors a flag may have caused
  RETURN_IF_ERROR(ApplySpecFlags(*spec, measured_balance, &flags));
  if (absl::Status s = AdoptInitFromPreprocessing(&*spec); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(path, ": ", s.message()));
  }
  if (absl::Status s = CheckJobSpec(&*spec); !s.ok()) {
    // A file that checks without the flags was made invalid by them: a
    // usage error (exit 2), as the flags' own range checks are; it read as
    // a failure (exit 1) when found this deep.
    if (!flags.empty() && absl::IsInvalidArgument(s) &&
        ChecksWithoutFlags(path)) {
      return absl::InvalidArgumentError(absl::StrCat(
          flags, ": ", s.message(), " (", path, " is valid without them)"));
    }
    return absl::Status(
        s.code(), absl::StrCat(path, flags.empty() ? "" : " with ", flags, ": ",
                               s.message()));
  }
  return spec;
}

absl::StatusOr<gpipe::v1::Job> FollowJob(
    ControllerClient& client, const std::string& job_id, bool json,
    const std::function<bool()>& stop, std::optional<std::string> model_path) {
  JobFollower follower(json, std::move(model_path));
  absl::Status s = client.WatchJob(
      job_id,
      [&](const gpipe::v1::JobEvent& event) { follower.OnEvent(event); }, stop,
      absl::Seconds(30), [&] { follower.OnResumed(); });
  follower.EndBar();
  if (!s.ok()) return s;
  follower.PrintSummary();
  return follower.job();
}

int RunSubmit(const std::vector<std::string>& args) {
  if (args.size() != 1) {
    return Usage(
        "submit JOB.json [--watch] [--stages K] [--micro-batches M] "
        "[--schedule gpipe|1f1b|zb-h1|interleaved|zb-v] [--remat "
        "always|except_last|never] "
        "[--steps N] [--balance 2,3,1] [--controller ADDR] [--json]");
  }
  absl::StatusOr<gpipe::v1::JobSpec> spec = LoadSpecWithFlags(args[0]);
  if (!spec.ok()) return Fail("submit", spec.status());
  ControllerClient client = MakeClient();
  absl::StatusOr<gpipe::v1::Job> job = client.SubmitJob(*spec);
  if (!job.ok()) return Fail("submit", job.status());
  const bool watch = absl::GetFlag(FLAGS_watch);
  if (absl::GetFlag(FLAGS_json))
    PrintJson(*job);
  else
    std::printf("%s\n", job->id().c_str());
  std::fflush(stdout);
  if (!watch) return 0;
  return WatchToEnd("submit", client, job->id());
}

namespace {

// The job table, for `list` and `status` without a job; errors name
// `command`, the one the user typed.
int ListJobs(const char* command) {
  ControllerClient client = MakeClient();
  absl::StatusOr<gpipe::v1::ListJobsResponse> list = client.ListJobs();
  if (!list.ok()) return Fail(command, list.status());
  if (absl::GetFlag(FLAGS_json))
    PrintListJson(*list);
  else
    PrintJobTable(*list);
  return 0;
}

}  // namespace

int RunList(const std::vector<std::string>& args) {
  if (!args.empty()) return Usage("list [--controller ADDR] [--json]");
  return ListJobs("list");
}

int RunStatus(const std::vector<std::string>& args) {
  if (args.empty()) return ListJobs("status");
  if (args.size() != 1)
    return Usage("status [JOB] [--controller ADDR] [--json]");
  ControllerClient client = MakeClient();
  absl::StatusOr<gpipe::v1::Job> job = client.GetJob(args[0]);
  if (!job.ok()) return Fail("status", job.status());
  if (absl::GetFlag(FLAGS_json))
    PrintJson(*job);
  else
    PrintJobDetail(*job);
  return 0;
}

int RunWatch(const std::vector<std::string>& args) {
  if (args.size() != 1) return Usage("watch JOB [--controller ADDR] [--json]");
  ControllerClient client = MakeClient();
  return WatchToEnd("watch", client, args[0]);
}

int RunCancel(const std::vector<std::string>& args) {
  if (args.size() != 1) return Usage("cancel JOB [--controller ADDR] [--json]");
  ControllerClient client = MakeClient();
  absl::StatusOr<gpipe::v1::Job> job = client.CancelJob(args[0]);
  if (!job.ok()) return Fail("cancel", job.status());
  if (absl::GetFlag(FLAGS_json)) {
    PrintJson(*job);
  } else {
    std::printf("%s %s\n", job->id().c_str(),
                StateName(job->status().state()).c_str());
  }
  return 0;
}

int RunResume(const std::vector<std::string>& args) {
  constexpr char kUsage[] =
      "resume JOB [--steps N] [--watch] [--controller ADDR] [--json]";
  if (args.size() != 1) return Usage(kUsage);
  // Named as submit names it (a bare usage line said nothing of why).
  absl::StatusOr<int64_t> steps = StepCountFlag();
  if (!steps.ok()) return Fail("resume", steps.status());
  ControllerClient client = MakeClient();
  absl::StatusOr<gpipe::v1::Job> job = client.ResumeJob(args[0], *steps);
  if (!job.ok()) return Fail("resume", job.status());
  const bool watch = absl::GetFlag(FLAGS_watch);
  if (absl::GetFlag(FLAGS_json)) {
    PrintJson(*job);
  } else {
    const gpipe::v1::Condition* running = nullptr;
    for (const auto& c : job->status().conditions()) {
      if (c.type() == "Running") running = &c;
    }
    // Where it continues from, which the scheduler's message no longer
    // says once the job started again: a job without a checkpoint starts
    // from the beginning.
    const gpipe::v1::JobStatus& s = job->status();
    if (running == nullptr || running->reason() != "Resumed") {
      const int64_t from = s.run_from_step();
      // Without a checkpoint a job started from a model's step starts
      // there again (init_from).
      const std::string where =
          !s.checkpoints().empty()
              ? (from > 0 ? absl::StrCat("the checkpoint of step ", from)
                          : "the beginning")
          : from > 0
              ? absl::StrCat("step ", from,
                             ", where its init_from model left off (it has "
                             "no checkpoint)")
              : "the beginning (it has no checkpoint)";
      std::printf("%s resumed from %s, %lld steps in all\n", job->id().c_str(),
                  where.c_str(), static_cast<long long>(s.total_steps()));
    }
    std::printf("%s %s: %s\n", job->id().c_str(), StateName(s.state()).c_str(),
                running != nullptr ? running->message().c_str() : "resumed");
  }
  if (!watch) return 0;
  return WatchToEnd("resume", client, job->id());
}

int RunDelete(const std::vector<std::string>& args) {
  if (args.size() != 1) return Usage("delete JOB [--controller ADDR] [--json]");
  ControllerClient client = MakeClient();
  if (absl::Status s = client.DeleteJob(args[0]); !s.ok()) {
    return Fail("delete", s);
  }
  if (absl::GetFlag(FLAGS_json)) {
    // The response is empty: the request, which names the job deleted.
    gpipe::v1::DeleteJobRequest deleted;
    deleted.set_job_id(args[0]);
    PrintJson(deleted);
  } else {
    std::printf("%s deleted\n", args[0].c_str());
  }
  return 0;
}

int RunFetch(const std::vector<std::string>& args) {
  const std::vector<std::string> out = absl::GetFlag(FLAGS_o);
  if (args.size() != 1 || out.size() > 1) {
    return Usage("fetch JOB [-o DIR] [--step N] [--controller ADDR]");
  }
  // No --step: the final model (the request's step 0). A --step 0 was read
  // as none and fetched the final model without a word.
  int64_t step = 0;
  if (const std::string given = absl::GetFlag(FLAGS_step); !given.empty()) {
    if (!absl::SimpleAtoi(given, &step) || step < 1) {
      return Fail("fetch",
                  absl::InvalidArgumentError(absl::StrCat(
                      "--step: must be a step a committed checkpoint follows, "
                      ">= 1 (without --step: the final model), got '",
                      given, "'")));
    }
  }
  const std::string dir = out.empty() || out[0].empty() ? "." : out[0];
  ControllerClient client = MakeClient();
  absl::StatusOr<std::vector<DownloadedFile>> files =
      client.FetchModel(args[0], step, dir);
  if (!files.ok()) return Fail("fetch", files.status());
  for (const DownloadedFile& f : *files) {
    std::printf("%s  %lld bytes  sha256 %s\n", f.path.c_str(),
                static_cast<long long>(f.bytes), f.sha256.c_str());
  }
  return 0;
}

int RunWorkers(const std::vector<std::string>& args) {
  if (!args.empty()) return Usage("workers [--controller ADDR] [--json]");
  ControllerClient client = MakeClient();
  absl::StatusOr<gpipe::v1::ListWorkersResponse> list = client.ListWorkers();
  if (!list.ok()) return Fail("workers", list.status());
  if (absl::GetFlag(FLAGS_json)) {
    PrintJson(*list);
    return 0;
  }
  if (list->workers().empty()) {
    std::printf("no workers attached\n");
    return 0;
  }
  std::vector<std::vector<std::string>> rows = {{"ID", "ADDRESS", "STATE",
                                                 "JOB", "STAGE", "CPUS",
                                                 "MEMORY", "HEARTBEAT"}};
  for (const gpipe::v1::WorkerInfo& w : list->workers()) {
    const bool busy = !w.job_id().empty();
    rows.push_back(
        {w.worker_id(), w.address().empty() ? "-" : w.address(),
         w.held_back().empty()
             ? std::string(WorkerStateName(w.state()))
             : absl::StrCat(WorkerStateName(w.state()), " (held back)"),
         busy ? w.job_id() : "-",
         busy ? absl::StrCat(w.stage(),
                             w.replica() > 0
                                 ? absl::StrCat(" (replica ", w.replica(), ")")
                                 : "")
              : "-",
         w.resources().cpus() > 0 ? absl::StrCat(w.resources().cpus()) : "-",
         w.resources().memory_bytes() > 0
             ? FormatBytes(w.resources().memory_bytes())
             : "-",
         IsSet(w.last_heartbeat())
             ? absl::StrCat(Age(w.last_heartbeat()), " ago")
             : "-"});
  }
  PrintTable(rows);
  for (const gpipe::v1::WorkerInfo& w : list->workers()) {
    if (!w.held_back().empty()) {
      std::printf("%s is held back: %s\n", w.worker_id().c_str(),
                  w.held_back().c_str());
    }
  }
  return 0;
}

}  // namespace gpipe::cli
