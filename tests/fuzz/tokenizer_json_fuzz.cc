// tokenizer.json loading (Tokenizer::FromJson) on any text: a tokenizer or a std::runtime_error
// naming the part (what the gateway reports at start-up), never a crash, a hang or an allocation
// past -malloc_limit_mb (a hostile id must not size the id tables). A tokenizer that loads
// encodes and decodes a fixed text without crashing, with every id below its vocabulary size.
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

#include "gateway/tokenizer/tokenizer.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  ExpectRefusalOrSuccess<std::runtime_error>([&] {
    const auto tok = ferry::tokenizer::Tokenizer::FromJson(text);
    const auto ids = tok->Encode("Hello, wörld! 123 <|im_end|> \xF0\x9F\x98\x80");
    for (int32_t id : ids) FUZZ_CHECK(id >= 0 && id < tok->vocab_size(), "id %d of %d", id, tok->vocab_size());
    (void)tok->Decode(ids);
  });
  return 0;
}
