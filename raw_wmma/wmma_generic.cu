// The generic WMMA GEMM: every fragment type of the CUDA guide with a byte-or-wider element
// (f16 with f32 or f16 accumulation, bf16, tf32, f64, s8, u8), in every fragment shape, with A
// and B each row- or column-major.
//
// D[b] = alpha * A[b] @ B[b] + beta * C[b] for any M, N, K >= 1 and any strides: each block
// stages a BM x BK tile of A and a BK x BN tile of B through shared memory with element-wise,
// bounds-checked loads (zero outside the matrix), so global operands need no alignment at all
// and every WMMA load reads an aligned, padded shared tile in the operand's own layout. The
// accumulators go back through shared memory to a guarded, element-wise epilogue.
//
// One templated body (generic_gemm); the extern "C" entry points below name each instance.
#include "common.cuh"

namespace rw {
using namespace nvcuda;

// Fragment descriptions: storage type in memory (T), fragment element type (FragT), accumulator
// type and the m-n-k shape, plus how many fragments one warp owns and how deep a K tile is.
template <typename T_, typename FragT_, typename Acc_, int FM_, int FN_, int FK_, int WFM_,
          int WFN_, int KSTEPS_>
struct Frag {
    using T = T_;
    using FragT = FragT_;
    using Acc = Acc_;
    static constexpr int FM = FM_, FN = FN_, FK = FK_;
    static constexpr int WFM = WFM_, WFN = WFN_, KSTEPS = KSTEPS_;
};

template <typename FragT>
struct RoundOperand {
    template <typename F>
    __device__ static void apply(F&) {}
};

// tf32: the f32 operands are rounded to tf32 (10 mantissa bits) as the guide prescribes.
template <>
struct RoundOperand<wmma::precision::tf32> {
    template <typename F>
    __device__ static void apply(F& f) {
        for (int i = 0; i < f.num_elements; ++i) f.x[i] = wmma::__float_to_tf32(f.x[i]);
    }
};

template <typename T>
__device__ __forceinline__ T zero_of() { return T(0); }
template <>
__device__ __forceinline__ __half zero_of<__half>() { return __float2half(0.0f); }
template <>
__device__ __forceinline__ __nv_bfloat16 zero_of<__nv_bfloat16>() { return __float2bfloat16(0.0f); }

constexpr int kGenericThreads = 128;  // 2 x 2 warps

// Copies rows [r0, r0 + R) x cols [c0, c0 + C) of a strided matrix into a shared tile whose
// C direction is contiguous; outside rows x cols it writes zeros.
template <typename T, typename TileT, int R, int C>
__device__ __forceinline__ void stage(T* tile, const T* g, long long s_r, long long s_c, int r0, int c0,
                             int rows, int cols) {
    for (int i = threadIdx.x; i < R * C; i += kGenericThreads) {
        const int r = i / C, c = i % C;
        const int gr = r0 + r, gc = c0 + c;
        tile[TileT::at(r, c)] = (gr < rows && gc < cols) ? g[gr * s_r + gc * s_c] : zero_of<T>();
    }
}

template <typename F, bool A_ROW, bool B_ROW>
__device__ __forceinline__ void generic_gemm(const void* a_, const void* b_, int M, int N, int K,
                             long long sam, long long sak, long long sbk, long long sbn,
                             long long sba, long long sbb, int batch, const Epilogue ep) {
    using T = typename F::T;
    using Acc = typename F::Acc;
    constexpr int FM = F::FM, FN = F::FN, FK = F::FK;
    constexpr int BM = 2 * F::WFM * FM, BN = 2 * F::WFN * FN, BK = F::KSTEPS * FK;
    using LayA = typename If<A_ROW, wmma::row_major, wmma::col_major>::type;
    using LayB = typename If<B_ROW, wmma::row_major, wmma::col_major>::type;
    // A row-major: [BM][BK] cut along K by FK; column-major: [BK][BM] cut along M by FM.
    using TileA = typename If<A_ROW, Tile<T, BM, BK, FK>, Tile<T, BK, BM, FM>>::type;
    using TileB = typename If<B_ROW, Tile<T, BK, BN, FN>, Tile<T, BN, BK, FK>>::type;
    using TileD = Tile<Acc, BM, BN, FN>;
    constexpr int kOperandBytes = TileA::kBytes + TileB::kBytes;
    constexpr int kBytes = kOperandBytes > TileD::kBytes ? kOperandBytes : TileD::kBytes;
    __shared__ __align__(128) unsigned char smem[kBytes];
    T* sa = reinterpret_cast<T*>(smem);
    T* sb = reinterpret_cast<T*>(smem + TileA::kBytes);
    Acc* sd = reinterpret_cast<Acc*>(smem);

    const int tiles_n = (N + BN - 1) / BN;
    const int m0 = (blockIdx.x / tiles_n) * BM, n0 = (blockIdx.x % tiles_n) * BN;
    const int warp = threadIdx.x / 32;
    const int wm = (warp / 2) * F::WFM * FM, wn = (warp % 2) * F::WFN * FN;

    for (int b = blockIdx.y; b < batch; b += gridDim.y) {
        const T* A = static_cast<const T*>(a_) + b * sba;
        const T* B = static_cast<const T*>(b_) + b * sbb;
        wmma::fragment<wmma::accumulator, FM, FN, FK, Acc> acc[F::WFM][F::WFN];
        for (int i = 0; i < F::WFM; ++i)
            for (int j = 0; j < F::WFN; ++j) wmma::fill_fragment(acc[i][j], Acc(0));

        for (int k0 = 0; k0 < K; k0 += BK) {
            if (A_ROW) stage<T, TileA, BM, BK>(sa, A, sam, sak, m0, k0, M, K);
            else stage<T, TileA, BK, BM>(sa, A, sak, sam, k0, m0, K, M);
            if (B_ROW) stage<T, TileB, BK, BN>(sb, B, sbk, sbn, k0, n0, K, N);
            else stage<T, TileB, BN, BK>(sb, B, sbn, sbk, n0, k0, N, K);
            __syncthreads();
#pragma unroll
            for (int kk = 0; kk < BK; kk += FK) {
                wmma::fragment<wmma::matrix_a, FM, FN, FK, typename F::FragT, LayA> fa[F::WFM];
                wmma::fragment<wmma::matrix_b, FM, FN, FK, typename F::FragT, LayB> fb[F::WFN];
#pragma unroll
                for (int i = 0; i < F::WFM; ++i) {
                    const int r = wm + i * FM;
                    const T* p = A_ROW ? sa + TileA::at(r, kk) : sa + TileA::at(kk, r);
                    wmma::load_matrix_sync(fa[i], p, TileA::kLd);
                    RoundOperand<typename F::FragT>::apply(fa[i]);
                }
#pragma unroll
                for (int j = 0; j < F::WFN; ++j) {
                    const int c = wn + j * FN;
                    const T* p = B_ROW ? sb + TileB::at(kk, c) : sb + TileB::at(c, kk);
                    wmma::load_matrix_sync(fb[j], p, TileB::kLd);
                    RoundOperand<typename F::FragT>::apply(fb[j]);
                }
#pragma unroll
                for (int i = 0; i < F::WFM; ++i)
#pragma unroll
                    for (int j = 0; j < F::WFN; ++j) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
            }
            __syncthreads();
        }

        for (int i = 0; i < F::WFM; ++i)
            for (int j = 0; j < F::WFN; ++j)
                wmma::store_matrix_sync(sd + TileD::at(wm + i * FM, wn + j * FN), acc[i][j],
                                        TileD::kLd, wmma::mem_row_major);
        __syncthreads();
        for (int i = threadIdx.x; i < BM * BN; i += kGenericThreads) {
            const int r = i / BN, c = i % BN;
            if (m0 + r < M && n0 + c < N)
                write_element<Acc>(ep, b, m0 + r, n0 + c, N, M, sd[TileD::at(r, c)]);
        }
        __syncthreads();
    }
}

// Fragment sets (T, fragment type, accumulator, shape, fragments per warp, k-steps per tile).
using F16F32_16 = Frag<__half, __half, float, 16, 16, 16, 2, 2, 2>;
using F16F32_32 = Frag<__half, __half, float, 32, 8, 16, 1, 4, 2>;
using F16F32_8 = Frag<__half, __half, float, 8, 32, 16, 4, 1, 2>;
using F16F16_16 = Frag<__half, __half, __half, 16, 16, 16, 2, 2, 2>;
using F16F16_32 = Frag<__half, __half, __half, 32, 8, 16, 1, 4, 2>;
using F16F16_8 = Frag<__half, __half, __half, 8, 32, 16, 4, 1, 2>;
using BF16_16 = Frag<__nv_bfloat16, __nv_bfloat16, float, 16, 16, 16, 2, 2, 2>;
using BF16_32 = Frag<__nv_bfloat16, __nv_bfloat16, float, 32, 8, 16, 1, 4, 2>;
using BF16_8 = Frag<__nv_bfloat16, __nv_bfloat16, float, 8, 32, 16, 4, 1, 2>;
using TF32_16 = Frag<float, wmma::precision::tf32, float, 16, 16, 8, 2, 2, 4>;
using F64_8 = Frag<double, double, double, 8, 8, 4, 2, 2, 4>;
using S8_16 = Frag<signed char, signed char, int, 16, 16, 16, 2, 2, 2>;
using S8_32 = Frag<signed char, signed char, int, 32, 8, 16, 1, 4, 2>;
using S8_8 = Frag<signed char, signed char, int, 8, 32, 16, 4, 1, 2>;
using U8_16 = Frag<unsigned char, unsigned char, int, 16, 16, 16, 2, 2, 2>;
using U8_32 = Frag<unsigned char, unsigned char, int, 32, 8, 16, 1, 4, 2>;
using U8_8 = Frag<unsigned char, unsigned char, int, 8, 32, 16, 4, 1, 2>;

}  // namespace rw

