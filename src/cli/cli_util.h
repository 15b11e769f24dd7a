// Helpers shared by the `fathom` subcommands.
//
//   FATHOM_ASSIGN_OR_RETURN(std::vector<int32_t> ids, ParseTokenList("1,2,3"));
//   cmd->callback([=] { ExitOnError(RunThing(...)); });   // prints "error: ..." and exits 1 on failure
//   FATHOM_ASSIGN_OR_RETURN(std::unique_ptr<Backend> be, MakeBackend("cuda:0"));
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/backend.h"

namespace fathom {

StatusOr<std::vector<int32_t>> ParseTokenList(const std::string& text);

// "cpu", "cuda" or "cuda:N" (CUDA only in builds with FATHOM_CUDA).
StatusOr<std::unique_ptr<Backend>> MakeBackend(const std::string& device);

// The per-op kernel times of a CUDA backend run with FATHOM_CUDA_PROFILE set; empty otherwise.
std::string CudaProfileReport(Backend& backend);
// Forgets the kernel times so far (FATHOM_CUDA_PROFILE), e.g. those of loading and warm-up.
void CudaResetProfile(Backend& backend);

// On error: prints "error: <message>" to stderr and throws CLI::RuntimeError(1), which main() turns into exit 1.
void ExitOnError(const Status& status);

}  // namespace fathom
