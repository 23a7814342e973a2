// Writes a bound port to a file so a launcher (gpipectl local, a test) can
// find an endpoint that took a free port.
#ifndef GPIPE_SERVICES_TELEMETRY_PORT_FILE_H_
#define GPIPE_SERVICES_TELEMETRY_PORT_FILE_H_

#include <string>

#include "absl/status/status.h"

namespace gpipe {

// Through a temporary file and a rename: a reader sees nothing or the whole
// number.
absl::Status WritePortFile(const std::string& path, int port);

}  // namespace gpipe

#endif  // GPIPE_SERVICES_TELEMETRY_PORT_FILE_H_
