#include "core/status.h"

#include <gtest/gtest.h>

#include <memory>

namespace fathom {
namespace {

Status Fails() {
  return InvalidArgumentError("bad thing");
}
StatusOr<int> Half(int x) {
  if (x % 2) return InvalidArgumentError("odd");
  return x / 2;
}
Status UsesMacros(int x, int* out) {
  FATHOM_ASSIGN_OR_RETURN(int h, Half(x));
  FATHOM_ASSIGN_OR_RETURN(*out, Half(h));
  return OkStatus();
}
Status ReturnsIfError(bool fail) {
  FATHOM_RETURN_IF_ERROR(fail ? Fails() : OkStatus());
  return NotFoundError("reached the end");
}

TEST(StatusTest, OkAndError) {
  EXPECT_TRUE(OkStatus().ok());
  EXPECT_EQ(OkStatus().ToString(), "OK");
  Status s = Fails();
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.ToString(), "INVALID_ARGUMENT: bad thing");
  EXPECT_EQ(s.WithContext("loading x").message(), "loading x: bad thing");
  EXPECT_TRUE(OkStatus().WithContext("ctx").ok());
}

TEST(StatusTest, StatusOrMacros) {
  int out = 0;
  EXPECT_TRUE(UsesMacros(8, &out).ok());
  EXPECT_EQ(out, 2);
  Status s = UsesMacros(6, &out);  // 6 -> 3 -> odd
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ReturnsIfError(true).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ReturnsIfError(false).code(), StatusCode::kNotFound);
}

TEST(StatusTest, StatusOrHoldsMoveOnly) {
  StatusOr<std::unique_ptr<int>> p = std::make_unique<int>(7);
  ASSERT_TRUE(p.ok());
  std::unique_ptr<int> v = std::move(p).value();
  EXPECT_EQ(*v, 7);
}

TEST(StatusDeathTest, ValueOfErrorAborts) {
  StatusOr<int> e = InvalidArgumentError("nope");
  EXPECT_DEATH((void)e.value(), "StatusOr::value\\(\\) on an error.*nope");
}

TEST(StatusTest, CodeNames) {
  EXPECT_EQ(StatusCodeName(StatusCode::kResourceExhausted), "RESOURCE_EXHAUSTED");
  EXPECT_EQ(StatusCodeName(StatusCode::kDeadlineExceeded), "DEADLINE_EXCEEDED");
}

}  // namespace
}  // namespace fathom
