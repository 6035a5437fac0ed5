#include "parallel/device_buffer_work.h"

#include <stdexcept>
#include <string>

namespace tpsp::gpu {

static void check(cudaError_t status, const char* what) {
    if (status != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(status));
}

constexpr unsigned buffer_threads = 256;

static unsigned blocks_for(size_t count) { return unsigned((count + buffer_threads - 1) / buffer_threads); }

__global__ void add_kernel(bf16* acc, const bf16* x, size_t count) {
    const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < count) acc[i] = __float2bfloat16(__bfloat162float(acc[i]) + __bfloat162float(x[i]));
}

void copy_on_stream(cudaStream_t stream, bf16* dst, const bf16* src, size_t count) {
    check(cudaMemcpyAsync(dst, src, count * sizeof(bf16), cudaMemcpyDeviceToDevice, stream), "copy");
}

void add_on_stream(cudaStream_t stream, bf16* acc, const bf16* x, size_t count) {
    if (count == 0) return;
    add_kernel<<<blocks_for(count), buffer_threads, 0, stream>>>(acc, x, count);
    check(cudaGetLastError(), "add");
}

void copy_rows_on_stream(cudaStream_t stream, bf16* dst, size_t dst_stride, const bf16* src, size_t src_stride,
                         size_t rows, size_t width) {
    check(cudaMemcpy2DAsync(dst, dst_stride * sizeof(bf16), src, src_stride * sizeof(bf16), width * sizeof(bf16), rows,
                            cudaMemcpyDeviceToDevice, stream),
          "copy_rows");
}

// The ranks' buffers, by value in the kernel's arguments.
template <class T>
struct RankBuffers {
    const T* at[max_reduced_ranks];
    int ranks;
};

__device__ inline float to_float(float x) { return x; }
__device__ inline float to_float(bf16 x) { return __bfloat162float(x); }
__device__ inline void store(float* out, float x) { *out = x; }
__device__ inline void store(bf16* out, float x) { *out = __float2bfloat16(x); }

template <class T>
__global__ void reduce_kernel(T* out, RankBuffers<T> in, size_t count, bool maximum) {
    const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= count) return;
    float acc = to_float(in.at[0][i]);
    for (int q = 1; q < in.ranks; q++) acc = maximum ? fmaxf(acc, to_float(in.at[q][i])) : acc + to_float(in.at[q][i]);
    store(out + i, acc);
}

template <class T>
void reduce_on_stream(cudaStream_t stream, T* out, const T* const* inputs, int ranks, size_t count, bool maximum) {
    if (ranks < 1 || ranks > max_reduced_ranks)
        throw std::invalid_argument("reduce_on_stream: " + std::to_string(ranks) + " ranks (1 to " +
                                    std::to_string(max_reduced_ranks) + ")");
    if (count == 0) return;
    RankBuffers<T> in{};
    for (int q = 0; q < ranks; q++) in.at[q] = inputs[q];
    in.ranks = ranks;
    reduce_kernel<T><<<blocks_for(count), buffer_threads, 0, stream>>>(out, in, count, maximum);
    check(cudaGetLastError(), "reduce over the ranks");
}

__global__ void sum_blocks_kernel(float* out, const float* blocks, int ranks, size_t count) {
    const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= count) return;
    float acc = blocks[i];
    for (int q = 1; q < ranks; q++) acc += blocks[size_t(q) * count + i];
    out[i] = acc;
}

void sum_blocks_on_stream(cudaStream_t stream, float* out, const float* blocks, int ranks, size_t count) {
    if (count == 0) return;
    sum_blocks_kernel<<<blocks_for(count), buffer_threads, 0, stream>>>(out, blocks, ranks, count);
    check(cudaGetLastError(), "sum of the ranks' blocks");
}

template void reduce_on_stream<bf16>(cudaStream_t, bf16*, const bf16* const*, int, size_t, bool);
template void reduce_on_stream<float>(cudaStream_t, float*, const float* const*, int, size_t, bool);

}  // namespace tpsp::gpu
