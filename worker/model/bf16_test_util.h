// Tests of the bf16 matmul path skip, saying why, on a CPU that has none (oneDNN 2.6 has bf16
// matmul from AVX-512 on; an AVX2-only CPU serves float32, which `--dtype auto` picks there).
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "worker/model/linear.h"

#define FERRY_SKIP_WITHOUT_BF16(dtype)                                                      \
  if (std::string(dtype) == "bfloat16" && !::ferry::worker::Bf16MatmulAvailable())          \
  GTEST_SKIP() << "bfloat16 matmul needs AVX-512 (oneDNN 2.6): this CPU has none; --dtype " \
                  "auto serves float32 on it"
