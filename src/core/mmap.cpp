#include "core/mmap.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <utility>

namespace td {
namespace {

constexpr size_t kHugePage = size_t{2} << 20;
constexpr size_t kSmallPage = 4096;
// 2 MiB samples prefer_huge_pages checks (fewer where the range has fewer 2 MiB pages).
constexpr size_t kHugePageSamples = 16;

uintptr_t align_down(uintptr_t p, size_t a) {
    return p & ~(static_cast<uintptr_t>(a) - 1);
}
uintptr_t align_up(uintptr_t p, size_t a) {
    return align_down(p + a - 1, a);
}

// Anonymous memory of `size` bytes (a multiple of 4 KiB) at a 2 MiB-aligned address: reserves 2 MiB more
// than asked, keeps the aligned part and gives back the rest. MAP_FAILED on failure.
void *reserve_aligned(size_t size, int prot) {
    void *area = ::mmap(nullptr, size + kHugePage, prot, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (area == MAP_FAILED) return MAP_FAILED;
    const auto a = reinterpret_cast<uintptr_t>(area);
    const uintptr_t al = align_up(a, kHugePage);
    const uintptr_t reserved_end = a + size + kHugePage;
    if (al > a) ::munmap(area, al - a);
    if (reserved_end > al + size) ::munmap(reinterpret_cast<void *>(al + size), reserved_end - (al + size));
    return reinterpret_cast<void *>(al);
}

// Maps fd whole at a 2 MiB-aligned address (the file mapping replaces an aligned reservation); MAP_FAILED
// on failure.
void *map_aligned(int fd, size_t size) {
    const size_t reserved = align_up(size, kSmallPage);
    void *area = reserve_aligned(reserved, PROT_NONE);
    if (area == MAP_FAILED) return MAP_FAILED;
    void *p = ::mmap(area, size, PROT_READ, MAP_SHARED | MAP_FIXED, fd, 0);
    if (p == MAP_FAILED) ::munmap(area, reserved);
    return p;
}

#if defined(__linux__)
#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif

bool thp_enabled() {
    std::ifstream in("/sys/kernel/mm/transparent_hugepage/enabled");
    std::string line;
    return std::getline(in, line) && line.find("[never]") == std::string::npos;
}

// Faults [p, p + len) in (MADV_POPULATE_READ, Linux 5.14; else a read per 4 KiB page).
void touch(const uint8_t *p, size_t len) {
    if (::madvise(const_cast<uint8_t *>(p), len, MADV_POPULATE_READ) == 0) return;
    volatile uint8_t sink = 0;
    for (size_t off = 0; off < len; off += kSmallPage) sink = sink + p[off];
}

// The kB figure `field` ("FilePmdMapped:", "AnonHugePages:") of the mapping that contains p in
// /proc/self/smaps; -1 when it cannot be read.
int64_t smaps_kb(const void *p, const char *field) {
    const size_t field_len = std::strlen(field);
    std::ifstream in("/proc/self/smaps");
    const auto addr = reinterpret_cast<uintptr_t>(p);
    std::string line;
    bool inside = false;
    while (std::getline(in, line)) {
        // A mapping's header: "start-end perms offset dev inode path", addresses in lower-case hex.
        const size_t dash = line.find('-');
        const size_t space = line.find(' ');
        if (dash != std::string::npos && dash < space && std::isxdigit(static_cast<unsigned char>(line[0])) &&
            !std::isupper(static_cast<unsigned char>(line[0]))) {
            const uintptr_t begin = std::strtoull(line.c_str(), nullptr, 16);
            const uintptr_t end = std::strtoull(line.c_str() + dash + 1, nullptr, 16);
            if (inside) return -1;  // passed our mapping without the field
            inside = addr >= begin && addr < end;
            continue;
        }
        if (inside && line.compare(0, field_len, field) == 0)
            return std::strtoll(line.c_str() + field_len, nullptr, 10);
    }
    return -1;
}

// kB of the mapping that contains p mapped as 2 MiB pages of a file; -1 when it cannot be read.
int64_t file_pmd_mapped_kb(const void *p) {
    return smaps_kb(p, "FilePmdMapped:");
}
#endif

}  // namespace

const char *huge_pages_name(HugePages h) {
    switch (h) {
        case HugePages::unavailable:
            return "unavailable";
        case HugePages::already:
            return "already";
        case HugePages::refreshed:
            return "refreshed";
    }
    return "?";
}

Result<MappedFile> MappedFile::open(const std::string &path) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int err = errno;
        return make_error(err == ENOENT ? ErrorKind::not_found : ErrorKind::io, "{}: cannot open: {}", path,
                          std::strerror(err));
    }
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
        int err = errno;
        ::close(fd);
        return make_error(ErrorKind::io, "{}: cannot stat: {}", path, std::strerror(err));
    }
    if (!S_ISREG(st.st_mode)) {
        ::close(fd);
        return make_error(ErrorKind::invalid_input, "{}: not a regular file", path);
    }
    MappedFile file;
    file.path_ = path;
    file.size_ = static_cast<size_t>(st.st_size);
    if (file.size_ > 0) {
        void *p = file.size_ >= kHugePage ? map_aligned(fd, file.size_) : MAP_FAILED;
        if (p == MAP_FAILED) p = ::mmap(nullptr, file.size_, PROT_READ, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED) {
            int err = errno;
            ::close(fd);
            return make_error(ErrorKind::io, "{}: cannot mmap {} bytes: {}", path, file.size_,
                              std::strerror(err));
        }
        file.data_ = static_cast<uint8_t *>(p);
    }
    ::close(fd);
    return file;
}

