// The one way fathom reads its switches from the environment: every boolean variable takes 1/true/on/yes or
// 0/false/off/no (any case, surrounding spaces ignored), every number a decimal integer, and anything else is refused
// with a message that names the variable and what it takes. A variable of a few named values takes one of them (any
// case). Unset (or set to nothing) means "not given".
//
//   FATHOM_ASSIGN_OR_RETURN(std::optional<bool> profile, EnvSwitch("FATHOM_CUDA_PROFILE"));
//   if (profile) options.profile = *profile;
//   FATHOM_ASSIGN_OR_RETURN(std::optional<int64_t> n, EnvInteger("FATHOM_CUDA_MOE_MMA_TOKENS"));
//   FATHOM_ASSIGN_OR_RETURN(auto form, EnvChoice("FATHOM_MLA_PREFILL", {"auto", "up", "absorbed"}));
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string_view>

#include "core/status.h"

namespace fathom {

// `value` as a switch: true for 1/true/on/yes, false for 0/false/off/no; kInvalidArgument naming `name` otherwise.
StatusOr<bool> ParseSwitch(std::string_view name, std::string_view value);
// `value` as a decimal integer (an optional sign, digits, nothing else, within int64); kInvalidArgument otherwise.
StatusOr<int64_t> ParseInteger(std::string_view name, std::string_view value);

// `value` as one of `choices` (lower case; any case matches, surrounding spaces ignored): that choice;
// kInvalidArgument naming `name` and the choices otherwise.
StatusOr<std::string_view> ParseChoice(std::string_view name, std::string_view value,
                                       std::initializer_list<std::string_view> choices);

// The variable `name` read by ParseSwitch / ParseInteger / ParseChoice; nullopt when it is unset or empty.
StatusOr<std::optional<bool>> EnvSwitch(const char* name);
StatusOr<std::optional<int64_t>> EnvInteger(const char* name);
StatusOr<std::optional<std::string_view>> EnvChoice(const char* name, std::initializer_list<std::string_view> choices);

}  // namespace fathom
