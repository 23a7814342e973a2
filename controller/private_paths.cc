#include "controller/private_paths.h"

#include <filesystem>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "services/pipeline/data_resolution.h"

namespace gpipe::controller {
namespace {

namespace fs = std::filesystem;

// The path with links and ".." resolved as far as it exists.
fs::path Resolved(const std::string& path) {
  std::error_code ec;
  fs::path p = fs::weakly_canonical(fs::path(path), ec);
  return ec ? fs::path(path).lexically_normal() : p;
}

// Whether `inner` is `outer` or lies under it.
bool Within(const fs::path& inner, const fs::path& outer) {
  auto i = inner.begin();
  for (auto o = outer.begin(); o != outer.end(); ++o, ++i) {
    if (i == inner.end() || *i != *o) return false;
  }
  return true;
}

}  // namespace

absl::Status CheckNoPrivatePaths(
    const gpipe::v1::JobSpec& spec,
    const std::vector<std::string>& private_files) {
  std::vector<fs::path> secrets;
  for (const std::string& f : private_files)
    if (!f.empty()) secrets.push_back(Resolved(f));
  if (secrets.empty()) return absl::OkStatus();
  for (const auto& [field, path] : SpecPaths(spec)) {
    if (path.empty()) continue;
    const fs::path p = Resolved(path);
    for (const fs::path& secret : secrets) {
      if (Within(secret, p)) {
        return absl::PermissionDeniedError(absl::StrCat(
            field, ": ", path,
            " is, or holds, one of the controller's own files (its tokens, "
            "TLS key or job store), which a job may not read"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace gpipe::controller
