#include "model/gpt.h"

#include <omp.h>

#include <cmath>
#include <cstring>

#include "model/kernels/cpu_kernels.h"
#include "model/kernels/philox.h"

namespace tpsp {

std::vector<TensorSpec> parameter_table(const GPTConfig& c, ParameterTensors* p) {
    Dim Vp{c.padded_vocab_size, "Vp"}, maxT{c.max_seq_len, "maxT"}, L{c.num_layers, "L"};
    Dim h{c.channels, "h"}, h3{3 * c.channels, "3h"}, h4{4 * c.channels, "4h"};
    return {
        f32_tensor("wte", {Vp, h}, &p->wte),
        f32_tensor("wpe", {maxT, h}, &p->wpe),
        f32_tensor("ln1w", {L, h}, &p->ln1w),
        f32_tensor("ln1b", {L, h}, &p->ln1b),
        f32_tensor("qkvw", {L, h3, h}, &p->qkvw),
        f32_tensor("qkvb", {L, h3}, &p->qkvb),
        f32_tensor("attprojw", {L, h, h}, &p->attprojw),
        f32_tensor("attprojb", {L, h}, &p->attprojb),
        f32_tensor("ln2w", {L, h}, &p->ln2w),
        f32_tensor("ln2b", {L, h}, &p->ln2b),
        f32_tensor("fcw", {L, h4, h}, &p->fcw),
        f32_tensor("fcb", {L, h4}, &p->fcb),
        f32_tensor("fcprojw", {L, h, h4}, &p->fcprojw),
        f32_tensor("fcprojb", {L, h}, &p->fcprojb),
        f32_tensor("lnfw", {h}, &p->lnfw),
        f32_tensor("lnfb", {h}, &p->lnfb),
    };
}

bool parameter_is_matrix(const std::string& name) {
    return name == "wte" || name == "wpe" || name == "qkvw" || name == "attprojw" || name == "fcw" ||
           name == "fcprojw";
}

std::vector<TensorSpec> block_activation_table(const GPTConfig& c, const RunShape& r, BlockActivations* a) {
    Dim b{r.batch, "b"}, s{r.seq_len, "s"}, heads{c.num_heads, "a"};
    Dim h{c.channels, "h"}, h3{3 * c.channels, "3h"}, h4{4 * c.channels, "4h"};
    return {
        f32_tensor("ln1_in", {b, s, h}, &a->ln1_in),
        f32_tensor("ln1_out", {b, s, h}, &a->ln1_out),
        f32_tensor("qkv", {b, s, h3}, &a->qkv),
        f32_tensor("softmax_out", {b, heads, s, s}, &a->softmax_out),
        u8_tensor("attn_dropout_mask", {b, heads, s, s}, &a->attn_dropout_mask),
        f32_tensor("attn_dropout_out", {b, heads, s, s}, &a->attn_dropout_out),
        f32_tensor("attn_out", {b, s, h}, &a->attn_out),
        u8_tensor("proj_dropout_mask", {b, s, h}, &a->proj_dropout_mask),
        f32_tensor("ln2_in", {b, s, h}, &a->ln2_in),
        f32_tensor("ln2_out", {b, s, h}, &a->ln2_out),
        f32_tensor("gelu_in", {b, s, h4}, &a->gelu_in),
        f32_tensor("gelu_out", {b, s, h4}, &a->gelu_out),
        u8_tensor("fc2_dropout_mask", {b, s, h}, &a->fc2_dropout_mask),
    };
}

std::vector<TensorSpec> outside_activation_table(const GPTConfig& c, const RunShape& r, OutsideActivations* a) {
    Dim b{r.batch, "b"}, s{r.seq_len, "s"}, h{c.channels, "h"}, Vp{c.padded_vocab_size, "Vp"};
    return {
        u8_tensor("embedding_dropout_mask", {b, s, h}, &a->embedding_dropout_mask),
        f32_tensor("lnf_in", {b, s, h}, &a->lnf_in),
        f32_tensor("lnf_out", {b, s, h}, &a->lnf_out),
        f32_tensor("logits", {b, s, Vp}, &a->logits),
        f32_tensor("losses", {b, s}, &a->losses),
        f32_tensor("lse", {b, s}, &a->lse),
    };
}

std::vector<TensorSpec> workspace_table(const GPTConfig& c, const RunShape& r, int threads, Workspace* w) {
    Dim b{r.batch, "b"}, s{r.seq_len, "s"}, h{c.channels, "h"}, h4{4 * c.channels, "4h"};
    return {
        f32_tensor("stream_grad", {b, s, h}, &w->stream_grad),
        f32_tensor("branch", {b, s, h}, &w->branch),
        f32_tensor("narrow_grad", {b, s, h}, &w->narrow_grad),
        f32_tensor("wide_grad", {b, s, h4}, &w->wide_grad),
        f32_tensor("ln_stats", {{2, "2"}, b, s}, &w->ln_stats),
        f32_tensor("attention_scratch", {{threads, "threads"}, s, s}, &w->attention_scratch),
    };
}

int64_t block_activation_formula_bytes(int64_t b, int64_t s, int64_t h, int64_t a, int64_t e) {
    return b * s * h * (16 * e + 2) + b * a * s * s * (2 * e + 1);
}

double model_flops_per_token(const GPTConfig& c, int seq_len) {
    double C = c.channels, L = c.num_layers;
    double matmul_params = L * 12.0 * C * C + double(c.padded_vocab_size) * C;
    return 6.0 * matmul_params + 12.0 * L * seq_len * C;
}

GPT::GPT(const GPTConfig& c, const RunShape& r) : config(c), shape(r) {
    parameter_specs = parameter_table(config, &params);
    param_arena = Arena(parameter_specs);
    std::vector<TensorSpec> grad_specs = parameter_table(config, &grads);
    grad_arena = Arena(grad_specs);
    num_parameters = int64_t(param_arena.bytes() / sizeof(float));

    blocks.resize(config.num_layers);
    std::vector<TensorSpec> activations;
    for (BlockActivations& block : blocks) {
        std::vector<TensorSpec> table = block_activation_table(config, shape, &block);
        activations.insert(activations.end(), table.begin(), table.end());
    }
    std::vector<TensorSpec> outside_table = outside_activation_table(config, shape, &outside);
    activations.insert(activations.end(), outside_table.begin(), outside_table.end());
    activation_arena = Arena(activations);
    workspace_arena = Arena(workspace_table(config, shape, omp_get_max_threads(), &workspace));
}

std::vector<TensorSpec> GPT::block_table_of_layer0() const {
    BlockActivations scratch{};
    return block_activation_table(config, shape, &scratch);
}

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
    std::memset(param_arena.data(), 0, param_arena.bytes());
    float std = 0.02f;
    float residual_std = 0.02f / std::sqrt(2.0f * config.num_layers);
    int64_t C = config.channels, L = config.num_layers;
    fill_normal(params.wte, int64_t(config.vocab_size) * C, std, seed, 0);
    fill_normal(params.wpe, int64_t(config.max_seq_len) * C, std, seed, 1);
    fill_normal(params.qkvw, L * 3 * C * C, std, seed, 2);
    fill_normal(params.attprojw, L * C * C, residual_std, seed, 3);
    fill_normal(params.fcw, L * 4 * C * C, std, seed, 4);
    fill_normal(params.fcprojw, L * 4 * C * C, residual_std, seed, 5);
    for (int64_t i = 0; i < L * C; i++) params.ln1w[i] = params.ln2w[i] = 1.0f;
    for (int64_t i = 0; i < C; i++) params.lnfw[i] = 1.0f;
}

