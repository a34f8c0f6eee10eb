// ferry-client: a small command-line client of the public Generation API.
#include <CLI/CLI.hpp>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <fstream>
#include <future>
#include <optional>
#include <iostream>
#include <sstream>
#include <vector>

#include "common/process.h"
#include "ferry/v1/generation.grpc.pb.h"

namespace {

// A file's whole text; false (and a message) when it cannot be read.
bool ReadFile(const std::string& path, std::string& out) {
  std::ifstream in(path);
  if (!in) {
    std::cerr << path << ": cannot be read\n";
    return false;
  }
  std::stringstream text;
  text << in.rdbuf();
  out = text.str();
  return true;
}

// Structured output from the flags: at most one of them; false when none can be read.
bool SetGuided(bool json_object, const std::vector<std::string>& choices, const std::string& schema_file,
               const std::string& regex, const std::string& grammar_file, ferry::v1::SamplingParams& sampling) {
  if (json_object + !choices.empty() + !schema_file.empty() + !regex.empty() + !grammar_file.empty() > 1) {
    std::cerr << "--json-object, --choice, --json-schema, --regex and --grammar are exclusive: a request takes one "
                 "constraint\n";
    return false;
  }
  if (json_object) sampling.mutable_guided()->set_json_object(true);
  if (!regex.empty()) sampling.mutable_guided()->set_regex(regex);
  for (const std::string& c : choices) sampling.mutable_guided()->mutable_choice()->add_choices(c);
  std::string text;
  if (!schema_file.empty()) {
    if (!ReadFile(schema_file, text)) return false;
    sampling.mutable_guided()->set_json_schema(text);
  }
  if (!grammar_file.empty()) {
    if (!ReadFile(grammar_file, text)) return false;
    sampling.mutable_guided()->set_grammar(text);
  }
  return true;
}

// grpc.health.v1.Health/Check of `service` (the Ferry services answer "" for readiness and
// "liveness"): 0 when SERVING, 1 otherwise, with the status printed. An exec probe for Kubernetes
// once TLS is on (the kubelet's own gRPC probes speak plaintext only). The messages are one field
// each, so they are written and read here in protobuf's wire format (no health .proto is installed):
// request `string service = 1`, response `ServingStatus status = 1` (1 = SERVING).
int CheckHealth(const std::shared_ptr<grpc::Channel>& channel, const std::string& service) {
  if (service.size() > 127) {  // its length must fit one varint byte
    std::cerr << "--health: a service name of at most 127 bytes\n";
    return 2;
  }
  std::string request = {0x0a, static_cast<char>(service.size())};  // field 1, length-delimited
  request += service;
  grpc::Slice slice(request);
  grpc::ByteBuffer in(&slice, 1), out;
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  std::promise<grpc::Status> done;
  stub.UnaryCall(&context, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &in, &out,
                 [&done](grpc::Status status) { done.set_value(std::move(status)); });
  const grpc::Status status = done.get_future().get();
  if (!status.ok()) {
    std::cerr << "health \"" << service << "\": error " << status.error_code() << ": " << status.error_message() << "\n";
    return 1;
  }
  std::vector<grpc::Slice> slices;
  std::string response;
  if (out.Dump(&slices).ok()) {
    for (const auto& s : slices) response.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  // field 1, varint: the status (absent: 0, UNKNOWN)
  const int code = response.size() >= 2 && response[0] == 0x08 ? response[1] : 0;
  static const char* kNames[] = {"UNKNOWN", "SERVING", "NOT_SERVING", "SERVICE_UNKNOWN"};
  std::cout << "health \"" << service << "\": " << (code >= 0 && code <= 3 ? kNames[code] : "?") << "\n";
  return code == 1 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  ferry::IgnoreBrokenPipes();  // a server that closes mid-request is an error to report, not a death
  CLI::App app{"ferry-client: send one prompt to a Ferry gateway and print the completion"};
  std::string target = "127.0.0.1:50051", prompt, lane;
  int max_tokens = 32;
  float temperature = 0.f;
  uint64_t seed = 0;
  bool stream = false, json_object = false;
  std::vector<std::string> choices;
  std::string schema_file, regex, grammar_file;
  std::optional<std::string> health;
  app.add_option("prompt", prompt, "Prompt text (not with --health)");
  app.add_option("--health", health,
                 "Instead of a prompt: grpc.health.v1 Check of this service at --target (\"\" readiness, liveness); "
                 "exit 0 when SERVING (a Kubernetes exec probe with TLS)");
  app.add_option("--target", target, "Gateway address");
  std::string tls_ca, tls_cert, tls_key;
  app.add_option("--tls-ca", tls_ca, "PEM CA bundle to verify the gateway with (set: TLS)");
  app.add_option("--tls-cert", tls_cert,
                 "PEM client certificate, when the server asks for one (an internal service always does)");
  app.add_option("--tls-key", tls_key, "PEM private key of --tls-cert");
  app.add_option("--max-tokens", max_tokens, "Tokens to generate at most");
  app.add_option("--temperature", temperature, "0: greedy");
  app.add_option("--seed", seed, "Sampling seed");
  app.add_option("--lane", lane, "Priority lane (interactive, batch)");
  app.add_flag("--stream", stream, "Print text as it is generated");
  app.add_flag("--json-object", json_object, "Structured output: any JSON object");
  app.add_option("--choice", choices, "Structured output: exactly one of these strings (repeat the flag)")
      ->allow_extra_args(false);  // one string a flag, so the prompt after it stays the prompt
  app.add_option("--json-schema", schema_file, "Structured output: a value of the JSON Schema in this file");
  app.add_option("--regex", regex, "Structured output: a text the whole of which matches this regex");
  app.add_option("--grammar", grammar_file, "Structured output: a text of the EBNF grammar in this file (from root)");
  CLI11_PARSE(app, argc, argv);

  auto credentials = grpc::InsecureChannelCredentials();
  if (!tls_ca.empty()) {
    grpc::SslCredentialsOptions ssl;
    if (!ReadFile(tls_ca, ssl.pem_root_certs) || (!tls_cert.empty() && !ReadFile(tls_cert, ssl.pem_cert_chain)) ||
        (!tls_key.empty() && !ReadFile(tls_key, ssl.pem_private_key))) {
      return 2;
    }
    credentials = grpc::SslCredentials(ssl);
  }
  auto channel = grpc::CreateChannel(target, credentials);
  if (health) return CheckHealth(channel, *health);
  if (prompt.empty()) {
    std::cerr << "a prompt is required (or --health SERVICE)\n";
    return 2;
  }
  auto stub = ferry::v1::Generation::NewStub(channel);
  ferry::v1::GenerateRequest request;
  request.set_text(prompt);
  request.set_lane(lane);
  request.mutable_sampling()->set_max_tokens(max_tokens);
  request.mutable_sampling()->set_temperature(temperature);
  request.mutable_sampling()->set_seed(seed);
  if (!SetGuided(json_object, choices, schema_file, regex, grammar_file, *request.mutable_sampling())) return 2;
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
