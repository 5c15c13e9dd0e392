// GGUF reader: maps the file and validates the whole header before anything is handed out.
//
// Every read goes through Parser, which knows how many bytes are left. Counts are bounded by the
// smallest encoding of what they count (a key/value pair is at least 13 bytes, a tensor record 32, an
// array element its element's size) before any vector is reserved, so a hostile count cannot make us
// allocate more than a small multiple of the file size.
#include <bit>
#include <cstring>
#include <limits>

#include "core/check.h"
#include "gguf/gguf.h"

namespace td::gguf {

static_assert(std::endian::native == std::endian::little, "the GGUF reader assumes a little-endian host");

namespace {

// Smallest encodings: empty key + type + u8 value; empty name + n_dims + one ne + dtype + offset.
constexpr size_t kMinKvBytes = 8 + 4 + 1;
constexpr size_t kMinTensorInfoBytes = 8 + 4 + 8 + 4 + 8;
constexpr size_t kMaxPrintedName = 120;

bool value_type_is_known(uint32_t id) {
    return id <= static_cast<uint32_t>(ValueType::f64);
}

// Bytes of one encoded value of this type, or its smallest encoding for strings (length only) and
// arrays (elem_type + count).
size_t value_min_bytes(ValueType type) {
    switch (type) {
        case ValueType::u8:
        case ValueType::i8:
        case ValueType::boolean:
            return 1;
        case ValueType::u16:
        case ValueType::i16:
            return 2;
        case ValueType::u32:
        case ValueType::i32:
        case ValueType::f32:
            return 4;
        case ValueType::u64:
        case ValueType::i64:
        case ValueType::f64:
        case ValueType::string:
            return 8;
        case ValueType::array:
            return 4 + 8;
    }
    TD_UNREACHABLE("value type {}", static_cast<uint32_t>(type));
}

template <typename T>
T load(const uint8_t *p) {
    T v;
    std::memcpy(&v, p, sizeof(T));
    return v;
}

// Integer scalars widened to int64 (u64 bit-cast, bool as 0/1). `p` holds value_min_bytes(type) bytes.
int64_t decode_int(ValueType type, const uint8_t *p) {
    switch (type) {
        case ValueType::u8:
            return p[0];
        case ValueType::i8:
            return load<int8_t>(p);
        case ValueType::u16:
            return load<uint16_t>(p);
        case ValueType::i16:
            return load<int16_t>(p);
        case ValueType::u32:
            return load<uint32_t>(p);
        case ValueType::i32:
            return load<int32_t>(p);
        case ValueType::u64:
            return std::bit_cast<int64_t>(load<uint64_t>(p));
        case ValueType::i64:
            return load<int64_t>(p);
        case ValueType::boolean:
            return p[0] != 0 ? 1 : 0;
        default:
            TD_UNREACHABLE("not an integer type: {}", value_type_name(type));
    }
}

double decode_float(ValueType type, const uint8_t *p) {
    if (type == ValueType::f32) return load<float>(p);
    TD_ASSERT(type == ValueType::f64, "not a float type: {}", value_type_name(type));
    return load<double>(p);
}

bool type_is_integer(ValueType t) {
    return t != ValueType::f32 && t != ValueType::f64 && t != ValueType::string && t != ValueType::array;
}

// A key or tensor name fit for an error message: control bytes escaped, long names shortened.
std::string printable(std::string_view s) {
    std::string out;
    for (size_t i = 0; i < s.size() && i < kMaxPrintedName; ++i) {
        auto c = static_cast<unsigned char>(s[i]);
        if (c < 0x20 || c == 0x7f)
            out += fmt::format("\\x{:02x}", c);
        else
            out += static_cast<char>(c);
    }
    if (s.size() > kMaxPrintedName) out += fmt::format("... ({} bytes)", s.size());
    return out;
}

}  // namespace

// Reads one file front to back into a File. Errors carry no path; File::open prefixes it.
class Parser {
public:
    explicit Parser(File &file) : file_(file), data_(file.map_->data()), size_(file.map_->size()) {}

