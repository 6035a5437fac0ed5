// The GPT's tables, forward and backward, written once for both backends
// (gpt.h declares them). Kernels are called by name: the CPU ones
// (cpu_kernels.h) take fp32 activations, the CUDA ones (cuda_kernels.h)
// bf16, and overloading picks (model/kernels/kernels.h says which are in view).
//
// Included by gpt.cpp (the CPU model), gpt_cuda.cu (the CUDA model) and
// memory_report.cpp (the tables, for either dtype).
#pragma once
#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <vector>

#include "model/gpt.h"
#include "model/kernels/kernels.h"

namespace tpsp {

// ----------------------------------------------------------------------------
// tables

// A dimension split t ways: its size on one rank, named "3h/t" (or "3h" when t = 1).
inline Dim split_dim(int64_t full, const std::string& symbol, int t) {
    return {full / t, t > 1 ? symbol + "/t" : symbol};
}

template <class Act>
std::vector<TensorSpec> gemm_weight_table(const GPTConfig& c, int t, GemmWeights<Act>* w,
                                          std::vector<BlockGemmWeights<Act>>* blocks, const ModelPart* part) {
    Dim L{part ? part->num_layers() : c.num_layers, "L"}, h{c.channels, "h"};
    Dim Vp = split_dim(!part || part->holds_wte() ? c.padded_vocab_size : 0, "Vp", t);
    Dim h_t = split_dim(c.channels, "h", t);
    Dim h3_t = split_dim(3 * c.channels, "3h", t), h4_t = split_dim(4 * c.channels, "4h", t);
    using B = BlockGemmWeights<Act>;
    return {
        tensor("wte", {Vp, h}, &w->wte),
        layered_tensor("qkvw", L, {h3_t, h}, &w->qkvw, blocks, &B::qkvw),
        layered_tensor("qkvb", L, {h3_t}, &w->qkvb, blocks, &B::qkvb),
        layered_tensor("attprojw", L, {h, h_t}, &w->attprojw, blocks, &B::attprojw),
        layered_tensor("fcw", L, {h4_t, h}, &w->fcw, blocks, &B::fcw),
        layered_tensor("fcb", L, {h4_t}, &w->fcb, blocks, &B::fcb),
        layered_tensor("fcprojw", L, {h, h4_t}, &w->fcprojw, blocks, &B::fcprojw),
    };
}

// A dimension split again cp ways, for context parallelism: "a/t" → "a/t/cp".
inline Dim cp_split(const Dim& d, const ContextParallelism& cp) {
    return cp.size > 1 ? Dim{d.size / cp.size, d.symbol + "/cp"} : d;
}

// S', its dropout mask and S [b, a/t, s, s] of the explicit attention; at
// p = 0 only S' (S is S', and there is no mask). Under CP with a2a:
// [b, a/t/cp, s, s], every position for 1/cp of the heads; with ring
// attention [b, a/t, s/cp, s], this rank's queries against every key (held
// as [b, 2, a/t, s/(2cp), s]: its two chunks of queries, §9). The same
// elements either way: the paper's per-rank figure divided by cp.
template <class Act>
std::vector<TensorSpec> attention_scores_table(const GPTConfig& c, const RunShape& r, const TensorParallelism& tp,
                                               BlockActivations<Act>* a, const ContextParallelism& cp = {}) {
    Dim b{r.batch, "b"}, s{int64_t(r.seq_len) * cp.size, "s"};
    Dim heads = cp.ring ? split_dim(c.num_heads, "a", tp.size) : cp_split(split_dim(c.num_heads, "a", tp.size), cp);
    Dim rows = cp.ring ? Dim{r.seq_len, "s/cp"} : s;
    std::vector<TensorSpec> table = {tensor("softmax_out", {b, heads, rows, s}, &a->softmax_out)};
    if (r.dropout > 0.0f)
        table.insert(table.end(), {tensor("attn_dropout_mask", {b, heads, rows, s}, &a->attn_dropout_mask),
                                   tensor("attn_dropout_out", {b, heads, rows, s}, &a->attn_dropout_out)});
    return table;
}

// What one block keeps (`keeps`, from block_keeps()): its whole table, its
// input only, or nothing. The whole table is docs/design.md §2's, less what
// the run does not need: no dropout masks at p = 0, no S', mask or S under
// selective recomputation.
template <class Act>
std::vector<TensorSpec> block_activation_table(const GPTConfig& c, const RunShape& r, const TensorParallelism& tp,
                                               BlockActivations<Act>* a, BlockKeeps keeps,
                                               const ContextParallelism& cp) {
    const int t = tp.size;
    Dim b{r.batch, "b"}, s{r.seq_len, cp.size > 1 ? "s/cp" : "s"}, h{c.channels, "h"};
    Dim s_local = tp.sequence_parallel ? split_dim(r.seq_len, "s", t) : s;  // tp.local_seq, named
    Dim heads = split_dim(c.num_heads, "a", t), h_t = split_dim(c.channels, "h", t);
    Dim h3_t = split_dim(3 * c.channels, "3h", t), h4_t = split_dim(4 * c.channels, "4h", t);
    if (keeps == BlockKeeps::nothing) return {};
    std::vector<TensorSpec> table = {tensor("ln1_in", {s_local, b, h}, &a->ln1_in)};
    if (keeps == BlockKeeps::input_only) return table;
    const bool dropout = r.dropout > 0.0f;
    table.push_back(tensor("ln1_out", {s_local, b, h}, &a->ln1_out));
    if (cp.size > 1 && !cp.ring)  // as many elements, after sp2hp: every position, 1/cp of the heads
        table.push_back(tensor("qkv", {{int64_t(r.seq_len) * cp.size, "s"}, b, cp_split(h3_t, cp)}, &a->qkv));
    else table.push_back(tensor("qkv", {s, b, h3_t}, &a->qkv));
    if (c.attention == AttentionKernel::cudnn_fused) {
        table.push_back(tensor("softmax_stats", {b, heads, s}, &a->softmax_stats));
    } else if (keeps_attention_scores(c, r)) {
        const std::vector<TensorSpec> scores = attention_scores_table(c, r, tp, a, cp);
        table.insert(table.end(), scores.begin(), scores.end());
    } else if (cp.ring) {  // selective: each query row's log-sum-exp, as cuDNN's fused kernel keeps (§9)
        table.push_back(tensor("softmax_stats", {b, heads, s}, &a->softmax_stats));
    }
    table.push_back(tensor("attn_out", {s, b, h_t}, &a->attn_out));
    if (dropout) table.push_back(tensor("proj_dropout_mask", {s_local, b, h}, &a->proj_dropout_mask));
    table.push_back(tensor("ln2_in", {s_local, b, h}, &a->ln2_in));
    table.push_back(tensor("ln2_out", {s_local, b, h}, &a->ln2_out));
    table.push_back(tensor("gelu_in", {s, b, h4_t}, &a->gelu_in));
    table.push_back(tensor("gelu_out", {s, b, h4_t}, &a->gelu_out));
    if (dropout) table.push_back(tensor("fc2_dropout_mask", {s_local, b, h}, &a->fc2_dropout_mask));
    return table;
}

// The tables backward recomputes into, in the workspace: under selective
// recomputation one block's S', mask and S (every block's, one at a time);
// under full recomputation one whole table per block of the longest run,
// slot j for the run's block j, where slot 0 has no input (the run's first
// block keeps its own). Names are prefixed "recompute[j].".
template <class Act>
std::vector<TensorSpec> recompute_table(const GPTConfig& c, const RunShape& r, const TensorParallelism& tp, int slot,
                                        BlockActivations<Act>* a, const ContextParallelism& cp) {
    std::vector<TensorSpec> table;
    if (recomputes_attention_scores(c, r) && !cp.ring) table = attention_scores_table(c, r, tp, a, cp);
    if (r.recompute == Recompute::full) {
        table = block_activation_table(c, r, tp, a, BlockKeeps::whole_table, cp);
        if (slot == 0) table.erase(table.begin());  // ln1_in
    }
    for (TensorSpec& spec : table) spec.name = "recompute[" + std::to_string(slot) + "]." + spec.name;
    return table;
}

// The attention kernels' scratch in the workspace: the explicit kernels'
// (the backend's `explicit_scratch`), none for cuDNN's fused kernel, which keeps its own.
inline Dim attention_scratch_for(const GPTConfig& c, const Dim& explicit_scratch) {
    return c.attention == AttentionKernel::cudnn_fused ? Dim{0, "cuDNN's own"} : explicit_scratch;
}

template <class Act>
std::vector<TensorSpec> outside_activation_table(const GPTConfig& c, const RunShape& r, const TensorParallelism& tp,
                                                 OutsideActivations<Act>* a, bool embeddings, bool head) {
    Dim b{r.batch, "b"}, s{r.seq_len, "s"}, h{c.channels, "h"};
    Dim s_local = tp.sequence_parallel ? split_dim(r.seq_len, "s", tp.size) : s;
    std::vector<TensorSpec> table;
    if (r.dropout > 0.0f && embeddings)
        table.push_back(tensor("embedding_dropout_mask", {s_local, b, h}, &a->embedding_dropout_mask));
    if (!head) return table;
    const std::vector<TensorSpec> rest = {
        tensor("lnf_in", {s_local, b, h}, &a->lnf_in),
        tensor("lnf_out", {s_local, b, h}, &a->lnf_out),
        tensor("logits", {s, b, split_dim(c.padded_vocab_size, "Vp", tp.size)}, &a->logits),
        tensor("losses", {s, b}, &a->losses),
        tensor("lse", {s, b}, &a->lse),
    };
    table.insert(table.end(), rest.begin(), rest.end());
    return table;
}

// Elements of the replicated parameters a part holds (packed for their one all-reduce).
int64_t replicated_parameter_elements(const GPTConfig& c, const ModelPart& part);

template <class Act>
std::vector<TensorSpec> workspace_table(const GPTConfig& c, const RunShape& r, const TensorParallelism& tp,
                                        const Dim& attention_scratch, Workspace<Act>* w, const ContextParallelism& cp,
                                        const ModelPart* part) {
    const int t = tp.size;
    Dim b{r.batch, "b"}, s{r.seq_len, cp.size > 1 ? "s/cp" : "s"}, h{c.channels, "h"};
    Dim cp_s = cp.size > 1 && !cp.ring ? s : Dim{0, "no a2a"};  // the all-to-all buffers' rows
    Dim ring_s = cp.ring ? s : Dim{0, "no ring"};               // ring attention's
    Dim s_local = tp.sequence_parallel ? split_dim(r.seq_len, "s", t) : s;
    bool packs_replicated = tp.sequence_parallel_active();
    bool overlapped_rs = packs_replicated && (tp.overlap.rs || tp.overlap.rs_dgrad);
    std::vector<TensorSpec> table = {
        tensor("stream_grad", {s_local, b, h}, &w->stream_grad),
        tensor("branch", {s_local, b, h}, &w->branch),
        tensor("local_grad", {s_local, b, h}, &w->local_grad),
        tensor("gathered", {s, b, h}, &w->gathered),
        tensor("partial", {s, b, h}, &w->partial),
        tensor("attn_grad", {s, b, split_dim(c.channels, "h", t)}, &w->attn_grad),
        tensor("wide_grad", {s, b, split_dim(4 * c.channels, "4h", t)}, &w->wide_grad),
        tensor("ln_stats", {{2, "2"}, s_local, b}, &w->ln_stats),
        tensor("vocab_stats", {{3, "3"}, s, b}, &w->vocab_stats),
        tensor("attention_scratch", {attention_scratch}, &w->attention_scratch),
        tensor("replicated_grads",
               {{packs_replicated ? replicated_parameter_elements(c, part ? *part : whole_model(c)) : 0, "replicated"}},
               &w->replicated_grads),
        tensor("rs_scratch", {{overlapped_rs ? 3 : 0, "3"}, s_local, b, h}, &w->rs_scratch),
        tensor("cp_qkv", {cp_s, b, split_dim(3 * c.channels, "3h", t)}, &w->cp_qkv),
        tensor("cp_out", {cp_s, b, split_dim(c.channels, "h", t)}, &w->cp_out),
        tensor("cp_send", {cp_s, b, split_dim(3 * c.channels, "3h", t)}, &w->cp_send),
        tensor("cp_receive", {cp_s, b, split_dim(3 * c.channels, "3h", t)}, &w->cp_receive),
        tensor("ring_kv", {{2, "2"}, ring_s, b, split_dim(2 * c.channels, "2h", t)}, &w->ring_kv),
        tensor("ring_dkv", {{4, "4"}, ring_s, b, split_dim(2 * c.channels, "2h", t)}, &w->ring_dkv),
        tensor("ring_stats", {{2, "2"}, b, split_dim(c.num_heads, "a", t), ring_s}, &w->ring_stats),
    };
    w->recompute.assign(size_t(recompute_slots(c, r)), BlockActivations<Act>{});
    for (int slot = 0; slot < int(w->recompute.size()); slot++) {
        const std::vector<TensorSpec> recomputed = recompute_table(c, r, tp, slot, &w->recompute[size_t(slot)], cp);
        table.insert(table.end(), recomputed.begin(), recomputed.end());
    }
    return table;
}

// ----------------------------------------------------------------------------
// construction

template <class Backend>
GPTModel<Backend>::GPTModel(const GPTConfig& c, const RunShape& r, const TensorParallelism& t, Comm* group,
                            Comm* cp_group, bool ring_attention, const ModelPart& model_part)
    : config(c), shape(r), tp(t), cp{cp_group ? cp_group->size() : 1, cp_group ? cp_group->rank() : 0,
                                     ring_attention && cp_group && cp_group->size() > 1},
      group_(group ? group : &single_rank_group_), mappings_(group_, t.sequence_parallel_active()),
      cp_group_(cp_group) {
    part = model_part.layers.empty() ? whole_model(config) : model_part;
    if (group_->size() != tp.size || group_->rank() != tp.rank)
        throw std::logic_error("GPT: the communicator does not match the tensor-parallel layout");
    if (cp.size > 1) {
        if (config.attention == AttentionKernel::cudnn_fused && cp.ring)
            throw std::invalid_argument(
                "model.attention: cudnn runs under context parallelism's a2a only (p2p's "
                "ring merges the blocks by statistics the explicit kernels keep)");
        if (config.num_heads % head_split() != 0 || shape.seq_len % (2 * tp.size) != 0)
            throw std::logic_error("GPT: the context-parallel layout does not divide the heads or the positions");
        if (attention_seq() > config.max_seq_len)
            throw std::logic_error("GPT: under context parallelism the shape is a CP rank's: cp · seq_len = " +
                                   std::to_string(attention_seq()) + " positions, more than max_seq_len");
    }
    if (cp_all_to_all()) {
        const int qkv_heads = config.num_heads / tp.size, head_size = config.channels / config.num_heads;
        cp_qkv_ = std::make_unique<ContextParallelMappings<Comm>>(cp_group_, 3, qkv_heads, head_size, attention_seq(),
                                                                  shape.batch);
        cp_out_ = std::make_unique<ContextParallelMappings<Comm>>(cp_group_, 1, qkv_heads, head_size, attention_seq(),
                                                                  shape.batch);
    }
    // a pipeline's model chunk, as the tables see it: its blocks are "L" (they all hold as many)
    GPTConfig chunk_config = config;
    chunk_config.num_layers = part.chunks[0].end - part.chunks[0].begin;
    if (shape.recompute == Recompute::full &&
        (shape.recompute_layers < 1 || shape.recompute_layers > chunk_config.num_layers))
        throw std::invalid_argument("model.recompute_layers: " + std::to_string(shape.recompute_layers) +
                                    " blocks to recompute; full recomputation takes 1 to the blocks of a model "
                                    "chunk (" +
                                    std::to_string(chunk_config.num_layers) + ")");
    if (config.attention == AttentionKernel::cudnn_fused && !Backend::has_fused_attention)
        throw std::invalid_argument(
            "model.attention: cudnn is cuDNN's fused attention: it needs the GPU backend "
            "built with cuDNN");
    const Memory& memory = Backend::memory();
    parameter_specs = parameter_table(config, tp.size, part, &params, &block_params);
    param_arena = Arena(parameter_specs, memory);
    grad_arena = Arena(parameter_table(config, tp.size, part, &grads, &block_grads), memory);
    const int64_t wte_rows = part.holds_wte() ? config.padded_vocab_size / tp.size : 0;
    embedding_grad_arena = Arena(
        {tensor("embedding_grad", {{wte_rows, "Vp/t"}, {config.channels, "h"}}, &embedding_grad)}, memory);
    num_parameters = int64_t(param_arena.bytes() / sizeof(float));
    int64_t offset = 0;  // of each gradient tensor in grads
    for (const TensorSpec& p : parameter_specs) {
        grad_norm_ranges_.push_back({offset, p.elements(), parameter_is_replicated(p.name) ? 1 : 0});
        offset += p.elements();
    }
    std::vector<TensorSpec> weight_table = gemm_weight_table(config, tp.size, &weights, &block_weights, &part);
    if constexpr (Backend::copies_gemm_weights) {
        // each bf16 copy beside the fp32 parameter of its name, for refresh_gemm_weights
        weight_arena = Arena(weight_table, memory);
        Act* copy = static_cast<Act*>(weight_arena.data());  // one dtype: the arena keeps the table's order
        for (const TensorSpec& w : weight_table) {
            const bool layered = w.shape.size() > 1 && w.shape[0].symbol == "L";
            const int64_t slices = layered ? w.shape[0].size : 1, slice = w.elements() / slices;
            for (int64_t l = 0; l < slices; l++)  // one copy per layer: forward casts it when it reaches the layer
                gemm_weight_copies_.push_back(
                    {copy + l * slice, parameter(w.name) + l * slice, slice, layered ? int(l) + 1 : 0});
            copy += w.elements();
        }
    } else {
        for (const TensorSpec& w : weight_table) w.place(parameter(w.name));  // the GEMMs read the parameters
    }

    // the blocks' activation sets, one per micro-batch in flight (chunks together; one without a
    // pipeline), and each chunk's slots of what it keeps outside its blocks
    std::vector<TensorSpec> activations, token_tables;
    block_sets_.assign(size_t(part.block_sets), std::vector<BlockActivations<Act>>(size_t(chunk_config.num_layers)));
    for (std::vector<BlockActivations<Act>>& set : block_sets_)
        for (int l = 0; l < chunk_config.num_layers; l++) {
            std::vector<TensorSpec> table = block_activation_table(config, shape, tp, &set[size_t(l)],
                                                                   block_keeps(shape, chunk_config.num_layers, l), cp);
            activations.insert(activations.end(), table.begin(), table.end());
        }
    slots_.resize(part.chunks.size());
    for (size_t chunk = 0; chunk < part.chunks.size(); chunk++) {
        const bool first = chunk == 0 && part.embeddings, last = chunk + 1 == part.chunks.size() && part.head;
        slots_[chunk].resize(size_t(part.in_flight[chunk]));
        for (ChunkSlot& slot : slots_[chunk]) {
            std::vector<TensorSpec> outside_table = outside_activation_table(config, shape, tp, &slot.outside, first,
                                                                             last);
            activations.insert(activations.end(), outside_table.begin(), outside_table.end());
            std::vector<TensorSpec> token_rows = token_table(shape, &slot.tokens);
            token_tables.insert(token_tables.end(), token_rows.begin(), token_rows.end());
        }
    }
    activation_arena = Arena(activations, memory);
    const Dim scratch = attention_scratch_for(
        config, cp.ring ? Backend::ring_attention_scratch(shape.batch, shape.seq_len, config.channels, config.num_heads,
                                                          head_split())
                        : Backend::attention_scratch(shape.batch, attention_seq(), config.channels, config.num_heads,
                                                     head_split()));
    workspace_arena = Arena(workspace_table(chunk_config, shape, tp, scratch, &workspace, cp, &part), memory);
    token_arena = Arena(token_tables, memory);
    recomputed_runs_ = recomputed_runs(shape, chunk_config.num_layers);
    for (std::vector<BlockActivations<Act>>& set : block_sets_) place_recomputed_tensors(set, chunk_config.num_layers);
    blocks.resize(size_t(part.num_layers()));
    for (int chunk = int(part.chunks.size()) - 1; chunk >= 0; chunk--) use_set(chunk, 0, 0);
    host_row_targets_.resize(size_t(shape.batch) * shape.seq_len);
    linears_ = std::make_unique<ParallelLinears<Comm, Act>>(group_, tp, shape.seq_len * shape.batch,
                                                            local_seq() * shape.batch, workspace.rs_scratch);
}

// Points what one chunk's blocks do not keep at the workspace's recompute
// tables: under selective recomputation every block's S', mask and S at the
// one set; under full recomputation each run's blocks at the slots, block j
// of the run at slot j, and its first block's input at the input it keeps.
template <class Backend>
void GPTModel<Backend>::place_recomputed_tensors(std::vector<BlockActivations<Act>>& chunk_blocks, int chunk_layers) {
    if (recomputes_attention_scores(config, shape)) {
        const BlockActivations<Act>& scores = workspace.recompute[0];
        for (BlockActivations<Act>& block : chunk_blocks) {
            block.softmax_out = scores.softmax_out;
            block.attn_dropout_mask = scores.attn_dropout_mask;
            block.attn_dropout_out = scores.attn_dropout_out;
        }
    }
    for (const BlockRun& run : recomputed_runs(shape, chunk_layers)) {
        for (int l = run.begin; l < run.end; l++) {
            Act* kept_input = chunk_blocks[size_t(l)].ln1_in;
            chunk_blocks[size_t(l)] = workspace.recompute[size_t(l - run.begin)];
            if (l == run.begin) chunk_blocks[size_t(l)].ln1_in = kept_input;
        }
    }
}

// The model's code reads blocks[l], outside and tokens: the set's and the slot's, from here on.
template <class Backend>
void GPTModel<Backend>::use_set(int chunk, int slot, int block_set) {
    const std::vector<BlockActivations<Act>>& set = block_sets_[size_t(block_set)];
    std::copy(set.begin(), set.end(), blocks.begin() + part.chunks[size_t(chunk)].begin);
    const ChunkSlot& s = slots_[size_t(chunk)][size_t(slot)];
    outside = s.outside;
    tokens = s.tokens;
    last_draw_ = s.draw;
    last_dropout_ = s.dropout;
}

template <class Backend>
float* GPTModel<Backend>::parameter(const std::string& name) const {
    int64_t at = 0;  // one dtype: the arena keeps the table's order
    for (const TensorSpec& p : parameter_specs) {
        if (p.name == name) return params.wte + at;
        at += p.elements();
    }
    throw std::logic_error("GPT: no parameter named " + name);
}

template <class Backend>
void GPTModel<Backend>::zero_grad() {
    ComputeSpan span(group_->tracer, "zero gradients");
    Backend::zero(grad_arena.data(), grad_arena.bytes());
    Backend::zero(embedding_grad_arena.data(), embedding_grad_arena.bytes());
}

// The full model's weights from the seed, as at t = 1 (gpt.cpp).
std::vector<float> initial_full_parameters(const GPTConfig& config, uint64_t seed);

template <class Backend>
void GPTModel<Backend>::init_random(uint64_t seed) {
    std::vector<float> full = initial_full_parameters(config, seed);
    std::vector<float> shard(static_cast<size_t>(num_parameters));
    copy_parameter_shards(config, tp.size, tp.rank, part, full.data(), shard.data(), ShardDirection::full_to_shard);
    Backend::upload(params.wte, shard.data(), shard.size() * sizeof(float));
}

// ----------------------------------------------------------------------------
// forward

// Dropout boxes: where this rank's tensors sit in the global ones, whose
// element order is [B_global, s, h] for token tensors and
// [B_global, a, s, s] for attention probabilities.
inline DropoutBox token_box(int s_local, int B, int S, int C, int seq_start, int64_t batch_offset) {
    return {s_local, B, C, C, int64_t(S) * C, seq_start, batch_offset};
}

inline DropoutBox probs_box(int B, int heads_local, int heads, int S, int head_start, int64_t batch_offset) {
    int64_t ss = int64_t(S) * S;
    return {B, heads_local, ss, heads * ss, ss, batch_offset, head_start};
}

// On the GPU: the bf16 copies of the GEMM weights that forward stage `stage`
// reads, from the fp32 master weights. Stage by stage, so that with
// parallel.overlap_param_gather a layer's copy is made only once its
// parameters have arrived.
template <class Backend>
void GPTModel<Backend>::refresh_gemm_weights(int stage) {
    if constexpr (Backend::copies_gemm_weights) {
        ComputeSpan span(group_->tracer, "weights to bf16");
        for (const GemmWeightCopy& c : gemm_weight_copies_)
            if (c.stage == stage) Backend::cast(c.copy, c.master, c.elements);
    }
}

// cuDNN's dropout seed for one layer of one forward: Philox of (step,
// layer, micro-batch, head group) under the run's seed, so it differs for
// every one of them (a rank's heads are its own: its group is its TP rank,
// under CP's a2a tp_rank · cp + cp_rank).
inline uint64_t fused_attention_seed(const DropoutStep& draw, int layer, int head_group) {
    const PhiloxCounter bits = philox4x32_10(
        {draw.step, uint32_t(layer), uint32_t(draw.batch_offset), uint32_t(head_group)},
        {uint32_t(draw.seed), uint32_t(draw.seed >> 32)});
    return uint64_t(bits[0]) | uint64_t(bits[1]) << 32;
}

// Where the qkv linear writes: the block's qkv, or under CP's a2a the
// scratch that sp2hp then turns into the block's (head-sharded) qkv.
template <class Backend>
typename GPTModel<Backend>::Act* GPTModel<Backend>::attention_input(int l) {
    return cp_all_to_all() ? workspace.cp_qkv : blocks[l].qkv;
}

// Causal self-attention of this rank's a/t heads: qkv → attn_out. Under CP
// (§9) with a2a: sp2hp gives every position for a/(t·cp) heads, the core runs
// on them, and hp2sp brings the output back to this rank's positions; with
// ring attention this rank's queries meet every K/V block as it passes.
template <class Backend>
void GPTModel<Backend>::self_attention_forward(int l, const DropoutStep& draw, float p) {
    const int B = shape.batch, T = attention_seq(), Ct = attention_channels(), heads = attention_heads();
    BlockActivations<Act>& a = blocks[l];
    Workspace<Act>& w = workspace;
    if (cp.ring) {
        ring_attention_forward(l, a.attn_out, draw, p);
        return;
    }
    if (cp.size > 1) {
        ComputeSpan span(group_->tracer, "sp2hp");
        cp_qkv_->sequence_to_heads(w.cp_qkv, a.qkv, w.cp_send, w.cp_receive);
    }
    {
        ComputeSpan span(group_->tracer, "attention");
        Act* out = cp.size > 1 ? w.cp_out : a.attn_out;
        if constexpr (Backend::has_fused_attention) {
            if (config.attention == AttentionKernel::cudnn_fused)
                fused_attention_forward(out, a.softmax_stats, a.qkv, B, T, Ct, heads, p,
                                        fused_attention_seed(draw, global_layer(l), head_group()));
        }
        if (config.attention != AttentionKernel::cudnn_fused) explicit_attention_forward(l, out, draw, p);
    }
    if (cp.size > 1) {
        ComputeSpan span(group_->tracer, "hp2sp");
        cp_out_->heads_to_sequence(w.cp_out, a.attn_out, w.cp_send, w.cp_receive);
    }
}

// The explicit kernels: out = S·V, writing the block's S', mask and S (its
// own, or under selective recomputation the workspace's one set).
template <class Backend>
void GPTModel<Backend>::explicit_attention_forward(int l, Act* out, const DropoutStep& draw, float p) {
    const int B = shape.batch, T = attention_seq(), Ct = attention_channels(), heads = attention_heads();
    BlockActivations<Act>& a = blocks[l];
    attention_forward(out, a.softmax_out, a.attn_dropout_mask, a.attn_dropout_out, a.qkv, workspace.attention_scratch,
                      B, T, Ct, heads, p,
                      probs_box(B, heads, config.num_heads, T, first_attention_head(), draw.batch_offset),
                      {draw.seed, draw.step, uint32_t(global_layer(l)), DropoutSite::attention_probs});
}

// Ring attention (§9): this rank's own K|V block is copied out of qkv and
// sent around the CP ring (parallel/overlap.h); as each block arrives, the
// rank's queries meet it, one sequence of the micro-batch at a time, the
// transfers polled in between. S', its mask and S are this rank's rows of
// the explicit kernels'; under selective recomputation none is kept, only
// each row's log-sum-exp, from which backward recomputes them block by block.
template <class Backend>
void GPTModel<Backend>::ring_attention_forward(int l, Act* out, const DropoutStep& draw, float p) {
    const int B = shape.batch, T = shape.seq_len, Ct = attention_channels();
    const RingAttention ra = ring_layout(draw.batch_offset);
    const DropoutKey key{draw.seed, draw.step, uint32_t(global_layer(l)), DropoutSite::attention_probs};
    BlockActivations<Act>& a = blocks[l];
    Workspace<Act>& w = workspace;
    const size_t block = size_t(T) * B * 2 * Ct;
    cp_group_->copy_rows(w.ring_kv, 2 * Ct, a.qkv + Ct, 3 * Ct, size_t(T) * B, 2 * Ct);  // K | V
    ring_attention_start(out, w.ring_stats, ra, w.attention_scratch);
    ring_pass_overlapped(*cp_group_, w.ring_kv, w.ring_kv + block, block,
                         [&](int source, const Act* kv, const auto& poll) {
                             ComputeSpan span(group_->tracer, "ring attention");
                             const int chunks[2] = {cp.chunk_of(source, 0), cp.chunk_of(source, 1)};
                             for (int b = 0; b < B; b++) {
                                 ring_attention_forward_block(out, w.ring_stats, a.softmax_out, a.qkv, kv, chunks, ra,
                                                              b, p, key, w.attention_scratch);
                                 poll();
                                 background_transfers.poll();  // the DP buckets', where in flight
                             }
                         });
    ComputeSpan span(group_->tracer, "ring attention");
    ring_attention_finish(out, a.softmax_out, a.attn_dropout_mask, a.attn_dropout_out, a.softmax_stats, w.ring_stats,
                          ra, p, key, w.attention_scratch);
}

// Backward: the K|V blocks go round again and each block's dK|dV follows,
// gathering every rank's part on its way home; dQ stays here.
template <class Backend>
void GPTModel<Backend>::ring_attention_backward(int l, Act* dqkv, const Act* dout) {
    const int B = shape.batch, T = shape.seq_len, Ct = attention_channels();
    const RingAttention ra = ring_layout(last_draw_.batch_offset);
    const float p = last_dropout_;
    const DropoutKey key{last_draw_.seed, last_draw_.step, uint32_t(global_layer(l)), DropoutSite::attention_probs};
    const BlockActivations<Act>& a = blocks[l];
    Workspace<Act>& w = workspace;
    const size_t block = size_t(T) * B * 2 * Ct;
    {
        ComputeSpan span(group_->tracer, "ring attention backward");
        cp_group_->copy_rows(w.ring_kv, 2 * Ct, a.qkv + Ct, 3 * Ct, size_t(T) * B, 2 * Ct);
        ring_attention_backward_start(w.ring_stats, dqkv, dout, a.attn_out, ra, w.attention_scratch);
    }
    Act* home = w.ring_dkv + 3 * block;
    ring_pass_with_gradients_overlapped(*cp_group_, w.ring_kv, w.ring_kv + block, w.ring_dkv, w.ring_dkv + block, home,
                                        block, [&](int source, const Act* kv, Act* partial, const auto& poll) {
                                            ComputeSpan span(group_->tracer, "ring attention backward");
                                            const int chunks[2] = {cp.chunk_of(source, 0), cp.chunk_of(source, 1)};
                                            Backend::zero(partial, block * sizeof(Act));
                                            for (int b = 0; b < B; b++) {
                                                ring_attention_backward_block(
                                                    dqkv, partial, dout, a.qkv, kv, a.softmax_out, a.attn_dropout_mask,
                                                    a.attn_dropout_out, a.softmax_stats, w.ring_stats, chunks, ra, b, p,
                                                    key, w.attention_scratch);
                                                poll();
                                                background_transfers.poll();  // the DP buckets' (backward starts them)
                                            }
                                        });
    cp_group_->copy_rows(dqkv + Ct, 3 * Ct, home, 2 * Ct, size_t(T) * B, 2 * Ct);  // dK | dV
    ring_attention_backward_finish(dqkv, w.attention_scratch, ra);                 // dQ
}

// dL/d(qkv) into workspace.wide_grad from dL/d(attn_out) in workspace.attn_grad.
// Under CP the gradient takes the mappings' way back: sp2hp of dL/d(attn_out)
// (hp2sp's backward), the core's backward, hp2sp of dL/d(qkv) (sp2hp's).
template <class Backend>
void GPTModel<Backend>::self_attention_backward(int l) {
    Workspace<Act>& w = workspace;
    if (cp.ring) {
        self_attention_core_backward(l, w.wide_grad, w.attn_grad);
        return;
    }
    if (cp.size > 1) {
        ComputeSpan span(group_->tracer, "hp2sp backward");
        cp_out_->sequence_to_heads(w.attn_grad, w.cp_out, w.cp_send, w.cp_receive);
    }
    self_attention_core_backward(l, cp.size > 1 ? w.cp_qkv : w.wide_grad, cp.size > 1 ? w.cp_out : w.attn_grad);
    if (cp.size > 1) {
        ComputeSpan span(group_->tracer, "sp2hp backward");
        cp_qkv_->heads_to_sequence(w.cp_qkv, w.wide_grad, w.cp_send, w.cp_receive);
    }
}

// dL/d(qkv) into dqkv from dL/d(the core's output) in dout, both as the core sees them.
template <class Backend>
void GPTModel<Backend>::self_attention_core_backward(int l, Act* dqkv, const Act* dout) {
    const int B = shape.batch, T = attention_seq(), Ct = attention_channels(), heads = attention_heads();
    const float p = last_dropout_;
    const BlockActivations<Act>& a = blocks[l];
    Workspace<Act>& w = workspace;
    if constexpr (Backend::has_fused_attention) {
        if (config.attention == AttentionKernel::cudnn_fused) {
            // cuDNN's backward reads the output O as the core wrote it; under CP's a2a the block
            // keeps it after hp2sp, at its positions: one more sp2hp brings it back into the
            // heads' layout, in `partial` (free here), rather than keep both (§9)
            const Act* out = a.attn_out;
            if (cp.size > 1) {
                ComputeSpan span(group_->tracer, "sp2hp of the attention output");
                cp_out_->sequence_to_heads(a.attn_out, w.partial, w.cp_send, w.cp_receive);
                out = w.partial;
            }
            ComputeSpan span(group_->tracer, "attention backward");
            fused_attention_backward(dqkv, dout, a.qkv, out, a.softmax_stats, B, T, Ct, heads, p,
                                     fused_attention_seed(last_draw_, global_layer(l), head_group()));
            return;
        }
    }
    if (cp.ring) {  // under selective recomputation each block's S' comes back from the rows' log-sum-exp
        ring_attention_backward(l, dqkv, dout);
        return;
    }
    if (recomputes_attention_scores(config, shape)) {
        // selective recomputation: S', the mask and S again, from the saved qkv and the
        // same Philox keys, so the same bits; S·V goes to scratch (partial is free here)
        ComputeSpan span(group_->tracer, "attention recompute");
        explicit_attention_forward(l, w.partial, last_draw_, p);
    }
    ComputeSpan span(group_->tracer, "attention backward");
    attention_backward(dqkv, dout, a.qkv, a.softmax_out, a.attn_dropout_mask, a.attn_dropout_out, w.attention_scratch,
                       B, T, Ct, heads, p);
}

// LayerNorm over this rank's rows [s/t·b, h] (all s·b rows without SP).
template <class Backend>
void GPTModel<Backend>::norm_forward(Act* out, const Act* inp, const float* weight, const float* bias) {
    ComputeSpan span(group_->tracer, "layernorm");
    layernorm_forward(out, inp, weight, bias, local_seq() * shape.batch, config.channels);
}

// A residual branch's end: out = residual + dropout(y + bias); y is scratch.
// The masks are keyed by global position: one call per run of them (§9).
template <class Backend>
void GPTModel<Backend>::branch_forward(Act* out, const Act* residual, Act* y, const float* bias, uint8_t* mask, float p,
                                       const DropoutKey& key, int64_t batch_offset) {
    const int B = shape.batch, C = config.channels;
    ComputeSpan span(group_->tracer, "bias, dropout, residual");
    const ContextParallelism::PositionRuns runs = position_runs();
    for (int i = 0; i < runs.count; i++) {
        const ContextParallelism::PositionRun& run = runs.run[i];
        const size_t at = size_t(run.offset) * B * C;
        bias_dropout_residual_forward(out + at, mask ? mask + at : nullptr, y + at, residual + at, bias,
                                      token_box(run.count, B, attention_seq(), C, run.global_start, batch_offset), p,
                                      key);
    }
}

template <class Backend>
void GPTModel<Backend>::block_forward(int l, Act* block_out, const DropoutStep& draw, float p) {
    const int C = config.channels, t = tp.size;
    const int Ct = C / t, hidden = 4 * C / t;
    const BlockParameters& param = block_params[l];
    const BlockGemmWeights<Act>& weight = block_weights[l];
    BlockActivations<Act>& a = blocks[l];
    Workspace<Act>& w = workspace;
    auto key = [&](DropoutSite site) { return DropoutKey{draw.seed, draw.step, uint32_t(global_layer(l)), site}; };

    // attention half: ln2_in = ln1_in + dropout(ḡ(proj(attention(qkv(g(ln1(ln1_in)))))) + bias)
    norm_forward(a.ln1_out, a.ln1_in, param.ln1w, param.ln1b);
    linears_->column_forward("qkv", attention_input(l), a.ln1_out, w.gathered, weight.qkvw, weight.qkvb, C, 3 * Ct);
    self_attention_forward(l, draw, p);
    Act* y = linears_->row_forward("attention proj", a.attn_out, w.partial, w.branch, weight.attprojw, Ct, C);
    branch_forward(a.ln2_in, a.ln1_in, y, param.attprojb, a.proj_dropout_mask, p, key(DropoutSite::attention_proj),
                   draw.batch_offset);

    // MLP half: block_out = ln2_in + dropout(ḡ(fc2(gelu(fc1(g(ln2(ln2_in)))))) + bias)
    norm_forward(a.ln2_out, a.ln2_in, param.ln2w, param.ln2b);
    linears_->column_forward("fc1 + gelu", a.gelu_out, a.ln2_out, w.gathered, weight.fcw, weight.fcb, C, hidden,
                             a.gelu_in);
    y = linears_->row_forward("fc2", a.gelu_out, w.partial, w.branch, weight.fcprojw, hidden, C);
    branch_forward(block_out, a.ln2_in, y, param.fcprojb, a.fc2_dropout_mask, p, key(DropoutSite::mlp_fc2),
                   draw.batch_offset);
}

// Final LayerNorm, the column-parallel LM head and the vocabulary-parallel
// cross-entropy: the full logits never exist on one rank.
template <class Backend>
void GPTModel<Backend>::classifier_forward() {
    const int C = config.channels, N = shape.seq_len * shape.batch;
    const int Vp_local = config.padded_vocab_size / tp.size, vocab_start = tp.rank * Vp_local;
    const int V_real = std::max(0, std::min(Vp_local, config.vocab_size - vocab_start));
    norm_forward(outside.lnf_out, outside.lnf_in, params.lnfw, params.lnfb);
    linears_->column_forward("lm head", outside.logits, outside.lnf_out, workspace.gathered,
                             GemmWeight<Act>{weights.wte}, GemmWeight<Act>{}, C, Vp_local);

    float* maxes = workspace.vocab_stats;
    float* stats = workspace.vocab_stats + N;  // Σ exp [N], then the target logit [N]
    {
        ComputeSpan span(group_->tracer, "cross-entropy");
        crossentropy_max_forward(maxes, outside.logits, N, V_real, Vp_local);
    }
    group_->all_reduce_max(maxes, size_t(N));
    {
        ComputeSpan span(group_->tracer, "cross-entropy");
        crossentropy_sum_forward(stats, outside.logits, maxes, tokens.row_targets, vocab_start, N, V_real, Vp_local);
    }
    group_->all_reduce_sum(stats, size_t(2) * N);
    ComputeSpan span(group_->tracer, "cross-entropy");
    Backend::finish_losses(outside.losses, outside.lse, maxes, stats, N);
}

template <class Backend>
float GPTModel<Backend>::forward(const int* inputs, const int* targets, const DropoutStep& draw, bool training,
                                 const std::function<void(int stage)>& parameters_needed) {
    return forward_chunk(0, 0, 0, inputs, targets, draw, nullptr, nullptr, training, parameters_needed);
}

// Vocabulary-parallel embedding: each rank looks up the tokens it holds, ḡ
// sums them (into this rank's sequence shard); then positions and dropout,
// into the first block's input.
template <class Backend>
void GPTModel<Backend>::embeddings_forward(const DropoutStep& draw, float p) {
    const int B = shape.batch, T = shape.seq_len, C = config.channels, N = T * B;
    const int Vp_local = config.padded_vocab_size / tp.size;
    Workspace<Act>& w = workspace;
    {
        ComputeSpan span(group_->tracer, "embeddings");
        token_embedding_forward(w.partial, tokens.inputs, params.wte, tp.rank * Vp_local, Vp_local, B, T, C);
    }
    Act* x = mappings_.gbar_forward(w.partial, w.branch, size_t(N) * C);
    ComputeSpan span(group_->tracer, "embeddings");
    const ContextParallelism::PositionRuns runs = position_runs();  // global positions (§9)
    for (int i = 0; i < runs.count; i++) {
        const ContextParallelism::PositionRun& run = runs.run[i];
        const size_t at = size_t(run.offset) * B * C;
        uint8_t* mask = outside.embedding_dropout_mask;
        position_embedding_forward(x + at, params.wpe, run.global_start, run.count, B, C);
        dropout_forward(blocks[0].ln1_in + at, mask ? mask + at : nullptr, x + at,
                        token_box(run.count, B, attention_seq(), C, run.global_start, draw.batch_offset), p,
                        {draw.seed, draw.step, 0, DropoutSite::embedding});
    }
}

// This micro-batch's tokens into the chunk's slot: the inputs where the
// chunk holds the embeddings, the targets (in the activations' row order,
// [s, b]) where it holds the loss; under CP this rank's positions of the
// whole sequences [b, cp·T].
template <class Backend>
void GPTModel<Backend>::upload_tokens(const int* inputs, const int* targets, bool first, bool last) {
    const int B = shape.batch, T = shape.seq_len, N = T * B;
    if (cp.size > 1) {
        const int S = attention_seq();
        host_cp_inputs_.resize(size_t(N));
        for (int b = 0; b < B; b++)
            for (int t = 0; t < T; t++) {
                const int at = b * S + cp.global_position(t, S);
                host_cp_inputs_[size_t(b) * T + t] = inputs[at];
                host_row_targets_[size_t(t) * B + b] = targets[at];
            }
        inputs = host_cp_inputs_.data();
    } else {
        for (int b = 0; b < B; b++)
            for (int t = 0; t < T; t++) host_row_targets_[size_t(t) * B + b] = targets[b * T + t];
    }
    if (first) Backend::upload(tokens.inputs, inputs, sizeof(int) * N);
    if (last) Backend::upload(tokens.row_targets, host_row_targets_.data(), sizeof(int) * N);
}

template <class Backend>
float GPTModel<Backend>::forward_chunk(int chunk, int slot, int block_set, const int* inputs, const int* targets,
                                       const DropoutStep& draw, const Act* input, Act* output, bool training,
                                       const std::function<void(int stage)>& parameters_needed) {
    const int B = shape.batch, T = shape.seq_len, C = config.channels, L = part.num_layers();
    const int N = T * B;
    const BlockRun blocks_run = part.chunks[size_t(chunk)];
    const bool first = chunk == 0 && part.embeddings, last = chunk + 1 == int(part.chunks.size()) && part.head;
    const float p = training ? shape.dropout : 0.0f;
    use_set(chunk, slot, block_set);
    if (first || last) upload_tokens(inputs, targets, first, last);
    ChunkSlot& kept = slots_[size_t(chunk)][size_t(slot)];
    kept.draw = last_draw_ = draw;
    kept.dropout = last_dropout_ = p;

    // before each stage, its parameters: arrived (parameters_needed, where set) and, on the GPU, cast to bf16
    const auto stage_ready = [&](int stage) {
        if (parameters_needed) parameters_needed(stage);
        refresh_gemm_weights(stage);
    };
    if (first) {
        stage_ready(0);
        embeddings_forward(draw, p);
    } else {
        Backend::copy(blocks[size_t(blocks_run.begin)].ln1_in, input, sizeof(Act) * local_seq() * B * C);
    }
    for (int l = blocks_run.begin; l < blocks_run.end; l++) {
        stage_ready(l + 1);
        Act* block_out = l + 1 < blocks_run.end ? blocks[size_t(l) + 1].ln1_in : last ? outside.lnf_in : output;
        block_forward(l, block_out, draw, p);
    }
    if (!last) return 0.0f;
    if (!part.embeddings) stage_ready(0);  // the LM head reads wte
    stage_ready(L + 1);
    classifier_forward();
    if (cp.size == 1) return Backend::mean_loss(outside.losses, N);
    double mean = Backend::mean_loss(outside.losses, N);  // of this rank's positions: as many on every CP rank
    cp_group_->all_reduce_sum(&mean, 1);
    return float(mean / cp.size);
}

template <class Backend>
void GPTModel<Backend>::token_losses(float* out) {
    const int B = shape.batch, T = shape.seq_len;
    std::vector<float> rows(size_t(B) * T);  // [s, b], the activations' order
    Backend::download(rows.data(), outside.losses, sizeof(float) * rows.size());
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) out[size_t(b) * T + t] = rows[size_t(t) * B + b];
}

