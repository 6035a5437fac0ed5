// The CUDA kernels of cuda_kernels.h, except the GEMMs (cuda_gemm.cu).
// Each op is a __global__ kernel and the host function that launches it.
#include "model/kernels/cuda_kernels.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

namespace tpsp {
using gpu::batched_gemm;
using gpu::check_cuda;
using gpu::check_launch;
using gpu::GpuContext;

// ----------------------------------------------------------------------------
// launch shapes and reductions

constexpr int block_threads = 256;
constexpr int warp_size = 32;
constexpr int warps_per_block = block_threads / warp_size;

// At least one block: every kernel checks its bounds, and a grid of 0 is a launch error.
static unsigned blocks_for(int64_t n, int per_block = block_threads) {
    return unsigned(std::max<int64_t>(1, (n + per_block - 1) / per_block));
}

__device__ inline float warp_sum(float v) {
    for (int offset = warp_size / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

__device__ inline float warp_max(float v) {
    for (int offset = warp_size / 2; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
    return v;
}

// The sum (or max) over a whole block, returned to every thread.
__device__ inline float block_reduce(float v, bool is_max) {
    __shared__ float partial[warp_size];
    const int lane = threadIdx.x % warp_size, warp = threadIdx.x / warp_size;
    v = is_max ? warp_max(v) : warp_sum(v);
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    const float identity = is_max ? -INFINITY : 0.0f;
    v = lane < int(blockDim.x / warp_size) ? partial[lane] : identity;
    v = is_max ? warp_max(v) : warp_sum(v);
    __syncthreads();  // partial may be reused by the next call
    return v;
}

__device__ inline float to_float(bf16 x) { return __bfloat162float(x); }
__device__ inline bf16 to_bf16(float x) { return __float2bfloat16(x); }

// ----------------------------------------------------------------------------
// deterministic sums over rows: the parameter gradients of the biases and of
// LayerNorm add up a column of N rows. Each column's rows are summed in one
// fixed order, with no atomics, so that two runs give the same bits (the
// data-parallel modes are then proven bit for bit on the GPU as on the CPU):
//   1. a block of 32 columns × 16 lanes per row group: lane l adds rows
//      l, l + 16, … of the group, then the 16 lanes are added in a fixed tree;
//      each of the 32 row groups writes its partial sum,
//   2. one thread per column adds the 32 partials in group order into the
//      gradient (+=, as the micro-batches accumulate).
// The order depends on the shape alone, not on the device or the timing.

constexpr int sum_columns = 32;     // a block's columns: one warp across
constexpr int sum_lanes = 16;       // a block's threads down its rows
constexpr int sum_row_groups = 32;  // blocks down the rows

// The partials [quantities, sum_row_groups, width], in this thread's device
// scratch: grown in the first step and kept (cudaFree waits for the device).
static float* column_partials(int quantities, int width) {
    thread_local float* scratch = nullptr;
    thread_local size_t scratch_floats = 0;
    const size_t needed = size_t(quantities) * sum_row_groups * size_t(width);
    if (needed > scratch_floats) {
        if (scratch) check_cuda(cudaFree(scratch), "cudaFree");
        scratch = nullptr;
        check_cuda(cudaMalloc(&scratch, needed * sizeof(float)), "cudaMalloc of the column sums' partials");
        scratch_floats = needed;
    }
    return scratch;
}

// Q quantities per (row, column) from term(n, c, acc) (acc[q] += …), summed per row group.
template <int Q, class Term>
__global__ void column_partial_sums_kernel(float* partials, Term term, int N, int width) {
    __shared__ float sums[Q][sum_lanes][sum_columns];
    const int c = blockIdx.x * sum_columns + threadIdx.x, lane = threadIdx.y;
    const int rows_per_group = (N + sum_row_groups - 1) / sum_row_groups;
    const int n0 = blockIdx.y * rows_per_group, n1 = min(N, n0 + rows_per_group);
    float acc[Q] = {};
    if (c < width)
        for (int n = n0 + lane; n < n1; n += sum_lanes) term(n, c, acc);
    for (int q = 0; q < Q; q++) sums[q][lane][threadIdx.x] = acc[q];
    __syncthreads();
    for (int stride = sum_lanes / 2; stride > 0; stride /= 2) {
        if (lane < stride)
            for (int q = 0; q < Q; q++) sums[q][lane][threadIdx.x] += sums[q][lane + stride][threadIdx.x];
        __syncthreads();
    }
    if (lane == 0 && c < width)
        for (int q = 0; q < Q; q++)
            partials[(int64_t(q) * sum_row_groups + blockIdx.y) * width + c] = sums[q][0][threadIdx.x];
}

// out_q [c] += Σ over the row groups g, in order, of partials [q, g, c]
template <int Q>
__global__ void add_column_partials_kernel(float* out0, float* out1, const float* partials, int width) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= width) return;
    float* outs[2] = {out0, out1};
    for (int q = 0; q < Q; q++) {
        float sum = 0.0f;
        for (int g = 0; g < sum_row_groups; g++) sum += partials[(int64_t(q) * sum_row_groups + g) * width + c];
        outs[q][c] += sum;
    }
}

// out0 [c] (and out1 [c] where Q = 2) += Σ_n of term's quantities over the N rows
template <int Q, class Term>
static void add_column_sums(float* out0, float* out1, const Term& term, int N, int width, const char* what) {
    const GpuContext& ctx = gpu::context();
    float* partials = column_partials(Q, width);
    const dim3 block(sum_columns, sum_lanes), grid(blocks_for(width, sum_columns), sum_row_groups);
    column_partial_sums_kernel<Q, Term><<<grid, block, 0, ctx.stream>>>(partials, term, N, width);
    check_launch(what);
    add_column_partials_kernel<Q><<<blocks_for(width), block_threads, 0, ctx.stream>>>(out0, out1, partials, width);
    check_launch(what);
}

// ----------------------------------------------------------------------------
// casts

__global__ void cast_to_bf16_kernel(bf16* out, const float* inp, int64_t n) {
    int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < n) out[i] = to_bf16(inp[i]);
}

void cast_to_bf16(bf16* out, const float* inp, int64_t n) {
    const GpuContext& ctx = gpu::context();
    if (n == 0) return;
    cast_to_bf16_kernel<<<blocks_for(n), block_threads, 0, ctx.stream>>>(out, inp, n);
    check_launch("cast_to_bf16");
}

// ----------------------------------------------------------------------------
// embeddings

__global__ void token_embedding_forward_kernel(bf16* out, const int* inp, const float* wte, int vocab_start,
                                               int V_local, int B, int T, int C) {
    int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= int64_t(T) * B * C) return;
    const int c = int(i % C);
    const int64_t row = i / C;  // t·B + b
    const int b = int(row % B), t = int(row / B);
    const int token = inp[b * T + t] - vocab_start;
    out[i] = token >= 0 && token < V_local ? to_bf16(wte[int64_t(token) * C + c]) : to_bf16(0.0f);
}

void token_embedding_forward(bf16* out, const int* inp, const float* wte, int vocab_start, int V_local, int B, int T,
                             int C) {
    const GpuContext& ctx = gpu::context();
    token_embedding_forward_kernel<<<blocks_for(int64_t(T) * B * C), block_threads, 0, ctx.stream>>>(
        out, inp, wte, vocab_start, V_local, B, T, C);
    check_launch("token_embedding_forward");
}

