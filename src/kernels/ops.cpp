// The row ops of kernels/ops.h: each calls the active ISA's variant where one exists, else the reference.
#include "kernels/ops.h"

#include "core/check.h"
#include "kernels/kernels.h"
#include "kernels/ref/ops-ref.h"

#if TD_KERNELS_X86
#include "kernels/x86/kernels-x86.h"
#endif
#if TD_KERNELS_ARM
#include "kernels/arm/kernels-arm.h"
#endif

namespace td::kernels {

#if TD_KERNELS_X86
namespace {

bool use_avx2() {
    const Isa isa = isa_active();
    return isa == Isa::avx2 || isa == Isa::avx512;
}

}  // namespace
#endif

void rmsnorm(const float *x, const float *w, float *y, int64_t n, float eps) {
#if TD_KERNELS_X86
    if (use_avx2()) return avx2::rmsnorm(x, w, y, n, eps);
#endif
#if TD_KERNELS_ARM
    if (isa_active() == Isa::neon) return neon::rmsnorm(x, w, y, n, eps);
#endif
    ref::rmsnorm(x, w, y, n, eps);
}

void rope(float *x, int32_t n_head, int32_t head_dim, int32_t pos, const RopeParams &p) {
    TD_ASSERT(p.n_rot > 0 && p.n_rot <= head_dim && p.n_rot % 2 == 0 && p.n_rot <= 1024,
              "rope: n_rot {} head_dim {}", p.n_rot, head_dim);
#if TD_KERNELS_X86
    if (use_avx2()) return avx2::rope(x, n_head, head_dim, pos, p);
#endif
#if TD_KERNELS_ARM
    if (isa_active() == Isa::neon) return neon::rope(x, n_head, head_dim, pos, p);
#endif
    ref::rope(x, n_head, head_dim, pos, p);
}

void softmax(float *x, int64_t n) {
    ref::softmax(x, n);
}

void swiglu(const float *gate, const float *up, float *out, int64_t n) {
#if TD_KERNELS_X86
    if (use_avx2()) return avx2::swiglu(gate, up, out, n);
#endif
#if TD_KERNELS_ARM
    if (isa_active() == Isa::neon) return neon::swiglu(gate, up, out, n);
#endif
    ref::swiglu(gate, up, out, n);
}

void add_inplace(float *y, const float *x, int64_t n) {
#if TD_KERNELS_X86
    if (use_avx2()) return avx2::add_inplace(y, x, n);
#endif
#if TD_KERNELS_ARM
    if (isa_active() == Isa::neon) return neon::add_inplace(y, x, n);
#endif
    ref::add_inplace(y, x, n);
}

void attention_head(const float *q, const void *k, const void *v, bool kv_f16, int64_t kv_stride,
                    int32_t head_dim, int32_t n_kv, float scale, float softcap, float *scores, float *out) {
    attention_group(q, 1, k, v, kv_f16, kv_stride, head_dim, n_kv, scale, softcap, scores, out);
}

void attention_group(const float *q, int32_t n_q, const void *k, const void *v, bool kv_f16,
                     int64_t kv_stride, int32_t head_dim, int32_t n_kv, float scale, float softcap,
                     float *scores, float *out) {
    TD_ASSERT(n_q >= 1, "attention_group: {} query heads", n_q);
    TD_ASSERT(head_dim > 0 && head_dim <= 1024 && n_kv >= 0, "attention_group: head_dim {} n_kv {}", head_dim,
              n_kv);
    TD_ASSERT(softcap >= 0.0f, "attention_group: softcap {}", softcap);
#if TD_KERNELS_X86
    if (kv_f16 && isa_active() == Isa::avx512 &&
        avx512::attention_group_f16(q, n_q, k, v, kv_stride, head_dim, n_kv, scale, softcap, scores, out))
        return;
    if (use_avx2())
        return avx2::attention_group(q, n_q, k, v, kv_f16, kv_stride, head_dim, n_kv, scale, softcap, scores,
                                     out);
#endif
#if TD_KERNELS_ARM
    if (kv_f16 && isa_active() == Isa::neon)
        return neon::attention_group_f16(q, n_q, k, v, kv_stride, head_dim, n_kv, scale, softcap, scores,
                                         out);
#endif
    for (int32_t g = 0; g < n_q; ++g)
        ref::attention_head(q + static_cast<size_t>(g) * head_dim, k, v, kv_f16, kv_stride, head_dim, n_kv,
                            scale, softcap, scores, out + static_cast<size_t>(g) * head_dim);
}

bool kv_type_supported(DType type) {
    switch (type) {
        case DType::f32:
        case DType::f16:
        case DType::bf16:
        case DType::q8_0:
        case DType::q4_0:
        case DType::q4_1:
        case DType::q5_0:
        case DType::q5_1:
            return true;
        default:
            return false;
    }
}

void attention_group_typed(const float *q, int32_t n_q, const KvRows &k, const KvRows &v, int32_t head_dim,
                           int32_t n_kv, float scale, float softcap, float *scores, float *out) {
    TD_ASSERT(kv_type_supported(k.type) && kv_type_supported(v.type), "attention: K {} V {}",
              dtype_name(k.type), dtype_name(v.type));
    const bool plain =
        k.type == v.type && k.row_bytes == v.row_bytes && (k.type == DType::f16 || k.type == DType::f32);
    if (plain) {
        const size_t elt = k.type == DType::f16 ? sizeof(uint16_t) : sizeof(float);
        return attention_group(q, n_q, k.data, v.data, k.type == DType::f16,
                               static_cast<int64_t>(k.row_bytes / elt), head_dim, n_kv, scale, softcap,
                               scores, out);
    }
    TD_ASSERT(n_q >= 1 && head_dim > 0 && head_dim <= 1024 && n_kv >= 0 && softcap >= 0.0f,
              "attention_group_typed: {} heads, head_dim {}, n_kv {}, softcap {}", n_q, head_dim, n_kv,
              softcap);
    // Other types are read through the kernels of the ISA in use (the reference's results for block types).
    ref::KvReaders rd;
    if (k.type != DType::f16 && k.type != DType::f32) {
        const TypeKernels *kt = type_kernels(k.type);
        rd.k_dot = kt->vec_dot;
        rd.q_to_k = type_kernels(kt->vec_dot_type)->from_float;
    }
    if (v.type != DType::f16 && v.type != DType::f32) rd.v_to_float = type_kernels(v.type)->to_float;
#if TD_KERNELS_X86
    if (use_avx2())
        return avx2::attention_group_typed(q, n_q, k, v, rd, head_dim, n_kv, scale, softcap, scores, out);
#endif
    for (int32_t g = 0; g < n_q; ++g)
        ref::attention_head_typed(q + static_cast<size_t>(g) * head_dim, k, v, rd, head_dim, n_kv, scale,
                                  softcap, out + static_cast<size_t>(g) * head_dim);
}

void store_row_typed(const float *src, void *dst, DType type, int64_t n) {
    if (type == DType::f16 || type == DType::f32) return store_row(src, dst, type == DType::f16, n);
    TD_ASSERT(kv_type_supported(type), "store_row_typed: {}", dtype_name(type));
    type_kernels(type)->from_float(src, dst, n);
}

void store_row(const float *src, void *dst, bool to_f16, int64_t n) {
#if TD_KERNELS_X86
    if (use_avx2()) return avx2::store_row(src, dst, to_f16, n);
#endif
#if TD_KERNELS_ARM
    if (isa_active() == Isa::neon) return neon::store_row(src, dst, to_f16, n);
#endif
    ref::store_row(src, dst, to_f16, n);
}

}  // namespace td::kernels
