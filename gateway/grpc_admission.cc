#include "gateway/grpc_admission.h"

#include <spdlog/spdlog.h>

#include "gateway/request_validation.h"

namespace ferry::gateway {

std::optional<std::string> BearerToken(const grpc::ServerContextBase& context) {
  const auto& metadata = context.client_metadata();
  auto it = metadata.find("authorization");
  if (it == metadata.end()) return std::nullopt;
  std::string value(it->second.data(), it->second.size());
  constexpr std::string_view kPrefix = "Bearer ";
  if (value.size() <= kPrefix.size() || value.compare(0, kPrefix.size(), kPrefix) != 0) return std::nullopt;
  return value.substr(kPrefix.size());
}

grpc::Status ToGrpcStatus(const AuthResult& result, grpc::ServerContextBase& context) {
  switch (result.code) {
    case AuthCode::kOk: return grpc::Status::OK;
    case AuthCode::kUnauthenticated: return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, result.message);
    case AuthCode::kPermissionDenied: return grpc::Status(grpc::StatusCode::PERMISSION_DENIED, result.message);
    case AuthCode::kRateLimited:
      if (result.retry_after_ms > 0) {
        context.AddTrailingMetadata("grpc-retry-pushback-ms", std::to_string(result.retry_after_ms));
      }
      return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, result.message);
  }
  return grpc::Status(grpc::StatusCode::INTERNAL, "unknown auth result");
}

Admission AdmitCall(Authenticator& auth, const Generator& generator, grpc::ServerContextBase& context,
                    const ferry::v1::GenerateRequest& request) {
  Admission admission;
  const auto bearer = BearerToken(context);
  // An adapter the tenant may not use is answered as one not served (its name is not confirmed).
  if (!request.lora_name().empty()) {
    const auto tenant = auth.Identify(bearer);
    if (tenant && !auth.MayUseAdapter(*tenant, request.lora_name())) {
      admission.tenant = *tenant;
      admission.status = grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                      fmt::format("lora_name = \"{}\" is not a LoRA adapter this model serves",
                                                  request.lora_name()));
      return admission;
    }
  }
  const auto lane = generator.options().lanes.Find(request.lane());
  if (!lane) {
    auto tenant = auth.Identify(bearer);
    if (!tenant) {
      admission.status = ToGrpcStatus({AuthCode::kUnauthenticated, "", bearer ? "invalid API key" : "missing API key"},
                                      context);
    } else {
      admission.tenant = *tenant;
    }
    return admission;
  }
  int64_t prompt_tokens = 0;
  if (request.has_token_ids()) {
    prompt_tokens = request.token_ids().ids_size();
  } else {
    prompt_tokens = static_cast<int64_t>(generator.tokenizer().Encode(request.text(), AddsSpecialTokens(request)).size());
  }
  const auto& s = request.sampling();
  const int64_t max_tokens = s.has_max_tokens() && s.max_tokens() > 0 ? s.max_tokens() : kDefaultMaxTokens;
  const AuthResult result = auth.Admit(bearer, lane->name, prompt_tokens, max_tokens);
  admission.status = ToGrpcStatus(result, context);
  admission.tenant = result.tenant;
  if (result.code == AuthCode::kOk) {
    admission.reserved_completion_tokens = max_tokens;
  } else {
    // The tenant name only: the key never reaches a log line.
    spdlog::info("refused request tenant={} lane={}: {}", result.tenant.empty() ? "-" : result.tenant, lane->name,
                 result.message);
  }
  return admission;
}

void RefundUnused(Authenticator& auth, const Admission& admission, int64_t completion_tokens) {
  const int64_t unused = admission.reserved_completion_tokens - completion_tokens;
  if (!admission.tenant.empty() && unused > 0) auth.Refund(admission.tenant, unused);
}

}  // namespace ferry::gateway
