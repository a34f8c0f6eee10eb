// An HTTP/1.1 response parser fed bytes as they arrive from a socket (any split), so one thread
// can read many streams without a blocking read per stream: ferry-bench's HTTP client
// (http_client.cc) reads every SSE stream this way from one event loop. It decodes the body
// (chunked transfer coding, Content-Length, or "until the connection closes") and hands the
// decoded bytes on as they come; it knows nothing of sockets or SSE.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

namespace ferry::bench {

class HttpResponseParser {
 public:
  enum class State { kHead, kBody, kDone, kError };
  using BodySink = std::function<void(std::string_view)>;

  // Parses `bytes`, the next ones of the response; body bytes go to `on_body` (possibly in
  // several pieces). Bytes after the end of the response are an error: nothing pipelines here.
  State Feed(std::string_view bytes, const BodySink& on_body);
  // The peer closed the connection: this ends a body delimited by the close; anything else that
  // is unfinished becomes an error.
  State OnClose();

  State state() const { return state_; }
  int status() const { return status_; }  // 0 until the status line is read
  const std::string& error() const { return error_; }
  // Whether the connection may carry the next request once the response is done.
  bool is_keep_alive() const { return is_keep_alive_ && body_mode_ != BodyMode::kUntilClose; }

 private:
  enum class BodyMode { kNone, kLength, kChunked, kUntilClose };
  enum class ChunkStep { kSize, kData, kDataEnd, kTrailer };

  size_t FeedHead(std::string_view bytes);
  void OnHeadLine(std::string_view line);
  void OnHeader(std::string_view name, std::string_view value);
  void StartBody();
  size_t FeedBody(std::string_view bytes, const BodySink& on_body);
  size_t FeedChunked(std::string_view bytes, const BodySink& on_body);
  void OnChunkLine(std::string_view line);
  // Appends to line_ up to the next '\n'; returns the bytes consumed and whether a line ended.
  size_t TakeLine(std::string_view bytes, bool& has_line);
  void Fail(std::string message);

  State state_ = State::kHead;
  std::string error_;
  std::string line_;  // the line being read (head, chunk size, trailer), without its "\n"
  int status_ = 0;
  bool has_status_line_ = false;
  bool is_keep_alive_ = true;
  bool is_chunked_ = false;
  int64_t content_length_ = -1;
  BodyMode body_mode_ = BodyMode::kNone;
  ChunkStep chunk_step_ = ChunkStep::kSize;
  uint64_t remaining_ = 0;  // body bytes left (kLength) or of the current chunk (kChunked)
};

}  // namespace ferry::bench
