#include "cli/commands.h"

namespace gpipe::cli {

int RunTrain(const std::vector<std::string>& args) { return 1; }

}  // namespace gpipe::cli
