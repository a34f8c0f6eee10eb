#include "gateway/http/sse_stream.h"

#include <poll.h>
#include <sys/socket.h>

#include <cerrno>

#include <fmt/format.h>
#include <httplib.h>

namespace ferry::gateway::http {

namespace {

// cpp-httplib's default write timeout: a client that takes nothing for this long is gone.
constexpr int kWriteTimeoutMs = 5000;

// Sends all of `data` on a connected socket, waiting for room; false on an error or the timeout.
bool SendAll(int socket, std::string_view data) {
  while (!data.empty()) {
    const ssize_t sent = ::send(socket, data.data(), data.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    if (sent > 0) {
      data.remove_prefix(static_cast<size_t>(sent));
      continue;
    }
    if (sent < 0 && errno == EINTR) continue;
    if (sent < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return false;
    pollfd p{socket, POLLOUT, 0};
    const int ready = ::poll(&p, 1, kWriteTimeoutMs);
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0 || (p.revents & (POLLERR | POLLHUP | POLLNVAL)) != 0) return false;
  }
  return true;
}

}  // namespace

std::string HttpChunk(std::string_view data) {
  // A zero-length chunk would end the body: callers never frame nothing.
  return fmt::format("{:x}\r\n", data.size()).append(data).append("\r\n");
}

ChatStreamFormat::ChatStreamFormat(ResponseContext ctx, int32_t num_choices, int32_t n, bool include_usage)
    : ctx_(std::move(ctx)), n_(n), include_usage_(include_usage), states_(static_cast<size_t>(num_choices)) {
  for (size_t i = 0; i < states_.size(); ++i) states_[i].index = static_cast<int32_t>(i);
}

std::string ChatStreamFormat::Chunk(int32_t index, const ferry::v1::GenerateChunk& chunk, nlohmann::json tool_calls,
                                    bool tools_called) {
  StreamState& state = states_.at(static_cast<size_t>(index));
  state.tool_calls = std::move(tool_calls);
  state.tools_called = tools_called;
  std::string event = StreamChunkEvent(ctx_, chunk, state);
  state.tool_calls = nullptr;
  if (chunk.finish_reason() != ferry::v1::FINISH_REASON_UNSPECIFIED) {
    AddChoiceUsage(chunk.usage(), static_cast<size_t>(index), n_, usage_);
  }
  return event;
}

std::string ChatStreamFormat::End(const Status& status) {
  std::string rest;
  if (status.ok() && include_usage_) rest += SseEvent(StreamUsageJson(ctx_, usage_));
  if (!status.ok()) rest += SseEvent(ErrorJson(ErrorFromStatus(status)));
  rest += kSseDone;
  return rest;
}

SseStream::SseStream(std::unique_ptr<StreamFormat> format) : format_(std::move(format)) {}

void SseStream::OnChunk(int32_t index, const ferry::v1::GenerateChunk& chunk, nlohmann::json tool_calls,
                        bool tools_called) {
  std::lock_guard lock(mu_);
  if (is_broken_) return;
  std::string event = format_->Chunk(index, chunk, std::move(tool_calls), tools_called);
  const bool was_started = is_started_;
  is_started_ = true;
  if (event.empty()) {
    if (!was_started) cv_.notify_all();
    return;
  }
  SendOrQueueLocked(std::move(event));
  // Wake the connection's thread only when it has something to do: a direct send needs nothing.
  if (!was_started || is_broken_ || !queued_.empty() || !unsent_tail_.empty()) cv_.notify_all();
}

void SseStream::SendOrQueueLocked(std::string event) {
  if (socket_ < 0 || is_flushing_ || !unsent_tail_.empty() || !queued_.empty()) {
    queued_ += event;  // behind what is already waiting
    return;
  }
  const std::string framed = HttpChunk(event);
  const ssize_t sent = ::send(socket_, framed.data(), framed.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
  if (sent == static_cast<ssize_t>(framed.size())) {
    ++direct_sends_;
    return;
  }
  if (sent < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
    is_broken_ = true;
    return;
  }
  unsent_tail_ = framed.substr(sent > 0 ? static_cast<size_t>(sent) : 0);
}

void SseStream::End(const Status& status) {
  std::lock_guard lock(mu_);
  status_ = status;
  is_ended_ = true;
  cv_.notify_all();
}

std::optional<Status> SseStream::WaitStarted() {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return is_started_ || is_ended_; });
  if (!is_started_ && !status_.ok()) return status_;
  return std::nullopt;
}

bool SseStream::WaitStartedFor(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  return cv_.wait_for(lock, timeout, [&] { return is_started_ || is_ended_; });
}

bool SseStream::FlushLocked(std::unique_lock<std::mutex>& lock, int socket, httplib::DataSink& sink) {
  const std::string tail = std::move(unsent_tail_);
  const std::string events = std::move(queued_);
  unsent_tail_.clear();
  queued_.clear();
  is_flushing_ = true;  // chunks that come meanwhile queue behind these
  lock.unlock();
  bool ok = true;
  if (socket >= 0) {
    ok = SendAll(socket, tail) && (events.empty() || SendAll(socket, HttpChunk(events)));
  } else if (!events.empty()) {
    ok = sink.write(events.data(), events.size());  // frames it; there is never a tail without a socket
  }
  lock.lock();
  is_flushing_ = false;
  return ok;
}

bool SseStream::Serve(int socket, httplib::DataSink& sink) {
  std::unique_lock lock(mu_);
  socket_ = socket;  // the headers are out: gRPC threads may send from now on
  for (;;) {
    cv_.wait(lock, [&] { return is_broken_ || is_ended_ || !queued_.empty() || !unsent_tail_.empty(); });
    if (is_broken_) return false;
    if (queued_.empty() && unsent_tail_.empty()) break;  // ended, everything sent
    if (!FlushLocked(lock, socket, sink)) {
      is_broken_ = true;
      return false;
    }
  }
  // Ended: no chunk can come any more, so this thread writes the rest alone.
  const std::string rest = format_->End(status_);
  lock.unlock();
  if (!sink.write(rest.data(), rest.size())) return false;
  sink.done();
  return true;
}

int64_t SseStream::direct_sends() const {
  std::lock_guard lock(mu_);
  return direct_sends_;
}

}  // namespace ferry::gateway::http
