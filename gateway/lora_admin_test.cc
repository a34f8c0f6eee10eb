// LoraAdmin over several replicas: a load reaches every listed replica or none (a replica's refusal
// unloads it from those that took it, and the catalog is unchanged), an unload leaves the catalog
// before the replicas are told, and the names' rules hold before any replica is asked.
#include "gateway/lora_admin.h"

#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <vector>

namespace ferry::gateway {
namespace {

// Replicas as sets of loaded adapters; replica `refuses` answers INVALID_ARGUMENT to loads.
class FakeReplicas final : public SchedulerClient {
 public:
  explicit FakeReplicas(size_t n) : router_(std::vector<std::string>(n, "replica"), [](size_t) { return true; }) {
    loaded.resize(n);
  }
  ReplicaRouter& router() override { return router_; }
  SchedulerStream* NewStream(size_t, const ferry::v1::SubmitRequest&, std::chrono::system_clock::time_point,
                             std::shared_ptr<StreamReader>) override {
    return nullptr;
  }
  void After(std::chrono::milliseconds, std::function<void()>) override {}
  Status LoadLora(size_t replica, const std::string& name, const std::string& path) override {
    calls.push_back("load " + std::to_string(replica) + " " + name);
    if (loaded.size() <= replica) loaded.resize(replica + 1);
    if (replica == refuses) return {StatusCode::kInvalidArgument, "adapter_config.json missing in " + path};
    loaded[replica].insert(name);
    return {};
  }
  Status UnloadLora(size_t replica, const std::string& name) override {
    calls.push_back("unload " + std::to_string(replica) + " " + name);
    if (!loaded[replica].erase(name)) return {StatusCode::kNotFound, name + " is not loaded"};
    return {};
  }

  std::vector<std::set<std::string>> loaded;
  std::vector<std::string> calls;
  size_t refuses = SIZE_MAX;

 private:
  ReplicaRouter router_;
};

TEST(LoraAdmin, ALoadReachesEveryReplicaOrNone) {
  auto replicas = std::make_shared<FakeReplicas>(3);
  auto catalog = std::make_shared<LoraCatalog>(std::vector<std::string>{"start"});
  LoraAdmin admin(catalog, replicas);
  ASSERT_TRUE(admin.Load("acme", "/a").ok());
  EXPECT_EQ(admin.Names(), (std::vector<std::string>{"acme", "start"}));
  for (const auto& l : replicas->loaded) EXPECT_EQ(l, (std::set<std::string>{"acme"}));

  replicas->refuses = 2;
  const Status refused = admin.Load("shop", "/missing");
  EXPECT_EQ(refused.error_code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(refused.error_message(), "adapter_config.json missing in /missing");
  for (const auto& l : replicas->loaded) EXPECT_EQ(l, (std::set<std::string>{"acme"})) << "none keeps it";
  EXPECT_FALSE(catalog->Has("shop"));

  EXPECT_EQ(admin.Load("acme", "/b").error_code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(admin.Load("has space", "/a").error_code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(admin.Load("x", "").error_code(), StatusCode::kInvalidArgument);
}

TEST(LoraAdmin, AnUnloadLeavesTheCatalogFirstAndSkipsUnlistedReplicas) {
  auto replicas = std::make_shared<FakeReplicas>(2);
  auto catalog = std::make_shared<LoraCatalog>();
  LoraAdmin admin(catalog, replicas);
  ASSERT_TRUE(admin.Load("acme", "/a").ok());
  replicas->router().Remove("replica");  // both share the address: the first listed one goes
  replicas->calls.clear();
  ASSERT_TRUE(admin.Unload("acme").ok());
  EXPECT_FALSE(catalog->Has("acme"));
  EXPECT_EQ(replicas->calls, (std::vector<std::string>{"unload 1 acme"})) << "an unlisted replica is not asked";
  EXPECT_EQ(admin.Unload("acme").error_code(), StatusCode::kNotFound);
  EXPECT_EQ(admin.Load("acme", "/a2").error_code(), StatusCode::kOk) << "loaded again: a reload";
}

TEST(LoraAdmin, AReplicaListedLaterGetsTheRunTimeAdapters) {
  auto replicas = std::make_shared<FakeReplicas>(1);
  LoraAdmin admin(std::make_shared<LoraCatalog>(std::vector<std::string>{"start"}), replicas);
  ASSERT_TRUE(admin.Load("acme", "/a").ok());
  ASSERT_TRUE(admin.Load("shop", "/s").ok());
  ASSERT_TRUE(admin.Unload("shop").ok());
  const size_t added = replicas->router().Add("new", false);
  replicas->calls.clear();
  admin.SyncReplica("new");
  EXPECT_EQ(replicas->calls, (std::vector<std::string>{"load " + std::to_string(added) + " acme"}))
      << "the run-time adapters still served, not the start ones (its own flags) nor the unloaded";
  admin.SyncReplica("nobody");
  EXPECT_EQ(replicas->calls.size(), 1u);
}

TEST(LoraAdmin, NoReplicaIsUnavailable) {
  auto replicas = std::make_shared<FakeReplicas>(1);
  replicas->router().Remove("replica");
  LoraAdmin admin(std::make_shared<LoraCatalog>(), replicas);
  EXPECT_EQ(admin.Load("acme", "/a").error_code(), StatusCode::kUnavailable);
}

}  // namespace
}  // namespace ferry::gateway
