// Error messages that name the field, the value and the limit, so a client can
// fix its request without reading our code.
#pragma once

#include <string>
#include <string_view>

#include <fmt/format.h>

#include <type_traits>

namespace ferry {

// "sampling.top_p = 1.5 is outside (0, 1]" style message.
template <typename V>
std::string FieldMessage(std::string_view field, const V& value, std::string_view constraint) {
  if constexpr (std::is_convertible_v<V, std::string_view>) {
    return fmt::format("{} = \"{}\" {}", field, std::string_view(value), constraint);
  } else {
    return fmt::format("{} = {} {}", field, value, constraint);
  }
}

}  // namespace ferry
