// The GGUF reader and what reads a model's metadata from it: the vocabulary, the hyperparameters and the
// chat template. An input is a whole file (kept in a memfd, opened by path as a real file would be).
#include <sys/mman.h>
#include <unistd.h>

#include <string>

#include "fuzz-util.h"
#include "gguf/gguf.h"
#include "model/hparams.h"
#include "text/chat-template.h"
#include "text/vocab.h"

using namespace td;

TD_FUZZ_INIT(gguf) {
    std::vector<fuzz::Bytes> seeds;
    const std::string dir = std::filesystem::temp_directory_path() / "td-fuzz-gguf-seeds";
    std::filesystem::create_directories(dir);
    {
        gguf::Writer w;
        w.set_string("general.architecture", "llama");
        w.set_u32("llama.block_count", 2);
        w.set_u32("llama.embedding_length", 64);
        w.set_u32("llama.attention.head_count", 4);
        w.set_u32("llama.attention.head_count_kv", 2);
        w.set_u32("llama.feed_forward_length", 128);
        w.set_u32("llama.context_length", 256);
        w.set_f32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
        w.set_string("tokenizer.ggml.model", "llama");
        w.set_string_array("tokenizer.ggml.tokens", {"<unk>", "<s>", "</s>", "a", "b", "ab"});
        w.set_f32_array("tokenizer.ggml.scores", {0, 0, 0, -1, -2, -3});
        w.set_string("tokenizer.chat_template", "{% for m in messages %}<|im_start|>{{ m.role }}{% endfor %}");
        std::vector<uint8_t> t(64 * 4, 1);
        w.add_tensor("token_embd.weight", DType::f32, {64, 1}, t.data(), t.size());
        const std::string p = dir + "/a.gguf";
        if (w.write(p).ok()) {
            std::ifstream in(p, std::ios::binary);
            seeds.emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
        }
    }
    fuzz::write_seeds_and_exit_if_asked(seeds);
    return 0;
}

TD_FUZZ_TARGET(gguf) {
    const int fd = ::memfd_create("td-fuzz-gguf", MFD_CLOEXEC);
    if (fd < 0) return 0;
    size_t off = 0;
    while (off < size) {
        const ssize_t n = ::write(fd, data + off, size - off);
        if (n <= 0) break;
        off += static_cast<size_t>(n);
    }
    auto f = gguf::File::open("/proc/self/fd/" + std::to_string(fd));
    if (f.ok()) {
        for (const auto &[key, value] : f->metadata()) (void)key;
        for (const auto &t : f->tensors()) (void)t.view();
        (void)Vocab::from_gguf(*f);
        if (auto arch = f->get_string("general.architecture"); arch.ok()) (void)read_hparams(*f, *arch);
        (void)chat_template_for_model(*f, "");
    }
    ::close(fd);
    return 0;
}
