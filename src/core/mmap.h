// Read-only memory map of a whole file. Weights stay mapped (never copied) for the process lifetime.
//
// Files of 2 MiB or more are mapped at a 2 MiB-aligned address, so that where the kernel holds the file in
// 2 MiB page-cache folios (Linux 6.x on ext4/xfs/btrfs) each 2 MiB of the file can be one huge mapping.
// Streaming weights from such pages is much faster than from 4 KiB pages: measured here, one core reads
// ~29 GB/s instead of ~18, because the TLB no longer misses every 4 KiB and the hardware prefetchers run
// on across what used to be page boundaries.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/status.h"

namespace td {

// What MappedFile::prefer_huge_pages found and did.
enum class HugePages {
    unavailable,  // no transparent huge pages here (disabled, old kernel or a filesystem without large
                  // folios)
    already,      // the range is in 2 MiB pages
    refreshed,    // the range was cached in 4 KiB pages and was dropped from the page cache, so that the next
                  // reads bring it back in 2 MiB pages
};
const char *huge_pages_name(HugePages h);

class MappedFile {
public:
    // Maps `path` read-only. Errors: not_found / io with the path and strerror in the message.
    // An empty file maps to size() == 0 and data() == nullptr.
    static Result<MappedFile> open(const std::string &path);

    MappedFile() = default;
    MappedFile(MappedFile &&other) noexcept;
    MappedFile &operator=(MappedFile &&other) noexcept;
    MappedFile(const MappedFile &) = delete;
    MappedFile &operator=(const MappedFile &) = delete;
    ~MappedFile();

    const uint8_t *data() const { return data_; }
    size_t size() const { return size_; }
    const std::string &path() const { return path_; }

    // For a range that is read whole, again and again (the weight matrices): asks for 2 MiB pages
    // (MADV_HUGEPAGE). The page cache only forms 2 MiB pages for data it reads in under that advice; when any
    // of 16 2 MiB samples spread over the range is cached in 4 KiB pages (the file was just written, copied,
    // read with read(), or partly evicted and read back) and a re-read of that sample does give a 2 MiB page,
    // the range is dropped from the page cache (after fdatasync; only clean pages that no process maps are
    // dropped, so this is safe while others use the file) and comes back from disk in 2 MiB pages on first
    // use. Costs at most one re-read of the range, once per write of the file. Ranges are rounded inwards to
    // 2 MiB.
    HugePages prefer_huge_pages(size_t offset, size_t len) const;
    // For a range read sparsely (an embedding table, a row per token): keeps it mapped in 4 KiB pages
    // (MADV_NOHUGEPAGE), so that touching one row does not map (and count in RSS) 2 MiB around it.
    void avoid_huge_pages(size_t offset, size_t len) const;
    // For a range read once (hashed): unmaps its pages from this process (MADV_DONTNEED; the page cache keeps
    // them, a later read maps them again), so they stop counting in RSS. The mapping stays valid.
    void drop_pages(size_t offset, size_t len) const;
    // Bytes of the mapping now mapped in 2 MiB pages (FilePmdMapped; 0 where unknown): what the advice got.
    size_t huge_page_bytes() const;

private:
    uint8_t *data_ = nullptr;
    size_t size_ = 0;
    std::string path_;
};

// Anonymous read-write memory at a 2 MiB-aligned address, advised into 2 MiB pages (MADV_HUGEPAGE) where
// transparent huge pages are on: for a buffer streamed whole again and again that must stream as fast as
// the weights MappedFile maps (the probes that time reads and matrix products). Zero-filled; pages are
// backed when first written.
class HugeBuffer {
public:
    // Errors: overloaded when the memory cannot be mapped. bytes == 0 gives an empty buffer.
    static Result<HugeBuffer> allocate(size_t bytes);

    HugeBuffer() = default;
    HugeBuffer(HugeBuffer &&other) noexcept;
    HugeBuffer &operator=(HugeBuffer &&other) noexcept;
    HugeBuffer(const HugeBuffer &) = delete;
    HugeBuffer &operator=(const HugeBuffer &) = delete;
    ~HugeBuffer();

    uint8_t *data() const { return data_; }
    size_t size() const { return size_; }
    // Bytes now backed by 2 MiB pages (AnonHugePages; 0 where unknown): what the advice got.
    size_t huge_page_bytes() const;

private:
    uint8_t *data_ = nullptr;
    size_t size_ = 0;
};

}  // namespace td
