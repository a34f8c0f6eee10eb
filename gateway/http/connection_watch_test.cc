// ConnectionWatch on real loopback TCP connections: it finds the server side of
// a connection by its peer, fires when the client closes, and not for bytes of
// a pipelined request; stopping it is immediate.
#include "gateway/http/connection_watch.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <future>

namespace ferry::gateway::http {
namespace {

int Port(int fd, bool peer) {
  sockaddr_in a{};
  socklen_t len = sizeof(a);
  if (peer) getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len);
  else getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  return ntohs(a.sin_port);
}

// A connected pair over 127.0.0.1 (kernel-chosen port): the client's and the
// server's (accepted) descriptors, and the listening port.
struct Connection {
  int listener = -1, client = -1, server = -1, port = 0;
  Connection() {
    listener = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(listener, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    listen(listener, 4);
    port = Port(listener, false);
    a.sin_port = htons(static_cast<uint16_t>(port));
    client = socket(AF_INET, SOCK_STREAM, 0);
    connect(client, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    server = accept(listener, nullptr, nullptr);
  }
  ~Connection() {
    for (int fd : {listener, client, server}) {
      if (fd >= 0) close(fd);
    }
  }
};

TEST(ConnectionWatchTest, FindsTheServerSideOfAConnectionByItsPeer) {
  Connection c;
  ASSERT_GE(c.server, 0);
  const int client_port = Port(c.client, false);
  EXPECT_EQ(FindConnectionSocket("127.0.0.1", client_port, c.port), c.server);
  EXPECT_EQ(FindConnectionSocket("127.0.0.2", client_port, c.port), -1);  // another peer
  EXPECT_EQ(FindConnectionSocket("127.0.0.1", client_port, c.port + 1), -1);  // another local port
}

TEST(ConnectionWatchTest, FiresWhenTheClientCloses) {
  Connection c;
  std::promise<void> fired;
  ConnectionWatch watch(c.server, [&] { fired.set_value(); });
  ASSERT_TRUE(watch.watching());
  EXPECT_FALSE(watch.gone());
  close(c.client);
  c.client = -1;
  ASSERT_EQ(fired.get_future().wait_for(std::chrono::seconds(10)), std::future_status::ready);
  EXPECT_TRUE(watch.gone());
}

TEST(ConnectionWatchTest, IgnoresPipelinedBytesAndStopsAtOnce) {
  Connection c;
  bool fired = false;
  const auto start = std::chrono::steady_clock::now();
  {
    ConnectionWatch watch(c.server, [&] { fired = true; });
    ASSERT_EQ(write(c.client, "GET / HTTP/1.1\r\n", 16), 16);  // the next request, early
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_FALSE(watch.gone());
  }
  EXPECT_FALSE(fired);
  // The destructor wakes the thread (no poll timeout to wait out); a generous bound.
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

TEST(ConnectionWatchTest, WatchesNothingWithoutASocket) {
  ConnectionWatch watch(-1, [] {});
  EXPECT_FALSE(watch.watching());
  EXPECT_FALSE(watch.gone());
}

}  // namespace
}  // namespace ferry::gateway::http
