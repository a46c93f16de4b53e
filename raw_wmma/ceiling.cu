// Register-only ceilings of the tensor-core instructions the raw WMMA kernels are built on:
// what one instruction family can do on this GPU with no memory traffic at all, the bound every
// GEMM figure of that family is reported against.
//
// Each warp loads one A and one B fragment once, then runs `iterations` rounds of kChains
// independent multiply-accumulates into accumulators held in registers, and at the end stores
// the sum of its accumulators (out[warp][M * N]), so no instruction is dead. One round of one
// warp does kChains * 2 * M * N * K operations (for b1: the AND and the popcount-add of a pair of
// bits counted as a multiply-add, as for the other types). The benchmark fills every SM with
// blocks of kCeilingThreads threads (benchmarks/gpu_raw_wmma_ceiling.py).
//
// WMMA: f16 and bf16 (16x16x16, f32 accumulators), tf32 (16x16x8), s8 (16x16x16, s32), f64
// (8x8x4) and b1 (8x8x128, AND + popcount). PTX mma.sync, whose fragments are registers (common.cuh
// gives their layout): m16n8k128 and m16n8k256 .b1 AND + popcount, m16n8k32 .s8 and m16n8k8
// .tf32, the instructions of the K-major GEMM (mma_kmajor.cu), and the f64 m16n8k4 / k8 / k16
// of sm_90 (built for sm_80 they trap: the instruction does not exist there). Any bits serve a
// ceiling, so each thread reads its registers from a and b in order. wgmma (sm_90a; other
// builds trap), whose operands are shared memory tiles: each warpgroup copies A (64 rows) and
// B (N rows) of 128 bytes each from a and b once, then runs rounds of kChains instructions
// over the tiles' four 32-byte steps of K, one commit group per round, one group left in
// flight; a warp's share of one instruction is 16 of its 64 rows.
//
// One templated body per kind (wmma_ceiling, ptx_ceiling, wgmma_ceiling); the extern "C" entry
// points below name each instance and share one signature: (a, b, out, iterations).
#include "common.cuh"

namespace rw {
using namespace nvcuda;
namespace wx = nvcuda::wmma::experimental;

constexpr int kCeilingThreads = 256;  // 8 warps
constexpr int kChains = 8;            // independent accumulators per warp

__device__ __forceinline__ long long warp_index() {
    return (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
}

// One multiply-accumulate of the WMMA kind: mma_sync, or bmma_sync with AND + popcount for b1.
template <typename FragT, typename FA, typename FB, typename FC>
__device__ __forceinline__ void wmma_step(FC& c, const FA& a, const FB& b) {
    if constexpr (Same<FragT, wx::precision::b1>::value) {
        wmma::bmma_sync(c, a, b, c, wx::bmmaBitOpAND, wx::bmmaAccumulateOpPOPC);
    } else {
        wmma::mma_sync(c, a, b, c);
    }
}

// T: the element type in memory; FragT: the fragment's (tf32 and b1 differ from T); Acc: the
// accumulator's. The fragments' leading dimension is K (elements; bits for b1).
template <typename T, typename FragT, typename Acc, int M, int N, int K>
__device__ __forceinline__ void wmma_ceiling(const void* a, const void* b, void* out,
                                             int iterations) {
    wmma::fragment<wmma::matrix_a, M, N, K, FragT, wmma::row_major> fa;
    wmma::fragment<wmma::matrix_b, M, N, K, FragT, wmma::col_major> fb;
    wmma::fragment<wmma::accumulator, M, N, K, Acc> acc[kChains];
    wmma::load_matrix_sync(fa, static_cast<const T*>(a), K);
    wmma::load_matrix_sync(fb, static_cast<const T*>(b), K);
#pragma unroll
    for (int c = 0; c < kChains; ++c) wmma::fill_fragment(acc[c], Acc(0));
    for (int i = 0; i < iterations; ++i) {
#pragma unroll
        for (int c = 0; c < kChains; ++c) wmma_step<FragT>(acc[c], fa, fb);
    }
#pragma unroll
    for (int c = 1; c < kChains; ++c)
        for (int e = 0; e < acc[0].num_elements; ++e) acc[0].x[e] += acc[c].x[e];
    wmma::store_matrix_sync(static_cast<Acc*>(out) + warp_index() * M * N, acc[0], N,
                            wmma::mem_row_major);
}

// Mma: one of common.cuh's PTX instructions (MmaB1And<KBITS>, MmaS8, MmaF16, MmaBf16,
// MmaTf32, MmaF64<K>).
template <typename Mma>
__device__ __forceinline__ void ptx_ceiling(const void* a, const void* b, void* out,
                                            int iterations) {
    using Acc = typename Mma::Acc;
    const int lane = threadIdx.x % 32;
    using Reg = typename Mma::Reg;
    Reg ra[Mma::kA], rb[Mma::kB];
#pragma unroll
    for (int i = 0; i < Mma::kA; ++i) ra[i] = static_cast<const Reg*>(a)[lane * Mma::kA + i];
#pragma unroll
    for (int i = 0; i < Mma::kB; ++i) rb[i] = static_cast<const Reg*>(b)[lane * Mma::kB + i];
    Acc acc[kChains][4];
#pragma unroll
    for (int c = 0; c < kChains; ++c)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[c][j] = Acc(0);
    for (int i = 0; i < iterations; ++i) {
#pragma unroll
        for (int c = 0; c < kChains; ++c) Mma::step(acc[c], ra, rb);
    }
    Acc* d = static_cast<Acc*>(out) + warp_index() * 16 * 8 + lane * 4;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        Acc sum = Acc(0);
#pragma unroll
        for (int c = 0; c < kChains; ++c) sum += acc[c][j];
        d[j] = sum;
    }
}

// Wg: one of common.cuh's warpgroup instructions. a and b hold at least 2048 bytes each.
template <typename Wg>
__device__ __forceinline__ void wgmma_ceiling(const void* a, const void* b, void* out,
                                              int iterations) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using Acc = typename Wg::Acc;
    constexpr int kABytes = 64 * 128, kBBytes = Wg::kN * 128, kWords = 2048 / 4;
    __shared__ __align__(1024) unsigned tiles[(kABytes + kBBytes) / 4];
    for (int i = threadIdx.x; i < kABytes / 4; i += blockDim.x)
        tiles[i] = static_cast<const unsigned*>(a)[i % kWords];
    for (int i = threadIdx.x; i < kBBytes / 4; i += blockDim.x)
        tiles[kABytes / 4 + i] = static_cast<const unsigned*>(b)[i % kWords];
    fence_proxy_async();
    __syncthreads();
    const unsigned base = shared_address(tiles);
    const unsigned long long da = wgmma_desc(base), db = wgmma_desc(base + kABytes);
    Acc acc[Wg::kN / 2];
#pragma unroll
    for (int e = 0; e < Wg::kN / 2; ++e) acc[e] = Acc(0);
    for (int i = 0; i < iterations; ++i) {
        wgmma_fence();
#pragma unroll
        for (int c = 0; c < kChains; ++c)
            Wg::step(acc, da + wgmma_desc_offset(32 * (c % 4)),
                     db + wgmma_desc_offset(32 * (c % 4)));
        wgmma_commit();
        wgmma_wait<1>();
    }
    wgmma_wait<0>();
    Acc sum = Acc(0);
#pragma unroll
    for (int e = 0; e < Wg::kN / 2; ++e) sum += acc[e];
    static_cast<Acc*>(out)[warp_index() * 32 + threadIdx.x % 32] = sum;
#else
    __trap();  // wgmma exists on sm_90a alone
#endif
}

}  // namespace rw