// ----------------------------------------------------------------------------
// forward

// The dropout box of a [b, s, h] activation of this micro-batch.
static DropoutBox token_box(const RunShape& r, int C, int64_t batch_offset) {
    return {r.batch, r.seq_len, C, r.seq_len, C, batch_offset, 0, 0};
}

void GPT::block_forward(int l, float* block_out, const DropoutStep& draw, float p) {
    const int B = shape.batch, T = shape.seq_len, C = config.channels, NH = config.num_heads;
    const int N = B * T;
    BlockActivations& a = blocks[l];
    float* branch = workspace.branch;
    DropoutBox tokens = token_box(shape, C, draw.batch_offset);
    DropoutBox probs = {B, NH, int64_t(T) * T, NH, int64_t(T) * T, draw.batch_offset, 0, 0};
    auto key = [&](DropoutSite site) { return DropoutKey{draw.seed, draw.step, uint32_t(l), site}; };

    // attention half: ln2_in = ln1_in + dropout(proj(attention(ln1(ln1_in))))
    layernorm_forward(a.ln1_out, a.ln1_in, params.ln1w + l * C, params.ln1b + l * C, N, C);
    matmul_forward(a.qkv, a.ln1_out, params.qkvw + int64_t(l) * 3 * C * C, params.qkvb + l * 3 * C, N, C, 3 * C);
    attention_forward(a.attn_out, a.softmax_out, a.attn_dropout_mask, a.attn_dropout_out, a.qkv, B, T, C, NH, p,
                      probs, key(DropoutSite::attention_probs));
    matmul_forward(branch, a.attn_out, params.attprojw + int64_t(l) * C * C, params.attprojb + l * C, N, C, C);
    dropout_forward(branch, a.proj_dropout_mask, branch, tokens, p, key(DropoutSite::attention_proj));
    residual_forward(a.ln2_in, a.ln1_in, branch, int64_t(N) * C);

    // MLP half: block_out = ln2_in + dropout(fc2(gelu(fc1(ln2(ln2_in)))))
    layernorm_forward(a.ln2_out, a.ln2_in, params.ln2w + l * C, params.ln2b + l * C, N, C);
    matmul_forward(a.gelu_in, a.ln2_out, params.fcw + int64_t(l) * 4 * C * C, params.fcb + l * 4 * C, N, C, 4 * C);
    gelu_forward(a.gelu_out, a.gelu_in, int64_t(N) * 4 * C);
    matmul_forward(branch, a.gelu_out, params.fcprojw + int64_t(l) * 4 * C * C, params.fcprojb + l * C, N, 4 * C,
                   C);
    dropout_forward(branch, a.fc2_dropout_mask, branch, tokens, p, key(DropoutSite::mlp_fc2));
    residual_forward(block_out, a.ln2_in, branch, int64_t(N) * C);
}

