#include "model/registry.h"

#include <fmt/format.h>

namespace fathom {

const std::vector<Architecture>& Architectures() {
  // Explicit registration: static-initializer self-registration is dropped by the linker from static libraries.
  static const std::vector<Architecture> archs = [] {
    std::vector<Architecture> v;
    RegisterLlamaFamily(v);
    RegisterDeepseekFamily(v);
    RegisterDeepseekV4Family(v);
    return v;
  }();
  return archs;
}

StatusOr<const Architecture*> FindArchitecture(const std::string& name) {
  std::string names;
  for (const Architecture& a : Architectures()) {
    if (a.name == name) return &a;
    names += names.empty() ? a.name : ", " + a.name;
  }
  return UnimplementedError(fmt::format("architecture '{}' is not supported; supported: {}", name, names));
}

void RegisterFamily(std::vector<Architecture>& out, std::initializer_list<const char*> names,
                    const Architecture& family) {
  for (const char* name : names) {
    out.push_back(family);
    out.back().name = name;
  }
}

StatusOr<std::unique_ptr<Model>> LoadModel(const std::string& model_dir, const ModelConfig& cfg,
                                           const LoadOptions& options, Backend& backend, Communicator& comm) {
  FATHOM_ASSIGN_OR_RETURN(const Architecture* arch, FindArchitecture(cfg.architecture));
  FATHOM_ASSIGN_OR_RETURN(std::vector<WeightSpec> specs, arch->weight_specs(cfg, comm.parallel()));
  FATHOM_ASSIGN_OR_RETURN(std::unique_ptr<WeightStore> weights, LoadWeights(model_dir, specs, options, backend));
  FATHOM_ASSIGN_OR_RETURN(std::unique_ptr<Model> model, arch->create(cfg, std::move(weights), backend, comm));
  model->set_run_options(options.run);
  return model;
}

}  // namespace fathom
