#include "model/kernels/cuda_device.h"

#include <cstdio>
#include <stdexcept>
#include <string>

#include "common/loaded_library.h"

namespace tpsp::gpu {

void check_cuda(cudaError_t status, const char* what) {
    if (status != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(status));
}

void check_cublas(cublasStatus_t status, const char* what) {
    if (status != CUBLAS_STATUS_SUCCESS)
        throw std::runtime_error(std::string(what) + ": cuBLAS status " + std::to_string(int(status)));
}

void check_launch(const char* kernel) { check_cuda(cudaGetLastError(), kernel); }

// One per thread: the ranks of the one-GPU stand-in (parallel/cuda_thread_group.h)
// are threads of one process, each with its own stream and cuBLASLt handle.
thread_local const GpuContext* current_context = nullptr;

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

// CUDA's 13020 → "13.2"
static std::string cuda_version_text(int version) {
    return std::to_string(version / 1000) + "." + std::to_string(version % 1000 / 10);
}

static std::string from_file(const char* symbol, const char* library = nullptr) {
    const std::string file = library_file_of(symbol, library);
    return file.empty() ? "" : " (" + file + ")";
}

std::vector<std::string> cuda_versions() {
    std::vector<std::string> lines;
    int driver = 0, runtime = 0;
    const bool have_driver = cudaDriverGetVersion(&driver) == cudaSuccess && driver > 0;
    lines.push_back("CUDA driver: " + (have_driver
                                           ? cuda_version_text(driver) + from_file("cuDriverGetVersion", "libcuda.so.1")
                                           : std::string("none loaded")));
    cudaRuntimeGetVersion(&runtime);
    lines.push_back("CUDA runtime: " + cuda_version_text(runtime) + from_file("cudaRuntimeGetVersion") +
                    ", compiled against " + cuda_version_text(CUDART_VERSION));
    const size_t blas = cublasLtGetVersion();  // major·10000 + minor·100 + patch
    lines.push_back("cuBLASLt: " + std::to_string(blas / 10000) + "." + std::to_string(blas / 100 % 100) + "." +
                    std::to_string(blas % 100) + from_file("cublasLtGetVersion"));
    int count = 0;
    const cudaError_t status = cudaGetDeviceCount(&count);
    if (status != cudaSuccess) {
        lines.push_back(std::string("GPUs: none (") + cudaGetErrorString(status) + ")");
        cudaGetLastError();
        return lines;
    }
    for (int device = 0; device < count; device++) {
        cudaDeviceProp p{};
        if (cudaGetDeviceProperties(&p, device) != cudaSuccess) continue;
        char line[512];
        std::snprintf(line, sizeof line, "GPU %d: %s, sm_%d%d, %.1f GiB, %d SMs", device, p.name, p.major, p.minor,
                      double(p.totalGlobalMem) / double(1 << 30), p.multiProcessorCount);
        lines.push_back(line);
    }
    return lines;
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
