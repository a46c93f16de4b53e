// Pieces every raw WMMA kernel family shares: selecting one entry point per compile, the
// padded shared-memory tile layout that keeps every WMMA pointer 256-bit aligned, the
// element codes of C and D, and the alpha/beta epilogue with its guarded stores.
#pragma once

#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <mma.h>

namespace rw {

// ---- one entry point per run-time compile --------------------------------------------
// Compiled with -DRW_ONLY=<entry name>, every other entry point of the file keeps an empty
// body, so a run-time compile builds only the kernel asked for. Without RW_ONLY (the nvcc
// build of the CPU tests) every entry point is built.
#define RW_STR2(x) #x
#define RW_STR(x) RW_STR2(x)
#ifdef RW_ONLY
constexpr const char* kOnly = RW_STR(RW_ONLY);
#else
constexpr const char* kOnly = nullptr;
#endif

__host__ __device__ constexpr bool same_name(const char* a, const char* b) {
    while (*a != '\0' && *a == *b) {
        ++a;
        ++b;
    }
    return *a == *b;
}

__host__ __device__ constexpr bool selected(const char* name) { return kOnly == nullptr || same_name(name, kOnly); }

// std::conditional without <type_traits> (NVRTC has no host standard library).
template <bool C, typename A, typename B>
struct If {
    using type = A;
};
template <typename A, typename B>
struct If<false, A, B> {
    using type = B;
};

// std::is_same, for the same reason.
template <typename A, typename B>
struct Same {
    static constexpr bool value = false;
};
template <typename A>
struct Same<A, A> {
    static constexpr bool value = true;
};

// ---- element codes of C and D (kept in step with backends/raw_wmma.py) ---------------
enum ElemCode : int { kF16 = 0, kBF16 = 1, kF32 = 2, kF64 = 3, kS32 = 4 };

// ---- padded shared-memory tiles --------------------------------------------------------
// A tile of R x C elements of T stored with C contiguous. C is cut into chunks of CH
// elements (one WMMA fragment's extent along C); each chunk starts on a 32-byte boundary and
// each row is one extra 32-byte slot longer than its chunks, so every fragment pointer is
// 256-bit aligned and the leading dimension is a multiple of 16 bytes whatever the dtype.
template <typename T, int R, int C, int CH>
struct Tile {
    static_assert(C % CH == 0, "a tile row holds whole fragment chunks");
    static constexpr int kSlot = 32 / sizeof(T) > 0 ? 32 / sizeof(T) : 1;
    static constexpr int kChunkPad = ((CH + kSlot - 1) / kSlot) * kSlot;
    static constexpr int kLd = (C / CH) * kChunkPad + kSlot;
    static constexpr int kElems = R * kLd;
    static constexpr int kBytes = kElems * sizeof(T);