// The gradient of a row of wte is the sum of the gradients of the positions
// that hold its token. Deterministic, with no atomics: the token ids come
// back to the host, a counting sort lists each token's rows in row order,
// and one thread per (token, channel) adds its rows in that order. The sort
// costs the host one wait for the device at the end of backward (the token
// embedding's is its last op) and 4N + 8·(distinct tokens) bytes up.
//
// segments [2S + 1]: the S tokens present (local ids), then where each one's
// rows begin in rows, and the end; rows [N]: activation rows (t · B + b).
__global__ void token_embedding_backward_kernel(float* dwte, const bf16* dout, const int* segments, const int* rows,
                                                int S, int C) {
    const int segment = blockIdx.x, c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= C) return;
    const int token = segments[segment], begin = segments[S + segment], end = segments[S + segment + 1];
    float sum = 0.0f;
    for (int k = begin; k < end; k++) sum += to_float(dout[int64_t(rows[k]) * C + c]);
    dwte[int64_t(token) * C + c] += sum;
}

void token_embedding_backward(float* dwte, const bf16* dout, const int* inp, int vocab_start, int V_local, int B, int T,
                              int C) {
    const GpuContext& ctx = gpu::context();
    const int N = B * T;
    thread_local std::vector<int> tokens, counts, host;  // host: segments, then rows
    thread_local int* device = nullptr;
    thread_local size_t device_ints = 0;
    tokens.resize(size_t(N));
    check_cuda(cudaMemcpyAsync(tokens.data(), inp, sizeof(int) * size_t(N), cudaMemcpyDeviceToHost, ctx.stream),
               "token_embedding_backward: the tokens");
    check_cuda(cudaStreamSynchronize(ctx.stream), "token_embedding_backward");
    counts.assign(size_t(V_local) + 1, 0);
    const auto local_id = [&](int row) { return tokens[size_t(row % B) * T + size_t(row / B)] - vocab_start; };
    for (int row = 0; row < N; row++) {
        const int id = local_id(row);
        if (id >= 0 && id < V_local) counts[size_t(id) + 1]++;
    }
    int S = 0;
    for (int id = 0; id < V_local; id++) S += counts[size_t(id) + 1] > 0;
    host.assign(size_t(2 * S + 1 + N), 0);
    int* segment_tokens = host.data();
    int* segment_starts = host.data() + S;
    int* rows = host.data() + 2 * S + 1;
    for (int id = 0; id < V_local; id++) counts[size_t(id) + 1] += counts[size_t(id)];  // each id's first row
    for (int id = 0, segment = 0; id < V_local; id++)
        if (counts[size_t(id) + 1] > counts[size_t(id)]) {
            segment_tokens[segment] = id;
            segment_starts[segment++] = counts[size_t(id)];
        }
    segment_starts[S] = counts[size_t(V_local)];
    for (int row = 0; row < N; row++) {  // rows in row order within each token
        const int id = local_id(row);
        if (id >= 0 && id < V_local) rows[counts[size_t(id)]++] = row;
    }
    if (S == 0) return;
    // sized for the most segments (S ≤ N) at the first call of a shape, so that no later step
    // allocates (cudaFree waits for the whole device, NCCL's transfers too)
    const size_t capacity = 3 * size_t(N) + 1;
    if (capacity > device_ints) {
        if (device) check_cuda(cudaFree(device), "cudaFree");
        device = nullptr;
        check_cuda(cudaMalloc(&device, capacity * sizeof(int)), "cudaMalloc of the token embedding's rows");
        device_ints = capacity;
    }
    // from pageable memory: the copy has left `host` when it returns
    check_cuda(cudaMemcpyAsync(device, host.data(), host.size() * sizeof(int), cudaMemcpyHostToDevice, ctx.stream),
               "token_embedding_backward: the rows");
    const dim3 grid(unsigned(S), blocks_for(C));
    token_embedding_backward_kernel<<<grid, block_threads, 0, ctx.stream>>>(dwte, dout, device, device + 2 * S + 1, S,
                                                                            C);
    check_launch("token_embedding_backward");
}

__global__ void position_embedding_forward_kernel(bf16* out, const float* wpe, int pos_start, int T_local, int B,
                                                  int C) {
    int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= int64_t(T_local) * B * C) return;
    const int c = int(i % C), t = int(i / C / B);
    out[i] = to_bf16(to_float(out[i]) + wpe[int64_t(pos_start + t) * C + c]);
}

void position_embedding_forward(bf16* out, const float* wpe, int pos_start, int T_local, int B, int C) {
    const GpuContext& ctx = gpu::context();
    position_embedding_forward_kernel<<<blocks_for(int64_t(T_local) * B * C), block_threads, 0, ctx.stream>>>(
        out, wpe, pos_start, T_local, B, C);
    check_launch("position_embedding_forward");
}

// one thread per (position, channel): sums the batch, so no atomics
__global__ void position_embedding_backward_kernel(float* dwpe, const bf16* dout, int pos_start, int T_local, int B,
                                                   int C) {
    int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= int64_t(T_local) * C) return;
    const int c = int(i % C), t = int(i / C);
    float sum = 0.0f;
    for (int b = 0; b < B; b++) sum += to_float(dout[(int64_t(t) * B + b) * C + c]);
    dwpe[int64_t(pos_start + t) * C + c] += sum;
}

void position_embedding_backward(float* dwpe, const bf16* dout, int pos_start, int T_local, int B, int C) {
    const GpuContext& ctx = gpu::context();
    position_embedding_backward_kernel<<<blocks_for(int64_t(T_local) * C), block_threads, 0, ctx.stream>>>(
        dwpe, dout, pos_start, T_local, B, C);
    check_launch("position_embedding_backward");
}

// ----------------------------------------------------------------------------
// layernorm: one warp per row, the statistics in two passes as on the CPU

constexpr float layernorm_eps = 1e-5f;

struct RowStatistics {
    float mean, rstd;
};

__device__ inline RowStatistics row_statistics(const bf16* x, int C, int lane) {
    float sum = 0.0f;
    for (int c = lane; c < C; c += warp_size) sum += to_float(x[c]);
    const float mean = warp_sum(sum) / C;
    float var = 0.0f;
    for (int c = lane; c < C; c += warp_size) {
        float d = to_float(x[c]) - mean;
        var += d * d;
    }
    return {mean, rsqrtf(warp_sum(var) / C + layernorm_eps)};
}

__global__ void layernorm_forward_kernel(bf16* out, const bf16* inp, const float* weight, const float* bias, int N,
                                         int C) {
    const int row = blockIdx.x * warps_per_block + threadIdx.x / warp_size, lane = threadIdx.x % warp_size;
    if (row >= N) return;
    const bf16* x = inp + int64_t(row) * C;
    bf16* o = out + int64_t(row) * C;
    const RowStatistics s = row_statistics(x, C, lane);
    for (int c = lane; c < C; c += warp_size) o[c] = to_bf16((to_float(x[c]) - s.mean) * s.rstd * weight[c] + bias[c]);
}

void layernorm_forward(bf16* out, const bf16* inp, const float* weight, const float* bias, int N, int C) {
    const GpuContext& ctx = gpu::context();
    layernorm_forward_kernel<<<blocks_for(N, warps_per_block), block_threads, 0, ctx.stream>>>(out, inp, weight, bias,
                                                                                               N, C);
    check_launch("layernorm_forward");
}

// One warp per row: the row statistics into scratch, and dinp.
__global__ void layernorm_backward_input_kernel(bf16* dinp, float* scratch, const bf16* dout, const bf16* inp,
                                                const float* weight, int N, int C) {
    const int row = blockIdx.x * warps_per_block + threadIdx.x / warp_size, lane = threadIdx.x % warp_size;
    if (row >= N) return;
    const bf16* x = inp + int64_t(row) * C;
    const bf16* d = dout + int64_t(row) * C;
    bf16* dx = dinp + int64_t(row) * C;
    const RowStatistics s = row_statistics(x, C, lane);
    if (lane == 0) {
        scratch[row] = s.mean;
        scratch[N + row] = s.rstd;
    }
    float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
    for (int c = lane; c < C; c += warp_size) {
        float dnorm = weight[c] * to_float(d[c]);
        dnorm_mean += dnorm;
        dnorm_norm_mean += dnorm * (to_float(x[c]) - s.mean) * s.rstd;
    }
    dnorm_mean = warp_sum(dnorm_mean) / C;
    dnorm_norm_mean = warp_sum(dnorm_norm_mean) / C;
    for (int c = lane; c < C; c += warp_size) {
        const float norm = (to_float(x[c]) - s.mean) * s.rstd;
        dx[c] = to_bf16(to_float(dx[c]) + (weight[c] * to_float(d[c]) - dnorm_mean - norm * dnorm_norm_mean) * s.rstd);
    }
}

