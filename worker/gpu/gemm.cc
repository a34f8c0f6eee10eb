#include "worker/gpu/gemm.h"

#include <stdexcept>
#include <string>

namespace ferry::worker::gpu {

CublasGemm::CublasGemm(cudaStream_t stream, size_t workspace_bytes) : workspace_(workspace_bytes) {
  FERRY_CUBLAS_CHECK(cublasCreate(&handle_));
  try {
    FERRY_CUBLAS_CHECK(cublasSetStream(handle_, stream));
    FERRY_CUBLAS_CHECK(cublasSetWorkspace(handle_, workspace_.get(), workspace_.bytes()));
    // No tensor-op downgrades to reduced-precision reductions: accumulate in fp32.
    FERRY_CUBLAS_CHECK(cublasSetMathMode(handle_, CUBLAS_DEFAULT_MATH));
  } catch (...) {
    cublasDestroy(handle_);
    throw;
  }
}

CublasGemm::~CublasGemm() { cublasDestroy(handle_); }

void CublasGemm::Run(const uint16_t* x, const uint16_t* w, float* y, int64_t m, int64_t n, int64_t k) {
  if (m == 0) return;
  if (m > INT32_MAX || n > INT32_MAX || k > INT32_MAX) {
    throw std::invalid_argument("GEMM size " + std::to_string(m) + "x" + std::to_string(n) + "x" +
                                std::to_string(k) + " exceeds cuBLAS int sizes");
  }
  const float alpha = 1.f, beta = 0.f;
  // cuBLAS is column-major: row-major y [m, n] is column-major y^T [n, m] = w [n, k] . x^T [k, m],
  // with w read as the transpose of a column-major [k, n] and x as a column-major [k, m].
  FERRY_CUBLAS_CHECK(cublasGemmEx(handle_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m),
                                  static_cast<int>(k), &alpha, w, CUDA_R_16BF, static_cast<int>(k), x, CUDA_R_16BF,
                                  static_cast<int>(k), &beta, y, CUDA_R_32F, static_cast<int>(n),
                                  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

}  // namespace ferry::worker::gpu
