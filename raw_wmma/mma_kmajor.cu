// The PTX mma.sync GEMM on K-contiguous operands (A row-major, B column-major):
// D = alpha * A @ B + beta * C with register fragments loaded by ldmatrix from a cp.async
// multi-stage pipeline, for every kind whose fragments share common.cuh's byte layout:
//   b1 AND   mma.sync.aligned.m16n8k256 / m16n8k128 .row.col.s32.b1.b1.s32.and.popc
//   s8, u8   mma.sync.aligned.m16n8k32.row.col.s32.{s8,u8}.{s8,u8}.s32 (int32 out)
//   tf32     mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 (float32 in and out; each
//            element rounded to tf32 as the generic kernel's __float_to_tf32 does)
//
// The kernel sees each operand as rows of bytes along K: A as M rows of kbytes bytes, B as N
// columns of kbytes bytes (the transposed view of an N x K row-major array), rows lda / ldb
// elements apart (ELEM bytes each), each row 16-byte aligned with a leading dimension that is a
// multiple of 16 bytes (the host checks this). b1 operands arrive packed along K
// (multibackend/packing.py: bit k in byte k / 8 at bit k % 8); a popcount of AND over K is the
// same for any order of the bits as long as A and B share it, so the bytes go to the tensor
// cores as they lie.
//
// Shared memory holds, per stage, A's BM rows and B's BN columns of one 128-byte k-tile (1024
// bits, 128 s8, 32 tf32). Each row is eight 16-byte chunks stored at chunk ^ (row % 8): the
// eight rows an ldmatrix phase reads at one chunk fall in eight different bank groups, and so
// do the chunks a warp's cp.async writes. ldmatrix reads the bytes as 16-bit elements, and an
// 8 x 8 matrix of them gives lane l the 4 bytes at row l / 4, bytes 4 * (l % 4) .. of its 16:
// exactly the fragments (A's rows g and g + 8, B's column g). One x4 load per 16 rows of A and
// per 16 columns of B covers 32 bytes of K: one instruction of kA = 4 registers, or two of 2.
//
// Copies: a k-tile wholly inside the matrices is copied with unguarded 16-byte cp.async; at
// the edges each copy takes min(16, bytes left in the row) and zero-fills the rest, rows past
// M or N are zero (zeros add nothing to a product or an AND popcount), and nothing outside the
// matrices is read. Epilogue: each lane writes its accumulators' pairs of columns, as one
// 8-byte store when D is written plainly (alpha 1, no C), its base 8-byte aligned and the
// pair inside an even row; else element by element through common.cuh's write_element.
//
// One templated body (KMajorGemm); the extern "C" entry points below name each instance.
#include "common.cuh"

namespace rw {

constexpr int kKChunks = 8;                // 16-byte chunks per shared row
constexpr int kKRowBytes = kKChunks * 16;  // one k-tile: 128 bytes of K

// Mma: one of common.cuh's instructions; ELEM: bytes per element the strides count.
template <typename Mma, int ELEM, int BM, int BN, int WARPS_M, int WARPS_N, int STAGES>
struct KMajorGemm {
    using Acc = typename Mma::Acc;
    struct alignas(2 * sizeof(Acc)) Pair {  // two neighbouring outputs: one store
        Acc x, y;
    };
    static constexpr int kThreads = WARPS_M * WARPS_N * 32;
    static constexpr int WTM = BM / WARPS_M, WTN = BN / WARPS_N;  // warp tile
    static constexpr int MI = WTM / 16, NI = WTN / 8;             // mma tiles per warp
    static constexpr int kStageBytes = (BM + BN) * kKRowBytes;
    static constexpr int kSmemBytes = STAGES * kStageBytes;
    static constexpr int kRowsPerPass = kThreads / kKChunks;
    // ldmatrix feeds the 32-bit kinds; f64 fragments are read as doubles
    static constexpr bool kLdsm = Same<typename Mma::Reg, unsigned>::value;
    static_assert(kLdsm ? Mma::kA == 2 * Mma::kB && (Mma::kA == 2 || Mma::kA == 4)
                        : Mma::kA == 2 && Mma::kB == 1,
                  "32 bytes of K per row: one instruction of 4 32-bit A registers or two of "
                  "2, or one f64 m16n8k4");
    static_assert(WTM % 16 == 0 && WTN % 16 == 0, "whole x4 loads of A and B per warp");
    static_assert(BM % kRowsPerPass == 0 && BN % kRowsPerPass == 0, "whole copy passes");
    static_assert(STAGES >= 2, "a multi-stage pipeline");

