#include "services/telemetry/metrics_server.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <deque>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "prometheus/text_serializer.h"
#include "services/core/log.h"

namespace gpipe {
namespace {

constexpr size_t kMaxRequestBytes = 16 << 10;

void WriteAll(int fd, const std::string& data) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n =
        send(fd, data.data() + done, data.size() - done, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // the scraper went away: nothing to tell it
    done += n;
  }
}

std::string Response(const char* status, const char* type,
                     const std::string& body) {
  return absl::StrCat("HTTP/1.0 ", status, "\r\nContent-Type: ", type,
                      "\r\nContent-Length: ", body.size(),
                      "\r\nConnection: close\r\n\r\n", body);
}

}  // namespace

absl::Status CheckListenAddress(const std::string& flag,
                                const std::string& address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, ": '", address,
                     "' is not HOST:PORT (e.g. 127.0.0.1:9464)"));
  }
  int port = -1;
  if (!absl::SimpleAtoi(address.substr(colon + 1), &port) || port < 0 ||
      port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, ": '", address.substr(colon + 1),
                     "' is not a port number in 0..65535"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    const std::string& address,
    const std::vector<std::shared_ptr<prometheus::Collectable>>& collectables) {
  if (absl::Status s = CheckListenAddress("metrics_listen", address); !s.ok())
    return s;
  const size_t colon = address.rfind(':');
  std::string host = address.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  const std::string port = address.substr(colon + 1);
  addrinfo hints = {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (int e = getaddrinfo(host.c_str(), port.c_str(), &hints, &found); e != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--metrics_listen: cannot resolve '", host, "': ", gai_strerror(e)));
  }
  int fd = -1;
  std::string why = "no address";
  for (addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
    // Non-blocking: Serve accepts until none is waiting.
    fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK,
                a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, 64) != 0) {
      why = std::strerror(errno);
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(found);
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat("cannot serve metrics on ",
                                               address, ": ", why,
                                               " (is the port in use?)"));
  }
  sockaddr_storage bound = {};
  socklen_t len = sizeof(bound);
  getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
  const int bound_port =
      bound.ss_family == AF_INET6
          ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
          : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  std::vector<std::weak_ptr<prometheus::Collectable>> sources(
      collectables.begin(), collectables.end());
  return std::unique_ptr<MetricsServer>(new MetricsServer(
      fd, bound_port, absl::StrCat(address.substr(0, colon), ":", bound_port),
      std::move(sources)));
}

MetricsServer::MetricsServer(
    int fd, int port, std::string address,
    std::vector<std::weak_ptr<prometheus::Collectable>> sources)
    : fd_(fd),
      port_(port),
      address_(std::move(address)),
      sources_(std::move(sources)) {
  thread_ = std::thread([this] { Serve(); });
}

MetricsServer::~MetricsServer() {
  stop_ = true;
  thread_.join();
  close(fd_);
}

