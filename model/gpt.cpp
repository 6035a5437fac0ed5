#include "model/gpt.h"

#include <omp.h>

#include <cmath>
#include <cstring>
#include <stdexcept>

#include "model/kernels/cpu_kernels.h"
#include "model/kernels/philox.h"

namespace tpsp {

// ----------------------------------------------------------------------------
// tables

// A dimension split t ways: its size on one rank, named "3h/t" (or "3h" when t = 1).
static Dim split(int64_t full, const std::string& symbol, int t) {
    return {full / t, t > 1 ? symbol + "/t" : symbol};
}

std::vector<TensorSpec> parameter_table(const GPTConfig& c, int t, ParameterTensors* p) {
    Dim maxT{c.max_seq_len, "maxT"}, L{c.num_layers, "L"}, h{c.channels, "h"};
    Dim Vp = split(c.padded_vocab_size, "Vp", t), h_t = split(c.channels, "h", t);
    Dim h3_t = split(3 * c.channels, "3h", t), h4_t = split(4 * c.channels, "4h", t);
    return {
        f32_tensor("wte", {Vp, h}, &p->wte),
        f32_tensor("wpe", {maxT, h}, &p->wpe),
        f32_tensor("ln1w", {L, h}, &p->ln1w),
        f32_tensor("ln1b", {L, h}, &p->ln1b),
        f32_tensor("qkvw", {L, h3_t, h}, &p->qkvw),
        f32_tensor("qkvb", {L, h3_t}, &p->qkvb),
        f32_tensor("attprojw", {L, h, h_t}, &p->attprojw),
        f32_tensor("attprojb", {L, h}, &p->attprojb),
        f32_tensor("ln2w", {L, h}, &p->ln2w),
        f32_tensor("ln2b", {L, h}, &p->ln2b),
        f32_tensor("fcw", {L, h4_t, h}, &p->fcw),
        f32_tensor("fcb", {L, h4_t}, &p->fcb),
        f32_tensor("fcprojw", {L, h, h4_t}, &p->fcprojw),
        f32_tensor("fcprojb", {L, h}, &p->fcprojb),
        f32_tensor("lnfw", {h}, &p->lnfw),
        f32_tensor("lnfb", {h}, &p->lnfb),
    };
}

bool parameter_is_matrix(const std::string& name) {
    return name == "wte" || name == "wpe" || name == "qkvw" || name == "attprojw" || name == "fcw" ||
           name == "fcprojw";
}

bool parameter_is_replicated(const std::string& name) {
    return name == "wpe" || name == "ln1w" || name == "ln1b" || name == "attprojb" || name == "ln2w" ||
           name == "ln2b" || name == "fcprojb" || name == "lnfw" || name == "lnfb";
}

void copy_parameter_shards(const GPTConfig& c, int t, int r, float* full, float* shard, ShardDirection direction) {
    ParameterTensors unused{};
    std::vector<TensorSpec> full_table = parameter_table(c, 1, &unused);
    std::vector<TensorSpec> shard_table = parameter_table(c, t, &unused);
    const int64_t C = c.channels, L = c.num_layers;
    auto copy = [&](int64_t full_at, int64_t shard_at, int64_t count) {
        if (direction == ShardDirection::full_to_shard) std::memcpy(shard + shard_at, full + full_at, count * 4);
        else std::memcpy(full + full_at, shard + shard_at, count * 4);
    };
    int64_t f = 0, s = 0;  // where the current tensor starts in full and shard
    for (size_t i = 0; i < full_table.size(); i++) {
        const std::string& name = full_table[i].name;
        if (parameter_is_replicated(name)) {
            copy(f, s, full_table[i].elements());
        } else if (name == "wte") {  // rows: a block of the vocabulary
            int64_t rows = c.padded_vocab_size / t;
            copy(f + r * rows * C, s, rows * C);
        } else if (name == "qkvw" || name == "qkvb") {  // rows: this rank's heads of each of Q, K, V
            int64_t width = name == "qkvw" ? C : 1, rows = C / t;
            for (int64_t l = 0; l < L; l++)
                for (int64_t third = 0; third < 3; third++)
                    copy(f + (l * 3 * C + third * C + r * rows) * width, s + (l * 3 * rows + third * rows) * width,
                         rows * width);
        } else if (name == "fcw" || name == "fcb") {  // rows: a block of the 4C hidden units
            int64_t width = name == "fcw" ? C : 1, rows = 4 * C / t;
            for (int64_t l = 0; l < L; l++) copy(f + (l * 4 * C + r * rows) * width, s + l * rows * width, rows * width);
        } else if (name == "attprojw" || name == "fcprojw") {  // columns: the inputs this rank produces
            int64_t in = name == "attprojw" ? C : 4 * C, cols = in / t;
            for (int64_t row = 0; row < L * C; row++) copy(f + row * in + r * cols, s + row * cols, cols);
        }
        f += full_table[i].elements();
        s += shard_table[i].elements();
    }
}

std::vector<TensorSpec> block_activation_table(const GPTConfig& c, const RunShape& r, const TensorParallelism& tp,
                                               BlockActivations* a) {
    const int t = tp.size;
    Dim b{r.batch, "b"}, s{r.seq_len, "s"}, h{c.channels, "h"};
    Dim s_local = tp.sequence_parallel ? split(r.seq_len, "s", t) : s;
    Dim heads = split(c.num_heads, "a", t), h_t = split(c.channels, "h", t);
    Dim h3_t = split(3 * c.channels, "3h", t), h4_t = split(4 * c.channels, "4h", t);
    return {
        f32_tensor("ln1_in", {s_local, b, h}, &a->ln1_in),
        f32_tensor("ln1_out", {s_local, b, h}, &a->ln1_out),
        f32_tensor("qkv", {s, b, h3_t}, &a->qkv),
        f32_tensor("softmax_out", {b, heads, s, s}, &a->softmax_out),
        u8_tensor("attn_dropout_mask", {b, heads, s, s}, &a->attn_dropout_mask),
        f32_tensor("attn_dropout_out", {b, heads, s, s}, &a->attn_dropout_out),
        f32_tensor("attn_out", {s, b, h_t}, &a->attn_out),
        u8_tensor("proj_dropout_mask", {s_local, b, h}, &a->proj_dropout_mask),
        f32_tensor("ln2_in", {s_local, b, h}, &a->ln2_in),
        f32_tensor("ln2_out", {s_local, b, h}, &a->ln2_out),
        f32_tensor("gelu_in", {s, b, h4_t}, &a->gelu_in),
        f32_tensor("gelu_out", {s, b, h4_t}, &a->gelu_out),
        u8_tensor("fc2_dropout_mask", {s_local, b, h}, &a->fc2_dropout_mask),
    };
}

std::vector<TensorSpec> outside_activation_table(const GPTConfig& c, const RunShape& r, const TensorParallelism& tp,
                                                 OutsideActivations* a) {
    Dim b{r.batch, "b"}, s{r.seq_len, "s"}, h{c.channels, "h"};
    Dim s_local = tp.sequence_parallel ? split(r.seq_len, "s", tp.size) : s;
    return {
        u8_tensor("embedding_dropout_mask", {s_local, b, h}, &a->embedding_dropout_mask),
        f32_tensor("lnf_in", {s_local, b, h}, &a->lnf_in),
        f32_tensor("lnf_out", {s_local, b, h}, &a->lnf_out),
        f32_tensor("logits", {s, b, split(c.padded_vocab_size, "Vp", tp.size)}, &a->logits),
        f32_tensor("losses", {s, b}, &a->losses),
        f32_tensor("lse", {s, b}, &a->lse),
    };
}

static int64_t replicated_elements(const GPTConfig& c) {
    ParameterTensors unused{};
    int64_t n = 0;
    for (const TensorSpec& t : parameter_table(c, 1, &unused))
        if (parameter_is_replicated(t.name)) n += t.elements();
    return n;
}

std::vector<TensorSpec> workspace_table(const GPTConfig& c, const RunShape& r, const TensorParallelism& tp,
                                        int threads, Workspace* w) {
    const int t = tp.size;
    Dim b{r.batch, "b"}, s{r.seq_len, "s"}, h{c.channels, "h"};
    Dim s_local = tp.sequence_parallel ? split(r.seq_len, "s", t) : s;
    bool packs_replicated = tp.sequence_parallel && t > 1;
    bool overlapped_rs = packs_replicated && (tp.overlap.rs || tp.overlap.rs_dgrad);
    return {
        f32_tensor("stream_grad", {s_local, b, h}, &w->stream_grad),
        f32_tensor("branch", {s_local, b, h}, &w->branch),
        f32_tensor("local_grad", {s_local, b, h}, &w->local_grad),
        f32_tensor("gathered", {s, b, h}, &w->gathered),
        f32_tensor("partial", {s, b, h}, &w->partial),
        f32_tensor("attn_grad", {s, b, split(c.channels, "h", t)}, &w->attn_grad),
        f32_tensor("wide_grad", {s, b, split(4 * c.channels, "4h", t)}, &w->wide_grad),
        f32_tensor("ln_stats", {{2, "2"}, s_local, b}, &w->ln_stats),
        f32_tensor("vocab_stats", {{3, "3"}, s, b}, &w->vocab_stats),
        f32_tensor("attention_scratch", {{threads, "threads"}, s, s}, &w->attention_scratch),
        f32_tensor("replicated_grads", {{packs_replicated ? replicated_elements(c) : 0, "replicated"}},
                   &w->replicated_grads),
        f32_tensor("rs_scratch", {{overlapped_rs ? 3 : 0, "3"}, s_local, b, h}, &w->rs_scratch),
    };
}

int64_t block_activation_formula_bytes(int64_t b, int64_t s, int64_t h, int64_t a, int64_t e, int64_t t,
                                       bool sequence_parallel) {
    int64_t attention_scores = b * a * s * s * (2 * e + 1) / t;
    if (sequence_parallel) return b * s * h * (16 * e + 2) / t + attention_scores;
    return b * s * h * (4 * e + 2) + b * s * h * 12 * e / t + attention_scores;
}

double model_flops_per_token(const GPTConfig& c, int seq_len) {
    double C = c.channels, L = c.num_layers;
    double matmul_params = L * 12.0 * C * C + double(c.padded_vocab_size) * C;
    return 6.0 * matmul_params + 12.0 * L * seq_len * C;
}

// ----------------------------------------------------------------------------
// construction

GPT::GPT(const GPTConfig& c, const RunShape& r, const TensorParallelism& t, Communicator* group)
    : config(c), shape(r), tp(t), group_(group ? group : &single_rank_group_),
      mappings_(group_, t.sequence_parallel && t.size > 1) {
    if (group_->size() != tp.size || group_->rank() != tp.rank)
        throw std::logic_error("GPT: the communicator does not match the tensor-parallel layout");
    parameter_specs = parameter_table(config, tp.size, &params);
    param_arena = Arena(parameter_specs);
    grad_arena = Arena(parameter_table(config, tp.size, &grads));
    num_parameters = int64_t(param_arena.bytes() / sizeof(float));

    blocks.resize(config.num_layers);
    std::vector<TensorSpec> activations;
    for (BlockActivations& block : blocks) {
        std::vector<TensorSpec> table = block_activation_table(config, shape, tp, &block);
        activations.insert(activations.end(), table.begin(), table.end());
    }
    std::vector<TensorSpec> outside_table = outside_activation_table(config, shape, tp, &outside);
    activations.insert(activations.end(), outside_table.begin(), outside_table.end());
    activation_arena = Arena(activations);
    workspace_arena = Arena(workspace_table(config, shape, tp, omp_get_max_threads(), &workspace));
    row_targets_.resize(size_t(shape.batch) * shape.seq_len);
    linears_ = std::make_unique<ParallelLinears>(group_, tp.sequence_parallel, tp.overlap, shape.seq_len * shape.batch,
                                                 local_seq() * shape.batch, workspace.rs_scratch);
}

int GPT::local_seq() const { return tp.sequence_parallel ? shape.seq_len / tp.size : shape.seq_len; }
int GPT::seq_start() const { return tp.sequence_parallel ? tp.rank * local_seq() : 0; }

void GPT::zero_grad() { std::memset(grad_arena.data(), 0, grad_arena.bytes()); }

// ----------------------------------------------------------------------------
// initialisation

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

void GPT::init_random(uint64_t seed) {
    // the full model, as at t = 1; then this rank's shard of it
    ParameterTensors full{};
    Arena full_arena(parameter_table(config, 1, &full));
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
    copy_parameter_shards(config, tp.size, tp.rank, full.wte, params.wte, ShardDirection::full_to_shard);
}

// ----------------------------------------------------------------------------
// forward

// Puts a span of compute on the trace, when one is being recorded.
template <class F>
static void traced(Communicator* group, const char* name, F&& f) {
    double start = now_seconds();
    f();
    if (group->tracer) group->tracer->record(name, Track::compute, start, now_seconds());
}

// Dropout boxes: where this rank's tensors sit in the global ones, whose
// element order is [B_global, s, h] for token tensors and
// [B_global, a, s, s] for attention probabilities.
static DropoutBox token_box(int s_local, int B, int S, int C, int seq_start, int64_t batch_offset) {
    return {s_local, B, C, C, int64_t(S) * C, seq_start, batch_offset};
}

static DropoutBox probs_box(int B, int heads_local, int heads, int S, int head_start, int64_t batch_offset) {
    int64_t ss = int64_t(S) * S;
    return {B, heads_local, ss, heads * ss, ss, batch_offset, head_start};
}

void GPT::block_forward(int l, float* block_out, const DropoutStep& draw, float p) {
    const int B = shape.batch, T = shape.seq_len, C = config.channels, t = tp.size;
    const int Ct = C / t, heads = config.num_heads / t, hidden = 4 * C / t;
    const int N = T * B, N_local = local_seq() * B;  // rows of the full and of the local activations
    BlockActivations& a = blocks[l];
    DropoutBox tokens = token_box(local_seq(), B, T, C, seq_start(), draw.batch_offset);
    DropoutBox probs = probs_box(B, heads, config.num_heads, T, tp.rank * heads, draw.batch_offset);
    auto key = [&](DropoutSite site) { return DropoutKey{draw.seed, draw.step, uint32_t(l), site}; };

    // attention half: ln2_in = ln1_in + dropout(ḡ(proj(attention(qkv(g(ln1(ln1_in)))))) + bias)
    layernorm_forward(a.ln1_out, a.ln1_in, params.ln1w + l * C, params.ln1b + l * C, N_local, C);
    linears_->column_forward("qkv", a.qkv, a.ln1_out, workspace.gathered, params.qkvw + int64_t(l) * 3 * Ct * C,
                             params.qkvb + l * 3 * Ct, C, 3 * Ct);
    traced(group_, "attention", [&] {
        attention_forward(a.attn_out, a.softmax_out, a.attn_dropout_mask, a.attn_dropout_out, a.qkv, B, T, Ct, heads,
                          p, probs, key(DropoutSite::attention_probs));
    });
    float* y = linears_->row_forward("attention proj", a.attn_out, workspace.partial, workspace.branch,
                                     params.attprojw + int64_t(l) * C * Ct, Ct, C);
    bias_forward(y, params.attprojb + l * C, N_local, C);
    dropout_forward(y, a.proj_dropout_mask, y, tokens, p, key(DropoutSite::attention_proj));
    residual_forward(a.ln2_in, a.ln1_in, y, int64_t(N_local) * C);

    // MLP half: block_out = ln2_in + dropout(ḡ(fc2(gelu(fc1(g(ln2(ln2_in)))))) + bias)
    layernorm_forward(a.ln2_out, a.ln2_in, params.ln2w + l * C, params.ln2b + l * C, N_local, C);
    linears_->column_forward("fc1", a.gelu_in, a.ln2_out, workspace.gathered, params.fcw + int64_t(l) * hidden * C,
                             params.fcb + l * hidden, C, hidden);
    traced(group_, "gelu", [&] { gelu_forward(a.gelu_out, a.gelu_in, int64_t(N) * hidden); });
    y = linears_->row_forward("fc2", a.gelu_out, workspace.partial, workspace.branch,
                              params.fcprojw + int64_t(l) * C * hidden, hidden, C);
    bias_forward(y, params.fcprojb + l * C, N_local, C);
    dropout_forward(y, a.fc2_dropout_mask, y, tokens, p, key(DropoutSite::mlp_fc2));
    residual_forward(block_out, a.ln2_in, y, int64_t(N_local) * C);
}

// Final LayerNorm, the column-parallel LM head and the vocabulary-parallel
// cross-entropy: the full logits never exist on one rank.
void GPT::classifier_forward() {
    const int C = config.channels, N = shape.seq_len * shape.batch, N_local = local_seq() * shape.batch;
    const int Vp_local = config.padded_vocab_size / tp.size, vocab_start = tp.rank * Vp_local;
    const int V_real = std::max(0, std::min(Vp_local, config.vocab_size - vocab_start));
    layernorm_forward(outside.lnf_out, outside.lnf_in, params.lnfw, params.lnfb, N_local, C);
    linears_->column_forward("lm head", outside.logits, outside.lnf_out, workspace.gathered, params.wte, nullptr, C,
                             Vp_local);

    float* maxes = workspace.vocab_stats;
    float* stats = workspace.vocab_stats + N;  // Σ exp [N], then the target logit [N]
    crossentropy_max_forward(maxes, outside.logits, N, V_real, Vp_local);
    group_->all_reduce_max(maxes, size_t(N));
    crossentropy_sum_forward(stats, outside.logits, maxes, row_targets_.data(), vocab_start, N, V_real, Vp_local);
    group_->all_reduce_sum(stats, size_t(2) * N);
    for (int n = 0; n < N; n++) {
        outside.lse[n] = maxes[n] + std::log(stats[n]);
        outside.losses[n] = outside.lse[n] - stats[N + n];
    }
}

float GPT::forward(const int* inputs, const int* targets, const DropoutStep& draw, bool training) {
    const int B = shape.batch, T = shape.seq_len, C = config.channels, L = config.num_layers;
    const int N = T * B;
    const int Vp_local = config.padded_vocab_size / tp.size;
    const float p = training ? shape.dropout : 0.0f;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) row_targets_[size_t(t) * B + b] = targets[b * T + t];

