#include "model/kernels/cuda_device.h"

#include <stdexcept>
#include <string>

namespace tpsp::gpu {

void check_cuda(cudaError_t status, const char* what) {
    if (status != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(status));
}

void check_cublas(cublasStatus_t status, const char* what) {
    if (status != CUBLAS_STATUS_SUCCESS)
        throw std::runtime_error(std::string(what) + ": cuBLAS status " + std::to_string(int(status)));
}

void check_launch(const char* kernel) { check_cuda(cudaGetLastError(), kernel); }

static const GpuContext* current_context = nullptr;

const GpuContext& context() {
    if (!current_context) throw std::logic_error("a CUDA kernel was called with no GpuRuntime alive");
    return *current_context;
}

void set_context(const GpuContext* context) { current_context = context; }

int cuda_device_count() {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
        cudaGetLastError();  // clear the sticky error the failed query left
        return 0;
    }
    return count;
}

constexpr size_t blas_workspace_bytes = size_t(32) << 20;

GpuRuntime::GpuRuntime(int device) {
    check_cuda(cudaSetDevice(device), "cudaSetDevice");
    // a blocking stream: it waits for, and is waited for by, the legacy
    // default stream that cudaMemcpy and cudaMemset use
    check_cuda(cudaStreamCreate(&context_.stream), "cudaStreamCreate");
    check_cublas(cublasLtCreate(&context_.blas), "cublasLtCreate");
    check_cuda(cudaMalloc(&context_.blas_workspace, blas_workspace_bytes), "cuBLASLt workspace");
    context_.blas_workspace_bytes = blas_workspace_bytes;
    set_context(&context_);
}

GpuRuntime::~GpuRuntime() {
    set_context(nullptr);
    cudaStreamSynchronize(context_.stream);
    cudaFree(context_.blas_workspace);
    cublasLtDestroy(context_.blas);
    cudaStreamDestroy(context_.stream);
}

void GpuRuntime::synchronize() const { check_cuda(cudaStreamSynchronize(context_.stream), "kernel"); }

}  // namespace tpsp::gpu
