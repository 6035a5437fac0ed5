// The CPU kernels of GPT-2, in forward/backward pairs, fp32.
//
// Conventions (the same as llm.c's train_gpt2.c):
//   - every tensor is contiguous, row-major, and its shape is in the comment
//     above the function; N = B*T rows where a kernel does not care about
//     the batch/time split.
//   - `*_backward` ACCUMULATES into parameter gradients (dweight, dbias), so
//     gradient accumulation over micro-batches is free, and says per kernel
//     whether it overwrites or accumulates the input gradient `dinp`.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "model/kernels/dropout_rng.h"
#include "model/kernels/ring_attention.h"

namespace tpsp {

// Activations are sequence-major, [T, B, C] (Megatron's [s, b, h]): a
// sequence shard is then a contiguous block of rows.
//
// Token embedding, vocabulary-parallel: this rank holds the rows
// [vocab_start, vocab_start + V_local) of wte. out [T, B, C] = wte[inp] for
// tokens in that range, 0 for the others (the other ranks supply them).
// inp [B, T] token ids, in the data's order.
void token_embedding_forward(float* out, const int* inp, const float* wte, int vocab_start, int V_local, int B, int T,
                             int C);
// dwte [V_local, C] accumulates;  dout [T, B, C]
void token_embedding_backward(float* dwte, const float* dout, const int* inp, int vocab_start, int V_local, int B,
                              int T, int C);
// out [T_local, B, C] += wpe[pos_start + t]: the positions of a sequence shard.
void position_embedding_forward(float* out, const float* wpe, int pos_start, int T_local, int B, int C);
// dwpe accumulates;  dout [T_local, B, C]
void position_embedding_backward(float* dwpe, const float* dout, int pos_start, int T_local, int B, int C);

// out [N, C] = (inp - mean) * rstd * weight + bias, per row. Mean and rstd
// are not kept: backward recomputes them from inp.
void layernorm_forward(float* out, const float* inp, const float* weight, const float* bias, int N, int C);
// dinp [N, C] ACCUMULATES (the residual stream's gradient flows through it);
// scratch [2N] holds the recomputed row statistics.
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, float* scratch, int N, int C);

// The GEMM of the linears (the matmul_* kernels below): oneDNN's sgemm where
// tpsp is built with it (TPSP_WITH_ONEDNN), which picks its JIT kernels from
// cpuid whatever OPENBLAS_CORETYPE says; OpenBLAS's otherwise. The
// attention's per-head GEMMs, small and many, stay on OpenBLAS, which is
// faster at that size (docs/performance.md). Row-major:
// C [M, N] = alpha · op(A) · op(B) + beta · C, op transposing where asked.
void linear_sgemm(bool transpose_a, bool transpose_b, int M, int N, int K, float alpha, const float* A, int lda,
                  const float* B, int ldb, float beta, float* C, int ldc);
// The library and kernels linear_sgemm runs: "oneDNN 2.6.3 sgemm, AVX-512 JIT kernels", or "OpenBLAS".
std::string linear_gemm_library();

// out [N, OC] = inp [N, C] @ weight [OC, C]^T + bias [OC]  (bias may be null)
void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N, int C, int OC);
// A linear and the GELU after it: pre_gelu [N, OC] = inp @ weight^T + bias,
// out [N, OC] = gelu(pre_gelu). The GPU does both in one GEMM's epilogue;
// here it is the GEMM, then the GELU on the same rows.
void matmul_forward_gelu(float* out, float* pre_gelu, const float* inp, const float* weight, const float* bias, int N,
                         int C, int OC);
// dinp [N, C] is OVERWRITTEN; dweight [OC, C] and dbias [OC] accumulate.
void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int N, int C, int OC);
// The two halves of matmul_backward, for schedules that run them apart:
// dgrad: dinp [N, C] = dout [N, OC] @ weight [OC, C]   (OVERWRITTEN)
void matmul_backward_input(float* dinp, const float* dout, const float* weight, int N, int C, int OC);
// dgrad through the GELU that made the input: dinp [N, C] = (dout @ weight) ⊙ gelu'(pre_gelu [N, C])
void matmul_backward_input_gelu(float* dinp, const float* dout, const float* weight, const float* pre_gelu, int N,
                                int C, int OC);
