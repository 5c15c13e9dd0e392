#include <gtest/gtest.h>

#include <atomic>
#include <numeric>
#include <vector>

#include "core/mmap.h"
#include "core/status.h"
#include "core/thread-pool.h"
#include "tensor/dtype.h"
#include "tensor/fp16.h"

namespace td {

TEST(Status, ResultCarriesValueOrError) {
    Result<int> good = 5;
    ASSERT_TRUE(good.ok());
    EXPECT_EQ(*good, 5);
    Result<int> bad = invalid_input("bad {}", 7);
    ASSERT_FALSE(bad.ok());
    EXPECT_EQ(bad.status().message(), "bad 7");
    EXPECT_EQ(bad.status().kind(), ErrorKind::invalid_input);
    EXPECT_EQ(bad.status().with_context("f.gguf").message(), "f.gguf: bad 7");
}

TEST(ThreadPool, ParallelForCoversEveryIndexOnce) {
    for (int n_threads : {1, 2, 3, 8}) {
        ThreadPool pool(n_threads);
        for (int64_t n : {0, 1, 7, 1000, 100003}) {
            std::vector<std::atomic<int>> hits(n);
            for (int rep = 0; rep < 3; ++rep)
                pool.parallel_for(n, [&](int64_t b, int64_t e) {
                    for (int64_t i = b; i < e; ++i) hits[i].fetch_add(1);
                });
            for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 3) << "n_threads " << n_threads;
        }
    }
}

TEST(ThreadPool, RunGivesEachThreadItsIndex) {
    ThreadPool pool(4);
    std::vector<int> seen(4, 0);
    for (int rep = 0; rep < 1000; ++rep) pool.run([&](int ith, int nth) { seen[ith] += (nth == 4); });
    for (int v : seen) EXPECT_EQ(v, 1000);
}

TEST(MappedFile, MissingFileIsNotFound) {
    auto r = MappedFile::open("/nonexistent/dir/model.gguf");
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().kind(), ErrorKind::not_found);
    EXPECT_NE(r.status().message().find("/nonexistent/dir/model.gguf"), std::string::npos);
}

TEST(DType, TraitsAndNames) {
    EXPECT_EQ(dtype_row_bytes(DType::q4_0, 64), 36u);
    EXPECT_EQ(dtype_row_bytes(DType::q8_0, 32), 34u);
    EXPECT_EQ(dtype_row_bytes(DType::f16, 10), 20u);
    EXPECT_EQ(*dtype_from_name("Q5_1"), DType::q5_1);
    EXPECT_FALSE(dtype_from_name("q9_9").ok());
    EXPECT_FALSE(dtype_is_known(4));  // removed from ggml
    EXPECT_TRUE(dtype_is_known(30));
}

TEST(Fp16, RoundTripsEveryHalf) {
    for (uint32_t h = 0; h < 65536; ++h) {
        float f = fp16_to_fp32(static_cast<uint16_t>(h));
        if (f != f) continue;  // NaN
        EXPECT_EQ(fp32_to_fp16(f), h) << h;
    }
    EXPECT_EQ(fp32_to_fp16(1.0f), 0x3c00);
    EXPECT_EQ(fp32_to_fp16(65520.0f), 0x7c00);  // rounds to inf
    EXPECT_EQ(fp32_to_fp16(65519.0f), 0x7bff);
    EXPECT_EQ(fp32_to_fp16(1.0f + 1.0f / 2048), 0x3c00);  // tie to even
    EXPECT_EQ(fp32_to_fp16(1.0f + 3.0f / 2048), 0x3c02);
    EXPECT_EQ(fp32_to_bf16(1.0f), 0x3f80);
    EXPECT_EQ(bf16_to_fp32(0x3f80), 1.0f);
}

}  // namespace td