    __device__ __forceinline__ static int swizzled(int row, int chunk) {
        return row * kKRowBytes + ((chunk ^ (row % 8)) << 4);
    }

    // Copies k-tile kb (a byte offset along K) of ROWS rows starting at r0 of a matrix of
    // `rows` rows of `kbytes` bytes, `ld` bytes apart, into a stage's rows.
    template <int ROWS>
    __device__ __forceinline__ static void copy(unsigned char* stage, const unsigned char* g,
                                                long long ld, int r0, int rows, int kbytes,
                                                int kb, bool full) {
        const int chunk = threadIdx.x % kKChunks, first = threadIdx.x / kKChunks;
        const int at = kb + chunk * 16;
        const unsigned char* src = g + (r0 + first) * ld + at;
        const long long step = kRowsPerPass * ld;
#pragma unroll
        for (int i = 0; i < ROWS / kRowsPerPass; ++i, src += step) {
            const int r = first + i * kRowsPerPass;
            unsigned char* dst = stage + swizzled(r, chunk);
            if (full) {
                cp_async16_full(dst, src);
            } else {
                const bool in = r0 + r < rows && at < kbytes;
                cp_async16(dst, in ? src : g, in ? min(kbytes - at, 16) : 0);
            }
        }
    }

    // 32 bytes of K per row: a and b as one x4 ldmatrix of each gives them.
    __device__ __forceinline__ static void mma(Acc (&acc)[4], const unsigned (&a)[4],
                                               const unsigned (&b)[2]) {
        if constexpr (Mma::kA == 4) {
            Mma::step(acc, a, b);
        } else {
            const unsigned a0[2] = {a[0], a[1]}, a1[2] = {a[2], a[3]};
            const unsigned b0[1] = {b[0]}, b1[1] = {b[1]};
            Mma::step(acc, a0, b0);
            Mma::step(acc, a1, b1);
        }
    }

    // One output through the epilogue: int32 (b1, s8, u8) as write_element<int> computes it;
    // float32 (tf32) and float64, whose C and D have the accumulators' type, in double,
    // without write_element's switch over element codes (which puts the accumulators in
    // local memory).
    __device__ __forceinline__ static void store(const Epilogue& ep, int bi, int gm, int gn,
                                                 int M, int N, Acc v) {
        if constexpr (Same<Acc, int>::value) {
            write_element<int>(ep, bi, gm, gn, N, M, v);
        } else {
            double r = ep.alpha * v;
            if (ep.c != nullptr && ep.beta != 0.0)
                r += ep.beta * static_cast<const Acc*>(ep.c)[bi * ep.sbc + gm * ep.scm +
                                                             gn * ep.scn];
            static_cast<Acc*>(ep.d)[(static_cast<long long>(bi) * M + gm) * N + gn] =
                static_cast<Acc>(r);
        }
    }

