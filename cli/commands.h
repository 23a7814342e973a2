// The subcommands of gpipectl; each returns the process exit code.
#ifndef GPIPE_CLI_COMMANDS_H_
#define GPIPE_CLI_COMMANDS_H_

#include <string>
#include <vector>

namespace gpipe::cli {

int RunTrain(const std::vector<std::string>& args);
int RunPlan(const std::vector<std::string>& args);

}  // namespace gpipe::cli

#endif  // GPIPE_CLI_COMMANDS_H_
