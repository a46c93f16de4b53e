// The fast f16 / bf16 WMMA GEMM (f32 accumulation): block tiles in shared memory filled by a
// multi-stage cp.async pipeline (one barrier per k-tile; the copies STAGES - 1 tiles ahead are
// issued before the current tile's MMAs), fragments double-buffered across k-steps (the next
// step's ldmatrix loads overlap this step's MMAs, across the stage boundary too), several
// 16x16x16 fragments per warp, a padded shared layout free of bank conflicts, grouped block
// order for L2 reuse and a vectorized epilogue.
//
// D[b] = alpha * A[b] @ B[b] + beta * C[b] for any M, N, K >= 1. A and B are each row- or
// column-major; each shared tile keeps its operand's layout (rows padded by 8 elements) and
// the WMMA loads take that layout. Tiles wholly inside the matrices are copied with unguarded
// 16-byte cp.async from per-thread pointers computed once; at ragged edges every 16-byte
// cp.async copies min(16, bytes left in the row) and zero-fills the rest, so nothing outside
// the matrix is read. The host guarantees what cp.async needs: 16-byte aligned base pointers,
// leading dimensions and batch strides that are multiples of 8 elements. The accumulators
// leave through a per-warp shared scratch tile; each lane then writes 8 consecutive outputs
// with one 16-byte store where the row allows it, element by element (guarded) elsewhere.
//
// One templated body (fast_gemm); the extern "C" entry points below name each instance.
#include "common.cuh"

namespace rw {
using namespace nvcuda;

constexpr int kFastPad = 8;  // elements added to each shared row: 16 bytes, conflict-free

template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
    return __float2bfloat16_rn(v);
}
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

// Fragment loads from shared memory. f16: load_matrix_sync (the compiler sees the shared
// address and emits ldmatrix). bf16: load_matrix_sync goes through a generic address (plain
// LD + MOVM in SASS), so the same wmma.load is written with the .shared state space, which
// ptxas turns into ldmatrix; the fragment is the one load_matrix_sync would produce.
template <typename Frag>
__device__ __forceinline__ void load_frag(Frag& f, const __half* p, unsigned ld) {
    wmma::load_matrix_sync(f, p, ld);
}
#define RW_BF16_LOAD(USE, LAY, PTX)                                                              \
    __device__ __forceinline__ void load_frag(                                                  \
        wmma::fragment<wmma::USE, 16, 16, 16, __nv_bfloat16, wmma::LAY>& f,                     \
        const __nv_bfloat16* p, unsigned ld) {                                                  \
        unsigned* r = reinterpret_cast<unsigned*>(f.x);                                         \
        const unsigned s = shared_address(p);                                                  \
        asm volatile(PTX " {%0, %1, %2, %3}, [%4], %5;\n"                                       \
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])                           \
                     : "r"(s), "r"(ld)                                                          \
                     : "memory");                                                               \
    }
RW_BF16_LOAD(matrix_a, row_major, "wmma.load.a.sync.aligned.row.m16n16k16.shared.bf16")
RW_BF16_LOAD(matrix_a, col_major, "wmma.load.a.sync.aligned.col.m16n16k16.shared.bf16")
RW_BF16_LOAD(matrix_b, row_major, "wmma.load.b.sync.aligned.row.m16n16k16.shared.bf16")
RW_BF16_LOAD(matrix_b, col_major, "wmma.load.b.sync.aligned.col.m16n16k16.shared.bf16")
#undef RW_BF16_LOAD

