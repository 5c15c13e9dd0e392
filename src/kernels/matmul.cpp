// y = x W^T for any supported weight type, split over output rows.
//
// The activations are quantized once per call to the weight's vec_dot_type (q8_0 for q4_0 weights, ...);
// then every output element y[t][o] is one vec_dot(W row o, x row t). No element is ever split across
// threads or summed from partial results, so y does not depend on the thread count or on which tokens share
// the batch: the same token gives the same bits alone or in a batch of 100.
#include <algorithm>
#include <cstdint>

#include "core/check.h"
#include "kernels/gemm.h"
#include "kernels/kernels.h"
#include "kernels/pack.h"

#if TD_KERNELS_X86
#include "kernels/x86/kernels-x86.h"
#endif

namespace td::kernels {
namespace {

// Output rows per work item: a multiple of the tile kernels' panels (32 rows for the VNNI kernels), enough
// to amortise the scheduling; parallel_for hands them out in shrinking chunks.
constexpr int64_t kRowsPerChunk = 32;
static_assert(kRowsPerChunk % kPackRows == 0);

}  // namespace

GemmFn gemm_for(DType type) {
    if (GemmFn kq = gemm_kquants_for(type); kq != nullptr) return kq;
#if TD_KERNELS_X86
    const Isa isa = isa_active();
    if (isa != Isa::avx2 && isa != Isa::avx512) return nullptr;
    if (avx512_vnni_active()) {
        if (type == DType::q4_0) return avx512::gemm_q4_0_q8_0;
        if (type == DType::q5_0) return avx512::gemm_q5_0_q8_0;
        if (type == DType::q8_0) return avx512::gemm_q8_0_q8_0;
        if (type == DType::q4_1) return avx512::gemm_q4_1_q8_1;
        if (type == DType::q5_1) return avx512::gemm_q5_1_q8_1;
    }
    if (type == DType::q4_0) return avx2::gemm_q4_0_q8_0;
    if (type == DType::q5_0) return avx2::gemm_q5_0_q8_0;
    if (type == DType::q8_0) return avx2::gemm_q8_0_q8_0;
    if (type == DType::q4_1) return avx2::gemm_q4_1_q8_1;
    if (type == DType::q5_1) return avx2::gemm_q5_1_q8_1;
#else
    (void)type;
#endif
    return nullptr;
}

namespace {

// Everything the worker lambda needs, captured through one pointer so std::function does not allocate.
struct MatmulJob {
    const TypeKernels *kernels;
    GemmFn gemm;       // nullptr: vec_dot per element
    const uint8_t *w;  // [n_out][w_row_bytes]
    size_t w_row_bytes;
    // Packed weights (kernels/pack.h) with neither a packed kernel for this batch nor a tile kernel that
    // reads packed groups (gemm_from_packed_for): each chunk of rows is unpacked into a per-thread buffer
    // first, then `gemm` (a row-major kernel) runs on it.
    bool unpack;
    const uint8_t *x;  // [n_tokens][x_row_bytes], in kernels->vec_dot_type
    size_t x_row_bytes;
    float *y;  // [n_tokens][n_out]
    int64_t n_in;
    int64_t n_out;
    int64_t n_tokens;
};

// Rows [row_begin, row_end) of y from row-major weight rows; w points at row row_begin.
void compute_rows(const MatmulJob &job, const uint8_t *w, int64_t row_begin, int64_t row_end) {
    if (job.gemm != nullptr) {
        job.gemm(job.n_in, w, job.w_row_bytes, job.x, job.x_row_bytes, job.y + row_begin, job.n_out,
                 row_end - row_begin, job.n_tokens);
        return;
    }
    // Token-outer: the chunk's weight rows are reused from cache by every token.
    for (int64_t t = 0; t < job.n_tokens; ++t) {
        const uint8_t *xt = job.x + static_cast<size_t>(t) * job.x_row_bytes;
        float *yt = job.y + t * job.n_out;  // [n_out]
        for (int64_t o = row_begin; o < row_end; ++o)
            job.kernels->vec_dot(job.n_in, &yt[o], w + static_cast<size_t>(o - row_begin) * job.w_row_bytes,
                                 xt);
    }
}

void matmul_rows(const MatmulJob &job, int64_t row_begin, int64_t row_end) {
    if (!job.unpack) {
        compute_rows(job, job.w + static_cast<size_t>(row_begin) * job.w_row_bytes, row_begin, row_end);
        return;
    }
    // Row chunks start on a packed group (kRowsPerChunk is a multiple of kPackRows); one chunk at a time
    // keeps the buffer in cache. It grows once per thread, then is reused.
    thread_local std::vector<uint8_t> rows;  // [kRowsPerChunk][w_row_bytes]
    if (rows.size() < kRowsPerChunk * job.w_row_bytes) rows.resize(kRowsPerChunk * job.w_row_bytes);
    for (int64_t r = row_begin; r < row_end; r += kRowsPerChunk) {
        const int64_t n = std::min(kRowsPerChunk, row_end - r);
        unpack_rows(job.kernels->type, job.w, job.n_in, r, n, rows.data());
        compute_rows(job, rows.data(), r, r + n);
    }
}

}  // namespace

namespace {

// The job for one matrix (its kernels, packed or not), without the activations.
MatmulJob make_job(const TensorView &w, float *y, int64_t n_tokens) {
    const int64_t n_in = w.ne[0];
    const int64_t n_out = w.ne[1];
    TD_ASSERT(w.ne[2] == 1 && w.ne[3] == 1, "matmul: {} is not a matrix ({} x {} x {} x {})", w.name, w.ne[0],
              w.ne[1], w.ne[2], w.ne[3]);
    TD_ASSERT(n_tokens >= 0 && n_in > 0 && n_out >= 0, "matmul: {} n_in {} n_out {} n_tokens {}", w.name,
              n_in, n_out, n_tokens);
    const TypeKernels *k = type_kernels(w.type);
    TD_ASSERT(k != nullptr, "matmul: {} has type {}, which has no kernels", w.name, dtype_name(w.type));
    const DTypeTraits &wt = dtype_traits(w.type);
    TD_ASSERT(n_in % wt.block_size == 0, "matmul: {} row length {} is not a multiple of {}'s block size {}",
              w.name, n_in, wt.name, wt.block_size);
    const size_t w_align = w.type == DType::f32 ? alignof(float) : alignof(uint16_t);
    TD_ASSERT(reinterpret_cast<uintptr_t>(w.data) % w_align == 0, "matmul: {} data is not {}-byte aligned",
              w.name, w_align);

    MatmulJob job{};
    job.kernels = k;
    // One token: a matrix-vector kernel (or vec_dot per row); a tile kernel only pays when rows are reused.
    job.gemm = n_tokens > 1 ? gemm_for(w.type) : gemv_for(w.type);
    job.w = static_cast<const uint8_t *>(w.data);
    if (w.packed != nullptr) {
        TD_ASSERT(packable(w.type, n_in, n_out), "matmul: {} is packed but {} [{} rows] has no packed layout",
                  w.name, dtype_name(w.type), n_out);
        job.w = static_cast<const uint8_t *>(w.packed);
        const GemmFn packed = gemm_packed_for(w.type, n_tokens);
        const GemmFn from_packed = packed == nullptr ? gemm_from_packed_for(w.type) : nullptr;
        job.unpack = packed == nullptr && from_packed == nullptr;
        if (packed != nullptr) job.gemm = packed;
        if (from_packed != nullptr) job.gemm = from_packed;
    }
    job.w_row_bytes = w.row_bytes();
    job.y = y;
    job.n_in = n_in;
    job.n_out = n_out;
    job.n_tokens = n_tokens;
    return job;
}

// x [n_tokens][n_in] f32 in the vec_dot_type of k: the f32 rows themselves, or each row quantized once into
// scratch. Sets *row_bytes.
const uint8_t *prepare_x(const TypeKernels *k, const float *x, int64_t n_in, int64_t n_tokens,
                         ThreadPool &pool, std::vector<uint8_t> &scratch, size_t *row_bytes) {
    if (k->vec_dot_type == DType::f32) {
        *row_bytes = static_cast<size_t>(n_in) * sizeof(float);
        return reinterpret_cast<const uint8_t *>(x);
    }
    const TypeKernels *kx = type_kernels(k->vec_dot_type);
    TD_ASSERT(kx != nullptr, "no kernels for vec_dot_type {}", dtype_name(k->vec_dot_type));
    *row_bytes = dtype_row_bytes(k->vec_dot_type, n_in);
    const size_t need = *row_bytes * static_cast<size_t>(n_tokens);
    if (scratch.size() < need) scratch.resize(need);
    uint8_t *xq = scratch.data();  // [n_tokens][row_bytes]
    if (n_tokens == 1) {
        kx->from_float(x, xq, n_in);
        return xq;
    }
    struct QuantizeJob {
        const TypeKernels *kx;
        const float *x;
        uint8_t *xq;
        int64_t n_in;
        size_t row_bytes;
    } qjob{kx, x, xq, n_in, *row_bytes};
    pool.parallel_for(n_tokens, [q = &qjob](int64_t begin, int64_t end) {
        for (int64_t t = begin; t < end; ++t)
            q->kx->from_float(q->x + t * q->n_in, q->xq + static_cast<size_t>(t) * q->row_bytes, q->n_in);
    });
    return xq;
}

// Work items of a job: groups of kRowsPerChunk rows, so every chunk but the last starts and ends on a panel.
int64_t n_items(const MatmulJob &job) {
    return (job.n_out + kRowsPerChunk - 1) / kRowsPerChunk;
}

void run_items(const MatmulJob &job, int64_t begin, int64_t end) {
    matmul_rows(job, begin * kRowsPerChunk, std::min(end * kRowsPerChunk, job.n_out));
}

}  // namespace

void matmul(const TensorView &w, const float *x, float *y, int64_t n_tokens, ThreadPool &pool,
            std::vector<uint8_t> &scratch) {
    const MatmulOut out{&w, y};
    matmul_group(&out, 1, x, n_tokens, pool, scratch);
}

void matmul_group(const MatmulOut *outs, int n_outs, const float *x, int64_t n_tokens, ThreadPool &pool,
                  std::vector<uint8_t> &scratch) {
    constexpr int kMaxOuts = 4;
    TD_ASSERT(n_outs >= 1 && n_outs <= kMaxOuts, "matmul_group: {} matrices (1 to {})", n_outs, kMaxOuts);
    MatmulJob jobs[kMaxOuts];
    for (int i = 0; i < n_outs; ++i) jobs[i] = make_job(*outs[i].w, outs[i].y, n_tokens);
    // One quantized x serves every matrix only if they agree on its length and type; else one call each.
    for (int i = 1; i < n_outs; ++i) {
        if (jobs[i].n_in != jobs[0].n_in || jobs[i].kernels->vec_dot_type != jobs[0].kernels->vec_dot_type) {
            for (int j = 0; j < n_outs; ++j) matmul_group(&outs[j], 1, x, n_tokens, pool, scratch);
            return;
        }
    }
    if (n_tokens == 0) return;
    size_t x_row_bytes = 0;
    const uint8_t *xq = prepare_x(jobs[0].kernels, x, jobs[0].n_in, n_tokens, pool, scratch, &x_row_bytes);
    int64_t total = 0;
    for (int i = 0; i < n_outs; ++i) {
        jobs[i].x = xq;
        jobs[i].x_row_bytes = x_row_bytes;
        total += n_items(jobs[i]);
    }
    if (total == 0) return;

    // The matrices' items back to back, handed out as one range: one dispatch (one wait) for all of them,
    // and the threads finish together at the end of the last one instead of at the end of each.
    struct Group {
        const MatmulJob *jobs;
        int n;
    } group{jobs, n_outs};
    pool.parallel_for(total, [g = &group](int64_t begin, int64_t end) {
        int64_t first = 0;  // global index of job i's item 0
        for (int i = 0; i < g->n && begin < end; ++i) {
            const int64_t items = n_items(g->jobs[i]);
            if (begin < first + items) {
                const int64_t e = std::min(end, first + items);
                run_items(g->jobs[i], begin - first, e - first);
                begin = e;
            }
            first += items;
        }
    });
}

}  // namespace td::kernels
