// The PTX GEMM on K-contiguous operands (A row-major, B column-major): D = alpha * A @ B +
// beta * C from a cp.async multi-stage pipeline of swizzled shared tiles, computed either by
// warps' mma.sync on register fragments loaded by ldmatrix, for every kind whose fragments
// share common.cuh's byte layout:
//   b1 AND   mma.sync.aligned.m16n8k256 / m16n8k128 .row.col.s32.b1.b1.s32.and.popc
//   s8, u8   mma.sync.aligned.m16n8k32.row.col.s32.{s8,u8}.{s8,u8}.s32 (int32 out)
//   tf32     mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 (float32 in and out; each
//            element rounded to tf32 as the generic kernel's __float_to_tf32 does)
//   f16,     mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32 (float32
//   bf16     accumulators; D in the operands' type or float32)
//   f64      mma.sync.aligned.m16n8k4.row.col.f64.f64.f64.f64 (sm_90)
// or, on sm_90a, by warpgroups' wgmma.mma_async reading both operands from the same tiles
// through shared memory descriptors (the tiles' swizzle is wgmma's 128-byte one): b1 AND
// m64nNk256, s8 / u8 m64nNk32, f16 / bf16 m64nNk16 and tf32 m64nNk8 (whose tensor cores ignore
// the operands' low 13 bits: truncation, not the rounding above).
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
// bits, 128 s8, 64 f16, 32 tf32, 16 f64). Each row is eight 16-byte chunks stored at chunk ^
// (row % 8): the eight rows an ldmatrix phase reads at one chunk fall in eight different bank
// groups, and so do the chunks a warp's cp.async writes. ldmatrix reads the bytes as 16-bit
// elements, and an 8 x 8 matrix of them gives lane l the 4 bytes at row l / 4, bytes 4 * (l %
// 4) .. of its 16: exactly the fragments (A's rows g and g + 8, B's column g). One x4 load per
// 16 rows of A and per 16 columns of B covers 32 bytes of K: one instruction of kA = 4
// registers, or two of 2. Each warp keeps two steps' fragments in registers: the next 32 bytes
// load while the current ones feed the tensor cores, across k-tiles too.
//
// Copies: a k-tile wholly inside the matrices is copied with unguarded 16-byte cp.async; at the
// edges each copy takes min(16, bytes left in the row) and zero-fills the rest, rows past M or
// N are zero (zeros add nothing to a product or an AND popcount), and nothing outside the
// matrices is read. Epilogue: each lane writes its accumulators' pairs of columns, as one store
// of two outputs when D is written plainly (alpha 1, no C, D in the kind's Out type), its base
// aligned to the pair and the pair inside an even row; else element by element.
//
// One templated body (KMajorGemm); the extern "C" entry points below name each instance.
#include "common.cuh"

namespace rw {

constexpr int kKChunks = 8;                // 16-byte chunks per shared row
constexpr int kKRowBytes = kKChunks * 16;  // one k-tile: 128 bytes of K

// Mma: one of common.cuh's instructions (a warp's mma.sync, or with kWarpgroup a warpgroup's
// wgmma); ELEM: bytes per element the strides count.
template <typename Mma, int ELEM, int BM, int BN, int WARPS_M, int WARPS_N, int STAGES>
struct KMajorGemm {
    using Acc = typename Mma::Acc;
    using Out = typename Mma::Out;  // C and D: Out, or float32 for the 16-bit kinds
    struct alignas(2 * sizeof(Out)) Pair {  // two neighbouring outputs: one store
        Out x, y;
    };
    static constexpr int kThreads = WARPS_M * WARPS_N * 32;
    static constexpr int WTM = BM / WARPS_M, WTN = BN / WARPS_N;  // warp tile
    static constexpr int MI = WTM / 16, NI = WTN / 8;             // 16 x 8 tiles per warp
    static constexpr int kStageBytes = (BM + BN) * kKRowBytes;
    // wgmma's 128-byte swizzle is on address bits: its tiles start on 1024-byte boundaries,
    // which the kernel finds inside 1024 extra bytes
    static constexpr int kAlign = Mma::kWarpgroup ? 1024 : 0;
    static constexpr int kSmemBytes = STAGES * kStageBytes + kAlign;
    static constexpr int kRowsPerPass = kThreads / kKChunks;
    static constexpr int kSteps = kKChunks / 2;  // 32-byte steps of K per k-tile
    static constexpr int kOutCode = Same<Out, int>::value      ? kS32
                                    : Same<Out, float>::value  ? kF32
                                    : Same<Out, double>::value ? kF64
                                    : Same<Out, __half>::value ? kF16
                                                               : kBF16;
    static_assert(BM % kRowsPerPass == 0 && BN % kRowsPerPass == 0, "whole copy passes");
    static_assert(STAGES >= 2, "a multi-stage pipeline");

    __device__ __forceinline__ static int swizzled(int row, int chunk) {
        return row * kKRowBytes + ((chunk ^ (row % 8)) << 4);
    }

