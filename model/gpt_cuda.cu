// The CUDA model: gpt_model.h instantiated on CudaBackend, and the backend's
// memory operations.
#include <stdexcept>
#include <string>
#include <vector>

#include "model/cuda_backend.h"
#include "model/gpt_model.h"

namespace tpsp {

using gpu::check_cuda;

// The GPU of a local rank, or one line saying why there is none.
static int checked_device(int local_rank) {
    const int count = gpu::cuda_device_count();
    if (count == 0) throw std::runtime_error("train.device=cuda: no CUDA device is visible to this process");
    if (local_rank >= count)
        throw std::runtime_error("train.device=cuda: local rank " + std::to_string(local_rank) + " has no GPU (" +
                                 std::to_string(count) + " visible): launch at most one rank per GPU");
    return local_rank;
}

static void* device_allocate(size_t bytes) {
    void* data = nullptr;
    check_cuda(cudaMalloc(&data, bytes ? bytes : 1), "cudaMalloc");
    check_cuda(cudaMemset(data, 0, bytes), "cudaMemset");
    return data;
}

static void device_release(void* data) { cudaFree(data); }

const Memory& CudaBackend::memory() {
    static const Memory device = {device_allocate, device_release};
    return device;
}

void CudaBackend::copy(void* dst, const void* src, size_t bytes) {
    check_cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, gpu::context().stream), "copy");
}

void CudaBackend::upload(void* dst, const void* host, size_t bytes) {
    // from pageable memory: returns once the host buffer has been read
    check_cuda(cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, gpu::context().stream), "upload");
}

void CudaBackend::download(void* host, const void* src, size_t bytes) {
    check_cuda(cudaMemcpyAsync(host, src, bytes, cudaMemcpyDeviceToHost, gpu::context().stream), "download");
    check_cuda(cudaStreamSynchronize(gpu::context().stream), "download");
}

__global__ void add_kernel(float* acc, const float* x, int64_t n) {
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < n) acc[i] += x[i];
}

void CudaBackend::add(float* acc, const float* x, int64_t n) {
    if (n == 0) return;
    add_kernel<<<unsigned((n + 255) / 256), 256, 0, gpu::context().stream>>>(acc, x, n);
    gpu::check_launch("add");
}

void CudaBackend::zero(void* data, size_t bytes) {
    check_cuda(cudaMemsetAsync(data, 0, bytes, gpu::context().stream), "zero");
}

// grid (blocks per range, ranges): a block sums x² over its stride of one
// range, in double, into partials [range, block]; the host adds the partials
// in order (no atomics: the same bits every run)
constexpr int square_sum_threads = 256, square_sum_blocks_per_range = 64;

__global__ void square_sums_kernel(double* partials, const float* x, const SquareSumRange* ranges) {
    __shared__ double partial[square_sum_threads];
    const SquareSumRange range = ranges[blockIdx.y];
    const float* data = x + range.begin;
    double local = 0.0;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < range.count;
         i += int64_t(gridDim.x) * blockDim.x)
        local += double(data[i]) * data[i];
    partial[threadIdx.x] = local;
    __syncthreads();
    for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
        if (int(threadIdx.x) < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
        __syncthreads();
    }
    if (threadIdx.x == 0) partials[size_t(blockIdx.y) * gridDim.x + blockIdx.x] = partial[0];
}

void CudaBackend::square_sums(const float* x, const std::vector<SquareSumRange>& ranges, double sums[2]) {
    sums[0] = sums[1] = 0.0;
    if (ranges.empty()) return;
    // device scratch: the partials, then the range table; grows, never shrinks;
    // one per thread, as the stream it is used on
    thread_local void* scratch = nullptr;
    thread_local size_t scratch_bytes = 0;
    thread_local std::vector<double> partials;
    partials.resize(ranges.size() * square_sum_blocks_per_range);
    const size_t needed = partials.size() * sizeof(double) + ranges.size() * sizeof(SquareSumRange);
    if (needed > scratch_bytes) {
        device_release(scratch);
        scratch = device_allocate(needed);
        scratch_bytes = needed;
    }
    double* device_partials = static_cast<double*>(scratch);
    SquareSumRange* device_ranges = reinterpret_cast<SquareSumRange*>(device_partials + partials.size());
    upload(device_ranges, ranges.data(), ranges.size() * sizeof(SquareSumRange));
    const dim3 grid(square_sum_blocks_per_range, unsigned(ranges.size()));
    square_sums_kernel<<<grid, square_sum_threads, 0, gpu::context().stream>>>(device_partials, x, device_ranges);
    gpu::check_launch("square_sums");
    download(partials.data(), device_partials, partials.size() * sizeof(double));
    for (size_t r = 0; r < ranges.size(); r++)
        for (int b = 0; b < square_sum_blocks_per_range; b++)
            sums[ranges[r].sum] += partials[r * square_sum_blocks_per_range + size_t(b)];
}

