#include "tools/bench/http_response_parser.h"

#include <algorithm>
#include <cctype>

namespace ferry::bench {
namespace {

// A status line, header or chunk-size line longer than this is not from a sane server; failing
// bounds what a broken peer can make the parser buffer.
constexpr size_t kMaxLineBytes = 64 << 10;

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

bool IEquals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
         });
}

// Calls f on each comma-separated, trimmed token of a header value.
template <typename F>
void ForEachToken(std::string_view value, F f) {
  while (!value.empty()) {
    const size_t comma = value.find(',');
    f(Trim(value.substr(0, comma)));
    if (comma == std::string_view::npos) return;
    value.remove_prefix(comma + 1);
  }
}

// Parses unsigned digits in `base` (the whole of s); false when empty, not digits or too large.
bool ParseUnsigned(std::string_view s, int base, uint64_t& out) {
  if (s.empty() || s.size() > 15) return false;  // 15 hex digits still fit in 63 bits
  out = 0;
  for (const char c : s) {
    int d;
    if (c >= '0' && c <= '9') {
      d = c - '0';
    } else if (base == 16 && std::isxdigit(static_cast<unsigned char>(c))) {
      d = std::tolower(static_cast<unsigned char>(c)) - 'a' + 10;
    } else {
      return false;
    }
    out = out * base + d;
  }
  return true;
}

}  // namespace

HttpResponseParser::State HttpResponseParser::Feed(std::string_view bytes, const BodySink& on_body) {
  while (!bytes.empty() && (state_ == State::kHead || state_ == State::kBody)) {
    const size_t n = state_ == State::kHead ? FeedHead(bytes) : FeedBody(bytes, on_body);
    bytes.remove_prefix(n);
  }
  if (!bytes.empty() && state_ == State::kDone) Fail("bytes after the end of the response");
  return state_;
}

HttpResponseParser::State HttpResponseParser::OnClose() {
  if (state_ == State::kBody && body_mode_ == BodyMode::kUntilClose) {
    state_ = State::kDone;
  } else if (state_ == State::kHead) {
    Fail(status_ == 0 && line_.empty() ? "connection closed before the response"
                                       : "connection closed in the response's headers");
  } else if (state_ == State::kBody) {
    Fail("connection closed mid-body");
  }
  return state_;
}

size_t HttpResponseParser::TakeLine(std::string_view bytes, bool& has_line) {
  const size_t nl = bytes.find('\n');
  has_line = nl != std::string_view::npos;
  const size_t n = has_line ? nl + 1 : bytes.size();
  line_.append(bytes.data(), has_line ? nl : n);
  if (line_.size() > kMaxLineBytes) Fail("a line of the response is over 64 KiB");
  if (has_line && !line_.empty() && line_.back() == '\r') line_.pop_back();
  return n;
}

size_t HttpResponseParser::FeedHead(std::string_view bytes) {
  bool has_line = false;
  const size_t n = TakeLine(bytes, has_line);
  if (has_line && state_ == State::kHead) {
    const std::string line = std::move(line_);
    line_.clear();
    OnHeadLine(line);
  }
  return n;
}

void HttpResponseParser::OnHeadLine(std::string_view line) {
  if (!has_status_line_) {
    // "HTTP/1.1 200 OK"; HTTP/1.0 closes after the response unless it says keep-alive.
    uint64_t code = 0;
    if (line.size() < 12 || line.substr(0, 7) != "HTTP/1." || line[8] != ' ' ||
        !ParseUnsigned(line.substr(9, 3), 10, code) || (line.size() > 12 && line[12] != ' ')) {
      return Fail("malformed status line: " + std::string(line.substr(0, 100)));
    }
    status_ = static_cast<int>(code);
    is_keep_alive_ = line[7] != '0';
    has_status_line_ = true;
  } else if (line.empty()) {
    StartBody();
  } else {
    const size_t colon = line.find(':');
    if (colon == std::string_view::npos || colon == 0) {
      return Fail("malformed header line: " + std::string(line.substr(0, 100)));
    }
    OnHeader(Trim(line.substr(0, colon)), Trim(line.substr(colon + 1)));
  }
}

