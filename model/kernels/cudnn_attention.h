// Causal self-attention fused by cuDNN (model.attention: cudnn): flash
// attention through cuDNN's backend graph API, the operation graph written
// out node by node (cudnn_attention.cu). The scores S', the dropout mask and
// S never reach memory: forward keeps only the row statistics
// lse = max + log Σ exp of the scaled, masked scores, from which backward
// rebuilds S' tile by tile. So a layer keeps b·(a/t)·s fp32 statistics in
// place of the explicit path's 5·a·s²·b/t bytes.
//
// Dropout draws cuDNN's own Philox stream from (seed, offset 0), position by
// position in this rank's [b, a/t, s, s]: backward redraws the same mask
// from the same seed, but it is not the explicit path's mask.
#pragma once
#include <cstdint>
#include <string>

#include "model/kernels/cuda_kernels.h"

namespace tpsp {

// qkv [T, B, 3C] (head h in columns h·hs .. (h+1)·hs of each third, as in
// attention_forward) → out [T, B, C], stats [B, NH, T] fp32. Q, K, V and the
// output are read and written in place through strides: no head-major copies.
void fused_attention_forward(bf16* out, float* stats, const bf16* qkv, int B, int T, int C, int NH, float p,
                             uint64_t seed);
// dqkv [T, B, 3C] OVERWRITTEN from dout [T, B, C]; out and stats are the forward's.
void fused_attention_backward(bf16* dqkv, const bf16* dout, const bf16* qkv, const bf16* out, const float* stats, int B,
                              int T, int C, int NH, float p, uint64_t seed);

// Builds both operation graphs for this shape and asks cuDNN for an
// execution plan of each for an H100 / H200 described to it by its device
// properties, so that a machine without a GPU can check that cuDNN fuses
// these graphs (its deviceless compilation, 9.8 and later). cuDNN then
// generates and compiles both fused kernels; loading them needs the driver
// library (libcuda: the real one, or the toolkit's stub, which refuses).
// Throws cuDNN's message about the first descriptor or plan it rejects.
struct FusedAttentionPlanCheck {
    bool planned = false;  // both plans finalised; false: compiled, but no driver could load them
    int64_t forward_workspace_bytes = 0, backward_workspace_bytes = 0;
};
FusedAttentionPlanCheck check_fused_attention_plans_for_hopper(int B, int T, int C, int NH, float p);

// "cuDNN: 9.13.0 (its file), compiled against 9.x.y": the cuDNN that loaded.
std::string cudnn_version();

}  // namespace tpsp