    // An operand stored MN-major (the 16-bit warpgroup kinds): a stage holds it as blocks of
    // kMnRows rows of 128 bytes, row k of a block the k-tile's k-th element of kMnRows
    // consecutive rows of the operand (columns of B), in the same swizzle. A block spans
    // kMnBlockBytes, and 32 bytes of K (16 k's) are 16 of its rows.
    static constexpr int kMnRows = kKRowBytes / 2;
    static constexpr int kMnBlockBytes = kMnRows * kKRowBytes;
    // The shared memory descriptor of an operand's tile at `smem`, and the offset of step s
    // (32 bytes of K) in it.
    template <bool MN>
    __device__ __forceinline__ static unsigned long long tile_desc(unsigned smem) {
        return MN ? wgmma_desc_mn(smem, kMnBlockBytes) : wgmma_desc(smem);
    }
    template <bool MN>
    __host__ __device__ static constexpr int step_bytes(int s) {
        return MN ? s * 16 * kKRowBytes : s * 32;
    }

    // Copies k-tile kb (a byte offset along K) of ROWS rows starting at r0 of a matrix of
    // `rows` rows of `kbytes` bytes, `ld` bytes apart, into a stage's rows.
    template <int ROWS>
    __device__ __forceinline__ static void copy(unsigned stage, const unsigned char* g,
                                                long long ld, int r0, int rows, int kbytes,
                                                int kb, bool full) {
        const int chunk = threadIdx.x % kKChunks, first = threadIdx.x / kKChunks;
        const int at = kb + chunk * 16;
        const unsigned char* src = g + (r0 + first) * ld + at;
        const long long step = kRowsPerPass * ld;
#pragma unroll 1  // one pointer stepped through the rows, not one held per row
        for (int i = 0; i < ROWS / kRowsPerPass; ++i, src += step) {
            const int r = first + i * kRowsPerPass;
            const unsigned dst = stage + swizzled(r, chunk);
            if (full) {
                cp_async16_full(dst, src);
            } else {
                const bool in = r0 + r < rows && at < kbytes;
                cp_async16(dst, in ? src : g, in ? min(kbytes - at, 16) : 0);
            }
        }
    }

    // The warps' mma.sync main loop: each warp keeps two 32-byte steps' fragments in
    // registers, the next step's loading (ldmatrix, or 8-byte loads for f64) while the
    // current one's feed the tensor cores, across k-tiles too.
    struct Warp {
        using Reg = typename Mma::Reg;
        // ldmatrix feeds the 32-bit kinds; f64 fragments are read as doubles
        static constexpr bool kLdsm = Same<Reg, unsigned>::value;
        static_assert(kLdsm ? Mma::kA == 2 * Mma::kB && (Mma::kA == 2 || Mma::kA == 4)
                            : Mma::kA == 2 && Mma::kB == 1,
                      "32 bytes of K per row: one instruction of 4 32-bit A registers or two "
                      "of 2, or one f64 m16n8k4");
        static_assert(WTM % 16 == 0 && WTN % 16 == 0, "whole x4 loads of A and B per warp");
        static_assert(kSteps % 2 == 0, "fragments alternate between two buffers per step");

        // One step's fragments of a warp: 4 registers of A per 16 rows and 2 of B per 8
        // columns (f64: 2 and 1 doubles).
        struct Frags {
            Reg a[MI][kLdsm ? 4 : 2];
            Reg b[NI][kLdsm ? 2 : 1];
        };

        // The fragments of step s (chunks 2s and 2s + 1 of the stage at shared address
        // `stage`) of the warp whose tile starts at (wm, wn).
        __device__ __forceinline__ static void load(Frags& f, unsigned stage, int s, int wm,
                                                    int wn, int lane) {
            const int ks = 2 * s;
            if constexpr (kLdsm) {
                // ldmatrix rows of this lane: A row (lane % 16) at chunk ks + lane / 16; B
                // column (lane % 8) + 8 * (lane / 16) at chunk ks + (lane / 8) % 2.
                const int a_row = wm + lane % 16, a_chunk = ks + lane / 16;
                const int b_row = BM + wn + lane % 8 + 8 * (lane / 16);
                const int b_chunk = ks + (lane / 8) % 2;
#pragma unroll
                for (int i = 0; i < MI; ++i) {
                    ldmatrix_x4(f.a[i], stage + swizzled(a_row + i * 16, a_chunk));
#pragma unroll
                    for (int e = 0; e < 4; ++e) Mma::operand(f.a[i][e]);
                }
#pragma unroll
                for (int j = 0; j < NI; j += 2) {  // one x4 load: two 8-column blocks
                    unsigned r[4];
                    ldmatrix_x4(r, stage + swizzled(b_row + j * 8, b_chunk));
#pragma unroll
                    for (int e = 0; e < 4; ++e) Mma::operand(r[e]);
                    f.b[j][0] = r[0];
                    f.b[j][1] = r[1];
                    f.b[j + 1][0] = r[2];
                    f.b[j + 1][1] = r[3];
                }
            } else {
                // f64 m16n8k4: one double per register, read with 8-byte shared loads: A rows
                // g and g + 8 and B column g, bytes 8 * t .. of the step (chunk ks + t / 2).
                // The eight rows of a load sit in eight different swizzled chunks: no bank
                // conflict.
                const int g = lane / 4, t = lane % 4, chunk = ks + t / 2, off = 8 * (t % 2);
#pragma unroll
                for (int i = 0; i < MI; ++i)
#pragma unroll
                    for (int h = 0; h < 2; ++h)
                        f.a[i][h] = lds64(stage + swizzled(wm + i * 16 + g + 8 * h, chunk) + off);
#pragma unroll
                for (int j = 0; j < NI; ++j)
                    f.b[j][0] = lds64(stage + swizzled(BM + wn + j * 8 + g, chunk) + off);
            }
        }

