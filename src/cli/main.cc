// `fathom`: one executable, one subcommand per task (run, logits, inspect, tokenize, render-chat, ...).
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <new>
#include <string>
#include <string_view>
#include <vector>

#include "cli/bench_command.h"
#include "cli/model_commands.h"
#include "cli/run_command.h"
#include "cli/serve_command.h"
#include "cli/tokenizer_commands.h"
#include "core/logging.h"

namespace fathom {

// A command line that does not parse: one line that says what is wrong, in the order it was typed, the help to
// read, and exit status 2 (the convention for usage errors; CLI11's own codes are 100-and-up).
int UsageError(const CLI::App& app, const CLI::ParseError& e, int argc, char** argv) {
  std::string command = "fathom";
  const CLI::App* where = &app;
  for (const CLI::App* sub : app.get_subcommands()) {
    command += " " + sub->get_name();
    where = sub;
  }
  std::string message = e.what();
  if (app.get_subcommands().empty()) {
    // The first word that is not an option names the command: say which one is unknown, and which exist.
    for (int i = 1; i < argc; ++i) {
      const std::string_view arg = argv[i];
      if (arg.empty() || arg[0] == '-') continue;
      std::string known;
      for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
        known += (known.empty() ? "" : ", ") + sub->get_name();
      }
      message = fmt::format("unknown command '{}' (commands: {})", arg, known);
      break;
    }
  } else if (dynamic_cast<const CLI::ExtrasError*>(&e) != nullptr) {
    std::vector<std::string> extras = where->remaining();
    std::string list;
    for (const std::string& x : extras) list += (list.empty() ? "" : " ") + x;
    message = !extras.empty() && extras[0].starts_with("-") ? fmt::format("unknown option '{}'", extras[0])
                                                            : fmt::format("unexpected arguments: {}", list);
  }
  std::fprintf(stderr, "error: %s\nRun '%s --help' for the options.\n", message.c_str(), command.c_str());
  return 2;
}

}  // namespace fathom

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
  // vLLM's -tp (CLI11 takes one letter after a single dash): the same as --tensor-parallel-size.
  std::vector<std::string> args(argv, argv + argc);
  std::vector<char*> arg_ptrs;
  for (std::string& a : args) {
    if (a == "-tp") a = "--tensor-parallel-size";
    arg_ptrs.push_back(a.data());
  }
  argv = arg_ptrs.data();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);                                       // --help, --version
    if (dynamic_cast<const CLI::RuntimeError*>(&e) != nullptr) return e.get_exit_code();  // ExitOnError: said
    return fathom::UsageError(app, e, argc, argv);
  } catch (const std::bad_alloc&) {  // a size no check foresaw: an error, never an abort
    std::fprintf(stderr, "error: RESOURCE_EXHAUSTED: out of host memory\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: INTERNAL: %s\n", e.what());
    return 1;
  }
  return 0;
}
