// GPT-2 on one rank of a tensor-parallel group: the parameter shard, the
// saved activations of docs/design.md §2 for this rank, the backward workspace, and
// forward / backward with the g / ḡ collectives of docs/design.md §3. With a group of
// one (the default) it is the plain single-rank model.
//
// Activations are sequence-major, [s, b, h] as in Megatron, so that a
// sequence shard [s/t, b, h] is a contiguous block of rows.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "model/backend.h"
#include "model/gpt_config.h"
#include "model/parallel_linear.h"
#include "model/tensor_table.h"
#include "parallel/layout.h"
#include "parallel/mappings.h"
#include "parallel/pipeline_schedule.h"

namespace tpsp {

// llm.c's 16 parameter tensors, in llm.c's order (the checkpoint order).
// Per rank: the column-parallel weights hold 1/t of their output rows (QKV
// per head, so each third is split), the row-parallel weights 1/t of their
// input columns, wte 1/t of the (padded) vocabulary; the rest is replicated.
struct ParameterTensors {
    float *wte, *wpe;            // [Vp/t, h], [maxT, h]
    float *ln1w, *ln1b;          // [L, h]
    float *qkvw, *qkvb;          // [L, 3h/t, h], [L, 3h/t]
    float *attprojw, *attprojb;  // [L, h, h/t], [L, h]
    float *ln2w, *ln2b;          // [L, h]
    float *fcw, *fcb;            // [L, 4h/t, h], [L, 4h/t]
    float *fcprojw, *fcprojb;    // [L, h, 4h/t], [L, h]
    float *lnfw, *lnfb;          // [h]
};

// One block's slice of the per-layer tensors above (of the parameters, or of
// their gradients).
struct BlockParameters {
    float *ln1w, *ln1b;          // [h]
    float *qkvw, *qkvb;          // [3h/t, h], [3h/t]
    float *attprojw, *attprojb;  // [h, h/t], [h]
    float *ln2w, *ln2b;          // [h]
    float *fcw, *fcb;            // [4h/t, h], [4h/t]
    float *fcprojw, *fcprojb;    // [h, 4h/t], [h]
};

// Blocks [begin, end) taken together: a run that full recomputation runs
// forward again, or a pipeline's model chunk.
struct BlockRun {
    int begin, end;
};

// What one pipeline stage holds of the model (docs/design.md §10); without a
// pipeline, all of it (whole_model). Its blocks are numbered locally
// 0 … layers.size() − 1 in every table, each knowing its global index.
struct ModelPart {
    std::vector<int> layers;       // the global index of each block held, ascending
    std::vector<BlockRun> chunks;  // its model chunks, local ranges of `layers`, in the model's order
    bool embeddings = true;        // the first stage: wte's lookup, wpe, the embedding dropout
    bool head = true;              // the last stage: the final LayerNorm, the LM head over wte, the loss
    std::vector<int> in_flight;    // per chunk, the micro-batches its schedule keeps in flight at most
    int block_sets = 1;            // the blocks' activation sets: the most micro-batches in flight, chunks together
    int num_layers() const { return int(layers.size()); }
    bool holds_wte() const { return embeddings || head; }  // both ends hold the tied wte (Megatron's embedding group)
};
ModelPart whole_model(const GPTConfig& config);

// The table of the parameters; with `blocks`, also each block's view of them.
// A part's tables keep every tensor's row: those it does not hold have no
// elements (wte, wpe, lnf), the per-layer ones its blocks.
std::vector<TensorSpec> parameter_table(const GPTConfig& config, int tp, ParameterTensors* p,
                                        std::vector<BlockParameters>* blocks = nullptr);
std::vector<TensorSpec> parameter_table(const GPTConfig& config, int tp, const ModelPart& part, ParameterTensors* p,
                                        std::vector<BlockParameters>* blocks = nullptr);
// The tensors AdamW decays by default: the matrices (wte, wpe and the four linear weights).
bool parameter_is_matrix(const std::string& name);
// The tensors every rank of a TP group holds whole (their gradients are
// summed over the group under SP).
bool parameter_is_replicated(const std::string& name);

// Copies between a full tensor (llm.c layout) and rank r's shard of it.
enum class ShardDirection { full_to_shard, shard_to_full };
void copy_parameter_shards(const GPTConfig& config, int tp, int rank, float* full, float* shard,
                           ShardDirection direction);
// The same for the part a pipeline stage holds: its shard of its tensors.
void copy_parameter_shards(const GPTConfig& config, int tp, int rank, const ModelPart& part, float* full, float* shard,
                           ShardDirection direction);

// The tensors the GEMMs read, whole (where the GPU's copies live).
template <class Act>
struct GemmWeights {
    Act *wte, *qkvw, *qkvb, *attprojw, *fcw, *fcb, *fcprojw;
};

// One block's slice of them.
template <class Act>
struct BlockGemmWeights {
    GemmWeight<Act> qkvw, qkvb, attprojw, fcw, fcb, fcprojw;
};

// What one block keeps for backward: exactly the table of docs/design.md §2, in the
// activation dtype (e bytes per element). s_local = s/t under SP, s without.
template <class Act>
struct BlockActivations {
    Act* ln1_in;                 // [s_local, b, h]  residual stream entering the block
    Act* ln1_out;                // [s_local, b, h]  QKV GEMM input (re-gathered in backward)
    Act* qkv;                    // [s, b, 3h/t]
    Act* softmax_out;            // [b, a/t, s, s]  S'      (explicit attention)
    uint8_t* attn_dropout_mask;  // [b, a/t, s, s]          (explicit attention)
    Act* attn_dropout_out;       // [b, a/t, s, s]  S       (explicit attention)
    float* softmax_stats;        // [b, a/t, s]  log Σ exp of each score row (cuDNN's fused attention, instead)
    Act* attn_out;               // [s, b, h/t]  proj GEMM input
    uint8_t* proj_dropout_mask;  // [s_local, b, h]
    Act* ln2_in;                 // [s_local, b, h]
    Act* ln2_out;                // [s_local, b, h]  fc1 GEMM input (re-gathered in backward)
    Act* gelu_in;                // [s, b, 4h/t] fc1 output
    Act* gelu_out;               // [s, b, 4h/t] fc2 GEMM input
    uint8_t* fc2_dropout_mask;   // [s_local, b, h]
};

// What the model keeps outside the blocks.
template <class Act>
struct OutsideActivations {
    uint8_t* embedding_dropout_mask;  // [s_local, b, h]
    Act* lnf_in;                      // [s_local, b, h]  output of the last block
    Act* lnf_out;                     // [s_local, b, h]  (re-gathered in backward)
    Act* logits;                      // [s, b, Vp/t] overwritten by its gradient in backward
    float* losses;                    // [s, b]  per-token loss
    float* lse;                       // [s, b]  per-token log-sum-exp
};

// Scratch reused from block to block; not kept across forward and backward.
template <class Act>
struct Workspace {
    Act* stream_grad;         // [s_local, b, h] gradient of the residual stream
    Act* branch;              // [s_local, b, h] a branch's output before its dropout / the gradient entering it
    Act* local_grad;          // [s_local, b, h] gradient of an LN output, after g's backward
    Act* gathered;            // [s, b, h]  g's all-gather of an LN output / ḡ's all-gather of a gradient
    Act* partial;             // [s, b, h]  a row-parallel output, or a column-parallel dgrad, before its reduction
    Act* attn_grad;           // [s, b, h/t] gradient of the attention output
    Act* wide_grad;           // [s, b, 4h/t] gradient of fc1's output, or of qkv
    float* ln_stats;          // [2, s_local, b] LayerNorm statistics recomputed in backward
    float* vocab_stats;       // [3, s, b] cross-entropy row max, Σ exp, target logit
    Act* attention_scratch;   // the attention kernels' scratch, as large as the backend says
    float* replicated_grads;  // the replicated parameters' gradients, packed for one all-reduce
    Act* rs_scratch;          // [3, s_local, b, h] an overlapped reduce-scatter's buffers in flight
    // context parallelism's (none at cp = 1), each [s/cp, b, 3h/t] or as many elements:
    Act* cp_qkv;      // qkv before sp2hp; then the gradient of the head-sharded qkv, before hp2sp
    Act* cp_out;      // [s, b, h/(t·cp)] the attention's output before hp2sp; then its gradient after sp2hp
    Act* cp_send;     // the all-to-all's blocks going out
    Act* cp_receive;  // and coming in
    // ring attention (cp_comm_type p2p, §9): [2, s/cp, b, 2h/t] the K|V block
    // this rank computes on and the one arriving; [4, s/cp, b, 2h/t] in
    // backward the dK|dV partial, the accumulators going out and coming in,
    // and this rank's own when it is home; [2, b, a/t, s/cp] the rows' running
    // max and sum (forward), or dO·O (backward)
    Act* ring_kv;
    Act* ring_dkv;
    float* ring_stats;
    // what backward recomputes into (recompute_table in gpt_model.h): the
    // recomputed blocks' forward writes there, and backward writes it again
    // before it reads it
    std::vector<BlockActivations<Act>> recompute;
};

// The token ids of one forward, where the kernels read them.
struct TokenBuffers {
    int* inputs;       // [b, s] the data's order
    int* row_targets;  // [s, b] the targets in the activations' row order
};

// What one block keeps for backward: its whole table, only its input (the
// first block of a run that full recomputation reruns), or nothing (the
// other blocks of such a run).
enum class BlockKeeps { whole_table, input_only, nothing };
// Full recomputation's runs (RecomputeMethod in gpt_config.h); none for the other modes.
std::vector<BlockRun> recomputed_runs(const RunShape& shape, int num_layers);
BlockKeeps block_keeps(const RunShape& shape, int num_layers, int layer);
// "none", "selective", "full (uniform: runs of 2 blocks)", "full (block: the first 3 blocks)"
std::string recompute_description(const RunShape& shape);
// How many tables the workspace holds for recomputation: 1 under selective
// (S', mask and S of the explicit attention; 0 with cuDNN's), the longest run under full.
// config.num_layers: the blocks of one model chunk where a pipeline cuts the model.
int recompute_slots(const GPTConfig& config, const RunShape& shape);
// A pipeline stage's part (parallel/pipeline_schedule.h): its chunks' blocks
// and the activation sets its schedule keeps in flight.
ModelPart pipeline_part(const PipelineShape& pipeline, int stage);
// The blocks' saved activations a stage keeps, per rank (docs/design.md §10):
// its activation sets (the most micro-batches in flight, chunks together) ×
// one chunk's blocks' formula (saved_blocks_formula_bytes of a chunk's
// blocks); the whole model's for whole_model().
int64_t part_saved_blocks_formula_bytes(const GPTConfig& config, const RunShape& shape, const TensorParallelism& tp,
                                        int64_t e, const ModelPart& part);

template <class Act>
std::vector<TensorSpec> gemm_weight_table(const GPTConfig& config, int tp, GemmWeights<Act>* w,
                                          std::vector<BlockGemmWeights<Act>>* blocks = nullptr,
                                          const ModelPart* part = nullptr);
// Under context parallelism (cp) `shape` is a CP rank's: seq_len is the s/cp
// positions it holds; its attention runs on all cp·seq_len positions for
// 1/cp of its heads (docs/design.md §9).
template <class Act>
std::vector<TensorSpec> block_activation_table(const GPTConfig& config, const RunShape& shape,
                                               const TensorParallelism& tp, BlockActivations<Act>* a,
                                               BlockKeeps keeps = BlockKeeps::whole_table,
                                               const ContextParallelism& cp = {});
// embeddings / head: whether the activation set is of a chunk that runs the
// embeddings (their dropout mask) or the head (lnf_in … lse); a pipeline's
// other chunks keep none of it.
template <class Act>
std::vector<TensorSpec> outside_activation_table(const GPTConfig& config, const RunShape& shape,
                                                 const TensorParallelism& tp, OutsideActivations<Act>* a,
                                                 bool embeddings = true, bool head = true);
// attention_scratch: the backend's (Backend::attention_scratch)
template <class Act>
// part: a pipeline stage's (its replicated parameters, packed under SP); null, the whole model's.
std::vector<TensorSpec> workspace_table(const GPTConfig& config, const RunShape& shape, const TensorParallelism& tp,
                                        const Dim& attention_scratch, Workspace<Act>* w,
                                        const ContextParallelism& cp = {}, const ModelPart* part = nullptr);
std::vector<TensorSpec> token_table(const RunShape& shape, TokenBuffers* tokens);

// docs/design.md §2, bytes of one block's whole table per rank:
//   TP+SP:    b·s·h·(16e + 2)/t  +  b·a·s²·(2e + 1)/t
//   TP only:  b·s·h·(4e + 2)     +  b·s·h·12e/t  +  b·a·s²·(2e + 1)/t
// Without dropout (p = 0) there are no masks: the 2 goes and (2e + 1) becomes e.
// With cuDNN's fused attention the s² term is 4·b·a·s/t (fp32 row statistics).
// Under selective recomputation the s² term moves to the workspace (once).
// Under full recomputation this is the table a block outside the runs keeps,
// and the one a recomputed block has in the workspace.
int64_t block_activation_formula_bytes(int64_t b, int64_t s, int64_t h, int64_t a, int64_t e, int64_t t,
                                       bool sequence_parallel,
                                       AttentionKernel attention = AttentionKernel::explicit_scores,
                                       Recompute recompute = Recompute::none, bool dropout = true);
// The formulas of a whole run, per rank, with e bytes per activation: what the
// L blocks keep (under full recomputation, each run's input b·s·h·e/t and the
// whole tables of the blocks outside the runs), and the workspace that
// recomputation adds (selective: one block's s² term; full: the longest run's
// tables, less the input its first block keeps).
int64_t saved_blocks_formula_bytes(const GPTConfig& config, const RunShape& shape, const TensorParallelism& tp,
                                   int64_t e);
int64_t recompute_workspace_formula_bytes(const GPTConfig& config, const RunShape& shape, const TensorParallelism& tp,
                                          int64_t e);
// Whether a block's whole table has S' (and at p > 0 its mask and S): the explicit attention, not under selective
// recomputation.
bool keeps_attention_scores(const GPTConfig& config, const RunShape& shape);
// Whether backward recomputes them: the explicit attention under selective recomputation.
bool recomputes_attention_scores(const GPTConfig& config, const RunShape& shape);

// The dropout draw of one forward: the same (seed, step) draws the same masks;
// batch_offset is the global index of this micro-batch's first sequence
// (counting over data-parallel ranks and micro-batches).
struct DropoutStep {
    uint64_t seed = 0;
    uint32_t step = 0;
    int64_t batch_offset = 0;
};

// The GPT of one rank, on a backend: CpuBackend (backend.h: fp32, OpenBLAS,
// MPI) or CudaBackend (cuda_backend.h: bf16 activations, cuBLASLt, NCCL).
// The forward and backward code (gpt_model.h) is the same for both; the
// backend supplies the kernels, the memory and the communicator.
template <class Backend>
class GPTModel {
    static_assert(ModelBackend<Backend>);

public:
    using Act = typename Backend::Act;
    using Comm = typename Backend::Comm;

