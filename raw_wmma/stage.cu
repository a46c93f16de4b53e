// Staging copies: one misaligned operand copied onto the 16-byte grid, or copied in the other
// orientation for a kernel that reads it K-major (see multibackend/staging.py), the pass a
// repeated staged call launches before its GEMM.
//
// The destination is `lines` lines of `ld` elements each (ld a multiple of 16 bytes, lines
// starting 16-byte aligned); the source element `pos` of line `line` is at
// src[line * src_line + pos * src_pos], any strides. Each thread writes one 16-byte vector of a
// line: 16 / sizeof(element) consecutive elements, read one by one from the source (so no
// source alignment is needed), those at or past `length` written as 0 (the line's padding,
// which no kernel reads). blockIdx.x runs over a line's vectors, blockIdx.y (with a stride
// loop beyond 65535) over the lines. Elements are copied as raw bits, so one instance per
// element size serves every dtype of that size.
//
// One templated body; the extern "C" entry points below name each instance.
#include "common.cuh"

namespace rw {

constexpr int kStageThreads = 256;

template <int BYTES>
struct Bits;
template <>
struct Bits<1> {
    using T = unsigned char;
};
template <>
struct Bits<2> {
    using T = unsigned short;
};
template <>
struct Bits<4> {
    using T = unsigned int;
};
template <>
struct Bits<8> {
    using T = unsigned long long;
};

template <int BYTES>
__device__ void stage_copy(const void* src, void* dst, int lines, int length, long long ld,
                           long long src_line, long long src_pos) {
    using T = typename Bits<BYTES>::T;
    constexpr int kVec = 16 / BYTES;
    union Vector {
        uint4 bits;
        T elem[kVec];
    };
    const long long first = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) * kVec;
    if (first >= length) return;
    const T* from = static_cast<const T*>(src);
    T* to = static_cast<T*>(dst);
    for (long long line = blockIdx.y; line < lines; line += gridDim.y) {
        const T* row = from + line * src_line;
        Vector v;
#pragma unroll
        for (int i = 0; i < kVec; ++i) {
            const long long pos = first + i;
            v.elem[i] = pos < length ? row[pos * src_pos] : T(0);
        }
        *reinterpret_cast<uint4*>(to + line * ld + first) = v.bits;
    }
}

// The same copy where the source's lines are its contiguous direction (src_line 1: a matrix
// staged in the other orientation, a transpose): a block moves tiles of 32 lines by 32
// positions through shared memory, reading with its lanes along the lines and writing with
// them along the positions, so both sides are read and written in whole sectors. Positions at
// or past `length` are not written (no kernel reads a line's padding).
template <int BYTES>
__device__ void stage_transpose(const void* src, void* dst, int lines, int length, long long ld,
                                long long src_line, long long src_pos) {
    using T = typename Bits<BYTES>::T;
    constexpr int kTile = 32, kRows = kStageThreads / kTile;
    __shared__ T tile[kTile][kTile + 1];  // [position][line], padded against bank conflicts
    const int lane = threadIdx.x % kTile, row = threadIdx.x / kTile;
    const long long pos0 = static_cast<long long>(blockIdx.x) * kTile;
    const T* from = static_cast<const T*>(src);
    T* to = static_cast<T*>(dst);
    for (long long line0 = static_cast<long long>(blockIdx.y) * kTile; line0 < lines;
         line0 += static_cast<long long>(gridDim.y) * kTile) {
        for (int p = row; p < kTile; p += kRows) {
            const long long pos = pos0 + p, line = line0 + lane;
            if (pos < length && line < lines) tile[p][lane] = from[line * src_line + pos * src_pos];
        }
        __syncthreads();
        for (int l = row; l < kTile; l += kRows) {
            const long long pos = pos0 + lane, line = line0 + l;
            if (pos < length && line < lines) to[line * ld + pos] = tile[lane][l];
        }
        __syncthreads();
    }
}

}  // namespace rw

// Entry points rw_stage_b<bits> (stage_copy: blocks of 256 threads, grid (ceil(length / (256 *
// 16 / element bytes)), min(lines, 65535))) and rw_stage_t_b<bits> (stage_transpose: blocks of
// 256 threads, grid (ceil(length / 32), min(ceil(lines / 32), 65535))).
#define RW_STAGE(NAME, COPY, BYTES)                                                             \
    extern "C" __global__ void __launch_bounds__(rw::kStageThreads)                              \
        NAME(const void* src, void* dst, int lines, int length, long long ld,                   \
             long long src_line, long long src_pos) {                                           \
        if constexpr (rw::selected(#NAME))                                                      \
            rw::COPY<BYTES>(src, dst, lines, length, ld, src_line, src_pos);                    \
    }

RW_STAGE(rw_stage_b8, stage_copy, 1)
RW_STAGE(rw_stage_b16, stage_copy, 2)
RW_STAGE(rw_stage_b32, stage_copy, 4)
RW_STAGE(rw_stage_b64, stage_copy, 8)
RW_STAGE(rw_stage_t_b8, stage_transpose, 1)
RW_STAGE(rw_stage_t_b16, stage_transpose, 2)
RW_STAGE(rw_stage_t_b32, stage_transpose, 4)
RW_STAGE(rw_stage_t_b64, stage_transpose, 8)
