// The names LoRA adapters may be served under (--lora-modules NAME=PATH, LoadLoraAdapter): what an
// OpenAI `model` field carries, so no spaces, and no '#', which the scheduler's keys of run-time
// loads use ("<name>#<n>", scheduler/lora_table.h).
#pragma once

#include <string>

namespace ferry {

inline constexpr size_t kMaxLoraNameLength = 128;

// "" when `name` may name an adapter, else why not (naming the field, the value and the rule).
inline std::string LoraNameError(const std::string& name) {
  if (name.empty()) return "lora_name is empty";
  if (name.size() > kMaxLoraNameLength) {
    return "lora_name is " + std::to_string(name.size()) + " characters, above the limit " +
           std::to_string(kMaxLoraNameLength);
  }
  for (const char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
                    c == '_' || c == ':' || c == '/' || c == '-';
    if (!ok) return "lora_name = \"" + name + "\" may hold only letters, digits and . _ : / -";
  }
  return "";
}

}  // namespace ferry
