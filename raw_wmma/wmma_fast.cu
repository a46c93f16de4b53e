// The fast f16 / bf16 WMMA GEMM (f32 accumulation): block tiles in shared memory filled by a
// multi-stage cp.async pipeline, several 16x16x16 fragments per warp, a padded shared layout
// free of bank conflicts, grouped block order for L2 reuse and a vectorized epilogue.
//
// D[b] = alpha * A[b] @ B[b] + beta * C[b] for any M, N, K >= 1. A and B are each row- or
// column-major; each shared tile keeps its operand's layout (rows padded by 8 elements) and
// the WMMA loads take that layout. Every 16-byte cp.async copies min(16, bytes left in the
// row) and zero-fills the rest, so ragged edges read nothing outside the matrix. The host
// guarantees what cp.async needs: 16-byte aligned base pointers, leading dimensions and batch
// strides that are multiples of 8 elements. The accumulators leave through a per-warp shared
// scratch tile; each lane then writes 8 consecutive outputs with one 16-byte store where the
// row allows it, element by element (guarded) elsewhere.
//
// One templated body (fast_gemm); the extern "C" entry points below name each instance.
#include "common.cuh"

namespace rw {
using namespace nvcuda;

constexpr int kFastBK = 32;
constexpr int kFastPad = 8;  // elements added to each shared row: 16 bytes, conflict-free

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, int src_bytes) {
    const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem),
                 "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

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

// Copies rows [r0, r0 + R) x cols [c0, c0 + C) of a matrix with contiguous columns and row
// stride ld into a shared [R][C + pad] tile, 16 bytes per cp.async, zero outside rows x cols.
template <typename T, int R, int C, int THREADS>
__device__ __forceinline__ void load_tile(T* tile, const T* g, long long ld, int r0, int c0,
                                          int rows, int cols) {
    constexpr int kVec = 16 / sizeof(T);
    constexpr int kChunks = R * C / kVec;
    static_assert(kChunks % THREADS == 0, "every thread copies the same number of chunks");
#pragma unroll
    for (int i = 0; i < kChunks / THREADS; ++i) {
        const int chunk = threadIdx.x + i * THREADS;
        const int r = chunk / (C / kVec), c = (chunk % (C / kVec)) * kVec;
        const int gr = r0 + r, gc = c0 + c;
        int bytes = 0;
        const T* src = g;
        if (gr < rows && gc < cols) {
            bytes = min(cols - gc, kVec) * static_cast<int>(sizeof(T));
            src = g + gr * ld + gc;
        }
        cp_async16(tile + r * (C + kFastPad) + c, src, bytes);
    }
}

template <typename T, bool A_ROW, bool B_ROW, int BM, int BN, int WARPS_M, int WARPS_N,
          int STAGES>
struct FastGemm {
    static constexpr int kThreads = WARPS_M * WARPS_N * 32;
    static constexpr int BK = kFastBK;
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

    __device__ static void load_stage(T* sa, T* sb, const T* A, const T* B, long long lda,
                                      long long ldb, int m0, int n0, int k0, int M, int N, int K) {
        if (A_ROW) load_tile<T, BM, BK, kThreads>(sa, A, lda, m0, k0, M, K);
        else load_tile<T, BK, BM, kThreads>(sa, A, lda, k0, m0, K, M);
        if (B_ROW) load_tile<T, BK, BN, kThreads>(sb, B, ldb, k0, n0, K, N);
        else load_tile<T, BN, BK, kThreads>(sb, B, ldb, n0, k0, N, K);
    }

