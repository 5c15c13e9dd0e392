#include "cluster/stage-cache.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/log.h"

namespace td::cluster {
namespace fs = std::filesystem;

namespace {

Result<uint64_t> statvfs_free(const std::string &dir) {
    struct statvfs v {};
    if (::statvfs(dir.c_str(), &v) != 0)
        return make_error(ErrorKind::io, "{}: cannot read the free space ({})", dir, std::strerror(errno));
    return uint64_t{v.f_bavail} * v.f_frsize;
}

int64_t timespec_ns(const timespec &t) {
    return int64_t{t.tv_sec} * 1000000000 + t.tv_nsec;
}

bool is_cache_file(const fs::path &p) {
    const std::string ext = p.extension().string();
    return ext == ".gguf" || ext == ".tdpack" || ext == ".part";
}

}  // namespace

std::string fmt_gib(uint64_t bytes) {
    return fmt::format("{:.2f} GiB", static_cast<double>(bytes) / (1u << 30));
}

StageCache::StageCache(std::string dir, StageCacheOptions options) : dir_(std::move(dir)), opt_(std::move(options)) {
    if (!opt_.free_space) opt_.free_space = statvfs_free;
}

std::vector<CacheFile> StageCache::files() const {
    std::vector<CacheFile> out;
    std::error_code ec;
    for (auto it = fs::recursive_directory_iterator(dir_, ec); !ec && it != fs::recursive_directory_iterator();
         it.increment(ec)) {
        if (it.depth() > 1) it.disable_recursion_pending();  // <dir>/*.gguf and <dir>/packed/*.tdpack
        std::error_code fe;
        if (!it->is_regular_file(fe) || !is_cache_file(it->path())) continue;
        struct stat st {};
        if (::stat(it->path().c_str(), &st) != 0) continue;
        // Last used: when touch() (or a read the kernel recorded) last set its access time, or when it was
        // written, whichever is later.
        out.push_back({it->path().string(), static_cast<uint64_t>(st.st_size),
                       std::max(timespec_ns(st.st_atim), timespec_ns(st.st_mtim))});
    }
    std::sort(out.begin(), out.end(), [](const CacheFile &a, const CacheFile &b) {
        return a.last_use_ns != b.last_use_ns ? a.last_use_ns < b.last_use_ns : a.path < b.path;
    });
    return out;
}

uint64_t StageCache::used_bytes() const {
    uint64_t n = 0;
    for (const CacheFile &f : files()) n += f.bytes;
    return n;
}

Status StageCache::make_room(uint64_t bytes, const std::set<std::string> &keep) {
    const std::vector<CacheFile> all = files();
    uint64_t used = 0, evictable = 0;
    for (const CacheFile &f : all) {
        used += f.bytes;
        if (!keep.count(f.path)) evictable += f.bytes;
    }
    TD_ASSIGN_OR_RETURN(const uint64_t free_now, opt_.free_space(dir_));
    if (opt_.max_bytes > 0 && bytes > opt_.max_bytes)
        return make_error(ErrorKind::overloaded, "{}: a stage of {} does not fit the cache limit of {} (--cache-max)",
                          dir_, fmt_gib(bytes), fmt_gib(opt_.max_bytes));
    if (opt_.max_bytes > 0 && used - evictable + bytes > opt_.max_bytes)
        return make_error(ErrorKind::overloaded,
                          "{}: a stage of {} does not fit the cache limit of {} (--cache-max) beside the {} in use",
                          dir_, fmt_gib(bytes), fmt_gib(opt_.max_bytes), fmt_gib(used - evictable));
    if (free_now + evictable < bytes + opt_.min_free_bytes)
        return make_error(ErrorKind::overloaded,
                          "{}: a stage of {} needs that much disk plus {} kept free; the disk has {} free and the "
                          "cache could give back {}",
                          dir_, fmt_gib(bytes), fmt_gib(opt_.min_free_bytes), fmt_gib(free_now), fmt_gib(evictable));
    uint64_t freed = 0;
    for (const CacheFile &f : all) {
        const bool cap_ok = opt_.max_bytes == 0 || used - freed + bytes <= opt_.max_bytes;
        const bool disk_ok = free_now + freed >= bytes + opt_.min_free_bytes;
        if (cap_ok && disk_ok) break;
        if (keep.count(f.path)) continue;
        std::error_code ec;
        if (fs::remove(f.path, ec)) {
            freed += f.bytes;
            log_info("cache: evicted {} ({}), the least recently used, for a stage of {}", f.path, fmt_gib(f.bytes),
                     fmt_gib(bytes));
        } else if (ec) {
            log_warn("cache: cannot evict {}: {}", f.path, ec.message());
        }
    }
    if ((opt_.max_bytes > 0 && used - freed + bytes > opt_.max_bytes) ||
        free_now + freed < bytes + opt_.min_free_bytes)
        return make_error(ErrorKind::overloaded, "{}: could not evict enough cached files for a stage of {}", dir_,
                          fmt_gib(bytes));
    return {};
}

Result<OpenFile> open_or_make(const std::string &path, const std::function<bool(const std::string &)> &usable,
                              const std::function<Status()> &make) {
    for (int made = 0;; ++made) {
        OpenFile f(std::fopen(path.c_str(), "rb"));
        if (f && usable && !usable(path)) {
            f.reset();
            std::error_code ec;
            fs::remove(path, ec);
            log_warn("{}: not the file wanted (left by another version?); making it again", path);
        }
        if (f) return f;
        if (made == kMaxMakes)
            return make_error(ErrorKind::io,
                              "{}: gone again after being made {} times (another process evicting from {}?)",
                              path, made, fs::path(path).parent_path().string());
        if (made > 0) log_warn("{}: evicted before it was opened; making it again", path);
        TD_TRY(make());
    }
}

void StageCache::touch(const std::string &path) {
    // The access time only: the modification time is part of a file's identity (the packed weights' key
    // hashes it, model/weight-pack.h), and a stage file whose identity changed on every use was packed anew
    // at every load, each time into another cache file.
    const timespec times[2] = {{0, UTIME_NOW}, {0, UTIME_OMIT}};
    (void)::utimensat(AT_FDCWD, path.c_str(), times, 0);
}

}  // namespace td::cluster
