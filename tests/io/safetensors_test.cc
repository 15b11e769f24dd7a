#include "io/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "testing/golden.h"
#include "testing/temp_dir.h"

namespace fathom {
namespace {

namespace fs = std::filesystem;

std::vector<uint8_t> Bytes(std::initializer_list<float> v) {
  std::vector<uint8_t> out(v.size() * 4);
  std::memcpy(out.data(), std::data(v), out.size());
  return out;
}

void WriteRaw(const std::string& path, const std::string& header, size_t data_bytes) {
  std::ofstream out(path, std::ios::binary);
  uint64_t n = header.size();
  out.write(reinterpret_cast<const char*>(&n), 8);
  out << header;
  out << std::string(data_bytes, '\0');
}

TEST(SafetensorsTest, RoundTripSingleFile) {
  testing::TempDir d("fathom_st");
  auto a = Bytes({1, 2, 3, 4, 5, 6});
  std::vector<uint8_t> b = {1, 2, 3};
  ASSERT_TRUE(WriteSafetensors(d.file("model.safetensors"), {{"a", DType::kF32, {2, 3}, a}, {"b", DType::kU8, {3}, b}},
                               {{"format", "pt"}})
                  .ok());
  auto ck = Checkpoint::Open(d.path());
  ASSERT_TRUE(ck.ok()) << ck.status().ToString();
  EXPECT_EQ((*ck)->size(), 2u);
  auto av = (*ck)->Get("a", DType::kF32, std::vector<int64_t>{2, 3});
  ASSERT_TRUE(av.ok());
  EXPECT_EQ(av->data<float>()[5], 6.0f);
  auto bv = (*ck)->Get("b");
  ASSERT_TRUE(bv.ok());
  EXPECT_EQ(bv->data<uint8_t>()[2], 3);
  auto file = SafetensorsFile::Open(d.file("model.safetensors"));
  ASSERT_TRUE(file.ok());
  EXPECT_EQ((*file)->metadata().at("format"), "pt");
}

// The format promises no alignment: an odd header length and a 3-byte tensor first leave every later tensor off
// its element size (found by the model_files fuzz target: UBSan's misaligned uint16_t load in ConvertToF32).
TEST(SafetensorsTest, MisalignedTensorsAreReadThroughAlignedCopies) {
  testing::TempDir d("fathom_st");
  const std::string header =
      R"({"u":{"dtype":"U8","shape":[3],"data_offsets":[0,3]},)"
      R"("h":{"dtype":"BF16","shape":[2],"data_offsets":[3,7]},"f":{"dtype":"F32","shape":[2],"data_offsets":[7,15]}})";
  ASSERT_EQ((8 + header.size()) % 2, 1u) << "the test needs an odd data start";
  std::vector<uint8_t> data = {9, 8, 7};
  for (uint16_t b : {F32ToBf16(1.5f), F32ToBf16(-2.0f)}) {
    data.push_back(static_cast<uint8_t>(b & 0xff));
    data.push_back(static_cast<uint8_t>(b >> 8));
  }
  for (float f : {3.25f, -4.5f}) {
    uint8_t b[4];
    std::memcpy(b, &f, 4);
    data.insert(data.end(), b, b + 4);
  }
  {
    std::ofstream out(d.file("model.safetensors"), std::ios::binary);
    const uint64_t n = header.size();
    out.write(reinterpret_cast<const char*>(&n), 8);
    out << header;
    out.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
  }
  auto ck = Checkpoint::Open(d.path());
  ASSERT_TRUE(ck.ok()) << ck.status().ToString();
  auto h = (*ck)->Get("h", DType::kBF16, std::vector<int64_t>{2});
  auto f = (*ck)->Get("f", DType::kF32, std::vector<int64_t>{2});
  auto u = (*ck)->Get("u", DType::kU8, std::vector<int64_t>{3});
  ASSERT_TRUE(h.ok() && f.ok() && u.ok());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(h->data<uint16_t>()) % 2, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(f->data<float>()) % 4, 0u);
  float hv[2];
  ConvertToF32(h->data<uint16_t>(), DType::kBF16, 0, 2, hv);
  EXPECT_EQ(hv[0], 1.5f);
  EXPECT_EQ(hv[1], -2.0f);
  EXPECT_EQ(f->data<float>()[0], 3.25f);
  EXPECT_EQ(f->data<float>()[1], -4.5f);
  EXPECT_EQ(u->data<uint8_t>()[2], 7);
}

TEST(SafetensorsTest, WrongDtypeShapeAndMissingNameTheTensorAndFile) {
  testing::TempDir d("fathom_st");
  auto a = Bytes({1, 2, 3, 4});
  ASSERT_TRUE(WriteSafetensors(d.file("model.safetensors"), {{"w", DType::kF32, {2, 2}, a}}).ok());
  auto ck = Checkpoint::Open(d.path());
  ASSERT_TRUE(ck.ok());
  Status s = (*ck)->Get("w", DType::kBF16).status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("'w'"), std::string::npos);
  EXPECT_NE(s.message().find("model.safetensors"), std::string::npos);
  EXPECT_NE(s.message().find("BF16"), std::string::npos);
  s = (*ck)->Get("w", std::nullopt, std::vector<int64_t>{4}).status();
  EXPECT_NE(s.message().find("shape [2, 2], expected [4]"), std::string::npos) << s.message();
  s = (*ck)->Get("missing.weight").status();
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_NE(s.message().find("'missing.weight'"), std::string::npos);
}

