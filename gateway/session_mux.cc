#include "gateway/session_mux.h"

#include <algorithm>
#include <atomic>
#include <deque>
#include <optional>
#include <thread>
#include <unordered_map>

#include <grpcpp/client_context.h>
#include <grpcpp/support/client_callback.h>
#include <spdlog/spdlog.h>

#include "gateway/session_writes.h"

namespace ferry::gateway {

using ferry::v1::SessionEvents;
using ferry::v1::SessionRequests;
using ferry::v1::TokenEvent;
using SteadyClock = std::chrono::steady_clock;

namespace {

constexpr int64_t kSchedulerGoneRetryMs = 1000;

// One request on a session, as the SchedulerStream GenerationCall reads. Events arrive on the
// session's thread whenever the scheduler sends them; the reader takes them at its own pace
// (ReadNext), so what arrives meanwhile waits here, merged into one event (at most the request's
// max_tokens ids): this is the request's flow control, and the scheduler never waits for it.
//
// Lifetime: shared by the session (until the request ends there) and itself (from Start until
// OnStreamDone returns).
class MuxStream final : public SchedulerStream, public std::enable_shared_from_this<MuxStream> {
 public:
  MuxStream(std::shared_ptr<Session> session, const ferry::v1::SubmitRequest& submit,
            std::chrono::system_clock::time_point deadline, std::shared_ptr<StreamReader> reader, DeadlineTimer& timer)
      : session_(std::move(session)), submit_(submit), deadline_(deadline), reader_(std::move(reader)), timer_(timer) {}

  // The stream's own share, from its making until OnStreamDone returns.
  void Own() { self_ = shared_from_this(); }
  void Start() override;
  void ReadNext() override {
    std::unique_lock lock(mu_);
    waiting_ = true;
    Deliver(lock);
  }
  void StopReading() override {
    std::unique_lock lock(mu_);
    const bool cancel = !ended_;
    if (cancel) End(Status(StatusCode::kCancelled, "stopped reading"));
    waiting_ = false;
    lock.unlock();
    if (cancel) CancelUpstream();
    Done();
  }
  // A waiting reader hears of the end on the timer's thread, never inside Cancel: the canceller
  // may hold a lock that the reader's OnStreamDone takes (CancelSource's does).
  void Cancel() override {
    if (Abandon(Status(StatusCode::kCancelled, "cancelled"), true, false)) {
      timer_.Add(DeadlineTimer::Key{SteadyClock::time_point::min(), id_}, [keep = shared_from_this()] { keep->Done(); });
    }
  }

  // The session's thread: one event of this request, kept (its contents swapped in) until Offer.
  void Take(TokenEvent& event) {
    std::lock_guard lock(mu_);
    if (ended_) return;  // cancelled or timed out here: the scheduler's late events are dropped
    if (event.status_code() != 0) {
      Status status(static_cast<StatusCode>(event.status_code()), event.status_message());
      status.WithRetryAfter(event.retry_after_ms()).FromReplica();
      if (event.queue_timeout()) status.AsQueueTimeout();
      End(std::move(status));
    } else {
      Merge(event);
      if (event.finish() != ferry::v1::FINISH_KIND_NONE || pending_.finish() != ferry::v1::FINISH_KIND_NONE) {
        End(Status());
      }
    }
  }
  // The session's thread, after the Takes of a batch: a waiting reader gets what they brought.
  void Offer() {
    std::unique_lock lock(mu_);
    Deliver(lock);
  }
  // The session ended before the request did.
  void OnSessionEnd(const Status& status) { Abandon(status, false); }

  uint64_t id() const { return id_; }

 private:
  // Ends the request here with `status`, once: a waiting reader hears of it now (or, unless
  // `tell_now`, from the caller: true is returned), another at its next ReadNext; `upstream` tells
  // the scheduler to free the sequence.
  bool Abandon(const Status& status, bool upstream, bool tell_now = true) {
    std::unique_lock lock(mu_);
    if (ended_) return false;
    End(status);
    has_pending_ = false;  // as a cancelled gRPC call's reads fail, what was not taken is dropped
    pending_.Clear();
    const bool waiting = waiting_;
    waiting_ = false;
    lock.unlock();
    if (upstream) CancelUpstream();
    if (waiting && tell_now) Done();
    return waiting && !tell_now;
  }