void MetricsServer::Serve() {
  // Connections are read side by side, each within its own deadline, and a
  // request is answered once it is whole: one at a time, 50 clients that
  // sent a header line every second held every scrape off (each had 2 s in
  // turn). Past kMaxConnections the oldest unfinished one is dropped.
  using Clock = std::chrono::steady_clock;
  constexpr auto kRequestTime = std::chrono::seconds(2);
  constexpr size_t kMaxConnections = 128;
  struct Connection {
    int fd;
    Clock::time_point deadline;
    std::string request;
  };
  std::deque<Connection> open;
  const auto drop = [&](size_t i) {
    close(open[i].fd);
    open.erase(open.begin() + static_cast<std::ptrdiff_t>(i));
  };
  std::vector<pollfd> polled;
  while (!stop_) {
    polled.assign(1, pollfd{fd_, POLLIN, 0});
    for (const Connection& c : open) polled.push_back({c.fd, POLLIN, 0});
    // Wakes to notice stop_ and the deadlines.
    if (poll(polled.data(), polled.size(), 100) < 0 && errno != EINTR) {
      continue;
    }
    const Clock::time_point now = Clock::now();
    // Readable connections first (polled[i + 1] is open[i]); from the back,
    // so erasing keeps the earlier indices.
    for (size_t i = open.size(); i-- > 0;) {
      if (polled[i + 1].revents == 0) {
        if (now > open[i].deadline) drop(i);
        continue;
      }
      char buffer[2048];
      const ssize_t n = recv(open[i].fd, buffer, sizeof(buffer), 0);
      if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      if (n <= 0) {  // closed before a whole request
        drop(i);
        continue;
      }
      std::string& request = open[i].request;
      request.append(buffer, n);
      const bool whole = request.find("\r\n\r\n") != std::string::npos ||
                         request.find("\n\n") != std::string::npos;
      if (whole || request.size() > kMaxRequestBytes) {
        // The answer is written blocking, within a send timeout: it is a
        // few tens of KB, which the socket's buffer takes at once.
        const int fd = open[i].fd;
        fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
        timeval timeout = {1, 0};
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
        Answer(fd, request);
        drop(i);
      } else if (now > open[i].deadline) {
        drop(i);
      }
    }
    if (polled[0].revents & POLLIN) {
      for (;;) {
        const int c =
            accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (c < 0) break;
        if (open.size() >= kMaxConnections) drop(0);
        open.push_back({c, Clock::now() + kRequestTime, std::string()});
      }
    }
  }
  for (const Connection& c : open) close(c.fd);
}

void MetricsServer::Answer(int connection, const std::string& request) {
  if (request.size() > kMaxRequestBytes &&
      request.find("\r\n\r\n") == std::string::npos &&
      request.find("\n\n") == std::string::npos) {
    WriteAll(connection, Response("431 Request Header Fields Too Large",
                                  "text/plain", "request too large\n"));
    return;
  }
  const std::string line = request.substr(0, request.find_first_of("\r\n"));
  if (!absl::StartsWith(line, "GET ") && !absl::StartsWith(line, "HEAD ")) {
    WriteAll(connection, Response("405 Method Not Allowed", "text/plain",
                                  "only GET /metrics\n"));
    return;
  }
  const size_t path_begin = line.find(' ') + 1;
  const std::string path =
      line.substr(path_begin, line.find(' ', path_begin) - path_begin);
  if (path != "/metrics" && !absl::StartsWith(path, "/metrics?")) {
    WriteAll(connection, Response("404 Not Found", "text/plain",
                                  "metrics are at /metrics\n"));
    return;
  }
  std::string body = Exposition();
  if (absl::StartsWith(line, "HEAD ")) {
    std::string head = Response("200 OK", "text/plain; version=0.0.4", body);
    head.resize(head.size() - body.size());
    WriteAll(connection, head);
    return;
  }
  WriteAll(
      connection,
      Response("200 OK", "text/plain; version=0.0.4; charset=utf-8", body));
}

namespace {

// prometheus-cpp writes a NaN sample as "Nan". Prometheus reads that (Go's
// float parser ignores case) but the exposition format and OpenMetrics
// spell it "NaN", and stricter parsers refuse the scrape, losing every
// series with it (a failed job's NaN loss is what GpipeLossNotFinite
// reads). A sample line ends with its value; no label value can end a line.
std::string SpellNaN(std::string text) {
  static constexpr char kWrong[] = " Nan\n";
  for (size_t at = text.find(kWrong); at != std::string::npos;
       at = text.find(kWrong, at + 1)) {
    text[at + 3] = 'N';  // " NaN\n"
  }
  return text;
}

}  // namespace

std::string MetricsServer::Exposition() {
  std::vector<prometheus::MetricFamily> families;
  for (const auto& weak : sources_) {
    if (std::shared_ptr<prometheus::Collectable> c = weak.lock()) {
      std::vector<prometheus::MetricFamily> more = c->Collect();
      families.insert(families.end(), std::make_move_iterator(more.begin()),
                      std::make_move_iterator(more.end()));
    }
  }
  return SpellNaN(prometheus::TextSerializer().Serialize(families));
}

}  // namespace gpipe