        // One step of K from a step's fragments into the warp's accumulators.
        __device__ __forceinline__ static void compute(Acc (&acc)[MI][NI][4], const Frags& f) {
#pragma unroll
            for (int j = 0; j < NI; ++j)
#pragma unroll
                for (int i = 0; i < MI; ++i) {
                    if constexpr (Mma::kA == 2 && kLdsm) {  // two instructions per 32 bytes
                        const unsigned a0[2] = {f.a[i][0], f.a[i][1]};
                        const unsigned a1[2] = {f.a[i][2], f.a[i][3]};
                        const unsigned b0[1] = {f.b[j][0]}, b1[1] = {f.b[j][1]};
                        Mma::step(acc[i][j], a0, b0);
                        Mma::step(acc[i][j], a1, b1);
                    } else {
                        Mma::step(acc[i][j], f.a[i], f.b[j]);
                    }
                }
        }

        // k-tiles 0 .. STAGES - 2 in flight before the loop; one k-tile per trip and one
        // barrier per k-tile. Step s computes from the fragments loaded one step earlier
        // while the next step's load (the last step's from the next k-tile, after the
        // barrier that makes it visible and after which every warp is done with the slot
        // read before); the first step issues the copies of the k-tile STAGES - 1 ahead into
        // that slot.
        template <typename Issue>
        __device__ __forceinline__ static void loop(Acc (&acc)[MI][NI][4], const Issue& issue,
                                                    unsigned smem, int KT) {
            const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
            const int wm = (warp / WARPS_N) * WTM, wn = (warp % WARPS_N) * WTN;
#pragma unroll
            for (int s = 0; s < STAGES - 1; ++s) issue(s, s);
            cp_async_wait<STAGES - 2>();
            __syncthreads();
            Frags f[2];
            int read = 0, write = STAGES - 1;  // stage slots: being computed, being filled
            load(f[0], smem, 0, wm, wn, lane);
            for (int kt = 0; kt < KT; ++kt) {
#pragma unroll
                for (int s = 0; s < kSteps; ++s) {
                    if (s == kSteps - 1) {
                        cp_async_wait<STAGES - 2>();
                        __syncthreads();
                        read = read + 1 == STAGES ? 0 : read + 1;
                    }
                    load(f[(s + 1) % 2], smem + read * kStageBytes, (s + 1) % kSteps, wm, wn,
                         lane);
                    if (s == 0) {
                        issue(kt + STAGES - 1, write);
                        write = write + 1 == STAGES ? 0 : write + 1;
                    }
                    compute(acc, f[s % 2]);
                }
            }
        }
    };

    // The warpgroups' wgmma main loop (sm_90a): warpgroup w computes rows 64w .. 64w + 63 of
    // the tile, its accumulators the 16 x 8 tiles of warp w's rows (the wgmma D layout is
    // the mma.sync one repeated down the warpgroup), reading both operands from the swizzled
    // stages through descriptors (K-major, or MN-major where Mma's kMnA / kMnB say so: the
    // TMA kernel's 16-bit kinds), 32 bytes of K per instruction. The wgmma of one k-tile run
    // while the next one's are issued (wgmma.wait_group 1): a slot is refilled only after
    // the barrier that follows every warpgroup's wait for the k-tile read from it, so copies
    // run STAGES - 2 k-tiles ahead.
    struct Warpgroup {
        static_assert(MI == 1 && WARPS_N == 1 && BM % 64 == 0, "one warp per 16 rows");
        static_assert(BN % Mma::kN == 0, "whole instructions along N");
        static_assert(!(Mma::kMnA || Mma::kMnB) || ELEM == 2, "MN-major: 16-bit elements");

        // The wgmma of one k-tile (the stage at shared address `stage`, this warpgroup's rows
        // `a_row` bytes into it), committed as one group.
        __device__ __forceinline__ static void ktile(Acc (&acc)[MI][NI][4], unsigned stage,
                                                     unsigned a_row) {
            const unsigned long long da = tile_desc<Mma::kMnA>(stage + a_row);
            const unsigned long long db = tile_desc<Mma::kMnB>(stage + BM * kKRowBytes);
            wgmma_fence();
#pragma unroll
            for (int s = 0; s < kSteps; ++s)
#pragma unroll
                for (int h = 0; h < BN / Mma::kN; ++h)  // kN columns: kN rows of either order
                    Mma::step(reinterpret_cast<Acc(&)[Mma::kN / 2]>(acc[0][h * Mma::kN / 8]),
                              da + wgmma_desc_offset(step_bytes<Mma::kMnA>(s)),
                              db + wgmma_desc_offset(Mma::kN * kKRowBytes * h +
                                                     step_bytes<Mma::kMnB>(s)));
            wgmma_commit();
        }