HugePages MappedFile::prefer_huge_pages(size_t offset, size_t len) const {
#if defined(__linux__)
    if (data_ == nullptr || offset >= size_) return HugePages::unavailable;
    len = std::min(len, size_ - offset);
    const auto base = reinterpret_cast<uintptr_t>(data_);
    const uintptr_t begin = align_up(base + offset, kHugePage),
                    end = align_down(base + offset + len, kHugePage);
    if (end <= begin || !thp_enabled()) return HugePages::unavailable;
    auto *range = reinterpret_cast<uint8_t *>(begin);
    auto *range_end = reinterpret_cast<uint8_t *>(end);
    if (::madvise(range, end - begin, MADV_HUGEPAGE) != 0) return HugePages::unavailable;
    // 2 MiB samples spread over the range tell how the page cache holds it. One is not enough: a file's cache
    // can be part 2 MiB and part 4 KiB pages (parts written, read with read() or evicted and read back at
    // other times; seen here: 480 of a 796 MiB pack file in 2 MiB pages, the rest streamed ~15% slower).
    // Each sample is checked by how much it adds to the mapping's FilePmdMapped, after this process's own
    // mapping of the range is dropped (MADV_DONTNEED: the page cache keeps the pages), so that a 2 MiB page
    // this process mapped in 4 KiB pieces before (under MADV_NOHUGEPAGE, say) maps whole again.
    ::madvise(range, end - begin, MADV_DONTNEED);
    const size_t n_pages = (end - begin) / kHugePage;
    const size_t n_samples = std::min(kHugePageSamples, n_pages);
    int64_t pmd_kb = file_pmd_mapped_kb(range);
    uint8_t *small = nullptr;  // the first sample held in 4 KiB pages
    for (size_t i = 0; i < n_samples && small == nullptr; ++i) {
        auto *sample = range + (n_pages * i / n_samples) * kHugePage;
        touch(sample, kHugePage);
        const int64_t now = file_pmd_mapped_kb(range);
        if (now < 0) return HugePages::unavailable;
        if (now - pmd_kb < static_cast<int64_t>(kHugePage >> 10)) small = sample;
        pmd_kb = now;
    }
    if (small == nullptr) return HugePages::already;

    // Would a re-read give 2 MiB pages? Try that sample first: a filesystem without large folios (or memory
    // too fragmented for them) then costs one 2 MiB re-read, not the whole range.
    const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return HugePages::unavailable;
    ::fdatasync(fd);  // dirty pages (a file just written) cannot be dropped
    const auto file_offset = [&](const uint8_t *p) { return static_cast<off_t>(p - data_); };
    // Unmap what the samples mapped, so their cache pages can go too.
    ::madvise(range, end - begin, MADV_DONTNEED);
    ::posix_fadvise(fd, file_offset(small), kHugePage, POSIX_FADV_DONTNEED);
    const int64_t before = file_pmd_mapped_kb(range);
    touch(small, kHugePage);
    if (file_pmd_mapped_kb(range) - before < static_cast<int64_t>(kHugePage >> 10)) {
        ::close(fd);
        return HugePages::unavailable;
    }
    // Only clean pages that no process maps are dropped; the rest of the range comes back in 2 MiB pages
    // on first use.
    ::posix_fadvise(fd, file_offset(range), small - range, POSIX_FADV_DONTNEED);
    ::posix_fadvise(fd, file_offset(small + kHugePage), range_end - (small + kHugePage), POSIX_FADV_DONTNEED);
    ::close(fd);
    return HugePages::refreshed;
#else
    (void)offset;
    (void)len;
    return HugePages::unavailable;
#endif
}

