// Packed weights end to end (model/weight-pack.h): a q4_0 model loaded with a pack dir computes the same
// logits bit for bit as the rows, for prompts of every batch size the kernels treat differently; the cache
// file is written once and reused; a damaged cache file is rewritten; where the dir cannot be written (a full
// disk) the packed copies are made in memory.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/thread-pool.h"
#include "kernels/pack.h"
#include "model/batch.h"
#include "model/context.h"
#include "model/model.h"
#include "model/synth.h"
#include "test-util.h"

namespace td {
namespace {

// A q4_0 model (every matrix packable) or a q4_k_m mix (q4_k and q6_k matrices; packed only where the CPU has
// the packed K-quant kernels).
class WeightPack : public ::testing::TestWithParam<const char *> {
protected:
    void SetUp() override {
        if (!test::shared_exists("models/stories260K.gguf")) GTEST_SKIP();
        SynthParams sp;
        const bool kquant = std::string(GetParam()) != "q4_0";
        sp.n_embd = kquant ? 256 : 64;  // K-quant rows are whole super-blocks of 256
        sp.n_layer = 2;
        sp.n_head = 4;
        sp.n_head_kv = 2;
        sp.n_ff = kquant ? 512 : 96;
        sp.n_ctx = 128;
        ASSERT_TRUE(synth_parse_type(GetParam(), sp).ok());
        sp.vocab_from = test::shared_path("models/stories260K.gguf");
        ThreadPool pool(2);
        ASSERT_TRUE(synth_model(sp, model_path_, pool).ok());
    }

    // Logits of a prompt of n_prompt tokens (one batch), then of 3 greedy one-token steps.
    std::vector<float> logits(const ModelLoadOptions &lo, int n_prompt) {
        auto m = Model::load(model_path_, lo);
        EXPECT_TRUE(m.ok()) << m.status().message();
        last_pack_ = (*m)->pack();
        ThreadPool pool(2);
        ContextParams cp;
        cp.n_ctx = 64;
        auto c = Context::create(*m, cp, pool);
        EXPECT_TRUE(c.ok());
        Context &ctx = **c;
        const int32_t nv = ctx.model().hparams().n_vocab;
        Batch b;
        for (int i = 0; i < n_prompt; ++i) b.add(1 + (i * 37) % 500, i, 0, true);
        std::vector<float> all;
        for (int step = 0; step < 4; ++step) {
            EXPECT_TRUE(ctx.decode(b, nullptr).ok());
            all.insert(all.end(), ctx.logits(), ctx.logits() + static_cast<size_t>(ctx.n_outputs()) * nv);
            const float *row = ctx.logits() + static_cast<size_t>(ctx.n_outputs() - 1) * nv;
            const int32_t next = static_cast<int32_t>(std::max_element(row, row + nv) - row);
            const int32_t pos = b.pos.back() + 1;
            b.clear();
            b.add(next, pos, 0, true);
        }
        return all;
    }

    // Matrices a full load packs: 7 per layer and the output head, those of types the CPU has kernels for.
    size_t expected_packed(int32_t first, int32_t last) {
        auto m = Model::load(model_path_, {first, last, ""});
        EXPECT_TRUE(m.ok());
        size_t n = 0;
        for (const auto &t : (*m)->file().tensors()) {
            const bool in_range = t.name == "output.weight"      ? last == 2
                                  : t.name.rfind("blk.", 0) == 0 ? std::stoi(t.name.substr(4)) >= first &&
                                                                       std::stoi(t.name.substr(4)) < last
                                                                 : false;
            if (in_range && t.n_dims == 2 && kernels::packable(t.type, t.ne[0], t.ne[1]) &&
                kernels::pack_pays(t.type))
                ++n;
        }
        return n;
    }