// One operand's k-tile copier: the tile is R x C elements with C contiguous (C + kFastPad per
// shared row); K_CONTIG says whether k runs along C (else along R). Each thread owns the
// chunks (rt + i * kRowStep, ct): its global pointer and shared offset are computed once and
// a k-tile only adds k0 (K_CONTIG) or k0 * ld. Interior tiles copy 16 bytes unguarded;
// edge tiles copy min(16, bytes left in the row) and zero-fill the rest.
template <typename T, int R, int C, int THREADS, bool K_CONTIG>
struct TileCopier {
    static constexpr int kVec = 16 / sizeof(T);
    static constexpr int kPerRow = C / kVec;
    static constexpr int kRowStep = THREADS / kPerRow;
    static constexpr int kIters = R / kRowStep;
    static constexpr int kLd = C + kFastPad;
    static_assert(C % kVec == 0 && THREADS % kPerRow == 0 && R % kRowStep == 0,
                  "every thread copies whole chunks of one column");

    const T* base;  // the matrix
    const T* g;     // this thread's first chunk at k = 0
    long long ld;
    int o, c;       // its (outer, contiguous) position at k = 0
    int rows, cols; // the matrix's extents (outer, contiguous)
    int soff;       // its element offset in a stage

    __device__ __forceinline__ TileCopier(const T* m, long long ld_, int o0, int c0, int rows_,
                                          int cols_)
        : base(m), ld(ld_), rows(rows_), cols(cols_) {
        const int rt = threadIdx.x / kPerRow, ct = (threadIdx.x % kPerRow) * kVec;
        o = o0 + rt;
        c = c0 + ct;
        g = m + o * ld + c;
        soff = rt * kLd + ct;
    }

    __device__ __forceinline__ void copy(T* stage, int k0, bool full) const {
        const T* src = g + (K_CONTIG ? static_cast<long long>(k0) : k0 * ld);
        T* dst = stage + soff;
        if (full) {
#pragma unroll
            for (int i = 0; i < kIters; ++i)
                cp_async16_full(shared_address(dst + i * kRowStep * kLd),
                                src + i * kRowStep * ld);
        } else {
            const int ci = c + (K_CONTIG ? k0 : 0);
            const int left = cols - ci;
#pragma unroll
            for (int i = 0; i < kIters; ++i) {
                const int oi = o + i * kRowStep + (K_CONTIG ? 0 : k0);
                const bool in = oi < rows && left > 0;
                const int bytes = in ? min(left, kVec) * static_cast<int>(sizeof(T)) : 0;
                cp_async16(shared_address(dst + i * kRowStep * kLd),
                           in ? src + i * kRowStep * ld : base, bytes);
            }
        }
    }
};

template <typename T, bool A_ROW, bool B_ROW, int BM, int BN, int BK_, int WARPS_M, int WARPS_N,
          int STAGES>
struct FastGemm {
    static constexpr int kThreads = WARPS_M * WARPS_N * 32;
    static constexpr int BK = BK_;
    static constexpr int KSTEPS = BK / 16;
    static_assert(KSTEPS % 2 == 0, "fragments alternate between two buffers per k-step");
    static_assert(STAGES >= 2, "a multi-stage pipeline");
    static constexpr int WTM = BM / WARPS_M, WTN = BN / WARPS_N;  // warp tile
    static constexpr int FRM = WTM / 16, FRN = WTN / 16;          // fragments per warp
    // Shared tiles in the operands' layouts: A [BM][BK] or [BK][BM]; B [BK][BN] or [BN][BK].
    static constexpr int kLdA = (A_ROW ? BK : BM) + kFastPad;
    static constexpr int kLdB = (B_ROW ? BN : BK) + kFastPad;
    static constexpr int kStageA = (A_ROW ? BM : BK) * kLdA;
    static constexpr int kStageB = (B_ROW ? BK : BN) * kLdB;
    static constexpr int kScratchLd = WTN + 4;  // floats: rows 16-byte aligned, skewed
    static constexpr int kSmemBytes = STAGES * (kStageA + kStageB) * sizeof(T);
    static_assert(kSmemBytes >= (kThreads / 32) * 16 * kScratchLd * 4, "scratch strips fit");

