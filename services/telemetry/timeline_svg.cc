#include "services/telemetry/timeline_svg.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "services/telemetry/step_trace.h"

namespace gpipe {

namespace v1 = gpipe::v1;

namespace {

// Layout, in SVG user units (px).
constexpr double kWidth = 1200;
constexpr double kLeft = 120;   // track labels ("replica 1 stage 2")
constexpr double kRight = 90;   // busy share
constexpr double kTop = 58;     // title and step labels
constexpr double kRow = 30;     // per track
constexpr double kBox = 22;     // op box height within a row
constexpr double kAxis = 34;    // time axis below the rows
constexpr double kLegend = 30;  // legend below the axis

struct PhaseStyle {
  v1::OpTrace::Phase phase;
  const char* label;
  const char* fill;
};
// Colour-blind-safe (Tableau 10) and distinct in grey scale.
constexpr PhaseStyle kPhases[] = {
    {v1::OpTrace::FORWARD, "forward", "#4e79a7"},
    {v1::OpTrace::BACKWARD, "backward", "#f28e2b"},
    {v1::OpTrace::RECOMPUTE, "recompute", "#edc948"},
    {v1::OpTrace::OPTIMIZER, "optimizer", "#59a14f"},
    {v1::OpTrace::BACKWARD_INPUT, "backward (input)", "#e15759"},
    {v1::OpTrace::BACKWARD_WEIGHT, "backward (weight)", "#b07aa1"},
};
constexpr const char* kIdleFill = "#eeeeee";
constexpr const char* kOtherFill = "#999999";

const char* Fill(v1::OpTrace::Phase phase) {
  for (const PhaseStyle& s : kPhases)
    if (s.phase == phase) return s.fill;
  return kOtherFill;
}

// Text on a dark or a light fill.
const char* TextColour(v1::OpTrace::Phase phase) {
  return phase == v1::OpTrace::FORWARD ? "#ffffff" : "#222222";
}

std::string Num(double v) { return absl::StrFormat("%.2f", v); }

// A tick spacing of 1, 2 or 5 times a power of ten giving about `target`
// ticks over `span`.
double TickStep(double span, int target) {
  if (span <= 0) return 1;
  const double raw = span / target;
  const double power = std::pow(10.0, std::floor(std::log10(raw)));
  for (const double m : {1.0, 2.0, 5.0}) {
    if (raw <= m * power) return m * power;
  }
  return 10 * power;
}

std::string Milliseconds(double ms) {
  return absl::StrFormat(ms < 10 ? "%.3g ms" : "%.4g ms", ms);
}

}  // namespace

std::string XmlEscape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    const unsigned char u = static_cast<unsigned char>(c);
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        if (u < 0x20 && c != '\t' && c != '\n' && c != '\r') {
          out += "\xEF\xBF\xBD";  // U+FFFD: XML 1.0 has no escape for these
        } else {
          out += c;
        }
    }
  }
  return out;
}

