// A trace drawn as an SVG picture: one row per stage, time to the right, a
// box per op coloured by phase (micro-batch number inside when it fits, a
// tooltip with the details), thin marks where each step starts on each
// stage, each stage's busy share at the right, a legend and a time axis in
// milliseconds. The light grey row behind the boxes is idle time: the
// pipeline's bubbles. Well-formed XML; every text is escaped.
#ifndef GPIPE_SERVICES_TELEMETRY_TIMELINE_SVG_H_
#define GPIPE_SERVICES_TELEMETRY_TIMELINE_SVG_H_

#include <string>
#include <string_view>

#include "gpipe/v1/controller.pb.h"

namespace gpipe {

std::string TimelineSvg(const gpipe::v1::GetTraceResponse& trace);

// `text` with &, <, >, " and ' escaped, for XML text and attributes;
// control characters XML 1.0 forbids become U+FFFD.
std::string XmlEscape(std::string_view text);

}  // namespace gpipe

#endif  // GPIPE_SERVICES_TELEMETRY_TIMELINE_SVG_H_