    using LayA = typename If<A_ROW, wmma::row_major, wmma::col_major>::type;
    using LayB = typename If<B_ROW, wmma::row_major, wmma::col_major>::type;
    using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, T, LayA>;
    using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 16, T, LayB>;
    using CopyA = TileCopier<T, A_ROW ? BM : BK, A_ROW ? BK : BM, kThreads, A_ROW>;
    using CopyB = TileCopier<T, B_ROW ? BK : BN, B_ROW ? BN : BK, kThreads, !B_ROW>;

    // Fragments of k-step kk of a stage (sa / sb: the stage plus the warp's offset).
    __device__ __forceinline__ static void load_frags(FragA (&fa)[FRM], FragB (&fb)[FRN],
                                                      const T* sa, const T* sb, int kk) {
#pragma unroll
        for (int i = 0; i < FRM; ++i)
            load_frag(fa[i], A_ROW ? sa + i * 16 * kLdA + kk : sa + kk * kLdA + i * 16, kLdA);
#pragma unroll
        for (int j = 0; j < FRN; ++j)
            load_frag(fb[j], B_ROW ? sb + kk * kLdB + j * 16 : sb + j * 16 * kLdB + kk, kLdB);
    }

    __device__ static void run(const T* a, const T* b, int M, int N, int K, long long lda,
                               long long ldb, long long sba, long long sbb, int batch,
                               const Epilogue ep, int vec_ok) {
        extern __shared__ __align__(128) unsigned char smem[];
        T* sa_base = reinterpret_cast<T*>(smem);
        T* sb_base = sa_base + STAGES * kStageA;

        int m0, n0;
        grouped_tile<BM, BN>(M, N, blockIdx.x, m0, n0);

        const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
        const int wm = (warp / WARPS_N) * WTM, wn = (warp % WARPS_N) * WTN;
        const int KT = (K + BK - 1) / BK;
        const bool mn_full = m0 + BM <= M && n0 + BN <= N;
        // The warp's corner in a stage.
        const int warp_a = A_ROW ? wm * kLdA : wm;
        const int warp_b = B_ROW ? wn : wn * kLdB;

        for (int bi = blockIdx.y; bi < batch; bi += gridDim.y) {
            const CopyA copy_a(a + bi * sba, lda, A_ROW ? m0 : 0, A_ROW ? 0 : m0,
                               A_ROW ? M : K, A_ROW ? K : M);
            const CopyB copy_b(b + bi * sbb, ldb, B_ROW ? 0 : n0, B_ROW ? n0 : 0,
                               B_ROW ? K : N, B_ROW ? N : K);
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[FRM][FRN];
#pragma unroll
            for (int i = 0; i < FRM; ++i)
#pragma unroll
                for (int j = 0; j < FRN; ++j) wmma::fill_fragment(acc[i][j], 0.0f);

            // Prologue: stages 0 .. STAGES-2 in flight, the first ready, its first fragments
            // in registers.
#pragma unroll
            for (int s = 0; s < STAGES - 1; ++s) {
                if (s < KT) {
                    const bool full = mn_full && (s + 1) * BK <= K;
                    copy_a.copy(sa_base + s * kStageA, s * BK, full);
                    copy_b.copy(sb_base + s * kStageB, s * BK, full);
                }
                cp_async_commit();
            }
            cp_async_wait<STAGES - 2>();
            __syncthreads();

            FragA fa[2][FRM];
            FragB fb[2][FRN];
            int read = 0, write = STAGES - 1;  // stage slots: computed, being filled
            const T* sa = sa_base + warp_a;
            const T* sb = sb_base + warp_b;
            load_frags(fa[0], fb[0], sa, sb, 0);

            // Main loop, one k-tile per trip and one barrier per k-tile. k-step kk computes
            // from the fragments loaded one step earlier while the next step's fragments load
            // (the last step's next fragments come from the next stage, after the barrier
            // that makes it visible); the first step issues the copies of the k-tile
            // STAGES - 1 ahead into the slot every warp finished reading before that barrier.
            for (int kt = 0; kt < KT; ++kt) {
#pragma unroll
                for (int ks = 0; ks < KSTEPS; ++ks) {
                    const int cur = ks & 1;
                    if (ks == KSTEPS - 1) {
                        cp_async_wait<STAGES - 2>();
                        __syncthreads();
                        read = read + 1 == STAGES ? 0 : read + 1;
                        sa = sa_base + read * kStageA + warp_a;
                        sb = sb_base + read * kStageB + warp_b;
                    }
                    load_frags(fa[cur ^ 1], fb[cur ^ 1], sa, sb,
                               ks == KSTEPS - 1 ? 0 : (ks + 1) * 16);
                    if (ks == 0) {
                        const int next = kt + STAGES - 1;
                        if (next < KT) {
                            const bool full = mn_full && (next + 1) * BK <= K;
                            copy_a.copy(sa_base + write * kStageA, next * BK, full);
                            copy_b.copy(sb_base + write * kStageB, next * BK, full);
                        }
                        cp_async_commit();
                        write = write + 1 == STAGES ? 0 : write + 1;
                    }
#pragma unroll
                    for (int i = 0; i < FRM; ++i)
#pragma unroll
                        for (int j = 0; j < FRN; ++j)
                            wmma::mma_sync(acc[i][j], fa[cur][i], fb[cur][j], acc[i][j]);
                }
            }
            cp_async_wait<0>();
            __syncthreads();

            // Epilogue: each warp passes one 16-row strip of its tile at a time through a
            // shared scratch strip; each lane then writes runs of 8 outputs.
            float* scratch = reinterpret_cast<float*>(smem) + warp * 16 * kScratchLd;
#pragma unroll
            for (int i = 0; i < FRM; ++i) {
#pragma unroll
                for (int j = 0; j < FRN; ++j)
                    wmma::store_matrix_sync(scratch + j * 16, acc[i][j], kScratchLd,
                                            wmma::mem_row_major);
                __syncwarp();
#pragma unroll 1
                for (int run = lane; run < 16 * WTN / 8; run += 32) {
                    const int row = run / (WTN / 8), col = (run % (WTN / 8)) * 8;
                    const int gm = m0 + wm + i * 16 + row, gn = n0 + wn + col;
                    if (gm < M && gn < N)
                        store8(ep, bi, gm, gn, M, N, scratch + row * kScratchLd + col, vec_ok);
                }
                __syncwarp();
            }
            __syncthreads();
        }
    }

