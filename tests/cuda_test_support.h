// What the GPU tests share: the tiny config's model, downloads, and a fixture
// that skips where no GPU is visible and otherwise holds this thread's GPU.
#pragma once
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "model/cuda_backend.h"
#include "model/gpt_config.h"
#include "model/kernels/cuda_device.h"

namespace tpsp::testing {

// configs/tiny.yaml's model, on a shorter batch
inline GPTConfig tiny_gpu_config() {
    GPTConfig c;
    c.num_layers = 4, c.num_heads = 4, c.channels = 128, c.vocab_size = 256, c.padded_vocab_size = 256;
    c.max_seq_len = 128;
    return c;
}

inline std::vector<float> download_floats(const float* device, int64_t n) {
    std::vector<float> host(static_cast<size_t>(n));
    CudaBackend::download(host.data(), device, sizeof(float) * n);
    return host;
}

inline std::vector<uint8_t> download_bytes(const uint8_t* device, int64_t n) {
    std::vector<uint8_t> host(static_cast<size_t>(n));
    CudaBackend::download(host.data(), device, size_t(n));
    return host;
}

// A test of the GPU: skipped without one; else GPU 0 is this thread's.
class GpuTest : public ::testing::Test {
protected:
    void SetUp() override {
        if (gpu::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
        runtime_ = std::make_unique<gpu::GpuRuntime>(0);
    }

private:
    std::unique_ptr<gpu::GpuRuntime> runtime_;
};

}  // namespace tpsp::testing
