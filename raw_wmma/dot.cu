// Vector dot products x . y for f16, bf16, f32 and f64, in two passes.
//
// Pass 1 (dot_partial): a grid-stride loop whose start is blockIdx.x * blockDim.x +
// threadIdx.x, reading 16 bytes of x and of y per step (8 halves, 4 floats, 2 doubles) with
// several steps in flight per thread; a warp-shuffle then shared-memory reduction leaves one
// partial sum per block. Pass 2 (dot_final) sums the block partials in a fixed order, so the
// result is deterministic.
//
// Accuracy: with an f32 accumulator a product of two halves (or two bf16) is exact in f32,
// so each half2 pair is widened to float2 and fused-multiply-added there; the f32 path keeps
// f64 partials. Rounding each product to half (as __hfma2 does) would cost ~2^-11 per term,
// far above f32 accumulation, so the __hfma2 form runs only where the caller asked for an f16
// accumulator: half2 lanes multiply-add 4 terms with __hfma2 and are flushed to f32 after
// every 16-byte step.
//
// One templated body per pass; the extern "C" entry points below name each instance.
#include "common.cuh"

namespace rw {

constexpr int kDotThreads = 256;
constexpr int kDotUnroll = 4;  // 16-byte steps in flight per thread

enum DotMode { kExact = 0, kHfma2 = 1 };

template <typename T>
struct DotTraits;
template <>
struct DotTraits<__half> {
    using Acc = float;
    static constexpr int kPerVec = 8;
    template <int MODE>
    __device__ static Acc vec(const uint4& x, const uint4& y) {
        const __half2* xh = reinterpret_cast<const __half2*>(&x);
        const __half2* yh = reinterpret_cast<const __half2*>(&y);
        if constexpr (MODE == kHfma2) {
            __half2 h = __hmul2(xh[0], yh[0]);
            h = __hfma2(xh[1], yh[1], h);
            h = __hfma2(xh[2], yh[2], h);
            h = __hfma2(xh[3], yh[3], h);
            const float2 f = __half22float2(h);
            return f.x + f.y;
        } else {
            float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const float2 a = __half22float2(xh[i]), b = __half22float2(yh[i]);
                s0 = fmaf(a.x, b.x, s0);
                s1 = fmaf(a.y, b.y, s1);
            }
            return s0 + s1;
        }
    }
    __device__ static Acc one(__half x, __half y) { return __half2float(x) * __half2float(y); }
};
template <>
struct DotTraits<__nv_bfloat16> {
    using Acc = float;
    static constexpr int kPerVec = 8;
    template <int MODE>
    __device__ static Acc vec(const uint4& x, const uint4& y) {
        const __nv_bfloat162* xh = reinterpret_cast<const __nv_bfloat162*>(&x);
        const __nv_bfloat162* yh = reinterpret_cast<const __nv_bfloat162*>(&y);
        float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const float2 a = __bfloat1622float2(xh[i]), b = __bfloat1622float2(yh[i]);
            s0 = fmaf(a.x, b.x, s0);
            s1 = fmaf(a.y, b.y, s1);
        }
        return s0 + s1;
    }
    __device__ static Acc one(__nv_bfloat16 x, __nv_bfloat16 y) {
        return __bfloat162float(x) * __bfloat162float(y);
    }
};
template <>
struct DotTraits<float> {
    using Acc = double;
    static constexpr int kPerVec = 4;
    template <int MODE>
    __device__ static Acc vec(const uint4& x, const uint4& y) {
        const float4 a = *reinterpret_cast<const float4*>(&x);
        const float4 b = *reinterpret_cast<const float4*>(&y);
        return static_cast<double>(a.x) * b.x + static_cast<double>(a.y) * b.y +
               static_cast<double>(a.z) * b.z + static_cast<double>(a.w) * b.w;
    }
    __device__ static Acc one(float x, float y) { return static_cast<double>(x) * y; }
};
template <>
struct DotTraits<double> {
    using Acc = double;
    static constexpr int kPerVec = 2;
    template <int MODE>
    __device__ static Acc vec(const uint4& x, const uint4& y) {
        const double2 a = *reinterpret_cast<const double2*>(&x);
        const double2 b = *reinterpret_cast<const double2*>(&y);
        return fma(a.x, b.x, a.y * b.y);
    }
    __device__ static Acc one(double x, double y) { return x * y; }
};

// The block's sum of v, valid in thread 0.
template <typename Acc>
__device__ __forceinline__ Acc block_sum(Acc v) {
    __shared__ Acc warp_sums[kDotThreads / 32];
#pragma unroll
    for (int off = 16; off > 0; off /= 2) v += __shfl_down_sync(0xffffffffu, v, off);
    if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = v;
    __syncthreads();
    if (threadIdx.x < 32) {
        v = threadIdx.x < kDotThreads / 32 ? warp_sums[threadIdx.x] : Acc(0);
#pragma unroll
        for (int off = 16; off > 0; off /= 2) v += __shfl_down_sync(0xffffffffu, v, off);
    }
    return v;
}

