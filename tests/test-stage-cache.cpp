// The worker's bounded cache dir: eviction in least-recently-used order, the size cap and the free-disk floor
// each tested at the limit and one past (free space injected), files in use kept; then real workers with
// --cache-max: a stage one byte over the cap is refused with nothing written, one that fits evicts the older
// stage, and --cache-min-free over the disk is refused naming the free space; the head's own stage files stay
// within twice the model.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <thread>

#include "cluster/cluster-engine.h"
#include "cluster/fingerprint.h"
#include "cluster/stage-cache.h"
#include "core/size.h"
#include "model/model.h"
#include "model/synth.h"
#include "test-child-process.h"
#include "test-util.h"

namespace td::cluster {
namespace {

namespace fs = std::filesystem;

const std::string kModel = "models/stories260K.gguf";

// A file of `bytes` bytes written and last used `age_s` seconds ago.
void make_file(const std::string &path, size_t bytes, int age_s) {
    fs::create_directories(fs::path(path).parent_path());
    std::ofstream(path, std::ios::binary) << std::string(bytes, 'x');
    timespec then{};
    clock_gettime(CLOCK_REALTIME, &then);
    then.tv_sec -= age_s;
    const timespec times[2] = {then, then};
    ASSERT_EQ(utimensat(AT_FDCWD, path.c_str(), times, 0), 0);
}

StageCacheOptions with_free(uint64_t max_bytes, uint64_t min_free, uint64_t *free_bytes) {
    StageCacheOptions o;
    o.max_bytes = max_bytes;
    o.min_free_bytes = min_free;
    o.free_space = [free_bytes](const std::string &) -> Result<uint64_t> { return *free_bytes; };
    return o;
}

std::vector<std::string> names(const StageCache &c) {
    std::vector<std::string> out;
    for (const CacheFile &f : c.files()) out.push_back(fs::path(f.path).filename().string());
    return out;
}

TEST(StageCache, ListsCacheFilesOldestFirst) {
    test::TempDir dir;
    make_file(dir.file("a.gguf"), 100, 30);
    make_file(dir.file("packed/b.tdpack"), 50, 10);
    make_file(dir.file("c.gguf"), 10, 20);
    make_file(dir.file("c.gguf.part"), 5, 40);
    make_file(dir.file("notes.txt"), 1000, 50);  // not the cache's
    uint64_t free_bytes = 1 << 20;
    StageCache c(dir.path(), with_free(0, 0, &free_bytes));
    EXPECT_EQ(names(c), (std::vector<std::string>{"c.gguf.part", "a.gguf", "c.gguf", "b.tdpack"}));
    EXPECT_EQ(c.used_bytes(), 165u);
}

TEST(StageCache, TheCapEvictsLeastRecentlyUsedAndIsExactAtItsLimit) {
    test::TempDir dir;
    make_file(dir.file("old.gguf"), 100, 30);
    make_file(dir.file("mid.gguf"), 100, 20);
    make_file(dir.file("new.gguf"), 100, 10);
    uint64_t free_bytes = 1 << 30;
    StageCache c(dir.path(), with_free(400, 0, &free_bytes));
    EXPECT_TRUE(c.make_room(100, {}).ok());  // 300 + 100 = the cap: nothing to evict
    EXPECT_EQ(names(c).size(), 3u);
    EXPECT_TRUE(c.make_room(101, {}).ok());  // one past: the oldest goes
    EXPECT_EQ(names(c), (std::vector<std::string>{"mid.gguf", "new.gguf"}));
    const auto written = fs::last_write_time(dir.file("mid.gguf"));
    StageCache::touch(dir.file("mid.gguf"));  // used now: new.gguf is the least recent
    EXPECT_EQ(fs::last_write_time(dir.file("mid.gguf")), written);  // part of its identity: left alone
    EXPECT_TRUE(c.make_room(250, {}).ok());
    EXPECT_EQ(names(c), (std::vector<std::string>{"mid.gguf"}));
}

TEST(StageCache, FilesInUseAreKeptAndAStageOverTheCapIsRefusedWithNothingEvicted) {
    test::TempDir dir;
    make_file(dir.file("a.gguf"), 100, 30);
    make_file(dir.file("b.gguf"), 100, 20);
    uint64_t free_bytes = 1 << 30;
    StageCache c(dir.path(), with_free(300, 0, &free_bytes));
    auto over = c.make_room(301, {});
    ASSERT_FALSE(over.ok());
    EXPECT_EQ(over.kind(), ErrorKind::overloaded);
    EXPECT_NE(over.message().find("--cache-max"), std::string::npos) << over.message();
    EXPECT_EQ(names(c).size(), 2u);
    // a.gguf in use: only b.gguf may go, and 100 in use + 201 is one past the cap.
    auto beside = c.make_room(201, {dir.file("a.gguf")});
    ASSERT_FALSE(beside.ok());
    EXPECT_NE(beside.message().find("in use"), std::string::npos) << beside.message();
    EXPECT_EQ(names(c).size(), 2u);
    EXPECT_TRUE(c.make_room(200, {dir.file("a.gguf")}).ok());
    EXPECT_EQ(names(c), (std::vector<std::string>{"a.gguf"}));
}

TEST(StageCache, TheFreeDiskFloorIsExactAndEvictsToKeepIt) {
    test::TempDir dir;
    make_file(dir.file("a.gguf"), 100, 30);
    make_file(dir.file("b.gguf"), 100, 20);
    uint64_t free_bytes = 1000;
    StageCache c(dir.path(), with_free(0, 500, &free_bytes));
    EXPECT_TRUE(c.make_room(500, {}).ok());  // 1000 free - 500 = the floor
    EXPECT_EQ(names(c).size(), 2u);
    // One past with nothing to give back beyond 200: refused, nothing evicted.
    auto refused = c.make_room(701, {});
    ASSERT_FALSE(refused.ok());
    EXPECT_NE(refused.message().find("kept free"), std::string::npos) << refused.message();
    EXPECT_EQ(names(c).size(), 2u);
    // 501 needs one byte more than the disk has over the floor: the oldest file goes (the fake disk does not
    // see it freed, but the cache counts it).
    EXPECT_TRUE(c.make_room(501, {}).ok());
    EXPECT_EQ(names(c), (std::vector<std::string>{"b.gguf"}));
}

TEST(StageCache, SizesParseWithUnits) {
    EXPECT_EQ(*parse_byte_size("0"), 0u);
    EXPECT_EQ(*parse_byte_size("4096"), 4096u);
    EXPECT_EQ(*parse_byte_size("64K"), 65536u);
    EXPECT_EQ(*parse_byte_size("1.5G"), 3ull << 29);
    EXPECT_EQ(*parse_byte_size("20GiB"), 20ull << 30);
    EXPECT_EQ(*parse_byte_size("2TB"), 2ull << 40);
    for (const char *bad : {"", "G", "-1G", "5X", "1.2.3"}) {
        auto r = parse_byte_size(bad);
        ASSERT_FALSE(r.ok()) << bad;
        EXPECT_NE(r.status().message().find("is not a size"), std::string::npos);
    }
}

// ---- a cache dir shared with other processes -------------------------------------------------------------

std::string read_all(std::FILE *f) {
    std::string out;
    char buf[256];
    for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) out.append(buf, n);
    return out;
}

// Writes `path` as the writers do (a whole file, renamed into place), then, the first `evictions` times,
// removes it again as another head's make_room would before this one opens it.
struct EvictedMaker {
    std::string path;
    int evictions = 0;
    int made = 0;
    Status operator()() {
        ++made;
        make_file(path + ".tmp", 1000, 0);
        fs::rename(path + ".tmp", path);
        if (made <= evictions) fs::remove(path);
        return {};
    }
};

TEST(StageCache, AFileEvictedBeforeItIsOpenedIsMadeAgainAndTheOpenHandleOutlivesTheNextEviction) {
    test::TempDir dir;
    EvictedMaker maker{dir.file("a.gguf"), kMaxMakes - 1};
    auto f = open_or_make(maker.path, nullptr, std::ref(maker));
    ASSERT_TRUE(f.ok()) << f.status().message();
    EXPECT_EQ(maker.made, kMaxMakes);
    fs::remove(maker.path);  // evicted again while it streams: the handle still reads the whole file
    EXPECT_EQ(read_all(f->get()), std::string(1000, 'x'));
}

TEST(StageCache, AFileEvictedAfterEveryMakeIsAnErrorNamingItsDir) {
    test::TempDir dir;
    EvictedMaker maker{dir.file("a.gguf"), kMaxMakes};
    auto f = open_or_make(maker.path, nullptr, std::ref(maker));
    ASSERT_FALSE(f.ok());
    EXPECT_EQ(maker.made, kMaxMakes);
    EXPECT_NE(
        f.status().message().find("a.gguf: gone again after being made 4 times (another process evicting "
                                  "from " +
                                  dir.path()),
        std::string::npos)
        << f.status().message();
}

TEST(StageCache, AUsableFileIsOpenedAsItIsAndAnUnusableOneIsMadeAgain) {
    test::TempDir dir;
    EvictedMaker maker{dir.file("a.gguf")};
    make_file(maker.path, 10, 0);
    auto kept = open_or_make(
        maker.path, [](const std::string &) { return true; }, std::ref(maker));
    ASSERT_TRUE(kept.ok());
    EXPECT_EQ(maker.made, 0);
    EXPECT_EQ(read_all(kept->get()), std::string(10, 'x'));
    auto remade = open_or_make(
        maker.path, [](const std::string &p) { return fs::file_size(p) == 1000; }, std::ref(maker));
    ASSERT_TRUE(remade.ok());
    EXPECT_EQ(maker.made, 1);
    EXPECT_EQ(read_all(remade->get()), std::string(1000, 'x'));
    // A make that fails is the error, nothing retried.
    auto failed =
        open_or_make(dir.file("b.gguf"), nullptr, [] { return make_error(ErrorKind::io, "disk full"); });
    ASSERT_FALSE(failed.ok());
    EXPECT_EQ(failed.status().message(), "disk full");
}

// ---- real workers ----------------------------------------------------------------------------------------

struct CappedWorker {
    test::ChildProcess proc;
    std::string address;
    CappedWorker(const std::string &cache_dir, const std::string &cache_max, const std::string &min_free = "0") {
        proc.start({"worker", "--listen", "127.0.0.1:0", "--cache-dir", cache_dir, "-t", "1", "--no-repack",
                    "--cache-max", cache_max, "--cache-min-free", min_free},
                   "listening on ");
        address = proc.ready_text();
    }
};

// Layers [first, last) of the test model as the head would stream them: the file's size.
uint64_t stage_size(const test::TempDir &dir, int32_t first, int32_t last) {
    auto f = gguf::File::open(test::shared_path(kModel));
    EXPECT_TRUE(f.ok());
    auto m = Model::load(test::shared_path(kModel));
    EXPECT_TRUE(m.ok());
    const std::string path = dir.file(fmt::format("stage-{}-{}.gguf", first, last));
    EXPECT_TRUE(write_stage_file(*f, first, last, (*m)->hparams().n_layer, path).ok());
    return fs::file_size(path);
}

size_t gguf_files(const std::string &dir) {
    size_t n = 0;
    std::error_code ec;
    for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator();
         it.increment(ec))
        n += it->path().extension() == ".gguf" || it->path().extension() == ".part";
    return n;
}

