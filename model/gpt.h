// GPT-2 on one rank, CPU, fp32: parameters, the saved activations of
// DESIGN §2, the backward workspace, and forward / backward of the model.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model/tensor_table.h"

namespace tpsp {

struct GPTConfig {
    int max_seq_len = 1024;         // maxT: rows of wpe
    int vocab_size = 50257;         // V: real tokens
    int padded_vocab_size = 50304;  // Vp: rows of wte, a multiple of 128 in llm.c
    int num_layers = 12;            // L
    int num_heads = 12;             // a
    int channels = 768;             // h (C)
};

// The shape of one forward/backward: micro-batch b, sequence length s, and
// the dropout probability at all four sites.
struct RunShape {
    int batch = 4;
    int seq_len = 64;
    float dropout = 0.0f;
};

// llm.c's 16 parameter tensors, in llm.c's order (the checkpoint order).
struct ParameterTensors {
    float *wte, *wpe;                   // [Vp, C], [maxT, C]
    float *ln1w, *ln1b;                 // [L, C]
    float *qkvw, *qkvb;                 // [L, 3C, C], [L, 3C]
    float *attprojw, *attprojb;         // [L, C, C], [L, C]
    float *ln2w, *ln2b;                 // [L, C]
    float *fcw, *fcb;                   // [L, 4C, C], [L, 4C]
    float *fcprojw, *fcprojb;           // [L, C, 4C], [L, C]
    float *lnfw, *lnfb;                 // [C]
};
std::vector<TensorSpec> parameter_table(const GPTConfig& config, ParameterTensors* p);
// The tensors AdamW decays by default: the matrices (wte, wpe and the four linear weights).
bool parameter_is_matrix(const std::string& name);

// What one block keeps for backward: exactly the table of DESIGN §2.
struct BlockActivations {
    float* ln1_in;              // [b, s, h]  residual stream entering the block
    float* ln1_out;             // [b, s, h]  QKV GEMM input
    float* qkv;                 // [b, s, 3h]
    float* softmax_out;         // [b, a, s, s]  S'
    uint8_t* attn_dropout_mask; // [b, a, s, s]
    float* attn_dropout_out;    // [b, a, s, s]  S
    float* attn_out;            // [b, s, h]  proj GEMM input
    uint8_t* proj_dropout_mask; // [b, s, h]
    float* ln2_in;              // [b, s, h]
    float* ln2_out;             // [b, s, h]  fc1 GEMM input
    float* gelu_in;             // [b, s, 4h] fc1 output
    float* gelu_out;            // [b, s, 4h] fc2 GEMM input
    uint8_t* fc2_dropout_mask;  // [b, s, h]
};

// What the model keeps outside the blocks.
struct OutsideActivations {
    uint8_t* embedding_dropout_mask;  // [b, s, h]
    float* lnf_in;                    // [b, s, h]  output of the last block
    float* lnf_out;                   // [b, s, h]
    float* logits;                    // [b, s, Vp] overwritten by its gradient in backward
    float* losses;                    // [b, s]  per-token loss
    float* lse;                       // [b, s]  per-token log-sum-exp
};

// Scratch reused from block to block; not kept across forward and backward.
struct Workspace {
    float* stream_grad;        // [b, s, h]  gradient of the residual stream
    float* branch;             // [b, s, h]  a branch's output before its dropout / the gradient entering it
    float* narrow_grad;        // [b, s, h]  gradient of an LN output or of the attention output
    float* wide_grad;          // [b, s, 4h] gradient of fc1's output, or of qkv
    float* ln_stats;           // [2, b, s]  LayerNorm statistics recomputed in backward
    float* attention_scratch;  // [threads, s, s] one head's score gradient per thread
};

std::vector<TensorSpec> block_activation_table(const GPTConfig& config, const RunShape& shape, BlockActivations* a);
std::vector<TensorSpec> outside_activation_table(const GPTConfig& config, const RunShape& shape,
                                                 OutsideActivations* a);
std::vector<TensorSpec> workspace_table(const GPTConfig& config, const RunShape& shape, int threads,
                                        Workspace* w);

// DESIGN §2, one rank (t = 1): b·s·h·(16e + 2) + b·a·s²·(2e + 1) bytes per block.
int64_t block_activation_formula_bytes(int64_t b, int64_t s, int64_t h, int64_t a, int64_t e);

// The dropout draw of one forward: the same (seed, step) draws the same masks;
// batch_offset is the global index of this micro-batch's first sequence
// (counting over data-parallel ranks and micro-batches).
struct DropoutStep {
    uint64_t seed = 0;
    uint32_t step = 0;
    int64_t batch_offset = 0;
};

class GPT {
public:
    GPT(const GPTConfig& config, const RunShape& shape);

    // inputs, targets [b, s]; returns the mean loss over the b·s tokens.
    // training = false turns dropout off (validation, sampling).
    float forward(const int* inputs, const int* targets, const DropoutStep& draw, bool training = true);
    // Accumulates into grads the gradient of dloss_scale · Σ token losses.
    // Uses the activations of the last forward; overwrites logits.
    void backward(const int* inputs, const int* targets, float dloss_scale);
    void zero_grad();
    // GPT-2's initialisation: N(0, 0.02), residual projections N(0, 0.02/√(2L)),
    // biases 0, LayerNorm weights 1; the padded vocabulary rows stay 0.
    void init_random(uint64_t seed);

    GPTConfig config;
    RunShape shape;
    std::vector<TensorSpec> parameter_specs;  // names and shapes, llm.c order
    int64_t num_parameters = 0;
    ParameterTensors params{}, grads{};
    std::vector<BlockActivations> blocks;
    OutsideActivations outside{};
    Workspace workspace{};
    Arena param_arena, grad_arena, activation_arena, workspace_arena;
    std::vector<TensorSpec> block_table_of_layer0() const;  // for reports

private:
    void block_forward(int layer, float* block_out, const DropoutStep& draw, float p);
    void block_backward(int layer);
};

// Model FLOPs of one forward+backward per token (PaLM's 6N + 12·L·s·h, with
// N the parameters that take part in matmuls, the LM head included).
double model_flops_per_token(const GPTConfig& config, int seq_len);

}  // namespace tpsp
