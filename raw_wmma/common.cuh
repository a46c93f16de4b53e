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
__device__ __forceinline__ double to_double(__nv_bfloat16 v) { return __bfloat162float(v); }

// A result in D's element type: 16-bit floats rounded to nearest, the rest converted.
template <typename Out, typename V>
__device__ __forceinline__ Out out_cast(V v) {
    if constexpr (Same<Out, __half>::value) {
        return __float2half_rn(static_cast<float>(v));
    } else if constexpr (Same<Out, __nv_bfloat16>::value) {
        return __float2bfloat16_rn(static_cast<float>(v));
    } else {
        return static_cast<Out>(v);
    }
}

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

// ---- cp.async, ldmatrix, shared loads and block order (the pipelined kernels) ------------
// A 16-byte cp.async copying src_bytes (0..16) and zero-filling the rest; the same copy of
// all 16 bytes; committing and waiting for groups of copies. The destination is a shared
// memory address (__cvta_generic_to_shared of a pointer, see shared_address).
__device__ __forceinline__ unsigned shared_address(const void* smem) {
    return static_cast<unsigned>(__cvta_generic_to_shared(smem));
}
__device__ __forceinline__ void cp_async16(unsigned smem, const void* gmem, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem), "l"(gmem),
                 "r"(src_bytes));
}
__device__ __forceinline__ void cp_async16_full(unsigned smem, const void* gmem) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem), "l"(gmem));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// Four 8 x 8 matrices of 16-bit elements (8 rows of 16 bytes each) from shared memory: lane l
// gives the address of row l % 8 of matrix l / 8 and receives, of each matrix i, the 32 bits
// at row l / 4, bytes 4 * (l % 4) .. + 4 in r[i]. smem: a shared memory address.
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], unsigned smem) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem)
                 : "memory");
}

// One double from a shared memory address.
__device__ __forceinline__ double lds64(unsigned smem) {
    double v;
    asm volatile("ld.shared.f64 %0, [%1];\n" : "=d"(v) : "r"(smem) : "memory");
    return v;
}

// Grouped block order: 8 block rows sweep the block columns together, so blocks that run at
// the same time share the rows of A and the columns of B they read (L2 reuse). Block
// `block`'s tile corner (m0, n0) of an M x N output in BM x BN tiles.
template <int BM, int BN>
__device__ __forceinline__ void grouped_tile(int M, int N, int block, int& m0, int& n0) {
    const int tiles_m = (M + BM - 1) / BM, tiles_n = (N + BN - 1) / BN;
    constexpr int kGroup = 8;
    const int per_group = kGroup * tiles_n;
    const int first_m = (block / per_group) * kGroup;
    const int group_m = min(tiles_m - first_m, kGroup);
    const int in_group = block % per_group;
    m0 = (first_m + in_group % group_m) * BM;
    n0 = (in_group / group_m) * BN;
}

// threadIdx.x and blockIdx.x read anew: what an epilogue derives from them is computed after
// the main loop instead of held in registers through it.
__device__ __forceinline__ int fresh_thread() {
    int r;
    asm volatile("mov.u32 %0, %%tid.x;\n" : "=r"(r));
    return r;
}
__device__ __forceinline__ int fresh_block() {
    int r;
    asm volatile("mov.u32 %0, %%ctaid.x;\n" : "=r"(r));
    return r;
}