// dgrad of the input columns [c_begin, c_end) only: dinp [N, c_end − c_begin] (OVERWRITTEN)
void matmul_backward_input_columns(float* dinp, const float* dout, const float* weight, int N, int C, int OC,
                                   int c_begin, int c_end);
// wgrad of the output rows [o_begin, o_end): dweight[o] += Σ_n dout[n, o] inp[n], dbias[o] += Σ_n dout[n, o]
void matmul_backward_weight(float* dweight, float* dbias, const float* dout, const float* inp, int N, int C, int OC,
                            int o_begin, int o_end);

// out [N] = gelu(inp), tanh approximation
void gelu_forward(float* out, const float* inp, int64_t N);
// dinp [N] OVERWRITTEN (may alias dout)
void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t N);

// out = inp * mask / (1 - p), mask[i] = 1 with probability 1 - p. out may
// alias inp. At p = 0 it copies and never touches the mask (which may be null:
// a model without dropout keeps none).
void dropout_forward(float* out, uint8_t* mask, const float* inp, const DropoutBox& box, float p,
                     const DropoutKey& key);
// dinp [n] OVERWRITTEN (may alias dout): the input is not needed, only the mask
// (none at p = 0: it copies).
void dropout_backward(float* dinp, const uint8_t* mask, const float* dout, int64_t n, float p);

// out [N] = inp1 + inp2. Its backward is the identity on both inputs: the
// model passes the same gradient buffer on, so no kernel is needed.
void residual_forward(float* out, const float* inp1, const float* inp2, int64_t N);

// Causal self-attention of NH heads on qkv [T, B, 3C] (Q | K | V, head h in
// columns h*hs .. (h+1)*hs of each third). Saves, for backward:
//   softmax_out [B, NH, T, T]  S' = softmax(Q K^T / sqrt(hs)), zero above the diagonal
//   dropout_mask [B, NH, T, T], dropout_out [B, NH, T, T]  S = dropout(S')
// and writes out [T, B, C] = S V. `box` places [B, NH, T*T] in the global tensor.
// At p = 0, S is S': the mask and dropout_out are neither written nor read
// (both may be null), here and in backward.
// scratch: none is needed on the CPU; the argument is the CUDA twin's.
void attention_forward(float* out, float* softmax_out, uint8_t* dropout_mask, float* dropout_out, const float* qkv,
                       float* scratch, int B, int T, int C, int NH, float p, const DropoutBox& box,
                       const DropoutKey& key);
// dqkv [T, B, 3C] OVERWRITTEN; scratch [T, T] per OpenMP thread.
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* softmax_out,
                        const uint8_t* dropout_mask, const float* dropout_out, float* scratch, int B, int T, int C,
                        int NH, float p);

// Ring attention (context parallelism's cp_comm_type p2p), in the layout of
// ring_attention.h.
//
// out [T, B, C] = 0, the running max −∞ and sum 0. scratch: as the blocks'
// (the CUDA twin keeps its fp32 running output there; the CPU's is `out`).
void ring_attention_start(float* out, float* stats, const RingAttention& ra, float* scratch);
// Sequence b's rows against one K|V block: S' gets the scaled scores Q K^T
// of the computed pairs (a null S': selective recomputation, which keeps
// none); out and stats take the block in by the online softmax (out
// rescaled by exp(m_old − m_new), then += dropout(exp(scores − m_new)) · V).
// Rows with no key in the block are left as they were. scratch: 2·c² floats
// per OpenMP thread.
void ring_attention_forward_block(float* out, float* stats, float* softmax_out, const float* qkv, const float* kv,
                                  const int kv_chunks[2], const RingAttention& ra, int b, float p,
                                  const DropoutKey& key, float* scratch);
