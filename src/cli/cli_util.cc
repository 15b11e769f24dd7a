#include "cli/cli_util.h"

#include <fmt/format.h>

#include "backend/cpu/cpu_backend.h"
#ifdef FATHOM_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

#include <CLI/CLI.hpp>
#include <charconv>
#include <cstdio>

namespace fathom {

StatusOr<std::vector<int32_t>> ParseTokenList(const std::string& text) {
  std::vector<int32_t> out;
  size_t i = 0;
  while (i < text.size()) {
    size_t j = text.find(',', i);
    if (j == std::string::npos) j = text.size();
    std::string item = text.substr(i, j - i);
    while (!item.empty() && item.front() == ' ') item.erase(item.begin());
    while (!item.empty() && item.back() == ' ') item.pop_back();
    int32_t v = 0;
    auto [p, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
    if (item.empty() || ec != std::errc() || p != item.data() + item.size() || v < 0) {
      return InvalidArgumentError(
          fmt::format("bad token id '{}' in '{}' (expected comma-separated non-negative "
                      "integers)",
                      item, text));
    }
    out.push_back(v);
    i = j + 1;
  }
  if (out.empty()) return InvalidArgumentError("no token ids given");
  return out;
}

StatusOr<std::unique_ptr<Backend>> MakeBackend(const std::string& device) {
  if (device == "cpu") return std::unique_ptr<Backend>(std::make_unique<CpuBackend>());
  if (device == "cuda" || device.rfind("cuda:", 0) == 0) {
    int index = 0;
    if (device.size() > 5) {
      FATHOM_ASSIGN_OR_RETURN(std::vector<int32_t> parsed, ParseTokenList(device.substr(5)));
      index = parsed[0];
    }
#ifdef FATHOM_HAVE_CUDA
    FATHOM_ASSIGN_OR_RETURN(std::unique_ptr<CudaBackend> gpu, CudaBackend::Create(index));
    return std::unique_ptr<Backend>(std::move(gpu));
#else
    (void)index;
    return UnimplementedError("this fathom was built without CUDA (configure with the cuda-release preset)");
#endif
  }
  return InvalidArgumentError(fmt::format("unknown device '{}' (use cpu, cuda or cuda:N)", device));
}

std::string CudaProfileReport([[maybe_unused]] Backend& backend) {
#ifdef FATHOM_HAVE_CUDA
  if (auto* gpu = dynamic_cast<CudaBackend*>(&backend)) return gpu->ProfileReport();
#endif
  return "";
}

void CudaResetProfile([[maybe_unused]] Backend& backend) {
#ifdef FATHOM_HAVE_CUDA
  if (auto* gpu = dynamic_cast<CudaBackend*>(&backend)) gpu->ResetProfile();
#endif
}

void ExitOnError(const Status& status) {
  if (status.ok()) return;
  std::fprintf(stderr, "error: %s\n", status.ToString().c_str());
  throw CLI::RuntimeError(1);
}

}  // namespace fathom
