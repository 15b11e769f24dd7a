// `fathom`: one executable, one subcommand per task (run, logits, inspect, tokenize, render-chat, ...).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <new>

#include "cli/bench_command.h"
#include "cli/model_commands.h"
#include "cli/run_command.h"
#include "cli/serve_command.h"
#include "cli/tokenizer_commands.h"
#include "core/logging.h"

int main(int argc, char** argv) {
  CLI::App app{"fathom: an inference server for DeepSeek-family models"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "fathom 0.1.0");
  std::string log_level = "info";
  app.add_option("--log-level", log_level, "debug | info | warn | error | off")->capture_default_str();
  app.parse_complete_callback([&] {
    auto level = fathom::ParseLogLevel(log_level);
    if (!level.ok()) throw CLI::ValidationError("--log-level", level.status().message());
    fathom::SetLogLevel(*level);
  });
  fathom::AddBenchCommand(app);
  fathom::AddModelCommands(app);
  fathom::AddRunCommand(app);
  fathom::AddServeCommand(app);
  fathom::AddTokenizerCommands(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::bad_alloc&) {  // a size no check foresaw: an error, never an abort
    std::fprintf(stderr, "error: RESOURCE_EXHAUSTED: out of host memory\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: INTERNAL: %s\n", e.what());
    return 1;
  }
  return 0;
}