// A head that runs layers [0, head_layers) itself and gives the rest to `worker` (stage_dir: where the head
// writes the stage files it streams; "": its default).
Status connect_with(const std::string &worker, int32_t head_layers, const std::string &stage_dir = "",
                    const std::string &model_path = test::shared_path(kModel)) {
    auto model = Model::load(model_path);
    if (!model.ok()) return model.status();
    ClusterOptions o;
    o.secret = test::test_secret();
    o.workers = worker;
    o.head_layers = head_layers;
    o.head_threads = 1;
    o.context.n_ctx = 64;
    o.print_placement = false;
    o.stage_dir = stage_dir;
    auto e = ClusterEngine::create(std::shared_ptr<const Model>(*model), o);
    return e.status();
}

TEST(StageCacheWorker, AStageOverTheCapIsRefusedUnwrittenAndOneThatFitsEvictsTheOlder) {
    if (!test::shared_exists(kModel)) GTEST_SKIP() << "missing " << kModel;
    test::TempDir dir;
    const uint64_t all = stage_size(dir, 0, 5);  // the whole model (5 layers) on the worker
    const uint64_t part = stage_size(dir, 2, 5);  // layers 2-4, the head running 0-1
    ASSERT_GT(all, part);

    CappedWorker tight(dir.file("tight"), std::to_string(all - 1));
    ASSERT_TRUE(tight.proc.running()) << tight.proc.log();
    const auto t0 = std::chrono::steady_clock::now();
    Status s = connect_with(tight.address, 0);
    ASSERT_FALSE(s.ok());
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
    EXPECT_NE(s.message().find("worker " + tight.address), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("--cache-max"), std::string::npos) << s.message();
    EXPECT_EQ(gguf_files(dir.file("tight")), 0u);
    EXPECT_TRUE(tight.proc.running());
    // At the cap exactly, it fits.
    CappedWorker exact(dir.file("exact"), std::to_string(all));
    ASSERT_TRUE(connect_with(exact.address, 0).ok());
    EXPECT_EQ(gguf_files(dir.file("exact")), 1u);

    // The cap holds either stage but not both: each load evicts the other, and a cache hit evicts nothing.
    CappedWorker w(dir.file("lru"), std::to_string(all + part - 1));
    ASSERT_TRUE(w.proc.running()) << w.proc.log();
    auto held = [&] {
        std::vector<uint64_t> sizes;
        for (const CacheFile &f : StageCache(dir.file("lru"), {}).files()) sizes.push_back(f.bytes);
        return sizes;
    };
    ASSERT_TRUE(connect_with(w.address, 0).ok());
    ASSERT_TRUE(connect_with(w.address, 0).ok());
    EXPECT_EQ(held(), std::vector<uint64_t>{all});
    ASSERT_TRUE(connect_with(w.address, 2).ok());
    EXPECT_EQ(held(), std::vector<uint64_t>{part});
    ASSERT_TRUE(connect_with(w.address, 0).ok());
    EXPECT_EQ(held(), std::vector<uint64_t>{all});
}