TEST(SafetensorsTest, ShardedIndex) {
  testing::TempDir d("fathom_st");
  auto a = Bytes({1, 2});
  auto b = Bytes({3});
  ASSERT_TRUE(WriteSafetensors(d.file("model-00001-of-00002.safetensors"), {{"x", DType::kF32, {2}, a}}).ok());
  ASSERT_TRUE(WriteSafetensors(d.file("model-00002-of-00002.safetensors"), {{"y", DType::kF32, {1}, b}}).ok());
  std::ofstream(d.file("model.safetensors.index.json"))
      << R"({"metadata": {}, "weight_map": {"x": "model-00001-of-00002.safetensors", "y": "model-00002-of-00002.safetensors"}})";
  auto ck = Checkpoint::Open(d.path());
  ASSERT_TRUE(ck.ok()) << ck.status().ToString();
  EXPECT_EQ((*ck)->Get("y")->data<float>()[0], 3.0f);
  EXPECT_NE((*ck)->FileOf("x").find("00001"), std::string::npos);
}

TEST(SafetensorsTest, ShardedIndexErrors) {
  testing::TempDir d("fathom_st");
  auto a = Bytes({1, 2});
  ASSERT_TRUE(WriteSafetensors(d.file("s1.safetensors"), {{"x", DType::kF32, {2}, a}}).ok());
  auto write_index = [&](const std::string& text) { std::ofstream(d.file("model.safetensors.index.json")) << text; };
  write_index(R"({"weight_map": {"x": "s1.safetensors", "z": "s1.safetensors"}})");
  Status s = Checkpoint::Open(d.path()).status();
  EXPECT_NE(s.message().find("'z'"), std::string::npos) << s.message();
  write_index(R"({"weight_map": {"x": "../etc/passwd"}})");
  EXPECT_NE(Checkpoint::Open(d.path()).status().message().find("invalid shard name"), std::string::npos);
  write_index(R"({"weight_map": {"x": "missing.safetensors"}})");
  s = Checkpoint::Open(d.path()).status();
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_NE(s.message().find("missing.safetensors"), std::string::npos);
  write_index("{not json");
  EXPECT_EQ(Checkpoint::Open(d.path()).status().code(), StatusCode::kDataLoss);
  write_index(R"({"weight_map": 3})");
  EXPECT_NE(Checkpoint::Open(d.path()).status().message().find("weight_map"), std::string::npos);
}

struct BadHeaderCase {
  const char* name;
  std::string header;
  size_t data_bytes;
  const char* expect;  // substring of the message
};

TEST(SafetensorsTest, CorruptHeadersGiveClearErrors) {
  const std::vector<BadHeaderCase> cases = {
      {"overlap",
       R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
       12, "overlap"},
      {"past_end", R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8, "run past"},
      {"size_mismatch", R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8, "need 12"},
      {"bad_dtype", R"({"a":{"dtype":"Q4","shape":[1],"data_offsets":[0,1]}})", 1, "unsupported safetensors dtype"},
      {"reversed", R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[4,0]}})", 4, "reversed"},
      {"negative_shape", R"({"a":{"dtype":"U8","shape":[-1],"data_offsets":[0,1]}})", 1, "non-negative"},
      {"not_object", R"([1,2,3])", 0, "not a JSON object"},
      {"not_json", R"({"a": )", 0, "not valid JSON"},
      {"missing_offsets", R"({"a":{"dtype":"U8","shape":[1]}})", 1, "data_offsets"},
      {"huge_shape", R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,4]}})", 4, "too large"},
      {"bad_metadata", R"({"__metadata__":{"k":3}})", 0, "__metadata__"},
  };
  testing::TempDir d("fathom_st");
  for (const auto& c : cases) {
    const std::string path = d.file(std::string(c.name) + ".safetensors");
    WriteRaw(path, c.header, c.data_bytes);
    auto f = SafetensorsFile::Open(path);
    ASSERT_FALSE(f.ok()) << c.name;
    EXPECT_NE(f.status().message().find(c.expect), std::string::npos) << c.name << ": " << f.status().message();
    EXPECT_NE(f.status().message().find(path), std::string::npos) << c.name << " should name the file";
  }
}

TEST(SafetensorsTest, TruncatedFileAndHugeHeaderLength) {
  testing::TempDir d("fathom_st");
  std::ofstream(d.file("tiny.safetensors")) << "abc";
  EXPECT_NE(SafetensorsFile::Open(d.file("tiny.safetensors")).status().message().find("too short"), std::string::npos);
  {
    std::ofstream out(d.file("big.safetensors"), std::ios::binary);
    uint64_t n = 1ull << 40;
    out.write(reinterpret_cast<const char*>(&n), 8);
    out << "{}";
  }
  EXPECT_NE(SafetensorsFile::Open(d.file("big.safetensors")).status().message().find("exceeds"), std::string::npos);
  {
    std::ofstream out(d.file("cut.safetensors"), std::ios::binary);
    uint64_t n = 100;
    out.write(reinterpret_cast<const char*>(&n), 8);
    out << "{}";
  }
  EXPECT_NE(SafetensorsFile::Open(d.file("cut.safetensors")).status().message().find("truncated"), std::string::npos);
  EXPECT_EQ(SafetensorsFile::Open(d.file("absent.safetensors")).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(Checkpoint::Open(d.file("no_such_dir")).status().code(), StatusCode::kNotFound);
}

TEST(SafetensorsTest, ReadsTheReferenceCheckpoint) {
  auto ck = Checkpoint::Open(testing::ModelDir("qwen2-distill-tiny"));
  ASSERT_TRUE(ck.ok()) << ck.status().ToString();
  auto w = (*ck)->Get("model.embed_tokens.weight", DType::kBF16, std::vector<int64_t>{512, 128});
  EXPECT_TRUE(w.ok()) << w.status().ToString();
}

}  // namespace
}  // namespace fathom
