#include "core/bytes.h"

#include <gtest/gtest.h>

namespace fathom {
namespace {

TEST(BytesTest, FormatBytesInBinaryUnits) {
  EXPECT_EQ(FormatBytes(1536), "1.5 KiB");
  EXPECT_EQ(FormatBytes(int64_t{3} << 30), "3.00 GiB");
}

TEST(BytesTest, ParseBytesReadsSizesInPowersOf1024) {
  EXPECT_EQ(*ParseBytes("1073741824", "--x"), int64_t{1} << 30);
  EXPECT_EQ(*ParseBytes("512MiB", "--x"), int64_t{512} << 20);
  EXPECT_EQ(*ParseBytes("2G", "--x"), int64_t{2} << 30);
  EXPECT_EQ(*ParseBytes("256k", "--x"), int64_t{256} << 10);
  EXPECT_EQ(*ParseBytes("1.5gb", "--x"), int64_t{3} << 29);
}

TEST(BytesTest, ParseBytesRefusesByTheFlagsName) {
  for (const char* bad : {"", "abc", "12 parsecs", "0", "-5M", "nan", "1e30G", "inf"}) {
    const StatusOr<int64_t> r = ParseBytes(bad, "--kv-cache-memory");
    ASSERT_FALSE(r.ok()) << bad << " -> " << *r;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(r.status().message().find("--kv-cache-memory"), std::string::npos) << r.status().message();
  }
}

}  // namespace
}  // namespace fathom