// ---- PTX mma.sync from registers (the K-major GEMM and its ceiling probes) --------------
// The kinds below share one fragment layout in bytes along K, so one ldmatrix pattern feeds
// them all (groupID g = lane / 4, t = lane % 4): A (16 rows, K-contiguous) in kA registers,
// register i holding row g + 8 * (i % 2), bytes 16 * (i / 2) + 4 * t .. + 4; B (8 columns,
// K-contiguous) in kB registers, register j holding column g, bytes 16 * j + 4 * t .. + 4; C
// and D in 4 accumulators, rows g (c0, c1) and g + 8 (c2, c3), columns 2 * t and 2 * t + 1. So
// 32 bytes of K per row feed one m16n8k256 b1, m16n8k32 s8 / u8, m16n8k16 f16 / bf16 or m16n8k8
// tf32 (kA 4, kB 2), or two m16n8k128 b1 (kA 2, kB 1). step() is one instruction; operand() is
// what an element's bits need before it (tf32: rounding to nearest, ties away, as
// __float_to_tf32; else nothing). Reg: the type of one fragment register (MmaF64's are doubles,
// see there); Out: the type the GEMM writes D in when D is plain.
template <int KBITS>
struct MmaB1And {  // mma.sync.aligned.m16n8k<KBITS>.row.col.s32.b1.b1.s32.and.popc
    static_assert(KBITS == 128 || KBITS == 256, "m16n8k128 or m16n8k256");
    using Acc = int;
    using Out = int;
    using Reg = unsigned;
    static constexpr bool kWarpgroup = false;
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

// The kinds of 4 A and 2 B 32-bit registers: mma.sync.aligned.<SHAPE> with accumulators of
// ACC (register constraint R) written to D as OUT, and OPERAND the statement that prepares
// each operand register r.
#define RW_MMA_4X2(NAME, SHAPE, ACC, R, OUT, OPERAND)                                         \
    struct NAME {                                                                             \
        using Acc = ACC;                                                                      \
        using Out = OUT;                                                                      \
        using Reg = unsigned;                                                                 \
        static constexpr bool kWarpgroup = false;                                             \
        static constexpr int kA = 4, kB = 2;                                                  \
        __device__ __forceinline__ static void operand(unsigned& r) { OPERAND; }              \
        __device__ __forceinline__ static void step(ACC (&c)[4], const unsigned (&a)[4],      \
                                                    const unsigned (&b)[2]) {                 \
            asm volatile("mma.sync.aligned." SHAPE                                            \
                         " {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n" \
                         : "+" R(c[0]), "+" R(c[1]), "+" R(c[2]), "+" R(c[3])                 \
                         : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1])); \
        }                                                                                     \
    };
RW_MMA_4X2(MmaS8, "m16n8k32.row.col.s32.s8.s8.s32", int, "r", int, (void)r)
RW_MMA_4X2(MmaU8, "m16n8k32.row.col.s32.u8.u8.s32", int, "r", int, (void)r)
// tf32: each element rounded to nearest, ties away, as __float_to_tf32
RW_MMA_4X2(MmaTf32, "m16n8k8.row.col.f32.tf32.tf32.f32", float, "f", float,
           asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(__uint_as_float(r))))
RW_MMA_4X2(MmaF16, "m16n8k16.row.col.f32.f16.f16.f32", float, "f", __half, (void)r)
RW_MMA_4X2(MmaBf16, "m16n8k16.row.col.f32.bf16.bf16.f32", float, "f", __nv_bfloat16, (void)r)
#undef RW_MMA_4X2