size_t packed_files(const std::string &dir) {
    size_t n = 0;
    std::error_code ec;
    for (auto it = fs::directory_iterator(dir + "/packed", ec); !ec && it != fs::directory_iterator();
         it.increment(ec))
        n += it->path().extension() == ".tdpack";
    return n;
}

// A stage served from the cache keeps the identity its packed weights are keyed on: the second load reuses
// them (once, every load packed the stage anew into another file, and a long-lived worker filled its disk).
TEST(StageCacheWorker, ACachedStageReusesItsPackedWeights) {
    test::TempDir dir;
    SynthParams sp;
    sp.n_layer = 2;
    sp.type = DType::q4_0;
    sp.vocab_from = test::shared_path(kModel);
    if (!test::shared_exists(kModel)) GTEST_SKIP() << "missing " << kModel;
    const std::string model = dir.file("q4_0.gguf");
    ThreadPool pool(1);
    ASSERT_TRUE(synth_model(sp, model, pool).ok());
    test::ChildProcess w;
    w.start({"worker", "--listen", "127.0.0.1:0", "--cache-dir", dir.file("cache"), "-t", "1"},
            "listening on ");
    ASSERT_TRUE(w.running()) << w.log();
    ASSERT_TRUE(connect_with(w.ready_text(), 0, dir.file("head"), model).ok());
    const size_t packed = packed_files(dir.file("cache"));
    if (packed == 0) GTEST_SKIP() << "this CPU has no packed kernel for q4_0: nothing to pack";
    EXPECT_EQ(packed, 1u);
    for (int again = 0; again < 2; ++again) {
        ASSERT_TRUE(connect_with(w.ready_text(), 0, dir.file("head"), model).ok());
        EXPECT_EQ(packed_files(dir.file("cache")), 1u) << "load " << again + 2;
    }
}

