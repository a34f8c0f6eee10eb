// Counts heap allocations made through operator new (every standard container's and protobuf's),
// for tests that prove a path allocates nothing. A test binary links count_allocations.cc, which
// replaces the global operator new and delete.
#pragma once

#include <cstdint>

namespace ferry::testing {

// Allocations through operator new since the process started, on every thread.
int64_t NumAllocations();

}  // namespace ferry::testing
