// The command-line flags of every engine knob (engine/engine_builder.h's options), shared by `fathom run`, `fathom
// serve`, `fathom bench --offline` and `fathom logits`, the built-in demo model, and a worker process's loop.
//
//   EngineOptions o;
//   AddEngineOptions(cmd, o);                        // --model, --device, --max-num-seqs, ... in option groups
//   FATHOM_RETURN_IF_ERROR(UseDemoWithoutModel(o).status());
//   FATHOM_ASSIGN_OR_RETURN(LoadedModel m, LoadModelAndTokenizer(o, TokenizerLoad::kRequired));
//   if (m.worker) return RunParallelWorker(*m.worker);
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "core/status.h"
#include "engine/engine_builder.h"

namespace fathom {

// --tensor-parallel-size (-tp) and --enable-expert-parallel, in the "Parallel" group.
void AddParallelOptions(CLI::App* cmd, ParallelOptions& o);

// Registers the model and engine flags on `cmd` in two option groups ("Model" and "Engine"). `model_required`:
// whether --model must be given.
void AddEngineOptions(CLI::App* cmd, EngineOptions& o, bool model_required = true);

// The demo model's folder: $FATHOM_DEMO_DIR, or the one in the source tree this binary was built from.
std::string DemoDir();
// With no --model, points `o` at the built-in demo (random weights: --load-format dummy) and says so on stderr;
// returns true then. An error when the demo's files are missing.
StatusOr<bool> UseDemoWithoutModel(EngineOptions& o);

// A worker process of an mpirun launch (LoadedModel::worker): leaves SIGTERM and SIGINT to the first process, then
// runs the worker until the first process stops. The command returns its status and the process exits.
Status RunParallelWorker(ParallelWorker& worker);

}  // namespace fathom
