// UTF-8 and JSON text primitives shared by the gateway's fronts.
#pragma once

#include <string>
#include <string_view>

namespace ferry {

// Strict UTF-8: no overlong forms, surrogates, or code points past U+10FFFF.
bool IsValidUtf8(std::string_view s);

// Appends `s` as a JSON string literal, quotes included, escaped byte for byte as
// nlohmann::json's dump() escapes it (ensure_ascii off: '"', '\\', \b \f \n \r \t by name,
// other bytes below 0x20 as \u00xx, everything else as is). `s` must be valid UTF-8.
void AppendJsonString(std::string& out, std::string_view s);

}  // namespace ferry