std::string TimelineSvg(const v1::GetTraceResponse& trace) {
  const TimeSpan span = Span(trace);
  const std::vector<TraceTrack> tracks = ByTrack(trace);
  const bool replicas = HasReplicas(tracks);
  const double rows = static_cast<double>(std::max<size_t>(tracks.size(), 1));
  const double height = kTop + rows * kRow + kAxis + kLegend + 8;
  const double plot = kWidth - kLeft - kRight;
  const double total_ms = std::max(1e-6, (span.end_ns - span.begin_ns) * 1e-6);
  auto x_of = [&](int64_t ns) {
    return kLeft + (ns - span.begin_ns) * 1e-6 / total_ms * plot;
  };

  std::string svg = absl::StrCat(
      R"(<?xml version="1.0" encoding="UTF-8"?>)", "\n",
      R"(<svg xmlns="http://www.w3.org/2000/svg" width=")", Num(kWidth),
      R"(" height=")", Num(height), R"(" viewBox="0 0 )", Num(kWidth), " ",
      Num(height),
      R"(" font-family="DejaVu Sans, Helvetica, Arial, sans-serif" font-size="11">)",
      "\n");
  int64_t first_step = 0, last_step = -1;
  bool any = false;
  for (const v1::StepTrace& s : trace.steps()) {
    first_step = any ? std::min(first_step, s.step()) : s.step();
    last_step = any ? std::max(last_step, s.step()) : s.step();
    any = true;
  }
  const std::string title = absl::StrCat(
      "gpipe ", trace.job_id(), ": K=", trace.stages(), " stages, ",
      trace.replicas() > 1 ? absl::StrCat("R=", trace.replicas(), " replicas, ")
                           : std::string(),
      "M=", trace.micro_batches(), " micro-batches, ",
      v1::Schedule_Name(trace.schedule()),
      any ? absl::StrCat(", steps ", first_step, "..", last_step) : "", ", ",
      Milliseconds(total_ms));
  absl::StrAppend(&svg, R"(<rect width="100%" height="100%" fill="#ffffff"/>)",
                  "\n", R"(<text x=")", Num(kLeft),
                  R"(" y="18" font-size="14" font-weight="bold">)",
                  XmlEscape(title), "</text>\n");

  for (size_t row = 0; row < tracks.size(); ++row) {
    const TraceTrack& track = tracks[row];
    const std::string name = TrackName(track, replicas);
    const double y = kTop + row * kRow;
    const double box_y = y + (kRow - kBox) / 2;
    absl::StrAppend(
        &svg, R"(<g class="stage" id=")",
        replicas ? absl::StrCat("replica-", track.replica, "-") : std::string(),
        "stage-", track.stage, R"(">)", "\n");
    absl::StrAppend(&svg, R"(<text x=")", Num(kLeft - 8), R"(" y=")",
                    Num(y + kRow / 2 + 4), R"(" text-anchor="end">)", name,
                    "</text>\n");
    absl::StrAppend(&svg, R"(<rect x=")", Num(kLeft), R"(" y=")", Num(box_y),
                    R"(" width=")", Num(plot), R"(" height=")", Num(kBox),
                    R"(" fill=")", kIdleFill, R"("/>)", "\n");
    int64_t busy_ns = 0, wall_ns = 0;
    for (const v1::StepTrace* step : track.steps) {
      wall_ns += step->end_unix_ns() - step->start_unix_ns();
      for (const v1::OpTrace& op : step->ops()) {
        busy_ns += op.end_unix_ns() - op.start_unix_ns();
        const double x0 = x_of(op.start_unix_ns());
        const double w = std::max(0.5, x_of(op.end_unix_ns()) - x0);
        const std::string tip = absl::StrCat(
            name, ", step ", step->step(), ": ", PhaseName(op.phase()),
            op.micro_batch() >= 0
                ? absl::StrCat(" of micro-batch ", op.micro_batch())
                : "",
            ", ", Milliseconds((op.end_unix_ns() - op.start_unix_ns()) * 1e-6),
            op.bytes_sent() > 0 ? absl::StrCat(", sent ", op.bytes_sent(), " B")
                                : "",
            op.bytes_received() > 0
                ? absl::StrCat(", received ", op.bytes_received(), " B")
                : "");
        absl::StrAppend(&svg, R"(<rect class=")", PhaseName(op.phase()),
                        R"(" x=")", Num(x0), R"(" y=")", Num(box_y),
                        R"(" width=")", Num(w), R"(" height=")", Num(kBox),
                        R"(" fill=")", Fill(op.phase()),
                        R"(" stroke="#ffffff" stroke-width="0.5"><title>)",
                        XmlEscape(tip), "</title></rect>\n");
        const std::string label =
            op.micro_batch() >= 0 ? absl::StrCat(op.micro_batch()) : "opt";
        if (w >= 7.0 * label.size() + 4) {
          absl::StrAppend(&svg, R"(<text x=")", Num(x0 + w / 2), R"(" y=")",
                          Num(box_y + kBox / 2 + 4),
                          R"(" text-anchor="middle" font-size="10" fill=")",
                          TextColour(op.phase()), R"(">)", XmlEscape(label),
                          "</text>\n");
        }
      }
      // Where this stage's step begins: a dark mark across the row.
      const double sx = x_of(step->start_unix_ns());
      absl::StrAppend(
          &svg, R"(<line class="step" x1=")", Num(sx), R"(" y1=")", Num(y + 1),
          R"(" x2=")", Num(sx), R"(" y2=")", Num(y + kRow - 1),
          R"(" stroke="#333333" stroke-width="1.5"><title>)",
          XmlEscape(absl::StrCat(name, ": step ", step->step(), " begins")),
          "</title></line>\n");
      if (row == 0) {
        absl::StrAppend(&svg, R"(<text x=")", Num(sx + 2), R"(" y=")",
                        Num(kTop - 6), R"(" font-size="10" fill="#333333">)",
                        XmlEscape(absl::StrCat("step ", step->step())),
                        "</text>\n");
      }
    }
    if (wall_ns > 0) {
      absl::StrAppend(&svg, R"(<text x=")", Num(kWidth - kRight + 8),
                      R"(" y=")", Num(y + kRow / 2 + 4), R"(">)",
                      absl::StrFormat("busy %.0f%%", 100.0 * busy_ns / wall_ns),
                      "</text>\n");
    }
    absl::StrAppend(&svg, "</g>\n");
  }

  // Time axis.
  const double axis_y = kTop + rows * kRow + 4;
  absl::StrAppend(&svg, R"(<line x1=")", Num(kLeft), R"(" y1=")", Num(axis_y),
                  R"(" x2=")", Num(kLeft + plot), R"(" y2=")", Num(axis_y),
                  R"(" stroke="#333333"/>)", "\n");
  const double tick = TickStep(total_ms, 10);
  for (double t = 0; t <= total_ms + 1e-9; t += tick) {
    const double x = kLeft + t / total_ms * plot;
    absl::StrAppend(&svg, R"(<line x1=")", Num(x), R"(" y1=")", Num(axis_y),
                    R"(" x2=")", Num(x), R"(" y2=")", Num(axis_y + 5),
                    R"(" stroke="#333333"/>)", "\n", R"(<text x=")", Num(x),
                    R"(" y=")", Num(axis_y + 17), R"(" text-anchor="middle">)",
                    absl::StrFormat("%g", t), "</text>\n");
  }
  absl::StrAppend(&svg, R"(<text x=")", Num(kLeft + plot), R"(" y=")",
                  Num(axis_y + 30), R"(" text-anchor="end">time (ms)</text>)",
                  "\n");

  // Legend.
  const double legend_y = axis_y + kAxis - 8;
  double lx = kLeft;
  auto legend_entry = [&](const char* fill, const char* label) {
    absl::StrAppend(&svg, R"(<rect x=")", Num(lx), R"(" y=")", Num(legend_y),
                    R"(" width="14" height="14" fill=")", fill,
                    R"(" stroke="#999999" stroke-width="0.5"/>)", "\n",
                    R"(<text x=")", Num(lx + 19), R"(" y=")",
                    Num(legend_y + 11), R"(">)", XmlEscape(label), "</text>\n");
    lx += 28 + 7.0 * std::string_view(label).size();
  };
  for (const PhaseStyle& s : kPhases) legend_entry(s.fill, s.label);
  legend_entry(kIdleFill, "idle (bubble)");
  absl::StrAppend(&svg, R"(<line x1=")", Num(lx), R"(" y1=")", Num(legend_y),
                  R"(" x2=")", Num(lx), R"(" y2=")", Num(legend_y + 14),
                  R"(" stroke="#333333" stroke-width="1.5"/>)", "\n",
                  R"(<text x=")", Num(lx + 6), R"(" y=")", Num(legend_y + 11),
                  R"(">step begins</text>)", "\n");
  svg += "</svg>\n";
  return svg;
}

}  // namespace gpipe
