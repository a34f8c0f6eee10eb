// Tests of the bf16 matmul path skip, saying why, where it does not run: only when
// FERRY_CPU_MATMUL=onednn forces oneDNN on a CPU where oneDNN 2.6 has no bf16 matmul (below
// AVX-512); otherwise Ferry's kernel serves bf16 there.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "worker/model/linear.h"

#define FERRY_SKIP_WITHOUT_BF16(dtype)                                                      \
  if (std::string(dtype) == "bfloat16" && !::ferry::worker::Bf16MatmulAvailable())          \
  GTEST_SKIP() << "bfloat16 matmul through oneDNN needs AVX-512 and this CPU has none; "   \
                  "FERRY_CPU_MATMUL=onednn forbids Ferry's kernel"