float GPT::forward(const int* inputs, const int* targets, const DropoutStep& draw, bool training) {
    const int B = shape.batch, T = shape.seq_len, C = config.channels, L = config.num_layers;
    const int N = B * T, V = config.vocab_size, Vp = config.padded_vocab_size;

    const float p = training ? shape.dropout : 0.0f;
    // embedding, then its dropout, into the residual stream of block 0
    embedding_forward(workspace.branch, inputs, params.wte, params.wpe, B, T, C);
    dropout_forward(blocks[0].ln1_in, outside.embedding_dropout_mask, workspace.branch,
                    token_box(shape, C, draw.batch_offset), p,
                    {draw.seed, draw.step, 0, DropoutSite::embedding});
    for (int l = 0; l < L; l++) block_forward(l, l + 1 < L ? blocks[l + 1].ln1_in : outside.lnf_in, draw, p);

    layernorm_forward(outside.lnf_out, outside.lnf_in, params.lnfw, params.lnfb, N, C);
    matmul_forward(outside.logits, outside.lnf_out, params.wte, nullptr, N, C, Vp);
    crossentropy_forward(outside.losses, outside.lse, outside.logits, targets, N, V, Vp);
    double sum = 0.0;
    for (int i = 0; i < N; i++) sum += outside.losses[i];
    return float(sum / N);
}