// A row's share of dweight and dbias: (x − mean) · rstd · dout, and dout.
struct LayerNormParameterTerm {
    const bf16 *dout, *inp;
    const float* stats;  // mean [N], then rstd [N]
    int N, C;
    __device__ void operator()(int n, int c, float* acc) const {
        const float d = to_float(dout[int64_t(n) * C + c]);
        acc[0] += (to_float(inp[int64_t(n) * C + c]) - stats[n]) * stats[N + n] * d;
        acc[1] += d;
    }
};

void layernorm_backward(bf16* dinp, float* dweight, float* dbias, const bf16* dout, const bf16* inp,
                        const float* weight, float* scratch, int N, int C) {
    const GpuContext& ctx = gpu::context();
    layernorm_backward_input_kernel<<<blocks_for(N, warps_per_block), block_threads, 0, ctx.stream>>>(
        dinp, scratch, dout, inp, weight, N, C);
    check_launch("layernorm_backward");
    add_column_sums<2>(dweight, dbias, LayerNormParameterTerm{dout, inp, scratch, N, C}, N, C,
                       "layernorm_backward parameters");
}

// ----------------------------------------------------------------------------
// gelu, tanh approximation

constexpr float gelu_scale = 0.7978845608028654f;  // sqrt(2 / pi)

__global__ void gelu_forward_kernel(bf16* out, const bf16* inp, int64_t N) {
    int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= N) return;
    const float x = to_float(inp[i]);
    out[i] = to_bf16(0.5f * x * (1.0f + tanhf(gelu_scale * (x + 0.044715f * x * x * x))));
}

void gelu_forward(bf16* out, const bf16* inp, int64_t N) {
    const GpuContext& ctx = gpu::context();
    gelu_forward_kernel<<<blocks_for(N), block_threads, 0, ctx.stream>>>(out, inp, N);
    check_launch("gelu_forward");
}

__global__ void gelu_backward_kernel(bf16* dinp, const bf16* inp, const bf16* dout, int64_t N) {
    int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= N) return;
    const float x = to_float(inp[i]);
    const float th = tanhf(gelu_scale * (x + 0.044715f * x * x * x));
    const float sech2 = 1.0f - th * th;
    const float du_dx = gelu_scale * (1.0f + 3.0f * 0.044715f * x * x);
    dinp[i] = to_bf16(to_float(dout[i]) * (0.5f * (1.0f + th) + 0.5f * x * sech2 * du_dx));
}

void gelu_backward(bf16* dinp, const bf16* inp, const bf16* dout, int64_t N) {
    const GpuContext& ctx = gpu::context();
    gelu_backward_kernel<<<blocks_for(N), block_threads, 0, ctx.stream>>>(dinp, inp, dout, N);
    check_launch("gelu_backward");
}

// ----------------------------------------------------------------------------
// dropout: element i of the box has the global index row_start(i / n2) + i % n2

__global__ void dropout_forward_kernel(bf16* out, uint8_t* mask, const bf16* inp, DropoutBox box, float p, float scale,
                                       DropoutKey key) {
    int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= box.n0 * box.n1 * box.n2) return;
    const uint64_t global = box.row_start(i / box.n2) + uint64_t(i % box.n2);
    const bool keep = dropout_uniform(key, global) >= p;
    mask[i] = keep;
    out[i] = keep ? to_bf16(to_float(inp[i]) * scale) : to_bf16(0.0f);
}

void dropout_forward(bf16* out, uint8_t* mask, const bf16* inp, const DropoutBox& box, float p, const DropoutKey& key) {
    const GpuContext& ctx = gpu::context();
    const int64_t n = box.n0 * box.n1 * box.n2;
    if (p == 0.0f) {  // as on the CPU: a copy, the mask untouched (it may be null)
        if (out != inp)
            check_cuda(cudaMemcpyAsync(out, inp, sizeof(bf16) * n, cudaMemcpyDeviceToDevice, ctx.stream),
                       "dropout_forward copy");
        return;
    }
    dropout_forward_kernel<<<blocks_for(n), block_threads, 0, ctx.stream>>>(out, mask, inp, box, p, 1.0f / (1.0f - p),
                                                                            key);
    check_launch("dropout_forward");
}

__global__ void dropout_backward_kernel(bf16* dinp, const uint8_t* mask, const bf16* dout, int64_t n, float scale) {
    int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < n) dinp[i] = mask[i] ? to_bf16(to_float(dout[i]) * scale) : to_bf16(0.0f);
}

void dropout_backward(bf16* dinp, const uint8_t* mask, const bf16* dout, int64_t n, float p) {
    const GpuContext& ctx = gpu::context();
    if (p == 0.0f) {  // no mask at p = 0
        if (dinp != dout)
            check_cuda(cudaMemcpyAsync(dinp, dout, sizeof(bf16) * n, cudaMemcpyDeviceToDevice, ctx.stream),
                       "dropout_backward copy");
        return;
    }
    dropout_backward_kernel<<<blocks_for(n), block_threads, 0, ctx.stream>>>(dinp, mask, dout, n, 1.0f / (1.0f - p));
    check_launch("dropout_backward");
}

// ----------------------------------------------------------------------------
// residual and bias

__global__ void residual_forward_kernel(bf16* out, const bf16* inp1, const bf16* inp2, int64_t N) {
    int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < N) out[i] = to_bf16(to_float(inp1[i]) + to_float(inp2[i]));
}

void residual_forward(bf16* out, const bf16* inp1, const bf16* inp2, int64_t N) {
    const GpuContext& ctx = gpu::context();
    residual_forward_kernel<<<blocks_for(N), block_threads, 0, ctx.stream>>>(out, inp1, inp2, N);
    check_launch("residual_forward");
}

__global__ void bias_forward_kernel(bf16* out, const float* bias, int N, int OC) {
    int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < int64_t(N) * OC) out[i] = to_bf16(to_float(out[i]) + bias[i % OC]);
}

void bias_forward(bf16* out, const float* bias, int N, int OC) {
    const GpuContext& ctx = gpu::context();
    bias_forward_kernel<<<blocks_for(int64_t(N) * OC), block_threads, 0, ctx.stream>>>(out, bias, N, OC);
    check_launch("bias_forward");
}

// One thread per element of [N, h]: y + bias, dropped or scaled, added to the
// residual in fp32 and rounded once; the mask bit from the same key and
// global index as dropout_forward's.
__global__ void bias_dropout_residual_kernel(bf16* out, uint8_t* mask, const bf16* y, const bf16* residual,
                                             const float* bias, DropoutBox box, float p, float scale, DropoutKey key) {
    int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= box.n0 * box.n1 * box.n2) return;
    const int64_t c = i % box.n2;
    const bool keep = p == 0.0f || dropout_uniform(key, box.row_start(i / box.n2) + uint64_t(c)) >= p;
    if (p > 0.0f) mask[i] = keep;  // none at p = 0
    const float branch = keep ? (to_float(y[i]) + bias[c]) * scale : 0.0f;
    out[i] = to_bf16(to_float(residual[i]) + branch);
}

