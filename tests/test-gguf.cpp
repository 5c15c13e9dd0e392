#include <gtest/gtest.h>

#include <atomic>
#include <bit>
#include <cstring>
#include <fstream>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gguf/gguf.h"
#include "test-util.h"

namespace td {
namespace {

using gguf::File;
using gguf::Value;
using gguf::ValueType;
using gguf::Writer;

// ---- helpers --------------------------------------------------------------------------------------

std::vector<uint8_t> read_bytes(const std::string &path) {
    std::ifstream in(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Replaces the file by unlinking it first: ext4 flushes a truncated-and-rewritten file on close, which
// would make the thousands of small writes below wait on the disk.
void write_bytes(const std::string &path, const std::vector<uint8_t> &bytes) {
    std::filesystem::remove(path);
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char *>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

// Deterministic bytes for tensor data.
std::vector<uint8_t> pattern(size_t n, uint32_t seed) {
    std::vector<uint8_t> out(n);  // [n]
    std::mt19937 rng(seed);
    for (auto &b : out) b = static_cast<uint8_t>(rng());
    return out;
}

// Hand-built GGUF bytes for hostile inputs.
class Bytes {
public:
    Bytes &u32(uint32_t v) { return raw(&v, 4); }
    Bytes &u64(uint64_t v) { return raw(&v, 8); }
    Bytes &str(std::string_view s) {
        u64(s.size());
        return raw(s.data(), s.size());
    }
    Bytes &raw(const void *p, size_t n) {
        const auto *b = static_cast<const uint8_t *>(p);
        buf.insert(buf.end(), b, b + n);
        return *this;
    }
    Bytes &header(uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
        raw("GGUF", 4);
        u32(version);
        u64(n_tensors);
        return u64(n_kv);
    }
    Bytes &kv_u32(std::string_view key, uint32_t v) {
        str(key);
        u32(static_cast<uint32_t>(ValueType::u32));
        return u32(v);
    }
    Bytes &tensor(std::string_view name, std::vector<uint64_t> ne, uint32_t type, uint64_t offset) {
        str(name);
        u32(static_cast<uint32_t>(ne.size()));
        for (uint64_t n : ne) u64(n);
        u32(type);
        return u64(offset);
    }
    Bytes &pad(size_t a) {
        buf.resize((buf.size() + a - 1) / a * a, 0);
        return *this;
    }
    Bytes &zeros(size_t n) {
        buf.resize(buf.size() + n, 0);
        return *this;
    }

    std::vector<uint8_t> buf;  // [file bytes]
};

class GgufTest : public ::testing::Test {
protected:
    Result<File> open_bytes(const std::vector<uint8_t> &bytes, const std::string &name = "m.gguf") {
        std::string path = dir_.file(name);
        write_bytes(path, bytes);
        return File::open(path);
    }

    // Opening `bytes` fails with invalid_input; the message starts with the path and contains `needle`.
    void expect_error(const std::vector<uint8_t> &bytes, const std::string &needle) {
        auto r = open_bytes(bytes);
        ASSERT_FALSE(r.ok()) << "expected an error containing: " << needle;
        const std::string msg = r.status().message();
        EXPECT_EQ(r.status().kind(), ErrorKind::invalid_input) << msg;
        EXPECT_EQ(msg.rfind(dir_.file("m.gguf") + ": ", 0), 0u) << msg;
        EXPECT_NE(msg.find(needle), std::string::npos) << "message: " << msg << "\nexpected: " << needle;
    }

    std::string path(const std::string &name) const { return dir_.file(name); }

    test::TempDir dir_;
};

// A small valid file with metadata of several kinds and two tensors; the last tensor's data fills its
// aligned slot exactly, so the file has no trailing padding and every proper prefix is truncated.
Status write_small_valid_file(const std::string &path) {
    Writer w;
    w.set_string("general.architecture", "llama");
    w.set_u32("llama.block_count", 2);
    w.set_string_array("tokenizer.ggml.tokens", {"<s>", "a", "bc"});
    w.set_f32_array("tokenizer.ggml.scores", {0.0f, -1.5f, 2.25f});
    std::vector<uint8_t> q = pattern(dtype_row_bytes(DType::q8_0, 32) * 2, 1);
    w.add_tensor("q", DType::q8_0, {32, 2}, q.data(), q.size());
    std::vector<uint8_t> x = pattern(32, 2);
    w.add_tensor("x", DType::f32, {8}, x.data(), x.size());
    return w.write(path);
}

std::vector<uint8_t> small_valid_file(const std::string &path) {
    EXPECT_TRUE(write_small_valid_file(path).ok());
    return read_bytes(path);
}

// ---- round trips ----------------------------------------------------------------------------------

TEST_F(GgufTest, RoundTripEveryValueType) {
    const uint64_t big_u64 = 0xfedcba9876543210ull;
    Writer w;
    w.set_string("general.architecture", "llama");
    w.set_u8("k.u8", 250);
    w.set_i32("k.i32", -123456);
    w.set_u32("k.u32", 4000000000u);
    w.set_u64("k.u64.big", big_u64);
    w.set_u64("k.u64.small", 7);
    w.set_f32("k.f32", 0.15625f);
    w.set_bool("k.true", true);
    w.set_bool("k.false", false);
    w.set_string("k.empty", "");
    w.set_string("k.binary", std::string("a\0b", 3));
    w.set_string_array("k.strings", {"<s>", "", "▁hello", std::string(1000, 'z')});
    w.set_f32_array("k.floats", {1.0f, -2.5f, 3.0e-8f});
    w.set_i32_array("k.ints",
                    {-1, 0, std::numeric_limits<int32_t>::max(), std::numeric_limits<int32_t>::min()});
    w.set_i32_array("k.ints.empty", {});
    // Types without a setter travel through set_value.
    struct Scalar {
        const char *key;
        ValueType type;
        int64_t i;
        double f;
    };
    const Scalar scalars[] = {
        {"k.i8", ValueType::i8, -128, 0},
        {"k.u16", ValueType::u16, 65535, 0},
        {"k.i16", ValueType::i16, -32768, 0},
        {"k.i64", ValueType::i64, std::numeric_limits<int64_t>::min(), 0},
        {"k.f64", ValueType::f64, 0, 1e300},
    };
    for (const auto &s : scalars) {
        Value v;
        v.type = s.type;
        v.i = s.i;
        v.f = s.f;
        w.set_value(s.key, v);
    }
    // [[1, 2], [], [3]] of u16 and [["a"], ["b", "c"]]: nested arrays.
    Value nested;
    nested.type = ValueType::array;
    nested.elem_type = ValueType::array;
    const std::vector<std::vector<int64_t>> rows = {{1, 2}, {}, {3}};
    for (const auto &row : rows) {
        Value item;
        item.type = ValueType::array;
        item.elem_type = ValueType::u16;
        item.ints = row;
        nested.items.push_back(item);
    }
    w.set_value("k.nested", nested);
    Value u64_array;
    u64_array.type = ValueType::array;
    u64_array.elem_type = ValueType::u64;
    u64_array.ints = {std::bit_cast<int64_t>(big_u64), 5};
    w.set_value("k.u64s", u64_array);
    Value bool_array;
    bool_array.type = ValueType::array;
    bool_array.elem_type = ValueType::boolean;
    bool_array.ints = {1, 0, 1};
    w.set_value("k.bools", bool_array);
    ASSERT_TRUE(w.write(path("m.gguf")).ok());

    auto r = File::open(path("m.gguf"));
    ASSERT_TRUE(r.ok()) << r.status().message();
    const File &f = *r;
    EXPECT_EQ(f.version(), 3u);
    EXPECT_EQ(f.alignment(), 32u);
    EXPECT_FALSE(f.has("general.alignment"));  // default alignment is not written
    EXPECT_TRUE(f.tensors().empty());

    // Keys in insertion order.
    const std::vector<std::string> order = {"general.architecture",
                                            "k.u8",
                                            "k.i32",
                                            "k.u32",
                                            "k.u64.big",
                                            "k.u64.small",
                                            "k.f32",
                                            "k.true",
                                            "k.false",
                                            "k.empty",
                                            "k.binary",
                                            "k.strings",
                                            "k.floats",
                                            "k.ints",
                                            "k.ints.empty",
                                            "k.i8",
                                            "k.u16",
                                            "k.i16",
                                            "k.i64",
                                            "k.f64",
                                            "k.nested",
                                            "k.u64s",
                                            "k.bools"};
    ASSERT_EQ(f.metadata().size(), order.size());
    for (size_t i = 0; i < order.size(); ++i) EXPECT_EQ(f.metadata()[i].first, order[i]);

    EXPECT_EQ(*f.get_string("general.architecture"), "llama");
    EXPECT_EQ(f.find("k.u8")->type, ValueType::u8);
    EXPECT_EQ(*f.get_int("k.u8"), 250);
    EXPECT_EQ(*f.get_int("k.i32"), -123456);
    EXPECT_EQ(*f.get_u32("k.u32"), 4000000000u);
    EXPECT_EQ(f.find("k.u64.big")->type, ValueType::u64);
    EXPECT_EQ(static_cast<uint64_t>(f.find("k.u64.big")->i), big_u64);
    EXPECT_EQ(*f.get_int("k.u64.small"), 7);
    EXPECT_EQ(*f.get_f32("k.f32"), 0.15625f);
    EXPECT_EQ(f.find("k.f32")->type, ValueType::f32);
    EXPECT_TRUE(*f.get_bool("k.true"));
    EXPECT_FALSE(*f.get_bool("k.false"));
    EXPECT_EQ(*f.get_string("k.empty"), "");
    EXPECT_EQ(*f.get_string("k.binary"), std::string("a\0b", 3));
    EXPECT_EQ(*f.get_string_array("k.strings"),
              (std::vector<std::string>{"<s>", "", "▁hello", std::string(1000, 'z')}));
    EXPECT_EQ(*f.get_f32_array("k.floats"), (std::vector<float>{1.0f, -2.5f, 3.0e-8f}));
    EXPECT_EQ(*f.get_i32_array("k.ints"), (std::vector<int32_t>{-1, 0, std::numeric_limits<int32_t>::max(),
                                                                std::numeric_limits<int32_t>::min()}));
    EXPECT_TRUE(f.get_i32_array("k.ints.empty")->empty());
    EXPECT_EQ(f.find("k.ints.empty")->elem_type, ValueType::i32);
    for (const auto &s : scalars) {
        const Value *v = f.find(s.key);
        ASSERT_NE(v, nullptr) << s.key;
        EXPECT_EQ(v->type, s.type) << s.key;
        if (v->is_integer()) {
            EXPECT_EQ(v->i, s.i) << s.key;
        }
    }
    EXPECT_EQ(f.find("k.f64")->f, 1e300);
    EXPECT_FALSE(f.get_f32("k.f64").ok());  // 1e300 does not fit in f32

    const Value *n = f.find("k.nested");
    ASSERT_NE(n, nullptr);
    EXPECT_EQ(n->type, ValueType::array);
    EXPECT_EQ(n->elem_type, ValueType::array);
    ASSERT_EQ(n->array_size(), 3u);
    EXPECT_EQ(n->items[0].elem_type, ValueType::u16);
    EXPECT_EQ(n->items[0].ints, (std::vector<int64_t>{1, 2}));
    EXPECT_EQ(n->items[1].array_size(), 0u);
    EXPECT_EQ(n->items[2].ints, (std::vector<int64_t>{3}));

    const Value *u = f.find("k.u64s");
    ASSERT_NE(u, nullptr);
    EXPECT_EQ(static_cast<uint64_t>(u->ints[0]), big_u64);
    EXPECT_FALSE(f.get_i32_array("k.u64s").ok());
    EXPECT_EQ(f.find("k.bools")->ints, (std::vector<int64_t>{1, 0, 1}));
}

TEST_F(GgufTest, GettersNameFileAndKeyOnErrors) {
    Writer w;
    w.set_string("s", "text");
    w.set_u64("big", std::numeric_limits<uint64_t>::max());
    w.set_i32("neg", -1);
    w.set_i32("count", 12);
    w.set_string_array("arr", {"a"});
    ASSERT_TRUE(w.write(path("m.gguf")).ok());
    auto r = File::open(path("m.gguf"));
    ASSERT_TRUE(r.ok()) << r.status().message();
    const File &f = *r;
    const std::string p = path("m.gguf");

    auto missing = f.get_int("llama.block_count");
    ASSERT_FALSE(missing.ok());
    EXPECT_EQ(missing.status().kind(), ErrorKind::not_found);
    EXPECT_EQ(missing.status().message(), p + ": missing required key 'llama.block_count'");

    auto wrong = f.get_int("s");
    ASSERT_FALSE(wrong.ok());
    EXPECT_EQ(wrong.status().kind(), ErrorKind::invalid_input);
    EXPECT_EQ(wrong.status().message(), p + ": key 's' is string, expected an integer");
    EXPECT_EQ(f.get_string("arr").status().message(),
              p + ": key 'arr' is array of string, expected a string");
    EXPECT_EQ(f.get_f32_array("arr").status().message(),
              p + ": key 'arr' is array of string, expected an array of numbers");

    EXPECT_FALSE(f.get_int("big").ok());  // 2^64 - 1 does not fit in i64
    EXPECT_NE(f.get_int("big").status().message().find("18446744073709551615"), std::string::npos);
    EXPECT_FALSE(f.get_u32("big").ok());
    EXPECT_FALSE(f.get_u32("neg").ok());
    EXPECT_EQ(*f.get_u32("count"), 12u);
    EXPECT_EQ(*f.get_f32("count"), 12.0f);  // float getters accept integers
    EXPECT_EQ(*f.get_f32("big"), 18446744073709551615.0f);
    EXPECT_FALSE(f.get_bool("count").ok());

    // Optional forms: absent is nullopt, present-but-wrong is still an error.
    EXPECT_FALSE(f.get_int_opt("absent")->has_value());
    EXPECT_FALSE(f.get_f32_opt("absent")->has_value());
    EXPECT_FALSE(f.get_string_opt("absent")->has_value());
    EXPECT_FALSE(f.get_bool_opt("absent")->has_value());
    EXPECT_EQ(**f.get_int_opt("count"), 12);
    EXPECT_EQ(**f.get_string_opt("s"), "text");
    EXPECT_FALSE(f.get_int_opt("s").ok());
    EXPECT_FALSE(f.get_bool_opt("s").ok());
    EXPECT_FALSE(f.get_string_opt("count").ok());
    EXPECT_FALSE(f.get_f32_opt("s").ok());
}

TEST_F(GgufTest, TensorsRoundTripAtAlignment32And64) {
    struct Spec {
        const char *name;
        DType type;
        std::vector<int64_t> ne;
    };
    const std::vector<Spec> specs = {
        {"token_embd.weight", DType::f32, {5, 3}},        {"blk.0.attn_norm.weight", DType::f16, {7}},
        {"blk.0.attn_q.weight", DType::q4_0, {64, 3}},    {"blk.0.ffn_up.weight", DType::q8_0, {32, 2, 2}},
        {"blk.0.ffn_down.weight", DType::q6_k, {256, 1}},  // 256-element blocks
        {"blk.0.bf16", DType::bf16, {3, 1, 1, 2}},        {"ids", DType::i32, {1}},
    };
    for (size_t alignment : {size_t{32}, size_t{64}}) {
        SCOPED_TRACE(alignment);
        Writer w(alignment);
        w.set_string("general.architecture", "llama");
        std::vector<std::vector<uint8_t>> datas;
        for (size_t i = 0; i < specs.size(); ++i) {
            const auto &s = specs[i];
            int64_t rows = 1;
            for (size_t d = 1; d < s.ne.size(); ++d) rows *= s.ne[d];
            datas.push_back(pattern(dtype_row_bytes(s.type, s.ne[0]) * static_cast<size_t>(rows), 100 + i));
            w.add_tensor(s.name, s.type, s.ne, datas.back().data(), datas.back().size());
        }
        const std::string p = path("t.gguf");
        ASSERT_TRUE(w.write(p).ok());
        // Only the file itself is left (no temporary beside it).
        for (const auto &e : std::filesystem::directory_iterator(std::filesystem::path(p).parent_path()))
            EXPECT_EQ(e.path().string().find(p + "."), std::string::npos) << e.path();
        auto r = File::open(p);
        ASSERT_TRUE(r.ok()) << r.status().message();
        const File &f = *r;
        EXPECT_EQ(f.alignment(), alignment);
        if (alignment == 32) {
            EXPECT_FALSE(f.has("general.alignment"));
        } else {
            ASSERT_TRUE(f.has("general.alignment"));
            EXPECT_EQ(f.find("general.alignment")->type, ValueType::u32);  // the type llama.cpp requires
            EXPECT_EQ(*f.get_u32("general.alignment"), alignment);
        }
        EXPECT_EQ(f.data_offset() % alignment, 0u);
        ASSERT_EQ(f.tensors().size(), specs.size());
        // Tensors back to back in insertion order, each padded to the alignment, the file ending after the
        // last one's padding: the layout llama.cpp's reader requires.
        uint64_t expected_offset = 0;
        for (size_t i = 0; i < specs.size(); ++i) {
            const auto &t = f.tensors()[i];
            SCOPED_TRACE(t.name);
            EXPECT_EQ(t.name, specs[i].name);
            EXPECT_EQ(t.type, specs[i].type);
            EXPECT_EQ(t.n_dims, static_cast<int>(specs[i].ne.size()));
            for (int d = 0; d < 4; ++d)
                EXPECT_EQ(t.ne[d], d < t.n_dims ? specs[i].ne[static_cast<size_t>(d)] : 1);
            EXPECT_EQ(t.offset, expected_offset);
            EXPECT_EQ(t.offset % alignment, 0u);
            ASSERT_EQ(t.n_bytes, datas[i].size());
            EXPECT_EQ(t.data, f.tensors()[0].data + t.offset);  // zero-copy, into the mapping
            EXPECT_EQ(std::memcmp(t.data, datas[i].data(), t.n_bytes), 0);
            TensorView v = t.view();
            EXPECT_EQ(v.data, t.data);
            EXPECT_EQ(v.n_bytes(), t.n_bytes);
            EXPECT_EQ(f.find_tensor(specs[i].name), &t);
            // Padding after the data is zeros.
            size_t padded = (t.n_bytes + alignment - 1) / alignment * alignment;
            for (size_t k = t.n_bytes; k < padded; ++k) ASSERT_EQ(t.data[k], 0) << "padding byte " << k;
            expected_offset += padded;
        }
        EXPECT_EQ(f.file_size(), f.data_offset() + expected_offset);
        EXPECT_EQ(f.find_tensor("absent"), nullptr);
        EXPECT_FALSE(dtype_traits(f.find_tensor("ids")->type).supported);  // known, not computable: loads
    }
}

TEST_F(GgufTest, CopiesShareTheMappingAndOutliveTheOriginal) {
    std::vector<uint8_t> x = pattern(64, 9);
    Writer w;
    w.add_tensor("x", DType::f32, {16}, x.data(), x.size());
    ASSERT_TRUE(w.write(path("m.gguf")).ok());
    std::optional<File> copy;
    {
        auto r = File::open(path("m.gguf"));
        ASSERT_TRUE(r.ok()) << r.status().message();
        copy = *r;                                                    // copy
        File moved = std::move(*r);                                   // and move
        EXPECT_EQ(moved.tensors()[0].data, copy->tensors()[0].data);  // same mapping, no copy
    }
    ASSERT_EQ(copy->tensors().size(), 1u);
    EXPECT_EQ(std::memcmp(copy->tensors()[0].data, x.data(), x.size()), 0);
    EXPECT_EQ(copy->path(), path("m.gguf"));
}

TEST_F(GgufTest, WriterReplacesKeysInPlaceAndRefusesWhatLlamaCppWould) {
    {
        Writer w;
        w.set_u32("a", 1);
        w.set_u32("b", 2);
        w.set_string("a", "again");
        ASSERT_TRUE(w.write(path("m.gguf")).ok());
        auto r = File::open(path("m.gguf"));
        ASSERT_TRUE(r.ok()) << r.status().message();
        ASSERT_EQ(r->metadata().size(), 2u);
        EXPECT_EQ(r->metadata()[0].first, "a");
        EXPECT_EQ(*r->get_string("a"), "again");
    }
    {
        Writer w(64);
        w.set_u64("general.alignment", 64);  // agrees: written as u32
        ASSERT_TRUE(w.write(path("m.gguf")).ok());
        auto r = File::open(path("m.gguf"));
        ASSERT_TRUE(r.ok()) << r.status().message();
        EXPECT_EQ(r->find("general.alignment")->type, ValueType::u32);
        EXPECT_EQ(r->metadata().size(), 1u);
    }
    {
        Writer w(32);
        w.set_u32("general.alignment", 64);
        Status s = w.write(path("bad.gguf"));
        EXPECT_FALSE(s.ok());
        EXPECT_NE(s.message().find("general.alignment"), std::string::npos) << s.message();
        EXPECT_FALSE(std::filesystem::exists(path("bad.gguf")));
    }
    std::vector<uint8_t> x = pattern(4, 1);
    {
        Writer w;
        w.add_tensor("x", DType::f32, {1}, x.data(), x.size());
        w.add_tensor("x", DType::f32, {1}, x.data(), x.size());
        Status s = w.write(path("bad.gguf"));
        EXPECT_EQ(s.kind(), ErrorKind::invalid_input);
        EXPECT_NE(s.message().find("duplicate tensor name 'x'"), std::string::npos) << s.message();
    }
    {
        Writer w;
        w.add_tensor(std::string(64, 'n'), DType::f32, {1}, x.data(), x.size());
        Status s = w.write(path("bad.gguf"));
        EXPECT_EQ(s.kind(), ErrorKind::invalid_input);
        EXPECT_NE(s.message().find("at most 63"), std::string::npos) << s.message();
    }
    {
        Writer w;
        Status s = w.write(path("no-such-dir/m.gguf"));
        EXPECT_EQ(s.kind(), ErrorKind::io);
        EXPECT_NE(s.message().find("no-such-dir/m.gguf."), std::string::npos) << s.message();
        EXPECT_NE(s.message().find(".tmp"), std::string::npos) << s.message();
    }
}

// ---- real files -----------------------------------------------------------------------------------

// Two heads (or a head and a test) writing the same stage file at once: every write succeeds and the file is
// always whole. With one shared temporary name the writers truncated each other's file and a rename failed.
TEST_F(GgufTest, WritersOfOnePathAtOnceLeaveAWholeFile) {
    const std::string p = path("same.gguf");
    const std::vector<uint8_t> want = small_valid_file(p);
    std::atomic<int> failures{0};
    std::vector<std::thread> writers;
    for (int t = 0; t < 4; ++t)
        writers.emplace_back([&] {
            for (int i = 0; i < 50; ++i) {
                if (!write_small_valid_file(p).ok()) ++failures;
                if (read_bytes(p) != want) ++failures;
            }
        });
    for (auto &t : writers) t.join();
    EXPECT_EQ(failures.load(), 0);
}

TEST_F(GgufTest, ReadsStories260K) {
    auto r = File::open(test::shared_path("models/stories260K.gguf"));
    ASSERT_TRUE(r.ok()) << r.status().message();
    const File &f = *r;
    EXPECT_TRUE(f.version() == 2 || f.version() == 3);
    EXPECT_EQ(*f.get_string("general.architecture"), "llama");
    EXPECT_EQ(*f.get_int("llama.block_count"), 5);
    EXPECT_EQ(*f.get_u32("llama.embedding_length"), 64u);
    auto tokens = f.get_string_array("tokenizer.ggml.tokens");
    ASSERT_TRUE(tokens.ok()) << tokens.status().message();
    EXPECT_EQ(tokens->size(), 512u);
    const gguf::TensorInfo *emb = f.find_tensor("token_embd.weight");
    ASSERT_NE(emb, nullptr);
    EXPECT_EQ(emb->n_dims, 2);
    EXPECT_EQ(emb->ne[0], 64);
    EXPECT_EQ(emb->ne[1], 512);
    EXPECT_EQ(emb->n_bytes, emb->view().n_bytes());
    for (const auto &t : f.tensors())
        EXPECT_LE(f.data_offset() + t.offset + t.n_bytes, f.file_size()) << t.name;

    // llama.cpp wrote this file; carrying every key and tensor over must reproduce it byte for byte, which
    // is the strongest evidence that Writer's output is what llama.cpp reads.
    Writer w(f.alignment());
    for (const auto &[key, value] : f.metadata()) w.set_value(key, value);
    for (const auto &t : f.tensors())
        w.add_tensor(t.name, t.type, std::vector<int64_t>(t.ne, t.ne + t.n_dims), t.data, t.n_bytes);
    ASSERT_TRUE(w.write(path("copy.gguf")).ok());
    EXPECT_TRUE(read_bytes(path("copy.gguf")) == read_bytes(test::shared_path("models/stories260K.gguf")));
}

TEST_F(GgufTest, ReadsEveryVocabFile) {
    int n_files = 0;
    for (const auto &entry : std::filesystem::directory_iterator(test::shared_path("vocab"))) {
        if (entry.path().extension() != ".gguf") continue;
        ++n_files;
        auto r = File::open(entry.path().string());
        ASSERT_TRUE(r.ok()) << r.status().message();
        EXPECT_TRUE(r->tensors().empty()) << entry.path();  // vocab-only, and without trailing padding
        auto tokens = r->get_string_array("tokenizer.ggml.tokens");
        ASSERT_TRUE(tokens.ok()) << tokens.status().message();
        EXPECT_GT(tokens->size(), 1000u) << entry.path();
    }
    EXPECT_GE(n_files, 10);
}

TEST_F(GgufTest, ReadsLlamaSpmVocabAndCopiesIt) {
    auto r = File::open(test::shared_path("vocab/ggml-vocab-llama-spm.gguf"));
    ASSERT_TRUE(r.ok()) << r.status().message();
    const File &f = *r;
    auto tokens = f.get_string_array("tokenizer.ggml.tokens");
    ASSERT_TRUE(tokens.ok()) << tokens.status().message();
    ASSERT_EQ(tokens->size(), 32000u);
    auto scores = f.get_f32_array("tokenizer.ggml.scores");
    ASSERT_TRUE(scores.ok()) << scores.status().message();
    EXPECT_EQ(scores->size(), 32000u);
    auto types = f.get_i32_array("tokenizer.ggml.token_type");
    ASSERT_TRUE(types.ok()) << types.status().message();
    EXPECT_EQ(types->size(), 32000u);

    // Carry every key over to a new file; values come back identical.
    Writer w;
    for (const auto &[key, value] : f.metadata()) w.set_value(key, value);
    ASSERT_TRUE(w.write(path("vocab.gguf")).ok());
    auto c = File::open(path("vocab.gguf"));
    ASSERT_TRUE(c.ok()) << c.status().message();
    ASSERT_EQ(c->metadata().size(), f.metadata().size());
    for (size_t i = 0; i < f.metadata().size(); ++i) {
        const auto &[key, a] = f.metadata()[i];
        const auto &[key2, b] = c->metadata()[i];
        EXPECT_EQ(key, key2);
        EXPECT_EQ(a.type, b.type) << key;
        EXPECT_EQ(a.i, b.i) << key;
        EXPECT_EQ(a.str, b.str) << key;
        EXPECT_EQ(a.elem_type, b.elem_type) << key;
        EXPECT_EQ(a.strings, b.strings) << key;
        EXPECT_EQ(a.ints, b.ints) << key;
        EXPECT_EQ(a.floats, b.floats) << key;
    }
}

// ---- hostile input --------------------------------------------------------------------------------

TEST_F(GgufTest, EveryTruncationIsAnError) {
    const std::vector<uint8_t> full = small_valid_file(path("full.gguf"));
    ASSERT_TRUE(File::open(path("full.gguf")).ok());
    for (size_t n = 0; n < full.size(); ++n) {
        auto r = open_bytes({full.begin(), full.begin() + static_cast<ptrdiff_t>(n)});
        ASSERT_FALSE(r.ok()) << "prefix of " << n << " bytes of " << full.size() << " was accepted";
        EXPECT_EQ(r.status().kind(), ErrorKind::invalid_input) << r.status().message();
        EXPECT_EQ(r.status().message().rfind(path("m.gguf") + ": ", 0), 0u) << r.status().message();
    }
}

TEST_F(GgufTest, TruncationMessagesSayWhere) {
    const std::vector<uint8_t> full = small_valid_file(path("full.gguf"));
    expect_error({}, "truncated: magic at byte 0 needs 4 bytes, file is 0 bytes");
    expect_error({full.begin(), full.begin() + 10},
                 "truncated: tensor count at byte 8 needs 8 bytes, file is 10");
    expect_error({full.begin(), full.begin() + 40},
                 "truncated: header claims 4 key/value pairs, the 16 bytes");
    Bytes key;
    key.header(3, 0, 1).str("general.architecture").u32(static_cast<uint32_t>(ValueType::string)).u32(0);
    expect_error(
        key.buf,
        "truncated: key 'general.architecture', string value at byte 56 needs 8 bytes, file is 60 bytes");
    expect_error({full.begin(), full.end() - 1}, "ends at byte");
}

TEST_F(GgufTest, RejectsBadMagicAndVersions) {
    Bytes b;
    b.raw("GGML", 4).u32(3).u64(0).u64(0);
    expect_error(b.buf, "bad magic 'GGML' (not a GGUF file)");
    Bytes bin;
    bin.raw(
           "\x7f"
           "ELF",
           4)
        .u32(3)
        .u64(0)
        .u64(0);
    expect_error(bin.buf, "bad magic '\\x7fELF' (not a GGUF file)");
    expect_error(Bytes().header(1, 0, 0).buf, "GGUF version 1 is no longer supported");
    expect_error(Bytes().header(99, 0, 0).buf, "unsupported GGUF version 99");
    expect_error(Bytes().header(0, 0, 0).buf, "unsupported GGUF version 0");
    expect_error(Bytes().header(0x03000000, 0, 0).buf, "byte-swapped");
    // v2 and v3 share the layout; an empty v2 file is fine.
    auto r = open_bytes(Bytes().header(2, 0, 0).buf);
    ASSERT_TRUE(r.ok()) << r.status().message();
    EXPECT_EQ(r->version(), 2u);
}

TEST_F(GgufTest, RejectsHugeCounts) {
    expect_error(Bytes().header(3, 0, 1ull << 60).zeros(64).buf,
                 "header claims 1152921504606846976 key/value");
    expect_error(Bytes().header(3, ~0ull, 0).zeros(64).buf, "18446744073709551615 tensors");
    // Plausible counts that the rest of the file cannot hold.
    expect_error(Bytes().header(3, 0, 3).kv_u32("a", 1).zeros(20).buf, "3 key/value pairs");
    expect_error(Bytes().header(3, 2, 1).kv_u32("a", 1).zeros(40).buf, "tensors");
}

TEST_F(GgufTest, RejectsLengthsPastTheEnd) {
    // Key length past EOF.
    expect_error(Bytes().header(3, 0, 1).u64(1ull << 40).zeros(16).buf,
                 "truncated: key 0, name of 1099511627776 bytes at byte 32 runs past the end of the file");
    // String value length past EOF.
    Bytes s;
    s.header(3, 0, 1).str("general.name").u32(static_cast<uint32_t>(ValueType::string)).u64(~0ull).zeros(8);
    expect_error(s.buf, "truncated: key 'general.name', string value of 18446744073709551615 bytes");
    // Array count past EOF, for numbers and for strings.
    Bytes a;
    a.header(3, 0, 1).str("k").u32(static_cast<uint32_t>(ValueType::array));
    a.u32(static_cast<uint32_t>(ValueType::u32)).u64(1000).zeros(100);
    expect_error(a.buf, "truncated: key 'k', array of 1000 u32");
    Bytes as;
    as.header(3, 0, 1).str("tokenizer.ggml.tokens").u32(static_cast<uint32_t>(ValueType::array));
    as.u32(static_cast<uint32_t>(ValueType::string)).u64(1ull << 62).zeros(100);
    expect_error(as.buf, "array of 4611686018427387904 string");
    // An element string past EOF.
    Bytes e;
    e.header(3, 0, 1).str("k").u32(static_cast<uint32_t>(ValueType::array));
    e.u32(static_cast<uint32_t>(ValueType::string)).u64(2).str("ok").u64(500).zeros(10);
    expect_error(e.buf, "array string of 500 bytes");
    // A key longer than the limit (but inside the file).
    Bytes k;
    k.header(3, 0, 1).str(std::string(gguf::kMaxNameBytes + 1, 'k')).u32(0).zeros(1);
    expect_error(k.buf, "key 0: name is 65537 bytes long, more than the limit of 65536");
}

TEST_F(GgufTest, RejectsBadValueTypesAndDeepNesting) {
    expect_error(Bytes().header(3, 0, 1).str("k").u32(13).zeros(8).buf,
                 "key 'k' has unknown value type id 13");
    Bytes a;
    a.header(3, 0, 1).str("k").u32(static_cast<uint32_t>(ValueType::array)).u32(77).u64(0);
    expect_error(a.buf, "key 'k': array has unknown element type id 77");
    Bytes deep;
    deep.header(3, 0, 1).str("k").u32(static_cast<uint32_t>(ValueType::array));
    for (int i = 0; i < 100; ++i) deep.u32(static_cast<uint32_t>(ValueType::array)).u64(1);
    deep.u32(0).u64(0);
    expect_error(deep.buf, "arrays nested more than 8 deep");
}

TEST_F(GgufTest, RejectsBadTensorShapes) {
    const uint32_t f32 = 0, q4_0 = 2;
    auto file = [](std::vector<uint64_t> ne, uint32_t type) {
        Bytes b;
        b.header(3, 1, 0).tensor("blk.0.attn_q.weight", ne, type, 0).pad(32).zeros(4096);
        return b.buf;
    };
    expect_error(file({4, 4, 4, 4, 4}, f32),
                 "tensor 'blk.0.attn_q.weight' has 5 dimensions, expected 1 to 4");
    expect_error(file({}, f32), "has 0 dimensions");
    expect_error(file({4, 0}, f32), "tensor 'blk.0.attn_q.weight' has size 0 in dimension 1");
    expect_error(file({1ull << 32, 1ull << 32}, f32), "2^63 or more elements");
    expect_error(file({1ull << 62, 2}, f32), "2^63 or more elements");
    expect_error(file({1ull << 63, 1}, f32), "size 9223372036854775808 in dimension 0, 2^63 or more");
    expect_error(file({1ull << 61, 2}, f32), "2^64 or more bytes");  // 2^62 elements * 4 bytes
    expect_error(file({4}, 99), "tensor 'blk.0.attn_q.weight' has unknown type id 99");
    expect_error(file({4}, 4), "has unknown type id 4");  // removed from ggml
    expect_error(file({33, 2}, q4_0),
                 "of type q4_0 has 33 elements per row, not a multiple of the block size 32");
    // 1024 x 1024 f32 = 4 MiB of data in a file of about 4 KiB.
    expect_error(file({1024, 1024}, f32),
                 "tensor 'blk.0.attn_q.weight' ends at byte 4194400, file is 4192 bytes");
}

TEST_F(GgufTest, RejectsBadOffsetsAndAlignment) {
    Bytes mis;
    mis.header(3, 1, 0).tensor("x", {4}, 0, 16).pad(32).zeros(64);
    expect_error(mis.buf, "tensor 'x' offset 16 is not a multiple of the alignment 32");
    Bytes far;
    far.header(3, 1, 0).tensor("x", {4}, 0, ~0ull - 31).pad(32).zeros(64);
    expect_error(far.buf, "tensor 'x' offset 18446744073709551584 is past the end of the file");
    Bytes a64;  // offset 32 is fine at the default alignment, not at 64
    a64.header(3, 1, 1).kv_u32("general.alignment", 64).tensor("x", {4}, 0, 32).pad(64).zeros(128);
    expect_error(a64.buf, "offset 32 is not a multiple of the alignment 64");
    for (uint32_t bad : {0u, 3u, 48u}) {
        Bytes b;
        b.header(3, 0, 1).kv_u32("general.alignment", bad);
        expect_error(b.buf, fmt::format("general.alignment is {}, expected a nonzero power of two", bad));
    }
    Bytes s;
    s.header(3, 0, 1).str("general.alignment").u32(static_cast<uint32_t>(ValueType::string)).str("32");
    expect_error(s.buf, "general.alignment is string, expected u32");
    // A valid alignment of 64 moves the data section.
    Bytes ok;
    ok.header(3, 1, 1).kv_u32("general.alignment", 64).tensor("x", {4}, 0, 64).pad(64).zeros(64);
    std::vector<uint8_t> data = pattern(16, 3);
    ok.raw(data.data(), data.size()).pad(64);
    auto r = open_bytes(ok.buf);
    ASSERT_TRUE(r.ok()) << r.status().message();
    EXPECT_EQ(r->alignment(), 64u);
    EXPECT_EQ(r->data_offset() % 64, 0u);
    EXPECT_EQ(std::memcmp(r->tensors()[0].data, data.data(), 16), 0);
}

TEST_F(GgufTest, RejectsDuplicates) {
    Bytes k;
    k.header(3, 0, 2).kv_u32("llama.block_count", 1).kv_u32("llama.block_count", 2);
    expect_error(k.buf, "duplicate key 'llama.block_count'");
    Bytes t;
    t.header(3, 2, 0).tensor("x", {8}, 0, 0).tensor("x", {8}, 0, 32).pad(32).zeros(64);
    expect_error(t.buf, "duplicate tensor name 'x'");
}

// Byte flips, extreme field values and truncations of a valid file: every result is ok or an error, and
// an accepted file's tensors all lie inside it. Run under ASan this is what catches out-of-bounds reads.
TEST_F(GgufTest, RandomMutationsNeverCrash) {
    const std::vector<uint8_t> full = small_valid_file(path("full.gguf"));
    std::mt19937_64 rng(20240601);
    int n_ok = 0, n_err = 0;
    for (int iter = 0; iter < 3000; ++iter) {
        std::vector<uint8_t> bytes = full;
        int n_mutations = 1 + static_cast<int>(rng() % 4);
        for (int m = 0; m < n_mutations && !bytes.empty(); ++m) {
            size_t at = rng() % bytes.size();
            switch (rng() % 4) {
                case 0:
                    bytes[at] = static_cast<uint8_t>(rng());
                    break;
                case 1:
                    bytes[at] ^= static_cast<uint8_t>(1u << (rng() % 8));
                    break;
                case 2: {  // an extreme 8-byte field (counts, lengths, ne, offsets)
                    const uint64_t extremes[] = {0, 1, 0x7fffffffffffffffull, ~0ull, 1ull << 32, 31, 33};
                    uint64_t v = extremes[rng() % 7];
                    size_t n = std::min<size_t>(8, bytes.size() - at);
                    std::memcpy(bytes.data() + at, &v, n);
                    break;
                }
                default:
                    bytes.resize(at);
                    break;
            }
        }
        auto r = open_bytes(bytes);
        if (!r.ok()) {
            ++n_err;
            EXPECT_EQ(r.status().message().rfind(path("m.gguf") + ": ", 0), 0u) << r.status().message();
            continue;
        }
        ++n_ok;
        uint32_t sum = 0;
        for (const auto &t : r->tensors()) {
            ASSERT_LE(r->data_offset() + t.offset + t.n_bytes, r->file_size()) << t.name;
            for (size_t k = 0; k < t.n_bytes; ++k) sum += t.data[k];  // touch every byte
        }
        for (const auto &[key, v] : r->metadata())
            sum += static_cast<uint32_t>(v.array_size() + v.str.size());
        (void)sum;
    }
    EXPECT_GT(n_err, 0);
    EXPECT_GT(n_ok, 0);  // flips inside string bytes and tensor data keep the file valid
}

}  // namespace
}  // namespace td
