// What a pipeline stage needs from a model file, and the content hash both sides compare.
//
// A stage running layers [first, last) of an n_layer model needs:
//   blk.<il>.*                    for il in [first, last)
//   token_embd.weight             when first == 0 (embedding), or last == n_layer without output.weight
//   (tied) output_norm.weight, output.weight   when last == n_layer rope_freqs.weight             always when
//   present (every layer's RoPE reads it)
// The fingerprint is xxh3-64 over those tensors in file order: for each, its name, dtype id, dims and bytes.
// The head hashes its own file; a worker with its own copy hashes the same tensors; a streamed stage file
// (the same tensors, in the same order) hashes the same. Equal fingerprints mean equal weights.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "gguf/gguf.h"
#include "model/tp-slice.h"

namespace td::cluster {

// Tensors of the stage, in file order. Missing ones are simply absent (Model::load reports them).
std::vector<const gguf::TensorInfo *> stage_tensors(const gguf::File &file, int32_t layer_first,
                                                    int32_t layer_last, int32_t n_layer);

// Reads the stage's bytes through `file`'s mapping and unmaps them from this process as it goes (32 MiB at a
// time; the page cache keeps them), so hashing a range does not leave it resident.
uint64_t stage_fingerprint(const gguf::File &file, int32_t layer_first, int32_t layer_last, int32_t n_layer);

// Sum of the stage's tensor bytes (its weight memory).
uint64_t stage_weight_bytes(const gguf::File &file, int32_t layer_first, int32_t layer_last, int32_t n_layer);

// Writes a GGUF holding all of `file`'s metadata and only the stage's tensors (same names, types, shapes and
// order), which Model::load opens with the same layer range. Errors: i/o naming `path`.
Status write_stage_file(const gguf::File &file, int32_t layer_first, int32_t layer_last, int32_t n_layer,
                        const std::string &path);

// The fingerprint of a tensor-parallel slice file (model/tp-slice.h tp_slice_plan), computed from the whole
// model (`file`, whose pages it unmaps tensor by tensor once hashed) without writing the file:
// stage_fingerprint of the slice file once written gives the same value.
uint64_t slice_fingerprint(const gguf::File &file, const std::vector<TpSliceTensor> &plan);

// 16 lowercase hex digits (also the cache file name: <hex>.gguf)
std::string fingerprint_hex(uint64_t fp);

}  // namespace td::cluster
