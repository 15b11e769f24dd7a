// KernelOptions::FromEnvironment: the FATHOM_CUDA_* variables' defaults and values (the table atop
// backend/cuda/kernel_options.h). No GPU needed.
#include "backend/cuda/kernel_options.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

namespace fathom::cuda {
namespace {

// Sets variables for one test and restores what was there before.
class ScopedEnv {
 public:
  ~ScopedEnv() {
    for (auto it = saved_.rbegin(); it != saved_.rend(); ++it) {
      if (it->had) {
        setenv(it->name.c_str(), it->value.c_str(), 1);
      } else {
        unsetenv(it->name.c_str());
      }
    }
  }
  void Set(const std::string& name, const char* value) {
    const char* old = std::getenv(name.c_str());
    saved_.push_back({name, old != nullptr, old != nullptr ? old : ""});
    if (value == nullptr) {
      unsetenv(name.c_str());
    } else {
      setenv(name.c_str(), value, 1);
    }
  }

 private:
  struct Saved {
    std::string name;
    bool had;
    std::string value;
  };
  std::vector<Saved> saved_;
};

TEST(KernelOptionsTest, MeasuredDefaultsAreOnAndOptInsOff) {
  ScopedEnv env;
  for (const char* name : {"FATHOM_CUDA_MLA_WIDE", "FATHOM_CUDA_MLA_FP8", "FATHOM_CUDA_MLA_PIPELINE",
                           "FATHOM_CUDA_FUSED_SILU", "FATHOM_CUDA_PREFILL_MMA_ATTENTION"}) {
    env.Set(name, nullptr);
  }
  const KernelOptions o = KernelOptions::FromEnvironment();
  EXPECT_TRUE(o.mla_wide);
  EXPECT_EQ(o.mla_wide_min_keys, 256);
  EXPECT_TRUE(o.fused_silu_staging);
  EXPECT_TRUE(o.prefill_mma_attention);
  EXPECT_TRUE(o.mla_fp8);
  EXPECT_FALSE(o.mla_pipeline);
}

TEST(KernelOptionsTest, AnyValueButOneTurnsTheWideMlaInstanceOff) {
  for (const char* value : {"0", "off", "", "yes"}) {
    ScopedEnv env;
    env.Set("FATHOM_CUDA_MLA_WIDE", value);
    EXPECT_FALSE(KernelOptions::FromEnvironment().mla_wide) << "FATHOM_CUDA_MLA_WIDE=" << value;
  }
  ScopedEnv env;
  env.Set("FATHOM_CUDA_MLA_WIDE", "1");
  EXPECT_TRUE(KernelOptions::FromEnvironment().mla_wide);
}

TEST(KernelOptionsTest, AnyValueButOneTurnsTheFp8MlaFormOff) {
  for (const char* value : {"0", "off", "", "yes"}) {
    ScopedEnv env;
    env.Set("FATHOM_CUDA_MLA_FP8", value);
    EXPECT_FALSE(KernelOptions::FromEnvironment().mla_fp8) << "FATHOM_CUDA_MLA_FP8=" << value;
  }
  ScopedEnv env;
  env.Set("FATHOM_CUDA_MLA_FP8", "1");
  EXPECT_TRUE(KernelOptions::FromEnvironment().mla_fp8);
}

TEST(KernelOptionsTest, OptInsTakeOnlyOne) {
  ScopedEnv env;
  env.Set("FATHOM_CUDA_MLA_PIPELINE", "true");  // not "1": stays off
  env.Set("FATHOM_CUDA_FUSED_SILU", "0");
  const KernelOptions o = KernelOptions::FromEnvironment();
  EXPECT_FALSE(o.mla_pipeline);
  EXPECT_FALSE(o.fused_silu_staging);
  ScopedEnv on;
  on.Set("FATHOM_CUDA_MLA_PIPELINE", "1");
  EXPECT_TRUE(KernelOptions::FromEnvironment().mla_pipeline);
}

}  // namespace
}  // namespace fathom::cuda