    Status parse() {
        uint64_t n_tensors = 0, n_kv = 0;
        TD_TRY(read_header(n_tensors, n_kv));
        for (uint64_t i = 0; i < n_kv; ++i) TD_TRY(read_kv(i));
        where_.clear();
        TD_TRY(read_alignment());
        if (n_tensors > left() / kMinTensorInfoBytes)
            return invalid_input(
                "truncated: header claims {} tensors, the {} bytes left after the metadata "
                "at byte {} hold at most {}",
                n_tensors, left(), pos_, left() / kMinTensorInfoBytes);
        file_.tensors_.reserve(n_tensors);
        for (uint64_t i = 0; i < n_tensors; ++i) TD_TRY(read_tensor_info(i));
        where_.clear();
        return place_tensors();
    }

private:
    size_t left() const { return size_ - pos_; }

    // Fails unless n more bytes are available at pos_.
    Status need(size_t n, std::string_view what) const {
        if (n <= left()) return {};
        return invalid_input("truncated: {}{}{} at byte {} needs {} bytes, file is {} bytes", where_,
                             where_.empty() ? "" : ", ", what, pos_, n, size_);
    }

    Status read_u32(uint32_t &out, std::string_view what) {
        TD_TRY(need(4, what));
        out = load<uint32_t>(data_ + pos_);
        pos_ += 4;
        return {};
    }

    Status read_u64(uint64_t &out, std::string_view what) {
        TD_TRY(need(8, what));
        out = load<uint64_t>(data_ + pos_);
        pos_ += 8;
        return {};
    }

    Status read_string(std::string &out, size_t max_len, std::string_view what) {
        uint64_t len = 0;
        TD_TRY(read_u64(len, what));
        if (len > left())
            return invalid_input(
                "truncated: {}{}{} of {} bytes at byte {} runs past the end of the file ({} bytes)", where_,
                where_.empty() ? "" : ", ", what, len, pos_, size_);
        if (len > max_len)
            return invalid_input("{}{}{} is {} bytes long, more than the limit of {}", where_,
                                 where_.empty() ? "" : ": ", what, len, max_len);
        out.assign(reinterpret_cast<const char *>(data_ + pos_), len);
        pos_ += len;
        return {};
    }

    Status read_header(uint64_t &n_tensors, uint64_t &n_kv) {
        TD_TRY(need(4, "magic"));
        if (std::memcmp(data_, "GGUF", 4) != 0) {
            std::string magic;
            for (int i = 0; i < 4; ++i) {
                auto c = data_[i];
                magic += (c >= 0x20 && c < 0x7f) ? fmt::format("{}", static_cast<char>(c))
                                                 : fmt::format("\\x{:02x}", c);
            }
            return invalid_input("bad magic '{}' (not a GGUF file)", magic);
        }
        pos_ = 4;
        uint32_t version = 0;
        TD_TRY(read_u32(version, "version"));
        if (version == 1)
            return invalid_input(
                "GGUF version 1 is no longer supported; re-convert the model with a current "
                "llama.cpp");
        if (version != 0 && (version & 0xffffu) == 0)
            return invalid_input(
                "GGUF version {:#x} looks byte-swapped: only little-endian files are supported", version);
        if (version != 2 && version != 3)
            return invalid_input("unsupported GGUF version {} (tandem reads versions 2 and 3)", version);
        file_.version_ = version;
        TD_TRY(read_u64(n_tensors, "tensor count"));
        TD_TRY(read_u64(n_kv, "key/value count"));
        if (n_kv > left() / kMinKvBytes)
            return invalid_input(
                "truncated: header claims {} key/value pairs, the {} bytes left at byte {} hold "
                "at most {}",
                n_kv, left(), pos_, left() / kMinKvBytes);
        if (n_tensors > left() / kMinTensorInfoBytes ||
            n_kv * kMinKvBytes + n_tensors * kMinTensorInfoBytes > left())
            return invalid_input(
                "truncated: header claims {} key/value pairs and {} tensors, more than the {} "
                "bytes left at byte {} can hold",
                n_kv, n_tensors, left(), pos_);
        file_.kv_.reserve(n_kv);
        return {};
    }

    Status read_kv(uint64_t index) {
        where_ = fmt::format("key {}", index);
        std::string key;
        TD_TRY(read_string(key, kMaxNameBytes, "name"));
        where_ = fmt::format("key '{}'", printable(key));
        auto [it, inserted] = file_.kv_index_.emplace(key, file_.kv_.size());
        if (!inserted)
            return invalid_input("duplicate key '{}' (entries {} and {})", printable(key), it->second, index);
        uint32_t type = 0;
        TD_TRY(read_u32(type, "value type"));
        if (!value_type_is_known(type))
            return invalid_input("key '{}' has unknown value type id {}", printable(key), type);
        Value value;
        TD_TRY(read_value(static_cast<ValueType>(type), value, 0));
        file_.kv_.emplace_back(std::move(key), std::move(value));
        return {};
    }

