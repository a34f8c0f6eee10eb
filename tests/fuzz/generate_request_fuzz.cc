// The gateway's validation of ferry.v1.GenerateRequest (the gRPC front's input) from protobuf
// bytes: whatever parses (ParseFromArray) is validated into a SubmitRequest within the model's
// limits or refused with a message (request_check.h).
#include <cstddef>
#include <cstdint>

#include "ferry/v1/generation.pb.h"
#include "tests/fuzz/request_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ferry::v1::GenerateRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return 0;
  ferry::fuzz::CheckValidation(request);
  return 0;
}
