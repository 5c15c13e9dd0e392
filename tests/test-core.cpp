#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <mutex>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "core/mmap.h"
#include "core/printable.h"
#include "core/status.h"
#include "core/thread-pool.h"
#include "tensor/dtype.h"
#include "tensor/fp16.h"
#include "test-util.h"

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

TEST(Printable, EscapesControlBytesAndCutsOnACharacterBoundary) {
    EXPECT_EQ(printable("a\nb\x7f"), "a\\x0ab\\x7f");
    EXPECT_EQ(printable("short", 5), "short");
    EXPECT_EQ(printable("longer", 5), "longe...");
    // "é" is two bytes: a cut that would split it leaves it out whole.
    EXPECT_EQ(printable("abcé", 4), "abc...");
    EXPECT_EQ(printable("abcé", 5), "abcé");
    EXPECT_EQ(printable("\xff\xff", 1), "\xff...");           // not UTF-8: cut where asked
    EXPECT_EQ(printable(std::string(100, 'x')).size(), 63u);  // 60 by default
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

TEST(ThreadPool, ParallelForChunksShrinkAndKeepMinChunk) {
    for (int n_threads : {2, 4}) {
        ThreadPool pool(n_threads);
        std::mutex mu;
        std::vector<std::pair<int64_t, int64_t>> chunks;
        const int64_t n = 10000, min_chunk = 16;
        pool.parallel_for(
            n,
            [&](int64_t b, int64_t e) {
                std::lock_guard<std::mutex> lock(mu);
                chunks.emplace_back(b, e);
            },
            min_chunk);
        std::sort(chunks.begin(), chunks.end());
        int64_t at = 0;
        for (auto [b, e] : chunks) {
            ASSERT_EQ(b, at);
            if (e != n) {
                EXPECT_GE(e - b, min_chunk);
            }
            at = e;
        }
        EXPECT_EQ(at, n);
        // Guided: the first chunk takes 1 / (2 * threads) of everything, the last ones are small.
        EXPECT_EQ(chunks.front().second, n / (2 * n_threads));
        EXPECT_LE(chunks.back().second - chunks.back().first, min_chunk);
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

// Page advice never changes what the mapping reads, whatever the kernel does with it (2 MiB pages are not
// available everywhere, so the outcome itself is not asserted).
TEST(MappedFile, HugePageAdviceKeepsTheBytes) {
    test::TempDir dir;
    const size_t size = (size_t{7} << 20) + 123;
    std::vector<uint8_t> bytes(size);
    for (size_t i = 0; i < size; ++i) bytes[i] = static_cast<uint8_t>((i * 2654435761u) >> 13);
    const std::string path = dir.file("weights.bin");
    std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char *>(bytes.data()), size);

    auto m = MappedFile::open(path);
    ASSERT_TRUE(m.ok()) << m.status().message();
    ASSERT_EQ(m->size(), size);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(m->data()) % (2 << 20), 0u)
        << "files of 2 MiB or more map 2 MiB-aligned";
    const HugePages h = m->prefer_huge_pages(0, size);
    EXPECT_TRUE(h == HugePages::unavailable || h == HugePages::already || h == HugePages::refreshed);
    m->avoid_huge_pages(size_t{1} << 20, size_t{3} << 20);
    EXPECT_TRUE(std::equal(bytes.begin(), bytes.end(), m->data()));
    // A second look finds the pages as the first left them, or the same outcome again where unavailable.
    const HugePages again = m->prefer_huge_pages(0, size);
    if (h != HugePages::unavailable) {
        EXPECT_EQ(again, HugePages::already);
    }
    EXPECT_TRUE(std::equal(bytes.begin(), bytes.end(), m->data()));

    // Ranges without a whole 2 MiB page, or outside the file, are left alone.
    EXPECT_EQ(m->prefer_huge_pages(size_t{1} << 20, size_t{1} << 20), HugePages::unavailable);
    EXPECT_EQ(m->prefer_huge_pages(size + 1, 100), HugePages::unavailable);
    m->avoid_huge_pages(size + 1, 100);

    const std::string small = dir.file("small.bin");
    std::ofstream(small, std::ios::binary).write(reinterpret_cast<const char *>(bytes.data()), 1000);
    auto s = MappedFile::open(small);
    ASSERT_TRUE(s.ok());
    EXPECT_EQ(s->prefer_huge_pages(0, 1000), HugePages::unavailable);
    EXPECT_TRUE(std::equal(bytes.begin(), bytes.begin() + 1000, s->data()));
}

// A file cached part in 2 MiB pages and part in 4 KiB pages: its middle read back under the advice, the rest
// as written. A sample from the middle alone would call it done; the spread samples find the 4 KiB parts and
// the whole range comes back in 2 MiB pages. Where the page cache gives no 2 MiB pages (the advice is
// unavailable), only the bytes are checked.
TEST(MappedFile, HugePageAdviceFindsACachePartlyIn4KiBPages) {
    test::TempDir dir;
    constexpr size_t kMiB = size_t{1} << 20;
    const size_t size = 32 * kMiB;
    std::vector<uint8_t> bytes(size);
    for (size_t i = 0; i < size; ++i) bytes[i] = static_cast<uint8_t>((i * 2654435761u) >> 11);
    const std::string path = dir.file("weights.bin");
    std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char *>(bytes.data()), size);
    const auto read_all = [](const MappedFile &m, size_t from, size_t n) {
        uint64_t sum = 0;
        for (size_t i = from; i < from + n; i += 4096) sum += m.data()[i];
        return sum;
    };

    HugePages middle = HugePages::unavailable;
    {
        auto m = MappedFile::open(path);
        ASSERT_TRUE(m.ok()) << m.status().message();
        middle = m->prefer_huge_pages(8 * kMiB, 16 * kMiB);
        read_all(*m, 8 * kMiB, 16 * kMiB);
        EXPECT_TRUE(std::equal(bytes.begin(), bytes.end(), m->data()));
    }
    auto m = MappedFile::open(path);
    ASSERT_TRUE(m.ok()) << m.status().message();
    const HugePages h = m->prefer_huge_pages(0, size);
    // As written, the file was in 4 KiB pages where the middle had to be refreshed; then so are its ends.
    if (middle == HugePages::refreshed) {
        EXPECT_EQ(h, HugePages::refreshed);
    }
    read_all(*m, 0, size);
    if (h != HugePages::unavailable) {
        // All of it, give or take a page the kernel could not make whole.
        EXPECT_GE(m->huge_page_bytes(), size - 4 * kMiB) << huge_pages_name(h);
    }
    EXPECT_TRUE(std::equal(bytes.begin(), bytes.end(), m->data()));
}

