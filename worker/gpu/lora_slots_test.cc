// The GPU engine's adapter slots: which adapter sits where for a step (pure host logic, run
// everywhere), and the projection shapes per shard matching what LoadLoraAdapter reads. The
// device side is held to the CPU engine by gpu_runner_parity_test's TinyWithAdaptersMatchesCpu.
#include "worker/gpu/lora_slots.h"

#include <gtest/gtest.h>

#include <memory>

#include "worker/arch/shard_plan.h"

namespace ferry::worker::gpu {
namespace {

std::shared_ptr<const LoraAdapter> Adapter(const std::string& name) {
  auto a = std::make_shared<LoraAdapter>();
  a->name = name;
  return a;
}

TEST(LoraSlotTable, ResidentAdaptersKeepTheirSlotsAndTheLeastRecentlyUsedMakesRoom) {
  LoraSlotTable table(3);
  const auto a = Adapter("a"), b = Adapter("b"), c = Adapter("c"), d = Adapter("d");
  std::vector<std::pair<int32_t, std::shared_ptr<const LoraAdapter>>> placed;
  EXPECT_EQ(table.Assign({a, b}, placed), (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(placed.size(), 2u) << "both uploaded";
  EXPECT_EQ(table.Assign({b, a}, placed), (std::vector<int32_t>{1, 0}));
  EXPECT_TRUE(placed.empty()) << "resident: nothing to upload";
  EXPECT_EQ(table.Assign({c}, placed), (std::vector<int32_t>{2}));  // the empty slot first
  ASSERT_EQ(placed.size(), 1u);
  EXPECT_EQ(placed[0].first, 2);
  EXPECT_EQ(table.Assign({a}, placed), (std::vector<int32_t>{0}));
  // d takes the least recently used slot the step does not need: b's (used two steps ago; c's one).
  EXPECT_EQ(table.Assign({d, a}, placed), (std::vector<int32_t>{1, 0}));
  ASSERT_EQ(placed.size(), 1u);
  EXPECT_EQ(placed[0].second, d);
  EXPECT_EQ(table.resident(1), d.get());
  EXPECT_THROW(table.Assign({a, b, c, d}, placed), std::invalid_argument) << "more adapters than slots";
  EXPECT_EQ(table.resident(1), d.get()) << "a refused step changes nothing";
  // An adapter read again (evicted from the registry's cache) is another object: uploaded again.
  const auto a2 = Adapter("a");
  EXPECT_EQ(table.Assign({a2}, placed).size(), 1u);
  EXPECT_EQ(placed.size(), 1u);
  EXPECT_THROW(LoraSlotTable(0), std::invalid_argument);
}

TEST(LoraShardShape, MatchesTheBaseProjectionsOnEachShard) {
  ModelConfig c;
  c.hidden_size = 896;
  c.num_attention_heads = 14;
  c.num_key_value_heads = 2;
  c.head_dim = 64;
  c.intermediate_size = 4864;
  c.num_hidden_layers = 2;
  c.vocab_size = 1000;
  const ShardPlan one = PlanShard(c, 0, 1), half = PlanShard(c, 1, 2);
  EXPECT_EQ(LoraShardShape(LoraTarget::kQ, c, one), (std::pair<int64_t, int64_t>{896, 896}));
  EXPECT_EQ(LoraShardShape(LoraTarget::kK, c, one), (std::pair<int64_t, int64_t>{896, 128}));
  EXPECT_EQ(LoraShardShape(LoraTarget::kDown, c, one), (std::pair<int64_t, int64_t>{4864, 896}));
  EXPECT_EQ(LoraShardShape(LoraTarget::kQ, c, half), (std::pair<int64_t, int64_t>{896, 448}));
  EXPECT_EQ(LoraShardShape(LoraTarget::kO, c, half), (std::pair<int64_t, int64_t>{448, 896}));
  EXPECT_EQ(LoraShardShape(LoraTarget::kUp, c, half), (std::pair<int64_t, int64_t>{896, 2432}));
  for (int32_t t = 0; t < kNumLoraTargets; ++t) {  // what LoadLoraAdapter shards: the same widths
    const auto target = static_cast<LoraTarget>(t);
    const auto [out, in] = LoraTargetShape(target, c);
    const auto [shard_in, shard_out] = LoraShardShape(target, c, one);
    EXPECT_EQ(shard_in, in) << LoraTargetName(target);
    EXPECT_EQ(shard_out, out) << LoraTargetName(target);
  }
}

}  // namespace
}  // namespace ferry::worker::gpu
