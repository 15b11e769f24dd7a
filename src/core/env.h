// The one way fathom reads its switches from the environment: every boolean variable takes 1/true/on/yes or
// 0/false/off/no (any case, surrounding spaces ignored), every number a decimal integer, and anything else is refused
// with a message that names the variable and what it takes. Unset (or set to nothing) means "not given".
//
//   FATHOM_ASSIGN_OR_RETURN(std::optional<bool> profile, EnvSwitch("FATHOM_CUDA_PROFILE"));
//   if (profile) options.profile = *profile;
//   FATHOM_ASSIGN_OR_RETURN(std::optional<int64_t> n, EnvInteger("FATHOM_CUDA_MOE_MMA_TOKENS"));
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "core/status.h"

namespace fathom {

// `value` as a switch: true for 1/true/on/yes, false for 0/false/off/no; kInvalidArgument naming `name` otherwise.
StatusOr<bool> ParseSwitch(std::string_view name, std::string_view value);
// `value` as a decimal integer (an optional sign, digits, nothing else, within int64); kInvalidArgument otherwise.
StatusOr<int64_t> ParseInteger(std::string_view name, std::string_view value);

// The variable `name` read by ParseSwitch / ParseInteger; nullopt when it is unset or empty.
StatusOr<std::optional<bool>> EnvSwitch(const char* name);
StatusOr<std::optional<int64_t>> EnvInteger(const char* name);

}  // namespace fathom