// After every block: out /= the row's sum; where S' is kept, S' =
// exp(scores − log-sum-exp), 0 above the diagonal, and the mask and S =
// dropout(S') drawn as the box says; where lse_out [B, NH, T] is given,
// each row's log-sum-exp (what selective recomputation keeps).
void ring_attention_finish(float* out, float* softmax_out, uint8_t* dropout_mask, float* dropout_out, float* lse_out,
                           const float* stats, const RingAttention& ra, float p, const DropoutKey& key, float* scratch);
// Backward's start: stats [B, NH, T] = Σ_j dO·O per row (the softmax
// backward's Σ_k S'∘dS' over every key, which no block alone has), and the
// Q columns of dqkv [T, B, 3C] zeroed for the blocks to add into.
void ring_attention_backward_start(float* stats, float* dqkv, const float* dout, const float* out,
                                   const RingAttention& ra, float* scratch);
// Sequence b's rows against one K|V block: dQ (in dqkv's Q columns) and the
// block's dK|dV partial dkv [T, B, 2C] (as kv) accumulate. With a null S'
// each pair's S', mask and S are recomputed from Q K^T and the rows'
// log-sum-exp `lse` [B, NH, T], with the forward's dropout key. scratch:
// 4·c² floats per OpenMP thread.
void ring_attention_backward_block(float* dqkv, float* dkv, const float* dout, const float* qkv, const float* kv,
                                   const float* softmax_out, const uint8_t* dropout_mask, const float* dropout_out,
                                   const float* lse, const float* stats, const int kv_chunks[2],
                                   const RingAttention& ra, int b, float p, const DropoutKey& key, float* scratch);
// After every block: dQ is in dqkv's Q columns. Nothing is left to do here,
// where the blocks added into them; the CUDA twin sums dQ in fp32 in its
// scratch and writes it now.
void ring_attention_backward_finish(float* dqkv, const float* scratch, const RingAttention& ra);

// Softmax + cross-entropy, vocabulary-parallel. This rank holds the logit
// columns [vocab_start, vocab_start + Vp_local) of each row, of which the
// first V_real are real tokens (the rest is padding). The rows' statistics
// combine over ranks in between the two forward kernels:
//   1. crossentropy_max_forward: maxes [N] = the local max           -> all-reduce max
//   2. crossentropy_sum_forward: stats [2, N] = Σ exp(logit − max) and the
//      target's logit where this rank holds it (0 elsewhere)        -> all-reduce sum
//   then lse = max + log Σ and loss = lse − target logit.
// logits [N, Vp_local]; targets [N] in row order.
void crossentropy_max_forward(float* maxes, const float* logits, int N, int V_real, int Vp_local);
void crossentropy_sum_forward(float* stats, const float* logits, const float* maxes, const int* targets,
                              int vocab_start, int N, int V_real, int Vp_local);
// Overwrites logits [N, Vp_local] with dloss · (softmax − onehot(target)),
// zero in the padded columns. lse [N] from the forward.
void crossentropy_backward(float* logits, const float* lse, const int* targets, int vocab_start, float dloss, int N,
                           int V_real, int Vp_local);

// out [N, OC] += bias [OC] per row  (the row-parallel linears add their bias
// once, after the reduce-scatter)
void bias_forward(float* out, const float* bias, int N, int OC);
// dbias [OC] += Σ_rows dout [N, OC]
void bias_backward(float* dbias, const float* dout, int N, int OC);

// A residual branch's end: out = residual + dropout(y + bias), for the token
// tensors [N, h] of `box` (N = box.n0·box.n1 rows of box.n2 = h channels).
// y is scratch: here it is left holding dropout(y + bias), the three kernels
// run one after the other; the GPU does all in one pass and leaves y as it was.
void bias_dropout_residual_forward(float* out, uint8_t* mask, float* y, const float* residual, const float* bias,
                                   const DropoutBox& box, float p, const DropoutKey& key);

}  // namespace tpsp