        template <typename Issue>
        __device__ __forceinline__ static void loop(Acc (&acc)[MI][NI][4], const Issue& issue,
                                                    unsigned smem, int KT) {
            static_assert(STAGES >= 3, "a k-tile in the tensor cores, one being computed");
            const unsigned a_row = (threadIdx.x / 128) * 64 * kKRowBytes;
#pragma unroll
            for (int s = 0; s < STAGES - 2; ++s) issue(s, s);
            int read = 0, write = STAGES - 2;
            for (int kt = 0; kt < KT; ++kt) {
                cp_async_wait<STAGES - 3>();
                fence_proxy_async();  // this thread's copies, visible to the tensor cores
                __syncthreads();
                ktile(acc, smem + read * kStageBytes, a_row);
                read = read + 1 == STAGES ? 0 : read + 1;
                issue(kt + STAGES - 2, write);  // behind the k-tile's wgmma, already queued
                write = write + 1 == STAGES ? 0 : write + 1;
                wgmma_wait<1>();
            }
            wgmma_wait<0>();
        }
    };

    // C of the floating kinds at element i, as a double.
    __device__ __forceinline__ static double c_at(const Epilogue& ep, long long i) {
        if constexpr (sizeof(Out) == 2) {
            if (ep.c_code == kF32) return static_cast<const float*>(ep.c)[i];
        }
        return to_double(static_cast<const Out*>(ep.c)[i]);
    }

    // One output through the epilogue: int32 (b1, s8, u8) as write_element<int> computes it;
    // the floating kinds in double, C and D read and written as Out (or float32, see c_at),
    // without write_element's switch over element codes (which puts the accumulators in
    // local memory).
    __device__ __forceinline__ static void store(const Epilogue& ep, int bi, int gm, int gn,
                                                 int M, int N, Acc v) {
        if constexpr (Same<Acc, int>::value) {
            write_element<int>(ep, bi, gm, gn, N, M, v);
        } else {
            double r = ep.alpha * v;
            if (ep.c != nullptr && ep.beta != 0.0)
                r += ep.beta * c_at(ep, bi * ep.sbc + gm * ep.scm + gn * ep.scn);
            const long long at = (static_cast<long long>(bi) * M + gm) * N + gn;
            if (sizeof(Out) == 2 && ep.d_code == kF32)
                static_cast<float*>(ep.d)[at] = static_cast<float>(r);
            else
                static_cast<Out*>(ep.d)[at] = out_cast<Out>(r);
        }
    }

    // D of batch entry bi from the accumulators of the tile at (m0, n0): each lane writes its
    // pairs of columns, as one store when D is plain (alpha 1, no C, D in Out, its base
    // aligned to a pair, N even), else element by element. The lane's place is derived anew
    // (fresh_thread), not carried through the main loop; so is the tile's corner by callers.
    __device__ __forceinline__ static void epilogue(const Acc (&acc)[MI][NI][4],
                                                    const Epilogue& ep, int bi, int M, int N,
                                                    int m0, int n0) {
        const int thread = fresh_thread(), warp = thread / 32, lane = thread % 32;
        const int wm = (warp / WARPS_N) * WTM, wn = (warp % WARPS_N) * WTN;
        const int g = lane / 4, t = lane % 4;
        const bool plain = ep.c == nullptr && ep.alpha == 1.0 && ep.d_code == kOutCode &&
                           N % 2 == 0 &&
                           reinterpret_cast<unsigned long long>(ep.d) % sizeof(Pair) == 0;
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
                        Out* d = static_cast<Out*>(ep.d) +
                                 (static_cast<long long>(bi) * M + gm) * N + gn;
                        *reinterpret_cast<Pair*>(d) = Pair{out_cast<Out>(v0), out_cast<Out>(v1)};
                    } else {
                        store(ep, bi, gm, gn, M, N, v0);
                        if (gn + 1 < N) store(ep, bi, gm, gn + 1, M, N, v1);
                    }
                }
    }

    __device__ static void run(const unsigned char* a, const unsigned char* b, int M, int N,
                               int kbytes, long long lda_elems, long long ldb_elems, long long sba,
                               long long sbb, int batch, const Epilogue ep) {
        const long long lda = lda_elems * ELEM, ldb = ldb_elems * ELEM;
        extern __shared__ __align__(128) unsigned char smem_bytes[];
        const unsigned smem = kAlign ? (shared_address(smem_bytes) + kAlign - 1) & ~(kAlign - 1u)
                                     : shared_address(smem_bytes);
        int m0, n0;
        grouped_tile<BM, BN>(M, N, blockIdx.x, m0, n0);
        const int KT = (kbytes + kKRowBytes - 1) / kKRowBytes;
        const bool mn_full = m0 + BM <= M && n0 + BN <= N;

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

            // Copies of k-tile kt into stage slot `slot` (none past the last), one group.
            auto issue = [&](int kt, int slot) {
                if (kt < KT) {
                    const int kb = kt * kKRowBytes;
                    const bool full = mn_full && kb + kKRowBytes <= kbytes;
                    const unsigned stage = smem + slot * kStageBytes;
                    copy<BM>(stage, A, lda, m0, M, kbytes, kb, full);
                    copy<BN>(stage + BM * kKRowBytes, B, ldb, n0, N, kbytes, kb, full);
                }
                cp_async_commit();
            };
            if constexpr (Mma::kWarpgroup) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
                Warpgroup::loop(acc, issue, smem, KT);
#else
                __trap();  // wgmma exists on sm_90a alone
#endif
            } else {
                Warp::loop(acc, issue, smem, KT);
            }
            cp_async_wait<0>();
            __syncthreads();  // the next batch entry's copies reuse the stages
            int tile_m, tile_n;  // derived anew, not held through the main loop
            grouped_tile<BM, BN>(M, N, fresh_block(), tile_m, tile_n);
            epilogue(acc, ep, bi, M, N, tile_m, tile_n);
        }
    }
};

