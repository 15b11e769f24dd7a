// A plain-chrono twin of tokenizer_bench with exactly the methodology of bench/tokenizer_hf.py (warm-up encode, then
// the median of 5 rounds; load = median of 5), for running next to the Python baseline on a machine without Google
// Benchmark (link it with -static to carry it there).
//
//   tokenizer_speed TOKENIZER_DIR bench/data [SECONDS_PER_TEXT=2]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace {

std::string Read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s TOKENIZER_DIR DATA_DIR [SECONDS_PER_TEXT]\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1], data = argv[2];
  const double min_time = argc > 3 ? std::atof(argv[3]) : 2.0;
  std::vector<double> loads;
  std::unique_ptr<fathom::Tokenizer> tok;
  for (int i = 0; i < 5; ++i) {
    const auto start = std::chrono::steady_clock::now();
    auto t = fathom::Tokenizer::FromDirectory(dir);
    loads.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
    if (!t.ok()) {
      std::fprintf(stderr, "%s\n", t.status().ToString().c_str());
      return 1;
    }
    tok = std::move(t).value();
  }
  std::printf("fathom load: %.1f ms (median of 5)\n", Median(loads));
  for (const char* name : {"english", "code", "chinese"}) {
    const std::string text = Read(data + "/" + name + ".txt");
    const size_t tokens = tok->Encode(text).size();
    std::vector<double> rates;
    for (int round = 0; round < 5; ++round) {
      int n = 0;
      double elapsed = 0;
      const auto start = std::chrono::steady_clock::now();
      while (elapsed < min_time / 5) {
        auto ids = tok->Encode(text);
        ++n;
        elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      }
      rates.push_back(static_cast<double>(text.size()) * n / elapsed / 1e6);
    }
    std::printf("fathom encode %-8s: %8.2f MB/s  (%zu bytes, %zu tokens)\n", name, Median(rates), text.size(), tokens);
  }
  return 0;
}