void bias_dropout_residual_forward(bf16* out, uint8_t* mask, bf16* y, const bf16* residual, const float* bias,
                                   const DropoutBox& box, float p, const DropoutKey& key) {
    const GpuContext& ctx = gpu::context();
    const int64_t n = box.n0 * box.n1 * box.n2;
    bias_dropout_residual_kernel<<<blocks_for(n), block_threads, 0, ctx.stream>>>(out, mask, y, residual, bias, box, p,
                                                                                  1.0f / (1.0f - p), key);
    check_launch("bias_dropout_residual_forward");
}

// A row's share of a bias's gradient: its column of dout.
struct BiasTerm {
    const bf16* dout;
    int row_stride;
    __device__ void operator()(int n, int c, float* acc) const {
        acc[0] += to_float(dout[int64_t(n) * row_stride + c]);
    }
};

void bias_backward_columns(float* dbias, const bf16* dout, int N, int width, int row_stride) {
    add_column_sums<1>(dbias, nullptr, BiasTerm{dout, row_stride}, N, width, "bias_backward");
}

void bias_backward(float* dbias, const bf16* dout, int N, int OC) { bias_backward_columns(dbias, dout, N, OC, OC); }

// ----------------------------------------------------------------------------
// attention, explicit: per (batch, head) GEMMs run as strided batches over
// head-major copies of Q, K, V; softmax and dropout are one kernel.
//
// scratch layout (cuda_attention_scratch_elements), each part [B, NH, T, hs]
// unless noted: q, k, v, o (the heads' output, or in backward the output's
// gradient), dq, dk, dv, then the score gradient [B, NH, T, T].

// dst [B, NH, T, hs] = columns [offset, offset + C) of src [T, B, width], head h in columns h·hs ..
__global__ void to_head_major_kernel(bf16* dst, const bf16* src, int B, int T, int C, int NH, int width, int offset) {
    int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= int64_t(B) * T * C) return;
    const int hs = C / NH;
    const int d = int(i % hs), t = int(i / hs % T), h = int(i / hs / T % NH), b = int(i / hs / T / NH);
    dst[i] = src[(int64_t(t) * B + b) * width + offset + h * hs + d];
}

// the inverse: columns [offset, offset + C) of dst [T, B, width] = src [B, NH, T, hs]
__global__ void from_head_major_kernel(bf16* dst, const bf16* src, int B, int T, int C, int NH, int width, int offset) {
    int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= int64_t(B) * T * C) return;
    const int hs = C / NH;
    const int d = int(i % hs), t = int(i / hs % T), h = int(i / hs / T % NH), b = int(i / hs / T / NH);
    dst[(int64_t(t) * B + b) * width + offset + h * hs + d] = src[i];
}

static void to_head_major(bf16* dst, const bf16* src, int B, int T, int C, int NH, int width, int offset) {
    const GpuContext& ctx = gpu::context();
    to_head_major_kernel<<<blocks_for(int64_t(B) * T * C), block_threads, 0, ctx.stream>>>(dst, src, B, T, C, NH, width,
                                                                                           offset);
    check_launch("to_head_major");
}

static void from_head_major(bf16* dst, const bf16* src, int B, int T, int C, int NH, int width, int offset) {
    const GpuContext& ctx = gpu::context();
    from_head_major_kernel<<<blocks_for(int64_t(B) * T * C), block_threads, 0, ctx.stream>>>(dst, src, B, T, C, NH,
                                                                                             width, offset);
    check_launch("from_head_major");
}

// One warp per row (b, h, t) of scores [B·NH·T, T], which hold Q K^T · scale:
// S' = causal softmax in place (0 above the diagonal), then S = dropout(S');
// at p = 0, S is S' and neither the mask nor dropout_out is written.
// Row (b, h) of the box [B, NH, T·T] holds the T rows of one head.
__global__ void softmax_dropout_forward_kernel(bf16* softmax_out, uint8_t* mask, bf16* dropout_out, int rows, int T,
                                               float p, DropoutBox box, DropoutKey key) {
    const int row = blockIdx.x * warps_per_block + threadIdx.x / warp_size, lane = threadIdx.x % warp_size;
    if (row >= rows) return;
    const int t = row % T;
    bf16* s = softmax_out + int64_t(row) * T;
    float maxval = -INFINITY;
    for (int j = lane; j <= t; j += warp_size) maxval = fmaxf(maxval, to_float(s[j]));
    maxval = warp_max(maxval);
    float sum = 0.0f;
    for (int j = lane; j <= t; j += warp_size) sum += __expf(to_float(s[j]) - maxval);
    const float inv_sum = 1.0f / warp_sum(sum);
    const uint64_t global0 = box.row_start(row / T) + uint64_t(t) * T;
    const float keep_scale = 1.0f / (1.0f - p);
    for (int j = lane; j < T; j += warp_size) {
        const bf16 prob = j <= t ? to_bf16(__expf(to_float(s[j]) - maxval) * inv_sum) : to_bf16(0.0f);
        s[j] = prob;
        if (p > 0.0f) {
            const bool keep = dropout_uniform(key, global0 + j) >= p;
            mask[int64_t(row) * T + j] = keep;
            dropout_out[int64_t(row) * T + j] = keep ? to_bf16(to_float(prob) * keep_scale) : to_bf16(0.0f);
        }
    }
}

// In place on the score gradient [B·NH·T, T] (dS on entry): dS' = dropout
// backward of dS (dS itself where mask is null, at p = 0), then
// dD = S' ∘ (dS' − Σ_row S' ∘ dS') · scale.
__global__ void softmax_dropout_backward_kernel(bf16* dscores, const bf16* softmax_out, const uint8_t* mask, int rows,
                                                int T, float keep_scale, float score_scale) {
    const int row = blockIdx.x * warps_per_block + threadIdx.x / warp_size, lane = threadIdx.x % warp_size;
    if (row >= rows) return;
    const int t = row % T;
    bf16* ds = dscores + int64_t(row) * T;
    const bf16* sp = softmax_out + int64_t(row) * T;
    const uint8_t* m = mask ? mask + int64_t(row) * T : nullptr;
    auto dropout_grad = [&](int j) { return !m ? to_float(ds[j]) : m[j] ? to_float(ds[j]) * keep_scale : 0.0f; };
    float weighted = 0.0f;
    for (int j = lane; j <= t; j += warp_size) weighted += to_float(sp[j]) * dropout_grad(j);
    weighted = warp_sum(weighted);
    for (int j = lane; j < T; j += warp_size) {
        const float dsp = dropout_grad(j);
        ds[j] = to_bf16(to_float(sp[j]) * (dsp - weighted) * score_scale);
    }
}

// In the comments below, a row-major [r, c] matrix is the column-major [c, r]
// one that cuBLASLt sees: each GEMM is written for the transposed product.
void attention_forward(bf16* out, bf16* softmax_out, uint8_t* dropout_mask, bf16* dropout_out, const bf16* qkv,
                       bf16* scratch, int B, int T, int C, int NH, float p, const DropoutBox& box,
                       const DropoutKey& key) {
    const GpuContext& ctx = gpu::context();
    const int hs = C / NH, heads = B * NH;
    const int64_t head_elements = int64_t(B) * T * C, head_stride = int64_t(T) * hs, score_stride = int64_t(T) * T;
    bf16 *q = scratch, *k = q + head_elements, *v = k + head_elements, *o = v + head_elements;
    to_head_major(q, qkv, B, T, C, NH, 3 * C, 0);
    to_head_major(k, qkv, B, T, C, NH, 3 * C, C);
    to_head_major(v, qkv, B, T, C, NH, 3 * C, 2 * C);
    // scores [T, T] = Q K^T · scale, i.e. scores^T = K Q^T
    batched_gemm(true, false, T, T, hs, 1.0f / sqrtf(float(hs)), k, hs, head_stride, q, hs, head_stride, 0.0f,
                 softmax_out, T, score_stride, heads);
    const int rows = heads * T;
    softmax_dropout_forward_kernel<<<blocks_for(rows, warps_per_block), block_threads, 0, ctx.stream>>>(
        softmax_out, dropout_mask, dropout_out, rows, T, p, box, key);
    check_launch("softmax_dropout_forward");
    // o [T, hs] = S V, i.e. o^T = V^T S^T (S = S' at p = 0)
    const bf16* scores = p > 0.0f ? dropout_out : softmax_out;
    batched_gemm(false, false, hs, T, T, 1.0f, v, hs, head_stride, scores, T, score_stride, 0.0f, o, hs, head_stride,
                 heads);
    from_head_major(out, o, B, T, C, NH, C, 0);
}

