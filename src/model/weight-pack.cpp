#include "model/weight-pack.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>

#include "kernels/pack.h"

namespace td {
namespace {

constexpr char kMagic[8] = {'T', 'D', 'P', 'A', 'C', 'K', '\0', '\0'};
constexpr uint32_t kVersion = 1;  // bump when kernels/pack.h's layout changes
constexpr size_t kAlign = 64;
// Rows packed per read: whole groups, a few MiB at most for the widest rows, so packing needs little memory.
constexpr int64_t kRowsPerPass = 256;
static_assert(kRowsPerPass % kernels::kPackRows == 0);

struct Header {
    char magic[8];
    uint32_t version;
    uint32_t reserved;
    uint64_t key;
    uint64_t n_tensors;
    uint64_t data_bytes;
    uint8_t pad[24];
};
static_assert(sizeof(Header) == 64);

size_t align_up(size_t n) {
    return (n + kAlign - 1) / kAlign * kAlign;
}

template <typename T>
void hash_value(XXH3_state_t *st, const T &v) {
    XXH3_64bits_update(st, &v, sizeof(v));
}

// Reads each of `todo`'s tensors from `file` (infos: their file entries) in passes of kRowsPerPass rows,
// packs them and hands `put` the packed bytes in order, each tensor padded to kAlign. False on a short read;
// stops early (true) where `put` fails.
bool pack_stream(const gguf::File &file, const std::vector<TensorView *> &todo,
                 const std::vector<const gguf::TensorInfo *> &infos,
                 const std::function<bool(const char *, size_t)> &put) {
    std::ifstream in(file.path(), std::ios::binary);
    if (!in) return false;
    std::vector<char> rows, packed, zeros(kAlign, 0);
    for (size_t i = 0; i < todo.size(); ++i) {
        const TensorView &v = *todo[i];
        const size_t row_bytes = v.row_bytes();
        const int64_t n_rows = v.ne[1];
        in.seekg(static_cast<std::streamoff>(file.data_offset() + infos[i]->offset));
        for (int64_t r = 0; r < n_rows; r += kRowsPerPass) {
            const int64_t n = std::min(kRowsPerPass, n_rows - r);
            const size_t bytes = static_cast<size_t>(n) * row_bytes;
            rows.resize(bytes);
            packed.resize(bytes);
            if (!in.read(rows.data(), static_cast<std::streamsize>(bytes))) return false;
            kernels::pack_rows(v.type, rows.data(), v.ne[0], n, packed.data());
            if (!put(packed.data(), bytes)) return true;
        }
        if (!put(zeros.data(), align_up(v.n_bytes()) - v.n_bytes())) return true;
    }
    return true;
}

}  // namespace

Result<PackResult> pack_weights(const gguf::File &file, const std::vector<TensorView *> &views,
                                const std::string &dir) {
    std::vector<TensorView *> todo;  // the views that get packed, in file order of their names
    for (TensorView *v : views)
        if (v != nullptr && v->data != nullptr && v->n_dims == 2 && v->packed == nullptr &&
            kernels::packable(v->type, v->ne[0], v->ne[1]) && kernels::pack_pays(v->type))
            todo.push_back(v);
    PackResult res;
    if (todo.empty()) return res;

    struct stat st {};
    if (::stat(file.path().c_str(), &st) != 0)
        return make_error(ErrorKind::io, "{}: cannot stat: {}", file.path(), std::strerror(errno));
    std::vector<const gguf::TensorInfo *> infos;
    XXH3_state_t *hs = XXH3_createState();
    XXH3_64bits_reset(hs);
    hash_value(hs, kVersion);
    hash_value(hs, static_cast<uint64_t>(st.st_dev));
    hash_value(hs, static_cast<uint64_t>(st.st_ino));
    hash_value(hs, static_cast<uint64_t>(st.st_size));
    hash_value(hs, static_cast<int64_t>(st.st_mtim.tv_sec));
    hash_value(hs, static_cast<int64_t>(st.st_mtim.tv_nsec));
    size_t data_bytes = 0;
    for (TensorView *v : todo) {
        const gguf::TensorInfo *t = file.find_tensor(v->name);
        if (t == nullptr || t->data != v->data) {
            XXH3_freeState(hs);
            return make_error(ErrorKind::io, "{}: tensor '{}' to pack is not in the file", file.path(),
                              v->name);
        }
        infos.push_back(t);
        XXH3_64bits_update(hs, t->name.data(), t->name.size());
        hash_value(hs, static_cast<int32_t>(t->type));
        hash_value(hs, t->ne);
        hash_value(hs, t->offset);
        data_bytes += align_up(v->n_bytes());
    }
    const uint64_t key = XXH3_64bits_digest(hs);
    XXH3_freeState(hs);

    res.path = fmt::format("{}/{:016x}.tdpack", dir, key);
    res.n_tensors = todo.size();
    res.n_bytes = data_bytes;

    Header want{};
    std::memcpy(want.magic, kMagic, sizeof(kMagic));
    want.version = kVersion;
    want.key = key;
    want.n_tensors = todo.size();
    want.data_bytes = data_bytes;

    // Reuse a complete file with our header; anything else is (re)written.
    auto try_map = [&]() -> std::shared_ptr<MappedFile> {
        auto m = MappedFile::open(res.path);
        if (!m.ok() || m->size() != sizeof(Header) + data_bytes) return nullptr;
        if (std::memcmp(m->data(), &want, sizeof(Header)) != 0) return nullptr;
        return std::make_shared<MappedFile>(std::move(m).value());
    };
    res.map = try_map();
    res.reused = res.map != nullptr;
    if (!res.reused) {
        std::error_code ec;
        std::filesystem::create_directories(dir, ec);
        const std::string tmp = fmt::format("{}.tmp.{}", res.path, ::getpid());
        // A disk without room for the file is not written at all: a write that fails part way costs a second
        // packing pass into memory (still possible where another writer fills the disk meanwhile).
        bool room = !ec;
        std::string why = "disk full or not writable";
        if (room) {
            const auto space = std::filesystem::space(dir, ec);
            room = ec || space.available >= sizeof(Header) + data_bytes;
            if (!room)
                why = fmt::format("{:.2f} GiB free, {:.2f} GiB needed", space.available / 1073741824.0,
                                  (sizeof(Header) + data_bytes) / 1073741824.0);
        }
        std::ofstream out;
        if (room) out.open(tmp, std::ios::binary | std::ios::trunc);
        bool read_ok = true;
        if (out) {
            out.write(reinterpret_cast<const char *>(&want), sizeof(want));
            read_ok = pack_stream(file, todo, infos, [&](const char *p, size_t n) {
                return static_cast<bool>(out.write(p, static_cast<std::streamsize>(n)));
            });
            out.close();
        }
        if (!read_ok) {
            std::filesystem::remove(tmp, ec);
            return make_error(ErrorKind::io, "{}: short read while packing its weights", file.path());
        }
        if (out) {
            // On disk before it gets its name: a crash then leaves a whole file or none. Also lets the page
            // cache drop these pages and read them back in 2 MiB pages (MappedFile::prefer_huge_pages).
            if (const int fd = ::open(tmp.c_str(), O_RDONLY | O_CLOEXEC); fd >= 0) {
                ::fsync(fd);
                ::close(fd);
            }
            std::filesystem::rename(tmp, res.path, ec);
            if (!ec) res.map = try_map();
        }
        if (res.map == nullptr) {  // a full disk or an unwritable dir: the packed copies live in memory
            std::filesystem::remove(tmp, ec);
            res.unwritten = fmt::format("{}: cannot write the packed weights ({})", tmp, why);
            TD_ASSIGN_OR_RETURN(HugeBuffer mem, HugeBuffer::allocate(data_bytes));
            size_t at = 0;
            if (!pack_stream(file, todo, infos, [&](const char *p, size_t n) {
                    std::memcpy(mem.data() + at, p, n);
                    at += n;
                    return true;
                }))
                return make_error(ErrorKind::io, "{}: short read while packing its weights", file.path());
            res.memory = std::make_shared<HugeBuffer>(std::move(mem));
            res.path.clear();
        }
    }
    const uint8_t *p = res.map != nullptr ? res.map->data() + sizeof(Header) : res.memory->data();
    for (TensorView *v : todo) {
        v->packed = p;
        p += align_up(v->n_bytes());
    }
    return res;
}

}  // namespace td