// The warpgroups' GEMM fed by the tensor memory accelerator (sm_90a). The stages are the
// ones above, written by TMA loads of 128-byte-wide boxes through tensor maps (their 128-byte
// swizzle is the stages' layout) instead of by the threads' cp.async, and CLUSTER CTAs one
// above the other along M share B: each loads BN / CLUSTER of the tile's columns of B and
// multicasts them to every CTA of its cluster, so a CTA reads BM + BN / CLUSTER rows from L2
// per k-tile instead of BM + BN. One producer warpgroup, after the BM / 64 consumer
// warpgroups, issues the loads from one lane. Per stage slot, mbarrier `full` completes when the slot's
// bytes have landed (the producer's arrival announcing them, then the deliveries of every
// CTA's loads), and `empty` when every consumer warp of every CTA of the cluster is done
// reading it (one arrival per warp and CTA, after its wgmma.wait_group for the k-tile): the
// producers refill a slot only then. A consumer keeps one wgmma group in flight while it
// issues the next. The producer is a whole warpgroup so that it can hand its registers to the
// consumers (setmaxnreg: kProducerRegs each, the consumers kConsumerRegs). Rows and K past
// the matrices are zero-filled by the TMA unit; a CTA whose rows all lie past M still loads
// and multicasts its share of B, and stores nothing. The tensor maps see a K-major operand as
// bytes (K, rows, batch): A as M rows, B as N columns, of kbytes bytes, loaded as one box of
// the tile's rows per k-tile. An MN-major one (A M-major, B N-major: the 16-bit kinds, whose
// wgmma reads it with its transpose bit) is seen as bytes (M or N, K, batch), loaded per
// k-tile as boxes of 64 k's by 128 bytes (64 consecutive rows or columns), one per 64 of the
// tile's rows: no copy of the operand into K-major order anywhere.
template <typename Mma, int BM, int BN, int STAGES, int CLUSTER>
struct TmaGemm {
    static constexpr int ELEM = Mma::kMnA || Mma::kMnB ? 2 : 1;  // bytes the MN-major steps count
    using Gemm = KMajorGemm<Mma, ELEM, BM, BN, BM / 16, 1, STAGES>;  // its stages and epilogue
    using Acc = typename Gemm::Acc;
    static constexpr int kConsumers = Gemm::kThreads;
    static constexpr int kThreads = kConsumers + 128;
    // Two or more consumer warpgroups take the producer's registers; one (a 64-row tile) has
    // enough of the launch's own (its 128 accumulators in at most 255 a thread).
    static constexpr bool kHandsRegs = kConsumers > 128;
    static constexpr int kProducerRegs = 40;
    static constexpr int kConsumerRegs =
        kHandsRegs ? (65536 / 128 - kProducerRegs) / (kConsumers / 128) / 8 * 8 : 0;
    static_assert(!kHandsRegs || (kConsumerRegs >= 128 && kConsumerRegs <= 256),
                  "setmaxnreg's range");
    // the code of the accumulators' type: what split-K partials are written as
    static constexpr int kAccCode = Same<Acc, int>::value ? kS32 : kF32;
    static constexpr int kStageBytes = Gemm::kStageBytes;
    static constexpr int kBRows = BN / CLUSTER;  // columns of B each CTA of a cluster loads
    // the stages from a 1024-byte boundary, then STAGES `full` and STAGES `empty` barriers
    static constexpr int kSmemBytes = STAGES * kStageBytes + 2 * STAGES * 8 + 1024;
    static_assert(CLUSTER == 1 || CLUSTER == 2, "one CTA, or two sharing B");
    static_assert(kBRows % 8 == 0 && kBRows <= 256 && BM <= 256,
                  "TMA boxes of whole 8-row swizzle atoms, at most 256 rows");
    static_assert((!Mma::kMnA || BM % Gemm::kMnRows == 0) &&
                      (!Mma::kMnB || kBRows % Gemm::kMnRows == 0),
                  "MN-major operands: whole blocks of 64 rows per CTA");