// ----------------------------------------------------------------------------
// backward

// The branch's gradient into workspace.branch from the residual stream's
// gradient in workspace.stream_grad (the residual passes it on unchanged).
template <class Backend>
void GPTModel<Backend>::branch_backward(float* dbias, const uint8_t* mask) {
    const int N_local = local_seq() * shape.batch, C = config.channels;
    ComputeSpan span(group_->tracer, "dropout, bias backward");
    dropout_backward(workspace.branch, mask, workspace.stream_grad, int64_t(N_local) * C, last_dropout_);
    bias_backward(dbias, workspace.branch, N_local, C);
}

// LayerNorm's input gradient added into workspace.stream_grad (the residual's share is there already).
template <class Backend>
void GPTModel<Backend>::norm_backward(float* dweight, float* dbias, const Act* dout, const Act* inp,
                                      const float* weight) {
    ComputeSpan span(group_->tracer, "layernorm backward");
    layernorm_backward(workspace.stream_grad, dweight, dbias, dout, inp, weight, workspace.ln_stats,
                       local_seq() * shape.batch, config.channels);
}

// On entry workspace.stream_grad holds dL/d(block output); on exit dL/d(block input).
template <class Backend>
void GPTModel<Backend>::block_backward(int l) {
    const int C = config.channels, t = tp.size;
    const int Ct = C / t, hidden = 4 * C / t;
    const BlockParameters& param = block_params[l];
    const BlockParameters& grad = block_grads[l];
    const BlockGemmWeights<Act>& weight = block_weights[l];
    const BlockActivations<Act>& a = blocks[l];
    Workspace<Act>& w = workspace;

    // MLP half
    branch_backward(grad.fcprojb, a.fc2_dropout_mask);
    linears_->row_backward("fc2 + gelu backward", w.wide_grad, w.branch, w.gathered, a.gelu_out, weight.fcprojw,
                           grad.fcprojw, hidden, C, a.gelu_in);
    const Act* dln = linears_->column_backward("fc1 backward", w.wide_grad, a.ln2_out, w.gathered, w.partial,
                                               w.local_grad, weight.fcw, grad.fcw, grad.fcb, C, hidden);
    norm_backward(grad.ln2w, grad.ln2b, dln, a.ln2_in, param.ln2w);

    // attention half
    branch_backward(grad.attprojb, a.proj_dropout_mask);
    linears_->row_backward("attention proj backward", w.attn_grad, w.branch, w.gathered, a.attn_out, weight.attprojw,
                           grad.attprojw, Ct, C);
    self_attention_backward(l);
    dln = linears_->column_backward("qkv backward", w.wide_grad, a.ln1_out, w.gathered, w.partial, w.local_grad,
                                    weight.qkvw, grad.qkvw, grad.qkvb, C, 3 * Ct);
    norm_backward(grad.ln1w, grad.ln1b, dln, a.ln1_in, param.ln1w);
}