    // One 32-byte step of K (chunks ks and ks + 1 of a stage) into the accumulators of the
    // warp whose tile starts at (wm, wn).
    __device__ __forceinline__ static void step(Acc (&acc)[MI][NI][4],
                                                const unsigned char* stage, int ks, int wm,
                                                int wn, int lane) {
        if constexpr (kLdsm) {
            // ldmatrix rows of this lane: A row (lane % 16) at chunk ks + lane / 16; B column
            // (lane % 8) + 8 * (lane / 16) at chunk ks + (lane / 8) % 2.
            const int a_row = wm + lane % 16, a_chunk = ks + lane / 16;
            const int b_row = BM + wn + lane % 8 + 8 * (lane / 16), b_chunk = ks + (lane / 8) % 2;
            unsigned fa[MI][4];
#pragma unroll
            for (int i = 0; i < MI; ++i) {
                ldmatrix_x4(fa[i], stage + swizzled(a_row + i * 16, a_chunk));
#pragma unroll
                for (int e = 0; e < 4; ++e) Mma::operand(fa[i][e]);
            }
            // B a pair of 8-column blocks at a time: four registers live, not 2 * NI
#pragma unroll
            for (int j = 0; j < NI; j += 2) {
                unsigned r[4];
                ldmatrix_x4(r, stage + swizzled(b_row + j * 8, b_chunk));
#pragma unroll
                for (int e = 0; e < 4; ++e) Mma::operand(r[e]);
                const unsigned left[2] = {r[0], r[1]}, right[2] = {r[2], r[3]};
#pragma unroll
                for (int i = 0; i < MI; ++i) {
                    mma(acc[i][j], fa[i], left);
                    mma(acc[i][j + 1], fa[i], right);
                }
            }
        } else {
            // f64 m16n8k4: one double per register, read with 8-byte shared loads: A rows g
            // and g + 8 and B column g, bytes 8 * t .. of the step (chunk ks + t / 2). The
            // eight rows of a load sit in eight different swizzled chunks: no bank conflict.
            const int g = lane / 4, t = lane % 4, chunk = ks + t / 2, off = 8 * (t % 2);
            double fa[MI][2];
#pragma unroll
            for (int i = 0; i < MI; ++i)
#pragma unroll
                for (int h = 0; h < 2; ++h)
                    fa[i][h] = *reinterpret_cast<const double*>(
                        stage + swizzled(wm + i * 16 + g + 8 * h, chunk) + off);
#pragma unroll
            for (int j = 0; j < NI; ++j) {
                const double fb[1] = {*reinterpret_cast<const double*>(
                    stage + swizzled(BM + wn + j * 8 + g, chunk) + off)};
#pragma unroll
                for (int i = 0; i < MI; ++i) Mma::step(acc[i][j], fa[i], fb);
            }
        }
    }

    __device__ static void run(const unsigned char* a, const unsigned char* b, int M, int N,
                               int kbytes, long long lda_elems, long long ldb_elems, long long sba,
                               long long sbb, int batch, const Epilogue ep) {
        const long long lda = lda_elems * ELEM, ldb = ldb_elems * ELEM;
        extern __shared__ __align__(128) unsigned char smem[];
        int m0, n0;
        grouped_tile<BM, BN>(M, N, m0, n0);
        const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
        const int wm = (warp / WARPS_N) * WTM, wn = (warp % WARPS_N) * WTN;
        const int KT = (kbytes + kKRowBytes - 1) / kKRowBytes;
        const bool mn_full = m0 + BM <= M && n0 + BN <= N;
        const bool plain = ep.c == nullptr && ep.alpha == 1.0 && N % 2 == 0 &&
                           reinterpret_cast<unsigned long long>(ep.d) % sizeof(Pair) == 0;

        for (int bi = blockIdx.y; bi < batch; bi += gridDim.y) {
            const unsigned char* A = a + bi * sba * ELEM;
            const unsigned char* B = b + bi * sbb * ELEM;
            Acc acc[MI][NI][4];
#pragma unroll
            for (int i = 0; i < MI; ++i)
#pragma unroll
                for (int j = 0; j < NI; ++j)
#pragma unroll
                    for (int e = 0; e < 4; ++e) acc[i][j][e] = Acc(0);

            auto issue = [&](int kt, int slot) {
                if (kt < KT) {
                    const int kb = kt * kKRowBytes;
                    const bool full = mn_full && kb + kKRowBytes <= kbytes;
                    unsigned char* stage = smem + slot * kStageBytes;
                    copy<BM>(stage, A, lda, m0, M, kbytes, kb, full);
                    copy<BN>(stage + BM * kKRowBytes, B, ldb, n0, N, kbytes, kb, full);
                }
                cp_async_commit();
            };
#pragma unroll
            for (int s = 0; s < STAGES - 1; ++s) issue(s, s);

            for (int kt = 0; kt < KT; ++kt) {
                cp_async_wait<STAGES - 2>();
                __syncthreads();  // tile kt visible; every warp done with the slot refilled
                issue(kt + STAGES - 1, (kt + STAGES - 1) % STAGES);
                const unsigned char* stage = smem + (kt % STAGES) * kStageBytes;
#pragma unroll 1
                for (int ks = 0; ks < kKChunks; ks += 2) {
                    step(acc, stage, ks, wm, wn, lane);
                }
            }
            cp_async_wait<0>();
            __syncthreads();  // the next batch entry's copies reuse the stages

            const int g = lane / 4, t = lane % 4;
#pragma unroll
            for (int i = 0; i < MI; ++i)
#pragma unroll
                for (int j = 0; j < NI; ++j)
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        const int gm = m0 + wm + i * 16 + g + 8 * h;
                        const int gn = n0 + wn + j * 8 + 2 * t;
                        if (gm >= M || gn >= N) continue;
                        const Acc v0 = acc[i][j][2 * h], v1 = acc[i][j][2 * h + 1];
                        if (plain && gn + 1 < N) {
                            Acc* d = static_cast<Acc*>(ep.d) +
                                     (static_cast<long long>(bi) * M + gm) * N + gn;
                            *reinterpret_cast<Pair*>(d) = Pair{v0, v1};
                        } else {
                            store(ep, bi, gm, gn, M, N, v0);
                            if (gn + 1 < N) store(ep, bi, gm, gn + 1, M, N, v1);
                        }
                    }
        }
    }
};

}  // namespace rw

