// The tandem binary as a user runs it: real processes, real files, exit codes and messages.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>

#include "gguf/gguf.h"
#include "test-util.h"

namespace td {
namespace {

const char *kStories = "models/stories260K.gguf";

void write_bytes(const std::string &path, const std::string &bytes) {
    std::ofstream out(path, std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A copy of stories260K through the writer, with `edit` applied to each key (return false to drop it).
std::string rewrite(const test::TempDir &dir, const std::string &name,
                    const std::function<bool(const std::string &, gguf::Value &)> &edit) {
    auto f = gguf::File::open(test::shared_path(kStories));
    EXPECT_TRUE(f.ok());
    gguf::Writer w;
    for (auto [key, value] : f->metadata())
        if (edit(key, value)) w.set_value(key, value);
    for (const auto &t : f->tensors())
        w.add_tensor(t.name, t.type, std::vector<int64_t>(t.ne, t.ne + t.n_dims), t.data, t.n_bytes);
    const std::string path = dir.file(name);
    EXPECT_TRUE(w.write(path).ok());
    return path;
}

// A bad input ends with exit code 1 and one line "tandem: error: ..." mentioning `needle`; never a signal.
void expect_clean_failure(const std::vector<std::string> &args, const std::string &needle) {
    test::ProcessResult r = test::run_tandem(args);
    ASSERT_FALSE(r.signaled) << "killed by signal " << r.signal << "\n" << r.err;
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_EQ(r.err.rfind("tandem: error: ", 0), 0u) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_NE(r.err.find(needle), std::string::npos) << "expected '" << needle << "' in: " << r.err;
}

class Cli : public ::testing::Test {
protected:
    void SetUp() override {
        if (!test::shared_exists(kStories)) GTEST_SKIP() << "no ../shared/" << kStories;
        stories = test::shared_path(kStories);
        bytes = test::read_file(stories);
    }
    std::string stories, bytes;
    test::TempDir dir;
};

TEST_F(Cli, RunGreedyPrintsTheReferenceText) {
    test::ProcessResult r = test::run_tandem(
        {"run", "-m", stories, "-p", "Once upon a time", "-n", "64", "--temp", "0", "-t", "1"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out,
              ", there was a little girl named Lily. She loved to play outside in the park. One day, she saw "
              "a big, red "
              "ball. She wanted to play with it, but it was too high.\nLily's mom said\n");
    EXPECT_NE(r.err.find("tokens/s"), std::string::npos) << r.err;
}

TEST_F(Cli, SameSeedSameText) {
    std::vector<std::string> args = {"run",    "-m", stories,  "-p", "Once upon a time", "-n", "32",
                                     "--seed", "7",  "--temp", "1.0"};
    test::ProcessResult a = test::run_tandem(args), b = test::run_tandem(args);
    ASSERT_EQ(a.exit_code, 0) << a.err;
    EXPECT_EQ(a.out, b.out);
    args[9] = "8";
    test::ProcessResult c = test::run_tandem(args);
    EXPECT_NE(a.out, c.out);
}

TEST_F(Cli, TokenizePrintsIds) {
    test::ProcessResult r = test::run_tandem({"tokenize", "-m", stories, "-p", "Once upon a time"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out, "1 403 407 261 378\n");
    r = test::run_tandem({"tokenize", "-m", stories, "-p", "Once upon a time", "--no-bos"});
    EXPECT_EQ(r.out, "403 407 261 378\n");
}

TEST_F(Cli, InfoDescribesTheModel) {
    test::ProcessResult r = test::run_tandem({"info", stories});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    for (const char *s :
         {"llama", "layers:        5", "embedding:     64", "8 query, 4 key/value", "f32", "per layer"})
        EXPECT_NE(r.out.find(s), std::string::npos) << s << "\n" << r.out;
}

TEST_F(Cli, SynthWritesALoadableModel) {
    const std::string out = dir.file("q8.gguf");
    test::ProcessResult r =
        test::run_tandem({"synth", "-o", out, "--dim", "64", "--layers", "2", "--heads", "4", "--kv-heads",
                          "2", "--ffn", "128", "--vocab-from", stories, "--type", "q8_0"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    r = test::run_tandem({"run", "-m", out, "-p", "Once upon a time", "-n", "8", "--temp", "0"});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    r = test::run_tandem({"info", out});
    EXPECT_NE(r.out.find("q8_0"), std::string::npos) << r.out;
}

TEST_F(Cli, UnreadablePath) {
    expect_clean_failure({"run", "-m", dir.file("missing.gguf"), "-p", "hi"}, "missing.gguf");
}

TEST_F(Cli, TruncatedFile) {
    const std::string p = dir.file("trunc.gguf");
    write_bytes(p, bytes.substr(0, bytes.size() / 2));
    expect_clean_failure({"run", "-m", p, "-p", "hi"}, "trunc.gguf");
}

TEST_F(Cli, WrongMagic) {
    const std::string p = dir.file("magic.gguf");
    std::string b = bytes;
    std::memcpy(b.data(), "GGML", 4);
    write_bytes(p, b);
    expect_clean_failure({"run", "-m", p, "-p", "hi"}, "magic");
}

TEST_F(Cli, TensorPastEndOfFile) {
    const std::string p = dir.file("short.gguf");
    write_bytes(p, bytes.substr(0, bytes.size() - 64));
    expect_clean_failure({"run", "-m", p, "-p", "hi"}, "tensor");
}

TEST_F(Cli, UnknownTensorType) {
    const std::string p = dir.file("type.gguf");
    std::string b = bytes;
    const std::string name = "output_norm.weight";
    size_t at = b.find(name);
    ASSERT_NE(at, std::string::npos);
    size_t type_at = at + name.size() + 4 + 8;  // n_dims (u32) = 1, ne[0] (u64), then the type (u32)
    uint32_t n_dims;
    std::memcpy(&n_dims, b.data() + at + name.size(), 4);
    ASSERT_EQ(n_dims, 1u);
    const uint32_t bad = 99;
    std::memcpy(b.data() + type_at, &bad, 4);
    write_bytes(p, b);
    expect_clean_failure({"run", "-m", p, "-p", "hi"}, "99");
}

TEST_F(Cli, MissingRequiredKey) {
    const std::string p = rewrite(
        dir, "nokey.gguf", [](const std::string &k, gguf::Value &) { return k != "llama.block_count"; });
    expect_clean_failure({"run", "-m", p, "-p", "hi"}, "llama.block_count");
}

TEST_F(Cli, ShapeDoesNotMatchHyperparameters) {
    const std::string p = rewrite(dir, "shape.gguf", [](const std::string &k, gguf::Value &v) {
        if (k == "llama.feed_forward_length") v.i = 100;
        return true;
    });
    expect_clean_failure({"run", "-m", p, "-p", "hi"}, "shape");
}

TEST_F(Cli, PromptLongerThanContext) {
    expect_clean_failure(
        {"run", "-m", stories, "-c", "8", "-p", "Once upon a time there was a little girl named Lily"},
        "context");
}

TEST_F(Cli, BadFlagValue) {
    test::ProcessResult r = test::run_tandem({"run", "-m", stories, "-n", "lots"});
    EXPECT_FALSE(r.signaled);
    EXPECT_NE(r.exit_code, 0);
}

}  // namespace
}  // namespace td
