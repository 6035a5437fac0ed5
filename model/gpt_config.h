// What a GPT is and what one forward/backward runs on: plain values, so that
// the config, the memory report and the checkpoint header can name a model
// without pulling in its kernels. The config keys' English names
// (model.channels, train.seq_len) become the paper's letters here (h, s).
#pragma once

namespace tpsp {

// How attention runs: the explicit kernels that save S', the mask and S
// (docs/design.md §2's table), or cuDNN's fused kernel that saves only the
// softmax row statistics (model.attention: cudnn; GPU only).
enum class AttentionKernel { explicit_scores, cudnn_fused };

// The largest model tpsp takes, from a config or a checkpoint header: within
// these every size computed from the shape fits in 64 bits, and the element
// counts the kernels index with int stay below 2^31 (with the run's own
// limit on b·s, checked by the config).
struct ModelLimits {
    static constexpr int channels = 65536, layers = 4096, seq_len = 1 << 20, padded_vocab = 1 << 24;
};

struct GPTConfig {
    int max_seq_len = 1024;         // maxT: rows of wpe
    int vocab_size = 50257;         // V: real tokens
    int padded_vocab_size = 50304;  // Vp: rows of wte, a multiple of 128 in llm.c
    int num_layers = 12;            // L
    int num_heads = 12;             // a
    int channels = 768;             // h (C in the kernels, as in llm.c)
    AttentionKernel attention = AttentionKernel::explicit_scores;
};

// What backward computes again instead of keeping it (Korthikanti et al.
// 2022; Megatron's --recompute-granularity, --recompute-method and
// --recompute-num-layers).
//   none:      a block keeps docs/design.md §2's whole table.
//   selective: a block drops the attention core's s² tensors (S', its dropout
//              mask and S); backward recomputes them from the saved qkv into
//              workspace that exists once, not per block.
//   full:      a recomputed block keeps only its input and backward runs its
//              forward again, communication included (RecomputeMethod says
//              which blocks).
enum class Recompute { none, selective, full };

// Which blocks full recomputation covers, with N = RunShape::recompute_layers:
//   uniform: the L blocks in runs of N (the last may be shorter); a run keeps
//            only its first block's input, and backward recomputes the whole
//            run at once (N blocks' tables in the workspace).
//   block:   the first N blocks each keep only their own input and are
//            recomputed one at a time; the other L − N keep their tables.
enum class RecomputeMethod { uniform, block };

// The shape of one forward/backward: micro-batch b, sequence length s, the
// dropout probability at all four sites, and what backward recomputes.
struct RunShape {
    int batch = 4;
    int seq_len = 64;
    float dropout = 0.0f;
    Recompute recompute = Recompute::none;
    RecomputeMethod recompute_method = RecomputeMethod::uniform;
    int recompute_layers = 1;  // N above; full recomputation only
};

}  // namespace tpsp
