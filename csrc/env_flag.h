// Boolean environment variables with vllm_metal/envs.py's values: 1/true/yes/on
// and 0/false/no/off (or empty), case ignored. Whitespace is dropped anywhere
// here; envs.py strips only the ends and refuses the rest at startup.
#pragma once

#include <cctype>
#include <cstdlib>
#include <optional>
#include <string>

namespace vllm_metal {

// A variable's raw value as a boolean; nullopt when it is null (unset) or not a
// recognised boolean (the caller decides: a default, or an error naming it).
inline std::optional<bool> parse_flag(const char* raw) {
  if (raw == nullptr) return std::nullopt;
  std::string v;
  for (const char* p = raw; *p; ++p) {
    if (!std::isspace(static_cast<unsigned char>(*p))) {
      v += static_cast<char>(std::tolower(static_cast<unsigned char>(*p)));
    }
  }
  if (v == "1" || v == "true" || v == "yes" || v == "on") return true;
  if (v.empty() || v == "0" || v == "false" || v == "no" || v == "off") return false;
  return std::nullopt;
}

inline std::optional<bool> env_flag(const char* name) {
  return parse_flag(std::getenv(name));
}

} // namespace vllm_metal
