// OpenAI HTTP request parsing and validation (gateway/http/openai_format.h, tokenize_api.h), as
// the HTTP front runs it: the body's depth check, json::parse, then the endpoint's parser, chosen
// by the first byte (0 completions, 1 chat, 2 tokenize, 3 detokenize, 4 responses). Every body gives a request
// or a 400 with a message, never an exception (it would reach cpp-httplib as a bare 500). Each
// choice of an accepted request then goes through the gateway's validation (request_check.h).
#include <cstddef>
#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "gateway/http/chat_template.h"
#include "gateway/http/openai_format.h"
#include "gateway/http/responses_format.h"
#include "gateway/http/tokenize_api.h"
#include "gateway/tokenizer/bpe_trainer.h"
#include "tests/fuzz/request_check.h"

namespace {

using ferry::gateway::http::ApiError;
using ferry::gateway::http::json;

const ferry::gateway::http::ChatTemplate& Template() {
  static const auto t =
      ferry::gateway::http::ChatTemplate::FromTemplateText(std::string(ferry::tokenizer::Qwen25ChatTemplate()));
  return t;
}

template <typename T>
bool IsCleanOutcome(const std::variant<T, ApiError>& out) {
  if (const auto* error = std::get_if<ApiError>(&out)) {
    FUZZ_CHECK(error->http_status == 400, "status %d: %s", error->http_status, error->message.c_str());
    FUZZ_CHECK(!error->message.empty(), "a 400 without a message");
    return false;
  }
  return true;
}

void ParseGenerate(const json& body, const std::string& text, bool chat) {
  using namespace ferry::gateway::http;
  std::variant<OpenAiRequest, ApiError> out;
  ExpectNoThrow([&] { out = chat ? ParseChatRequest(body, Template(), text) : ParseCompletionRequest(body, text); });
  if (!IsCleanOutcome(out)) return;
  const OpenAiRequest& request = std::get<OpenAiRequest>(out);
  FUZZ_CHECK(!request.prompts.empty(), "an accepted request without prompts");
  std::vector<ferry::v1::GenerateRequest> choices;
  ExpectNoThrow([&] { choices = ExpandChoices(request); });
  FUZZ_CHECK(choices.size() == static_cast<size_t>(request.n) * request.prompts.size(), "%zu choices for n %d x %zu",
             choices.size(), request.n, request.prompts.size());
  // The first few: validation is per choice and they differ only in seed and prompt.
  for (size_t i = 0; i < choices.size() && i < 4; ++i) ferry::fuzz::CheckValidation(choices[i]);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ferry::gateway::http;
  if (size == 0) return 0;
  const int endpoint = data[0] % 5;
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  if (NestsDeeperThan(text, kMaxJsonDepth)) return 0;
  const json body = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded()) return 0;
  if (endpoint <= 1) return ParseGenerate(body, text, endpoint == 1), 0;
  if (endpoint == 4) {  // /v1/responses: a chat request underneath
    std::variant<ResponsesRequest, ApiError> out;
    ExpectNoThrow([&] { out = ParseResponsesRequest(body, text, Template(), nullptr); });
    if (!IsCleanOutcome(out)) return 0;
    const ResponsesRequest& r = std::get<ResponsesRequest>(out);
    FUZZ_CHECK(r.chat.n == 1 && r.chat.prompts.size() == 1, "n %d, %zu prompts", r.chat.n, r.chat.prompts.size());
    FUZZ_CHECK(!r.history.empty(), "a request without history");
    ferry::fuzz::CheckValidation(ExpandChoices(r.chat).at(0));
    return 0;
  }
  if (endpoint == 2) {
    std::variant<std::string, ApiError> out;
    ExpectNoThrow([&] { out = ParseTokenizeRequest(body, Template(), text); });
    if (IsCleanOutcome(out)) (void)ferry::fuzz::DemoTokenizer().Encode(std::get<std::string>(out));
    return 0;
  }
  std::variant<std::vector<int32_t>, ApiError> out;
  const int32_t vocab_size = ferry::fuzz::DemoTokenizer().vocab_size();
  ExpectNoThrow([&] { out = ParseDetokenizeRequest(body, vocab_size); });
  if (IsCleanOutcome(out)) {
    for (int32_t id : std::get<std::vector<int32_t>>(out)) FUZZ_CHECK(id >= 0 && id < vocab_size, "id %d", id);
  }
  return 0;
}
