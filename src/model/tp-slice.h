// Tensor-parallel slices: the part of every layer one rank of a tensor-parallel group holds.
//
// A rank owns whole KV-head groups (KV heads [kv_first, kv_last) and their n_gqa query heads each), so its KV
// cache holds only those heads; FFN rows [ff_first, ff_last) of gate and up and the same columns of down; and
// output-head rows [vocab_first, vocab_last). Per layer, with x the (replicated) residual stream:
//
//   q, k, v = rows of Wq, Wk, Wv (+ the same elements of the biases)     -> attention over the rank's heads
//   partial = Wo[:, rank's query columns] · attn                         -> all_reduce_sum -> x += sum
//   g, u    = rows of W_gate, W_up;  partial = W_down[:, rank's rows] · act(g) * u -> all_reduce_sum -> x += sum
//
// Norms are applied to the reduced sums (gemma2's post-norms too), so they are computed once per rank on the
// same bits, never added N times. The output head gives each rank logits for its vocabulary rows
// (model/tp-sample.h merges them).
//
// A slice file is a GGUF holding one rank's tensors of a layer range, already cut (row slices as rows,
// column slices as shorter rows), with the full model's metadata plus the tandem.tp.* keys below, so
// Model::load maps only the slice and the packed-weight cache packs only the slice.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "gguf/gguf.h"
#include "model/hparams.h"

namespace td {

struct TpSlice {
    int32_t kv_first = 0, kv_last = 0;        // KV heads [first, last) of n_head_kv
    int32_t ff_first = 0, ff_last = 0;        // FFN rows [first, last) of n_ff
    int32_t vocab_first = 0, vocab_last = 0;  // output-head rows [first, last) of n_vocab

    int32_t n_kv() const { return kv_last - kv_first; }
    int32_t n_ff() const { return ff_last - ff_first; }
    int32_t n_vocab() const { return vocab_last - vocab_first; }
    bool operator==(const TpSlice &) const = default;
};

// Keys a slice file carries (i32 arrays [first, last]); the vocabulary only when it holds the output head.
inline constexpr const char *kTpKeyKvHeads = "tandem.tp.kv_heads";
inline constexpr const char *kTpKeyFf = "tandem.tp.ff";
inline constexpr const char *kTpKeyVocab = "tandem.tp.vocab";

TpSlice tp_slice_whole(const HParams &hp);
bool tp_slice_is_whole(const TpSlice &slice, const HParams &hp);
// "kv 0-1 ff 0-95 vocab 0-255" (inclusive), for tables and messages.
std::string tp_slice_str(const TpSlice &slice);

// Rows of FFN a slice boundary must be a multiple of for `file`'s layers [first, last): 16 (the packed
// kernels' row groups) and the block of every ffn_down type (its columns are cut), whichever is larger.
int32_t tp_ff_unit(const gguf::File &file, int32_t layer_first, int32_t layer_last);
inline constexpr int32_t kTpVocabUnit = 16;

// Splits hp's KV heads, FFN rows and vocabulary over shares.size() ranks in proportion to `shares`
// (positive; e.g. each node's measured speed), in whole units: a KV head (with its query heads), ff_unit
// FFN rows, kTpVocabUnit vocabulary rows (the last rank also takes what is left of n_ff and n_vocab past
// the last whole unit). Every rank gets at least one unit of each, in rank order. Errors (invalid_input):
// more ranks than KV heads ("3 KV heads cannot be split over 4 nodes"), or than FFN / vocabulary units.
Result<std::vector<TpSlice>> tp_split(const HParams &hp, const std::vector<double> &shares, int32_t ff_unit);

// Reads the tandem.tp.* keys: the whole model when there are none. Errors name the file and key (a range
// outside the model's sizes, or not on the units above).
Result<TpSlice> tp_slice_read(const gguf::File &file, const HParams &hp);

// One tensor of a slice file: where its bytes come from in the whole model's file.
struct TpSliceTensor {
    enum class Cut { whole, rows, cols };
    std::string name;                // in the slice file (the output head is always "output.weight")
    const gguf::TensorInfo *src = nullptr;  // in the whole model's file
    DType type = DType::f32;
    std::vector<int64_t> ne;         // the slice's shape
    size_t n_bytes = 0;
    Cut cut = Cut::whole;
    int64_t first = 0, last = 0;     // rows or columns [first, last) of src
    // Calls fn(offset, bytes) for each run of the slice's bytes, in order, with offsets from the start of src's
    // data: one run for a whole tensor or a row cut, one per row for a column cut. The slice file's bytes are
    // those runs back to back (the writer reads them with pread, the fingerprint hashes them in the mapping).
    template <typename Fn>
    void for_each_span(Fn &&fn) const;
};

// The tensors of the slice file of layers [layer_first, layer_last), in the order the file holds them (the
// whole file's order; output.weight last). Errors (invalid_input): a slice outside the model, a cut that
// is not on the tensor's block boundaries, a missing output head.
Result<std::vector<TpSliceTensor>> tp_slice_plan(const gguf::File &file, const HParams &hp, int32_t layer_first,
                                                 int32_t layer_last, const TpSlice &slice);

// Bytes a decoding step streams of a planned slice: every tensor but the token embedding, of which a step
// reads one row per token (the output head, tied or not, is output.weight and counted).
uint64_t tp_streamed_bytes(const std::vector<TpSliceTensor> &plan);

// Writes the slice file of layers [layer_first, layer_last) of `file` for `slice` (see above). Tensors are
// read with pread, one at a time, so writing maps nothing of `file` into memory and holds one tensor.
// The embedding is whole (layer_first == 0); the output head (layer_last == n_layer) is written as
// output.weight with the slice's rows (of token_embd.weight when the model ties them). Errors: io, naming
// the path; invalid_input for a slice the model's shapes do not allow.
Status tp_write_slice_file(const gguf::File &file, const HParams &hp, int32_t layer_first, int32_t layer_last,
                           const TpSlice &slice, const std::string &path);

}  // namespace td

namespace td {

template <typename Fn>
void TpSliceTensor::for_each_span(Fn &&fn) const {
    const size_t row_bytes = dtype_row_bytes(src->type, src->ne[0]);
    switch (cut) {
        case Cut::whole:
            fn(size_t{0}, src->n_bytes);
            break;
        case Cut::rows:
            fn(row_bytes * static_cast<size_t>(first), n_bytes);
            break;
        case Cut::cols: {
            const size_t skip = dtype_row_bytes(src->type, first), keep = dtype_row_bytes(src->type, last - first);
            const size_t n_rows = src->n_bytes / row_bytes;
            for (size_t r = 0; r < n_rows; ++r) fn(r * row_bytes + skip, keep);
            break;
        }
    }
}

}  // namespace td
