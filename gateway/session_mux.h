// The gateway's side of Scheduler.Session (issue #54: apart from the client that routes to replicas):
// requests multiplexed on one long-lived bidirectional stream per connection to a scheduler replica. Each
// scheduler step reaches the gateway as one message for every request on the session; each request is a
// SchedulerStream that its reader (GenerationCall) takes events from at its own pace. Sessions and requests
// are callback reactors: no thread waits on either (session_mux.cc says how each works).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>

#include "ferry/v1/scheduler.grpc.pb.h"
#include "gateway/deadline_timer.h"
#include "gateway/scheduler_client.h"

namespace ferry::gateway {

// The sessions of one client that still exist. A session's last share may go on one of gRPC's
// callback threads (OnDone), and its ClientContext holds a share of the channel: were that the
// channel's last, gRPC 1.51 would destroy the channel's callback completion queue on the very thread
// that polls it (a use after free, seen under TSan). So the client keeps its channels (in its stubs)
// until every session it made is gone, and waits for that when it is destroyed. A session also lives
// as long as a request on it (its MuxStream) that no reader has concluded; a client destroyed while
// a front still holds such a request waits for it a bounded time and says so.
class LiveSessions {
 public:
  class Member {
   public:
    explicit Member(LiveSessions& live) : live_(live) {
      std::lock_guard lock(live_.mu_);
      ++live_.count_;
    }
    ~Member() {
      std::lock_guard lock(live_.mu_);
      if (--live_.count_ == 0) live_.cv_.notify_all();
    }
    Member(const Member&) = delete;
    Member& operator=(const Member&) = delete;

   private:
    LiveSessions& live_;
  };
  // The sessions still alive after `limit`: 0 when they all went.
  int WaitNone(std::chrono::milliseconds limit) {
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, limit, [&] { return count_ == 0; });
    return count_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int count_ = 0;
};

// One Scheduler.Session (session_mux.cc).
class Session;

// Starts a session on `stub`, counted in `live` until it is gone.
std::shared_ptr<Session> StartSession(ferry::v1::Scheduler::Stub& stub, LiveSessions& live);
// The session has ended: it takes no new request (the client starts another).
bool HasEnded(Session& session);
// Ends the session (the gateway is shutting down) and waits until its requests heard of it.
void Shutdown(Session& session);
// A request on `session`, read by `reader`; `timer` ends it at `deadline` if the scheduler does not answer.
// The stream owns itself from here until its reader's OnStreamDone returns.
SchedulerStream* NewMuxStream(std::shared_ptr<Session> session, const ferry::v1::SubmitRequest& submit,
                              std::chrono::system_clock::time_point deadline, std::shared_ptr<StreamReader> reader,
                              DeadlineTimer& timer);

}  // namespace ferry::gateway