    // The loads of k-tile kt of ROWS rows (along M or N) of an operand from row r0 into the
    // stage at `dst`: one box of ROWS rows of the k-tile's 128 bytes (K-major), or ROWS / 64
    // boxes of the k-tile's 64 k's by 64 rows' 128 bytes (MN-major); multicast to the CTAs of
    // `mask` (0: this CTA alone).
    template <bool MN, int ROWS>
    __device__ __forceinline__ static void load(unsigned dst, const TensorMap& map, int kt,
                                                int r0, int bi, unsigned bar,
                                                unsigned short mask) {
        constexpr int kBoxes = MN ? ROWS / Gemm::kMnRows : 1;
#pragma unroll
        for (int j = 0; j < kBoxes; ++j) {
            const int c0 = MN ? (r0 + j * Gemm::kMnRows) * ELEM : kt * kKRowBytes;
            const int c1 = MN ? kt * Gemm::kMnRows : r0;
            const unsigned at = dst + j * Gemm::kMnBlockBytes;
            if (mask)
                tma_load(at, map, c0, c1, bi, bar, mask);
            else
                tma_load(at, map, c0, c1, bi, bar);
        }
    }

    // The producer lane: k-tiles kt0 .. kt1 - 1 of this CTA's batch entries, in the consumers'
    // order, each into the next slot once its previous k-tile's readers have all released it.
    __device__ static void produce(const TensorMap& amap, const TensorMap& bmap, unsigned smem,
                                   unsigned full, unsigned empty, int m0, int n0, int kt0,
                                   int kt1, int batch) {
        const int rank = CLUSTER > 1 ? static_cast<int>(cluster_rank()) : 0;
        int slot = 0, round = 0;  // the stage slot, and how often it has been filled
        for (int bi = blockIdx.y; bi < batch; bi += gridDim.y)
            for (int kt = kt0; kt < kt1; ++kt) {
                if (round > 0) mbar_wait(empty + 8 * slot, (round - 1) & 1);
                const unsigned stage = smem + slot * kStageBytes, bar = full + 8 * slot;
                mbar_expect_tx(bar, kStageBytes);
                load<Mma::kMnA, BM>(stage, amap, kt, m0, bi, bar, 0);
                load<Mma::kMnB, kBRows>(stage + (BM + rank * kBRows) * kKRowBytes, bmap, kt,
                                        n0 + rank * kBRows, bi, bar,
                                        CLUSTER > 1 ? (1 << CLUSTER) - 1 : 0);
                if (++slot == STAGES) {
                    slot = 0;
                    ++round;
                }
            }
    }

    // A consumer warp's release of a slot: one arrival on its `empty` barrier in every CTA of
    // the cluster (lane r on rank r's), once the whole warp has passed its wgmma wait.
    __device__ __forceinline__ static void release(unsigned empty, int slot) {
        __syncwarp();
        const unsigned lane = threadIdx.x % 32;
        if (lane < CLUSTER) mbar_arrive(empty + 8 * slot, lane);
    }

