// Sub-byte WMMA GEMMs: s4 / u4 (8x8x32, 8 elements per 32-bit word) and b1 (8x8x128, 32 per
// word) with XOR or AND followed by popcount, all accumulating in s32.
//
// Operands arrive packed along K (see multibackend/packing.py): A is an M x K/per byte matrix,
// B a K/per x N byte matrix, each with any strides. WMMA takes sub-byte A row-major and B
// column-major only, so the block stages A as [BM][K bytes] and B as [BN][K bytes] in shared
// memory; an A given column-major or a B given row-major is transposed (byte by byte, which
// keeps the packed K order) by that staging copy. Bytes past the matrix are zero: zero is
// neutral for s4/u4 products, for AND, and for XOR when both operands are zero there.
//
// One templated body (subbyte_gemm); the extern "C" entry points below name each instance.
#include "common.cuh"

namespace rw {
using namespace nvcuda;
namespace wx = nvcuda::wmma::experimental;

constexpr int kSubbyteThreads = 128;  // 2 x 2 warps, each 4 x 4 fragments of 8 x 8
constexpr int kSubWF = 4;
constexpr int kSubBM = 2 * kSubWF * 8;  // 64
constexpr int kSubBN = 2 * kSubWF * 8;  // 64
constexpr int kSubBKBytes = 64;         // 128 s4 or 512 b1 elements per K tile
constexpr int kSubChunk = 16;           // one fragment's K extent in bytes (32 x 4 or 128 x 1 bits)

// Kind: 0 = s4, 1 = u4 (mma_sync), 2 = b1 XOR, 3 = b1 AND (bmma_sync with popcount).
template <int KIND>
struct SubTraits;
template <>
struct SubTraits<0> {
    using P = wx::precision::s4;
    static constexpr int kFK = 32, kPerByte = 2;
};
template <>
struct SubTraits<1> {
    using P = wx::precision::u4;
    static constexpr int kFK = 32, kPerByte = 2;
};
template <>
struct SubTraits<2> {
    using P = wx::precision::b1;
    static constexpr int kFK = 128, kPerByte = 8;
};
template <>
struct SubTraits<3> : SubTraits<2> {};

template <int KIND, typename FA, typename FB, typename FC>
__device__ __forceinline__ void sub_mma(FC& c, const FA& a, const FB& b) {
    if constexpr (KIND == 2) {
        wmma::bmma_sync(c, a, b, c, wx::bmmaBitOpXOR, wx::bmmaAccumulateOpPOPC);
    } else if constexpr (KIND == 3) {
        wmma::bmma_sync(c, a, b, c, wx::bmmaBitOpAND, wx::bmmaAccumulateOpPOPC);
    } else {
        wmma::mma_sync(c, a, b, c);
    }
}

using SubTile = Tile<unsigned char, kSubBM, kSubBKBytes, kSubChunk>;
using SubTileD = Tile<int, kSubBM, kSubBN, 8>;

// Copies a [R rows][kSubBKBytes] byte tile (row r0.., byte column kb0..) from a strided byte
// matrix whose rows are M (for A) or N (for B) and whose columns are the packed K bytes.
__device__ __forceinline__ void stage_bytes(unsigned char* tile, const unsigned char* g,
                                            long long s_r, long long s_k, int r0, int kb0,
                                            int rows, int kbytes) {
    for (int i = threadIdx.x; i < kSubBM * kSubBKBytes; i += kSubbyteThreads) {
        const int r = i / kSubBKBytes, c = i % kSubBKBytes;
        const int gr = r0 + r, gc = kb0 + c;
        tile[SubTile::at(r, c)] = (gr < rows && gc < kbytes) ? g[gr * s_r + gc * s_k] : 0;
    }
}

template <int KIND>
__device__ __forceinline__ void subbyte_gemm(const unsigned char* a, const unsigned char* b,
                                             int M, int N, int kbytes, long long sam,
                                             long long sak, long long sbk, long long sbn,
                                             long long sba, long long sbb, int batch,
                                             const Epilogue ep) {
    using P = typename SubTraits<KIND>::P;
    constexpr int FK = SubTraits<KIND>::kFK;
    constexpr int kPer = SubTraits<KIND>::kPerByte;
    constexpr int kLdElems = SubTile::kLd * kPer;  // WMMA's ldm counts elements (bits / nibbles)
    constexpr int kBytes = 2 * SubTile::kBytes > SubTileD::kBytes ? 2 * SubTile::kBytes
                                                                  : SubTileD::kBytes;
    __shared__ __align__(128) unsigned char smem[kBytes];
    unsigned char* sa = smem;
    unsigned char* sb = smem + SubTile::kBytes;
    int* sd = reinterpret_cast<int*>(smem);

    const int tiles_n = (N + kSubBN - 1) / kSubBN;
    const int m0 = (blockIdx.x / tiles_n) * kSubBM, n0 = (blockIdx.x % tiles_n) * kSubBN;
    const int warp = threadIdx.x / 32;
    const int wm = (warp / 2) * kSubWF * 8, wn = (warp % 2) * kSubWF * 8;

    for (int bi = blockIdx.y; bi < batch; bi += gridDim.y) {
        const unsigned char* A = a + bi * sba;
        const unsigned char* B = b + bi * sbb;
        wmma::fragment<wmma::accumulator, 8, 8, FK, int> acc[kSubWF][kSubWF];
        for (int i = 0; i < kSubWF; ++i)
            for (int j = 0; j < kSubWF; ++j) wmma::fill_fragment(acc[i][j], 0);

        for (int kb0 = 0; kb0 < kbytes; kb0 += kSubBKBytes) {
            stage_bytes(sa, A, sam, sak, m0, kb0, M, kbytes);  // A as [M][K bytes]
            stage_bytes(sb, B, sbn, sbk, n0, kb0, N, kbytes);  // B as [N][K bytes]
            __syncthreads();
#pragma unroll
            for (int kk = 0; kk < kSubBKBytes; kk += kSubChunk) {
                wmma::fragment<wmma::matrix_a, 8, 8, FK, P, wmma::row_major> fa[kSubWF];
                wmma::fragment<wmma::matrix_b, 8, 8, FK, P, wmma::col_major> fb[kSubWF];
#pragma unroll
                for (int i = 0; i < kSubWF; ++i)
                    wmma::load_matrix_sync(fa[i], sa + SubTile::at(wm + i * 8, kk), kLdElems);
#pragma unroll
                for (int j = 0; j < kSubWF; ++j)
                    wmma::load_matrix_sync(fb[j], sb + SubTile::at(wn + j * 8, kk), kLdElems);
#pragma unroll
                for (int i = 0; i < kSubWF; ++i)
#pragma unroll
                    for (int j = 0; j < kSubWF; ++j) sub_mma<KIND>(acc[i][j], fa[i], fb[j]);
            }
            __syncthreads();
        }

        for (int i = 0; i < kSubWF; ++i)
            for (int j = 0; j < kSubWF; ++j)
                wmma::store_matrix_sync(sd + SubTileD::at(wm + i * 8, wn + j * 8), acc[i][j],
                                        SubTileD::kLd, wmma::mem_row_major);
        __syncthreads();
        for (int i = threadIdx.x; i < kSubBM * kSubBN; i += kSubbyteThreads) {
            const int r = i / kSubBN, c = i % kSubBN;
            if (m0 + r < M && n0 + c < N)
                write_element<int>(ep, bi, m0 + r, n0 + c, N, M, sd[SubTileD::at(r, c)]);
        }
        __syncthreads();
    }
}

}  // namespace rw

