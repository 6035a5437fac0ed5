// The GPT model's backend on a GPU (see backend.h for the list): bf16
// activations in device memory, the kernels of cuda_kernels.h, NCCL.
// Parameters, gradients and AdamW state stay fp32; the GEMMs read bf16
// copies of the weights, refreshed at every forward.
#pragma once
#include <cstddef>
#include <cstdint>

#include "model/kernels/cuda_kernels.h"

#include "model/gpt.h"
#include "model/kernels/cuda_device.h"
#ifdef TPSP_WITH_CUDNN
#include "model/kernels/cudnn_attention.h"
#endif
#include "model/tensor_table.h"
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
    // one kernel over all ranges, and one wait for the two sums
    static void square_sums(const float* x, const std::vector<SquareSumRange>& ranges, double sums[2]);
    static void cast(bf16* out, const float* inp, int64_t n) { cast_to_bf16(out, inp, n); }

    static Dim attention_scratch(int64_t b, int64_t s, int64_t h, int64_t a, int64_t t);
    static void attention_forward(bf16* out, bf16* softmax_out, uint8_t* dropout_mask, bf16* dropout_out,
                                  const bf16* qkv, bf16* scratch, int B, int T, int C, int NH, float p,
                                  const DropoutBox& box, const DropoutKey& key) {
        tpsp::attention_forward(out, softmax_out, dropout_mask, dropout_out, qkv, scratch, B, T, C, NH, p, box, key);
    }
    static void attention_backward(bf16* dqkv, const bf16* dout, const bf16* qkv, const bf16* softmax_out,
                                   const uint8_t* dropout_mask, const bf16* dropout_out, bf16* scratch, int B,
                                   int T, int C, int NH, float p) {
        tpsp::attention_backward(dqkv, dout, qkv, softmax_out, dropout_mask, dropout_out, scratch, B, T, C, NH, p);
    }
#ifdef TPSP_WITH_CUDNN
    // cuDNN's fused attention (cudnn_attention.h): saves only stats [B, NH, T]
    static void fused_attention_forward(bf16* out, float* stats, const bf16* qkv, int B, int T, int C, int NH,
                                        float p, uint64_t seed) {
        tpsp::fused_attention_forward(out, stats, qkv, B, T, C, NH, p, seed);
    }
    static void fused_attention_backward(bf16* dqkv, const bf16* dout, const bf16* qkv, const bf16* out,
                                         const float* stats, int B, int T, int C, int NH, float p, uint64_t seed) {
        tpsp::fused_attention_backward(dqkv, dout, qkv, out, stats, B, T, C, NH, p, seed);
    }
#endif
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
};

extern template class GPTModel<CudaBackend>;

}  // namespace tpsp