    // Writes D[bi, gm, gn .. gn + 8) from 8 accumulators: one 16-byte store when the whole run
    // is inside the row and D's rows are 16-byte aligned, else element by element. C and D
    // hold T or float (d_code / c_code say which).
    __device__ static void store8(const Epilogue& ep, int bi, int gm, int gn, int M, int N,
                                  const float* src, int vec_ok) {
        const float4 lo = *reinterpret_cast<const float4*>(src);
        const float4 hi = *reinterpret_cast<const float4*>(src + 4);
        float v[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
        const float alpha = static_cast<float>(ep.alpha), beta = static_cast<float>(ep.beta);
        const bool with_c = ep.c != nullptr && ep.beta != 0.0;
        const long long c0 = bi * ep.sbc + gm * ep.scm + gn * ep.scn;
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            v[e] *= alpha;
            if (with_c && gn + e < N) {
                const long long ci = c0 + e * ep.scn;
                v[e] += beta * (ep.c_code == kF32 ? static_cast<const float*>(ep.c)[ci]
                                                  : to_float(static_cast<const T*>(ep.c)[ci]));
            }
        }
        const long long base = (static_cast<long long>(bi) * M + gm) * N + gn;
        if (vec_ok && gn + 8 <= N) {
            union {
                uint4 u;
                T h[8];
            } pack;
#pragma unroll
            for (int e = 0; e < 8; ++e) pack.h[e] = from_float<T>(v[e]);
            *reinterpret_cast<uint4*>(static_cast<T*>(ep.d) + base) = pack.u;
        } else if (ep.d_code == kF32) {
            for (int e = 0; e < 8 && gn + e < N; ++e) static_cast<float*>(ep.d)[base + e] = v[e];
        } else {
            for (int e = 0; e < 8 && gn + e < N; ++e)
                static_cast<T*>(ep.d)[base + e] = from_float<T>(v[e]);
        }
    }
};

}  // namespace rw