void attention_backward(bf16* dqkv, const bf16* dout, const bf16* qkv, const bf16* softmax_out,
                        const uint8_t* dropout_mask, const bf16* dropout_out, bf16* scratch, int B, int T, int C,
                        int NH, float p) {
    const GpuContext& ctx = gpu::context();
    const int hs = C / NH, heads = B * NH;
    const int64_t head_elements = int64_t(B) * T * C, head_stride = int64_t(T) * hs, score_stride = int64_t(T) * T;
    bf16 *q = scratch, *k = q + head_elements, *v = k + head_elements, *dout_heads = v + head_elements;
    bf16 *dq = dout_heads + head_elements, *dk = dq + head_elements, *dv = dk + head_elements;
    bf16* dscores = dv + head_elements;
    to_head_major(q, qkv, B, T, C, NH, 3 * C, 0);
    to_head_major(k, qkv, B, T, C, NH, 3 * C, C);
    to_head_major(v, qkv, B, T, C, NH, 3 * C, 2 * C);
    to_head_major(dout_heads, dout, B, T, C, NH, C, 0);
    // dV [T, hs] = S^T dO, i.e. dV^T = dO^T S (S = S' at p = 0)
    const bf16* scores = p > 0.0f ? dropout_out : softmax_out;
    batched_gemm(false, true, hs, T, T, 1.0f, dout_heads, hs, head_stride, scores, T, score_stride, 0.0f, dv, hs,
                 head_stride, heads);
    // dS [T, T] = dO V^T, i.e. dS^T = V dO^T
    batched_gemm(true, false, T, T, hs, 1.0f, v, hs, head_stride, dout_heads, hs, head_stride, 0.0f, dscores, T,
                 score_stride, heads);
    const int rows = heads * T;
    softmax_dropout_backward_kernel<<<blocks_for(rows, warps_per_block), block_threads, 0, ctx.stream>>>(
        dscores, softmax_out, p > 0.0f ? dropout_mask : nullptr, rows, T, 1.0f / (1.0f - p), 1.0f / sqrtf(float(hs)));
    check_launch("softmax_dropout_backward");
    // dQ [T, hs] = dD K, i.e. dQ^T = K^T dD^T
    batched_gemm(false, false, hs, T, T, 1.0f, k, hs, head_stride, dscores, T, score_stride, 0.0f, dq, hs, head_stride,
                 heads);
    // dK [T, hs] = dD^T Q, i.e. dK^T = Q^T dD
    batched_gemm(false, true, hs, T, T, 1.0f, q, hs, head_stride, dscores, T, score_stride, 0.0f, dk, hs, head_stride,
                 heads);
    from_head_major(dqkv, dq, B, T, C, NH, 3 * C, 0);
    from_head_major(dqkv, dk, B, T, C, NH, 3 * C, C);
    from_head_major(dqkv, dv, B, T, C, NH, 3 * C, 2 * C);
}

// ----------------------------------------------------------------------------
// ring attention (context parallelism's p2p): the CPU kernels' steps
// (cpu_kernels.cpp) for one sequence b and one K|V block at a time; each
// pair of chunks is a few GEMMs batched over the NH heads of head-major
// copies of the sequence's Q, K, V (and dO), with a kernel in between.

// The scratch (cuda_ring_attention_scratch_elements), from its first
// 256-byte boundary: fp32 sums [B, NH, T, hs] (the output, then dQ) and
// dkv_sums [2, NH, T, hs] (one sequence's dK | dV); bf16 q, k, v, d
// [NH, T, hs] (one sequence); then per pair of chunks [NH, c, c]: scores (Q
// K^T, or in backward dP then dZ), probs (P, or the recomputed S'),
// dropped (the recomputed S) and the recomputed mask's bytes.
struct RingScratch {
    float *sums, *dkv_sums;
    bf16 *q, *k, *v, *d;
    bf16 *scores, *probs, *dropped;
    uint8_t* mask;
};

static RingScratch ring_scratch(const bf16* scratch, const RingAttention& ra) {
    const uintptr_t address = reinterpret_cast<uintptr_t>(scratch);
    bf16* aligned = const_cast<bf16*>(scratch) + (256 - address % 256) % 256 / sizeof(bf16);
    const int64_t tc = int64_t(ra.T) * ra.C, pair = int64_t(ra.NH) * ra.chunk * ra.chunk;
    RingScratch s;
    s.sums = reinterpret_cast<float*>(aligned);
    s.dkv_sums = s.sums + ra.B * tc;
    s.q = reinterpret_cast<bf16*>(s.dkv_sums + 2 * tc);
    s.k = s.q + tc;
    s.v = s.k + tc;
    s.d = s.v + tc;
    s.scores = s.d + tc;
    s.probs = s.scores + pair;
    s.dropped = s.probs + pair;
    s.mask = reinterpret_cast<uint8_t*>(s.dropped + pair);
    return s;
}

// Head-major copies of sequence b's rows: a [T, B, width] tensor's sequence
// b is the [T, 1, B·width] tensor that starts b·width further on.
static void sequence_to_head_major(bf16* dst, const bf16* src, int b, const RingAttention& ra, int width, int offset) {
    to_head_major(dst, src + int64_t(b) * width, 1, ra.T, ra.C, ra.NH, ra.B * width, offset);
}

// columns [offset, offset + C) of dst [T, B, width] = bf16(src [B, NH, T, hs]) (fp32)
__global__ void sums_from_head_major_kernel(bf16* dst, const float* src, int B, int T, int C, int NH, int width,
                                            int offset) {
    int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= int64_t(B) * T * C) return;
    const int hs = C / NH;
    const int d = int(i % hs), t = int(i / hs % T), h = int(i / hs / T % NH), b = int(i / hs / T / NH);
    dst[(int64_t(t) * B + b) * width + offset + h * hs + d] = to_bf16(src[i]);
}

static void sums_from_head_major(bf16* dst, const float* src, int B, int T, int C, int NH, int width, int offset) {
    const GpuContext& ctx = gpu::context();
    sums_from_head_major_kernel<<<blocks_for(int64_t(B) * T * C), block_threads, 0, ctx.stream>>>(dst, src, B, T, C, NH,
                                                                                                  width, offset);
    check_launch("sums_from_head_major");
}

// Row (b, h, t) of the [B, NH, T] statistics.
__device__ inline int64_t ring_stat(const RingAttention& ra, int b, int h, int t) {
    return (int64_t(b) * ra.NH + h) * ra.T + t;
}

// running max −∞ [rows], running sum 0 [rows]
__global__ void ring_stats_start_kernel(float* stats, int64_t rows) {
    int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < 2 * rows) stats[i] = i < rows ? -INFINITY : 0.0f;
}

