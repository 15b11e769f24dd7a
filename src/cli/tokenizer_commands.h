// The tokenizer subcommands of `fathom`: tokenize, detokenize, render-chat.
//
//   CLI::App app;
//   AddTokenizerCommands(app);   // registers the subcommands and their callbacks (output on stdout)
//
//   fathom tokenize --tokenizer DIR (--text S | --input-jsonl FILE) [--add-special-tokens]
//       one JSON array of ids per input (each line of FILE is a JSON string)
//   fathom detokenize --tokenizer DIR (--ids 1,2,3 | --input-jsonl FILE) [--skip-special-tokens]
//       one JSON string per input (each line of FILE is a JSON array of ids)
//   fathom render-chat --tokenizer DIR --input FILE.json [--template NAME]
//       FILE.json: {"messages": [...], "add_generation_prompt": bool, "tools": [...]?, "chat_template_kwargs": {}?}
//       prints {"rendered": "...", "ids": [...]}, or {"error": "..."} and exits 1 when the template fails
#pragma once

#include <CLI/CLI.hpp>
#include <ostream>

namespace fathom {

void AddTokenizerCommands(CLI::App& app);
// Same, writing results to `out` (for tests).
void AddTokenizerCommands(CLI::App& app, std::ostream& out);

}  // namespace fathom
