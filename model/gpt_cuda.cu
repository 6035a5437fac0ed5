// The CUDA model: gpt_model.h instantiated on CudaBackend, and the backend's
// memory operations. cuda_kernels.h comes first so that the model templates
// see the bf16 kernel overloads (gpt_model.h).
#include "model/kernels/cuda_kernels.h"

#include "model/cuda_backend.h"
#include "model/gpt_model.h"

#include <vector>

namespace tpsp {

using gpu::check_cuda;

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

void CudaBackend::zero(void* data, size_t bytes) {
    check_cuda(cudaMemsetAsync(data, 0, bytes, gpu::context().stream), "zero");
}

// one block per 64 Ki elements, each adding its share in double
__global__ void square_sum_kernel(double* sum, const float* x, int64_t n) {
    __shared__ double partial[256];
    double local = 0.0;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
        local += double(x[i]) * x[i];
    partial[threadIdx.x] = local;
    __syncthreads();
    for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
        if (int(threadIdx.x) < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
        __syncthreads();
    }
    if (threadIdx.x == 0) atomicAdd(sum, partial[0]);
}

double CudaBackend::square_sum(const float* x, int64_t n) {
    static double* device_sum = static_cast<double*>(device_allocate(sizeof(double)));
    const cudaStream_t stream = gpu::context().stream;
    check_cuda(cudaMemsetAsync(device_sum, 0, sizeof(double), stream), "square_sum");
    const int64_t blocks = std::min<int64_t>(1024, (n + 65535) / 65536 + 1);
    square_sum_kernel<<<unsigned(blocks), 256, 0, stream>>>(device_sum, x, n);
    gpu::check_launch("square_sum");
    double sum = 0.0;
    download(&sum, device_sum, sizeof sum);
    return sum;
}

Dim CudaBackend::attention_scratch(int64_t b, int64_t s, int64_t h, int64_t a, int64_t t) {
    return cuda_attention_scratch(b, s, h, a, t);
}

float CudaBackend::mean_loss(const float* losses, int N) {
    static std::vector<float> host;  // grows once; the step loop allocates nothing after the first step
    if (host.size() < size_t(N)) host.resize(size_t(N));
    download(host.data(), losses, sizeof(float) * N);
    double sum = 0.0;
    for (int i = 0; i < N; i++) sum += host[i];
    return float(sum / N);
}

template class GPTModel<CudaBackend>;

}  // namespace tpsp