    __device__ static int at(int r, int c) { return r * kLd + (c / CH) * kChunkPad + c % CH; }
};

// ---- reading and writing C / D by element code -----------------------------------------
__device__ __forceinline__ double load_as_double(const void* p, long long i, int code) {
    switch (code) {
        case kF16: return __half2float(static_cast<const __half*>(p)[i]);
        case kBF16: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
        case kF32: return static_cast<const float*>(p)[i];
        case kF64: return static_cast<const double*>(p)[i];
        default: return static_cast<const int*>(p)[i];
    }
}

// Saturation (WMMA's satf): +-inf -> +-MAX_NORM of float16, NaN -> +0.
__device__ __forceinline__ double saturate_f16(double v) {
    if (v != v) return 0.0;
    return fmin(fmax(v, -65504.0), 65504.0);
}

__device__ __forceinline__ void store_from_double(void* p, long long i, int code, double v, bool satf) {
    switch (code) {
        case kF16:
            static_cast<__half*>(p)[i] = __double2half(satf ? saturate_f16(v) : v);
            break;
        case kBF16: static_cast<__nv_bfloat16*>(p)[i] = __double2bfloat16(v); break;
        case kF32: static_cast<float*>(p)[i] = static_cast<float>(v); break;
        case kF64: static_cast<double*>(p)[i] = v; break;
        default: static_cast<int*>(p)[i] = static_cast<int>(static_cast<long long>(v)); break;
    }
}

// Everything a GEMM kernel needs to know about C, D and the scalars.
struct Epilogue {
    const void* c;      // may be null (no C term)
    void* d;            // row-major contiguous (batch, M, N)
    long long scm, scn; // C strides (elements)
    long long sbc;      // C batch stride (0 when broadcast)
    double alpha, beta;
    int c_code, d_code;
    int satf;
};

__device__ __forceinline__ double to_double(float v) { return v; }
__device__ __forceinline__ double to_double(double v) { return v; }
__device__ __forceinline__ double to_double(__half v) { return __half2float(v); }

// One output element D[b, m, n] = alpha * acc + beta * C[b, m, n] (floating accumulators).
template <typename Acc>
__device__ __forceinline__ void write_element(const Epilogue& e, int b, int m, int n, int N, int M,
                                     Acc acc) {
    double v = e.alpha * to_double(acc);
    if (e.c != nullptr && e.beta != 0.0) {
        v += e.beta * load_as_double(e.c, b * e.sbc + m * e.scm + n * e.scn, e.c_code);
    }
    store_from_double(e.d, (static_cast<long long>(b) * M + m) * N + n, e.d_code, v, e.satf);
}

// The integer form: exact 64-bit arithmetic, alpha and beta taken as integers.
template <>
__device__ __forceinline__ void write_element<int>(const Epilogue& e, int b, int m, int n, int N, int M,
                                          int acc) {
    long long v = static_cast<long long>(e.alpha) * acc;
    if (e.c != nullptr && e.beta != 0.0) {
        const int* c = static_cast<const int*>(e.c);
        v += static_cast<long long>(e.beta) * c[b * e.sbc + m * e.scm + n * e.scn];
    }
    static_cast<int*>(e.d)[(static_cast<long long>(b) * M + m) * N + n] = static_cast<int>(v);
}

// ---- cp.async, ldmatrix and block order (the pipelined kernels) -------------------------
// A 16-byte cp.async copying src_bytes (0..16) and zero-filling the rest; the same copy of
// all 16 bytes; committing and waiting for groups of copies.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, int src_bytes) {
    const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem),
                 "r"(src_bytes));
}
__device__ __forceinline__ void cp_async16_full(void* smem, const void* gmem) {
    const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// Four 8 x 8 matrices of 16-bit elements (8 rows of 16 bytes each) from shared memory: lane l
// gives the address of row l % 8 of matrix l / 8 and receives, of each matrix i, the 32 bits
// at row l / 4, bytes 4 * (l % 4) .. + 4 in r[i].
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const void* smem) {
    const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s)
                 : "memory");
}

// Grouped block order: 8 block rows sweep the block columns together, so blocks that run at
// the same time share the rows of A and the columns of B they read (L2 reuse). Block
// blockIdx.x's tile corner (m0, n0) of an M x N output in BM x BN tiles.
template <int BM, int BN>
__device__ __forceinline__ void grouped_tile(int M, int N, int& m0, int& n0) {
    const int tiles_m = (M + BM - 1) / BM, tiles_n = (N + BN - 1) / BN;
    constexpr int kGroup = 8;
    const int per_group = kGroup * tiles_n;
    const int first_m = (static_cast<int>(blockIdx.x) / per_group) * kGroup;
    const int group_m = min(tiles_m - first_m, kGroup);
    const int in_group = static_cast<int>(blockIdx.x) % per_group;
    m0 = (first_m + in_group % group_m) * BM;
    n0 = (in_group / group_m) * BN;
}

