// gRPC adapter of the admin API's LoRA calls (ferry.v1.LoraAdapters, lora.proto) over LoraAdmin:
// callers must hold an admin key when API keys are on (Authenticator::IsAdmin).
#pragma once

#include "ferry/v1/lora.grpc.pb.h"
#include "gateway/auth/authenticator.h"
#include "gateway/lora_admin.h"

namespace ferry::gateway {

class LoraAdaptersService final : public ferry::v1::LoraAdapters::Service {
 public:
  LoraAdaptersService(LoraAdmin& admin, Authenticator& auth) : admin_(admin), auth_(auth) {}

  grpc::Status Load(grpc::ServerContext* context, const ferry::v1::LoadLoraAdapterRequest* request,
                    ferry::v1::LoraAdaptersResponse* out) override;
  grpc::Status Unload(grpc::ServerContext* context, const ferry::v1::UnloadLoraAdapterRequest* request,
                      ferry::v1::LoraAdaptersResponse* out) override;

 private:
  // OK when the caller may change adapters, else UNAUTHENTICATED or PERMISSION_DENIED.
  grpc::Status Authorize(const grpc::ServerContext& context);
  grpc::Status Answer(const Status& status, ferry::v1::LoraAdaptersResponse* out) const;

  LoraAdmin& admin_;
  Authenticator& auth_;
};

}  // namespace ferry::gateway
