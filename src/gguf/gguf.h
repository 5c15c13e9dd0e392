// GGUF reader and writer (versions 2 and 3). Knows files, keys and tensors; nothing about transformers.
//
// File layout (little-endian):
//   magic "GGUF" | u32 version | u64 n_tensors | u64 n_kv          (v1 used u32 counts: rejected)
//   n_kv x { string key | u32 value_type | value }
//   n_tensors x { string name | u32 n_dims | u64 ne[n_dims] | u32 dtype | u64 offset }
//   padding to general.alignment (default 32)
//   tensor data; each tensor at data_start + offset, offset a multiple of the alignment
// string = u64 length + bytes (no terminator); array = u32 elem_type + u64 count + elements.
//
// Reading maps the file and validates everything before returning: counts and lengths are bounded by the
// bytes left in the file before anything is allocated, all size arithmetic is overflow-checked, every
// tensor must lie inside the file. Any violation returns invalid_input naming the file and the problem.
//
// general.alignment may be any integer type holding a nonzero power of two that fits u32; default 32.
// Copying a File shares the mapping (tensor data pointers stay valid while any copy lives) but copies
// the metadata; pass it by reference where that matters.
//
// Choices where llama.cpp is silent or lenient (documented so the model code can rely on them):
//   - n_dims must be 1..4 and every ne >= 1. ggml writes n_dims >= 1 and its reader divides by ne, so a
//     zero-sized dimension is rejected here rather than special-cased downstream.
//   - Known dtypes that tandem cannot compute with yet (dtype_traits(t).supported == false) load fine;
//     the model decides. Unknown dtype ids are an error naming the tensor and the id.
//   - Arrays may nest (array of arrays) up to kMaxArrayDepth levels; llama.cpp itself rejects nesting.
//   - Tensors need not be packed back to back (llama.cpp's reader requires that, its mmap loader does
//     not); each offset must be a multiple of the alignment and the data must end inside the file.
//   - A bool byte other than 0 reads as true.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/mmap.h"
#include "core/status.h"
#include "tensor/dtype.h"
#include "tensor/tensor.h"

namespace td::gguf {

inline constexpr size_t kDefaultAlignment = 32;
inline constexpr size_t kMaxNameBytes = 64 * 1024;  // key and tensor name limit when reading
inline constexpr size_t kMaxLlamaTensorName = 63;   // ggml's GGML_MAX_NAME - 1; enforced by Writer
inline constexpr int kMaxArrayDepth = 8;            // arrays inside arrays inside ... (reader and writer)

enum class ValueType : uint32_t {
    u8 = 0,
    i8 = 1,
    u16 = 2,
    i16 = 3,
    u32 = 4,
    i32 = 5,
    f32 = 6,
    boolean = 7,
    string = 8,
    array = 9,
    u64 = 10,
    i64 = 11,
    f64 = 12,
};

const char *value_type_name(ValueType type);

// One metadata value. Scalars are widened into `i` (signed and unsigned integers, bool), `f` (floats).
// Arrays: elem_type says what they hold; strings go to `strings`, numbers to `ints` or `floats`
// (widened), nested arrays are kept as `items`.
struct Value {
    ValueType type = ValueType::u8;
    int64_t i = 0;    // integer and bool scalars (u64 above INT64_MAX is stored bit-cast)
    double f = 0.0;   // f32 / f64 scalars
    std::string str;  // string scalar

    ValueType elem_type = ValueType::u8;  // arrays only
    std::vector<std::string> strings;     // array of string
    std::vector<int64_t> ints;            // array of integers / bools
    std::vector<double> floats;           // array of f32 / f64
    std::vector<Value> items;             // array of arrays
    size_t array_size() const;            // number of elements whatever elem_type is

    bool is_integer() const;  // u8..i64, bool
    bool is_float() const;    // f32, f64
};

struct TensorInfo {
    std::string name;
    DType type = DType::f32;
    int n_dims = 0;
    int64_t ne[4] = {1, 1, 1, 1};
    uint64_t offset = 0;  // relative to the start of the data section
    size_t n_bytes = 0;
    const uint8_t *data = nullptr;  // points into the mapping

    TensorView view() const;
};

class File {
public:
    // Maps and validates `path`. Errors name the file: "m.gguf: bad magic 'GGML' (not a GGUF file)".
    static Result<File> open(const std::string &path);

    const std::string &path() const { return map_->path(); }
    const MappedFile &mapping() const { return *map_; }
    uint32_t version() const { return version_; }
    size_t alignment() const { return alignment_; }
    size_t file_size() const { return map_->size(); }
    // Start of the data section (aligned end of the header). For a file without tensors it may lie past
    // file_size(): gguf-py writes no padding after the header then, and nothing reads from it.
    size_t data_offset() const { return data_offset_; }

