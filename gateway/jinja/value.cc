#include "gateway/jinja/value.h"

#include "common/utf8.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

namespace ferry::gateway::jinja {

const Value* Dict::Find(const std::string& key) const {
  for (const auto& [k, v] : items_) {
    if (k == key) return &v;
  }
  return nullptr;
}

void Dict::Set(const std::string& key, Value value) {
  for (auto& [k, v] : items_) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  items_.emplace_back(key, std::move(value));
}

Value Value::FromJson(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return None();
    case nlohmann::ordered_json::value_t::boolean: return Bool(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return Int(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const uint64_t u = j.get<uint64_t>();  // past int64: Python would keep it exact; a float is the nearest here
      return u > static_cast<uint64_t>(INT64_MAX) ? Float(static_cast<double>(u)) : Int(static_cast<int64_t>(u));
    }
    case nlohmann::ordered_json::value_t::number_float: return Float(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return String(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      List items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(FromJson(e));
      return MakeList(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      Dict d;
      for (const auto& [k, e] : j.items()) d.Set(k, FromJson(e));
      return MakeDict(std::move(d));
    }
    default: return None();  // binary / discarded: never produced by the JSON parser
  }
}

bool Value::Truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone: return false;
    case Kind::kBool:
    case Kind::kInt: return int_ != 0;
    case Kind::kFloat: return float_ != 0;
    case Kind::kString: return !str_->empty();
    case Kind::kList: return !list_->empty();
    case Kind::kDict: return dict_->size() > 0;
    case Kind::kNamespace:
    case Kind::kCallable: return true;
  }
  return false;
}

const char* Value::TypeName() const {
  switch (kind_) {
    case Kind::kUndefined: return "Undefined";
    case Kind::kNone: return "NoneType";
    case Kind::kBool: return "bool";
    case Kind::kInt: return "int";
    case Kind::kFloat: return "float";
    case Kind::kString: return "str";
    case Kind::kList: return tuple_ ? "tuple" : "list";
    case Kind::kDict: return "dict";
    case Kind::kNamespace: return "Namespace";
    case Kind::kCallable: return "function";
  }
  return "?";
}

bool Equal(const Value& a, const Value& b) {
  using K = Value::Kind;
  if (a.is_number() && b.is_number()) {
    if (a.kind() == K::kFloat || b.kind() == K::kFloat) return a.as_double() == b.as_double();
    return a.as_int() == b.as_int();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case K::kUndefined:
    case K::kNone: return true;
    case K::kString: return a.str() == b.str();
    case K::kList: {
      if (a.is_tuple() != b.is_tuple() || a.list().size() != b.list().size()) return false;
      for (size_t i = 0; i < a.list().size(); ++i) {
        if (!Equal(a.list()[i], b.list()[i])) return false;
      }
      return true;
    }
    case K::kDict: {
      if (a.dict().size() != b.dict().size()) return false;
      for (const auto& [k, v] : a.dict().items()) {
        const Value* other = b.dict().Find(k);
        if (other == nullptr || !Equal(v, *other)) return false;
      }
      return true;
    }
    case K::kNamespace: return &a.dict() == &b.dict();
    case K::kCallable: return &a.function() == &b.function();
    default: return false;
  }
}

bool Hashable(const Value& v) {
  if (v.is_dict()) return false;
  if (!v.is_list()) return true;
  return v.is_tuple() && std::all_of(v.list().begin(), v.list().end(), Hashable);
}

std::string FloatRepr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  char buf[64];
  // The shortest digits that read back as d, in scientific form: [-]D[.DDD]e[+-]XX.
  const auto res = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string s(buf, res.ptr);
  std::string sign;
  if (s[0] == '-') {
    sign = "-";
    s.erase(0, 1);
  }
  const size_t e = s.find('e');
  const int exponent = std::stoi(s.substr(e + 1));
  std::string digits = s.substr(0, e);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  // Python's repr: fixed notation for 1e-4 <= |d| < 1e16, else scientific.
  if (exponent >= -4 && exponent < 16) {
    std::string out;
    if (exponent < 0) {
      out = "0." + std::string(-exponent - 1, '0') + digits;
    } else if (static_cast<int>(digits.size()) <= exponent + 1) {
      out = digits + std::string(exponent + 1 - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, exponent + 1) + "." + digits.substr(exponent + 1);
    }
    return sign + out;
  }
  std::string mantissa = digits.size() == 1 ? digits : digits.substr(0, 1) + "." + digits.substr(1);
  char exp_buf[16];
  std::snprintf(exp_buf, sizeof exp_buf, "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
  return sign + mantissa + exp_buf;
}

namespace {

// The code point starting at s[i] (valid UTF-8: strings come from JSON or a checked template).
uint32_t DecodeAt(const std::string& s, size_t i, size_t* len) {
  const auto c = static_cast<unsigned char>(s[i]);
  int n = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
  if (i + n > s.size()) n = 1;
  uint32_t cp = n == 1 ? c : n == 2 ? c & 0x1F : n == 3 ? c & 0x0F : c & 0x07;
  for (int k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  *len = n;
  return cp;
}

std::string ReprString(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos;
  const char quote = has_single && s.find('"') == std::string::npos ? '"' : '\'';
  std::string out(1, quote);
  for (size_t i = 0; i < s.size();) {
    size_t len = 0;
    const uint32_t cp = DecodeAt(s, i, &len);
    if (cp == static_cast<uint32_t>(quote) || cp == '\\') {
      out += '\\';
      out += static_cast<char>(cp);
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp == '\t') {
      out += "\\t";
    } else if (cp < 0x20 || (cp >= 0x7F && cp <= 0xA0) || cp == 0xAD) {  // not printable (Latin-1 range)
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", cp);
      out += buf;
    } else {
      out.append(s, i, len);
    }
    i += len;
  }
  return out + quote;
}

// json.dumps' string: common/utf8's escapes (ensure_ascii=False), then with ensure_ascii every
// character outside ' '..'~' as \uXXXX (a surrogate pair past the BMP), as Python writes it.
void JsonString(const std::string& s, bool ensure_ascii, std::string& out) {
  if (!ensure_ascii) return AppendJsonString(out, s);
  std::string plain;
  AppendJsonString(plain, s);
  for (size_t i = 0; i < plain.size();) {
    size_t len = 0;
    const uint32_t cp = DecodeAt(plain, i, &len);
    i += len;
    if (cp < 0x7F) {
      out += static_cast<char>(cp);
      continue;
    }
    char buf[16];
    if (cp >= 0x10000) {
      const uint32_t v = cp - 0x10000;
      std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
    } else {
      std::snprintf(buf, sizeof buf, "\\u%04x", cp);
    }
    out += buf;
  }
}

void JsonValue(const Value& v, const JsonOptions& o, int depth, std::string& out) {
  using K = Value::Kind;
  const std::string item_sep = !o.item_separator.empty() ? o.item_separator : (o.indent >= 0 ? "," : ", ");
  const std::string key_sep = !o.key_separator.empty() ? o.key_separator : ": ";
  auto newline = [&](int level) {
    if (o.indent < 0) return;
    out += '\n';
    out.append(static_cast<size_t>(o.indent) * level, ' ');
  };
  switch (v.kind()) {
    case K::kNone: out += "null"; return;
    case K::kBool: out += v.as_bool() ? "true" : "false"; return;
    case K::kInt: out += std::to_string(v.as_int()); return;
    case K::kFloat: {
      const double d = v.as_double();
      out += std::isnan(d) ? "NaN" : std::isinf(d) ? (d < 0 ? "-Infinity" : "Infinity") : FloatRepr(d);
      return;
    }
    case K::kString: JsonString(v.str(), o.ensure_ascii, out); return;
    case K::kList: {
      if (v.list().empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t i = 0; i < v.list().size(); ++i) {
        if (i > 0) out += item_sep;
        newline(depth + 1);
        JsonValue(v.list()[i], o, depth + 1, out);
      }
      newline(depth);
      out += ']';
      return;
    }
    case K::kDict: {
      if (v.dict().size() == 0) {
        out += "{}";
        return;
      }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& item : v.dict().items()) items.push_back(&item);
      if (o.sort_keys) {
        std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
      }
      out += '{';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i > 0) out += item_sep;
        newline(depth + 1);
        JsonString(items[i]->first, o.ensure_ascii, out);
        out += key_sep;
        JsonValue(items[i]->second, o, depth + 1, out);
      }
      newline(depth);
      out += '}';
      return;
    }
    default:
      throw Error{std::string("Object of type ") + v.TypeName() + " is not JSON serializable"};
  }
}

}  // namespace

