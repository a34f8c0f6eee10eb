// Counts heap allocations made through operator new (every standard container's and protobuf's),
// for tests that prove a path allocates nothing. A test binary links count_allocations.cc, which
// replaces the global operator new and delete.
#pragma once

#include <cstdint>

namespace ferry::testing {

// Allocations through operator new since the process started, on every thread.
int64_t NumAllocations();
// Of those, the calling thread's (a test of one thread's path while others, gRPC's, allocate).
int64_t NumAllocationsOnThisThread();

}  // namespace ferry::testing