Dim CudaBackend::attention_scratch(int64_t b, int64_t s, int64_t h, int64_t a, int64_t t) {
    return cuda_attention_scratch(b, s, h, a, t);
}

float CudaBackend::mean_loss(const float* losses, int N) {
    // grows once; the step loop allocates nothing after the first step; one per rank thread
    thread_local std::vector<float> host;
    if (host.size() < size_t(N)) host.resize(size_t(N));
    download(host.data(), losses, sizeof(float) * N);
    double sum = 0.0;
    for (int i = 0; i < N; i++) sum += host[i];
    return float(sum / N);
}

CudaBackend::Runtime::Runtime(int local_rank) : gpu::GpuRuntime(checked_device(local_rank)) {}

int CudaBackend::device_count() { return gpu::cuda_device_count(); }

std::vector<std::string> CudaBackend::library_versions() {
    std::vector<std::string> lines = gpu::cuda_versions();
#ifdef TPSP_WITH_CUDNN
    lines.insert(lines.begin() + 3, cudnn_version());  // after the driver, the runtime and cuBLASLt
#else
    lines.insert(lines.begin() + 3, "cuDNN: not built in (-DTPSP_CUDNN=OFF, or not found)");
#endif
    lines.insert(lines.begin() + 4, NcclCommunicator::library_version());
    return lines;
}

std::unique_ptr<NcclCommunicator> CudaBackend::make_group(MPI_Comm comm) {
    return std::make_unique<NcclCommunicator>(comm, gpu::context().stream);
}

__global__ void adamw_kernel(float* params, const float* grads, float* m, float* v, int64_t n, float weight_decay,
                             AdamWStep s) {
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float g = grads[i] * s.grad_scale;
    m[i] = s.beta1 * m[i] + (1.0f - s.beta1) * g;
    v[i] = s.beta2 * v[i] + (1.0f - s.beta2) * g * g;
    const float m_hat = m[i] / s.correction1, v_hat = v[i] / s.correction2;
    params[i] -= s.lr * (m_hat / (sqrtf(v_hat) + s.eps) + weight_decay * params[i]);
}

void CudaBackend::adamw_update(float* params, const float* grads, float* m, float* v, int64_t n, float weight_decay,
                               const AdamWStep& step) {
    if (n == 0) return;
    constexpr int threads = 256;
    adamw_kernel<<<unsigned((n + threads - 1) / threads), threads, 0, gpu::context().stream>>>(params, grads, m, v, n,
                                                                                               weight_decay, step);
    gpu::check_launch("adamw_update");
}

void CudaBackend::synchronize() { check_cuda(cudaStreamSynchronize(gpu::context().stream), "synchronize"); }

double CudaBackend::peak_flops() {
    int device = 0;
    check_cuda(cudaGetDevice(&device), "cudaGetDevice");
    cudaDeviceProp props{};
    check_cuda(cudaGetDeviceProperties(&props, device), "cudaGetDeviceProperties");
    const std::string name = props.name;
    // H100 and H200 SXM: 989.4 TFLOP/s dense bf16 (NVIDIA's datasheet)
    if (name.find("H100") != std::string::npos || name.find("H200") != std::string::npos) return 989.4e12;
    // elsewhere an estimate: tensor-core FLOP per clock per SM × SMs × clock
    int clock_khz = 0;
    cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, device);
    const double per_sm_per_clock = props.major >= 9 ? 4096 : props.major == 8 ? 2048 : 1024;
    return per_sm_per_clock * props.multiProcessorCount * clock_khz * 1e3;
}

template class GPTModel<CudaBackend>;
template class GPTModel<CudaThreadGroupBackend>;

}  // namespace tpsp