void HttpResponseParser::OnHeader(std::string_view name, std::string_view value) {
  if (IEquals(name, "Connection")) {
    ForEachToken(value, [this](std::string_view t) {
      if (IEquals(t, "close")) is_keep_alive_ = false;
      if (IEquals(t, "keep-alive")) is_keep_alive_ = true;
    });
  } else if (IEquals(name, "Transfer-Encoding")) {
    // Only the last coding delimits the body (RFC 9112 6.1); any other leaves it to the close.
    std::string_view last;
    ForEachToken(value, [&last](std::string_view t) { last = t; });
    is_chunked_ = IEquals(last, "chunked");
    if (!is_chunked_) is_keep_alive_ = false;
  } else if (IEquals(name, "Content-Length")) {
    uint64_t n = 0;
    if (!ParseUnsigned(value, 10, n)) return Fail("malformed Content-Length: " + std::string(value.substr(0, 40)));
    content_length_ = static_cast<int64_t>(n);
  }
}

void HttpResponseParser::StartBody() {
  if (status_ >= 100 && status_ < 200) {
    // An interim response (100 Continue): the real one follows with a head of its own.
    *this = HttpResponseParser();
    return;
  }
  state_ = State::kBody;
  if (status_ == 204 || status_ == 304) {
    body_mode_ = BodyMode::kNone;
  } else if (is_chunked_) {
    body_mode_ = BodyMode::kChunked;  // wins over a Content-Length (RFC 9112 6.3)
  } else if (content_length_ >= 0) {
    body_mode_ = BodyMode::kLength;
    remaining_ = static_cast<uint64_t>(content_length_);
  } else {
    body_mode_ = BodyMode::kUntilClose;
  }
  if (body_mode_ == BodyMode::kNone || (body_mode_ == BodyMode::kLength && remaining_ == 0)) state_ = State::kDone;
}

size_t HttpResponseParser::FeedBody(std::string_view bytes, const BodySink& on_body) {
  switch (body_mode_) {
    case BodyMode::kLength: {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(remaining_, bytes.size()));
      on_body(bytes.substr(0, n));
      remaining_ -= n;
      if (remaining_ == 0) state_ = State::kDone;
      return n;
    }
    case BodyMode::kUntilClose:
      on_body(bytes);
      return bytes.size();
    case BodyMode::kChunked:
      return FeedChunked(bytes, on_body);
    case BodyMode::kNone:
      break;
  }
  state_ = State::kDone;
  return 0;
}

// One step of the chunked coding: a size line, (part of) a chunk's data, the CRLF after the
// data, or a trailer line (the empty one ends the body).
size_t HttpResponseParser::FeedChunked(std::string_view bytes, const BodySink& on_body) {
  if (chunk_step_ == ChunkStep::kData) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(remaining_, bytes.size()));
    on_body(bytes.substr(0, n));
    remaining_ -= n;
    if (remaining_ == 0) chunk_step_ = ChunkStep::kDataEnd;
    return n;
  }
  bool has_line = false;
  const size_t n = TakeLine(bytes, has_line);
  if (has_line && state_ == State::kBody) {
    const std::string line = std::move(line_);
    line_.clear();
    OnChunkLine(line);
  }
  return n;
}

void HttpResponseParser::OnChunkLine(std::string_view line) {
  switch (chunk_step_) {
    case ChunkStep::kSize: {
      uint64_t size = 0;
      const std::string_view digits = Trim(line.substr(0, line.find(';')));  // chunk extensions ignored
      if (!ParseUnsigned(digits, 16, size)) return Fail("malformed chunk size: " + std::string(line.substr(0, 40)));
      remaining_ = size;
      chunk_step_ = size == 0 ? ChunkStep::kTrailer : ChunkStep::kData;
      return;
    }
    case ChunkStep::kDataEnd:
      if (!line.empty()) return Fail("chunk data not followed by CRLF");
      chunk_step_ = ChunkStep::kSize;
      return;
    case ChunkStep::kTrailer:
      if (line.empty()) state_ = State::kDone;  // trailer fields themselves are not needed
      return;
    case ChunkStep::kData:
      return;
  }
}

void HttpResponseParser::Fail(std::string message) {
  if (state_ == State::kError) return;
  state_ = State::kError;
  error_ = std::move(message);
}

}  // namespace ferry::bench
