// gRPC side of authentication, shared by the Generation and Jobs services: reads the bearer
// key from metadata, admits a request through the Authenticator and maps its verdict to a
// gRPC status (RESOURCE_EXHAUSTED carries the `grpc-retry-pushback-ms` trailer, as gRPC's
// retry design specifies).
#pragma once

#include <optional>
#include <string>

#include <grpcpp/server_context.h>

#include "ferry/v1/generation.pb.h"
#include "gateway/auth/authenticator.h"
#include "gateway/generator.h"

namespace ferry::gateway {

// The key from "authorization: Bearer <key>"; nullopt when absent or not a bearer token.
std::optional<std::string> BearerToken(const grpc::ServerContextBase& context);

// UNAUTHENTICATED / PERMISSION_DENIED / RESOURCE_EXHAUSTED (+ retry trailer) / OK.
grpc::Status ToGrpcStatus(const AuthResult& result, grpc::ServerContextBase& context);

struct Admission {
  grpc::Status status;         // not OK: answer the call with it
  std::string tenant;
  int64_t reserved_completion_tokens = 0;  // refund what the request does not use
};

// Authenticates the caller and charges the request to its tenant. A request naming an unknown
// lane is only authenticated (nothing charged); the Generator then rejects it.
Admission AdmitCall(Authenticator& auth, const Generator& generator, grpc::ServerContextBase& context,
                    const ferry::v1::GenerateRequest& request);

// Returns what an admitted request reserved but did not generate.
void RefundUnused(Authenticator& auth, const Admission& admission, int64_t completion_tokens);

}  // namespace ferry::gateway
