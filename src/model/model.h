// A loaded model: hyperparameters plus views of the weights inside the mmapped GGUF (never copied).
// A model can be opened for a range of layers [first, last) so a pipeline stage maps only what it runs;
// the embedding is bound only when first == 0 and the output head only when last == n_layer.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "gguf/gguf.h"
#include "model/arch/arch.h"
#include "model/hparams.h"
#include "model/tp-slice.h"
#include "model/weight-pack.h"
#include "tensor/tensor.h"

namespace td {

struct LayerWeights {
    TensorView attn_norm;       // [n_embd] f32
    TensorView wq, wk, wv;      // [n_embd_q | n_embd_kv rows of n_embd]
    TensorView bq, bk, bv;      // optional biases [n_embd_q | n_embd_kv] f32 (qwen2)
    TensorView q_norm, k_norm;  // optional per-head RMSNorm weights [head_dim] f32 (qwen3)
    TensorView wo;              // [n_embd rows of n_embd_q]
    TensorView attn_post_norm;  // optional RMSNorm weight of the attention output [n_embd] f32 (gemma2)
    TensorView ffn_norm;        // [n_embd] f32
    TensorView w_gate, w_up;    // [n_ff rows of n_embd]
    TensorView w_down;          // [n_embd rows of n_ff]
    TensorView ffn_post_norm;   // optional RMSNorm weight of the FFN output [n_embd] f32 (gemma2)
    bool loaded = false;
};

struct ModelLoadOptions {
    int32_t layer_first = 0;
    int32_t layer_last = -1;  // -1: through the last layer
    // Where packed copies of the range's q4_0 matrices are cached (model/weight-pack.h); empty: no packing,
    // matmul reads the GGUF rows. Packing that fails (read-only disk, full disk) is logged, not an error.
    std::string pack_dir;
    // Ask for 2 MiB pages for the matrices streamed every token (core/mmap.h MappedFile::prefer_huge_pages);
    // the embedding stays in 4 KiB pages.
    bool huge_pages = true;
};

class Model {
public:
    // Opens and validates the file: known architecture, hyperparameters, every tensor of the range present
    // with the shape the hyperparameters imply and a type tandem computes. Errors name the file and tensor:
    //   "m.gguf: tensor 'blk.0.attn_q.weight' has shape [64, 32], expected [64, 64]".
    static Result<std::shared_ptr<Model>> load(const std::string &path, const ModelLoadOptions &options = {});
    // Same, on an already opened file.
    static Result<std::shared_ptr<Model>> load(gguf::File file, const ModelLoadOptions &options = {});

    const HParams &hparams() const { return hp_; }
    // The tensor-parallel slice the file holds (model/tp-slice.h): the whole model unless it is a slice file.
    // Matrices are bound with the slice's shapes: wq [n_embd rows of n_q], wk/wv [.. n_kv], wo [n_q rows of
    // n_embd] (a partial sum), gate/up [.. n_ff], down [n_ff rows of n_embd], output [.. n_vocab] (local sizes).
    const TpSlice &slice() const { return slice_; }
    bool is_slice() const { return !tp_slice_is_whole(slice_, hp_); }
    int32_t n_head_local() const { return slice_.n_kv() * hp_.n_gqa(); }
    int32_t n_head_kv_local() const { return slice_.n_kv(); }
    int32_t n_embd_q_local() const { return n_head_local() * hp_.head_dim; }
    int32_t n_embd_kv_local() const { return slice_.n_kv() * hp_.head_dim; }
    int32_t n_ff_local() const { return slice_.n_ff(); }
    int32_t n_vocab_local() const { return slice_.n_vocab(); }
    const Architecture &arch() const { return *arch_; }
    const gguf::File &file() const { return file_; }
    int32_t layer_first() const { return layer_first_; }
    int32_t layer_last() const { return layer_last_; }

    const TensorView &tok_embd() const { return tok_embd_; }        // [n_vocab rows of n_embd]; first == 0
    const TensorView &output_norm() const { return output_norm_; }  // [n_embd] f32; last == n_layer
    const TensorView &output() const { return output_; }            // [n_vocab rows of n_embd] (maybe tied)
    const LayerWeights &layer(int32_t il) const { return layers_[il]; }  // absolute layer index
    const float *rope_freq_factors() const { return rope_freqs_.empty() ? nullptr : rope_freqs_.data(); }

    // Bytes of weights of one layer / of the embedding and output head (for info and placement).
    size_t layer_weight_bytes(int32_t il) const;
    size_t tensor_bytes_total() const;
    // What packing did (n_tensors == 0: nothing packed).
    const PackResult &pack() const { return pack_; }

private:
    Model() = default;
    Status bind(const ModelLoadOptions &options);
    void pack_matrices(const std::string &dir);
    void advise_pages();
    // Copies the norms and biases (small f32 tensors spread between the matrices) into small_ with plain
    // reads. Read through the mapping, each would map the page-cache folio around it: 2 MiB, not 4 KiB, where
    // the kernel caches the file in large folios, so RSS would grow by 2 MiB per norm.
    Status own_small_tensors();

    gguf::File file_;
    const Architecture *arch_ = nullptr;
    HParams hp_;
    TpSlice slice_;
    int32_t layer_first_ = 0, layer_last_ = 0;
    TensorView tok_embd_, output_norm_, output_;
    std::vector<LayerWeights> layers_;  // [n_layer]; only the range is bound
    std::vector<float> rope_freqs_;     // [n_rot/2] llama3 frequency factors, or empty
    std::vector<float>
        small_;        // the range's norms and biases (own_small_tensors), each at a multiple of 16 floats
    PackResult pack_;  // owns the mapping the views' packed pointers point into
};

}  // namespace td
