// Run-time choices of a loaded model that the CLI, benchmarks and tests set (Model::set_run_options).
//
//   LoadOptions o;
//   o.run.prefill_form = PrefillForm::kExpanded;   // force MLA's up-projected prefill (tests)
//   model->set_run_options(o.run);                  // may change between steps
#pragma once

#include <cstdint>

namespace fathom {

// Which form a layout's attention takes on a step with prefill tokens, where it has two: by its own shape rule, or
// forced. Expanded: multi-head attention over keys and values up-projected from the cache rows (MLA's up-projected
// form); compact: attention straight over the cache rows (MLA's absorbed form). Layouts with one form ignore it.
enum class PrefillForm { kAuto, kExpanded, kCompact };

struct ModelRunOptions {
  // The token count the memory plan reserves step activations for (engine/memory_plan.h; 0: no limit). A model whose
  // step scratch can grow with more than the step's tokens (MLA's up-projected prefill gathers every context row)
  // keeps it within this many rows.
  int64_t max_batched_tokens = 0;
  // FATHOM_MLA_PREFILL=up|absorbed (engine/engine_builder.cc); tests set it directly.
  PrefillForm prefill_form = PrefillForm::kAuto;
};

}  // namespace fathom