  // mu_ held.
  void End(const Status& status) {
    ended_ = true;
    status_ = status;
  }

  // mu_ held. Appends the event to what the reader has not taken yet.
  void Merge(TokenEvent& event) {
    if (!has_pending_) {
      pending_.Swap(&event);
      has_pending_ = true;
      return;
    }
    pending_.mutable_token_ids()->Add(event.token_ids().begin(), event.token_ids().end());
    for (auto& lp : *event.mutable_logprobs()) pending_.add_logprobs()->Swap(&lp);
    for (auto& lp : *event.mutable_prompt_logprobs()) pending_.add_prompt_logprobs()->Swap(&lp);
    pending_.set_finish(event.finish());
  }

  // mu_ held by `lock`; releases it. Hands a waiting reader the merged event, or the end.
  void Deliver(std::unique_lock<std::mutex>& lock) {
    if (!waiting_) return;
    if (has_pending_) {
      waiting_ = false;
      has_pending_ = false;
      delivered_.Swap(&pending_);
      pending_.Clear();  // keeps its storage for the next merge
      std::shared_ptr<StreamReader> reader = reader_;
      std::shared_ptr<MuxStream> keep = shared_from_this();
      lock.unlock();
      return reader->OnEvent(delivered_);  // the reader answers with ReadNext or StopReading
    }
    if (!ended_) return;  // the reader waits for the next event
    waiting_ = false;
    lock.unlock();
    Done();
  }

  void CancelUpstream();
  void Done();

  const std::shared_ptr<Session> session_;
  const ferry::v1::SubmitRequest& submit_;
  const std::chrono::system_clock::time_point deadline_;
  std::shared_ptr<StreamReader> reader_;
  DeadlineTimer& timer_;
  std::optional<DeadlineTimer::Key> timer_key_;
  uint64_t id_ = 0;
  std::shared_ptr<MuxStream> self_;

  std::mutex mu_;
  bool waiting_ = false;  // the reader asked for an event and has none yet
  bool ended_ = false;    // the request's end is known (status_)
  bool done_ = false;     // OnStreamDone was called
  Status status_;
  bool has_pending_ = false;
  TokenEvent pending_;    // arrived, not taken
  TokenEvent delivered_;  // the reader's, during its OnEvent (one at a time)
};

}  // namespace

// One Scheduler.Session: the requests of one gateway connection to one replica, multiplexed.
// Submits and cancels queued while a write is in flight go out together in the next message, up
// to kMaxSessionWriteBytes (session_writes.h); the rest in the ones after.
// Each message read (a step's events of every request on it) goes to the session's own thread,
// which hands the events out: the per-token work (detokenising, the client's write, over HTTP a
// send per event) stays off gRPC's callback threads, which then complete the session's writes
// (the next submits) and reads without waiting behind it (an HTTP stream's first token waited
// 5x longer under load when they did it, docs/benchmarks/bench.md 2k). When the session ends every
// request still on it ends with its status, after the events read before (UNAVAILABLE when the
// scheduler went away, so a request that had not started may try another replica).
class Session final : public grpc::ClientBidiReactor<SessionRequests, SessionEvents>,
                      public std::enable_shared_from_this<Session> {
 public:
  Session(ferry::v1::Scheduler::Stub& stub, LiveSessions& live) : live_(live), stub_(stub) {}

  // A hold keeps OnDone back while a write may still start (WriteIfIdle decides under the lock,
  // starts outside it); it goes once reading failed and no write is in flight.
  void Begin() {
    self_ = shared_from_this();
    std::thread([session = self_] { session->HandOut(); }).detach();  // ends after the session's end
    stub_.async()->Session(&context_, this);
    AddHold();
    in_ = std::make_unique<SessionEvents>();
    StartRead(in_.get());
    StartCall();
  }

  // False when the session has already ended (the stream is not added).
  bool Open(const std::shared_ptr<MuxStream>& stream, const ferry::v1::SubmitRequest& submit, int64_t timeout_ms) {
    {
      std::lock_guard lock(mu_);
      if (ended_) return false;
      streams_.emplace(stream->id(), stream);
      auto* out = pending_.add_submits();
      out->set_stream_id(stream->id());
      *out->mutable_request() = submit;
      out->set_timeout_ms(timeout_ms);
    }
    WriteIfIdle();
    return true;
  }
  void Cancel(uint64_t id) {
    {
      std::lock_guard lock(mu_);
      if (streams_.erase(id) == 0 || ended_) return;  // ended already, here or there
      pending_.add_cancels(id);
    }
    WriteIfIdle();
  }
  void Forget(uint64_t id) {
    std::lock_guard lock(mu_);
    streams_.erase(id);
  }
  bool ended() {
    std::lock_guard lock(mu_);
    return ended_;
  }
  // Ends the session (the gateway is shutting down) and waits until its requests heard of it.
  void Shutdown() {
    context_.TryCancel();
    std::unique_lock lock(mu_);
    done_cv_.wait(lock, [&] { return done_; });
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the session is over: no more writes, and OnDone follows with its status
      bool release = false;
      {
        std::lock_guard lock(mu_);
        ended_ = true;
        release = !writing_;
        hold_ = hold_ && !release;
      }
      if (release) RemoveHold();
      return;
    }
    std::unique_ptr<SessionEvents> full = std::move(in_);
    {
      std::lock_guard lock(mu_);
      if (spare_.empty()) {
        in_ = std::make_unique<SessionEvents>();
      } else {
        in_ = std::move(spare_.back());
        spare_.pop_back();
      }
      read_.push_back(std::move(full));
    }
    read_cv_.notify_one();
    StartRead(in_.get());
  }
  void OnWriteDone(bool ok) override {
    bool release = false;
    {
      std::lock_guard lock(mu_);
      writing_ = false;
      release = ended_ && hold_;
      hold_ = hold_ && !release;
    }
    if (release) return RemoveHold();
    if (ok) WriteIfIdle();  // else the stream broke: the read fails too
  }
  void OnDone(const grpc::Status& status) override {
    {
      std::lock_guard lock(mu_);
      ended_ = true;
      end_ = status.ok() ? Status(StatusCode::kUnavailable, "the scheduler ended the session")
                         : Status(static_cast<StatusCode>(status.error_code()),
                                  "scheduler session: " + status.error_message());
      // A scheduler that went away is restarted by its supervisor, or another replica serves.
      if (end_->error_code() == StatusCode::kUnavailable) end_->WithRetryAfter(kSchedulerGoneRetryMs);
    }
    read_cv_.notify_one();
    std::shared_ptr<Session> last = std::move(self_);  // the hand-out thread holds its own share
  }