// ----------------------------------------------------------------------------
// backward

// On entry workspace.stream_grad holds dL/d(block output); on exit dL/d(block input).
void GPT::block_backward(int l) {
    const int B = shape.batch, T = shape.seq_len, C = config.channels, NH = config.num_heads;
    const int N = B * T;
    const float p = shape.dropout;
    const BlockActivations& a = blocks[l];
    float* dstream = workspace.stream_grad;
    float* dbranch = workspace.branch;
    float* dnarrow = workspace.narrow_grad;
    float* dwide = workspace.wide_grad;

    // MLP half
    dropout_backward(dbranch, a.fc2_dropout_mask, dstream, int64_t(N) * C, p);
    matmul_backward(dwide, grads.fcprojw + int64_t(l) * 4 * C * C, grads.fcprojb + l * C, dbranch, a.gelu_out,
                    params.fcprojw + int64_t(l) * 4 * C * C, N, 4 * C, C);
    gelu_backward(dwide, a.gelu_in, dwide, int64_t(N) * 4 * C);
    matmul_backward(dnarrow, grads.fcw + int64_t(l) * 4 * C * C, grads.fcb + l * 4 * C, dwide, a.ln2_out,
                    params.fcw + int64_t(l) * 4 * C * C, N, C, 4 * C);
    layernorm_backward(dstream, grads.ln2w + l * C, grads.ln2b + l * C, dnarrow, a.ln2_in, params.ln2w + l * C,
                       workspace.ln_stats, N, C);

    // attention half
    dropout_backward(dbranch, a.proj_dropout_mask, dstream, int64_t(N) * C, p);
    matmul_backward(dnarrow, grads.attprojw + int64_t(l) * C * C, grads.attprojb + l * C, dbranch, a.attn_out,
                    params.attprojw + int64_t(l) * C * C, N, C, C);
    attention_backward(dwide, dnarrow, a.qkv, a.softmax_out, a.attn_dropout_mask, a.attn_dropout_out,
                       workspace.attention_scratch, B, T, C, NH, p);
    matmul_backward(dnarrow, grads.qkvw + int64_t(l) * 3 * C * C, grads.qkvb + l * 3 * C, dwide, a.ln1_out,
                    params.qkvw + int64_t(l) * 3 * C * C, N, C, 3 * C);
    layernorm_backward(dstream, grads.ln1w + l * C, grads.ln1b + l * C, dnarrow, a.ln1_in, params.ln1w + l * C,
                       workspace.ln_stats, N, C);
}

void GPT::backward(const int* inputs, const int* targets, float dloss_scale) {
    const int B = shape.batch, T = shape.seq_len, C = config.channels, L = config.num_layers;
    const int N = B * T, V = config.vocab_size, Vp = config.padded_vocab_size;

    crossentropy_backward(outside.logits, outside.lse, targets, dloss_scale, N, V, Vp);
    matmul_backward(workspace.narrow_grad, grads.wte, nullptr, outside.logits, outside.lnf_out, params.wte, N, C,
                    Vp);
    std::memset(workspace.stream_grad, 0, sizeof(float) * N * C);
    layernorm_backward(workspace.stream_grad, grads.lnfw, grads.lnfb, workspace.narrow_grad, outside.lnf_in,
                       params.lnfw, workspace.ln_stats, N, C);
    for (int l = L - 1; l >= 0; l--) block_backward(l);
    dropout_backward(workspace.branch, outside.embedding_dropout_mask, workspace.stream_grad, int64_t(N) * C,
                     shape.dropout);
    embedding_backward(grads.wte, grads.wpe, workspace.branch, inputs, B, T, C);
}

}  // namespace tpsp