// Anonymous memory for buffers the probes stream: 2 MiB-aligned, zero-filled, writable, and where transparent
// huge pages are on (not "[never]"), backed by 2 MiB pages once written, as the engine's weights are.
TEST(HugeBuffer, IsAlignedWritableAndIn2MiBPagesWhereTheKernelHasThem) {
    constexpr size_t kMiB = size_t{1} << 20;
    auto b = HugeBuffer::allocate(16 * kMiB + 100);
    ASSERT_TRUE(b.ok()) << b.status().message();
    ASSERT_NE(b->data(), nullptr);
    EXPECT_GE(b->size(), 16 * kMiB + 100);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b->data()) % (2 * kMiB), 0u);
    EXPECT_TRUE(std::all_of(b->data(), b->data() + b->size(), [](uint8_t v) { return v == 0; }));
    std::memset(b->data(), 7, b->size());
    std::ifstream thp("/sys/kernel/mm/transparent_hugepage/enabled");
    std::string mode;
    std::getline(thp, mode);
    if (!mode.empty() && mode.find("[never]") == std::string::npos) {
        // All 8 whole 2 MiB pages, give or take what a fragmented machine could not make whole.
        EXPECT_GE(b->huge_page_bytes(), 8 * kMiB) << "THP: " << mode;
    }
    HugeBuffer moved = std::move(*b);
    EXPECT_EQ(b->data(), nullptr);
    EXPECT_EQ(moved.data()[16 * kMiB + 99], 7);
    auto empty = HugeBuffer::allocate(0);
    ASSERT_TRUE(empty.ok());
    EXPECT_EQ(empty->data(), nullptr);
    EXPECT_EQ(empty->huge_page_bytes(), 0u);
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
