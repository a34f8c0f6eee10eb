#include "kernels/cpu/isa.h"

#include <atomic>
#include <cstdlib>
#include <cstring>

namespace ferry::kernels::cpu {
namespace {

bool CpuHasAvx512() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
}

Isa Detect() {
  const char* forced = std::getenv("FERRY_CPU_ISA");
  if (forced != nullptr && std::strcmp(forced, "avx2") == 0) return Isa::kAvx2;
  return CpuHasAvx512() ? Isa::kAvx512 : Isa::kAvx2;
}

// Relaxed is enough: every thread computes the same value, and tests set it between runs.
std::atomic<Isa>& Active() {
  static std::atomic<Isa> isa{Detect()};
  return isa;
}

}  // namespace

Isa ActiveIsa() { return Active().load(std::memory_order_relaxed); }

const char* IsaName(Isa isa) { return isa == Isa::kAvx512 ? "avx512" : "avx2"; }

void SetIsaForTesting(Isa isa) {
  if (isa == Isa::kAvx512 && !CpuHasAvx512()) isa = Isa::kAvx2;
  Active().store(isa, std::memory_order_relaxed);
}

}  // namespace ferry::kernels::cpu
