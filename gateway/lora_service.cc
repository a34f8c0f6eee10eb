#include "gateway/lora_service.h"

#include "gateway/grpc_admission.h"

namespace ferry::gateway {

grpc::Status LoraAdaptersService::Authorize(const grpc::ServerContext& context) {
  const std::optional<std::string> tenant = auth_.Identify(BearerToken(context));
  if (!tenant) return {grpc::StatusCode::UNAUTHENTICATED, "missing or invalid API key"};
  if (!auth_.IsAdmin(*tenant)) {
    return {grpc::StatusCode::PERMISSION_DENIED, "loading and unloading LoRA adapters needs an admin key"};
  }
  return grpc::Status::OK;
}

grpc::Status LoraAdaptersService::Answer(const Status& status, ferry::v1::LoraAdaptersResponse* out) const {
  for (const std::string& name : admin_.Names()) out->add_lora_names(name);
  return {static_cast<grpc::StatusCode>(status.error_code()), status.error_message()};
}

grpc::Status LoraAdaptersService::Load(grpc::ServerContext* context, const ferry::v1::LoadLoraAdapterRequest* request,
                                       ferry::v1::LoraAdaptersResponse* out) {
  if (grpc::Status denied = Authorize(*context); !denied.ok()) return denied;
  return Answer(admin_.Load(request->lora_name(), request->lora_path()), out);
}

grpc::Status LoraAdaptersService::Unload(grpc::ServerContext* context, const ferry::v1::UnloadLoraAdapterRequest* request,
                                         ferry::v1::LoraAdaptersResponse* out) {
  if (grpc::Status denied = Authorize(*context); !denied.ok()) return denied;
  return Answer(admin_.Unload(request->lora_name()), out);
}

}  // namespace ferry::gateway