// Full recomputation, before the backward of a run's last block: the run's
// forward again from the input its first block kept, with the last
// forward's draw (so the same masks) and the same kernels and communication,
// so the tables it fills in the workspace are the same bits forward wrote.
// Only workspace.stream_grad is live here; the last block's output, which
// the next block keeps already, goes to local_grad, free until the block's backward.
template <class Backend>
void GPTModel<Backend>::recompute_runs_ending_at(int chunk_begin, int l) {
    for (const BlockRun& run : recomputed_runs_) {
        if (chunk_begin + run.end != l + 1) continue;
        for (int k = chunk_begin + run.begin; k < chunk_begin + run.end; k++)
            block_forward(k, k + 1 < chunk_begin + run.end ? blocks[size_t(k) + 1].ln1_in : workspace.local_grad,
                          last_draw_, last_dropout_);
    }
}

// Leaves dL/d(lnf_in) in workspace.stream_grad.
template <class Backend>
void GPTModel<Backend>::classifier_backward(float dloss_scale) {
    const int C = config.channels, N = shape.seq_len * shape.batch, N_local = local_seq() * shape.batch;
    const int Vp_local = config.padded_vocab_size / tp.size, vocab_start = tp.rank * Vp_local;
    const int V_real = std::max(0, std::min(Vp_local, config.vocab_size - vocab_start));
    Workspace<Act>& w = workspace;
    {
        ComputeSpan span(group_->tracer, "cross-entropy backward");
        crossentropy_backward(outside.logits, outside.lse, tokens.row_targets, vocab_start, dloss_scale, N, V_real,
                              Vp_local);
    }
    const Act* dln = linears_->column_backward("lm head backward", outside.logits, outside.lnf_out, w.gathered,
                                               w.partial, w.local_grad, GemmWeight<Act>{weights.wte}, grads.wte,
                                               nullptr, C, Vp_local);
    Backend::zero(w.stream_grad, sizeof(Act) * N_local * C);
    norm_backward(grads.lnfw, grads.lnfb, dln, outside.lnf_in, params.lnfw);
}

