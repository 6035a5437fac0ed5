// Finding a GPU, and the things the CUDA kernels run on: a stream, a
// cuBLASLt handle with its workspace, and device buffers.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include "model/kernels/cuda_kernels.h"

namespace tpsp::gpu {

// How many GPUs this process can use: 0 without a driver or a device
// (cudaGetDeviceCount then fails and leaves its argument unset).
int cuda_device_count();

// The CUDA driver, runtime and cuBLASLt that this process loaded, each with
// the file it came from and the version the build was compiled against, then
// each visible GPU (or why there is none): one line each, for `tpsp versions`.
std::vector<std::string> cuda_versions();

// One GPU made current for this thread, with its own stream, cuBLASLt
// handle and 32 MiB of cuBLASLt workspace.
class GpuRuntime {
public:
    explicit GpuRuntime(int device);
    GpuRuntime(const GpuRuntime&) = delete;
    GpuRuntime& operator=(const GpuRuntime&) = delete;
    ~GpuRuntime();
    const GpuContext& context() const { return context_; }
    void synchronize() const;  // waits for the stream, and throws if a kernel failed

private:
    GpuContext context_;
};

// n elements of T in device memory, zero-filled.
template <class T>
class DeviceBuffer {
public:
    explicit DeviceBuffer(size_t n) : size_(n) {
        check_cuda(cudaMalloc(&data_, sizeof(T) * (n ? n : 1)), "cudaMalloc");
        check_cuda(cudaMemset(data_, 0, sizeof(T) * n), "cudaMemset");
    }
    explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) { upload(host); }
    DeviceBuffer(const DeviceBuffer&) = delete;
    DeviceBuffer& operator=(const DeviceBuffer&) = delete;
    ~DeviceBuffer() { cudaFree(data_); }
    T* data() const { return data_; }
    size_t size() const { return size_; }
    void upload(const std::vector<T>& host) {
        check_cuda(cudaMemcpy(data_, host.data(), sizeof(T) * size_, cudaMemcpyHostToDevice), "upload");
    }
    std::vector<T> download() const {
        std::vector<T> host(size_);
        check_cuda(cudaMemcpy(host.data(), data_, sizeof(T) * size_, cudaMemcpyDeviceToHost), "download");
        return host;
    }

private:
    T* data_ = nullptr;
    size_t size_;
};

}  // namespace tpsp::gpu
