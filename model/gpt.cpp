// The model's non-template parts, and the CPU model's instantiation of gpt_model.h.
#include "model/gpt.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include "model/gpt_model.h"
#include "model/kernels/philox.h"

namespace tpsp {

// ----------------------------------------------------------------------------
// tables

ModelPart whole_model(const GPTConfig& c) {
    ModelPart part;
    for (int l = 0; l < c.num_layers; l++) part.layers.push_back(l);
    part.chunks = {{0, c.num_layers}};
    part.in_flight = {1};
    part.block_sets = 1;
    return part;
}

std::vector<TensorSpec> parameter_table(const GPTConfig& c, int t, ParameterTensors* p,
                                        std::vector<BlockParameters>* blocks) {
    return parameter_table(c, t, whole_model(c), p, blocks);
}

std::vector<TensorSpec> parameter_table(const GPTConfig& c, int t, const ModelPart& part, ParameterTensors* p,
                                        std::vector<BlockParameters>* blocks) {
    Dim maxT{part.embeddings ? c.max_seq_len : 0, "maxT"}, L{part.num_layers(), "L"}, h{c.channels, "h"};
    Dim Vp = split_dim(part.holds_wte() ? c.padded_vocab_size : 0, "Vp", t), h_t = split_dim(c.channels, "h", t);
    Dim h3_t = split_dim(3 * c.channels, "3h", t), h4_t = split_dim(4 * c.channels, "4h", t);
    Dim h_head{part.head ? c.channels : 0, "h"};
    using B = BlockParameters;
    return {
        tensor("wte", {Vp, h}, &p->wte),
        tensor("wpe", {maxT, h}, &p->wpe),
        layered_tensor("ln1w", L, {h}, &p->ln1w, blocks, &B::ln1w),
        layered_tensor("ln1b", L, {h}, &p->ln1b, blocks, &B::ln1b),
        layered_tensor("qkvw", L, {h3_t, h}, &p->qkvw, blocks, &B::qkvw),
        layered_tensor("qkvb", L, {h3_t}, &p->qkvb, blocks, &B::qkvb),
        layered_tensor("attprojw", L, {h, h_t}, &p->attprojw, blocks, &B::attprojw),
        layered_tensor("attprojb", L, {h}, &p->attprojb, blocks, &B::attprojb),
        layered_tensor("ln2w", L, {h}, &p->ln2w, blocks, &B::ln2w),
        layered_tensor("ln2b", L, {h}, &p->ln2b, blocks, &B::ln2b),
        layered_tensor("fcw", L, {h4_t, h}, &p->fcw, blocks, &B::fcw),
        layered_tensor("fcb", L, {h4_t}, &p->fcb, blocks, &B::fcb),
        layered_tensor("fcprojw", L, {h, h4_t}, &p->fcprojw, blocks, &B::fcprojw),
        layered_tensor("fcprojb", L, {h}, &p->fcprojb, blocks, &B::fcprojb),
        tensor("lnfw", {h_head}, &p->lnfw),
        tensor("lnfb", {h_head}, &p->lnfb),
    };
}

ModelPart pipeline_part(const PipelineShape& pipeline, int stage) {
    if (const std::string error = pipeline_shape_error(pipeline);
        !error.empty() || stage < 0 || stage >= pipeline.stages)
        throw std::logic_error("pipeline_part: not a pipeline's stage: " + error);
    ModelPart part;
    const int n = pipeline.layers_per_chunk();
    for (int c = 0; c < pipeline.chunks; c++) {
        const int begin = part.num_layers();
        for (int l = 0; l < n; l++) part.layers.push_back(pipeline.first_layer(stage, c) + l);
        part.chunks.push_back({begin, begin + n});
    }
    part.embeddings = pipeline.first_in_model(stage, 0);
    part.head = pipeline.last_in_model(stage, pipeline.chunks - 1);
    part.in_flight = pipeline_in_flight(pipeline, stage);
    part.block_sets = pipeline_peak_in_flight(pipeline, stage);
    return part;
}

bool parameter_is_matrix(const std::string& name) {
    return name == "wte" || name == "wpe" || name == "qkvw" || name == "attprojw" || name == "fcw" || name == "fcprojw";
}

bool parameter_is_replicated(const std::string& name) {
    return name == "wpe" || name == "ln1w" || name == "ln1b" || name == "attprojb" || name == "ln2w" ||
           name == "ln2b" || name == "fcprojb" || name == "lnfw" || name == "lnfb";
}

void copy_parameter_shards(const GPTConfig& c, int t, int r, float* full, float* shard, ShardDirection direction) {
    copy_parameter_shards(c, t, r, whole_model(c), full, shard, direction);
}

// Walks the full table (t = 1, every block) beside the part's shard table:
// for each tensor, each block the part holds (global l, local j) and the rows
// or columns rank r holds of it.
void copy_parameter_shards(const GPTConfig& c, int t, int r, const ModelPart& part, float* full, float* shard,
                           ShardDirection direction) {
    ParameterTensors unused{};
    std::vector<TensorSpec> full_table = parameter_table(c, 1, &unused);
    std::vector<TensorSpec> shard_table = parameter_table(c, t, part, &unused);
    const int64_t C = c.channels, L = c.num_layers;
    auto copy = [&](int64_t full_at, int64_t shard_at, int64_t count) {
        if (direction == ShardDirection::full_to_shard) std::memcpy(shard + shard_at, full + full_at, count * 4);
        else std::memcpy(full + full_at, shard + shard_at, count * 4);
    };
    int64_t f = 0, s = 0;  // where the current tensor starts in full and shard
    for (size_t i = 0; i < full_table.size(); i++) {
        const std::string& name = full_table[i].name;
        const bool layered = full_table[i].shape[0].symbol == "L";
        const int64_t full_layer = layered ? full_table[i].elements() / L : 0;  // one block's slice, full and shard
        const int64_t shard_layer = layered ? full_layer / (parameter_is_replicated(name) ? 1 : t) : 0;
        for (int j = 0; j < (layered ? part.num_layers() : 1); j++) {
            const int64_t fl = f + (layered ? part.layers[size_t(j)] * full_layer : 0), sl = s + j * shard_layer;
            if (layered && parameter_is_replicated(name)) {
                copy(fl, sl, full_layer);
            } else if (!layered) {
                if (shard_table[i].elements() == 0) continue;  // a tensor this part does not hold
                if (name == "wte") copy(f + r * (c.padded_vocab_size / t) * C, s, c.padded_vocab_size / t * C);
                else copy(f, s, full_table[i].elements());  // wpe, lnfw, lnfb: replicated
            } else if (name == "qkvw" || name == "qkvb") {  // rows: this rank's heads of each of Q, K, V
                const int64_t width = name == "qkvw" ? C : 1, rows = C / t;
                for (int64_t third = 0; third < 3; third++)
                    copy(fl + (third * C + r * rows) * width, sl + third * rows * width, rows * width);
            } else if (name == "fcw" || name == "fcb") {  // rows: a block of the 4C hidden units
                const int64_t width = name == "fcw" ? C : 1, rows = 4 * C / t;
                copy(fl + r * rows * width, sl, rows * width);
            } else if (name == "attprojw" || name == "fcprojw") {  // columns: the inputs this rank produces
                const int64_t in = name == "attprojw" ? C : 4 * C, cols = in / t;
                for (int64_t row = 0; row < C; row++) copy(fl + row * in + r * cols, sl + row * cols, cols);
            }
        }
        f += full_table[i].elements();
        s += shard_table[i].elements();
    }
}

int64_t replicated_parameter_elements(const GPTConfig& c, const ModelPart& part) {
    ParameterTensors unused{};
    int64_t n = 0;
    for (const TensorSpec& t : parameter_table(c, 1, part, &unused))
        if (parameter_is_replicated(t.name)) n += t.elements();
    return n;
}

std::vector<TensorSpec> token_table(const RunShape& r, TokenBuffers* tokens) {
    Dim b{r.batch, "b"}, s{r.seq_len, "s"};
    return {tensor("inputs", {b, s}, &tokens->inputs), tensor("row_targets", {s, b}, &tokens->row_targets)};
}

std::string recompute_description(const RunShape& r) {
    if (r.recompute == Recompute::none) return "none";
    if (r.recompute == Recompute::selective) return "selective";
    const int n = r.recompute_layers;
    if (r.recompute_method == RecomputeMethod::block)
        return "full (block: the first " + std::to_string(n) + (n == 1 ? " block)" : " blocks)");
    return "full (uniform: runs of " + std::to_string(n) + (n == 1 ? " block)" : " blocks)");
}

bool keeps_attention_scores(const GPTConfig& config, const RunShape& shape) {
    return config.attention == AttentionKernel::explicit_scores && shape.recompute != Recompute::selective;
}

bool recomputes_attention_scores(const GPTConfig& config, const RunShape& shape) {
    return config.attention == AttentionKernel::explicit_scores && shape.recompute == Recompute::selective;
}

std::vector<BlockRun> recomputed_runs(const RunShape& shape, int num_layers) {
    if (shape.recompute != Recompute::full) return {};
    const int n = shape.recompute_layers;  // 1 ≤ n ≤ L, checked by the model and the config; a chunk may hold fewer
    std::vector<BlockRun> runs;
    if (shape.recompute_method == RecomputeMethod::block) {
        for (int l = 0; l < std::min(n, num_layers); l++) runs.push_back({l, l + 1});
    } else {
        for (int l = 0; l < num_layers; l += n) runs.push_back({l, std::min(l + n, num_layers)});
    }
    return runs;
}

BlockKeeps block_keeps(const RunShape& shape, int num_layers, int layer) {
    for (const BlockRun& run : recomputed_runs(shape, num_layers))
        if (layer >= run.begin && layer < run.end)
            return layer == run.begin ? BlockKeeps::input_only : BlockKeeps::nothing;
    return BlockKeeps::whole_table;
}

int recompute_slots(const GPTConfig& config, const RunShape& shape) {
    if (shape.recompute == Recompute::selective) return recomputes_attention_scores(config, shape) ? 1 : 0;
    int longest = 0;
    for (const BlockRun& run : recomputed_runs(shape, config.num_layers))
        longest = std::max(longest, run.end - run.begin);
    return longest;
}

// S', its mask and S of one block, per rank (S' alone at p = 0)
static int64_t attention_scores_formula_bytes(int64_t b, int64_t s, int64_t a, int64_t e, int64_t t, bool dropout) {
    return b * a * s * s * (dropout ? 2 * e + 1 : e) / t;
}

int64_t block_activation_formula_bytes(int64_t b, int64_t s, int64_t h, int64_t a, int64_t e, int64_t t,
                                       bool sequence_parallel, AttentionKernel attention, Recompute recompute,
                                       bool dropout) {
    int64_t attention_scores = attention_scores_formula_bytes(b, s, a, e, t, dropout);
    if (attention == AttentionKernel::cudnn_fused) attention_scores = 4 * b * a * s / t;  // fp32 row statistics
    else if (recompute == Recompute::selective) attention_scores = 0;                     // recomputed in backward
    const int64_t masks = dropout ? 2 : 0;  // after the attention projection and fc2, one byte per element
    if (sequence_parallel) return b * s * h * (16 * e + masks) / t + attention_scores;
    return b * s * h * (4 * e + masks) + b * s * h * 12 * e / t + attention_scores;
}

// The formula's arguments for a run: under SP (or at t = 1) s/t rows per rank
struct FormulaShape {
    int64_t b, s, h, a, t;
    bool sequence_parallel, dropout;
};
static FormulaShape formula_shape(const GPTConfig& c, const RunShape& r, const TensorParallelism& tp) {
    return {r.batch,         r.seq_len, c.channels, c.num_heads, tp.size, tp.sequence_parallel || tp.size == 1,
            r.dropout > 0.0f};
}

static int64_t whole_table_formula_bytes(const GPTConfig& c, const RunShape& r, const TensorParallelism& tp,
                                         int64_t e) {
    const FormulaShape f = formula_shape(c, r, tp);
    return block_activation_formula_bytes(f.b, f.s, f.h, f.a, e, f.t, f.sequence_parallel, c.attention, r.recompute,
                                          f.dropout);
}

// A block's input [s/t, b, h] (s rows without SP)
static int64_t block_input_formula_bytes(const GPTConfig& c, const RunShape& r, const TensorParallelism& tp,
                                         int64_t e) {
    const FormulaShape f = formula_shape(c, r, tp);
    return f.b * f.s * f.h * e / (f.sequence_parallel ? f.t : 1);
}

int64_t saved_blocks_formula_bytes(const GPTConfig& c, const RunShape& r, const TensorParallelism& tp, int64_t e) {
    int64_t bytes = 0;
    for (int l = 0; l < c.num_layers; l++) {
        const BlockKeeps keeps = block_keeps(r, c.num_layers, l);
        if (keeps == BlockKeeps::whole_table) bytes += whole_table_formula_bytes(c, r, tp, e);
        if (keeps == BlockKeeps::input_only) bytes += block_input_formula_bytes(c, r, tp, e);
    }
    return bytes;
}

int64_t part_saved_blocks_formula_bytes(const GPTConfig& c, const RunShape& r, const TensorParallelism& tp, int64_t e,
                                        const ModelPart& part) {
    GPTConfig chunk_config = c;  // every chunk holds as many blocks
    chunk_config.num_layers = part.chunks[0].end - part.chunks[0].begin;
    return part.block_sets * saved_blocks_formula_bytes(chunk_config, r, tp, e);
}

int64_t recompute_workspace_formula_bytes(const GPTConfig& c, const RunShape& r, const TensorParallelism& tp,
                                          int64_t e) {
    const int slots = recompute_slots(c, r);
    if (r.recompute == Recompute::full && slots > 0)
        return slots * whole_table_formula_bytes(c, r, tp, e) - block_input_formula_bytes(c, r, tp, e);
    const FormulaShape f = formula_shape(c, r, tp);
    return slots * attention_scores_formula_bytes(f.b, f.s, f.a, e, f.t, f.dropout);
}

double model_flops_per_token(const GPTConfig& c, int seq_len) {
    double C = c.channels, L = c.num_layers;
    double matmul_params = L * 12.0 * C * C + double(c.padded_vocab_size) * C;
    return 6.0 * matmul_params + 12.0 * L * seq_len * C;
}

// Standard normals from Philox by Box–Muller: the same weights on any machine.
static void fill_normal(float* out, int64_t n, float std, uint64_t seed, uint32_t tensor_id) {
    for (int64_t i = 0; i < n; i += 2) {
        PhiloxCounter bits = philox4x32_10({uint32_t(i), uint32_t(uint64_t(i) >> 32), tensor_id, 0},
                                           {uint32_t(seed), uint32_t(seed >> 32)});
        float u1 = (float(bits[0] >> 8) + 1.0f) * (1.0f / 16777216.0f);  // (0, 1]
        float u2 = uniform_from_bits(bits[1]);
        float radius = std::sqrt(-2.0f * std::log(u1));
        out[i] = std * radius * std::cos(6.2831853f * u2);
        if (i + 1 < n) out[i + 1] = std * radius * std::sin(6.2831853f * u2);
    }
}

std::vector<float> initial_full_parameters(const GPTConfig& config, uint64_t seed) {
    ParameterTensors full{};
    std::vector<TensorSpec> table = parameter_table(config, 1, &full);
    std::vector<float> memory(table_bytes(table) / sizeof(float), 0.0f);
    int64_t at = 0;
    for (const TensorSpec& t : table) {
        t.place(memory.data() + at);
        at += t.elements();
    }
    const float std = 0.02f, residual_std = 0.02f / std::sqrt(2.0f * config.num_layers);
    const int64_t C = config.channels, L = config.num_layers;
    fill_normal(full.wte, int64_t(config.vocab_size) * C, std, seed, 0);
    fill_normal(full.wpe, int64_t(config.max_seq_len) * C, std, seed, 1);
    fill_normal(full.qkvw, L * 3 * C * C, std, seed, 2);
    fill_normal(full.attprojw, L * C * C, residual_std, seed, 3);
    fill_normal(full.fcw, L * 4 * C * C, std, seed, 4);
    fill_normal(full.fcprojw, L * 4 * C * C, residual_std, seed, 5);
    for (int64_t i = 0; i < L * C; i++) full.ln1w[i] = full.ln2w[i] = 1.0f;
    for (int64_t i = 0; i < C; i++) full.lnfw[i] = 1.0f;
    return memory;
}

template class GPTModel<CpuBackend>;
template class GPTModel<CpuThreadGroupBackend>;

}  // namespace tpsp