 private:
  // The session's own thread: hands out the events of every message read so far, then the
  // session's end. A request's events of several messages (this thread fell behind) are merged
  // and offered once: one chunk, one client write, for what arrived together.
  void HandOut() {
    std::deque<std::unique_ptr<SessionEvents>> messages;
    std::vector<std::pair<std::shared_ptr<MuxStream>, TokenEvent*>> batch;
    std::vector<MuxStream*> offers;
    std::unique_lock lock(mu_);
    while (true) {
      read_cv_.wait(lock, [&] { return !read_.empty() || end_.has_value(); });
      if (read_.empty()) break;  // ended, and everything read before was handed out
      messages.swap(read_);
      for (const auto& message : messages) {
        for (TokenEvent& event : *message->mutable_events()) {
          auto it = streams_.find(event.stream_id());
          if (it == streams_.end()) continue;  // cancelled or timed out here
          batch.emplace_back(it->second, &event);
          if (event.status_code() != 0 || event.finish() != ferry::v1::FINISH_KIND_NONE) streams_.erase(it);
        }
      }
      lock.unlock();
      for (auto& [stream, event] : batch) {
        stream->Take(*event);
        offers.push_back(stream.get());
      }
      std::sort(offers.begin(), offers.end());  // batch holds each stream alive until it is cleared
      offers.erase(std::unique(offers.begin(), offers.end()), offers.end());
      for (MuxStream* stream : offers) stream->Offer();
      offers.clear();
      batch.clear();
      for (auto& message : messages) message->Clear();  // keeps its events' storage for later reads
      lock.lock();
      for (auto& message : messages) spare_.push_back(std::move(message));
      messages.clear();
    }
    std::unordered_map<uint64_t, std::shared_ptr<MuxStream>> streams;
    streams.swap(streams_);
    const Status end = *end_;
    lock.unlock();
    for (auto& [id, stream] : streams) stream->OnSessionEnd(end);
    lock.lock();
    done_ = true;
    done_cv_.notify_all();
  }