    // Metadata, in file order.
    const std::vector<std::pair<std::string, Value>> &metadata() const { return kv_; }
    const Value *find(std::string_view key) const;  // nullptr when absent
    bool has(std::string_view key) const { return find(key) != nullptr; }

    // Typed getters. Errors (not_found / invalid_input) name the file and key:
    //   "m.gguf: missing required key 'llama.block_count'",
    //   "m.gguf: key 'llama.block_count' is string, expected an integer".
    // Integer getters accept any integer type whose value fits; float getters accept f32/f64 and integers.
    Result<std::string> get_string(std::string_view key) const;
    Result<int64_t> get_int(std::string_view key) const;
    Result<uint32_t> get_u32(std::string_view key) const;
    Result<float> get_f32(std::string_view key) const;
    Result<bool> get_bool(std::string_view key) const;
    Result<std::vector<std::string>> get_string_array(std::string_view key) const;
    Result<std::vector<float>> get_f32_array(std::string_view key) const;
    Result<std::vector<int32_t>> get_i32_array(std::string_view key) const;
    // Optional forms: nullopt when absent; a present key of the wrong type is still an error.
    Result<std::optional<int64_t>> get_int_opt(std::string_view key) const;
    Result<std::optional<float>> get_f32_opt(std::string_view key) const;
    Result<std::optional<std::string>> get_string_opt(std::string_view key) const;
    Result<std::optional<bool>> get_bool_opt(std::string_view key) const;

    const std::vector<TensorInfo> &tensors() const { return tensors_; }
    const TensorInfo *find_tensor(std::string_view name) const;  // nullptr when absent

private:
    std::shared_ptr<MappedFile> map_;
    uint32_t version_ = 0;
    size_t alignment_ = 32;
    size_t data_offset_ = 0;
    std::vector<std::pair<std::string, Value>> kv_;
    std::map<std::string, size_t, std::less<>> kv_index_;
    std::vector<TensorInfo> tensors_;
    std::map<std::string, size_t, std::less<>> tensor_index_;

    friend class Parser;
};

// Writes GGUF v3 files that llama.cpp loads. Keys keep insertion order; tensors are laid out in
// insertion order at `alignment` (general.alignment is written when it is not 32).
// Setting a key that is already set replaces its value and keeps its position. general.alignment, if
// set explicitly, must equal the constructor's alignment (write() fails otherwise) and is always
// written as u32, the type llama.cpp requires.
class Writer {
public:
    // alignment: a power of two (asserted).
    explicit Writer(size_t alignment = 32);

    void set_u8(std::string key, uint8_t v);
    void set_i32(std::string key, int32_t v);
    void set_u32(std::string key, uint32_t v);
    void set_u64(std::string key, uint64_t v);
    void set_f32(std::string key, float v);
    void set_bool(std::string key, bool v);
    void set_string(std::string key, std::string v);
    void set_string_array(std::string key, std::vector<std::string> v);
    void set_f32_array(std::string key, std::vector<float> v);
    void set_i32_array(std::string key, std::vector<int32_t> v);
    // Copies a value read from another file (used to carry a vocabulary over), arrays included.
    void set_value(std::string key, const Value &v);

    // ne as in GGUF (ne[0] innermost). `data` holds n_bytes = dtype_row_bytes(type, ne[0]) * rows and
    // is copied. Asserted (caller bugs): 1..4 dims, every ne >= 1, ne[0] a multiple of the block size,
    // n_bytes matching the shape.
    void add_tensor(std::string name, DType type, std::vector<int64_t> ne, const void *data, size_t n_bytes);
    // The same, with the bytes produced at write() time, one tensor at a time, so a large file is written
    // without holding its tensors in memory. source fills n_bytes at dst; its error ends write() (the
    // partial file is removed) with that error.
    using TensorSource = std::function<Status(uint8_t *dst)>;
    void add_tensor_from(std::string name, DType type, std::vector<int64_t> ne, size_t n_bytes,
                         TensorSource source);

    // Writes the whole file (to path + ".<pid>.<n>.tmp", then renamed). io errors name the path; invalid_input for
    // a duplicate tensor name, a tensor name longer than kMaxLlamaTensorName, a general.alignment that
    // disagrees with the constructor, or arrays nested deeper than kMaxArrayDepth.
    Status write(const std::string &path) const;

private:
    struct PendingTensor {
        std::string name;
        DType type;
        std::vector<int64_t> ne;
        std::vector<uint8_t> data;  // empty when `source` produces the bytes
        size_t n_bytes = 0;
        TensorSource source;
    };
    static void check_tensor(const std::string &name, DType type, const std::vector<int64_t> &ne,
                             size_t n_bytes);
    void put(std::string key, Value value);

    size_t alignment_;
    std::vector<std::pair<std::string, Value>> kv_;
    std::vector<PendingTensor> tensors_;
};

}  // namespace td::gguf
