// KernelOptions::FromEnvironment and MLA's provider's MlaKernelOptions::FromEnvironment: the FATHOM_CUDA_* variables'
// defaults and values (the tables atop backend/cuda/kernel_options.h and attention_mla.h), and programmatic launch as
// each stream's own setting. No GPU needed.
#include "backend/cuda/kernel_options.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "backend/cuda/attention_mla.h"
#include "backend/cuda/launcher.h"

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

KernelOptions Read() {
  StatusOr<KernelOptions> o = KernelOptions::FromEnvironment();
  EXPECT_TRUE(o.ok()) << o.status().ToString();
  return o.ok() ? *o : KernelOptions();
}

MlaKernelOptions ReadMla() {
  StatusOr<MlaKernelOptions> o = MlaKernelOptions::FromEnvironment();
  EXPECT_TRUE(o.ok()) << o.status().ToString();
  return o.ok() ? *o : MlaKernelOptions();
}

TEST(KernelOptionsTest, MeasuredDefaultsAreOnAndOptInsOff) {
  ScopedEnv env;
  for (const char* name : {"FATHOM_CUDA_MLA_WIDE", "FATHOM_CUDA_MLA_FP8", "FATHOM_CUDA_MLA_PIPELINE",
                           "FATHOM_CUDA_FUSED_SILU", "FATHOM_CUDA_PREFILL_MMA_ATTENTION", "FATHOM_CUDA_NO_PDL"}) {
    env.Set(name, nullptr);
  }
  const KernelOptions o = Read();
  const MlaKernelOptions m = ReadMla();
  EXPECT_TRUE(m.decode.wide);
  EXPECT_EQ(m.decode.wide_min_keys, 256);
  EXPECT_TRUE(o.fused_silu_staging);
  EXPECT_TRUE(o.prefill_mma_attention);
  EXPECT_TRUE(m.decode.fp8);
  EXPECT_FALSE(m.decode.pipeline);
  EXPECT_TRUE(m.decode_kernel);
  EXPECT_TRUE(m.context_mma);
  EXPECT_TRUE(o.pdl);
}

// Every switch reads 1/true/on/yes and 0/false/off/no alike, in any case: FATHOM_CUDA_FUSED_SILU=true used to turn
// the feature off, and FATHOM_CUDA_NO_PDL=0 turned PDL off too.
TEST(KernelOptionsTest, EverySwitchTakesTheSameWords) {
  for (const char* on : {"1", "true", "on", "yes", "TRUE", " On "}) {
    ScopedEnv env;
    env.Set("FATHOM_CUDA_MLA_PIPELINE", on);
    env.Set("FATHOM_CUDA_FUSED_SILU", on);
    env.Set("FATHOM_CUDA_NO_PDL", on);
    const KernelOptions o = Read();
    EXPECT_TRUE(ReadMla().decode.pipeline) << on;
    EXPECT_TRUE(o.fused_silu_staging) << on;
    EXPECT_FALSE(o.pdl) << "FATHOM_CUDA_NO_PDL=" << on;
  }
  for (const char* off : {"0", "false", "off", "no", "False"}) {
    ScopedEnv env;
    env.Set("FATHOM_CUDA_MLA_WIDE", off);
    env.Set("FATHOM_CUDA_MLA_FP8", off);
    env.Set("FATHOM_CUDA_NO_PDL", off);
    const KernelOptions o = Read();
    const MlaKernelOptions m = ReadMla();
    EXPECT_FALSE(m.decode.wide) << off;
    EXPECT_FALSE(m.decode.fp8) << off;
    EXPECT_TRUE(o.pdl) << "FATHOM_CUDA_NO_PDL=" << off;
  }
  ScopedEnv empty;
  empty.Set("FATHOM_CUDA_MLA_WIDE", "");  // set to nothing: the default
  EXPECT_TRUE(ReadMla().decode.wide);
  ScopedEnv no_kernel;
  no_kernel.Set("FATHOM_CUDA_NO_MLA_ATTENTION", "1");  // a NO_ switch set true turns its feature off
  EXPECT_FALSE(ReadMla().decode_kernel);
}

TEST(KernelOptionsTest, AnythingElseIsRefusedByName) {
  {
    ScopedEnv env;
    env.Set("FATHOM_CUDA_MLA_WIDE", "yes please");
    StatusOr<MlaKernelOptions> m = MlaKernelOptions::FromEnvironment();
    ASSERT_FALSE(m.ok());
    EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(m.status().message().find("FATHOM_CUDA_MLA_WIDE"), std::string::npos) << m.status().message();
  }
  for (const auto& [name, value] : std::vector<std::pair<const char*, const char*>>{
           {"FATHOM_CUDA_GEMM_TUNE", "yes please"},
           {"FATHOM_CUDA_PROFILE", "2"},
           {"FATHOM_CUDA_NO_PDL", "enable"},
           {"FATHOM_CUDA_MOE_MMA_TOKENS", "8k"},
           {"FATHOM_CUDA_INT4_GEMM_TOKENS", "99999999999999999999"},
       }) {
    ScopedEnv env;
    env.Set(name, value);
    StatusOr<KernelOptions> o = KernelOptions::FromEnvironment();
    ASSERT_FALSE(o.ok()) << name << "=" << value;
    EXPECT_EQ(o.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(o.status().message().find(name), std::string::npos) << o.status().message();
  }
  ScopedEnv env;
  env.Set("FATHOM_CUDA_MOE_MMA_TOKENS", " 16 ");
  EXPECT_EQ(Read().moe_mma_tokens, 16);
}

// Two backends' streams (handles only: nothing is launched): turning programmatic launch off for one leaves the other's
// on, and a stream forgotten (its backend destroyed) is on again, as is any stream no backend set.
TEST(ProgrammaticLaunchTest, IsEachStreamsOwn) {
  int a_storage = 0, b_storage = 0;
  const Stream a = &a_storage, b = &b_storage;
  EXPECT_TRUE(ProgrammaticLaunch(a));
  SetProgrammaticLaunch(a, false);
  EXPECT_FALSE(ProgrammaticLaunch(a));
  EXPECT_TRUE(ProgrammaticLaunch(b));
  SetProgrammaticLaunch(b, false);
  SetProgrammaticLaunch(a, true);
  EXPECT_TRUE(ProgrammaticLaunch(a));
  EXPECT_FALSE(ProgrammaticLaunch(b));
  ForgetProgrammaticLaunch(b);
  EXPECT_TRUE(ProgrammaticLaunch(b));
  // Slots are reused: many backends made and destroyed in turn never fill the table.
  for (int i = 0; i < 1000; ++i) {
    SetProgrammaticLaunch(a, false);
    ForgetProgrammaticLaunch(a);
  }
  EXPECT_TRUE(ProgrammaticLaunch(a));
}

}  // namespace
}  // namespace fathom::cuda