// Pass 1. VEC: x and y are contiguous and 16-byte aligned (16-byte loads, the last n % per
// elements read singly); otherwise elements are read one by one with strides sx, sy.
template <typename T, bool VEC, int MODE>
__device__ __forceinline__ void dot_partial(const T* x, long long sx, const T* y, long long sy,
                                            long long n,
                                            typename DotTraits<T>::Acc* partial) {
    using Tr = DotTraits<T>;
    using Acc = typename Tr::Acc;
    const long long start = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
    const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
    Acc acc[kDotUnroll] = {};
    if constexpr (VEC) {
        const uint4* xv = reinterpret_cast<const uint4*>(x);
        const uint4* yv = reinterpret_cast<const uint4*>(y);
        const long long nvec = n / Tr::kPerVec;
        long long i = start;
        for (; i + (kDotUnroll - 1) * stride < nvec; i += kDotUnroll * stride) {
            uint4 xs[kDotUnroll], ys[kDotUnroll];
#pragma unroll
            for (int u = 0; u < kDotUnroll; ++u) {
                xs[u] = __ldg(xv + i + u * stride);
                ys[u] = __ldg(yv + i + u * stride);
            }
#pragma unroll
            for (int u = 0; u < kDotUnroll; ++u) acc[u] += Tr::template vec<MODE>(xs[u], ys[u]);
        }
        for (; i < nvec; i += stride) acc[0] += Tr::template vec<MODE>(xv[i], yv[i]);
        for (long long j = nvec * Tr::kPerVec + start; j < n; j += stride)
            acc[1] += Tr::one(x[j], y[j]);
    } else {
        for (long long j = start; j < n; j += stride) acc[0] += Tr::one(x[j * sx], y[j * sy]);
    }
    Acc v = (acc[0] + acc[1]) + (acc[2] + acc[3]);
    v = block_sum(v);
    if (threadIdx.x == 0) partial[blockIdx.x] = v;
}

// Pass 2: one block sums the partials and writes out[0] in the element type d_code names.
template <typename Acc>
__device__ __forceinline__ void dot_final(const Acc* partial, int count, void* out, int d_code) {
    Acc v = Acc(0);
    for (int i = threadIdx.x; i < count; i += kDotThreads) v += partial[i];
    v = block_sum(v);
    if (threadIdx.x == 0) store_from_double(out, 0, d_code, static_cast<double>(v), false);
}

}  // namespace rw

// Entry point rw_dot_<dtype>_<vec|strided>[_hfma2]: pass 1, one partial per block (grid x).
#define RW_DOT(NAME, T, VEC, MODE)                                                              \
    extern "C" __global__ void __launch_bounds__(rw::kDotThreads, 1)                               \
        NAME(const T* x, long long sx, const T* y, long long sy, long long n,                   \
             typename rw::DotTraits<T>::Acc* partial) {                                         \
        if constexpr (rw::selected(#NAME)) rw::dot_partial<T, VEC, MODE>(x, sx, y, sy, n, partial); \
    }

// Entry point rw_dot_final_<f32|f64>: pass 2, launched as one block of 256 threads.
#define RW_DOT_FINAL(NAME, ACC)                                                                 \
    extern "C" __global__ void __launch_bounds__(rw::kDotThreads, 1)                               \
        NAME(const ACC* partial, int count, void* out, int d_code) {                            \
        if constexpr (rw::selected(#NAME)) rw::dot_final<ACC>(partial, count, out, d_code);     \
    }

RW_DOT(rw_dot_f16_vec, __half, true, rw::kExact)
RW_DOT(rw_dot_f16_vec_hfma2, __half, true, rw::kHfma2)
RW_DOT(rw_dot_f16_strided, __half, false, rw::kExact)
RW_DOT(rw_dot_bf16_vec, __nv_bfloat16, true, rw::kExact)
RW_DOT(rw_dot_bf16_strided, __nv_bfloat16, false, rw::kExact)
RW_DOT(rw_dot_f32_vec, float, true, rw::kExact)
RW_DOT(rw_dot_f32_strided, float, false, rw::kExact)
RW_DOT(rw_dot_f64_vec, double, true, rw::kExact)
RW_DOT(rw_dot_f64_strided, double, false, rw::kExact)
RW_DOT_FINAL(rw_dot_final_f32, float)
RW_DOT_FINAL(rw_dot_final_f64, double)
