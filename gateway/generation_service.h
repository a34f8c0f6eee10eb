// gRPC adapter of the public Generation API over the gateway's Generator. Both methods are
// callback reactors (generation_call.h): no thread waits on a request.
#pragma once

#include "ferry/v1/generation.grpc.pb.h"
#include "gateway/auth/authenticator.h"
#include "gateway/generator.h"

namespace ferry::gateway {

class GenerationService final : public ferry::v1::Generation::CallbackService {
 public:
  GenerationService(Generator& generator, Authenticator& auth) : generator_(generator), auth_(auth) {}

  grpc::ServerUnaryReactor* Generate(grpc::CallbackServerContext* context, const ferry::v1::GenerateRequest* request,
                                     ferry::v1::GenerateResponse* response) override;
  grpc::ServerWriteReactor<ferry::v1::GenerateChunk>* GenerateStream(
      grpc::CallbackServerContext* context, const ferry::v1::GenerateRequest* request) override;

  Generator& generator() { return generator_; }
  Authenticator& auth() { return auth_; }

 private:
  Generator& generator_;
  Authenticator& auth_;
};

}  // namespace ferry::gateway
