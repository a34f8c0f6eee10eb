// How the gateway cuts a Scheduler.Session's queued submits and cancels into messages: a burst of
// long prompts queued while a write is in flight must not become one message over the receiver's
// limit (gRPC's default is 4 MB; over it the scheduler would end the session, and with it every
// request on it). Plain logic on the proto messages, no gRPC.
#pragma once

#include <cstddef>

#include "ferry/v1/scheduler.pb.h"

namespace ferry::gateway {

// Half of gRPC's default receive limit: any scheduler takes it, whatever its own setting.
inline constexpr size_t kMaxSessionWriteBytes = 2 << 20;

// Moves into the returned message the oldest submits of `pending` whose serialised sizes add up
// to at most max_bytes (always at least one, so a submit is never stuck; a single submit is
// bounded by the prompt limit the gateway validates), and every cancel except those of submits
// still left in `pending` (a cancel must not overtake its submit: the scheduler ignores a cancel
// of a stream it does not know). What stays in `pending` goes in the next message, in order.
ferry::v1::SessionRequests TakeSessionWrite(ferry::v1::SessionRequests* pending, size_t max_bytes);

}  // namespace ferry::gateway
