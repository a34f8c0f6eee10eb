#include "gateway/jinja/lexer.h"

#include <cctype>
#include <cstring>
#include <optional>

namespace ferry::gateway::jinja {

namespace {

// The code point at s[i] and its length; -1 length when the bytes are not UTF-8.
uint32_t Decode(const std::string& s, size_t i, int* len) {
  const auto c = static_cast<unsigned char>(s[i]);
  int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : -1;
  if (n < 0 || i + n > s.size()) {
    *len = -1;
    return 0;
  }
  uint32_t cp = n == 1 ? c : n == 2 ? c & 0x1F : n == 3 ? c & 0x0F : c & 0x07;
  for (int k = 1; k < n; ++k) {
    const auto b = static_cast<unsigned char>(s[i + k]);
    if ((b & 0xC0) != 0x80) {
      *len = -1;
      return 0;
    }
    cp = (cp << 6) | (b & 0x3F);
  }
  const bool overlong = (n == 2 && cp < 0x80) || (n == 3 && cp < 0x800) || (n == 4 && cp < 0x10000);
  if (overlong || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
    *len = -1;
    return 0;
  }
  *len = n;
  return cp;
}

void AppendUtf8(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// Python's str.rstrip(): the text without its trailing whitespace.
std::string RStripPy(const std::string& s) {
  size_t end = 0;
  for (size_t i = 0; i < s.size();) {
    int len = 0;
    const uint32_t cp = Decode(s, i, &len);
    i += len;
    if (!IsPySpace(cp)) end = i;
  }
  return s.substr(0, end);
}

// Past the whitespace (Python's \s) at s[i]: the next index.
size_t SkipPySpace(const std::string& s, size_t i) {
  while (i < s.size()) {
    int len = 0;
    if (!IsPySpace(Decode(s, i, &len))) break;
    i += len;
  }
  return i;
}

bool AllPySpace(const std::string& s, size_t from) { return from < s.size() && SkipPySpace(s, from) == s.size(); }

// A string literal's body with Python's escapes resolved (jinja2 decodes it with
// "unicode-escape"); nullopt on a malformed escape.
std::optional<std::string> Unescape(const std::string& body) {
  std::string out;
  for (size_t i = 0; i < body.size(); ++i) {
    if (body[i] != '\\' || i + 1 == body.size()) {
      out += body[i];
      continue;
    }
    const char c = body[++i];
    auto hex = [&](int digits) -> std::optional<uint32_t> {
      uint32_t v = 0;
      for (int k = 1; k <= digits; ++k) {
        if (i + k >= body.size() || !std::isxdigit(static_cast<unsigned char>(body[i + k]))) return std::nullopt;
        const char h = static_cast<char>(std::tolower(static_cast<unsigned char>(body[i + k])));
        v = v * 16 + static_cast<uint32_t>(h <= '9' ? h - '0' : h - 'a' + 10);
      }
      i += digits;
      return v;
    };
    switch (c) {
      case '\n': break;  // a line continuation
      case '\\': out += '\\'; break;
      case '\'': out += '\''; break;
      case '"': out += '"'; break;
      case 'a': out += '\a'; break;
      case 'b': out += '\b'; break;
      case 'f': out += '\f'; break;
      case 'n': out += '\n'; break;
      case 'r': out += '\r'; break;
      case 't': out += '\t'; break;
      case 'v': out += '\v'; break;
      case 'x':
      case 'u':
      case 'U': {
        const auto v = hex(c == 'x' ? 2 : c == 'u' ? 4 : 8);
        if (!v || *v > 0x10FFFF || (*v >= 0xD800 && *v <= 0xDFFF)) return std::nullopt;
        AppendUtf8(*v, out);
        break;
      }
      default:
        if (c >= '0' && c <= '7') {  // up to three octal digits
          uint32_t v = c - '0';
          for (int k = 0; k < 2 && i + 1 < body.size() && body[i + 1] >= '0' && body[i + 1] <= '7'; ++k) {
            v = v * 8 + (body[++i] - '0');
          }
          AppendUtf8(v, out);
        } else {  // an unknown escape stays as written
          out += '\\';
          out += c;
        }
    }
  }
  return out;
}

bool IsNameStart(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }
bool IsNameChar(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }
bool IsDigit(char c) { return c >= '0' && c <= '9'; }

// Digits with single underscores between them ("1_000"), from s[i]; the end (i when none).
size_t Digits(const std::string& s, size_t i) {
  size_t j = i;
  while (j < s.size() && (IsDigit(s[j]) || (s[j] == '_' && j > i && j + 1 < s.size() && IsDigit(s[j + 1])))) ++j;
  return j;
}

class Lexer {
 public:
  explicit Lexer(std::string src) : src_(std::move(src)) {}

  std::variant<std::vector<Token>, Error> Run() {
    size_t pos = 0;
    bool line_starting = true;
    while (pos < src_.size()) {
      const size_t start = NextTagStart(pos);
      std::string text = src_.substr(pos, start - pos);
      if (start == src_.size()) {
        Emit(Token::Kind::kText, text, pos);
        break;
      }
      const char type = src_[start + 1];
      const char sign = start + 2 < src_.size() && (src_[start + 2] == '-' || src_[start + 2] == '+') ? src_[start + 2] : 0;
      if (sign == '-') {
        text = RStripPy(text);
      } else if (sign != '+' && type != '{') {  // lstrip_blocks: a block or comment tag alone on its line
        const size_t line_start = text.rfind('\n') + 1;  // npos + 1 == 0
        if ((line_start > 0 || line_starting) && AllPySpace(text, line_start)) text.resize(line_start);
      }
      if (!text.empty()) Emit(Token::Kind::kText, text, pos);
      size_t p = start + 2 + (sign ? 1 : 0);
      std::optional<Error> error;
      if (type == '#') {
        error = Comment(start, p);
      } else {
        error = Tag(type, start, p);
      }
      if (error) return *error;
      line_starting = p > 0 && src_[p - 1] == '\n';
      pos = p;
    }
    tokens_.push_back({Token::Kind::kEof, "", LineAt(src_.size())});
    return std::move(tokens_);
  }

 private:
  size_t NextTagStart(size_t from) const {
    size_t at = from;
    while ((at = src_.find('{', at)) != std::string::npos) {
      if (at + 1 < src_.size() && (src_[at + 1] == '{' || src_[at + 1] == '%' || src_[at + 1] == '#')) return at;
      ++at;
    }
    return src_.size();
  }

  int LineAt(size_t pos) {
    for (; line_pos_ < pos && line_pos_ < src_.size(); ++line_pos_) line_ += src_[line_pos_] == '\n';
    return line_;
  }

  void Emit(Token::Kind kind, std::string text, size_t pos) { tokens_.push_back({kind, std::move(text), LineAt(pos)}); }

  // After a block or comment end: "-" strips the whitespace that follows, "+" keeps it, else
  // trim_blocks drops one newline.
  size_t AfterBlockEnd(char sign, size_t p) const {
    if (sign == '-') return SkipPySpace(src_, p);
    if (sign != '+' && p < src_.size() && src_[p] == '\n') return p + 1;
    return p;
  }

  std::optional<Error> Comment(size_t start, size_t& p) {
    const size_t end = src_.find("#}", p);
    if (end == std::string::npos) return Error{"Missing end of comment tag", LineAt(start)};
    const char sign = end > p && (src_[end - 1] == '-' || src_[end - 1] == '+') ? src_[end - 1] : 0;
    p = AfterBlockEnd(sign, end + 2);
    return std::nullopt;
  }

  std::optional<Error> Tag(char type, size_t start, size_t& p) {
    const bool block = type == '%';
    Emit(block ? Token::Kind::kBlockBegin : Token::Kind::kVarBegin, "", start);
    std::string brackets;  // the closing brackets expected, innermost last
    while (true) {
      while (p < src_.size() && std::strchr(" \t\n\r\f\v", src_[p]) != nullptr && src_[p] != 0) ++p;
      if (p >= src_.size()) return Error{block ? "unexpected end of template, expected '%}'" : "unexpected end of template, expected '}}'", LineAt(start)};
      if (brackets.empty()) {
        const char* end = block ? "%}" : "}}";
        for (const char sign : {'-', '+', '\0'}) {
          if (sign == '+' && !block) continue;
          const size_t at = p + (sign ? 1 : 0);
          if ((sign == 0 || src_[p] == sign) && src_.compare(at, 2, end) == 0) {
            Emit(block ? Token::Kind::kBlockEnd : Token::Kind::kVarEnd, "", p);
            p = at + 2;
            if (block) {
              p = AfterBlockEnd(sign, p);
            } else if (sign == '-') {
              p = SkipPySpace(src_, p);
            }
            return std::nullopt;
          }
        }
      }
      if (auto error = Lex(p, brackets)) return error;
    }
  }

  // One token inside a tag, at src_[p].
  std::optional<Error> Lex(size_t& p, std::string& brackets) {
    const char c = src_[p];
    if (IsNameStart(c)) {
      size_t j = p;
      while (j < src_.size() && IsNameChar(src_[j])) ++j;
      Emit(Token::Kind::kName, src_.substr(p, j - p), p);
      p = j;
      return std::nullopt;
    }
    if (IsDigit(c)) return Number(p);
    if (c == '\'' || c == '"') return String(p);
    static const char* kOps[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-", "/", "*", "%", "~", "[", "]", "(", ")",
                                 "{", "}", ">", "<", "=", ".", ":", "|", ",", ";"};
    for (const char* op : kOps) {
      const size_t n = std::strlen(op);
      if (src_.compare(p, n, op) != 0) continue;
      if (n == 1 && std::strchr("[({", c) != nullptr) brackets += c == '[' ? ']' : c == '(' ? ')' : '}';
      if (n == 1 && std::strchr("])}", c) != nullptr) {
        if (brackets.empty()) return Error{std::string("unexpected '") + c + "'", LineAt(p)};
        if (brackets.back() != c) {
          return Error{std::string("unexpected '") + c + "', expected '" + brackets.back() + "'", LineAt(p)};
        }
        brackets.pop_back();
      }
      Emit(Token::Kind::kOp, op, p);
      p += n;
      return std::nullopt;
    }
    return Error{std::string("unexpected char '") + c + "'", LineAt(p)};
  }

  std::optional<Error> Number(size_t& p) {
    size_t j = Digits(src_, p);
    bool is_float = false;
    if (j + 1 < src_.size() && src_[j] == '.' && IsDigit(src_[j + 1])) {
      j = Digits(src_, j + 1);
      is_float = true;
    }
    if (j < src_.size() && (src_[j] == 'e' || src_[j] == 'E')) {
      size_t k = j + 1;
      if (k < src_.size() && (src_[k] == '+' || src_[k] == '-')) ++k;
      if (k < src_.size() && IsDigit(src_[k])) {
        j = Digits(src_, k);
        is_float = true;
      }
    }
    std::string text;
    for (size_t k = p; k < j; ++k) {
      if (src_[k] != '_') text += src_[k];
    }
    if (!is_float && text.size() > 1 && text[0] == '0' && text.find_first_not_of('0') != std::string::npos) {
      return Error{"binary, octal and hex literals and leading zeros are not served (" + text + ")", LineAt(p)};
    }
    Emit(is_float ? Token::Kind::kFloat : Token::Kind::kInt, text, p);
    p = j;
    return std::nullopt;
  }

  std::optional<Error> String(size_t& p) {
    const char quote = src_[p];
    size_t j = p + 1;
    while (j < src_.size() && src_[j] != quote) j += src_[j] == '\\' ? 2 : 1;
    if (j >= src_.size()) return Error{"unexpected end of string", LineAt(p)};
    auto value = Unescape(src_.substr(p + 1, j - p - 1));
    if (!value) return Error{"a malformed escape in a string literal", LineAt(p)};
    Emit(Token::Kind::kString, *value, p);
    p = j + 1;
    return std::nullopt;
  }

  std::string src_;
  std::vector<Token> tokens_;
  size_t line_pos_ = 0;
  int line_ = 1;
};

}  // namespace

bool IsPySpace(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
         cp == 0x3000;
}

std::variant<std::vector<Token>, Error> Tokenize(const std::string& source) {
  std::string src;
  src.reserve(source.size());
  for (size_t i = 0; i < source.size();) {  // UTF-8 only, and newlines as "\n" (jinja2 reads text)
    int len = 0;
    Decode(source, i, &len);
    if (len < 0) {
      int line = 1;
      for (size_t k = 0; k < i; ++k) line += source[k] == '\n';
      return Error{"the template is not UTF-8 (byte " + std::to_string(i) + ")", line};
    }
    if (source[i] == '\r') {
      src += '\n';
      i += i + 1 < source.size() && source[i + 1] == '\n' ? 2 : 1;
      continue;
    }
    src.append(source, i, len);
    i += len;
  }
  if (!src.empty() && src.back() == '\n') src.pop_back();  // keep_trailing_newline off
  return Lexer(std::move(src)).Run();
}

}  // namespace ferry::gateway::jinja
