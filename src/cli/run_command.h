// `fathom run`: generate from a prompt through the engine (scheduler, paged KV cache, sampler) and stream the text.
//
//   fathom run --model DIR --prompt "hello" --max-tokens 8                 # streams text (needs tokenizer.json)
//   fathom run --model DIR --tokens 1,2,3 --max-tokens 16 --ignore-eos     # prints the generated ids
//   fathom run --model cfg/config.json --load-format dummy --tokenizer TOKDIR --prompt "hi"
//
//   CLI::App app;
//   AddRunCommand(app);   // registers the subcommand and its callback
#pragma once

#include <CLI/CLI.hpp>

namespace fathom {

void AddRunCommand(CLI::App& app);

}  // namespace fathom