// Entry point rw_gemm_<s4|u4|b1xor|b1and>_s32_8x8x<32|128>: A [M][K bytes] and B [K bytes][N]
// with any strides (bytes); kbytes is K / elements-per-byte. Grid: x = output tiles, y = batch.
#define RW_SUBBYTE(NAME, KIND)                                                                   \
    extern "C" __global__ void __launch_bounds__(rw::kSubbyteThreads, 1)                         \
        NAME(const unsigned char* a, const unsigned char* b, const void* c, void* d, int M,      \
             int N, int kbytes, long long sam, long long sak, long long sbk, long long sbn,      \
             long long scm, long long scn, long long sba, long long sbb, long long sbc,          \
             int batch, double alpha, double beta, int c_code, int d_code, int satf) {           \
        if constexpr (rw::selected(#NAME)) {                                                     \
            const rw::Epilogue ep{c, d, scm, scn, sbc, alpha, beta, c_code, d_code, satf};       \
            rw::subbyte_gemm<KIND>(a, b, M, N, kbytes, sam, sak, sbk, sbn, sba, sbb, batch, ep); \
        }                                                                                        \
    }

RW_SUBBYTE(rw_gemm_s4_s32_8x8x32, 0)
RW_SUBBYTE(rw_gemm_u4_s32_8x8x32, 1)
RW_SUBBYTE(rw_gemm_b1xor_s32_8x8x128, 2)
RW_SUBBYTE(rw_gemm_b1and_s32_8x8x128, 3)