template <class Backend>
void GPTModel<Backend>::backward(float dloss_scale, const std::function<void(int stage)>& grads_final) {
    backward_chunk(0, 0, 0, dloss_scale, nullptr, nullptr, grads_final);
}

// The embedding dropout's, wpe's and (into embedding_grad) wte's gradients
// from the first block's input gradient in workspace.stream_grad.
template <class Backend>
void GPTModel<Backend>::embeddings_backward() {
    const int B = shape.batch, T = shape.seq_len, C = config.channels;
    const int N = T * B, N_local = local_seq() * B, Vp_local = config.padded_vocab_size / tp.size;
    Workspace<Act>& w = workspace;
    {
        ComputeSpan span(group_->tracer, "embeddings backward");
        dropout_backward(w.branch, outside.embedding_dropout_mask, w.stream_grad, int64_t(N_local) * C, last_dropout_);
        const ContextParallelism::PositionRuns runs = position_runs();
        for (int i = 0; i < runs.count; i++)
            position_embedding_backward(grads.wpe, w.branch + size_t(runs.run[i].offset) * B * C,
                                        runs.run[i].global_start, runs.run[i].count, B, C);
    }
    const Act* demb = mappings_.gbar_backward(static_cast<const Act*>(w.branch), w.gathered, size_t(N) * C);
    ComputeSpan span(group_->tracer, "embeddings backward");
    token_embedding_backward(embedding_grad, demb, tokens.inputs, tp.rank * Vp_local, Vp_local, B, T, C);
}

