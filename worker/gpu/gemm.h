// Dense layers on the GPU through cuBLAS: bf16 inputs and weights, fp32 accumulation and fp32
// output (the CPU bf16 path's numerics). The handle owns a fixed workspace so that calls can be
// captured into CUDA graphs (cuBLAS then never allocates).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "worker/gpu/device_buffer.h"

namespace ferry::worker::gpu {

class CublasGemm {
 public:
  CublasGemm(cudaStream_t stream, size_t workspace_bytes = 32u << 20);
  ~CublasGemm();
  CublasGemm(const CublasGemm&) = delete;
  CublasGemm& operator=(const CublasGemm&) = delete;

  // y = x w^T; throws CudaError on a cuBLAS failure.
  void Run(const uint16_t* x,  // [m, k] bf16
           const uint16_t* w,  // [n, k] bf16 (Hugging Face's [out_features, in_features])
           float* y,           // [m, n] fp32
           int64_t m, int64_t n, int64_t k);

 private:
  cublasHandle_t handle_ = nullptr;
  DeviceBuffer workspace_;
};

}  // namespace ferry::worker::gpu