    // vocabulary-parallel embedding: each rank looks up the tokens it holds,
    // ḡ sums them (into this rank's sequence shard); then positions and dropout
    token_embedding_forward(workspace.partial, inputs, params.wte, tp.rank * Vp_local, Vp_local, B, T, C);
    float* x = mappings_.gbar_forward(workspace.partial, workspace.branch, size_t(N) * C);
    position_embedding_forward(x, params.wpe, seq_start(), local_seq(), B, C);
    dropout_forward(blocks[0].ln1_in, outside.embedding_dropout_mask, x,
                    token_box(local_seq(), B, T, C, seq_start(), draw.batch_offset), p,
                    {draw.seed, draw.step, 0, DropoutSite::embedding});
    for (int l = 0; l < L; l++) block_forward(l, l + 1 < L ? blocks[l + 1].ln1_in : outside.lnf_in, draw, p);
    classifier_forward();
    double sum = 0.0;
    for (int i = 0; i < N; i++) sum += outside.losses[i];
    return float(sum / N);
}

// ----------------------------------------------------------------------------
// backward

// On entry workspace.stream_grad holds dL/d(block output); on exit dL/d(block input).
void GPT::block_backward(int l) {
    const int B = shape.batch, T = shape.seq_len, C = config.channels, t = tp.size;
    const int Ct = C / t, heads = config.num_heads / t, hidden = 4 * C / t;
    const int N = T * B, N_local = local_seq() * B;
    const float p = shape.dropout;
    const BlockActivations& a = blocks[l];
    Workspace& w = workspace;

    // MLP half
    dropout_backward(w.branch, a.fc2_dropout_mask, w.stream_grad, int64_t(N_local) * C, p);
    bias_backward(grads.fcprojb + l * C, w.branch, N_local, C);
    linears_->row_backward("fc2 backward", w.wide_grad, w.branch, w.gathered, a.gelu_out,
                           params.fcprojw + int64_t(l) * C * hidden, grads.fcprojw + int64_t(l) * C * hidden, hidden,
                           C);
    traced(group_, "gelu backward", [&] { gelu_backward(w.wide_grad, a.gelu_in, w.wide_grad, int64_t(N) * hidden); });
    const float* dln = linears_->column_backward("fc1 backward", w.wide_grad, a.ln2_out, w.gathered, w.partial,
                                                 w.local_grad, params.fcw + int64_t(l) * hidden * C,
                                                 grads.fcw + int64_t(l) * hidden * C, grads.fcb + l * hidden, C,
                                                 hidden);
    layernorm_backward(w.stream_grad, grads.ln2w + l * C, grads.ln2b + l * C, dln, a.ln2_in, params.ln2w + l * C,
                       w.ln_stats, N_local, C);

    // attention half
    dropout_backward(w.branch, a.proj_dropout_mask, w.stream_grad, int64_t(N_local) * C, p);
    bias_backward(grads.attprojb + l * C, w.branch, N_local, C);
    linears_->row_backward("attention proj backward", w.attn_grad, w.branch, w.gathered, a.attn_out,
                           params.attprojw + int64_t(l) * C * Ct, grads.attprojw + int64_t(l) * C * Ct, Ct, C);
    traced(group_, "attention backward", [&] {
        attention_backward(w.wide_grad, w.attn_grad, a.qkv, a.softmax_out, a.attn_dropout_mask, a.attn_dropout_out,
                           w.attention_scratch, B, T, Ct, heads, p);
    });
    dln = linears_->column_backward("qkv backward", w.wide_grad, a.ln1_out, w.gathered, w.partial, w.local_grad,
                                    params.qkvw + int64_t(l) * 3 * Ct * C, grads.qkvw + int64_t(l) * 3 * Ct * C,
                                    grads.qkvb + l * 3 * Ct, C, 3 * Ct);
    layernorm_backward(w.stream_grad, grads.ln1w + l * C, grads.ln1b + l * C, dln, a.ln1_in, params.ln1w + l * C,
                       w.ln_stats, N_local, C);
}

