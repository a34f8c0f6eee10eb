// Tokenizer encode/decode (gateway/tokenizer) on the demo tokenizer (demo_tokenizer.h).
// The first byte picks what the rest is:
//   even: text. When it is valid UTF-8, Decode(Encode(text)) is its NFC form (the normalizer is
//         NFC), and streaming those ids through IncrementalDecoder gives the same text in chunks
//         that are each valid UTF-8 (never half a character).
//   odd:  token ids (2 bytes each, little-endian, below the vocabulary size). Streaming them gives
//         valid UTF-8 chunks whose concatenation is Decode(ids), with and without the specials.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/utf8.h"
#include "gateway/tokenizer/tokenizer.h"
#include "gateway/tokenizer/unicode_util.h"
#include "tests/fuzz/demo_tokenizer.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

using ferry::tokenizer::IncrementalDecoder;
using ferry::tokenizer::Tokenizer;

// Streams `ids` and checks every chunk; returns the whole streamed text.
std::string Stream(const Tokenizer& tok, std::span<const int32_t> ids, bool skip_special) {
  IncrementalDecoder decoder(tok, skip_special);
  std::string text;
  for (size_t i = 0; i < ids.size(); ++i) {
    const std::string chunk = decoder.Add(ids[i]);
    FUZZ_CHECK(ferry::IsValidUtf8(chunk), "chunk %zu (token %d) is not valid UTF-8", i, ids[i]);
    text += chunk;
  }
  const std::string rest = decoder.Flush();
  FUZZ_CHECK(ferry::IsValidUtf8(rest), "the flushed rest is not valid UTF-8");
  return text + rest;
}

void RoundTrip(const Tokenizer& tok, const std::string& text) {
  if (!ferry::IsValidUtf8(text)) return;
  const std::vector<int32_t> ids = tok.Encode(text);
  for (int32_t id : ids) FUZZ_CHECK(id >= 0 && id < tok.vocab_size(), "id %d of %d", id, tok.vocab_size());
  FUZZ_CHECK(static_cast<int64_t>(ids.size()) >= tok.MinTokensFor(text.size()), "%zu ids below the bound %lld",
             ids.size(), static_cast<long long>(tok.MinTokensFor(text.size())));
  const std::string want = ferry::tokenizer::NormalizeNfc(text);
  const std::string decoded = tok.Decode(ids, /*skip_special=*/false);
  FUZZ_CHECK(decoded == want, "Decode(Encode(s)) != NFC(s): %zu bytes, want %zu", decoded.size(), want.size());
  FUZZ_CHECK(Stream(tok, ids, /*skip_special=*/false) == want, "the streamed text differs from NFC(s)");
}

void DecodeIds(const Tokenizer& tok, const uint8_t* data, size_t size) {
  std::vector<int32_t> ids;
  for (size_t i = 0; i + 1 < size; i += 2) {
    ids.push_back(static_cast<int32_t>((data[i] | (data[i + 1] << 8)) % tok.vocab_size()));
  }
  for (const bool skip : {false, true}) {
    const std::string whole = tok.Decode(ids, skip);
    FUZZ_CHECK(ferry::IsValidUtf8(whole), "Decode gave invalid UTF-8");
    FUZZ_CHECK(Stream(tok, ids, skip) == whole, "the streamed text differs from Decode (skip_special %d)", skip);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const Tokenizer& tok = ferry::fuzz::DemoTokenizer();
  if ((data[0] & 1) == 0) {
    RoundTrip(tok, std::string(reinterpret_cast<const char*>(data + 1), size - 1));
  } else {
    DecodeIds(tok, data + 1, size - 1);
  }
  return 0;
}
