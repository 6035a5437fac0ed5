// The buffer work of a GPU tensor-parallel group, enqueued on a stream:
// group.h's copy, add and copy_rows (NcclCommunicator and the one-GPU
// stand-in both run them on the compute stream), and the stand-in's sums and
// maxima over the ranks' buffers.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>

#include "common/bf16.h"

namespace tpsp::gpu {

// dst [count] = src [count]
void copy_on_stream(cudaStream_t stream, bf16* dst, const bf16* src, size_t count);
// acc [count] += x [count], in fp32, rounded once
void add_on_stream(cudaStream_t stream, bf16* acc, const bf16* x, size_t count);
// rows × width elements between two row strides
void copy_rows_on_stream(cudaStream_t stream, bf16* dst, size_t dst_stride, const bf16* src, size_t src_stride,
                         size_t rows, size_t width);

// The most ranks a reduction over device buffers takes.
constexpr int max_reduced_ranks = 8;

// out [count] = Σ (or max) of inputs[q] [count] over q = 0 … ranks − 1, left
// to right in fp32 and rounded once to T. `inputs` is a host array of device
// pointers (ranks ≤ max_reduced_ranks); out may be none of them.
template <class T>
void reduce_on_stream(cudaStream_t stream, T* out, const T* const* inputs, int ranks, size_t count, bool maximum);

// out [count] = Σ blocks [q · count …] over q = 0 … ranks − 1, left to right
// in fp32 (Communicator's sum_in_rank_order on the device: the data-parallel
// reduce-scatter over NCCL, any number of ranks). out may not overlap blocks.
void sum_blocks_on_stream(cudaStream_t stream, float* out, const float* blocks, int ranks, size_t count);

}  // namespace tpsp::gpu