    // The consumer warpgroups: k-tiles kt0 .. kt1 - 1 of each batch entry into the
    // accumulators, then D through the epilogue `ep`, or (split-K, `splits` > 1) the
    // accumulators as they are into this split's partial, (batch, M, N) elements of Acc from
    // `ws`, for rw_tma_reduce to sum.
    __device__ static void consume(unsigned smem, unsigned full, unsigned empty, int M, int N,
                                   int m0, int n0, int kt0, int kt1, int batch,
                                   const Epilogue& ep, void* ws, int splits) {
        const unsigned a_row = (threadIdx.x / 128) * 64 * kKRowBytes;
        int slot = 0, round = 0;
        for (int bi = blockIdx.y; bi < batch; bi += gridDim.y) {
            Acc acc[1][Gemm::NI][4];
#pragma unroll
            for (int j = 0; j < Gemm::NI; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[0][j][e] = Acc(0);
            int last = -1;  // the slot of the k-tile whose wgmma may still be running
            for (int kt = kt0; kt < kt1; ++kt) {
                mbar_wait(full + 8 * slot, round & 1);
                Gemm::Warpgroup::ktile(acc, smem + slot * kStageBytes, a_row);
                wgmma_wait<1>();
                if (last >= 0) release(empty, last);
                last = slot;
                if (++slot == STAGES) {
                    slot = 0;
                    ++round;
                }
            }
            wgmma_wait<0>();
            if (last >= 0) release(empty, last);
            if (splits > 1) {
                Acc* part = static_cast<Acc*>(ws) + static_cast<long long>(blockIdx.z) * batch *
                                                        M * N;
                const Epilogue plain{nullptr, part, 0, 0, 0, 1.0, 0.0, kAccCode, kAccCode, 0};
                Gemm::epilogue(acc, plain, bi, M, N, m0, n0);
            } else {
                Gemm::epilogue(acc, ep, bi, M, N, m0, n0);
            }
        }
    }

    // Split `splits` (blockIdx.z) of K: its share of the KT k-tiles, as even as they divide.
    __device__ static void run(const TensorMap& amap, const TensorMap& bmap, int M, int N,
                               int kbytes, int batch, const Epilogue& ep, void* ws,
                               int splits) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
        extern __shared__ __align__(128) unsigned char smem_bytes[];
        const unsigned smem = (shared_address(smem_bytes) + 1023) & ~1023u;
        const unsigned full = smem + STAGES * kStageBytes, empty = full + 8 * STAGES;
        const int KT = (kbytes + kKRowBytes - 1) / kKRowBytes;
        const int kt0 = static_cast<int>(static_cast<long long>(KT) * blockIdx.z / splits);
        const int kt1 = static_cast<int>(static_cast<long long>(KT) * (blockIdx.z + 1) / splits);
        if (threadIdx.x == kConsumers) {
            for (int s = 0; s < STAGES; ++s) {
                mbar_init(full + 8 * s, 1);
                mbar_init(empty + 8 * s, kConsumers / 32 * CLUSTER);
            }
            fence_mbar_init();
        }
        if constexpr (CLUSTER > 1)
            cluster_sync();  // every CTA's barriers initialized before any load or arrival
        else
            __syncthreads();
        int m0, n0;  // the cluster's tiles lie one above the other along M
        grouped_tile<BM * CLUSTER, BN>(M, N, blockIdx.x / CLUSTER, m0, n0);
        m0 += (blockIdx.x % CLUSTER) * BM;
        if (threadIdx.x < kConsumers) {
            if constexpr (kHandsRegs) regs_raise<kConsumerRegs>();
            consume(smem, full, empty, M, N, m0, n0, kt0, kt1, batch, ep, ws, splits);
        } else {
            if constexpr (kHandsRegs) regs_lower<kProducerRegs>();
            if (threadIdx.x == kConsumers)
                produce(amap, bmap, smem, full, empty, m0, n0, kt0, kt1, batch);
        }
        if constexpr (CLUSTER > 1) {
            __syncwarp();
            cluster_sync();  // no CTA leaves while a peer may still arrive on its barriers
        }
#else
        __trap();  // wgmma exists on sm_90a alone
#endif
    }
};

// Split-K's second pass: D = alpha * (the sum of the `splits` partials, (batch, M, N) elements
// of Acc each, summed in split order) + beta * C, one output per thread of a grid-stride loop.
template <typename Acc>
__device__ void splitk_reduce(const Acc* ws, int splits, int M, int N, int batch,
                              const Epilogue& ep) {
    const long long total = static_cast<long long>(batch) * M * N;
    const long long step = static_cast<long long>(gridDim.x) * blockDim.x;
    for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
         i += step) {
        Acc sum = ws[i];
        for (int s = 1; s < splits; ++s) sum += ws[s * total + i];
        const long long row = i / N;
        write_element<Acc>(ep, static_cast<int>(row / M), static_cast<int>(row % M),
                           static_cast<int>(i % N), N, M, sum);
    }
}

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
RW_MMA_TILES(rw_mma_f16_m16n8k16, rw::MmaF16, 2)
RW_MMA_TILES(rw_mma_bf16_m16n8k16, rw::MmaBf16, 2)
// f64 (sm_90): warp tiles of 64 x 32 and 32 x 64, whose 64 double accumulators fit
RW_MMA(rw_mma_f64_m16n8k4_128x128_s4, rw::MmaF64<4>, 8, 128, 128, 2, 4, 4)
RW_MMA(rw_mma_f64_m16n8k4_128x64_s4, rw::MmaF64<4>, 8, 128, 64, 2, 2, 4)
RW_MMA(rw_mma_f64_m16n8k4_64x128_s4, rw::MmaF64<4>, 8, 64, 128, 2, 2, 4)

