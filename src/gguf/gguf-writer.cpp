// GGUF v3 writer. The layout is the one llama.cpp's reader insists on: tensors back to back in the order
// of the tensor table, each padded with zeros to the alignment, the first at the aligned end of the header.
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <set>

#include "core/check.h"
#include "gguf/gguf.h"

namespace td::gguf {

namespace {

constexpr uint32_t kVersion = 3;

size_t align_up(size_t n, size_t a) {
    return (n + a - 1) / a * a;
}

// Little-endian byte sink for the header.
class Bytes {
public:
    template <typename T>
    void put(T v) {
        static_assert(std::endian::native == std::endian::little);
        put_bytes(&v, sizeof(T));
    }
    void put_string(std::string_view s) {
        put<uint64_t>(s.size());
        put_bytes(s.data(), s.size());
    }
    void put_bytes(const void *p, size_t n) {
        if (n == 0) return;
        size_t at = buf.size();
        buf.resize(at + n);
        std::memcpy(buf.data() + at, p, n);
    }

    std::vector<uint8_t> buf;  // [bytes written so far]
};

void put_int(Bytes &out, ValueType type, int64_t i) {
    switch (type) {
        case ValueType::u8:
            out.put(static_cast<uint8_t>(i));
            return;
        case ValueType::i8:
            out.put(static_cast<int8_t>(i));
            return;
        case ValueType::u16:
            out.put(static_cast<uint16_t>(i));
            return;
        case ValueType::i16:
            out.put(static_cast<int16_t>(i));
            return;
        case ValueType::u32:
            out.put(static_cast<uint32_t>(i));
            return;
        case ValueType::i32:
            out.put(static_cast<int32_t>(i));
            return;
        case ValueType::u64:
            out.put(static_cast<uint64_t>(i));
            return;
        case ValueType::i64:
            out.put(i);
            return;
        case ValueType::boolean:
            out.put(static_cast<uint8_t>(i != 0 ? 1 : 0));
            return;
        default:
            TD_UNREACHABLE("not an integer type: {}", value_type_name(type));
    }
}

void put_float(Bytes &out, ValueType type, double f) {
    if (type == ValueType::f32)
        out.put(static_cast<float>(f));
    else
        out.put(f);
}

bool is_float(ValueType t) {
    return t == ValueType::f32 || t == ValueType::f64;
}

Status put_array(Bytes &out, const Value &v, int depth, std::string_view key);

// The value's payload (what follows its type id).
Status put_value(Bytes &out, const Value &v, int depth, std::string_view key) {
    TD_ASSERT(static_cast<uint32_t>(v.type) <= static_cast<uint32_t>(ValueType::f64),
              "key '{}': bad value type {}", key, static_cast<uint32_t>(v.type));
    if (v.type == ValueType::string) {
        out.put_string(v.str);
    } else if (v.type == ValueType::array) {
        return put_array(out, v, depth + 1, key);
    } else if (is_float(v.type)) {
        put_float(out, v.type, v.f);
    } else {
        put_int(out, v.type, v.i);
    }
    return {};
}

Status put_array(Bytes &out, const Value &v, int depth, std::string_view key) {
    TD_ASSERT(v.type == ValueType::array, "key '{}': nested item is {}, not an array", key,
              value_type_name(v.type));
    TD_ASSERT(static_cast<uint32_t>(v.elem_type) <= static_cast<uint32_t>(ValueType::f64),
              "key '{}': bad array element type {}", key, static_cast<uint32_t>(v.elem_type));
    if (depth > kMaxArrayDepth)
        return invalid_input("key '{}': arrays nested more than {} deep", key, kMaxArrayDepth);
    out.put(static_cast<uint32_t>(v.elem_type));
    out.put<uint64_t>(v.array_size());
    switch (v.elem_type) {
        case ValueType::string:
            for (const auto &s : v.strings) out.put_string(s);
            break;
        case ValueType::array:
            for (const auto &item : v.items) TD_TRY(put_array(out, item, depth + 1, key));
            break;
        case ValueType::f32:
        case ValueType::f64:
            for (double f : v.floats) put_float(out, v.elem_type, f);
            break;
        default:
            for (int64_t i : v.ints) put_int(out, v.elem_type, i);
            break;
    }
    return {};
}

// Writes all of `data` to fd, retrying short writes.
bool write_all(int fd, const void *data, size_t n) {
    const auto *p = static_cast<const uint8_t *>(data);
    while (n > 0) {
        ssize_t w = ::write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return false;
        }
        p += w;
        n -= static_cast<size_t>(w);
    }
    return true;
}

}  // namespace

