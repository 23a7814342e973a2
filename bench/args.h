// Command-line parsing for the benchmarks: positional arguments and
// "--name value" / "--name=value" options ('_' and '-' are the same).
#ifndef GPIPE_BENCH_ARGS_H_
#define GPIPE_BENCH_ARGS_H_

#include <algorithm>
#include <cstdlib>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace gpipe::bench {

class Args {
 public:
  // Parses argv against the option names in `known` and the value-less
  // switches in `switches` (both spelt with '-'). ok() is false, and error()
  // says why, on an unknown option or one without a value.
  Args(int argc, char** argv, const std::set<std::string>& known,
       const std::set<std::string>& switches = {}) {
    for (int i = 1; i < argc; ++i) {
      std::string a = argv[i];
      if (a.rfind("--", 0) != 0) {
        positional_.push_back(a);
        continue;
      }
      std::string name = a.substr(2), value;
      const size_t eq = name.find('=');
      const bool has_value = eq != std::string::npos;
      if (has_value) {
        value = name.substr(eq + 1);
        name = name.substr(0, eq);
      }
      std::replace(name.begin(), name.end(), '_', '-');
      if (switches.count(name) != 0 && !has_value) {
        options_[name] = "1";
        continue;
      }
      if (known.count(name) == 0) {
        error_ = "unknown option --" + name;
        return;
      }
      if (!has_value) {
        if (i + 1 >= argc) {
          error_ = "--" + name + " needs a value";
          return;
        }
        value = argv[++i];
      }
      options_[name] = value;
    }
  }

  bool ok() const { return error_.empty(); }
  const std::string& error() const { return error_; }
  const std::vector<std::string>& positional() const { return positional_; }

  bool Has(const std::string& name) const { return options_.count(name) != 0; }
  // The option's value as an integer, or `fallback` when it was not given.
  long Int(const std::string& name, long fallback) const {
    auto it = options_.find(name);
    return it == options_.end() ? fallback
                                : std::strtol(it->second.c_str(), nullptr, 10);
  }
  // The option's value as given, or `fallback` when it was not given.
  std::string Str(const std::string& name, const std::string& fallback) const {
    auto it = options_.find(name);
    return it == options_.end() ? fallback : it->second;
  }
  double Double(const std::string& name, double fallback) const {
    auto it = options_.find(name);
    return it == options_.end() ? fallback
                                : std::strtod(it->second.c_str(), nullptr);
  }

 private:
  std::vector<std::string> positional_;
  std::map<std::string, std::string> options_;
  std::string error_;
};

}  // namespace gpipe::bench

#endif  // GPIPE_BENCH_ARGS_H_