    Status read_value(ValueType type, Value &v, int depth) {
        v.type = type;
        if (type == ValueType::string) return read_string(v.str, left(), "string value");
        if (type == ValueType::array) return read_array(v, depth + 1);
        size_t n = value_min_bytes(type);
        TD_TRY(need(n, value_type_name(type)));
        if (type_is_integer(type))
            v.i = decode_int(type, data_ + pos_);
        else
            v.f = decode_float(type, data_ + pos_);
        pos_ += n;
        return {};
    }

    // Reads elem_type, count and the elements of an array into v (v.type is already array).
    Status read_array(Value &v, int depth) {
        if (depth > kMaxArrayDepth)
            return invalid_input("{}: arrays nested more than {} deep", where_, kMaxArrayDepth);
        uint32_t elem = 0;
        uint64_t count = 0;
        TD_TRY(read_u32(elem, "array element type"));
        if (!value_type_is_known(elem))
            return invalid_input("{}: array has unknown element type id {}", where_, elem);
        v.elem_type = static_cast<ValueType>(elem);
        TD_TRY(read_u64(count, "array length"));
        size_t min_bytes = value_min_bytes(v.elem_type);
        if (count > left() / min_bytes)
            return invalid_input("truncated: {}, array of {} {} at byte {} cannot fit in the {} bytes left",
                                 where_, count, value_type_name(v.elem_type), pos_, left());
        switch (v.elem_type) {
            case ValueType::string:
                v.strings.resize(count);
                for (auto &s : v.strings) TD_TRY(read_string(s, left(), "array string"));
                return {};
            case ValueType::array:
                v.items.resize(count);
                for (auto &item : v.items) {
                    item.type = ValueType::array;
                    TD_TRY(read_array(item, depth + 1));
                }
                return {};
            case ValueType::f32:
            case ValueType::f64:
                // count * min_bytes <= left() was checked above; elements are fixed size.
                v.floats.resize(count);
                for (auto &f : v.floats) {
                    f = decode_float(v.elem_type, data_ + pos_);
                    pos_ += min_bytes;
                }
                return {};
            default:
                v.ints.resize(count);
                for (auto &x : v.ints) {
                    x = decode_int(v.elem_type, data_ + pos_);
                    pos_ += min_bytes;
                }
                return {};
        }
    }

    // general.alignment: any integer type holding a power of two that fits u32 (ggml stores a u32).
    Status read_alignment() {
        const Value *v = file_.find("general.alignment");
        if (v == nullptr) {
            file_.alignment_ = kDefaultAlignment;
            return {};
        }
        if (!v->is_integer() || v->type == ValueType::boolean)
            return invalid_input("general.alignment is {}, expected u32", value_type_name(v->type));
        bool big = v->type == ValueType::u64 && v->i < 0;
        if (big || v->i <= 0 || v->i > std::numeric_limits<uint32_t>::max() || (v->i & (v->i - 1)) != 0)
            return invalid_input(
                "general.alignment is {}, expected a nonzero power of two",
                big ? fmt::format("{}", static_cast<uint64_t>(v->i)) : fmt::format("{}", v->i));
        file_.alignment_ = static_cast<size_t>(v->i);
        return {};
    }

