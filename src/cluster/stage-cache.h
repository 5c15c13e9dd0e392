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
#include <functional>
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

}  // namespace td::cluster
