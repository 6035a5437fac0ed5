// The CUDA kernels of GPT-2: the same forward/backward pairs as
// cpu_kernels.h, on device pointers, with bf16 activations and fp32
// parameters, gradients and statistics (docs/design.md §2 with e = 2).
//
// Conventions, on top of cpu_kernels.h's:
//   - activations (`bf16*`) are [T, B, C] sequence-major, as on the CPU;
//     parameters and their gradients are fp32 except where a GEMM reads a
//     weight or a bias: those take the bf16 copy the model keeps of them.
//   - math inside a kernel is fp32; a bf16 value is rounded once, when stored.
//   - every function enqueues its work on the current context's stream
//     (gpu::context(), set by a GpuRuntime) and returns at once; the
//     signatures are the CPU kernels' with bf16 in place of fp32
//     activations, so the model code calls either through overloading.
//   - parameter gradients ACCUMULATE, as on the CPU; so does layernorm's dinp.
//   - dropout draws its bits from dropout_rng.h: a GPU mask is bit-identical
//     to the CPU's for the same key and box.
#pragma once
#include <cstddef>
#include <cstdint>

#include <cublasLt.h>
#include <cuda_runtime.h>

#include "common/bf16.h"
#include "model/kernels/attention_scratch.h"
#include "model/kernels/dropout_rng.h"
#include "model/kernels/ring_attention.h"

namespace tpsp::gpu {

// Where kernels run: one stream, and cuBLASLt with its workspace.
struct GpuContext {
    cudaStream_t stream = nullptr;
    cublasLtHandle_t blas = nullptr;
    void* blas_workspace = nullptr;
    size_t blas_workspace_bytes = 0;
};

// The context the kernels below enqueue on: llm.c's global stream and
// cuBLASLt handle, but one per thread, so that the t rank threads of the
// one-GPU stand-in each enqueue on their own; GpuRuntime sets it.
const GpuContext& context();
void set_context(const GpuContext* context);

// Throws std::runtime_error naming `what` when a CUDA or cuBLAS call failed.
void check_cuda(cudaError_t status, const char* what);
void check_cublas(cublasStatus_t status, const char* what);
// Throws when a kernel launch just enqueued on this thread failed.
void check_launch(const char* kernel);

// D_i = alpha · op(A_i) op(B_i) + beta · D_i for i < batch, column-major,
// bf16 in and out, fp32 accumulation (cuda_gemm.cu); attention's GEMMs.
void batched_gemm(bool transa, bool transb, int m, int n, int k, float alpha, const bf16* A, int lda, int64_t strideA,
                  const bf16* B, int ldb, int64_t strideB, float beta, bf16* D, int ldd, int64_t strideD, int batch);
// The same with an fp32 D, which beta = 1 accumulates into unrounded: ring attention's running sums.
void batched_gemm(bool transa, bool transb, int m, int n, int k, float alpha, const bf16* A, int lda, int64_t strideA,
                  const bf16* B, int ldb, int64_t strideB, float beta, float* D, int ldd, int64_t strideD, int batch);

}  // namespace tpsp::gpu