    Status read_tensor_info(uint64_t index) {
        where_ = fmt::format("tensor {}", index);
        TensorInfo t;
        TD_TRY(read_string(t.name, kMaxNameBytes, "name"));
        const std::string name = printable(t.name);
        where_ = fmt::format("tensor '{}'", name);
        auto [it, inserted] = file_.tensor_index_.emplace(t.name, file_.tensors_.size());
        if (!inserted)
            return invalid_input("duplicate tensor name '{}' (tensors {} and {})", name, it->second, index);

        uint32_t n_dims = 0;
        TD_TRY(read_u32(n_dims, "n_dims"));
        if (n_dims < 1 || n_dims > 4)
            return invalid_input("tensor '{}' has {} dimensions, expected 1 to 4", name, n_dims);
        t.n_dims = static_cast<int>(n_dims);
        int64_t n_elements = 1;
        for (uint32_t d = 0; d < n_dims; ++d) {
            uint64_t ne = 0;
            TD_TRY(read_u64(ne, "shape"));
            if (ne == 0) return invalid_input("tensor '{}' has size 0 in dimension {}", name, d);
            if (ne > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
                return invalid_input("tensor '{}' has size {} in dimension {}, 2^63 or more", name, ne, d);
            t.ne[d] = static_cast<int64_t>(ne);
            if (__builtin_mul_overflow(n_elements, t.ne[d], &n_elements))
                return invalid_input("tensor '{}' has 2^63 or more elements (shape [{}, {}, {}, {}])", name,
                                     t.ne[0], t.ne[1], t.ne[2], t.ne[3]);
        }

        uint32_t type_id = 0;
        TD_TRY(read_u32(type_id, "type"));
        if (!dtype_is_known(type_id))
            return invalid_input("tensor '{}' has unknown type id {}", name, type_id);
        t.type = static_cast<DType>(type_id);
        const DTypeTraits &traits = dtype_traits(t.type);
        if (t.ne[0] % traits.block_size != 0)
            return invalid_input(
                "tensor '{}' of type {} has {} elements per row, not a multiple of the block "
                "size {}",
                name, traits.name, t.ne[0], traits.block_size);
        // n_elements fits int64, so the row count does too; only the byte count can overflow.
        auto n_blocks = static_cast<uint64_t>(n_elements / traits.block_size);
        uint64_t n_bytes = 0;
        if (__builtin_mul_overflow(n_blocks, static_cast<uint64_t>(traits.block_bytes), &n_bytes) ||
            n_bytes > std::numeric_limits<size_t>::max())
            return invalid_input("tensor '{}' has 2^64 or more bytes of data", name);
        t.n_bytes = static_cast<size_t>(n_bytes);

        TD_TRY(read_u64(t.offset, "data offset"));
        if (t.offset % file_.alignment_ != 0)
            return invalid_input("tensor '{}' offset {} is not a multiple of the alignment {}", name,
                                 t.offset, file_.alignment_);
        file_.tensors_.push_back(std::move(t));
        return {};
    }

    // The data section starts at the aligned end of the header; every tensor must end inside the file.
    Status place_tensors() {
        size_t a = file_.alignment_;
        size_t data_offset =
            pos_ % a == 0 ? pos_ : pos_ + (a - pos_ % a);  // pos_ <= size_ < 2^63: no overflow
        file_.data_offset_ = data_offset;
        if (file_.tensors_.empty()) return {};
        if (data_offset > size_)
            return invalid_input("truncated: the data section starts at byte {}, file is {} bytes",
                                 data_offset, size_);
        for (TensorInfo &t : file_.tensors_) {
            uint64_t begin = 0, end = 0;
            if (__builtin_add_overflow(static_cast<uint64_t>(data_offset), t.offset, &begin) ||
                __builtin_add_overflow(begin, static_cast<uint64_t>(t.n_bytes), &end))
                return invalid_input("tensor '{}' offset {} is past the end of the file ({} bytes)",
                                     printable(t.name), t.offset, size_);
            if (end > size_)
                return invalid_input("tensor '{}' ends at byte {}, file is {} bytes", printable(t.name), end,
                                     size_);
            t.data = data_ + begin;
        }
        return {};
    }

    File &file_;
    const uint8_t *data_;  // [size_] the mapping (nullptr for an empty file)
    size_t size_;
    size_t pos_ = 0;
    std::string where_;  // what is being read, for messages: "key 'general.name'", "tensor 3"
};

Result<File> File::open(const std::string &path) {
    TD_ASSIGN_OR_RETURN(MappedFile map, MappedFile::open(path));
    File file;
    file.map_ = std::make_shared<MappedFile>(std::move(map));
    Parser parser(file);
    Status status = parser.parse();
    if (!status.ok()) return status.with_context(path);
    return file;
}

const Value *File::find(std::string_view key) const {
    auto it = kv_index_.find(key);
    return it == kv_index_.end() ? nullptr : &kv_[it->second].second;
}

const TensorInfo *File::find_tensor(std::string_view name) const {
    auto it = tensor_index_.find(name);
    return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

}  // namespace td::gguf
