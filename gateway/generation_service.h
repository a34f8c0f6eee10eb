// gRPC adapter of the public Generation API over the gateway's Generator.
#pragma once

#include "ferry/v1/generation.grpc.pb.h"
#include "gateway/auth/authenticator.h"
#include "gateway/generator.h"

namespace ferry::gateway {

class GenerationService final : public ferry::v1::Generation::Service {
 public:
  GenerationService(Generator& generator, Authenticator& auth) : generator_(generator), auth_(auth) {}

  grpc::Status Generate(grpc::ServerContext* context, const ferry::v1::GenerateRequest* request,
                        ferry::v1::GenerateResponse* response) override;
  grpc::Status GenerateStream(grpc::ServerContext* context, const ferry::v1::GenerateRequest* request,
                              grpc::ServerWriter<ferry::v1::GenerateChunk>* writer) override;

 private:
  // Admits the call (authorization metadata), runs it, and refunds unused tokens.
  grpc::Status Run(grpc::ServerContext* context, const ferry::v1::GenerateRequest& request,
                   const Generator::ChunkSink& sink);

  Generator& generator_;
  Authenticator& auth_;
};

}  // namespace ferry::gateway
