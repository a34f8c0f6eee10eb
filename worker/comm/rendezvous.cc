// RendezvousHost: one TCP listener, one short answer per connection. Answer:
//   "ferry-rendezvous-v1\n" <name> "\n" <value bytes>, then the host closes the connection.
// The magic and the name make a reader that reaches some other program on a reused port (or
// another group's host) reject the answer instead of taking it for its own.
#include "worker/comm/rendezvous.h"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>

#include "worker/comm/communicator.h"

namespace ferry::worker {
namespace {

using Clock = std::chrono::steady_clock;
constexpr char kMagic[] = "ferry-rendezvous-v1\n";
// One try never waits longer than this, so a stale address (a stopped process whose kernel
// still accepts connections) costs a second, not the whole deadline.
constexpr auto kTryTimeout = std::chrono::seconds(1);

std::string Answer(const std::string& name, const std::string& value) { return kMagic + name + "\n" + value; }

std::string Errno(const char* call) { return std::string(call) + ": " + std::strerror(errno); }

// Closes the descriptor on every path out of a try.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

int MillisLeft(Clock::time_point until) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()).count();
  return left > 0 ? static_cast<int>(left) : 0;
}

// Waits for `events` on fd until `until`; false on timeout.
bool WaitFor(int fd, short events, Clock::time_point until) {
  pollfd p{fd, events, 0};
  for (;;) {
    const int n = ::poll(&p, 1, MillisLeft(until));
    if (n > 0) return true;
    if (n == 0) return false;
    if (errno != EINTR) return false;
  }
}

void WriteAll(int fd, const std::string& bytes, Clock::time_point until) {
  size_t sent = 0;
  while (sent < bytes.size()) {
    if (!WaitFor(fd, POLLOUT, until)) return;  // a reader that does not read gets nothing
    const ssize_t n = ::send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    sent += static_cast<size_t>(n);
  }
}

// The address file's "host port", parsed; empty host when absent or unreadable.
std::pair<std::string, std::string> ReadAddress(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::string host, port;
  in >> host >> port;
  return {host, port};
}

// One try: connect, read the whole answer, check it. Returns false with `why` set on failure.
bool TryFetch(const std::string& host, const std::string& port, const std::string& name, Clock::time_point until,
              std::string* value, std::string* why) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (const int rc = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &found); rc != 0) {
    *why = "bad address '" + host + " " + port + "': " + ::gai_strerror(rc);
    return false;
  }
  Fd sock{::socket(found->ai_family, found->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0)};
  const int rc = sock.fd < 0 ? -1 : ::connect(sock.fd, found->ai_addr, found->ai_addrlen);
  ::freeaddrinfo(found);
  const std::string where = " (" + host + ":" + port + ")";
  if (rc != 0 && errno != EINPROGRESS) return *why = Errno("connect") + where, false;
  if (!WaitFor(sock.fd, POLLOUT, until)) return *why = "connect timed out" + where, false;
  int error = 0;
  socklen_t len = sizeof(error);
  ::getsockopt(sock.fd, SOL_SOCKET, SO_ERROR, &error, &len);
  if (error != 0) return *why = std::string("connect: ") + std::strerror(error) + where, false;
  std::string answer;
  char buffer[4096];
  for (;;) {
    if (!WaitFor(sock.fd, POLLIN, until)) return *why = "no answer" + where, false;
    const ssize_t n = ::recv(sock.fd, buffer, sizeof(buffer), 0);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n < 0) return *why = Errno("recv") + where, false;
    if (n == 0) break;
    answer.append(buffer, static_cast<size_t>(n));
  }
  const std::string head = std::string(kMagic) + name + "\n";
  if (answer.compare(0, head.size(), head) != 0) return *why = "not this group's rendezvous host" + where, false;
  *value = answer.substr(head.size());
  return true;
}

}  // namespace

RendezvousHost::RendezvousHost(const std::filesystem::path& dir, const std::string& name,
                               const std::string& interface_address, std::string value)
    : name_(name), value_(std::move(value)) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (const int rc = ::getaddrinfo(interface_address.c_str(), "0", &hints, &found); rc != 0) {
    throw CommError("rendezvous host: cannot resolve '" + interface_address + "': " + ::gai_strerror(rc));
  }
  listen_fd_ = ::socket(found->ai_family, found->ai_socktype | SOCK_CLOEXEC, 0);
  const bool listening = listen_fd_ >= 0 && ::bind(listen_fd_, found->ai_addr, found->ai_addrlen) == 0 &&
                         ::listen(listen_fd_, 64) == 0;
  ::freeaddrinfo(found);
  sockaddr_storage bound{};
  socklen_t bound_len = sizeof(bound);
  char host[NI_MAXHOST], port[NI_MAXSERV];
  if (!listening || ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&bound), &bound_len) != 0 ||
      ::getnameinfo(reinterpret_cast<sockaddr*>(&bound), bound_len, host, sizeof(host), port, sizeof(port),
                    NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    const std::string why = Errno("listen");
    if (listen_fd_ >= 0) ::close(listen_fd_);
    throw CommError("rendezvous host: cannot listen on " + interface_address + ": " + why);
  }
  std::filesystem::create_directories(dir);
  const std::filesystem::path path = dir / (name + ".addr");
  const std::filesystem::path tmp = dir / (name + ".addr." + std::to_string(::getpid()) + ".tmp");
  std::ofstream(tmp) << host << " " << port << "\n";
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);  // atomic: a reader sees the old address or the new one
  if (ec) {
    ::close(listen_fd_);
    throw CommError("rendezvous host: cannot publish " + path.string() + ": " + ec.message());
  }
  thread_ = std::thread([this] { Serve(); });
}

RendezvousHost::~RendezvousHost() {
  stopping_ = true;
  thread_.join();
  ::close(listen_fd_);
}

void RendezvousHost::Serve() {
  const std::string answer = Answer(name_, value_);
  while (!stopping_) {
    // Wakes every 50 ms to notice the destructor: simpler than a wake-up pipe, and the host
    // lives only while its group connects.
    pollfd p{listen_fd_, POLLIN, 0};
    if (::poll(&p, 1, 50) <= 0) continue;
    Fd client{::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC)};
    if (client.fd < 0) continue;
    WriteAll(client.fd, answer, Clock::now() + kTryTimeout);
  }
}

std::string FetchFromRendezvousHost(const std::filesystem::path& dir, const std::string& name,
                                    Clock::time_point deadline) {
  const std::filesystem::path path = dir / (name + ".addr");
  std::string why = "none";
  while (Clock::now() < deadline) {
    const auto [host, port] = ReadAddress(path);
    std::string value;
    if (host.empty()) {
      why = "no " + path.string() + " yet";
    } else if (TryFetch(host, port, name, std::min(deadline, Clock::now() + kTryTimeout), &value, &why)) {
      return value;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  throw CommError("timed out waiting for rank 0's rendezvous host " + path.string() + " (last try: " + why + ")");
}

}  // namespace ferry::worker
