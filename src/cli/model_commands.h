// The model subcommands of `fathom`: logits, run, inspect.
//
//   CLI::App app;
//   AddModelCommands(app);   // registers the subcommands and their callbacks
#pragma once

#include <CLI/CLI.hpp>

namespace fathom {

void AddModelCommands(CLI::App& app);

}  // namespace fathom