Writer::Writer(size_t alignment) : alignment_(alignment) {
    TD_ASSERT(alignment > 0 && (alignment & (alignment - 1)) == 0 &&
                  alignment <= std::numeric_limits<uint32_t>::max(),
              "alignment {} is not a power of two that fits u32", alignment);
}

void Writer::put(std::string key, Value value) {
    for (auto &[k, v] : kv_) {
        if (k == key) {
            v = std::move(value);
            return;
        }
    }
    kv_.emplace_back(std::move(key), std::move(value));
}

namespace {
Value scalar_int(ValueType type, int64_t i) {
    Value v;
    v.type = type;
    v.i = i;
    return v;
}
Value array_of(ValueType elem) {
    Value v;
    v.type = ValueType::array;
    v.elem_type = elem;
    return v;
}
}  // namespace

void Writer::set_u8(std::string key, uint8_t v) {
    put(std::move(key), scalar_int(ValueType::u8, v));
}
void Writer::set_i32(std::string key, int32_t v) {
    put(std::move(key), scalar_int(ValueType::i32, v));
}
void Writer::set_u32(std::string key, uint32_t v) {
    put(std::move(key), scalar_int(ValueType::u32, v));
}
void Writer::set_u64(std::string key, uint64_t v) {
    put(std::move(key), scalar_int(ValueType::u64, std::bit_cast<int64_t>(v)));
}
void Writer::set_bool(std::string key, bool v) {
    put(std::move(key), scalar_int(ValueType::boolean, v ? 1 : 0));
}

void Writer::set_f32(std::string key, float v) {
    Value value;
    value.type = ValueType::f32;
    value.f = v;
    put(std::move(key), std::move(value));
}

void Writer::set_string(std::string key, std::string v) {
    Value value;
    value.type = ValueType::string;
    value.str = std::move(v);
    put(std::move(key), std::move(value));
}

void Writer::set_string_array(std::string key, std::vector<std::string> v) {
    Value value = array_of(ValueType::string);
    value.strings = std::move(v);
    put(std::move(key), std::move(value));
}

void Writer::set_f32_array(std::string key, std::vector<float> v) {
    Value value = array_of(ValueType::f32);
    value.floats.assign(v.begin(), v.end());
    put(std::move(key), std::move(value));
}

void Writer::set_i32_array(std::string key, std::vector<int32_t> v) {
    Value value = array_of(ValueType::i32);
    value.ints.assign(v.begin(), v.end());
    put(std::move(key), std::move(value));
}

void Writer::set_value(std::string key, const Value &v) {
    put(std::move(key), v);
}

void Writer::check_tensor(const std::string &name, DType type, const std::vector<int64_t> &ne,
                          size_t n_bytes) {
    TD_ASSERT(dtype_is_known(static_cast<uint32_t>(type)), "tensor '{}': unknown dtype {}", name,
              static_cast<uint32_t>(type));
    TD_ASSERT(!ne.empty() && ne.size() <= 4, "tensor '{}' has {} dimensions", name, ne.size());
    int64_t rows = 1;
    for (size_t d = 0; d < ne.size(); ++d) {
        TD_ASSERT(ne[d] >= 1, "tensor '{}' ne[{}] = {}", name, d, ne[d]);
        if (d > 0) TD_ASSERT(!__builtin_mul_overflow(rows, ne[d], &rows), "tensor '{}' is too large", name);
    }
    TD_ASSERT(ne[0] % dtype_traits(type).block_size == 0,
              "tensor '{}': ne[0] {} is not a multiple of {}'s block", name, ne[0], dtype_name(type));
    size_t expected = 0;
    TD_ASSERT(!__builtin_mul_overflow(dtype_row_bytes(type, ne[0]), static_cast<size_t>(rows), &expected),
              "tensor '{}' is too large", name);
    TD_ASSERT(n_bytes == expected, "tensor '{}': {} bytes given, shape and type need {}", name, n_bytes,
              expected);
}

void Writer::add_tensor(std::string name, DType type, std::vector<int64_t> ne, const void *data,
                        size_t n_bytes) {
    check_tensor(name, type, ne, n_bytes);
    TD_ASSERT(data != nullptr, "tensor '{}': no data", name);
    const auto *p = static_cast<const uint8_t *>(data);
    tensors_.push_back({std::move(name), type, std::move(ne), std::vector<uint8_t>(p, p + n_bytes), n_bytes, {}});
}

