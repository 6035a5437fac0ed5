// The GPT model's backend on a GPU (see backend.h for the list): bf16
// activations in device memory, the kernels of cuda_kernels.h, NCCL.
// Parameters, gradients and AdamW state stay fp32; the GEMMs read bf16
// copies of the weights, refreshed at every forward.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/gpt.h"
#include "model/kernels/cuda_device.h"
#include "model/kernels/cuda_kernels.h"
#ifdef TPSP_WITH_CUDNN
#include "model/kernels/cudnn_attention.h"
#endif
#include "model/tensor_table.h"
#include "parallel/cuda_thread_group.h"
#include "parallel/nccl_communicator.h"

namespace tpsp {

struct CudaBackend {
    using Act = bf16;  // e = 2
    using Comm = NcclCommunicator;
    // the GPU of this rank's local rank, its stream and cuBLASLt handle
    struct Runtime : gpu::GpuRuntime {
        explicit Runtime(int local_rank);  // throws, in one line, when there is no such GPU
    };
    static constexpr const char* name = "cuda";
    // GPUs this process can use: 0 without a driver or a device
    static int device_count();
    // the communicator of an MPI group, on this rank's GPU (its Runtime must be alive)
    static std::unique_ptr<Comm> make_group(MPI_Comm comm);
    static constexpr bool copies_gemm_weights = true;
#ifdef TPSP_WITH_CUDNN
    static constexpr bool has_fused_attention = true;  // model.attention: cudnn
#else
    static constexpr bool has_fused_attention = false;  // built without cuDNN
#endif

    static const Memory& memory();  // cudaMalloc, zero-filled
    static void copy(void* dst, const void* src, size_t bytes);
    static void upload(void* dst, const void* host, size_t bytes);
    static void download(void* host, const void* src, size_t bytes);  // waits for the stream
    static void zero(void* data, size_t bytes);
    static void add(float* acc, const float* x, int64_t n);  // acc += x
    // one kernel over all ranges, and one wait for the two sums
    static void square_sums(const float* x, const std::vector<SquareSumRange>& ranges, double sums[2]);
    static void cast(bf16* out, const float* inp, int64_t n) { cast_to_bf16(out, inp, n); }

    static Dim attention_scratch(int64_t b, int64_t s, int64_t h, int64_t a, int64_t t);
    static Dim ring_attention_scratch(int64_t b, int64_t s, int64_t h, int64_t a, int64_t t) {
        return cuda_ring_attention_scratch(b, s, h, a, t);
    }
    static void finish_losses(float* losses, float* lse, const float* maxes, const float* stats, int N) {
        crossentropy_loss_forward(losses, lse, maxes, stats, N);
    }
    static float mean_loss(const float* losses, int N);

    static void adamw_update(float* params, const float* grads, float* m, float* v, int64_t n, float weight_decay,
                             const AdamWStep& step);
    static void synchronize();
    // dense bf16 tensor-core FLOP/s of this GPU (the datasheet's figure where known)
    static double peak_flops();
    static const char* peak_flops_name() { return "bf16 peak"; }
    static std::string kernels() { return "cuBLASLt and tpsp's CUDA kernels"; }
    // the driver, CUDA runtime, cuBLASLt, cuDNN and NCCL that loaded (with
    // their files), then each GPU: one line each (`tpsp versions`)
    static std::vector<std::string> library_versions();
};

static_assert(ModelBackend<CudaBackend>);

// The CUDA backend with a tensor-parallel group of threads on one GPU
// (parallel/cuda_thread_group.h): t ranks in one process, each thread with its
// own GpuRuntime; how one GPU proves TP+SP against t = 1.
struct CudaThreadGroupBackend : CudaBackend {
    using Comm = CudaThreadCommunicator;
};
static_assert(ModelBackend<CudaThreadGroupBackend>);

extern template class GPTModel<CudaBackend>;
extern template class GPTModel<CudaThreadGroupBackend>;

}  // namespace tpsp
