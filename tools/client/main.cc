// ferry-client: a small command-line client of the public Generation API.
#include <CLI/CLI.hpp>
#include <grpcpp/grpcpp.h>

#include <iostream>

#include "ferry/v1/generation.grpc.pb.h"

int main(int argc, char** argv) {
  CLI::App app{"ferry-client: send one prompt to a Ferry gateway and print the completion"};
  std::string target = "127.0.0.1:50051", prompt, lane;
  int max_tokens = 32;
  float temperature = 0.f;
  uint64_t seed = 0;
  bool stream = false;
  app.add_option("prompt", prompt, "Prompt text")->required();
  app.add_option("--target", target, "Gateway address");
  app.add_option("--max-tokens", max_tokens, "Tokens to generate at most");
  app.add_option("--temperature", temperature, "0: greedy");
  app.add_option("--seed", seed, "Sampling seed");
  app.add_option("--lane", lane, "Priority lane (interactive, batch)");
  app.add_flag("--stream", stream, "Print text as it is generated");
  CLI11_PARSE(app, argc, argv);

  auto stub = ferry::v1::Generation::NewStub(grpc::CreateChannel(target, grpc::InsecureChannelCredentials()));
  ferry::v1::GenerateRequest request;
  request.set_text(prompt);
  request.set_lane(lane);
  request.mutable_sampling()->set_max_tokens(max_tokens);
  request.mutable_sampling()->set_temperature(temperature);
  request.mutable_sampling()->set_seed(seed);
  grpc::ClientContext context;
  if (stream) {
    auto reader = stub->GenerateStream(&context, request);
    ferry::v1::GenerateChunk chunk;
    while (reader->Read(&chunk)) {
      std::cout << chunk.text() << std::flush;
      if (chunk.finish_reason() != ferry::v1::FINISH_REASON_UNSPECIFIED) {
        std::cout << "\n[" << ferry::v1::FinishReason_Name(chunk.finish_reason()) << ", "
                  << chunk.usage().completion_tokens() << " tokens, " << chunk.timings().total_s() << " s]\n";
      }
    }
    grpc::Status status = reader->Finish();
    if (!status.ok()) {
      std::cerr << "error " << status.error_code() << ": " << status.error_message() << "\n";
      return 1;
    }
    return 0;
  }
  ferry::v1::GenerateResponse response;
  grpc::Status status = stub->Generate(&context, request, &response);
  if (!status.ok()) {
    std::cerr << "error " << status.error_code() << ": " << status.error_message() << "\n";
    return 1;
  }
  std::cout << response.text() << "\n[" << ferry::v1::FinishReason_Name(response.finish_reason()) << ", "
            << response.usage().completion_tokens() << " tokens, " << response.timings().total_s() << " s]\n";
  return 0;
}
