// Which instruction set the CPU kernels run with, chosen once at run time. The hot kernels are
// compiled twice (impl_*.cc with AVX2+FMA, and again with AVX-512), and the public entry points
// in cpu_kernels.cc / paged_attention.cc dispatch to one copy.
#pragma once

namespace ferry::kernels::cpu {

enum class Isa { kAvx2, kAvx512 };

// AVX-512 (F, BW, VL, DQ) when the CPU has it, else AVX2. FERRY_CPU_ISA=avx2 forces AVX2.
Isa ActiveIsa();
const char* IsaName(Isa isa);
// Tests run both copies on one machine; kAvx512 is only honoured where the CPU supports it.
void SetIsaForTesting(Isa isa);

}  // namespace ferry::kernels::cpu