// Entry point rw_fast_<f16|bf16>_<BM>x<BN>x<BK>_s<STAGES>_<A layout><B layout> (r / c).
// lda / ldb: the operands' leading dimensions (elements). vec_ok: D is in the operands' dtype
// with 16-byte aligned rows. Grid: x = output tiles, y = batch; dynamic shared memory
// FastGemm<...>::kSmemBytes.
#define RW_FAST(NAME, T, AROW, BROW, BM, BN, BK, WM, WN, ST, MINB)                                        \
    extern "C" __global__ void __launch_bounds__(WM * WN * 32, MINB)                              \
        NAME(const T* a, const T* b, const void* c, void* d, int M, int N, int K, long long lda,  \
             long long ldb, long long scm, long long scn, long long sba, long long sbb,           \
             long long sbc, int batch, double alpha, double beta, int c_code, int d_code,         \
             int vec_ok) {                                                                        \
        if constexpr (rw::selected(#NAME)) {                                                      \
            const rw::Epilogue ep{c, d, scm, scn, sbc, alpha, beta, c_code, d_code, 0};           \
            rw::FastGemm<T, AROW, BROW, BM, BN, BK, WM, WN, ST>::run(a, b, M, N, K, lda, ldb, sba,    \
                                                                 sbb, batch, ep, vec_ok);         \
        }                                                                                         \
    }

// MINB: resident blocks per SM the register budget is cut for (2: at most 128 registers).
#define RW_FAST_LAYOUTS(PREFIX, T, BM, BN, BK, WM, WN, ST, MINB)          \
    RW_FAST(PREFIX##_rr, T, true, true, BM, BN, BK, WM, WN, ST, MINB)     \
    RW_FAST(PREFIX##_rc, T, true, false, BM, BN, BK, WM, WN, ST, MINB)    \
    RW_FAST(PREFIX##_cr, T, false, true, BM, BN, BK, WM, WN, ST, MINB)    \
    RW_FAST(PREFIX##_cc, T, false, false, BM, BN, BK, WM, WN, ST, MINB)

// Kept in step with FAST_TILES in backends/raw_wmma.py.
#define RW_FAST_DTYPE(SHORT, T)                                                                   \
    RW_FAST_LAYOUTS(rw_fast_##SHORT##_128x256x64_s3, T, 128, 256, 64, 2, 4, 3, 1)                 \
    RW_FAST_LAYOUTS(rw_fast_##SHORT##_128x128x64_s3, T, 128, 128, 64, 2, 2, 3, 2)                 \
    RW_FAST_LAYOUTS(rw_fast_##SHORT##_256x128x64_s3, T, 256, 128, 64, 4, 2, 3, 1)                 \
    RW_FAST_LAYOUTS(rw_fast_##SHORT##_128x256x64_s4, T, 128, 256, 64, 2, 4, 4, 1)                 \
    RW_FAST_LAYOUTS(rw_fast_##SHORT##_128x256x32_s3, T, 128, 256, 32, 2, 4, 3, 1)                 \
    RW_FAST_LAYOUTS(rw_fast_##SHORT##_128x128x32_s4, T, 128, 128, 32, 2, 4, 4, 1)                 \
    RW_FAST_LAYOUTS(rw_fast_##SHORT##_128x128x32_s3, T, 128, 128, 32, 2, 2, 3, 2)

RW_FAST_DTYPE(f16, __half)
RW_FAST_DTYPE(bf16, __nv_bfloat16)
