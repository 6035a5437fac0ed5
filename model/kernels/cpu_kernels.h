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

namespace tpsp {

// Where a dropout mask element lives in the global (un-sharded) tensor, so
// that its random bits do not depend on which rank holds it (DESIGN §3).
// The local tensor is a box [n0, n1, n2] at offset (o0, o1, o2) inside a
// global tensor [*, N1, N2]; its element (i0, i1, i2) has the global index
// ((o0 + i0) * N1 + o1 + i1) * N2 + o2 + i2.
struct DropoutBox {
    int64_t n0, n1, n2;        // local extent
    int64_t N1, N2;            // global extent of the two inner dimensions
    int64_t o0 = 0, o1 = 0, o2 = 0;  // offset of the box in the global tensor
};

// Which draw this is: one stream per (seed, step, layer, site).
enum class DropoutSite : uint32_t { embedding = 0, attention_probs = 1, attention_proj = 2, mlp_fc2 = 3 };
struct DropoutKey {
    uint64_t seed;
    uint32_t step;
    uint32_t layer;
    DropoutSite site;
};

// The random uniform in [0,1) of one global element; exposed for tests.
float dropout_uniform(const DropoutKey& key, uint64_t global_index);

// out [B, T, C] = wte[inp] + wpe[t];  inp [B, T] token ids
void embedding_forward(float* out, const int* inp, const float* wte, const float* wpe, int B, int T, int C);
// dwte, dwpe accumulate;  dout [B, T, C]
void embedding_backward(float* dwte, float* dwpe, const float* dout, const int* inp, int B, int T, int C);

// out [N, C] = (inp - mean) * rstd * weight + bias, per row. Mean and rstd
// are not kept: backward recomputes them from inp.
void layernorm_forward(float* out, const float* inp, const float* weight, const float* bias, int N, int C);
// dinp [N, C] ACCUMULATES (the residual stream's gradient flows through it);
// scratch [2N] holds the recomputed row statistics.
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, float* scratch, int N, int C);

// out [N, OC] = inp [N, C] @ weight [OC, C]^T + bias [OC]  (bias may be null)
void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N, int C, int OC);
// dinp [N, C] is OVERWRITTEN; dweight [OC, C] and dbias [OC] accumulate.
void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int N, int C, int OC);

// out [N] = gelu(inp), tanh approximation
void gelu_forward(float* out, const float* inp, int64_t N);
// dinp [N] OVERWRITTEN (may alias dout)
void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t N);

// out = inp * mask / (1 - p), mask[i] = 1 with probability 1 - p. out may
// alias inp. p = 0 writes an all-ones mask and copies.
void dropout_forward(float* out, uint8_t* mask, const float* inp, const DropoutBox& box, float p,
                     const DropoutKey& key);
// dinp [n] OVERWRITTEN (may alias dout): the input is not needed, only the mask.
void dropout_backward(float* dinp, const uint8_t* mask, const float* dout, int64_t n, float p);

// out [N] = inp1 + inp2. Its backward is the identity on both inputs: the
// model passes the same gradient buffer on, so no kernel is needed.
void residual_forward(float* out, const float* inp1, const float* inp2, int64_t N);

// Causal self-attention of NH heads on qkv [B, T, 3C] (Q | K | V, head h in
// columns h*hs .. (h+1)*hs of each third). Saves, for backward:
//   softmax_out [B, NH, T, T]  S' = softmax(Q K^T / sqrt(hs)), zero above the diagonal
//   dropout_mask [B, NH, T, T], dropout_out [B, NH, T, T]  S = dropout(S')
// and writes out [B, T, C] = S V. `box` places [B, NH, T*T] in the global tensor.
void attention_forward(float* out, float* softmax_out, uint8_t* dropout_mask, float* dropout_out,
                       const float* qkv, int B, int T, int C, int NH, float p, const DropoutBox& box,
                       const DropoutKey& key);
// dqkv [B, T, 3C] OVERWRITTEN; scratch [T, T] per OpenMP thread.
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* softmax_out,
                        const uint8_t* dropout_mask, const float* dropout_out, float* scratch, int B, int T,
                        int C, int NH, float p);

// Fused softmax + cross-entropy over the first V of Vp logits per row.
// logits [N, Vp]; losses [N] = logsumexp - logit[target]; lse [N] kept for
// backward (the per-token statistics).
void crossentropy_forward(float* losses, float* lse, const float* logits, const int* targets, int N, int V,
                          int Vp);
// Overwrites logits [N, Vp] with dloss * (softmax - onehot(target)), zero in
// the padded columns.
void crossentropy_backward(float* logits, const float* lse, const int* targets, float dloss, int N, int V,
                           int Vp);

}  // namespace tpsp
