#include "model/kernels/cuda_device.h"

namespace tpsp::gpu {

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
}

GpuRuntime::~GpuRuntime() {
    cudaStreamSynchronize(context_.stream);
    cudaFree(context_.blas_workspace);
    cublasLtDestroy(context_.blas);
    cudaStreamDestroy(context_.stream);
}

void GpuRuntime::synchronize() const { check_cuda(cudaStreamSynchronize(context_.stream), "kernel"); }

}  // namespace tpsp::gpu
