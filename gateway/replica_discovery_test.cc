// Replica discovery's sources (replica_discovery.h): the scheduler file's format and its errors, the
// union with the --scheduler flags, and a DNS name's records (localhost, from /etc/hosts). The
// gateway following a file while serving is tests/python/test_replica_discovery.py.
#include "gateway/replica_discovery.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

namespace ferry::gateway {
namespace {

TEST(ReplicaDiscoveryTest, TheFileHasOneHostPortALineWithCommentsAndBlanks) {
  EXPECT_EQ(ParseSchedulerFile("# replicas\n\n  10.0.0.1:50052  \nsched-1.ferry:50052 # the second\n[::1]:7\n", "f"),
            (std::vector<std::string>{"10.0.0.1:50052", "sched-1.ferry:50052", "[::1]:7"}));
  for (const char* bad : {"10.0.0.1\n", "host:\n", ":50052\n", "host:port\n", "host:70000\n"}) {
    try {
      ParseSchedulerFile(std::string("# ok\n") + bad, "f");
      ADD_FAILURE() << bad << " was accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("--scheduler-file f line 2"), std::string::npos) << e.what();
    }
  }
}

TEST(ReplicaDiscoveryTest, TheSourcesAreUnitedSortedAndAFileThatCannotBeReadIsAnError) {
  const auto path = std::filesystem::temp_directory_path() / ("ferry-discovery-" + std::to_string(::getpid()));
  std::ofstream(path) << "b:2\na:1\n";
  DiscoverySources sources{{"c:3", "a:1"}, path.string(), ""};
  std::string error;
  EXPECT_EQ(Discover(sources, &error), (std::vector<std::string>{"a:1", "b:2", "c:3"}));
  std::filesystem::remove(path);
  EXPECT_EQ(Discover(sources, &error), std::nullopt);
  EXPECT_NE(error.find("cannot be read"), std::string::npos) << error;
}

TEST(ReplicaDiscoveryTest, ADnsNameIsEveryAddressItResolvesTo) {
  std::string error;
  const auto found = Discover({{}, "", "localhost:50052"}, &error);
  ASSERT_TRUE(found.has_value()) << error;
  EXPECT_NE(std::find(found->begin(), found->end(), "127.0.0.1:50052"), found->end());
  // A name with no record is an empty set (a headless Service with no ready pod), not an error.
  const auto none = Discover({{}, "", "no-such-replica.invalid:50052"}, &error);
  ASSERT_TRUE(none.has_value()) << error;
  EXPECT_TRUE(none->empty());
}

}  // namespace
}  // namespace ferry::gateway
