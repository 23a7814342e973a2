// services/security: token files, constant-time compare, bearer token
// checks, stream keys, and loading TLS files with errors that name the flag
// and the file (missing, unreadable, not PEM, a certificate without its
// key, a key of another certificate). Certificates are made here with
// OpenSSL, so the test needs no files of its own.
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/security/bearer_token.h"
#include "services/security/client_security.h"
#include "services/security/constant_time.h"
#include "services/security/secret_file.h"
#include "services/security/stream_key.h"
#include "services/security/tls.h"
#include "services/security/token_file.h"

namespace gpipe::security {
namespace {

using ::testing::HasSubstr;

class TempDir {
 public:
  TempDir() {
    char pattern[] = "/tmp/gpipe-security-test-XXXXXX";
    path_ = mkdtemp(pattern);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::string Write(const std::string& name, const std::string& text) const {
    const std::string p = path_ + "/" + name;
    std::ofstream(p) << text;
    return p;
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// A P-256 key and a self-signed certificate for it, as PEM.
struct KeyPair {
  std::string cert_pem, key_pem;
};

KeyPair MakeSelfSigned(const char* name) {
  EVP_PKEY* key = EVP_EC_gen("P-256");
  X509* cert = X509_new();
  ASN1_INTEGER_set(X509_get_serialNumber(cert), 1);
  X509_gmtime_adj(X509_getm_notBefore(cert), 0);
  X509_gmtime_adj(X509_getm_notAfter(cert), 3600);
  X509_set_pubkey(cert, key);
  X509_NAME* subject = X509_get_subject_name(cert);
  X509_NAME_add_entry_by_txt(subject, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>(name), -1,
                             -1, 0);
  X509_set_issuer_name(cert, subject);
  X509_sign(cert, key, EVP_sha256());
  KeyPair pair;
  BIO* bio = BIO_new(BIO_s_mem());
  PEM_write_bio_X509(bio, cert);
  char* data = nullptr;
  long n = BIO_get_mem_data(bio, &data);
  pair.cert_pem.assign(data, n);
  BIO_free(bio);
  bio = BIO_new(BIO_s_mem());
  PEM_write_bio_PrivateKey(bio, key, nullptr, nullptr, 0, nullptr, nullptr);
  n = BIO_get_mem_data(bio, &data);
  pair.key_pem.assign(data, n);
  BIO_free(bio);
  X509_free(cert);
  EVP_PKEY_free(key);
  return pair;
}

TEST(ConstantTimeEquals, ComparesBytesAndLengths) {
  EXPECT_TRUE(ConstantTimeEquals("", ""));
  EXPECT_TRUE(ConstantTimeEquals("secret-token", "secret-token"));
  EXPECT_FALSE(ConstantTimeEquals("secret-token", "secret-tokem"));
  EXPECT_FALSE(ConstantTimeEquals("secret-token", "Secret-token"));
  EXPECT_FALSE(ConstantTimeEquals("secret", "secret-token"));
  EXPECT_FALSE(ConstantTimeEquals("secret-token", ""));
  EXPECT_TRUE(
      ConstantTimeEquals(std::string("a\0b", 3), std::string("a\0b", 3)));
  EXPECT_FALSE(
      ConstantTimeEquals(std::string("a\0b", 3), std::string("a\0c", 3)));
}

TEST(TokenFile, OneTokenPerLineWithCommentsAndBlankLines) {
  auto tokens = ParseTokens(
      "# the job API\n\n  0123456789abcdef0123  \nsecond-token-abcdefgh\r\n"
      "   # indented comment\n",
      "t");
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  EXPECT_EQ(*tokens, (std::vector<std::string>{"0123456789abcdef0123",
                                               "second-token-abcdefgh"}));
}

TEST(TokenFile, RefusesBadTokensNamingTheLineNotTheToken) {
  auto empty = ParseTokens("# only a comment\n\n", "--api_token_file=x");
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(empty.status().message(),
              HasSubstr("--api_token_file=x: holds no token"));

  auto short_token = ParseTokens("# c\nshort\n", "f");
  EXPECT_THAT(short_token.status().message(), HasSubstr("f line 2"));
  EXPECT_THAT(short_token.status().message(), HasSubstr("shorter than 16"));
  EXPECT_THAT(short_token.status().message(),
              ::testing::Not(HasSubstr("short\n")));

  auto spaced = ParseTokens("0123456789 abcdef0123\n", "f");
  EXPECT_THAT(spaced.status().message(),
              HasSubstr("f line 1: a token may hold only printable ASCII"));
  EXPECT_THAT(spaced.status().message(),
              ::testing::Not(HasSubstr("0123456789")));
  auto binary = ParseTokens("0123456789abcdef\x01xyz\n", "f");
  EXPECT_EQ(binary.status().code(), absl::StatusCode::kInvalidArgument);
  auto utf8 = ParseTokens("0123456789abcdef\xc3\xa9\n", "f");
  EXPECT_EQ(utf8.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(SecretFile, ErrorsNameTheFlagAndTheFile) {
  TempDir dir;
  auto missing = ReadSecretFile("tls_ca", dir.path() + "/none.pem");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(),
              HasSubstr("--tls_ca=" + dir.path() + "/none.pem: no such file"));

  auto directory = ReadSecretFile("tls_cert", dir.path());
  EXPECT_EQ(directory.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(directory.status().message(), HasSubstr("is a directory"));

  // A FIFO with no writer is refused at once (opening it waited for ever,
  // deaf to SIGTERM), as is a device.
  const std::string fifo = dir.path() + "/fifo";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_THAT(ReadSecretFile("api_token_file", fifo).status().message(),
              HasSubstr("not a regular file"));
  EXPECT_THAT(ReadSecretFile("tls_key", "/dev/zero").status().message(),
              HasSubstr("not a regular file"));

  auto empty = ReadSecretFile("token_file", dir.Write("empty", ""));
  EXPECT_THAT(empty.status().message(), HasSubstr("the file is empty"));

  const std::string big =
      dir.Write("big", std::string(kMaxSecretFileBytes + 1, 'x'));
  EXPECT_THAT(ReadSecretFile("tls_key", big).status().message(),
              HasSubstr("larger than"));

  if (geteuid() != 0) {  // root reads anything
    const std::string locked = dir.Write("locked", "secret");
    chmod(locked.c_str(), 0);
    auto denied = ReadSecretFile("tls_key", locked);
    EXPECT_EQ(denied.status().code(), absl::StatusCode::kPermissionDenied);
    EXPECT_THAT(denied.status().message(), HasSubstr("not readable"));
  }
  auto ok = ReadSecretFile("token_file", dir.Write("t", "abc\n"));
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(*ok, "abc\n");
}

TEST(ReadTokenFile, ReadsTheFileAndNamesIt) {
  TempDir dir;
  const std::string path =
      dir.Write("tokens",
                "# rotate: old and new\nold-token-0123456789\n"
                "new-token-0123456789\n");
  auto tokens = ReadTokenFile("worker_token_file", path);
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  EXPECT_EQ(tokens->size(), 2u);
  auto bad = ReadTokenFile("worker_token_file", dir.Write("bad", "# none\n"));
  EXPECT_THAT(bad.status().message(),
              HasSubstr("--worker_token_file=" + dir.path() + "/bad"));
}

TEST(LoadClientToken, FileFirstThenEnvironment) {
  TempDir dir;
  const std::string path = dir.Write("t", "# c\nfile-token-0123456789\n");
  setenv("GPIPE_TEST_TOKEN", "  env-token-0123456789\n", 1);
  auto from_file = LoadClientToken("token_file", path, "GPIPE_TEST_TOKEN");
  ASSERT_TRUE(from_file.ok());
  EXPECT_EQ(*from_file, "file-token-0123456789");
  auto from_env = LoadClientToken("token_file", "", "GPIPE_TEST_TOKEN");
  ASSERT_TRUE(from_env.ok());
  EXPECT_EQ(*from_env, "env-token-0123456789");
  setenv("GPIPE_TEST_TOKEN", "short", 1);
  EXPECT_THAT(
      LoadClientToken("token_file", "", "GPIPE_TEST_TOKEN").status().message(),
      HasSubstr("$GPIPE_TEST_TOKEN line 1"));
  unsetenv("GPIPE_TEST_TOKEN");
  auto none = LoadClientToken("token_file", "", "GPIPE_TEST_TOKEN");
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(*none, "");
}

TEST(TokenVerifier, MissingInvalidAndValidTokens) {
  TokenVerifier verifier({"first-token-0123456789", "second-token-0123456789"});
  ASSERT_TRUE(verifier.enabled());
  grpc::Status missing = verifier.CheckHeader(nullptr, "the job API");
  EXPECT_EQ(missing.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(missing.error_message(), HasSubstr("missing bearer token"));

  const std::string_view basic = "Basic dXNlcjpwYXNz";
  EXPECT_THAT(verifier.CheckHeader(&basic, "x").error_message(),
              HasSubstr("missing bearer token"));
  const std::string_view wrong = "Bearer first-token-0123456780";
  grpc::Status invalid = verifier.CheckHeader(&wrong, "the job API");
  EXPECT_EQ(invalid.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(invalid.error_message(), "invalid bearer token for the job API");
  const std::string_view prefix = "Bearer first-token";
  EXPECT_FALSE(verifier.CheckHeader(&prefix, "x").ok());
  const std::string_view empty = "Bearer ";
  EXPECT_FALSE(verifier.CheckHeader(&empty, "x").ok());

  const std::string_view first = "Bearer first-token-0123456789";
  const std::string_view second = "bearer second-token-0123456789";
  EXPECT_TRUE(verifier.CheckHeader(&first, "x").ok());
  EXPECT_TRUE(verifier.CheckHeader(&second, "x").ok());

  TokenVerifier open;
  EXPECT_FALSE(open.enabled());
  EXPECT_TRUE(open.CheckHeader(nullptr, "x").ok());
}

TEST(StreamKey, RandomHexAndCheckedForEquality) {
  std::set<std::string> keys;
  for (int i = 0; i < 16; ++i) {
    auto key = NewStreamKey();
    ASSERT_TRUE(key.ok());
    ASSERT_EQ(key->size(), 2u * kStreamKeyBytes);
    EXPECT_EQ(key->find_first_not_of("0123456789abcdef"), std::string::npos);
    keys.insert(*key);
  }
  EXPECT_EQ(keys.size(), 16u);
  const std::string key = *keys.begin();
  EXPECT_TRUE(CheckStreamKey(key, key).ok());
  absl::Status none = CheckStreamKey(key, "");
  EXPECT_EQ(none.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(none.message(), HasSubstr("no stream key"));
  std::string other = key;
  other.back() = other.back() == '0' ? '1' : '0';
  absl::Status wrong = CheckStreamKey(key, other);
  EXPECT_EQ(wrong.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(wrong.message(), HasSubstr("wrong stream key"));
  EXPECT_THAT(wrong.message(), ::testing::Not(HasSubstr(key.substr(0, 8))));
  // An assignment without a key (an older controller) accepts any stream.
  EXPECT_TRUE(CheckStreamKey("", "anything").ok());
}

TEST(Tls, NoFlagsMeansPlaintext) {
  auto server = LoadServerTls({});
  ASSERT_TRUE(server.ok());
  EXPECT_FALSE(server->has_value());
  auto client = LoadClientTls({});
  ASSERT_TRUE(client.ok());
  EXPECT_FALSE(client->has_value());
  EXPECT_NE(MakeServerCredentials(std::nullopt), nullptr);
  EXPECT_NE(MakeChannelCredentials(std::nullopt), nullptr);
}

TEST(Tls, LoadsAMatchingPairAndACa) {
  TempDir dir;
  const KeyPair ca = MakeSelfSigned("ca");
  const KeyPair leaf = MakeSelfSigned("controller");
  const TlsFlags flags{dir.Write("tls.crt", leaf.cert_pem),
                       dir.Write("tls.key", leaf.key_pem),
                       dir.Write("ca.crt", ca.cert_pem)};
  auto server = LoadServerTls(flags);
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_TRUE(server->has_value());
  EXPECT_EQ((*server)->cert_pem, leaf.cert_pem);
  EXPECT_EQ((*server)->ca_pem, ca.cert_pem);
  EXPECT_NE(MakeServerCredentials(*server), nullptr);
  auto client = LoadClientTls(flags);
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_NE(MakeChannelCredentials(*client), nullptr);
  // A client may go without a certificate of its own.
  auto anonymous = LoadClientTls({"", "", flags.ca});
  ASSERT_TRUE(anonymous.ok()) << anonymous.status();
  EXPECT_TRUE((*anonymous)->cert_pem.empty());
}

TEST(Tls, ErrorsNameTheFlagAndTheFile) {
  TempDir dir;
  const KeyPair leaf = MakeSelfSigned("worker");
  const KeyPair other = MakeSelfSigned("other");
  const std::string cert = dir.Write("tls.crt", leaf.cert_pem);
  const std::string key = dir.Write("tls.key", leaf.key_pem);
  const std::string other_key = dir.Write("other.key", other.key_pem);
  const std::string garbage = dir.Write("garbage.pem", "hello, not pem\n");
  const std::string broken = dir.Write(
      "broken.crt",
      "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n");

  auto message = [](const absl::StatusOr<std::optional<TlsMaterial>>& r) {
    return std::string(r.status().message());
  };
  EXPECT_THAT(message(LoadServerTls({cert, "", ""})),
              HasSubstr("--tls_cert is given without --tls_key"));
  EXPECT_THAT(message(LoadServerTls({"", key, ""})),
              HasSubstr("--tls_key is given without --tls_cert"));
  EXPECT_THAT(message(LoadServerTls({"", "", cert})),
              HasSubstr("--tls_ca is given without --tls_cert and --tls_key"));
  EXPECT_THAT(message(LoadClientTls({cert, key, ""})),
              HasSubstr("TLS needs --tls_ca"));
  EXPECT_THAT(
      message(LoadServerTls({dir.path() + "/none.crt", key, ""})),
      HasSubstr("--tls_cert=" + dir.path() + "/none.crt: no such file"));
  EXPECT_THAT(message(LoadServerTls({garbage, key, ""})),
              HasSubstr("--tls_cert=" + garbage + ": not a PEM certificate"));
  EXPECT_THAT(message(LoadServerTls({broken, key, ""})),
              HasSubstr("--tls_cert=" + broken +
                        ": a certificate block does not parse"));
  EXPECT_THAT(message(LoadServerTls({key, key, ""})),
              HasSubstr("holds a private key, not a certificate"));
  EXPECT_THAT(message(LoadServerTls({cert, cert, ""})),
              HasSubstr("--tls_key=" + cert +
                        ": holds a certificate, not a private key"));
  EXPECT_THAT(message(LoadServerTls({cert, garbage, ""})),
              HasSubstr("--tls_key=" + garbage + ": not a PEM private key"));
  EXPECT_THAT(message(LoadServerTls({cert, other_key, ""})),
              HasSubstr("--tls_key=" + other_key +
                        " is not the private key of the certificate "
                        "--tls_cert=" +
                        cert));
  EXPECT_THAT(message(LoadServerTls({cert, key, garbage})),
              HasSubstr("--tls_ca=" + garbage + ": not a PEM certificate"));
  for (const auto& r : {LoadServerTls({cert, other_key, ""}),
                        LoadServerTls({garbage, key, ""})}) {
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  }
}

}  // namespace
}  // namespace gpipe::security
