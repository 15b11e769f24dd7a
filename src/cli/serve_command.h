// `fathom serve`: the OpenAI- and DeepSeek-compatible HTTP server.
//
//   fathom serve                                              # the built-in demo model (noise text, real tokenizer)
//   fathom serve --model /models/DeepSeek-R1-Distill-Qwen-7B --device cuda --port 8000
//   fathom serve --model cfg/config.json --load-format dummy --tokenizer TOKDIR     # capacity tests at real sizes
//
//   CLI::App app;
//   AddServeCommand(app);   // registers the subcommand and its callback
#pragma once

#include <CLI/CLI.hpp>

namespace fathom {

void AddServeCommand(CLI::App& app);

}  // namespace fathom
