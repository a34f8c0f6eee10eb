// Status checks for host code that calls the CUDA runtime, cuBLAS or our kernel launchers.
// Every failure becomes a std::runtime_error carrying the call, file:line and the library's
// own message, so a failed step reports exactly what broke. Include from .cc or .cu files.
#pragma once

#include <cublas_api.h>
#include <cuda_runtime_api.h>

#include <stdexcept>
#include <string>

namespace ferry::kernels::cuda {

class CudaError : public std::runtime_error {
 public:
  CudaError(const std::string& what, int code) : std::runtime_error(what), code_(code) {}
  int code() const { return code_; }  // cudaError_t or cublasStatus_t value

 private:
  int code_;
};

[[noreturn]] inline void ThrowCuda(int code, const char* call, const char* file, int line) {
  const auto status = static_cast<cudaError_t>(code);
  throw CudaError(std::string(call) + " failed at " + file + ":" + std::to_string(line) + ": " +
                      cudaGetErrorName(status) + ": " + cudaGetErrorString(status),
                  code);
}

[[noreturn]] inline void ThrowCublas(int code, const char* call, const char* file, int line) {
  const auto status = static_cast<cublasStatus_t>(code);
  throw CudaError(std::string(call) + " failed at " + file + ":" + std::to_string(line) + ": " +
                      cublasGetStatusName(status) + ": " + cublasGetStatusString(status),
                  code);
}

}  // namespace ferry::kernels::cuda

// cudaError_t-returning calls, and our launchers (which return the cudaError_t as int).
#define FERRY_CUDA_CHECK(call)                                                              \
  do {                                                                                      \
    const int ferry_status_ = static_cast<int>(call);                                       \
    if (ferry_status_ != 0) ::ferry::kernels::cuda::ThrowCuda(ferry_status_, #call, __FILE__, __LINE__); \
  } while (0)

#define FERRY_CUBLAS_CHECK(call)                                                            \
  do {                                                                                      \
    const int ferry_status_ = static_cast<int>(call);                                       \
    if (ferry_status_ != 0) ::ferry::kernels::cuda::ThrowCublas(ferry_status_, #call, __FILE__, __LINE__); \
  } while (0)
