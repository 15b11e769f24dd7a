// Run-time choices of a loaded model that the CLI, benchmarks and tests set (Model::set_run_options).
//
//   LoadOptions o;
//   o.run.mla_prefill = MlaPrefill::kUpProjected;   // force MLA's up-projected prefill (tests)
//   model->set_run_options(o.run);                  // may change between steps
#pragma once

#include <cstdint>

namespace fathom {

// Which form MLA's attention takes on a step with prefill tokens (model/mla.h): by the shape rule, or forced.
enum class MlaPrefill { kAuto, kUpProjected, kAbsorbed };

struct ModelRunOptions {
  // The token count the memory plan reserves step activations for (engine/memory_plan.h; 0: no limit). A model whose
  // step scratch can grow with more than the step's tokens (MLA's up-projected prefill gathers every context row)
  // keeps it within this many rows.
  int64_t max_batched_tokens = 0;
  // FATHOM_MLA_PREFILL=up|absorbed in the CLI (cli/engine_setup.cc); tests set it directly.
  MlaPrefill mla_prefill = MlaPrefill::kAuto;
};

}  // namespace fathom