// Entry point rw_wgmma_<kind>_<BM>x<BN>_s<STAGES> (sm_90a): the same parameters; BM / 64
// warpgroups, one warp per 16 rows, instructions of WIDE columns across the 256-column tile
// (kept in step with WGMMA_TILES in backends/raw_wmma.py).
#define RW_WGMMA_TILES(PREFIX, MMA, ELEM, WIDE)                         \
    RW_MMA(PREFIX##_256x128_s4, MMA<128>, ELEM, 256, 128, 16, 1, 4)     \
    RW_MMA(PREFIX##_128x256_s4, MMA<WIDE>, ELEM, 128, 256, 8, 1, 4)

RW_WGMMA_TILES(rw_wgmma_f16, rw::WgF16, 2, 256)
RW_WGMMA_TILES(rw_wgmma_bf16, rw::WgBf16, 2, 256)
RW_WGMMA_TILES(rw_wgmma_tf32, rw::WgTf32, 4, 256)
RW_WGMMA_TILES(rw_wgmma_s8, rw::WgS8, 1, 128)
RW_WGMMA_TILES(rw_wgmma_u8, rw::WgU8, 1, 128)
RW_WGMMA_TILES(rw_wgmma_b1and, rw::WgB1And, 1, 256)

// Entry point rw_tma_<kind>_<BM>x<BN>_c<CLUSTER>[_<A><B>] (sm_90a): A and B as tensor maps
// of bytes with 128-byte boxes in the 128-byte swizzle (multibackend/gpu/tensormap.py) — a
// K-major operand (K, rows, batch) in boxes of BM or BN / CLUSTER rows, an MN-major one
// (rows, K, batch) in boxes of 64 k's — then C, D, the epilogue's parameters, and split-K's
// workspace and number of splits (1: D written directly; more: each split's partial written
// to ws for rw_tma_reduce). The suffix names A's and B's major orders ("r" row-, "c"
// column-major) where they are not A row- and B column-major: the 16-bit kinds are built for
// all four. Grid: x = output tiles (a multiple of CLUSTER), y = batch, z = splits; block
// BM / 64 + 1 warpgroups; dynamic shared memory TmaGemm<...>::kSmemBytes (kept in step with
// TMA_TILES in backends/raw_wmma/kernels.py).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define RW_CLUSTER_DIMS(CL) __cluster_dims__(CL, 1, 1)
#else
#define RW_CLUSTER_DIMS(CL)
#endif
#define RW_TMA(NAME, MMA, WIDE, MAJOR, BM, BN, ST, CL)                                          \
    extern "C" __global__ void __launch_bounds__(BM / 16 * 32 + 128, 1) RW_CLUSTER_DIMS(CL)     \
        NAME(const __grid_constant__ rw::TensorMap a_map,                                       \
             const __grid_constant__ rw::TensorMap b_map, const void* c, void* d, int M, int N, \
             int kbytes, long long scm, long long scn, long long sbc, int batch, double alpha,  \
             double beta, int c_code, int d_code, void* ws, int splits) {                       \
        if constexpr (rw::selected(#NAME)) {                                                    \
            const rw::Epilogue ep{c, d, scm, scn, sbc, alpha, beta, c_code, d_code, 0};         \
            rw::TmaGemm<MMA<WIDE, MAJOR>, BM, BN, ST, CL>::run(a_map, b_map, M, N, kbytes,      \
                                                               batch, ep, ws, splits);          \
        }                                                                                       \
    }

#define RW_TMA_TILES(PREFIX, MMA, WIDE, MAJOR, LAYOUT)                          \
    RW_TMA(PREFIX##_128x256_c1##LAYOUT, MMA, WIDE, MAJOR, 128, 256, 4, 1)       \
    RW_TMA(PREFIX##_128x256_c2##LAYOUT, MMA, WIDE, MAJOR, 128, 256, 4, 2)       \
    RW_TMA(PREFIX##_64x256_c1##LAYOUT, MMA, WIDE, MAJOR, 64, 256, 4, 1)
// the 16-bit kinds: A row- (K-major) or column-major (M-major), B column- (K-major) or
// row-major (N-major)
#define RW_TMA_LAYOUTS(PREFIX, MMA)                                             \
    RW_TMA_TILES(PREFIX, MMA, 256, rw::kKMajor, )                               \
    RW_TMA_TILES(PREFIX, MMA, 256, rw::kMnMajorB, _rr)                          \
    RW_TMA_TILES(PREFIX, MMA, 256, rw::kMnMajorA, _cc)                          \
    RW_TMA_TILES(PREFIX, MMA, 256, rw::kMnMajorA | rw::kMnMajorB, _cr)

RW_TMA_LAYOUTS(rw_tma_f16, rw::WgF16)
RW_TMA_LAYOUTS(rw_tma_bf16, rw::WgBf16)
RW_TMA_TILES(rw_tma_tf32, rw::WgTf32, 256, rw::kKMajor, )
RW_TMA_TILES(rw_tma_s8, rw::WgS8, 128, rw::kKMajor, )
RW_TMA_TILES(rw_tma_u8, rw::WgU8, 128, rw::kKMajor, )
RW_TMA_TILES(rw_tma_b1and, rw::WgB1And, 256, rw::kKMajor, )

// Entry point rw_tma_reduce_<acc>: split-K's second pass over the partials `ws` the TMA
// kernels wrote with `splits` > 1 (float32 for the floating kinds, int32 for s8, u8 and b1),
// D and C as the TMA kernel's epilogue takes them. Grid: x = blocks of 256 outputs.
#define RW_TMA_REDUCE(NAME, ACC)                                                                \
    extern "C" __global__ void __launch_bounds__(256)                                           \
        NAME(const void* ws, int splits, int M, int N, int batch, const void* c, void* d,       \
             long long scm, long long scn, long long sbc, double alpha, double beta, int c_code, \
             int d_code) {                                                                      \
        if constexpr (rw::selected(#NAME)) {                                                    \
            const rw::Epilogue ep{c, d, scm, scn, sbc, alpha, beta, c_code, d_code, 0};         \
            rw::splitk_reduce(static_cast<const ACC*>(ws), splits, M, N, batch, ep);            \
        }                                                                                       \
    }

RW_TMA_REDUCE(rw_tma_reduce_f32, float)
RW_TMA_REDUCE(rw_tma_reduce_s32, int)
