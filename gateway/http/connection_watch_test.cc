// ConnectionWatch on real loopback TCP connections: it finds the server side of
// a connection by its peer, fires when the client closes, and not for bytes of
// a pipelined request; stopping it is immediate.
#include "gateway/http/connection_watch.h"
#include "gateway/http/loopback_test_util.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <future>
#include <memory>

namespace ferry::gateway::http {
namespace {

TEST(ConnectionWatchTest, FindsTheServerSideOfAConnectionByItsPeer) {
  Connection c;
  ASSERT_GE(c.server, 0);
  const int client_port = Port(c.client, false);
  EXPECT_EQ(FindConnectionSocket("127.0.0.1", client_port, c.port), c.server);
  EXPECT_EQ(FindConnectionSocket("127.0.0.2", client_port, c.port), -1);  // another peer
  EXPECT_EQ(FindConnectionSocket("127.0.0.1", client_port, c.port + 1), -1);  // another local port
}

TEST(ConnectionWatchTest, RemembersAConnectionPerThreadAndChecksItAgain) {
  const auto c = std::make_unique<Connection>();
  const int client_port = Port(c->client, false);
  EXPECT_EQ(ConnectionSocketOfThisThread("127.0.0.1", client_port, c->port), c->server);
  EXPECT_EQ(ConnectionSocketOfThisThread("127.0.0.1", client_port, c->port), c->server);  // remembered
  // The connection closes: its descriptor no longer matches, so it is not answered again.
  const int server = c->server;
  close(c->server);
  c->server = -1;
  EXPECT_EQ(ConnectionSocketOfThisThread("127.0.0.1", client_port, c->port), -1) << "closed fd " << server;
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