// Leaves dL/d(lnf_in) in workspace.stream_grad.
void GPT::classifier_backward(float dloss_scale) {
    const int C = config.channels, N = shape.seq_len * shape.batch, N_local = local_seq() * shape.batch;
    const int Vp_local = config.padded_vocab_size / tp.size, vocab_start = tp.rank * Vp_local;
    const int V_real = std::max(0, std::min(Vp_local, config.vocab_size - vocab_start));
    Workspace& w = workspace;
    crossentropy_backward(outside.logits, outside.lse, row_targets_.data(), vocab_start, dloss_scale, N, V_real,
                          Vp_local);
    const float* dln = linears_->column_backward("lm head backward", outside.logits, outside.lnf_out, w.gathered,
                                                 w.partial, w.local_grad, params.wte, grads.wte, nullptr, C, Vp_local);
    std::memset(w.stream_grad, 0, sizeof(float) * N_local * C);
    layernorm_backward(w.stream_grad, grads.lnfw, grads.lnfb, dln, outside.lnf_in, params.lnfw, w.ln_stats, N_local,
                       C);
}

void GPT::backward(const int* inputs, float dloss_scale) {
    const int B = shape.batch, T = shape.seq_len, C = config.channels, L = config.num_layers;
    const int N = T * B, N_local = local_seq() * B, Vp_local = config.padded_vocab_size / tp.size;
    Workspace& w = workspace;
    classifier_backward(dloss_scale);
    for (int l = L - 1; l >= 0; l--) block_backward(l);
    dropout_backward(w.branch, outside.embedding_dropout_mask, w.stream_grad, int64_t(N_local) * C, shape.dropout);
    position_embedding_backward(grads.wpe, w.branch, seq_start(), local_seq(), B, C);
    const float* demb = mappings_.gbar_backward(w.branch, w.gathered, size_t(N) * C);
    token_embedding_backward(grads.wte, demb, inputs, tp.rank * Vp_local, Vp_local, B, T, C);
}

// ----------------------------------------------------------------------------
// gradients of the replicated parameters

void GPT::reduce_replicated_grads() {
    if (!(tp.sequence_parallel && tp.size > 1)) return;  // without SP every rank computed the same, whole gradient
    float* packed = workspace.replicated_grads;
    auto visit = [&](bool pack) {
        int64_t at = 0, offset = 0;
        for (const TensorSpec& t : parameter_specs) {
            if (parameter_is_replicated(t.name)) {
                float* g = grads.wte + at;
                if (pack) std::memcpy(packed + offset, g, t.bytes());
                else std::memcpy(g, packed + offset, t.bytes());
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

void GPT::grad_square_sums(double* sharded, double* replicated) const {
    *sharded = *replicated = 0.0;
    int64_t at = 0;
    for (const TensorSpec& t : parameter_specs) {
        const float* g = grads.wte + at;
        double sum = 0.0;
#pragma omp parallel for reduction(+ : sum)
        for (int64_t i = 0; i < t.elements(); i++) sum += double(g[i]) * g[i];
        (parameter_is_replicated(t.name) ? *replicated : *sharded) += sum;
        at += t.elements();
    }
}

}  // namespace tpsp