size_t MappedFile::huge_page_bytes() const {
#if defined(__linux__)
    if (data_ == nullptr) return 0;
    const int64_t kb = file_pmd_mapped_kb(data_);
    return kb > 0 ? static_cast<size_t>(kb) << 10 : 0;
#else
    return 0;
#endif
}

void MappedFile::drop_pages(size_t offset, size_t len) const {
    if (data_ == nullptr || offset >= size_) return;
    len = std::min(len, size_ - offset);
    const auto base = reinterpret_cast<uintptr_t>(data_);
    const uintptr_t begin = align_up(base + offset, kSmallPage), end = align_down(base + offset + len, kSmallPage);
    if (end > begin) ::madvise(reinterpret_cast<void *>(begin), end - begin, MADV_DONTNEED);
}

void MappedFile::avoid_huge_pages(size_t offset, size_t len) const {
#if defined(__linux__)
    if (data_ == nullptr || offset >= size_) return;
    len = std::min(len, size_ - offset);
    const auto base = reinterpret_cast<uintptr_t>(data_);
    const uintptr_t begin = align_down(base + offset, kSmallPage),
                    end = align_up(base + offset + len, kSmallPage);
    ::madvise(reinterpret_cast<void *>(begin), end - begin, MADV_NOHUGEPAGE);
#else
    (void)offset;
    (void)len;
#endif
}

MappedFile::MappedFile(MappedFile &&other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      path_(std::move(other.path_)) {}

MappedFile &MappedFile::operator=(MappedFile &&other) noexcept {
    if (this != &other) {
        if (data_ != nullptr) ::munmap(data_, size_);
        data_ = std::exchange(other.data_, nullptr);
        size_ = std::exchange(other.size_, 0);
        path_ = std::move(other.path_);
    }
    return *this;
}

MappedFile::~MappedFile() {
    if (data_ != nullptr) ::munmap(data_, size_);
}

Result<HugeBuffer> HugeBuffer::allocate(size_t bytes) {
    HugeBuffer b;
    if (bytes == 0) return b;
    const size_t size = align_up(bytes, kSmallPage);
    void *area = reserve_aligned(size, PROT_READ | PROT_WRITE);
    if (area == MAP_FAILED)
        return make_error(ErrorKind::overloaded, "cannot map {} MiB of memory: {}", size >> 20,
                          std::strerror(errno));
    b.data_ = static_cast<uint8_t *>(area);
    b.size_ = size;
#if defined(__linux__)
    if (size >= kHugePage) ::madvise(b.data_, align_down(size, kHugePage), MADV_HUGEPAGE);
#endif
    return b;
}

size_t HugeBuffer::huge_page_bytes() const {
#if defined(__linux__)
    if (data_ == nullptr) return 0;
    const int64_t kb = smaps_kb(data_, "AnonHugePages:");
    return kb > 0 ? static_cast<size_t>(kb) << 10 : 0;
#else
    return 0;
#endif
}

HugeBuffer::HugeBuffer(HugeBuffer &&other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

HugeBuffer &HugeBuffer::operator=(HugeBuffer &&other) noexcept {
    if (this != &other) {
        if (data_ != nullptr) ::munmap(data_, size_);
        data_ = std::exchange(other.data_, nullptr);
        size_ = std::exchange(other.size_, 0);
    }
    return *this;
}

HugeBuffer::~HugeBuffer() {
    if (data_ != nullptr) ::munmap(data_, size_);
}

}  // namespace td