TEST(StageCacheWorker, AFreeDiskFloorOverTheDiskIsRefusedNamingTheFreeSpace) {
    if (!test::shared_exists(kModel)) GTEST_SKIP() << "missing " << kModel;
    test::TempDir dir;
    CappedWorker w(dir.file("cache"), "0", "1000T");
    ASSERT_TRUE(w.proc.running()) << w.proc.log();
    Status s = connect_with(w.address, 0);
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.message().find("kept free"), std::string::npos) << s.message();
    EXPECT_EQ(gguf_files(dir.file("cache")), 0u);
}

// The head's stage files are a cache too: before it writes another, the least recently used go, so the
// directory holds at most twice the model file beside the files the head streams.
TEST(StageCacheHead, TheHeadsStageFilesStayWithinTwiceTheModel) {
    if (!test::shared_exists(kModel)) GTEST_SKIP() << "missing " << kModel;
    test::TempDir dir;
    const uint64_t model_bytes = fs::file_size(test::shared_path(kModel));
    const std::string head = dir.file("head");
    make_file(head + "/old.gguf", model_bytes, 300);
    make_file(head + "/older-still.gguf", model_bytes, 400);
    make_file(head + "/recent.gguf", model_bytes, 100);
    CappedWorker w(dir.file("worker"), "0");
    ASSERT_TRUE(w.proc.running()) << w.proc.log();
    ASSERT_TRUE(connect_with(w.address, 0, head).ok());
    const std::vector<std::string> held = names(StageCache(head, {}));
    ASSERT_EQ(held.size(), 2u);
    EXPECT_EQ(held[0], "recent.gguf");  // the newest of the old ones stays, then the one just streamed
    EXPECT_LE(StageCache(head, {}).used_bytes(), 2 * model_bytes);
    EXPECT_EQ(gguf_files(dir.file("worker")), 1u);
    // Streamed again (the worker's cache emptied): the file is reused, nothing more is evicted.
    fs::remove_all(dir.file("worker"));
    CappedWorker again(dir.file("worker"), "0");
    ASSERT_TRUE(connect_with(again.address, 0, head).ok());
    EXPECT_EQ(names(StageCache(head, {})), held);
}

}  // namespace
}  // namespace td::cluster
