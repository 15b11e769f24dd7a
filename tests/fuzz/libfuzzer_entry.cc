// The libFuzzer entry point of one target, chosen at compile time (tests/fuzz/CMakeLists.txt builds this file once per
// target with -DFATHOM_FUZZ_TARGET=FuzzHttp, ...).
#include "fuzz_targets.h"

#ifndef FATHOM_FUZZ_TARGET
#error "FATHOM_FUZZ_TARGET must name a function of fuzz_targets.h"
#endif

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return fathom::fuzz::FATHOM_FUZZ_TARGET(data, size);
}