    __device__ static void run(const T* a, const T* b, int M, int N, int K, long long lda,
                               long long ldb, long long sba, long long sbb, int batch,
                               const Epilogue ep, int vec_ok) {
        extern __shared__ __align__(128) unsigned char smem[];
        T* sa_base = reinterpret_cast<T*>(smem);
        T* sb_base = sa_base + STAGES * kStageA;

        // Grouped block order: 8 block rows sweep the block columns together (L2 reuse).
        const int tiles_m = (M + BM - 1) / BM, tiles_n = (N + BN - 1) / BN;
        constexpr int kGroup = 8;
        const int per_group = kGroup * tiles_n;
        const int group = blockIdx.x / per_group;
        const int first_m = group * kGroup;
        const int group_m = min(tiles_m - first_m, kGroup);
        const int in_group = blockIdx.x % per_group;
        const int m0 = (first_m + in_group % group_m) * BM;
        const int n0 = (in_group / group_m) * BN;

        const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
        const int wm = (warp / WARPS_N) * WTM, wn = (warp % WARPS_N) * WTN;
        const int KT = (K + BK - 1) / BK;

        for (int bi = blockIdx.y; bi < batch; bi += gridDim.y) {
            const T* A = a + bi * sba;
            const T* B = b + bi * sbb;
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[FRM][FRN];
#pragma unroll
            for (int i = 0; i < FRM; ++i)
#pragma unroll
                for (int j = 0; j < FRN; ++j) wmma::fill_fragment(acc[i][j], 0.0f);

#pragma unroll
            for (int s = 0; s < STAGES - 1; ++s) {
                if (s < KT)
                    load_stage(sa_base + s * kStageA, sb_base + s * kStageB, A, B, lda, ldb, m0,
                               n0, s * BK, M, N, K);
                cp_async_commit();
            }

            for (int kt = 0; kt < KT; ++kt) {
                cp_async_wait<STAGES - 2>();
                __syncthreads();
                const int next = kt + STAGES - 1;
                if (next < KT) {
                    const int s = next % STAGES;
                    load_stage(sa_base + s * kStageA, sb_base + s * kStageB, A, B, lda, ldb, m0,
                               n0, next * BK, M, N, K);
                }
                cp_async_commit();

                const T* sa = sa_base + (kt % STAGES) * kStageA;
                const T* sb = sb_base + (kt % STAGES) * kStageB;
#pragma unroll
                for (int kk = 0; kk < BK; kk += 16) {
                    wmma::fragment<wmma::matrix_a, 16, 16, 16, T, LayA> fa[FRM];
#pragma unroll
                    for (int i = 0; i < FRM; ++i) {
                        const int r = wm + i * 16;
                        wmma::load_matrix_sync(fa[i], A_ROW ? sa + r * kLdA + kk : sa + kk * kLdA + r,
                                               kLdA);
                    }
#pragma unroll
                    for (int j = 0; j < FRN; ++j) {
                        const int c = wn + j * 16;
                        wmma::fragment<wmma::matrix_b, 16, 16, 16, T, LayB> fb;
                        wmma::load_matrix_sync(fb, B_ROW ? sb + kk * kLdB + c : sb + c * kLdB + kk,
                                               kLdB);
#pragma unroll
                        for (int i = 0; i < FRM; ++i) wmma::mma_sync(acc[i][j], fa[i], fb, acc[i][j]);
                    }
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

// Entry point rw_fast_<f16|bf16>_<BM>x<BN>x32_s<STAGES>_<A layout><B layout> (r / c).
// lda / ldb: the operands' leading dimensions (elements). vec_ok: D is in the operands' dtype
// with 16-byte aligned rows. Grid: x = output tiles, y = batch; dynamic shared memory
// FastGemm<...>::kSmemBytes.
#define RW_FAST(NAME, T, AROW, BROW, BM, BN, WM, WN, ST, MINB)                                        \
    extern "C" __global__ void __launch_bounds__(WM * WN * 32, MINB)                              \
        NAME(const T* a, const T* b, const void* c, void* d, int M, int N, int K, long long lda,  \
             long long ldb, long long scm, long long scn, long long sba, long long sbb,           \
             long long sbc, int batch, double alpha, double beta, int c_code, int d_code,         \
             int vec_ok) {                                                                        \
        if constexpr (rw::selected(#NAME)) {                                                      \
            const rw::Epilogue ep{c, d, scm, scn, sbc, alpha, beta, c_code, d_code, 0};           \
            rw::FastGemm<T, AROW, BROW, BM, BN, WM, WN, ST>::run(a, b, M, N, K, lda, ldb, sba,    \
                                                                 sbb, batch, ep, vec_ok);         \
        }                                                                                         \
    }

// MINB: resident blocks per SM the register budget is cut for (2: at most 128 registers).
#define RW_FAST_LAYOUTS(PREFIX, T, BM, BN, WM, WN, ST, MINB)           \
    RW_FAST(PREFIX##_rr, T, true, true, BM, BN, WM, WN, ST, MINB)      \
    RW_FAST(PREFIX##_rc, T, true, false, BM, BN, WM, WN, ST, MINB)     \
    RW_FAST(PREFIX##_cr, T, false, true, BM, BN, WM, WN, ST, MINB)     \
    RW_FAST(PREFIX##_cc, T, false, false, BM, BN, WM, WN, ST, MINB)

RW_FAST_LAYOUTS(rw_fast_f16_128x128x32_s3, __half, 128, 128, 2, 4, 3, 2)
RW_FAST_LAYOUTS(rw_fast_f16_128x128x32_s4, __half, 128, 128, 2, 4, 4, 1)
RW_FAST_LAYOUTS(rw_fast_f16_128x256x32_s3, __half, 128, 256, 2, 4, 3, 1)
RW_FAST_LAYOUTS(rw_fast_bf16_128x128x32_s3, __nv_bfloat16, 128, 128, 2, 4, 3, 2)
RW_FAST_LAYOUTS(rw_fast_bf16_128x128x32_s4, __nv_bfloat16, 128, 128, 2, 4, 4, 1)
RW_FAST_LAYOUTS(rw_fast_bf16_128x256x32_s3, __nv_bfloat16, 128, 256, 2, 4, 3, 1)
