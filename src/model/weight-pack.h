// Packed weights: the q4_0 matrices of a model regrouped into kernels/pack.h's layout, kept in a cache file
// next to nothing else and mmapped, so the weights stay mmapped (never copied into the process) and a second
// start packs nothing.
//
// The cache file is <dir>/<key>.tdpack, where the key hashes the GGUF's identity (device, inode, size,
// modification time) and the packed tensors' names, types, shapes and offsets: a changed or different file
// gets a new key. Layout: a 64-byte header (magic "TDPACK\0\0", version, key, tensor count, data bytes), then
// each tensor's packed bytes in list order, each starting on a 64-byte boundary. It is written to a temporary
// name and renamed, so readers never see half a file, and two processes packing at once both succeed.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/mmap.h"
#include "core/status.h"
#include "gguf/gguf.h"
#include "tensor/tensor.h"

namespace td {

struct PackResult {
    std::shared_ptr<MappedFile> map;     // keeps the packed bytes the views point at mapped
    std::shared_ptr<HugeBuffer> memory;  // or holds them, where the cache file could not be written
    std::string unwritten;               // then: why not (the write's error)
    std::string path;
    size_t n_tensors = 0;
    size_t n_bytes = 0;
    bool reused = false;  // found in the cache, nothing packed
};

// Points `views[i]->packed` at packed copies of those views that kernels::packable accepts and the active ISA
// has a packed kernel for (kernels::pack_pays; others are left alone), reading the tensors from `file` with
// plain reads (so packing does not fault the GGUF's mapping into this process) and writing or reusing the
// cache file in `dir` (created when missing). Returns how many were packed; n_tensors == 0 and no file when
// none qualifies. Where the cache file cannot be written (a full disk), the packed copies are made in memory
// instead (`memory`, `unwritten` says why): they then cost RAM and are packed again at the next start. Errors
// (io) name the path; the views are unchanged then, and matmul runs on the rows as before.
Result<PackResult> pack_weights(const gguf::File &file, const std::vector<TensorView *> &views,
                                const std::string &dir);

}  // namespace td