template <class Backend>
void GPTModel<Backend>::backward_chunk(int chunk, int slot, int block_set, float dloss_scale, const Act* output_grad,
                                       Act* input_grad, const std::function<void(int stage)>& grads_final) {
    const int L = part.num_layers(), rows = local_seq() * shape.batch * config.channels;
    const BlockRun blocks_run = part.chunks[size_t(chunk)];
    const bool first = chunk == 0 && part.embeddings, last = chunk + 1 == int(part.chunks.size()) && part.head;
    use_set(chunk, slot, block_set);
    if (last) classifier_backward(dloss_scale);
    else Backend::copy(workspace.stream_grad, output_grad, sizeof(Act) * rows);
    for (int l = blocks_run.end - 1; l >= blocks_run.begin; l--) {
        recompute_runs_ending_at(blocks_run.begin, l);
        block_backward(l);
        if (grads_final) grads_final(L - l);
    }
    if (first) embeddings_backward();
    else Backend::copy(input_grad, workspace.stream_grad, sizeof(Act) * rows);
}

template <class Backend>
void GPTModel<Backend>::add_embedding_grad() {
    if (!part.holds_wte()) return;
    ComputeSpan span(group_->tracer, "tied wte gradients");
    Backend::add(grads.wte, embedding_grad, int64_t(embedding_grad_arena.bytes() / sizeof(float)));
}

// ----------------------------------------------------------------------------
// gradients of the replicated parameters

template <class Backend>
void GPTModel<Backend>::finish_grads() {
    add_embedding_grad();
    if (!tp.sequence_parallel_active()) return;  // without SP every rank computed the same, whole gradient
    float* packed = workspace.replicated_grads;
    auto visit = [&](bool pack) {
        int64_t at = 0, offset = 0;
        for (const TensorSpec& t : parameter_specs) {
            if (parameter_is_replicated(t.name)) {
                float* g = grads.wte + at;
                if (pack) Backend::copy(packed + offset, g, t.bytes());
                else Backend::copy(g, packed + offset, t.bytes());
                offset += t.elements();
            }
            at += t.elements();
        }
        return offset;
    };
    int64_t count = visit(true);
    group_->all_reduce_sum(packed, size_t(count));
    visit(false);
}

template <class Backend>
void GPTModel<Backend>::grad_square_sums(double* sharded, double* replicated) const {
    double sums[2];
    Backend::square_sums(grads.wte, grad_norm_ranges_, sums);
    *sharded = sums[0];
    *replicated = sums[1];
}

}  // namespace tpsp
