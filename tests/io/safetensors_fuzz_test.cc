// A corpus of corrupted safetensors images: every truncation of a valid file, single-byte and multi-byte
// mutations of its header and length prefix, and random garbage. None may crash (the test runs under ASan+UBSan in
// CI); each must either parse, with every view inside the buffer, or return an error.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "io/safetensors.h"

namespace fathom {
namespace {

std::vector<uint8_t> ValidImage() {
  std::vector<float> a = {1, 2, 3, 4, 5, 6};
  std::vector<uint16_t> b = {7, 8, 9};
  std::vector<uint8_t> c = {1, 2};
  return SerializeSafetensors(
      {{"model.layers.0.a", DType::kF32, {2, 3}, {reinterpret_cast<uint8_t*>(a.data()), a.size() * 4}},
       {"b", DType::kBF16, {3}, {reinterpret_cast<uint8_t*>(b.data()), b.size() * 2}},
       {"c", DType::kF8E4M3, {1, 2}, c}},
      {{"format", "pt"}});
}

// Parses a copy of `bytes` (exactly sized, so ASan sees any overread) and checks the views.
void ParseMustNotCrash(const std::vector<uint8_t>& bytes) {
  std::unique_ptr<uint8_t[]> copy(new uint8_t[bytes.size() ? bytes.size() : 1]);
  if (!bytes.empty()) std::memcpy(copy.get(), bytes.data(), bytes.size());
  auto f = SafetensorsFile::FromBytes({copy.get(), bytes.size()}, "fuzz.safetensors");
  if (!f.ok()) {
    EXPECT_FALSE(f.status().message().empty());
    return;
  }
  for (const auto& [name, e] : (*f)->entries()) {
    TensorView v = (*f)->View(e);
    const uint8_t* p = static_cast<const uint8_t*>(v.raw());
    ASSERT_GE(p, copy.get());
    ASSERT_LE(p + v.nbytes(), copy.get() + bytes.size()) << name;
    volatile uint8_t sink = 0;
    for (size_t i = 0; i < v.nbytes(); ++i) sink = sink ^ p[i];  // touch every byte
  }
}

TEST(SafetensorsFuzzTest, ValidImageParses) {
  auto img = ValidImage();
  auto f = SafetensorsFile::FromBytes(img, "valid");
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ((*f)->entries().size(), 3u);
}

TEST(SafetensorsFuzzTest, EveryTruncation) {
  const auto img = ValidImage();
  for (size_t n = 0; n < img.size(); ++n) {
    std::vector<uint8_t> cut(img.begin(), img.begin() + static_cast<int64_t>(n));
    ParseMustNotCrash(cut);
    auto f = SafetensorsFile::FromBytes(cut, "cut");
    EXPECT_FALSE(f.ok()) << "truncation to " << n << " bytes parsed";
  }
}

TEST(SafetensorsFuzzTest, HeaderMutations) {
  const auto img = ValidImage();
  uint64_t header_len = 0;
  std::memcpy(&header_len, img.data(), 8);
  std::mt19937 rng(1234);
  const char interesting[] = {'0', '9', '-', '"', '[', ']', '{', '}', ',', ':', ' ', 'e', '.', '\0', '\xff'};
  for (int iter = 0; iter < 4000; ++iter) {
    auto m = img;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      const size_t pos = rng() % (8 + header_len);
      m[pos] = rng() % 2 ? static_cast<uint8_t>(interesting[rng() % sizeof(interesting)]) : static_cast<uint8_t>(rng());
    }
    ParseMustNotCrash(m);
  }
}

TEST(SafetensorsFuzzTest, LengthPrefixMutations) {
  const auto img = ValidImage();
  for (uint64_t len : {0ull, 1ull, 7ull, 8ull, 0xffffffffull, 0xffffffffffffffffull, (1ull << 63), 100ull << 20}) {
    auto m = img;
    std::memcpy(m.data(), &len, 8);
    ParseMustNotCrash(m);
  }
}

TEST(SafetensorsFuzzTest, RandomGarbage) {
  std::mt19937 rng(42);
  for (int iter = 0; iter < 500; ++iter) {
    std::vector<uint8_t> g(rng() % 300);
    for (auto& b : g) b = static_cast<uint8_t>(rng());
    if (g.size() >= 8) {
      const uint64_t len = g.size() - 8 - (g.size() > 8 ? rng() % (g.size() - 8) : 0);
      std::memcpy(g.data(), &len, 8);
    }
    ParseMustNotCrash(g);
  }
}

}  // namespace
}  // namespace fathom
