#include "services/storage/sha256.h"

#include <openssl/evp.h>

#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "services/core/status.h"
#include "services/storage/file_io.h"

namespace gpipe::storage {
namespace {

struct CtxFree {
  void operator()(EVP_MD_CTX* ctx) const { EVP_MD_CTX_free(ctx); }
};
using EvpCtx = std::unique_ptr<EVP_MD_CTX, CtxFree>;

EvpCtx NewCtx() {
  EvpCtx ctx(EVP_MD_CTX_new());
  EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr);
  return ctx;
}

std::string FinishDigest(EVP_MD_CTX* ctx) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  EVP_DigestFinal_ex(ctx, digest, &n);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex;
  hex.reserve(2 * n);
  for (unsigned int i = 0; i < n; ++i) {
    hex.push_back(kHex[digest[i] >> 4]);
    hex.push_back(kHex[digest[i] & 15]);
  }
  return hex;
}

}  // namespace

struct Sha256::Ctx {
  EvpCtx ctx = NewCtx();
};
Sha256::Sha256() : ctx_(std::make_unique<Ctx>()) {}
Sha256::~Sha256() = default;
Sha256::Sha256(Sha256&&) noexcept = default;
Sha256& Sha256::operator=(Sha256&&) noexcept = default;
void Sha256::Update(std::string_view bytes) {
  EVP_DigestUpdate(ctx_->ctx.get(), bytes.data(), bytes.size());
}
std::string Sha256::Finish() { return FinishDigest(ctx_->ctx.get()); }

std::string Sha256Hex(std::string_view bytes) {
  EvpCtx ctx = NewCtx();
  EVP_DigestUpdate(ctx.get(), bytes.data(), bytes.size());
  return FinishDigest(ctx.get());
}

absl::StatusOr<std::string> Sha256File(const std::string& path) {
  uint64_t size = 0;
  ASSIGN_OR_RETURN(ScopedFd fd, OpenForRead(path, &size));
  EvpCtx ctx = NewCtx();
  std::vector<char> chunk(1 << 20);
  for (uint64_t offset = 0; offset < size;) {
    const size_t n =
        static_cast<size_t>(std::min<uint64_t>(chunk.size(), size - offset));
    RETURN_IF_ERROR(ReadAt(fd, path, offset, chunk.data(), n));
    EVP_DigestUpdate(ctx.get(), chunk.data(), n);
    offset += n;
  }
  return FinishDigest(ctx.get());
}

}  // namespace gpipe::storage