std::string ToStr(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined: return "";
    case Value::Kind::kString: return v.str();
    default: return Repr(v);
  }
}

std::string Repr(const Value& v) {
  using K = Value::Kind;
  switch (v.kind()) {
    case K::kUndefined: return "Undefined";
    case K::kNone: return "None";
    case K::kBool: return v.as_bool() ? "True" : "False";
    case K::kInt: return std::to_string(v.as_int());
    case K::kFloat: return FloatRepr(v.as_double());
    case K::kString: return ReprString(v.str());
    case K::kList: {
      std::string out = v.is_tuple() ? "(" : "[";
      for (size_t i = 0; i < v.list().size(); ++i) out += (i ? ", " : "") + Repr(v.list()[i]);
      if (v.is_tuple() && v.list().size() == 1) out += ",";
      return out + (v.is_tuple() ? ")" : "]");
    }
    case K::kDict:
    case K::kNamespace: {
      std::string out = v.kind() == K::kNamespace ? "<Namespace {" : "{";
      bool first = true;
      for (const auto& [k, e] : v.dict().items()) {
        out += (first ? "" : ", ") + ReprString(k) + ": " + Repr(e);
        first = false;
      }
      return out + (v.kind() == K::kNamespace ? "}>" : "}");
    }
    case K::kCallable: return "<function " + v.str() + ">";
  }
  return "";
}

std::string ToJson(const Value& v, const JsonOptions& options) {
  std::string out;
  JsonValue(v, options, 0, out);
  return out;
}

std::vector<std::string> CodePoints(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    size_t len = 0;
    DecodeAt(s, i, &len);
    out.push_back(s.substr(i, len));
    i += len;
  }
  return out;
}

size_t CodePointCount(const std::string& s) {
  size_t n = 0;
  for (const char c : s) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

}  // namespace ferry::gateway::jinja