    // group: the TP group's communicator (its size and rank must match tp);
    // null for a single rank. cp_group: the context-parallel group, null for
    // none; with one, `shape` is this CP rank's (seq_len: the s/cp positions
    // it holds) and forward reads those positions of the whole sequences it
    // is given (docs/design.md §9).
    // part: what a pipeline stage holds (pipeline_part); empty, the whole model.
    GPTModel(const GPTConfig& config, const RunShape& shape, const TensorParallelism& tp = {}, Comm* group = nullptr,
             Comm* cp_group = nullptr, bool ring_attention = false, const ModelPart& part = {});

    // inputs, targets [b, s] on the host (the data's order; under CP the whole
    // sequences, s = cp · shape.seq_len); returns the mean loss over the b·s tokens. training = false turns dropout off
    // (validation, sampling). Before each stage, parameters_needed(stage), where set: 0 the embeddings, l + 1 block l,
    // L + 1 the final LayerNorm and LM head, for the data-parallel gathers of the parameters that stage reads (§8).
    float forward(const int* inputs, const int* targets, const DropoutStep& draw, bool training = true,
                  const std::function<void(int stage)>& parameters_needed = {});
    // The last forward's loss of each position, into out [b, s] on the host
    // (the inputs' order). Every TP rank has them all; at cp = 1 only.
    void token_losses(float* out);
    // Accumulates into grads the gradient of dloss_scale · Σ token losses.
    // Uses the inputs and activations of the last forward; overwrites logits.
    // After block l's backward, grads_final(L − l), where set: block l's
    // gradients of the TP-sharded tensors are then final (in the step's last
    // micro-batch), for the data-parallel buckets to start (§8).
    void backward(float dloss_scale, const std::function<void(int stage)>& grads_final = {});
    // A pipeline's steps (docs/design.md §10): one model chunk's forward of
    // one micro-batch, and later its backward. Its blocks' activations are
    // kept in `block_set` (0 … part.block_sets − 1, any chunk's), what the
    // chunk keeps outside its blocks (the embeddings' mask, the head's
    // tensors), its tokens and its dropout draw in `slot` of the chunk's own
    // (0 … part.in_flight[chunk] − 1). forward_chunk's
    // input [s_local, b, h] is the chunk's input where it does not start the
    // model (what the previous stage sent), output where the chunk does not
    // end it (what goes to the next); inputs and targets as forward's; the mean
    // loss where the chunk ends the model, else 0. backward_chunk's
    // output_grad is dL/d(output) where the chunk does not end the model,
    // input_grad receives dL/d(input) where it does not start it.
    // forward() and backward() are the one chunk of the whole model in set and slot 0.
    float forward_chunk(int chunk, int slot, int block_set, const int* inputs, const int* targets,
                        const DropoutStep& draw, const Act* input, Act* output, bool training = true,
                        const std::function<void(int stage)>& parameters_needed = {});
    void backward_chunk(int chunk, int slot, int block_set, float dloss_scale, const Act* output_grad, Act* input_grad,
                        const std::function<void(int stage)>& grads_final = {});
    // The tied wte's gradient is two sums, kept apart through the step: the
    // LM head's (in grads.wte) and the embedding lookup's (in embedding_grad),
    // each over the micro-batches in order. Once per step, after the last
    // backward: grads.wte += embedding_grad. A pipeline's first and last
    // stage each hold one of the sums; they exchange them first (the trainer),
    // so that both add the same two and every layout gives the same bits.
    void add_embedding_grad();
    // Once per optimizer step, after the last backward: wte's two sums added
    // (add_embedding_grad), and under SP, where each rank saw only its tokens,
    // the replicated parameters' gradients summed over the TP group in one all-reduce.
    void finish_grads();
    void zero_grad();
    // GPT-2's initialisation: N(0, 0.02), residual projections N(0, 0.02/√(2L)),
    // biases 0, LayerNorm weights 1; the padded vocabulary rows stay 0. The
    // same full weights for any t: each rank keeps its shard.
    void init_random(uint64_t seed);
    // Σ grad² over this rank's tensors, sharded and replicated separately.
    void grad_square_sums(double* sharded, double* replicated) const;

