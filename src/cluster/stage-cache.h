// The worker's cache dir, bounded: streamed or sliced stage files (<fingerprint>.gguf), their packed
// weights (packed/<key>.tdpack) and interrupted downloads (*.part).
//
// Before a new stage file is written, make_room() evicts the least recently used files (by access time, which
// touch() sets on every use, or the modification time where later, so the order survives a restart; touch()
// leaves the modification time alone, as it is part of the file's identity) until the cache with the new file
// stays within max_bytes and the file system keeps min_free_bytes free. When even evicting every file not in
// use could not make the room, nothing is evicted and the error names the sizes: the head reports it and no
// byte of the stage is written.
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "core/status.h"

namespace td::cluster {

struct StageCacheOptions {
    uint64_t max_bytes = 0;                       // 0: no cap but the disk's free space
    uint64_t min_free_bytes = uint64_t{1} << 30;  // left free on the cache's file system
    // Free bytes (for an unprivileged user) on the file system holding `dir`; statvfs unless replaced (tests).
    std::function<Result<uint64_t>(const std::string &dir)> free_space;
};

struct CacheFile {
    std::string path;
    uint64_t bytes = 0;
    int64_t last_use_ns = 0;  // the later of its access and modification times
};

class StageCache {
public:
    StageCache(std::string dir, StageCacheOptions options);

    const std::string &dir() const { return dir_; }
    // The files the cache holds, least recently used first.
    std::vector<CacheFile> files() const;
    uint64_t used_bytes() const;
    // Room for `bytes` of new files; `keep` (paths in use) is never evicted. Error: overloaded, naming the
    // file's size, the cap or the free space, and what evicting could give.
    Status make_room(uint64_t bytes, const std::set<std::string> &keep);
    // Marks `path` used now.
    static void touch(const std::string &path);

private:
    std::string dir_;
    StageCacheOptions opt_;
};

std::string fmt_gib(uint64_t bytes);  // "1.25 GiB"

struct FileCloser {
    void operator()(std::FILE *f) const { std::fclose(f); }
};
using OpenFile = std::unique_ptr<std::FILE, FileCloser>;

// `path` open for reading, made by `make` (which writes it whole, by a rename) when it is missing or `usable`
// refuses it (then it is removed first; null: any file is usable). A cache dir may be shared with other
// processes that evict from it (every head on a host streams from <temp>/tandem-stages): a file evicted
// between `make` and the open is made again, up to kMaxMakes times, and once open here it outlives any
// eviction.
inline constexpr int kMaxMakes = 4;
Result<OpenFile> open_or_make(const std::string &path, const std::function<bool(const std::string &)> &usable,
                              const std::function<Status()> &make);

}  // namespace td::cluster
