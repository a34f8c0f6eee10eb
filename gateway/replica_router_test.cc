// ReplicaRouter: choice by load and health, panic routing when none is in rotation, and
// ejection by the health check only after failures in a row. No scheduler listens on the
// addresses used here (channels connect lazily), so every health check (GetState through
// grpc_scheduler_client.h) fails.
#include "gateway/replica_router.h"

#include <gtest/gtest.h>
#include <grpcpp/grpcpp.h>

#include <memory>

#include "gateway/grpc_scheduler_client.h"

namespace ferry::gateway {
namespace {

std::shared_ptr<SchedulerClient> MakeClient(size_t n) {
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  std::vector<std::string> addresses;
  for (size_t i = 0; i < n; ++i) {
    addresses.push_back("127.0.0.1:1");  // port 1: nothing listens, connections are refused
    channels.push_back(grpc::CreateChannel(addresses.back(), grpc::InsecureChannelCredentials()));
  }
  return MakeGrpcSchedulerClient(std::move(channels), addresses);
}

TEST(ReplicaRouterTest, ChoosesTheLeastLoadedHealthyReplica) {
  auto client = MakeClient(3);
  ReplicaRouter& router = client->router();
  router.replica(0).outstanding_tokens = 500;
  router.replica(1).outstanding_tokens = 100;
  router.replica(2).outstanding_tokens = 300;
  EXPECT_EQ(router.Choose(7, {}), 1u);
  EXPECT_EQ(router.Choose(7, {1}), 2u);
  router.MarkUnhealthy(2);
  EXPECT_EQ(router.Choose(7, {1}), 0u);
}

// Issue #57: a request under a LoRA adapter goes to a replica serving it, preferring one running it
// now unless that one is much busier; until a health check says who serves it, to any.
TEST(ReplicaRouterTest, AnAdaptersRequestGoesWhereItIsServedPreferringWhereItRuns) {
  auto client = MakeClient(3);
  ReplicaRouter& router = client->router();
  router.replica(0).outstanding_tokens = 100;
  router.replica(1).outstanding_tokens = 900;
  router.replica(2).outstanding_tokens = 500;
  EXPECT_EQ(router.Choose(7, {}, "acme"), 0u) << "nothing known yet: the least loaded";
  router.SetAdapters(0, {{"shop"}, {}});
  router.SetAdapters(1, {{"acme", "shop"}, {"acme"}});
  router.SetAdapters(2, {{"acme"}, {}});
  EXPECT_EQ(router.Choose(7, {}, "acme"), 1u) << "running there, within the slack";
  EXPECT_EQ(router.Choose(7, {}, ""), 0u) << "the base model goes anywhere";
  EXPECT_EQ(router.Choose(7, {1}, "acme"), 2u) << "served there";
  EXPECT_EQ(router.Choose(7, {1, 2}, "acme"), std::nullopt) << "replica 0 does not serve it";
  router.replica(1).outstanding_tokens = 100000;
  EXPECT_EQ(router.Choose(7, {}, "acme"), 2u) << "the warm replica is much busier";
  EXPECT_EQ(router.Choose(7, {}, "nobody"), 0u) << "served nowhere known: any (its scheduler answers)";
  router.MarkUnhealthy(1);
  router.MarkUnhealthy(2);
  EXPECT_EQ(router.Choose(7, {}, "acme"), 2u) << "none serving it in rotation: panic routing among those";
  EXPECT_EQ(router.Choose(7, {}, "shop"), 0u);

}

// A replica not checked yet (discovered since, perhaps still loading the adapter) gets none of the
// requests of an adapter another replica is known to serve.
TEST(ReplicaRouterTest, AReplicaNotCheckedYetGetsNoneOfAServedAdaptersRequests) {
  ReplicaRouter router({"checked"}, [](size_t) { return true; });
  router.replica(0).outstanding_tokens = 100;
  router.SetAdapters(0, {{"shop"}, {}});
  const size_t fresh = router.Add("fresh", false);
  EXPECT_EQ(router.Choose(7, {}, "shop"), 0u);
  EXPECT_EQ(router.Choose(7, {}, ""), fresh) << "idle: the base model's requests go there";
  EXPECT_EQ(router.Choose(7, {}, "acme"), fresh) << "served nowhere known: any";
  router.SetAdapters(fresh, {{"shop"}, {}});
  EXPECT_EQ(router.Choose(7, {}, "shop"), fresh) << "checked: the least loaded of those serving it";
}

TEST(ReplicaRouterTest, WithNoneInRotationStillTriesTheLeastLoadedUntried) {
  auto client = MakeClient(2);
  ReplicaRouter& router = client->router();
  router.replica(0).outstanding_tokens = 50;
  router.replica(1).outstanding_tokens = 10;
  router.MarkUnhealthy(0);
  router.MarkUnhealthy(1);
  EXPECT_FALSE(router.AnyHealthy());
  EXPECT_EQ(router.Choose(7, {}), 1u);
  EXPECT_EQ(router.Choose(7, {1}), 0u);
  EXPECT_EQ(router.Choose(7, {0, 1}), std::nullopt);  // every replica tried: the request fails
}

TEST(ReplicaRouterTest, HealthCheckEjectsOnlyAfterThreeFailuresInARow) {
  auto client = MakeClient(1);
  ReplicaRouter* router = &client->router();
  router->CheckOnce();
  router->CheckOnce();
  EXPECT_TRUE(router->AnyHealthy()) << "two failed checks in a row must not eject";
  router->CheckOnce();
  EXPECT_FALSE(router->AnyHealthy());
  EXPECT_EQ(router->replica(0).failed_checks, 3);
}

}  // namespace
// Replica discovery's membership: a removed replica is neither chosen (panic routing included)
// nor checked, keeps its index, and is listed again there when it comes back.
TEST(ReplicaRouterTest, ARemovedReplicaIsNeverChosenNorCheckedAndComesBackAtItsIndex) {
  std::vector<size_t> probed;
  ReplicaRouter router({"a:1", "b:1"}, [&](size_t i) {
    probed.push_back(i);
    return true;
  });
  router.replica(1).outstanding_tokens = 100;
  EXPECT_EQ(router.Choose(7, {}), 0u);
  EXPECT_TRUE(router.Remove("a:1"));
  EXPECT_FALSE(router.Remove("a:1"));
  EXPECT_FALSE(router.Remove("z:1"));
  EXPECT_EQ(router.Choose(7, {}), 1u);
  router.MarkUnhealthy(1);
  EXPECT_EQ(router.Choose(7, {}), 1u);  // panic routing: the listed one, unhealthy or not
  EXPECT_EQ(router.Choose(7, {1}), std::nullopt);
  router.CheckOnce();
  EXPECT_EQ(probed, std::vector<size_t>{1});
  EXPECT_EQ(router.Add("c:1"), 2u);
  EXPECT_EQ(router.Add("a:1"), 0u);
  EXPECT_EQ(router.size(), 3u);
  EXPECT_EQ(router.Choose(7, {}), 0u);
}

}  // namespace ferry::gateway