// Entry point rw_gemm_<dtype>_<acc>_<shape>_<A layout><B layout> (r: row-major, c: column).
// Grid: x = output tiles (row-major over tiles), y = batch (strided loop).
#define RW_GENERIC(NAME, FRAG, AROW, BROW)                                                       \
    extern "C" __global__ void __launch_bounds__(rw::kGenericThreads, 1)                            \
        NAME(const void* a, const void* b, const void* c, void* d, int M, int N, int K,          \
             long long sam, long long sak, long long sbk, long long sbn, long long scm,          \
             long long scn, long long sba, long long sbb, long long sbc, int batch,              \
             double alpha, double beta, int c_code, int d_code, int satf) {                      \
        if constexpr (rw::selected(#NAME)) {                                                     \
            const rw::Epilogue ep{c, d, scm, scn, sbc, alpha, beta, c_code, d_code, satf};       \
            rw::generic_gemm<rw::FRAG, AROW, BROW>(a, b, M, N, K, sam, sak, sbk, sbn, sba, sbb,  \
                                                   batch, ep);                                   \
        }                                                                                        \
    }

#define RW_GENERIC_LAYOUTS(PREFIX, FRAG)          \
    RW_GENERIC(PREFIX##_rr, FRAG, true, true)     \
    RW_GENERIC(PREFIX##_rc, FRAG, true, false)    \
    RW_GENERIC(PREFIX##_cr, FRAG, false, true)    \
    RW_GENERIC(PREFIX##_cc, FRAG, false, false)

RW_GENERIC_LAYOUTS(rw_gemm_f16_f32_16x16x16, F16F32_16)
RW_GENERIC_LAYOUTS(rw_gemm_f16_f32_32x8x16, F16F32_32)
RW_GENERIC_LAYOUTS(rw_gemm_f16_f32_8x32x16, F16F32_8)
RW_GENERIC_LAYOUTS(rw_gemm_f16_f16_16x16x16, F16F16_16)
RW_GENERIC_LAYOUTS(rw_gemm_f16_f16_32x8x16, F16F16_32)
RW_GENERIC_LAYOUTS(rw_gemm_f16_f16_8x32x16, F16F16_8)
RW_GENERIC_LAYOUTS(rw_gemm_bf16_f32_16x16x16, BF16_16)
RW_GENERIC_LAYOUTS(rw_gemm_bf16_f32_32x8x16, BF16_32)
RW_GENERIC_LAYOUTS(rw_gemm_bf16_f32_8x32x16, BF16_8)
RW_GENERIC_LAYOUTS(rw_gemm_tf32_f32_16x16x8, TF32_16)
RW_GENERIC_LAYOUTS(rw_gemm_f64_f64_8x8x4, F64_8)
RW_GENERIC_LAYOUTS(rw_gemm_s8_s32_16x16x16, S8_16)
RW_GENERIC_LAYOUTS(rw_gemm_s8_s32_32x8x16, S8_32)
RW_GENERIC_LAYOUTS(rw_gemm_s8_s32_8x32x16, S8_8)
RW_GENERIC_LAYOUTS(rw_gemm_u8_s32_16x16x16, U8_16)
RW_GENERIC_LAYOUTS(rw_gemm_u8_s32_32x8x16, U8_32)
RW_GENERIC_LAYOUTS(rw_gemm_u8_s32_8x32x16, U8_8)