void Writer::add_tensor_from(std::string name, DType type, std::vector<int64_t> ne, size_t n_bytes,
                             TensorSource source) {
    check_tensor(name, type, ne, n_bytes);
    TD_ASSERT(source != nullptr, "tensor '{}': no source", name);
    tensors_.push_back({std::move(name), type, std::move(ne), {}, n_bytes, std::move(source)});
}

Status Writer::write(const std::string &path) const {
    // Validate what llama.cpp would refuse before touching the disk.
    bool has_alignment_key = false;
    for (const auto &[key, value] : kv_) {
        if (key != "general.alignment") continue;
        has_alignment_key = true;
        bool big = value.type == ValueType::u64 && value.i < 0;
        if (!value.is_integer() || value.type == ValueType::boolean || big ||
            value.i != static_cast<int64_t>(alignment_))
            return invalid_input("{}: general.alignment is set to {}{}, but the writer aligns to {}", path,
                                 value_type_name(value.type),
                                 value.is_integer() ? fmt::format(" {}", value.i) : "", alignment_);
    }
    std::set<std::string_view> names;
    for (const auto &t : tensors_) {
        if (t.name.size() > kMaxLlamaTensorName)
            return invalid_input("{}: tensor name '{}' is {} bytes, llama.cpp allows at most {}", path,
                                 t.name, t.name.size(), kMaxLlamaTensorName);
        if (!names.insert(t.name).second)
            return invalid_input("{}: duplicate tensor name '{}'", path, t.name);
    }
    bool add_alignment_key = !has_alignment_key && alignment_ != kDefaultAlignment;

    Bytes head;
    head.put_bytes("GGUF", 4);
    head.put(kVersion);
    head.put<uint64_t>(tensors_.size());
    head.put<uint64_t>(kv_.size() + (add_alignment_key ? 1 : 0));
    for (const auto &[key, value] : kv_) {
        head.put_string(key);
        if (key == "general.alignment") {
            head.put(static_cast<uint32_t>(ValueType::u32));
            head.put(static_cast<uint32_t>(alignment_));
            continue;
        }
        head.put(static_cast<uint32_t>(value.type));
        Status status = put_value(head, value, 0, key);
        if (!status.ok()) return status.with_context(path);
    }
    if (add_alignment_key) {
        head.put_string("general.alignment");
        head.put(static_cast<uint32_t>(ValueType::u32));
        head.put(static_cast<uint32_t>(alignment_));
    }
    uint64_t offset = 0;
    for (const auto &t : tensors_) {
        head.put_string(t.name);
        head.put(static_cast<uint32_t>(t.ne.size()));
        for (int64_t n : t.ne) head.put(static_cast<uint64_t>(n));
        head.put(static_cast<uint32_t>(t.type));
        head.put(offset);
        offset += align_up(t.n_bytes, alignment_);
    }
    head.buf.resize(align_up(head.buf.size(), alignment_), 0);

    // A name of this writer's own: two processes (or threads) writing the same path must not share a
    // temporary file; the last rename wins with a whole file either way.
    static std::atomic<uint64_t> n_written{0};
    const std::string tmp = fmt::format("{}.{}.{}.tmp", path, ::getpid(), n_written.fetch_add(1));
    int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return make_error(ErrorKind::io, "{}: cannot create: {}", tmp, std::strerror(errno));
    const std::vector<uint8_t> zeros(alignment_, 0);
    bool ok = write_all(fd, head.buf.data(), head.buf.size());
    std::vector<uint8_t> produced;  // a sourced tensor's bytes, one tensor at a time
    Status source_status;
    for (const auto &t : tensors_) {
        if (!ok) break;
        const uint8_t *bytes = t.data.data();
        if (t.source) {
            produced.resize(t.n_bytes);
            source_status = t.source(produced.data());
            if (!source_status.ok()) break;
            bytes = produced.data();
        }
        ok = write_all(fd, bytes, t.n_bytes) &&
             write_all(fd, zeros.data(), align_up(t.n_bytes, alignment_) - t.n_bytes);
    }
    if (!source_status.ok()) {
        ::close(fd);
        ::unlink(tmp.c_str());
        return source_status.with_context(path);
    }
    int err = ok ? 0 : errno;
    if (::close(fd) != 0 && ok) {
        ok = false;
        err = errno;
    }
    if (!ok) {
        ::unlink(tmp.c_str());
        return make_error(ErrorKind::io, "{}: cannot write: {}", tmp, std::strerror(err));
    }
    if (std::rename(tmp.c_str(), path.c_str()) != 0) {
        err = errno;
        ::unlink(tmp.c_str());
        return make_error(ErrorKind::io, "{}: cannot rename {} to it: {}", path, tmp, std::strerror(err));
    }
    return {};
}

}  // namespace td::gguf
