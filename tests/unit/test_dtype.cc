// The dtype table and byte counts, including overflow and sub-byte rules.
#include <gtest/gtest.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

#include "ckptio.h"

TEST(Dtype, NamesRoundTrip) {
  for (int i = 0; i < CKPTIO_DTYPE_COUNT; i++) {
    ckptio_dtype d;
    ASSERT_EQ(ckptio_dtype_parse(ckptio_dtype_name((ckptio_dtype)i), &d), 0);
    EXPECT_EQ(d, i);
  }
  ckptio_dtype d;
  EXPECT_EQ(ckptio_dtype_parse("F128", &d), CKPTIO_E_DTYPE);
  EXPECT_EQ(ckptio_dtype_parse("bf16", &d), CKPTIO_E_DTYPE);
  EXPECT_EQ(ckptio_dtype_name((ckptio_dtype)CKPTIO_DTYPE_COUNT), nullptr);
}

TEST(Dtype, Bits) {
  EXPECT_EQ(ckptio_dtype_bits(CKPTIO_F4), 4);
  EXPECT_EQ(ckptio_dtype_bits(CKPTIO_F6_E2M3), 6);
  EXPECT_EQ(ckptio_dtype_bits(CKPTIO_BF16), 16);
  EXPECT_EQ(ckptio_dtype_bits(CKPTIO_C64), 64);
}

TEST(Dtype, Nbytes) {
  int64_t s[3] = {2, 3, 4};
  EXPECT_EQ(ckptio_tensor_nbytes(CKPTIO_F32, 3, s), 96);
  EXPECT_EQ(ckptio_tensor_nbytes(CKPTIO_F32, 0, nullptr), 4);  // scalar
  int64_t e[2] = {0, 7};
  EXPECT_EQ(ckptio_tensor_nbytes(CKPTIO_BF16, 2, e), 0);       // empty
  int64_t odd[1] = {3};
  EXPECT_EQ(ckptio_tensor_nbytes(CKPTIO_F4, 1, odd), CKPTIO_E_MISALIGNED);
  int64_t four[1] = {4};
  EXPECT_EQ(ckptio_tensor_nbytes(CKPTIO_F6_E3M2, 1, four), 3);
  int64_t big[2] = {INT64_MAX, 2};
  EXPECT_EQ(ckptio_tensor_nbytes(CKPTIO_U8, 2, big), CKPTIO_E_OVERFLOW);
  int64_t neg[1] = {-1};
  EXPECT_EQ(ckptio_tensor_nbytes(CKPTIO_U8, 1, neg), CKPTIO_E_SHAPE);
  EXPECT_EQ(ckptio_tensor_nbytes(CKPTIO_U8, 9, s), CKPTIO_E_SHAPE);
}

TEST(Errors, StrerrorNamesEveryCode) {
  for (int c = CKPTIO_E_INVALID_ARG; c >= CKPTIO_E_ERROR_MIN; c--)
    EXPECT_STRNE(ckptio_strerror(c), "unknown error") << c;
  EXPECT_STREQ(ckptio_strerror(-28), "No space left on device");
  EXPECT_STREQ(ckptio_strerror(0), "success");
}

// Issue 28: a negative errno code had no name (NULL), so logs and the
// Python exceptions could not say "ENOMEM".
TEST(Errors, ErrorNameNamesErrnoCodes) {
  EXPECT_STREQ(ckptio_error_name(CKPTIO_E_CHECKSUM), "CHECKSUM");
  EXPECT_STREQ(ckptio_error_name(CKPTIO_E_ERROR_MIN), "RANK");
  const char *n = ckptio_error_name(-ENOMEM);
  ASSERT_NE(n, nullptr);
  EXPECT_STREQ(n, "ENOMEM");
  EXPECT_STREQ(ckptio_error_name(-EIO), "EIO");
  EXPECT_STREQ(ckptio_error_name(-ENOSPC), "ENOSPC");
  // Nothing for success, for values that are no code, and below the
  // library's codes (the bindings read the table down to the first NULL).
  EXPECT_EQ(ckptio_error_name(0), nullptr);
  EXPECT_EQ(ckptio_error_name(5), nullptr);
  EXPECT_EQ(ckptio_error_name(-999), nullptr);
  EXPECT_EQ(ckptio_error_name(CKPTIO_E_ERROR_MIN - 1), nullptr);
  EXPECT_EQ(ckptio_error_name(-4095), nullptr);
  EXPECT_EQ(ckptio_error_name(INT32_MIN), nullptr);
  EXPECT_STREQ(ckptio_strerror(INT32_MIN), "unknown error");
}
