// The JSON Schema compiler (structured/json_schema.h) on any text: a schema graph or a
// JsonSchemaError (what the gateway catches), never a crash or another exception, and a graph
// within the documented limits whose node and DFA references are in range.
#include <cstddef>
#include <cstdint>
#include <string>

#include "structured/json_schema.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

void CheckGraph(const ferry::SchemaGraph& graph) {
  const size_t n = graph.nodes.size();
  FUZZ_CHECK(n > 0 && n <= ferry::kMaxSchemaNodes, "%zu nodes", n);
  FUZZ_CHECK(graph.root >= 0 && static_cast<size_t>(graph.root) < n, "root %d of %zu", graph.root, n);
  const auto in_range = [n](int32_t id) { return id >= 0 && static_cast<size_t>(id) < n; };
  for (const ferry::SchemaNode& node : graph.nodes) {
    for (const auto& p : node.properties) FUZZ_CHECK(in_range(p.node), "property node %d of %zu", p.node, n);
    for (int32_t id : node.prefix_items) FUZZ_CHECK(in_range(id), "prefix item node %d of %zu", id, n);
    for (int32_t id : node.alternatives) FUZZ_CHECK(in_range(id), "alternative node %d of %zu", id, n);
    for (int32_t id : node.tag_targets) FUZZ_CHECK(in_range(id), "tag target node %d of %zu", id, n);
    FUZZ_CHECK(node.items == -1 || in_range(node.items), "items node %d of %zu", node.items, n);
    FUZZ_CHECK(node.max_items < 0 || node.max_items >= node.min_items, "items %lld..%lld",
               static_cast<long long>(node.min_items), static_cast<long long>(node.max_items));
    FUZZ_CHECK(node.dfa >= -1 && node.dfa < static_cast<int32_t>(graph.dfas.size()), "dfa %d of %zu", node.dfa,
               graph.dfas.size());
    if (node.dfa >= 0) FUZZ_CHECK(graph.dfas[static_cast<size_t>(node.dfa)] != nullptr, "null dfa %d", node.dfa);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string schema(reinterpret_cast<const char*>(data), size);
  ExpectRefusalOrSuccess<ferry::JsonSchemaError>([&] { CheckGraph(ferry::CompileJsonSchema(schema)); });
  return 0;
}