  void WriteIfIdle() {
    {
      std::lock_guard lock(mu_);
      if (writing_ || ended_ || (pending_.submits_size() == 0 && pending_.cancels_size() == 0)) return;
      out_ = TakeSessionWrite(&pending_, kMaxSessionWriteBytes);  // the rest goes when this write is done
      writing_ = true;
    }
    StartWrite(&out_);
  }

  LiveSessions::Member live_;  // first: counted out after every other member, context_ included
  ferry::v1::Scheduler::Stub& stub_;
  grpc::ClientContext context_;
  std::shared_ptr<Session> self_;        // gRPC's share, until OnDone
  std::unique_ptr<SessionEvents> in_;    // the read in flight

  std::mutex mu_;
  std::condition_variable read_cv_;  // a message read, or the end
  std::condition_variable done_cv_;
  std::deque<std::unique_ptr<SessionEvents>> read_;   // read, not handed out yet
  std::vector<std::unique_ptr<SessionEvents>> spare_;  // handed out, cleared, for the next reads
  std::unordered_map<uint64_t, std::shared_ptr<MuxStream>> streams_;  // requests not ended upstream
  SessionRequests pending_;  // queued, not yet written
  SessionRequests out_;      // the write in flight
  bool writing_ = false;
  bool hold_ = true;    // Begin's hold is still on
  bool ended_ = false;  // reading failed: nothing more is sent
  std::optional<Status> end_;  // OnDone's status, for the requests still on the session
  bool done_ = false;          // the requests still on it heard of the end
};

namespace {

std::atomic<uint64_t> next_stream_id{1};

void MuxStream::Start() {
  id_ = next_stream_id.fetch_add(1);
  {
    std::unique_lock lock(mu_);
    if (ended_) {  // cancelled before it started (a CancelSource already cancelled): nothing is sent
      lock.unlock();
      return Done();
    }
    waiting_ = true;  // Start reads the first event
  }
  int64_t timeout_ms = 0;
  if (deadline_ != std::chrono::system_clock::time_point::max()) {
    const auto left = deadline_ - std::chrono::system_clock::now();
    // At least 1 ms: a deadline already past ends the request at once, there and here.
    timeout_ms = std::max<int64_t>(1, std::chrono::ceil<std::chrono::milliseconds>(left).count());
    std::weak_ptr<MuxStream> weak = self_;
    timer_key_ = DeadlineTimer::Key{SteadyClock::now() + std::chrono::milliseconds(timeout_ms), id_};
    timer_.Add(*timer_key_, [weak] {
      if (auto stream = weak.lock()) {
        stream->Abandon(Status(StatusCode::kDeadlineExceeded, "deadline exceeded waiting for the scheduler"), true);
      }
    });
  }
  if (!session_->Open(self_, submit_, timeout_ms)) {
    OnSessionEnd(Status(StatusCode::kUnavailable, "the scheduler session ended"));
  }
}

void MuxStream::CancelUpstream() { session_->Cancel(id_); }

void MuxStream::Done() {
  std::shared_ptr<StreamReader> reader;
  Status status;
  {
    std::lock_guard lock(mu_);
    if (done_) return;
    done_ = true;
    reader = std::move(reader_);
    status = status_;
  }
  if (timer_key_) timer_.Remove(*timer_key_);
  session_->Forget(id_);
  std::shared_ptr<MuxStream> last = std::move(self_);  // freed when this returns, unless a session still holds it
  reader->OnStreamDone(status);
}
}  // namespace

std::shared_ptr<Session> StartSession(ferry::v1::Scheduler::Stub& stub, LiveSessions& live) {
  auto session = std::make_shared<Session>(stub, live);
  session->Begin();
  return session;
}

bool HasEnded(Session& session) { return session.ended(); }

void Shutdown(Session& session) { session.Shutdown(); }

SchedulerStream* NewMuxStream(std::shared_ptr<Session> session, const ferry::v1::SubmitRequest& submit,
                              std::chrono::system_clock::time_point deadline, std::shared_ptr<StreamReader> reader,
                              DeadlineTimer& timer) {
  auto stream = std::make_shared<MuxStream>(std::move(session), submit, deadline, std::move(reader), timer);
  stream->Own();
  return stream.get();
}

}  // namespace ferry::gateway