// One warp per row (h, i) of a pair [NH, c, c] of scores (Q K^T · scale, row
// stride scores_ld, head stride scores_head): the online softmax. The row's
// running max and sum take the block in, its fp32 running output row in
// sums is rescaled by exp(m_old − m_new), and probs [NH, c, c] gets
// dropout(exp(scores − m_new)), 0 beyond the keys the query sees.
__global__ void ring_online_softmax_kernel(float* sums, float* stats, bf16* probs, const bf16* scores,
                                           int64_t scores_head, int scores_ld, RingAttention ra, int b, int qh, int kc,
                                           bool causal, float p, DropoutKey key) {
    const int row = blockIdx.x * warps_per_block + threadIdx.x / warp_size, lane = threadIdx.x % warp_size;
    const int c = ra.chunk, hs = ra.C / ra.NH;
    if (row >= ra.NH * c) return;
    const int h = row / c, i = row % c, valid = causal ? i + 1 : c, qc = ra.query_chunks[qh];
    const bf16* z = scores + h * scores_head + int64_t(i) * scores_ld;
    const int64_t stat = ring_stat(ra, b, h, qh * c + i);
    float* row_max = stats + stat;
    float* row_sum = stats + int64_t(ra.B) * ra.NH * ra.T + stat;
    float block_max = -INFINITY;
    for (int j = lane; j < valid; j += warp_size) block_max = fmaxf(block_max, to_float(z[j]));
    block_max = warp_max(block_max);
    const float m_old = *row_max, m_new = fmaxf(m_old, block_max);
    const float rescale = expf(m_old - m_new);  // 0 for the first block a row meets
    const float keep_scale = 1.0f / (1.0f - p);
    bf16* P = probs + (int64_t(h) * c + i) * c;
    float sum = 0.0f;
    for (int j = lane; j < c; j += warp_size) {
        float e = 0.0f;
        if (j < valid) {
            e = __expf(to_float(z[j]) - m_new);
            sum += e;
            if (p > 0.0f)
                e = dropout_uniform(key, uint64_t(ring_probs_index(ra, b, h, qc * c + i, kc * c + j))) >= p
                        ? e * keep_scale
                        : 0.0f;
        }
        P[j] = to_bf16(e);
    }
    sum = warp_sum(sum);  // (every lane has read the old max and sum above)
    float* o = sums + stat * hs;
    for (int d = lane; d < hs; d += warp_size) o[d] *= rescale;
    if (lane == 0) {
        *row_sum = *row_sum * rescale + sum;
        *row_max = m_new;
    }
}

// out [T, B, C] = sums [B, NH, T, hs] / the row's running sum
__global__ void ring_output_kernel(bf16* out, const float* sums, const float* stats, RingAttention ra) {
    int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= int64_t(ra.B) * ra.T * ra.C) return;
    const int hs = ra.C / ra.NH;
    const int d = int(i % hs), t = int(i / hs % ra.T), h = int(i / hs / ra.T % ra.NH), b = int(i / hs / ra.T / ra.NH);
    const float row_sum = stats[int64_t(ra.B) * ra.NH * ra.T + ring_stat(ra, b, h, t)];
    out[(int64_t(t) * ra.B + b) * ra.C + h * hs + d] = to_bf16(sums[i] / row_sum);
}

// lse [B, NH, T] = running max + log running sum
__global__ void ring_lse_kernel(float* lse, const float* stats, int64_t rows) {
    int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < rows) lse[i] = stats[i] + logf(stats[rows + i]);
}

// One warp per row (b, qh, h, i) of S' [B, 2, NH, c, S], which holds the
// scores of the pairs computed: S' = exp(scores − log-sum-exp) up to the
// query's own position, 0 after it; then the mask and S = dropout(S').
__global__ void ring_probabilities_kernel(bf16* softmax_out, uint8_t* mask, bf16* dropout_out, const float* stats,
                                          RingAttention ra, float p, DropoutKey key) {
    const int64_t row = int64_t(blockIdx.x) * warps_per_block + threadIdx.x / warp_size;
    const int lane = threadIdx.x % warp_size, c = ra.chunk, S = ra.S;
    if (row >= int64_t(ra.B) * 2 * ra.NH * c) return;
    const int i = int(row % c), h = int(row / c % ra.NH), qh = int(row / c / ra.NH % 2), b = int(row / c / ra.NH / 2);
    const int qc = ra.query_chunks[qh], last_key = qc * c + i;
    const int64_t stat = ring_stat(ra, b, h, qh * c + i);
    const float lse = stats[stat] + logf(stats[int64_t(ra.B) * ra.NH * ra.T + stat]);
    const float keep_scale = 1.0f / (1.0f - p);
    bf16* s = softmax_out + row * S;
    for (int j = lane; j < S; j += warp_size) {
        const bf16 prob = j <= last_key ? to_bf16(__expf(to_float(s[j]) - lse)) : to_bf16(0.0f);
        s[j] = prob;
        if (p > 0.0f) {
            const bool keep = dropout_uniform(key, uint64_t(ring_probs_index(ra, b, h, last_key, j))) >= p;
            mask[row * S + j] = keep;
            dropout_out[row * S + j] = keep ? to_bf16(to_float(prob) * keep_scale) : to_bf16(0.0f);
        }
    }
}

// One warp per row (b, h, t): stats = Σ dO·O over the row's hs channels
__global__ void ring_output_dot_kernel(float* stats, const bf16* dout, const bf16* out, RingAttention ra) {
    const int64_t row = int64_t(blockIdx.x) * warps_per_block + threadIdx.x / warp_size;
    const int lane = threadIdx.x % warp_size, hs = ra.C / ra.NH;
    if (row >= int64_t(ra.B) * ra.NH * ra.T) return;
    const int t = int(row % ra.T), h = int(row / ra.T % ra.NH), b = int(row / ra.T / ra.NH);
    const int64_t at = (int64_t(t) * ra.B + b) * ra.C + h * hs;
    float sum = 0.0f;
    for (int d = lane; d < hs; d += warp_size) sum += to_float(dout[at + d]) * to_float(out[at + d]);
    sum = warp_sum(sum);
    if (lane == 0) stats[row] = sum;
}

// Selective recomputation: one warp per row (h, i) of a pair, whose scores
// probs holds: S' = exp(scores − the row's log-sum-exp) in place (0 beyond
// the keys the query sees), the mask and S = dropout(S') drawn again.
__global__ void ring_recompute_kernel(bf16* probs, uint8_t* mask, bf16* dropped, const float* lse, RingAttention ra,
                                      int b, int qh, int kc, bool causal, float p, DropoutKey key) {
    const int row = blockIdx.x * warps_per_block + threadIdx.x / warp_size, lane = threadIdx.x % warp_size;
    const int c = ra.chunk;
    if (row >= ra.NH * c) return;
    const int h = row / c, i = row % c, valid = causal ? i + 1 : c, qc = ra.query_chunks[qh];
    const float row_lse = lse[ring_stat(ra, b, h, qh * c + i)];
    const float keep_scale = 1.0f / (1.0f - p);
    const int64_t at = int64_t(row) * c;
    for (int j = lane; j < c; j += warp_size) {
        const bf16 prob = j < valid ? to_bf16(__expf(to_float(probs[at + j]) - row_lse)) : to_bf16(0.0f);
        probs[at + j] = prob;
        if (p > 0.0f) {
            const bool keep = dropout_uniform(key, uint64_t(ring_probs_index(ra, b, h, qc * c + i, kc * c + j))) >= p;
            mask[at + j] = keep;
            dropped[at + j] = keep ? to_bf16(to_float(prob) * keep_scale) : to_bf16(0.0f);
        }
    }
}

