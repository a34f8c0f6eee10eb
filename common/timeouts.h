// Timeouts more than one process acts on, each defined once (issue #54: the worker's step timeout
// defaulted to 0, the scheduler's to 60, and ferry-launch documented both as 60).
#pragma once

namespace ferry {

// A step running longer than this: the scheduler loses the worker group (its requests wait for it),
// the worker's Health turns false, ferry-launch kills and restarts a worker that silent (the first
// steps of each connection get 5x, for a fresh worker's warm-up).
inline constexpr int kDefaultStepTimeoutS = 60;
// How long the scheduler keeps a lost worker group's requests for it to come back.
inline constexpr int kDefaultWorkerRecoveryTimeoutS = 120;

}  // namespace ferry