// ---- PTX mma.sync from registers (the K-major GEMM and its ceiling probes) --------------
// The kinds below share one fragment layout in bytes along K, so one ldmatrix pattern feeds
// them all (groupID g = lane / 4, t = lane % 4): A (16 rows, K-contiguous) in kA registers,
// register i holding row g + 8 * (i % 2), bytes 16 * (i / 2) + 4 * t .. + 4; B (8 columns,
// K-contiguous) in kB registers, register j holding column g, bytes 16 * j + 4 * t .. + 4; C and
// D in 4 accumulators, rows g (c0, c1) and g + 8 (c2, c3), columns 2 * t and 2 * t + 1. So 32
// bytes of K per row feed one m16n8k256 b1, m16n8k32 s8 / u8 or m16n8k8 tf32 (kA 4, kB 2), or
// two m16n8k128 b1 (kA 2, kB 1). step() is one instruction; operand() is what an element's bits
// need before it (tf32: rounding to nearest, ties away, as __float_to_tf32; else nothing).
// Reg: the type of one fragment register (MmaF64's are doubles, see there).
template <int KBITS>
struct MmaB1And {  // mma.sync.aligned.m16n8k<KBITS>.row.col.s32.b1.b1.s32.and.popc
    static_assert(KBITS == 128 || KBITS == 256, "m16n8k128 or m16n8k256");
    using Acc = int;
    using Reg = unsigned;
    static constexpr int kA = KBITS / 64, kB = KBITS / 128;
    __device__ __forceinline__ static void operand(unsigned&) {}
    __device__ __forceinline__ static void step(int (&c)[4], const unsigned (&a)[kA],
                                                const unsigned (&b)[kB]) {
        if constexpr (KBITS == 128) {
            asm volatile(
                "mma.sync.aligned.m16n8k128.row.col.s32.b1.b1.s32.and.popc "
                "{%0, %1, %2, %3}, {%4, %5}, {%6}, {%0, %1, %2, %3};\n"
                : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
                : "r"(a[0]), "r"(a[1]), "r"(b[0]));
        } else {
            asm volatile(
                "mma.sync.aligned.m16n8k256.row.col.s32.b1.b1.s32.and.popc "
                "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
                : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
        }
    }
};

// mma.sync.aligned.m16n8k32.row.col.s32.<T>.<T>.s32 for T = s8 or u8.
#define RW_MMA_INT8(NAME, T)                                                                  \
    struct NAME {                                                                             \
        using Acc = int;                                                                      \
        using Reg = unsigned;                                                                 \
        static constexpr int kA = 4, kB = 2;                                                  \
        __device__ __forceinline__ static void operand(unsigned&) {}                          \
        __device__ __forceinline__ static void step(int (&c)[4], const unsigned (&a)[4],      \
                                                    const unsigned (&b)[2]) {                 \
            asm volatile("mma.sync.aligned.m16n8k32.row.col.s32." T "." T ".s32 "               \
                         "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"  \
                         : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])                     \
                         : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1])); \
        }                                                                                     \
    };
RW_MMA_INT8(MmaS8, "s8")
RW_MMA_INT8(MmaU8, "u8")
#undef RW_MMA_INT8

struct MmaTf32 {  // mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32
    using Acc = float;
    using Reg = unsigned;
    static constexpr int kA = 4, kB = 2;
    __device__ __forceinline__ static void operand(unsigned& r) {
        asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(__uint_as_float(r)));
    }
    __device__ __forceinline__ static void step(float (&c)[4], const unsigned (&a)[4],
                                                const unsigned (&b)[2]) {
        asm volatile(
            "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
            "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    }
};

// mma.sync.aligned.m16n8k<K>.row.col.f64.f64.f64.f64 (K = 4, 8 or 16; sm_90): fragments of
// doubles, A in K / 2 registers, register i holding row g + 8 * (i % 2), column t + 4 * (i / 2);
// B in K / 4, register j holding row t + 4 * j, column g; C and D as above. Before sm_90 the
// instruction does not exist and step() traps.
template <int K>
struct MmaF64 {
    static_assert(K == 4 || K == 8 || K == 16, "m16n8k4, m16n8k8 or m16n8k16");
    using Acc = double;
    using Reg = double;
    static constexpr int kA = K / 2, kB = K / 4;
    __device__ __forceinline__ static void operand(double&) {}
    __device__ __forceinline__ static void step(double (&c)[4], const double (&a)[kA],
                                                const double (&b)[kB]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        if constexpr (K == 4) {
            asm volatile(
                "mma.sync.aligned.m16n8k4.row.col.f64.f64.f64.f64 "
                "{%0, %1, %2, %3}, {%4, %5}, {%6}, {%0, %1, %2, %3};\n"
                : "+d"(c[0]), "+d"(c[1]), "+d"(c[2]), "+d"(c[3])
                : "d"(a[0]), "d"(a[1]), "d"(b[0]));
        } else if constexpr (K == 8) {
            asm volatile(
                "mma.sync.aligned.m16n8k8.row.col.f64.f64.f64.f64 "
                "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                : "+d"(c[0]), "+d"(c[1]), "+d"(c[2]), "+d"(c[3])
                : "d"(a[0]), "d"(a[1]), "d"(a[2]), "d"(a[3]), "d"(b[0]), "d"(b[1]));
        } else {
            asm volatile(
                "mma.sync.aligned.m16n8k16.row.col.f64.f64.f64.f64 "
                "{%0, %1, %2, %3}, {%4, %5, %6, %7, %8, %9, %10, %11}, {%12, %13, %14, %15}, "
                "{%0, %1, %2, %3};\n"
                : "+d"(c[0]), "+d"(c[1]), "+d"(c[2]), "+d"(c[3])
                : "d"(a[0]), "d"(a[1]), "d"(a[2]), "d"(a[3]), "d"(a[4]), "d"(a[5]), "d"(a[6]),
                  "d"(a[7]), "d"(b[0]), "d"(b[1]), "d"(b[2]), "d"(b[3]));
        }
#else
        __trap();
#endif
    }
};

}  // namespace rw
