// Helpers shared by the `fathom` subcommands.
//
//   FATHOM_ASSIGN_OR_RETURN(std::vector<int32_t> ids, ParseTokenList("1,2,3"));
//   cmd->callback([=] { ExitOnError(RunThing(...)); });   // prints "error: ..." and exits 1 on failure
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/backend.h"

namespace fathom {

StatusOr<std::vector<int32_t>> ParseTokenList(const std::string& text);

// On error: prints "error: <message>" to stderr and throws CLI::RuntimeError(1), which main() turns into exit 1.
void ExitOnError(const Status& status);

}  // namespace fathom