// One warp per row (h, i) of a pair: dP [NH, c, c] (in place) becomes
// dZ = S' ∘ (dS' − Σ dO·O) · scale, dS' the dropout backward of dP (dP
// itself where mask is null). S' and the mask: row stride ld, head stride head.
__global__ void ring_score_gradient_kernel(bf16* dz, const bf16* softmax_out, const uint8_t* mask, int64_t head, int ld,
                                           const float* stats, RingAttention ra, int b, int qh, float keep_scale,
                                           float score_scale) {
    const int row = blockIdx.x * warps_per_block + threadIdx.x / warp_size, lane = threadIdx.x % warp_size;
    const int c = ra.chunk;
    if (row >= ra.NH * c) return;
    const int h = row / c, i = row % c;
    const float dot = stats[ring_stat(ra, b, h, qh * c + i)];
    bf16* g = dz + int64_t(row) * c;
    const bf16* sp = softmax_out + h * head + int64_t(i) * ld;
    const uint8_t* m = mask ? mask + h * head + int64_t(i) * ld : nullptr;
    for (int j = lane; j < c; j += warp_size) {
        const float ds = !m ? to_float(g[j]) : m[j] ? to_float(g[j]) * keep_scale : 0.0f;
        g[j] = to_bf16(to_float(sp[j]) * (ds - dot) * score_scale);
    }
}

void ring_attention_start(bf16* /*out*/, float* stats, const RingAttention& ra, bf16* scratch) {
    const GpuContext& ctx = gpu::context();
    const RingScratch s = ring_scratch(scratch, ra);
    const int64_t rows = int64_t(ra.B) * ra.NH * ra.T;
    check_cuda(cudaMemsetAsync(s.sums, 0, sizeof(float) * ra.B * ra.T * ra.C, ctx.stream), "ring attention sums");
    ring_stats_start_kernel<<<blocks_for(2 * rows), block_threads, 0, ctx.stream>>>(stats, rows);
    check_launch("ring_stats_start");
}

// In the comments below, as in attention_forward's, a GEMM is written for
// the transposed product cuBLASLt sees; each runs over the NH heads.
void ring_attention_forward_block(bf16* /*out*/, float* stats, bf16* softmax_out, const bf16* qkv, const bf16* kv,
                                  const int kv_chunks[2], const RingAttention& ra, int b, float p,
                                  const DropoutKey& key, bf16* scratch) {
    const GpuContext& ctx = gpu::context();
    const RingScratch s = ring_scratch(scratch, ra);
    const int c = ra.chunk, hs = ra.C / ra.NH;
    const int64_t head = int64_t(ra.T) * hs;  // a head's stride in the head-major copies
    sequence_to_head_major(s.q, qkv, b, ra, 3 * ra.C, 0);
    sequence_to_head_major(s.k, kv, b, ra, 2 * ra.C, 0);
    sequence_to_head_major(s.v, kv, b, ra, 2 * ra.C, ra.C);
    float* sequence_sums = s.sums + int64_t(b) * ra.NH * head;  // [NH, T, hs]
    for (int qh = 0; qh < 2; qh++) {
        for (int kh = 0; kh < 2; kh++) {
            const ChunkPair pair = chunk_pair(ra.query_chunks[qh], kv_chunks[kh]);
            if (pair == ChunkPair::none) continue;
            // the pair's scores [c, c]: in S' (row stride S), or in scratch under selective recomputation
            const int scores_ld = softmax_out ? ra.S : c;
            const int64_t scores_head = softmax_out ? int64_t(c) * ra.S : int64_t(c) * c;
            bf16* scores = softmax_out ? softmax_out + ring_scores_at(ra, b, qh, 0) + int64_t(kv_chunks[kh]) * c
                                       : s.scores;
            // scores [c, c] = Q K^T · scale, i.e. scores^T = K Q^T
            batched_gemm(true, false, c, c, hs, 1.0f / sqrtf(float(hs)), s.k + int64_t(kh) * c * hs, hs, head,
                         s.q + int64_t(qh) * c * hs, hs, head, 0.0f, scores, scores_ld, scores_head, ra.NH);
            ring_online_softmax_kernel<<<blocks_for(int64_t(ra.NH) * c, warps_per_block), block_threads, 0,
                                         ctx.stream>>>(s.sums, stats, s.probs, scores, scores_head, scores_ld, ra, b,
                                                       qh, kv_chunks[kh], pair == ChunkPair::causal, p, key);
            check_launch("ring_online_softmax");
            // sums [c, hs] += P V, i.e. sums^T = V^T P^T, fp32
            batched_gemm(false, false, hs, c, c, 1.0f, s.v + int64_t(kh) * c * hs, hs, head, s.probs, c, int64_t(c) * c,
                         1.0f, sequence_sums + int64_t(qh) * c * hs, hs, head, ra.NH);
        }
    }
}

void ring_attention_finish(bf16* out, bf16* softmax_out, uint8_t* dropout_mask, bf16* dropout_out, float* lse_out,
                           const float* stats, const RingAttention& ra, float p, const DropoutKey& key, bf16* scratch) {
    const GpuContext& ctx = gpu::context();
    const RingScratch s = ring_scratch(scratch, ra);
    const int64_t rows = int64_t(ra.B) * ra.NH * ra.T;
    ring_output_kernel<<<blocks_for(int64_t(ra.B) * ra.T * ra.C), block_threads, 0, ctx.stream>>>(out, s.sums, stats,
                                                                                                  ra);
    check_launch("ring_output");
    if (lse_out) {
        ring_lse_kernel<<<blocks_for(rows), block_threads, 0, ctx.stream>>>(lse_out, stats, rows);
        check_launch("ring_lse");
    }
    if (softmax_out) {
        ring_probabilities_kernel<<<blocks_for(rows, warps_per_block), block_threads, 0, ctx.stream>>>(
            softmax_out, dropout_mask, dropout_out, stats, ra, p, key);
        check_launch("ring_probabilities");
    }
}

void ring_attention_backward_start(float* stats, bf16* /*dqkv*/, const bf16* dout, const bf16* out,
                                   const RingAttention& ra, bf16* scratch) {
    const GpuContext& ctx = gpu::context();
    const RingScratch s = ring_scratch(scratch, ra);
    const int64_t rows = int64_t(ra.B) * ra.NH * ra.T;
    check_cuda(cudaMemsetAsync(s.sums, 0, sizeof(float) * ra.B * ra.T * ra.C, ctx.stream), "ring attention dQ");
    ring_output_dot_kernel<<<blocks_for(rows, warps_per_block), block_threads, 0, ctx.stream>>>(stats, dout, out, ra);
    check_launch("ring_output_dot");
}