    test::TempDir dir_;
    std::string model_path_ = dir_.file("model.gguf");
    PackResult last_pack_;
};

TEST_P(WeightPack, PackedModelGivesBitIdenticalLogits) {
    const std::string pack_dir = dir_.file("packed");
    for (int n_prompt : {1, 5, 16, 40}) {  // the packed kernels, and the unpack-then-GEMM path
        const std::vector<float> rows = logits({}, n_prompt);
        EXPECT_EQ(last_pack_.n_tensors, 0u);
        const std::vector<float> packed = logits({0, -1, pack_dir}, n_prompt);
        EXPECT_EQ(last_pack_.n_tensors, expected_packed(0, 2));
        ASSERT_EQ(rows.size(), packed.size());
        EXPECT_EQ(0, std::memcmp(rows.data(), packed.data(), rows.size() * sizeof(float)))
            << "prompt of " << n_prompt;
    }
}

TEST_P(WeightPack, CacheFileIsWrittenOnceThenReused) {
    const std::string pack_dir = dir_.file("packed");
    if (expected_packed(0, 2) == 0) GTEST_SKIP() << "this CPU packs none of " << GetParam() << "'s types";
    const std::vector<float> first = logits({0, -1, pack_dir}, 3);
    EXPECT_FALSE(last_pack_.reused);
    ASSERT_TRUE(std::filesystem::exists(last_pack_.path));
    const auto written = std::filesystem::last_write_time(last_pack_.path);
    const std::vector<float> second = logits({0, -1, pack_dir}, 3);
    EXPECT_TRUE(last_pack_.reused);
    EXPECT_EQ(written, std::filesystem::last_write_time(last_pack_.path));
    EXPECT_EQ(first, second);
    // A layer range packs only its own matrices, into a file of its own.
    auto stage = Model::load(model_path_, {1, 2, pack_dir});
    ASSERT_TRUE(stage.ok());
    EXPECT_EQ((*stage)->pack().n_tensors, expected_packed(1, 2));
    if (expected_packed(1, 2) > 0) {
        EXPECT_NE((*stage)->pack().path, last_pack_.path);
    }
}

TEST_P(WeightPack, DamagedCacheFileIsRewritten) {
    const std::string pack_dir = dir_.file("packed");
    if (expected_packed(0, 2) == 0) GTEST_SKIP() << "this CPU packs none of " << GetParam() << "'s types";
    const std::vector<float> good = logits({0, -1, pack_dir}, 3);
    const std::string path = last_pack_.path;
    for (int damage = 0; damage < 2; ++damage) {
        if (damage == 0) {
            std::filesystem::resize_file(path, std::filesystem::file_size(path) / 2);  // truncated
        } else {
            std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
            f.seekp(0);
            f.write("XXXX", 4);  // bad magic
        }
        const std::vector<float> again = logits({0, -1, pack_dir}, 3);
        EXPECT_FALSE(last_pack_.reused) << "damage " << damage;
        EXPECT_EQ(good, again) << "damage " << damage;
    }
}

TEST_P(WeightPack, UnwritableDirPacksInMemory) {
    const std::string blocker = dir_.file("not-a-dir");
    std::ofstream(blocker) << "x";
    const std::vector<float> rows = logits({}, 3);
    const std::vector<float> fallback = logits({0, -1, blocker + "/packed"}, 3);
    EXPECT_EQ(last_pack_.n_tensors, expected_packed(0, 2));
    if (last_pack_.n_tensors > 0) {
        EXPECT_NE(last_pack_.memory, nullptr);
        EXPECT_EQ(last_pack_.map, nullptr);
        EXPECT_TRUE(last_pack_.path.empty());
        EXPECT_NE(last_pack_.unwritten.find("cannot write the packed weights"), std::string::npos)
            << last_pack_.unwritten;
    }
    EXPECT_EQ(rows, fallback);
}

INSTANTIATE_TEST_SUITE_P(Types, WeightPack, ::testing::Values("q4_0", "q4_k_m"));

}  // namespace
}  // namespace td