// Entry point rw_ceiling_<kind>_<acc>_<m>x<n>x<k>(a, b, out, iterations): a and b hold one
// fragment's operands (M x K row-major, K x N column-major; for the PTX kinds 32 threads' .b32
// registers), out one M x N accumulator tile per warp of the grid.
#define RW_CEILING(NAME, BODY)                                                                  \
    extern "C" __global__ void __launch_bounds__(rw::kCeilingThreads)                           \
        NAME(const void* a, const void* b, void* out, int iterations) {                         \
        if constexpr (rw::selected(#NAME)) {                                                    \
            BODY(a, b, out, iterations);                                                        \
        }                                                                                       \
    }

#define RW_WMMA_CEILING(T, FRAGT, ACC, M, N, K) rw::wmma_ceiling<T, FRAGT, ACC, M, N, K>

RW_CEILING(rw_ceiling_f16_f32_16x16x16, (RW_WMMA_CEILING(__half, __half, float, 16, 16, 16)))
RW_CEILING(rw_ceiling_bf16_f32_16x16x16,
           (RW_WMMA_CEILING(__nv_bfloat16, __nv_bfloat16, float, 16, 16, 16)))
RW_CEILING(rw_ceiling_tf32_f32_16x16x8,
           (RW_WMMA_CEILING(float, nvcuda::wmma::precision::tf32, float, 16, 16, 8)))
RW_CEILING(rw_ceiling_s8_s32_16x16x16, (RW_WMMA_CEILING(signed char, signed char, int, 16, 16, 16)))
RW_CEILING(rw_ceiling_f64_f64_8x8x4, (RW_WMMA_CEILING(double, double, double, 8, 8, 4)))
RW_CEILING(rw_ceiling_b1and_s32_8x8x128,
           (RW_WMMA_CEILING(unsigned, nvcuda::wmma::experimental::precision::b1, int, 8, 8, 128)))
RW_CEILING(rw_ceiling_b1and_s32_16x8x128, rw::ptx_ceiling<rw::MmaB1And<128>>)
RW_CEILING(rw_ceiling_b1and_s32_16x8x256, rw::ptx_ceiling<rw::MmaB1And<256>>)
RW_CEILING(rw_ceiling_s8_s32_16x8x32, rw::ptx_ceiling<rw::MmaS8>)
RW_CEILING(rw_ceiling_tf32_f32_16x8x8, rw::ptx_ceiling<rw::MmaTf32>)
RW_CEILING(rw_ceiling_f16_f32_16x8x16, rw::ptx_ceiling<rw::MmaF16>)
RW_CEILING(rw_ceiling_bf16_f32_16x8x16, rw::ptx_ceiling<rw::MmaBf16>)
RW_CEILING(rw_ceiling_f16_f32_64x256x16, rw::wgmma_ceiling<rw::WgF16<256>>)
RW_CEILING(rw_ceiling_bf16_f32_64x256x16, rw::wgmma_ceiling<rw::WgBf16<256>>)
RW_CEILING(rw_ceiling_tf32_f32_64x256x8, rw::wgmma_ceiling<rw::WgTf32<256>>)
RW_CEILING(rw_ceiling_s8_s32_64x128x32, rw::wgmma_ceiling<rw::WgS8<128>>)
RW_CEILING(rw_ceiling_b1and_s32_64x256x256, rw::wgmma_ceiling<rw::WgB1And<256>>)
RW_CEILING(rw_ceiling_f64_f64_16x8x4, rw::ptx_ceiling<rw::MmaF64<4>>)
RW_CEILING(rw_ceiling_f64_f64_16x8x8, rw::ptx_ceiling<rw::MmaF64<8>>)
RW_CEILING(rw_ceiling_f64_f64_16x8x16, rw::ptx_ceiling<rw::MmaF64<16>>)