void ring_attention_backward_block(bf16* /*dqkv*/, bf16* dkv, const bf16* dout, const bf16* qkv, const bf16* kv,
                                   const bf16* softmax_out, const uint8_t* dropout_mask, const bf16* dropout_out,
                                   const float* lse, const float* stats, const int kv_chunks[2],
                                   const RingAttention& ra, int b, float p, const DropoutKey& key, bf16* scratch) {
    const GpuContext& ctx = gpu::context();
    const RingScratch s = ring_scratch(scratch, ra);
    const int c = ra.chunk, hs = ra.C / ra.NH;
    const int64_t head = int64_t(ra.T) * hs, pair_head = int64_t(c) * c;
    sequence_to_head_major(s.q, qkv, b, ra, 3 * ra.C, 0);
    sequence_to_head_major(s.k, kv, b, ra, 2 * ra.C, 0);
    sequence_to_head_major(s.v, kv, b, ra, 2 * ra.C, ra.C);
    sequence_to_head_major(s.d, dout, b, ra, ra.C, 0);
    float* dq = s.sums + int64_t(b) * ra.NH * head;
    float *dk = s.dkv_sums, *dv = s.dkv_sums + ra.NH * head;
    check_cuda(cudaMemsetAsync(s.dkv_sums, 0, sizeof(float) * 2 * ra.T * ra.C, ctx.stream), "ring attention dK|dV");
    const float keep_scale = p > 0.0f ? 1.0f / (1.0f - p) : 1.0f, score_scale = 1.0f / sqrtf(float(hs));
    for (int qh = 0; qh < 2; qh++) {
        const bf16* q = s.q + int64_t(qh) * c * hs;
        const bf16* d = s.d + int64_t(qh) * c * hs;
        for (int kh = 0; kh < 2; kh++) {
            const ChunkPair pair = chunk_pair(ra.query_chunks[qh], kv_chunks[kh]);
            if (pair == ChunkPair::none) continue;
            const bf16* k = s.k + int64_t(kh) * c * hs;
            const bf16* v = s.v + int64_t(kh) * c * hs;
            // the pair's S', its mask and S: kept (row stride S), or recomputed from the
            // scores and each row's log-sum-exp (selective recomputation; row stride c)
            const int64_t at = ring_scores_at(ra, b, qh, 0) + int64_t(kv_chunks[kh]) * c;
            const int ld = softmax_out ? ra.S : c;
            const int64_t pair_stride = softmax_out ? int64_t(c) * ra.S : pair_head;
            if (!softmax_out) {
                batched_gemm(true, false, c, c, hs, score_scale, k, hs, head, q, hs, head, 0.0f, s.probs, c, pair_head,
                             ra.NH);
                ring_recompute_kernel<<<blocks_for(int64_t(ra.NH) * c, warps_per_block), block_threads, 0,
                                        ctx.stream>>>(s.probs, s.mask, s.dropped, lse, ra, b, qh, kv_chunks[kh],
                                                      pair == ChunkPair::causal, p, key);
                check_launch("ring_recompute");
            }
            const bf16* sp = softmax_out ? softmax_out + at : s.probs;
            const bf16* sd = p == 0.0f ? sp : softmax_out ? dropout_out + at : s.dropped;
            const uint8_t* mask = p == 0.0f ? nullptr : softmax_out ? dropout_mask + at : s.mask;
            // dV [c, hs] += S^T dO, i.e. dV^T += dO^T S
            batched_gemm(false, true, hs, c, c, 1.0f, d, hs, head, sd, ld, pair_stride, 1.0f, dv + int64_t(kh) * c * hs,
                         hs, head, ra.NH);
            // dP [c, c] = dO V^T, i.e. dP^T = V dO^T
            batched_gemm(true, false, c, c, hs, 1.0f, v, hs, head, d, hs, head, 0.0f, s.scores, c, pair_head, ra.NH);
            ring_score_gradient_kernel<<<blocks_for(int64_t(ra.NH) * c, warps_per_block), block_threads, 0,
                                         ctx.stream>>>(s.scores, sp, mask, pair_stride, ld, stats, ra, b, qh,
                                                       keep_scale, score_scale);
            check_launch("ring_score_gradient");
            // dQ [c, hs] += dZ K, i.e. dQ^T += K^T dZ^T
            batched_gemm(false, false, hs, c, c, 1.0f, k, hs, head, s.scores, c, pair_head, 1.0f,
                         dq + int64_t(qh) * c * hs, hs, head, ra.NH);
            // dK [c, hs] += dZ^T Q, i.e. dK^T += Q^T dZ
            batched_gemm(false, true, hs, c, c, 1.0f, q, hs, head, s.scores, c, pair_head, 1.0f,
                         dk + int64_t(kh) * c * hs, hs, head, ra.NH);
        }
    }
    // sequence b's rows of the block's part [T, B, 2C]: dK | dV
    sums_from_head_major(dkv + int64_t(b) * 2 * ra.C, dk, 1, ra.T, ra.C, ra.NH, ra.B * 2 * ra.C, 0);
    sums_from_head_major(dkv + int64_t(b) * 2 * ra.C, dv, 1, ra.T, ra.C, ra.NH, ra.B * 2 * ra.C, ra.C);
}

void ring_attention_backward_finish(bf16* dqkv, const bf16* scratch, const RingAttention& ra) {
    const RingScratch s = ring_scratch(scratch, ra);
    sums_from_head_major(dqkv, s.sums, ra.B, ra.T, ra.C, ra.NH, 3 * ra.C, 0);  // dQ
}

// ----------------------------------------------------------------------------
// cross-entropy: one block per row

__global__ void crossentropy_max_forward_kernel(float* maxes, const bf16* logits, int V_real, int Vp_local) {
    const bf16* row = logits + int64_t(blockIdx.x) * Vp_local;
    float maxval = -INFINITY;  // a rank with no real column contributes −inf
    for (int v = threadIdx.x; v < V_real; v += blockDim.x) maxval = fmaxf(maxval, to_float(row[v]));
    maxval = block_reduce(maxval, true);
    if (threadIdx.x == 0) maxes[blockIdx.x] = maxval;
}

void crossentropy_max_forward(float* maxes, const bf16* logits, int N, int V_real, int Vp_local) {
    const GpuContext& ctx = gpu::context();
    crossentropy_max_forward_kernel<<<N, block_threads, 0, ctx.stream>>>(maxes, logits, V_real, Vp_local);
    check_launch("crossentropy_max_forward");
}

__global__ void crossentropy_sum_forward_kernel(float* stats, const bf16* logits, const float* maxes,
                                                const int* targets, int vocab_start, int N, int V_real, int Vp_local) {
    const int n = blockIdx.x;
    const bf16* row = logits + int64_t(n) * Vp_local;
    const float maxval = maxes[n];
    float sum = 0.0f;
    for (int v = threadIdx.x; v < V_real; v += blockDim.x) sum += __expf(to_float(row[v]) - maxval);
    sum = block_reduce(sum, false);
    if (threadIdx.x == 0) {
        const int column = targets[n] - vocab_start;
        stats[n] = sum;
        stats[N + n] = column >= 0 && column < V_real ? to_float(row[column]) : 0.0f;
    }
}

void crossentropy_sum_forward(float* stats, const bf16* logits, const float* maxes, const int* targets, int vocab_start,
                              int N, int V_real, int Vp_local) {
    const GpuContext& ctx = gpu::context();
    crossentropy_sum_forward_kernel<<<N, block_threads, 0, ctx.stream>>>(stats, logits, maxes, targets, vocab_start, N,
                                                                         V_real, Vp_local);
    check_launch("crossentropy_sum_forward");
}

__global__ void crossentropy_loss_forward_kernel(float* losses, float* lse, const float* maxes, const float* stats,
                                                 int N) {
    const int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N) return;
    lse[n] = maxes[n] + logf(stats[n]);
    losses[n] = lse[n] - stats[N + n];
}

void crossentropy_loss_forward(float* losses, float* lse, const float* maxes, const float* stats, int N) {
    const GpuContext& ctx = gpu::context();
    crossentropy_loss_forward_kernel<<<blocks_for(N), block_threads, 0, ctx.stream>>>(losses, lse, maxes, stats, N);
    check_launch("crossentropy_loss_forward");
}

__global__ void crossentropy_backward_kernel(bf16* logits, const float* lse, const int* targets, int vocab_start,
                                             float dloss, int V_real, int Vp_local) {
    const int n = blockIdx.x;
    bf16* row = logits + int64_t(n) * Vp_local;
    const float l = lse[n];
    const int column = targets[n] - vocab_start;
    for (int v = threadIdx.x; v < Vp_local; v += blockDim.x) {
        float grad = 0.0f;  // the padded columns
        if (v < V_real) grad = dloss * (__expf(to_float(row[v]) - l) - (v == column ? 1.0f : 0.0f));
        row[v] = to_bf16(grad);
    }
}

void crossentropy_backward(bf16* logits, const float* lse, const int* targets, int vocab_start, float dloss, int N,
                           int V_real, int Vp_local) {
    const GpuContext& ctx = gpu::context();
    crossentropy_backward_kernel<<<N, block_threads, 0, ctx.stream>>>(logits, lse, targets, vocab_start, dloss, V_real,
                                                                      Vp_local);
    check_launch("crossentropy_backward");
}

}  // namespace tpsp