namespace tpsp {

// out [n] = bf16(inp [n]): the GEMMs' copies of the fp32 master weights.
void cast_to_bf16(bf16* out, const float* inp, int64_t n);

// out [T, B, C] = wte[inp] for tokens in [vocab_start, vocab_start + V_local), else 0.
// inp [B, T] token ids, in the data's order; wte [V_local, C].
void token_embedding_forward(bf16* out, const int* inp, const float* wte, int vocab_start, int V_local, int B, int T,
                             int C);
// dwte [V_local, C] accumulates (atomically: rows of repeated tokens add up);  dout [T, B, C]
void token_embedding_backward(float* dwte, const bf16* dout, const int* inp, int vocab_start, int V_local, int B, int T,
                              int C);
// out [T_local, B, C] += wpe[pos_start + t]
void position_embedding_forward(bf16* out, const float* wpe, int pos_start, int T_local, int B, int C);
// dwpe [maxT, C] accumulates rows pos_start ..;  dout [T_local, B, C]
void position_embedding_backward(float* dwpe, const bf16* dout, int pos_start, int T_local, int B, int C);

// out [N, C] = (inp − mean) · rstd · weight + bias per row; mean and rstd are not kept.
void layernorm_forward(bf16* out, const bf16* inp, const float* weight, const float* bias, int N, int C);
// dinp [N, C] ACCUMULATES; the row statistics are recomputed from inp into scratch [2N].
void layernorm_backward(bf16* dinp, float* dweight, float* dbias, const bf16* dout, const bf16* inp,
                        const float* weight, float* scratch, int N, int C);

// GEMMs through cuBLASLt, fp32 accumulation (cuda_gemm.cu).
// out [N, OC] = inp [N, C] @ weight [OC, C]^T + bias [OC]  (bias may be null: a bias epilogue otherwise)
void matmul_forward(bf16* out, const bf16* inp, const bf16* weight, const bf16* bias, int N, int C, int OC);
// fc1 and its GELU in one GEMM (cuBLASLt's GELU_AUX_BIAS epilogue):
// pre_gelu [N, OC] = inp @ weight^T + bias, out [N, OC] = gelu(pre_gelu)
void matmul_forward_gelu(bf16* out, bf16* pre_gelu, const bf16* inp, const bf16* weight, const bf16* bias, int N, int C,
                         int OC);
// dinp [N, C] OVERWRITTEN; dweight [OC, C] and dbias [OC] (fp32) accumulate.
void matmul_backward(bf16* dinp, float* dweight, float* dbias, const bf16* dout, const bf16* inp, const bf16* weight,
                     int N, int C, int OC);
// dgrad: dinp [N, C] = dout [N, OC] @ weight [OC, C]   (OVERWRITTEN)
void matmul_backward_input(bf16* dinp, const bf16* dout, const bf16* weight, int N, int C, int OC);
// fc2's dgrad through the GELU before it (DGELU epilogue):
// dinp [N, C] = (dout @ weight) ⊙ gelu'(pre_gelu [N, C])   (OVERWRITTEN)
void matmul_backward_input_gelu(bf16* dinp, const bf16* dout, const bf16* weight, const bf16* pre_gelu, int N, int C,
                                int OC);
// dgrad of the input columns [c_begin, c_end): dinp [N, c_end − c_begin]   (OVERWRITTEN)
void matmul_backward_input_columns(bf16* dinp, const bf16* dout, const bf16* weight, int N, int C, int OC, int c_begin,
                                   int c_end);
// wgrad of the output rows [o_begin, o_end): dweight [OC, C] (fp32) += dout^T @ inp,
// dbias [OC] += Σ_rows dout (dbias may be null)
void matmul_backward_weight(float* dweight, float* dbias, const bf16* dout, const bf16* inp, int N, int C, int OC,
                            int o_begin, int o_end);

// out [N] = gelu(inp), tanh approximation
void gelu_forward(bf16* out, const bf16* inp, int64_t N);
// dinp [N] OVERWRITTEN (may alias dout)
void gelu_backward(bf16* dinp, const bf16* inp, const bf16* dout, int64_t N);

// out = inp · mask / (1 − p), the mask drawn for `box` under `key`; out may alias inp.
// At p = 0 a copy: the mask is neither written here nor read in backward (it may be null).
void dropout_forward(bf16* out, uint8_t* mask, const bf16* inp, const DropoutBox& box, float p, const DropoutKey& key);
// dinp [n] OVERWRITTEN (may alias dout)
void dropout_backward(bf16* dinp, const uint8_t* mask, const bf16* dout, int64_t n, float p);

// out [N] = inp1 + inp2
void residual_forward(bf16* out, const bf16* inp1, const bf16* inp2, int64_t N);

// out [N, OC] += bias [OC] per row
void bias_forward(bf16* out, const float* bias, int N, int OC);
// out = residual + dropout(y + bias) in one pass over [N, h] (cpu_kernels.h), y unchanged
void bias_dropout_residual_forward(bf16* out, uint8_t* mask, bf16* y, const bf16* residual, const float* bias,
                                   const DropoutBox& box, float p, const DropoutKey& key);
// dbias [OC] += Σ_rows dout [N, OC]
void bias_backward(float* dbias, const bf16* dout, int N, int OC);
// dbias [width] += Σ_rows of the first `width` columns of dout [N, row_stride]
void bias_backward_columns(float* dbias, const bf16* dout, int N, int width, int row_stride);

// Causal self-attention of NH heads, explicit: the same tensors as the CPU's
// attention_forward. qkv [T, B, 3C]; out [T, B, C]; softmax_out, dropout_mask,
// dropout_out [B, NH, T, T]; `box` places [B, NH, T·T] in the global tensor.
// At p = 0, S is S': the mask and dropout_out are not used (they may be null).
// scratch: cuda_attention_scratch_elements(B, T, C, NH) bf16s (attention_scratch.h).
void attention_forward(bf16* out, bf16* softmax_out, uint8_t* dropout_mask, bf16* dropout_out, const bf16* qkv,
                       bf16* scratch, int B, int T, int C, int NH, float p, const DropoutBox& box,
                       const DropoutKey& key);
// dqkv [T, B, 3C] OVERWRITTEN
void attention_backward(bf16* dqkv, const bf16* dout, const bf16* qkv, const bf16* softmax_out,
                        const uint8_t* dropout_mask, const bf16* dropout_out, bf16* scratch, int B, int T, int C,
                        int NH, float p);

// Ring attention (context parallelism's p2p): the CPU kernels' RingAttention
// layout and steps (cpu_kernels.h), bf16 activations, fp32 statistics. The
// output and dQ are summed over the K|V blocks in fp32 in the scratch
// (cuda_ring_attention_scratch_elements(B, T, C, NH) bf16s, attention_scratch.h),
// not in the bf16 tensors: each block adds a part, and rounding the running
// sum to bf16 after each of the 2·cp parts would add an error per block.
// finish writes out, backward_finish dQ. The blocks' dK|dV parts `dkv` are
// bf16 (they travel the ring and are added there), each written whole for
// sequence b: a pair's parts are summed in fp32 first.
void ring_attention_start(bf16* out, float* stats, const RingAttention& ra, bf16* scratch);
void ring_attention_forward_block(bf16* out, float* stats, bf16* softmax_out, const bf16* qkv, const bf16* kv,
                                  const int kv_chunks[2], const RingAttention& ra, int b, float p,
                                  const DropoutKey& key, bf16* scratch);
void ring_attention_finish(bf16* out, bf16* softmax_out, uint8_t* dropout_mask, bf16* dropout_out, float* lse_out,
                           const float* stats, const RingAttention& ra, float p, const DropoutKey& key, bf16* scratch);
void ring_attention_backward_start(float* stats, bf16* dqkv, const bf16* dout, const bf16* out, const RingAttention& ra,
                                   bf16* scratch);
void ring_attention_backward_block(bf16* dqkv, bf16* dkv, const bf16* dout, const bf16* qkv, const bf16* kv,
                                   const bf16* softmax_out, const uint8_t* dropout_mask, const bf16* dropout_out,
                                   const float* lse, const float* stats, const int kv_chunks[2],
                                   const RingAttention& ra, int b, float p, const DropoutKey& key, bf16* scratch);
void ring_attention_backward_finish(bf16* dqkv, const bf16* scratch, const RingAttention& ra);

// Vocabulary-parallel softmax + cross-entropy, the same three steps as on the
// CPU (cpu_kernels.h); logits [N, Vp_local] bf16, statistics fp32.
void crossentropy_max_forward(float* maxes, const bf16* logits, int N, int V_real, int Vp_local);
void crossentropy_sum_forward(float* stats, const bf16* logits, const float* maxes, const int* targets, int vocab_start,
                              int N, int V_real, int Vp_local);
// After the all-reduces: lse [N] = max + log Σ, losses [N] = lse − target logit.
void crossentropy_loss_forward(float* losses, float* lse, const float* maxes, const float* stats, int N);
// Overwrites logits with dloss · (softmax − onehot(target)), 0 in the padded columns.
void crossentropy_backward(bf16* logits, const float* lse, const int* targets, int vocab_start, float dloss, int N,
                           int V_real, int Vp_local);

}  // namespace tpsp