// Entry point rw_mma_<kind>_m16n8k<K>_<BM>x<BN>_s<STAGES>: A (M x K, lda elements apart) and
// B (N columns of K, ldb elements apart), kbytes the bytes of K per row (packed bytes for b1),
// the sub-byte kernels' parameter list (sak and sbk are 1 here). Grid: x = output tiles, y =
// batch; dynamic shared memory KMajorGemm<...>::kSmemBytes.
#define RW_MMA(NAME, MMA, ELEM, BM, BN, WM, WN, ST)                                             \
    extern "C" __global__ void __launch_bounds__(WM * WN * 32, 1)                               \
        NAME(const unsigned char* a, const unsigned char* b, const void* c, void* d, int M,     \
             int N, int kbytes, long long sam, long long sak, long long sbk, long long sbn,     \
             long long scm, long long scn, long long sba, long long sbb, long long sbc,         \
             int batch, double alpha, double beta, int c_code, int d_code, int satf) {          \
        if constexpr (rw::selected(#NAME)) {                                                    \
            const rw::Epilogue ep{c, d, scm, scn, sbc, alpha, beta, c_code, d_code, satf};      \
            rw::KMajorGemm<MMA, ELEM, BM, BN, WM, WN, ST>::run(a, b, M, N, kbytes, sam, sbn,    \
                                                               sba, sbb, batch, ep);            \
        }                                                                                       \
    }

// The tiles every kind is built in (kept in step with MMA_TILES in backends/raw_wmma.py).
#define RW_MMA_TILES(PREFIX, MMA, ELEM)                                 \
    RW_MMA(PREFIX##_128x256_s4, MMA, ELEM, 128, 256, 2, 4, 4)           \
    RW_MMA(PREFIX##_256x128_s4, MMA, ELEM, 256, 128, 4, 2, 4)           \
    RW_MMA(PREFIX##_128x128_s4, MMA, ELEM, 128, 128, 2, 2, 4)

RW_MMA_TILES(rw_mma_b1and_m16n8k256, rw::MmaB1And<256>, 1)
RW_MMA(rw_mma_b1and_m16n8k128_128x256_s4, rw::MmaB1And<128>, 1, 128, 256, 2, 4, 4)
RW_MMA_TILES(rw_mma_s8_m16n8k32, rw::MmaS8, 1)
RW_MMA_TILES(rw_mma_u8_m16n8k32, rw::MmaU8, 1)
RW_MMA_TILES(rw_mma_tf32_m16n8k8, rw::MmaTf32, 4)
// f64 (sm_90): warp tiles of 64 x 32 and 32 x 64, whose 64 double accumulators fit
RW_MMA(rw_mma_f64_m16n8k4_128x128_s4, rw::MmaF64<4>, 8, 128, 128, 2, 4, 4)
RW_MMA(rw_mma_f64_m16n8k4_128x64_s4, rw::MmaF64<4>, 8, 128, 64, 2, 2, 4)
RW_MMA(rw_mma_f64_m16n8k4_64x128_s4, rw::MmaF64<4>, 8, 64, 128, 2, 2, 4)
