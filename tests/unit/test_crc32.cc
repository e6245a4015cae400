// CRC-32 must match zlib's (the zip polynomial) and combine must join
// pieces computed on different threads, for any split.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "test_util.h"
extern "C" {
#include "core/crc32.h"
#include "core/stream_copy.h"
}

TEST(Crc32, CheckValue) {
  EXPECT_EQ(ckptio_crc32(0, "123456789", 9), 0xCBF43926u);
  EXPECT_EQ(ckptio_crc32(0, "", 0), 0u);
}

TEST(Crc32, ChainingEqualsWhole) {
  auto d = ckptio_test::pattern(100003, 1);
  uint32_t whole = ckptio_crc32(0, d.data(), d.size());
  uint32_t part = ckptio_crc32(0, d.data(), 4097);
  EXPECT_EQ(ckptio_crc32(part, d.data() + 4097, d.size() - 4097), whole);
}

TEST(Crc32, CombineAnySplit) {
  auto d = ckptio_test::pattern(70001, 2);
  uint32_t whole = ckptio_crc32(0, d.data(), d.size());
  for (size_t cut : {0ul, 1ul, 7ul, 4096ul, 65536ul, 70000ul, 70001ul}) {
    uint32_t a = ckptio_crc32(0, d.data(), cut);
    uint32_t b = ckptio_crc32(0, d.data() + cut, d.size() - cut);
    EXPECT_EQ(ckptio_crc32_combine(a, b, d.size() - cut), whole) << "cut " << cut;
  }
}

TEST(Crc32, CombineHugeLengthOfZeros) {
  // crc of 5 GiB of zeros, built by doubling, equals combining with a zero
  // block of that length: exercises lengths past 32 bits.
  std::vector<uint8_t> z(1 << 20, 0);
  uint32_t c = ckptio_crc32(0, z.data(), z.size());
  uint64_t len = z.size();
  for (int i = 0; i < 12; i++) { c = ckptio_crc32_combine(c, c, len); len *= 2; }
  uint32_t mb = ckptio_crc32(0, z.data(), z.size());
  uint32_t c2 = mb;
  for (uint64_t l = z.size(); l < len; l += z.size()) c2 = ckptio_crc32_combine(c2, mb, z.size());
  EXPECT_EQ(c, c2);
}

// ckptio_copy_crc through streaming copies: every byte lands, none beyond
// the end is touched, and the CRC is the bytes', for sizes around the
// streaming threshold and the CRC step and destinations off any alignment
// (streaming stores want 16 bytes; the head and tail go through memcpy).
TEST(Crc32, CopyCrcLandsEveryByteAtAnyAlignment) {
  const size_t sizes[] = {0, 1, 63, CKPTIO_STREAM_COPY_MIN - 1, CKPTIO_STREAM_COPY_MIN, CKPTIO_STREAM_COPY_MIN + 17,
                          CKPTIO_CRC_STEP + 5, 3 * CKPTIO_CRC_STEP + 4099};
  auto src = ckptio_test::pattern(3 * CKPTIO_CRC_STEP + 4099 + 64, 3);
  for (size_t n : sizes) {
    for (size_t skew : {0ul, 1ul, 8ul, 15ul}) {
      std::vector<uint8_t> dst(n + 64, 0xA5);
      uint32_t crc = 0;
      ckptio_copy_crc(dst.data() + skew, src.data() + 3, n, &crc);
      EXPECT_EQ(crc, ckptio_crc32(0, src.data() + 3, n)) << n << " bytes, skew " << skew;
      EXPECT_EQ(memcmp(dst.data() + skew, src.data() + 3, n), 0) << n << " bytes, skew " << skew;
      for (size_t i = 0; i < skew; i++) ASSERT_EQ(dst[i], 0xA5) << "before the copy, skew " << skew;
      for (size_t i = skew + n; i < dst.size(); i++) ASSERT_EQ(dst[i], 0xA5) << "after the copy, n " << n;
    }
  }
}
