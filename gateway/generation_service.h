// gRPC adapter of the public Generation API over the gateway's Generator.
#pragma once

#include "ferry/v1/generation.grpc.pb.h"
#include "gateway/generator.h"

namespace ferry::gateway {

class GenerationService final : public ferry::v1::Generation::Service {
 public:
  explicit GenerationService(Generator& generator) : generator_(generator) {}

  grpc::Status Generate(grpc::ServerContext* context, const ferry::v1::GenerateRequest* request,
                        ferry::v1::GenerateResponse* response) override;
  grpc::Status GenerateStream(grpc::ServerContext* context, const ferry::v1::GenerateRequest* request,
                              grpc::ServerWriter<ferry::v1::GenerateChunk>* writer) override;

 private:
  grpc::Status Run(grpc::ServerContext* context, const ferry::v1::GenerateRequest& request,
                   const Generator::ChunkSink& sink);

  Generator& generator_;
};

}  // namespace ferry::gateway
