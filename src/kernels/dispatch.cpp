// Run-time ISA choice and the per-ISA tables of type kernels.
//
// An ISA's table lists, for each type, the best function that ISA has, falling back to the next lower ISA
// and finally to the reference. A new SIMD file (say x86/quants-avx512.cpp) only needs its functions
// declared in x86/kernels-x86.h and named in its ISA's table below.
#include <atomic>
#include <cstdlib>
#include <iterator>
#include <string_view>

#include "core/log.h"
#include "kernels/kernels.h"
#include "kernels/ref/kquants-ref.h"
#include "kernels/ref/quants-ref.h"

#if TD_KERNELS_X86
#include <cpuid.h>

#include "kernels/x86/kernels-x86.h"
#include "kernels/x86/kquants-x86.h"
#endif
#if TD_KERNELS_ARM
#include "kernels/arm/kernels-arm.h"
#endif

namespace td::kernels {
namespace {

constexpr TypeKernels kRefTable[] = {
    {DType::f32, ref::to_float_f32, ref::from_float_f32, ref::vec_dot_f32_f32, DType::f32},
    {DType::f16, ref::to_float_f16, ref::from_float_f16, ref::vec_dot_f16_f16, DType::f16},
    {DType::bf16, ref::to_float_bf16, ref::from_float_bf16, ref::vec_dot_bf16_bf16, DType::bf16},
    {DType::q4_0, ref::to_float_q4_0, ref::from_float_q4_0, ref::vec_dot_q4_0_q8_0, DType::q8_0},
    {DType::q4_1, ref::to_float_q4_1, ref::from_float_q4_1, ref::vec_dot_q4_1_q8_1, DType::q8_1},
    {DType::q5_0, ref::to_float_q5_0, ref::from_float_q5_0, ref::vec_dot_q5_0_q8_0, DType::q8_0},
    {DType::q5_1, ref::to_float_q5_1, ref::from_float_q5_1, ref::vec_dot_q5_1_q8_1, DType::q8_1},
    {DType::q8_0, ref::to_float_q8_0, ref::from_float_q8_0, ref::vec_dot_q8_0_q8_0, DType::q8_0},
    {DType::q8_1, ref::to_float_q8_1, ref::from_float_q8_1, ref::vec_dot_q8_1_q8_1, DType::q8_1},
    {DType::q2_k, ref::to_float_q2_k, ref::from_float_q2_k, ref::vec_dot_q2_k_q8_k, DType::q8_k},
    {DType::q3_k, ref::to_float_q3_k, ref::from_float_q3_k, ref::vec_dot_q3_k_q8_k, DType::q8_k},
    {DType::q4_k, ref::to_float_q4_k, ref::from_float_q4_k, ref::vec_dot_q4_k_q8_k, DType::q8_k},
    {DType::q5_k, ref::to_float_q5_k, ref::from_float_q5_k, ref::vec_dot_q5_k_q8_k, DType::q8_k},
    {DType::q6_k, ref::to_float_q6_k, ref::from_float_q6_k, ref::vec_dot_q6_k_q8_k, DType::q8_k},
    {DType::q8_k, ref::to_float_q8_k, ref::from_float_q8_k, ref::vec_dot_q8_k_q8_k, DType::q8_k},
};

#if TD_KERNELS_X86
constexpr TypeKernels kAvx2Table[] = {
    {DType::f32, ref::to_float_f32, ref::from_float_f32, avx2::vec_dot_f32_f32, DType::f32},
    {DType::f16, ref::to_float_f16, avx2::from_float_f16, avx2::vec_dot_f16_f16, DType::f16},
    {DType::bf16, ref::to_float_bf16, ref::from_float_bf16, ref::vec_dot_bf16_bf16, DType::bf16},
    {DType::q4_0, avx2::to_float_q4_0, ref::from_float_q4_0, avx2::vec_dot_q4_0_q8_0, DType::q8_0},
    {DType::q4_1, ref::to_float_q4_1, ref::from_float_q4_1, avx2::vec_dot_q4_1_q8_1, DType::q8_1},
    {DType::q5_0, ref::to_float_q5_0, ref::from_float_q5_0, avx2::vec_dot_q5_0_q8_0, DType::q8_0},
    {DType::q5_1, ref::to_float_q5_1, ref::from_float_q5_1, avx2::vec_dot_q5_1_q8_1, DType::q8_1},
    {DType::q8_0, avx2::to_float_q8_0, avx2::from_float_q8_0, avx2::vec_dot_q8_0_q8_0, DType::q8_0},
    {DType::q8_1, ref::to_float_q8_1, avx2::from_float_q8_1, avx2::vec_dot_q8_1_q8_1, DType::q8_1},
    {DType::q2_k, ref::to_float_q2_k, ref::from_float_q2_k, avx2::vec_dot_q2_k_q8_k, DType::q8_k},
    {DType::q3_k, ref::to_float_q3_k, ref::from_float_q3_k, avx2::vec_dot_q3_k_q8_k, DType::q8_k},
    {DType::q4_k, ref::to_float_q4_k, ref::from_float_q4_k, avx2::vec_dot_q4_k_q8_k, DType::q8_k},
    {DType::q5_k, ref::to_float_q5_k, ref::from_float_q5_k, avx2::vec_dot_q5_k_q8_k, DType::q8_k},
    {DType::q6_k, ref::to_float_q6_k, ref::from_float_q6_k, avx2::vec_dot_q6_k_q8_k, DType::q8_k},
    {DType::q8_k, ref::to_float_q8_k, avx2::from_float_q8_k, avx2::vec_dot_q8_k_q8_k, DType::q8_k},
};
static_assert(std::size(kAvx2Table) == std::size(kRefTable));
#endif

#if TD_KERNELS_ARM
constexpr TypeKernels kNeonTable[] = {
    {DType::f32, ref::to_float_f32, ref::from_float_f32, neon::vec_dot_f32_f32, DType::f32},
    {DType::f16, ref::to_float_f16, neon::from_float_f16, neon::vec_dot_f16_f16, DType::f16},
    {DType::bf16, ref::to_float_bf16, ref::from_float_bf16, ref::vec_dot_bf16_bf16, DType::bf16},
    {DType::q4_0, ref::to_float_q4_0, ref::from_float_q4_0, neon::vec_dot_q4_0_q8_0, DType::q8_0},
    {DType::q4_1, ref::to_float_q4_1, ref::from_float_q4_1, neon::vec_dot_q4_1_q8_1, DType::q8_1},
    {DType::q5_0, ref::to_float_q5_0, ref::from_float_q5_0, neon::vec_dot_q5_0_q8_0, DType::q8_0},
    {DType::q5_1, ref::to_float_q5_1, ref::from_float_q5_1, neon::vec_dot_q5_1_q8_1, DType::q8_1},
    {DType::q8_0, ref::to_float_q8_0, neon::from_float_q8_0, neon::vec_dot_q8_0_q8_0, DType::q8_0},
    {DType::q8_1, ref::to_float_q8_1, neon::from_float_q8_1, neon::vec_dot_q8_1_q8_1, DType::q8_1},
    {DType::q2_k, ref::to_float_q2_k, ref::from_float_q2_k, neon::vec_dot_q2_k_q8_k, DType::q8_k},
    {DType::q3_k, ref::to_float_q3_k, ref::from_float_q3_k, neon::vec_dot_q3_k_q8_k, DType::q8_k},
    {DType::q4_k, ref::to_float_q4_k, ref::from_float_q4_k, neon::vec_dot_q4_k_q8_k, DType::q8_k},
    {DType::q5_k, ref::to_float_q5_k, ref::from_float_q5_k, neon::vec_dot_q5_k_q8_k, DType::q8_k},
    {DType::q6_k, ref::to_float_q6_k, ref::from_float_q6_k, neon::vec_dot_q6_k_q8_k, DType::q8_k},
    {DType::q8_k, ref::to_float_q8_k, neon::from_float_q8_k, neon::vec_dot_q8_k_q8_k, DType::q8_k},
};
static_assert(std::size(kNeonTable) == std::size(kRefTable));
#endif

struct Table {
    const TypeKernels *entries;
    size_t n;
};

Table table_for(Isa isa) {
    switch (isa) {
#if TD_KERNELS_X86
        case Isa::avx2:
        case Isa::avx512:  // no AVX-512 specialisations yet: an AVX-512 CPU runs the AVX2 kernels
            return {kAvx2Table, std::size(kAvx2Table)};
#endif
#if TD_KERNELS_ARM
        case Isa::neon:
            return {kNeonTable, std::size(kNeonTable)};
#endif
        default:
            return {kRefTable, std::size(kRefTable)};
    }
}

const TypeKernels *find(Table table, DType type) {
    for (size_t i = 0; i < table.n; ++i)
        if (table.entries[i].type == type) return &table.entries[i];
    return nullptr;
}

// Whether this build has the ISA and this CPU supports it.
bool isa_available(Isa isa) {
    const Isa best = isa_detected();
    switch (isa) {
        case Isa::scalar:
            return true;
        case Isa::avx2:
            return best == Isa::avx2 || best == Isa::avx512;
        case Isa::avx512:
            return best == Isa::avx512;
        case Isa::neon:
            return best == Isa::neon;
    }
    return false;
}

// The ISA TANDEM_ISA asks for, if it names one this machine can run; otherwise isa_detected().
Isa isa_from_env() {
    const Isa best = isa_detected();
    const char *env = std::getenv("TANDEM_ISA");
    if (env == nullptr || *env == '\0') return best;
    const std::string_view want(env);
    for (Isa isa : {Isa::scalar, Isa::avx2, Isa::avx512, Isa::neon}) {
        if (want != isa_name(isa)) continue;
        if (isa_available(isa)) return isa;
        log_warn("TANDEM_ISA={}: this CPU or build does not support it; using {}", want, isa_name(best));
        return best;
    }
    log_warn("TANDEM_ISA={} is not one of scalar, avx2, avx512, neon; using {}", want, isa_name(best));
    return best;
}

constexpr int kUnset = -1;
std::atomic<int> g_active_isa{kUnset};

}  // namespace

const char *isa_name(Isa isa) {
    switch (isa) {
        case Isa::scalar:
            return "scalar";
        case Isa::avx2:
            return "avx2";
        case Isa::avx512:
            return "avx512";
        case Isa::neon:
            return "neon";
    }
    return "unknown";
}

Isa isa_detected() {
#if TD_KERNELS_X86
    // __builtin_cpu_supports also checks that the OS saves the wide registers (xgetbv).
    static const Isa detected = [] {
        __builtin_cpu_init();
        // F16C from cpuid itself: clang's __builtin_cpu_supports does not know the name.
        unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
        const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C) != 0;
        const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
        const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                            __builtin_cpu_supports("avx512vl");
        if (avx2 && avx512) return Isa::avx512;
        if (avx2) return Isa::avx2;
        return Isa::scalar;
    }();
    return detected;
#elif TD_KERNELS_ARM
    return Isa::neon;  // baseline on aarch64
#else
    return Isa::scalar;
#endif
}

bool avx512_vnni_active() {
#if TD_KERNELS_X86
    static const bool vnni = [] {
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx512vnni") != 0;
    }();
    return vnni && isa_active() == Isa::avx512;
#else
    return false;
#endif
}

Isa isa_active() {
    int isa = g_active_isa.load(std::memory_order_relaxed);
    if (isa == kUnset) {
        // Two threads may both read the environment the first time; they store the same value.
        isa = static_cast<int>(isa_from_env());
        g_active_isa.store(isa, std::memory_order_relaxed);
    }
    return static_cast<Isa>(isa);
}

bool isa_force(Isa isa) {
    if (!isa_available(isa)) return false;
    g_active_isa.store(static_cast<int>(isa), std::memory_order_relaxed);
    return true;
}

void isa_reset() {
    g_active_isa.store(kUnset, std::memory_order_relaxed);
}

const TypeKernels *type_kernels(DType type) {
    return find(table_for(isa_active()), type);
}

const TypeKernels *type_kernels_ref(DType type) {
    return find(table_for(Isa::scalar), type);
}

const TypeKernels *type_kernels_for(DType type, Isa isa) {
    return find(table_for(isa), type);
}

}  // namespace td::kernels