    GPTConfig config;
    RunShape shape;
    TensorParallelism tp;
    ContextParallelism cp;                    // {1, 0} without context parallelism
    std::vector<TensorSpec> parameter_specs;  // names and shapes of this rank's shard, llm.c order
    int64_t num_parameters = 0;               // of this rank's shard
    ModelPart part;                           // the blocks it holds (all of them without a pipeline)
    ParameterTensors params{}, grads{};       // fp32 masters and their gradients, in the backend's memory
    float* embedding_grad = nullptr;          // [Vp/t, h] the embedding lookup's share of wte's gradient
    std::vector<BlockParameters> block_params, block_grads;  // each block's slice of them
    GemmWeights<Act> weights{};                        // what the GEMMs read (the GPU's bf16 copies; params on the CPU)
    std::vector<BlockGemmWeights<Act>> block_weights;  // each block's slice of them
    std::vector<BlockActivations<Act>> blocks;
    OutsideActivations<Act> outside{};
    Workspace<Act> workspace{};
    TokenBuffers tokens{};
    Arena param_arena, grad_arena, weight_arena, activation_arena, workspace_arena, token_arena, embedding_grad_arena;

private:
    // What one micro-batch of one chunk keeps besides its blocks' tables:
    // the tables outside the blocks, its tokens and its dropout draw.
    struct ChunkSlot {
        OutsideActivations<Act> outside{};
        TokenBuffers tokens{};
        DropoutStep draw;
        float dropout = 0.0f;
    };
    std::vector<std::vector<ChunkSlot>> slots_;                   // [chunk][slot]
    std::vector<std::vector<BlockActivations<Act>>> block_sets_;  // [set][a chunk's block]
    void use_set(int chunk, int slot, int block_set);             // points blocks, outside and tokens at them
    void upload_tokens(const int* inputs, const int* targets, bool first, bool last);  // into the chunk's slot
    int global_layer(int l) const { return part.layers[size_t(l)]; }                   // the dropout keys' layer
    void embeddings_forward(const DropoutStep& draw, float p);
    void embeddings_backward();
    void refresh_gemm_weights(int stage);
    void norm_forward(Act* out, const Act* inp, const float* weight, const float* bias);
    void branch_forward(Act* out, const Act* residual, Act* y, const float* bias, uint8_t* mask, float p,
                        const DropoutKey& key, int64_t batch_offset);
    void branch_backward(float* dbias, const uint8_t* mask);
    void norm_backward(float* dweight, float* dbias, const Act* dout, const Act* inp, const float* weight);
    void block_forward(int layer, Act* block_out, const DropoutStep& draw, float p);
    void self_attention_forward(int layer, const DropoutStep& draw, float p);
    void explicit_attention_forward(int layer, Act* out, const DropoutStep& draw, float p);
    void self_attention_backward(int layer);
    void self_attention_core_backward(int layer, Act* dqkv, const Act* dout);
    void block_backward(int layer);
    void recompute_runs_ending_at(int chunk_begin, int layer);
    void place_recomputed_tensors(std::vector<BlockActivations<Act>>& chunk_blocks, int chunk_layers);
    void classifier_forward();
    void classifier_backward(float dloss_scale);
    int local_seq() const { return tp.local_seq(shape.seq_len); }  // s/t under SP, s without
    int seq_start() const { return tp.seq_start(shape.seq_len); }  // first position of this rank's shard
    // this rank's shard of positions as runs of global positions (one without CP)
    ContextParallelism::PositionRuns position_runs() const {
        return cp.runs(seq_start(), local_seq(), attention_seq());
    }
    // what the attention core works on: every position (cp · seq_len), a/(t·cp) heads of h/(t·cp) channels
    // (a2a); under ring attention this rank's s/cp queries of a/t heads against every position
    int attention_seq() const { return shape.seq_len * cp.size; }
    int head_split() const { return cp.ring ? tp.size : tp.size * cp.size; }
    int attention_heads() const { return config.num_heads / head_split(); }
    int attention_channels() const { return config.channels / head_split(); }
    int head_group() const { return cp.ring ? tp.rank : tp.rank * cp.size + cp.rank; }  // this rank's heads, as a group
    int first_attention_head() const { return head_group() * attention_heads(); }
    bool cp_all_to_all() const { return cp.size > 1 && !cp.ring; }  // sp2hp / hp2sp around the core
    void ring_attention_forward(int layer, Act* out, const DropoutStep& draw, float p);
    // this rank's place in ring attention's layout (model/kernels/cpu_kernels.h)
    RingAttention ring_layout(int64_t batch_offset) const {
        return {shape.batch,
                shape.seq_len,
                attention_seq(),
                attention_channels(),
                attention_heads(),
                cp.chunk_len(attention_seq()),
                {cp.chunk_of(cp.rank, 0), cp.chunk_of(cp.rank, 1)},
                config.num_heads,
                first_attention_head(),
                batch_offset};
    }
    void ring_attention_backward(int layer, Act* dqkv, const Act* dout);
    Act* attention_input(int layer);                  // where the qkv linear writes
    float* parameter(const std::string& name) const;  // the fp32 tensor of that name
    Comm single_rank_group_;
    Comm* group_;
    TensorParallelMappings<Comm> mappings_;
    Comm* cp_group_ = nullptr;
    std::unique_ptr<ContextParallelMappings<Comm>> cp_qkv_, cp_out_;  // sp2hp / hp2sp of qkv and of the output
    std::unique_ptr<ParallelLinears<Comm, Act>> linears_;
    std::vector<int> host_row_targets_;  // [s, b], staged for the upload
    std::vector<int> host_cp_inputs_;    // [b, s/cp] under CP: this rank's positions of the inputs
    DropoutStep last_draw_;              // the last forward's draw and dropout probability, for backward
    float last_dropout_ = 0.0f;
    struct GemmWeightCopy {
        Act* copy;            // in weight_arena
        const float* master;  // in param_arena
        int64_t elements;
        int stage;  // the forward stage that reads it: l + 1 for layer l's slice, 0 for wte
    };
    std::vector<GemmWeightCopy> gemm_weight_copies_;  // empty where the GEMMs read the parameters
    std::vector<SquareSumRange> grad_norm_ranges_;    // every gradient tensor, sharded (0) or replicated (1)
    std::vector<BlockRun> recomputed_runs_;           // full recomputation's runs of a chunk's blocks
};

// The CPU model, which the trainer, the sampler and most tests use.
using GPT = GPTModel<CpuBackend>;
// The CPU model on a group of threads (the stand-in's tests).
using ThreadGroupGPT = GPTModel<CpuThreadGroupBackend>;

// Model FLOPs of one forward+backward per token (PaLM's 6N + 12·L·s·h, with
// N the parameters that take part in matmuls, the LM head included).
double model_flops_per_token(const GPTConfig& config, int seq_len);

}  // namespace tpsp