// mma.sync.aligned.m16n8k<K>.row.col.f64.f64.f64.f64 (K = 4, 8 or 16; sm_90): fragments of
// doubles, A in K / 2 registers, register i holding row g + 8 * (i % 2), column t + 4 * (i / 2);
// B in K / 4, register j holding row t + 4 * j, column g; C and D as above. Before sm_90 the
// instruction does not exist and step() traps.
template <int K>
struct MmaF64 {
    static_assert(K == 4 || K == 8 || K == 16, "m16n8k4, m16n8k8 or m16n8k16");
    using Acc = double;
    using Out = double;
    using Reg = double;
    static constexpr bool kWarpgroup = false;
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

// ---- wgmma (sm_90a: the K-major GEMM's warpgroup kinds) --------------------------------
// A shared memory matrix descriptor of a K-major tile stored as common 128-byte rows in the
// 128-byte swizzle (16-byte chunk c of row r at c ^ (r % 8), the tile on a 1024-byte
// boundary): start address / 16 in bits 0-13, leading byte offset 1 (unused by K-major
// swizzled layouts), stride byte offset 1024 / 16 (8 rows of 128 bytes to the next 8) in bits
// 32-45, swizzle mode 1 (128 bytes) in bits 62-63. A step of `bytes` along K inside the
// 128-byte rows adds wgmma_desc_offset(bytes) (the hardware applies the swizzle to the
// address it forms).
__device__ __forceinline__ unsigned long long wgmma_desc(unsigned smem) {
    return static_cast<unsigned long long>((smem & 0x3FFFF) >> 4) | (1ull << 16) |
           (64ull << 32) | (1ull << 62);
}
// The descriptor of an MN-major tile (16-bit elements, wgmma's transpose bit set): rows of
// 128 bytes, each one k's 64 consecutive elements along M or N, in the same 128-byte swizzle;
// 8 rows (8 k's) to the next 8 at 1024 bytes (the stride byte offset, bits 32-45) and a
// block of such rows (64 elements along M or N) to the next at `block` bytes (the leading
// byte offset, bits 16-29). A step of k along K adds wgmma_desc_offset(128 * k).
__device__ __forceinline__ unsigned long long wgmma_desc_mn(unsigned smem, unsigned block) {
    return static_cast<unsigned long long>((smem & 0x3FFFF) >> 4) |
           (static_cast<unsigned long long>(block >> 4) << 16) | (64ull << 32) | (1ull << 62);
}
__host__ __device__ constexpr unsigned long long wgmma_desc_offset(int bytes) {
    return static_cast<unsigned long long>(bytes >> 4);
}
// The tensor cores read shared memory through the async proxy: cp.async's writes are made
// visible to it by each writing thread before the barrier that publishes them.
__device__ __forceinline__ void fence_proxy_async() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_fence() {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// wgmma accumulator lists: the operand numbers %0 .. %63 and %64 .. %127, the list of a
// 64- and a 128-register instruction with its two descriptors' operands after it, and the
// matching "+" R(d[i]) constraints, 8 at a time.
#define RW_WG_NUM_0_63 \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, " \
    "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, " \
    "%36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, " \
    "%53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define RW_WG_NUM_64_127 \
    "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, " \
    "%81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, " \
    "%98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
    "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, " \
    "%126, %127"
#define RW_WG_REGS_64 "{" RW_WG_NUM_0_63 "}, %64, %65"
#define RW_WG_REGS_128 "{" RW_WG_NUM_0_63 ", " RW_WG_NUM_64_127 "}, %128, %129"
#define RW_WG_OUT8(R, i) \
    "+" R(d[(i)]), "+" R(d[(i) + 1]), "+" R(d[(i) + 2]), "+" R(d[(i) + 3]), \
    "+" R(d[(i) + 4]), "+" R(d[(i) + 5]), "+" R(d[(i) + 6]), "+" R(d[(i) + 7])
#define RW_WG_OUTS_64(R) \
    RW_WG_OUT8(R, 0), RW_WG_OUT8(R, 8), RW_WG_OUT8(R, 16), RW_WG_OUT8(R, 24), \
    RW_WG_OUT8(R, 32), RW_WG_OUT8(R, 40), RW_WG_OUT8(R, 48), RW_WG_OUT8(R, 56)
#define RW_WG_OUTS_128(R) \
    RW_WG_OUTS_64(R), \
    RW_WG_OUT8(R, 64), RW_WG_OUT8(R, 72), RW_WG_OUT8(R, 80), RW_WG_OUT8(R, 88), \
    RW_WG_OUT8(R, 96), RW_WG_OUT8(R, 104), RW_WG_OUT8(R, 112), RW_WG_OUT8(R, 120)

// The operands' major orders a warpgroup kind is built for: bit 0 set when A is M-major, bit 1
// when B is N-major (wgmma's imm-trans-a and imm-trans-b, which only its 16-bit kinds take);
// both clear: K-major, the only order of the other kinds.
constexpr int kKMajor = 0, kMnMajorA = 1, kMnMajorB = 2;
// The transpose immediates' operand numbers after a 64- and a 128-register list
#define RW_WG_TRANS_64 "%66, %67"
#define RW_WG_TRANS_128 "%130, %131"

// The warpgroup kinds: wgmma.mma_async.sync.aligned.<SHAPE> {d}, a-desc, b-desc, <TAIL> with
// both operands in shared memory, ACC accumulators (constraint R, REGS of them: an N-column
// instruction has N / 2) written to D as OUT; the 16-bit kinds' TAIL ends in the transpose
// immediates of MAJOR. Only sm_90a has them: the GEMM calls them from sm_90a builds alone.
#define RW_WGMMA_BODY(N, K, TYPES, REGS, ACC, R, OUT, MAJOR, TAIL, ...)                        \
    using Acc = ACC;                                                                            \
    using Out = OUT;                                                                            \
    static constexpr bool kWarpgroup = true;                                                    \
    static constexpr int kN = N;                                                                \
    static constexpr bool kMnA = (MAJOR) & kMnMajorA, kMnB = (MAJOR) & kMnMajorB;               \
    __device__ __forceinline__ static void step(ACC (&d)[REGS], unsigned long long a,           \
                                                unsigned long long b) {                         \
        static_assert(REGS == N / 2, "an N-column instruction: N / 2 accumulators");          \
        asm volatile("wgmma.mma_async.sync.aligned.m64n" #N "k" #K "." TYPES " "                \
                     RW_WG_REGS_##REGS ", " TAIL ";\n"                                          \
                     : RW_WG_OUTS_##REGS(R)                                                     \
                     : "l"(a), "l"(b)__VA_ARGS__);                                              \
    }
#define RW_WGMMA(NAME, N, K, TYPES, REGS, ACC, R, OUT, TAIL)                                   \
    template <>                                                                                 \
    struct NAME<N, kKMajor> {                                                                   \
        RW_WGMMA_BODY(N, K, TYPES, REGS, ACC, R, OUT, kKMajor, TAIL, )                          \
    };
#define RW_WGMMA16(NAME, N, TYPES, REGS, OUT)                                                  \
    template <int MAJOR>                                                                        \
    struct NAME<N, MAJOR> {                                                                     \
        RW_WGMMA_BODY(N, 16, TYPES, REGS, float, "f", OUT, MAJOR, "1, 1, 1, " RW_WG_TRANS_##REGS, \
                      , "n"(MAJOR & kMnMajorA ? 1 : 0), "n"(MAJOR & kMnMajorB ? 1 : 0))          \
    };
// Wg<kind><N, MAJOR>: the instruction of N columns (128 or 256) on operands in MAJOR order.
template <int N, int MAJOR = kKMajor>
struct WgF16;
template <int N, int MAJOR = kKMajor>
struct WgBf16;
template <int N, int MAJOR = kKMajor>
struct WgTf32;
template <int N, int MAJOR = kKMajor>
struct WgS8;
template <int N, int MAJOR = kKMajor>
struct WgU8;
template <int N, int MAJOR = kKMajor>
struct WgB1And;
RW_WGMMA16(WgF16, 256, "f32.f16.f16", 128, __half)
RW_WGMMA16(WgF16, 128, "f32.f16.f16", 64, __half)
RW_WGMMA16(WgBf16, 256, "f32.bf16.bf16", 128, __nv_bfloat16)
RW_WGMMA16(WgBf16, 128, "f32.bf16.bf16", 64, __nv_bfloat16)
// tf32: the tensor cores read float32 operands and ignore their low 13 bits (truncation)
RW_WGMMA(WgTf32, 256, 8, "f32.tf32.tf32", 128, float, "f", float, "1, 1, 1")
RW_WGMMA(WgTf32, 128, 8, "f32.tf32.tf32", 64, float, "f", float, "1, 1, 1")
// s8 / u8 stop at 224 columns: two 128-column instructions cover a 256-column tile
RW_WGMMA(WgS8, 128, 32, "s32.s8.s8", 64, int, "r", int, "1")
RW_WGMMA(WgU8, 128, 32, "s32.u8.u8", 64, int, "r", int, "1")
RW_WGMMA(WgB1And, 256, 256, "s32.b1.b1.and.popc", 128, int, "r", int, "1")
RW_WGMMA(WgB1And, 128, 256, "s32.b1.b1.and.popc", 64, int, "r", int, "1")
#undef RW_WGMMA16
#undef RW_WGMMA
#undef RW_WGMMA_BODY

// ---- TMA and mbarriers (sm_90: the K-major GEMM's tensor-memory-accelerator pipeline) ----
// A tensor map as the driver encodes it (cuTensorMapEncodeTiled: 128 opaque bytes, 64-byte
// aligned), passed to a kernel by value as a __grid_constant__ parameter.
struct alignas(64) TensorMap {
    unsigned long long words[16];
};

// mbarriers in shared memory (64-bit objects at 8-byte aligned shared addresses): init with
// the arrivals a phase expects; an arrival that also announces `bytes` the TMA unit will
// deliver; waiting for the phase of parity `parity` to complete; an arrival (release, at
// cluster scope) on the barrier at the same offset in cluster CTA `cta`.
__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(unsigned bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar),
                 "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) {
    asm volatile(
        "{\n"
        ".reg .pred done;\n"
        "RW_MBAR_WAIT_%=:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra RW_MBAR_WAIT_%=;\n"
        "}\n" ::"r"(bar),
        "r"(parity)
        : "memory");
}
__device__ __forceinline__ void mbar_arrive(unsigned bar, unsigned cta) {
    asm volatile(
        "{\n"
        ".reg .b32 remote;\n"
        "mapa.shared::cluster.u32 remote, %0, %1;\n"
        "mbarrier.arrive.shared::cluster.b64 _, [remote];\n"
        "}\n" ::"r"(bar),
        "r"(cta)
        : "memory");
}
// Barrier initializations made visible to the cluster (before the cluster barrier that
// publishes them); the cluster barrier itself (every thread of every CTA of the cluster); this
// CTA's rank in its cluster.
__device__ __forceinline__ void fence_mbar_init() {
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\n"
                 "barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
__device__ __forceinline__ unsigned cluster_rank() {
    unsigned r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
    return r;
}
// The registers per thread of the calling warpgroup raised or lowered to R (a multiple of 8,
// 24 .. 256): a producer warpgroup hands its registers to the consumers.
template <int R>
__device__ __forceinline__ void regs_raise() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(R));
}
template <int R>
__device__ __forceinline__ void regs_lower() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(R));
}
// A TMA load of the box at coordinates (c0, c1, c2) of `map` into shared memory at `dst`,
// completing its bytes on the mbarrier `bar`; with `mask`, the same box lands at the same
// offset (and completes on the same barrier offset) in every CTA of the cluster whose rank's
// bit is set (multicast).
__device__ __forceinline__ void tma_load(unsigned dst, const TensorMap& map, int c0, int c1,
                                         int c2, unsigned bar) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(dst),
        "l"(&map), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
        : "memory");
}
__device__ __forceinline__ void tma_load(unsigned dst, const TensorMap& map, int c0, int c1,
                                         int c2, unsigned bar, unsigned short mask) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
        ".multicast::cluster [%0], [%1, {%2, %3, %4}], [%5], %6;\n" ::"r"(dst),
        "l"(&map), "r"(c0), "r"(c1), "r"(c2), "r"(bar), "h"(mask)
        : "memory");
}

}  // namespace rw
