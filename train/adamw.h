// AdamW (Loshchilov & Hutter) with decoupled weight decay, global gradient
// norm clipping, and the learning-rate schedule.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "model/gpt.h"
#include "model/tensor_table.h"
#include "parallel/communicator.h"
#include "parallel/dp_buckets.h"

namespace tpsp {

struct AdamWSettings {
    float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.1f;
    bool decay_all = false;
};

// The moments live where the parameters do (the backend's memory), fp32.
// Without a bucket layout they cover every parameter of this rank, in
// parameter order. With one (the distributed optimizer, docs/design.md §8)
// they cover only this DP rank's piece of each bucket, bucket after bucket,
// each piece padded to the bucket's shard: the state is 8 bytes per
// parameter divided by dp.
template <class Backend>
class AdamWOptimizer {
public:
    AdamWOptimizer(const GPTModel<Backend>& model, const AdamWSettings& settings, const BucketLayout* shards = nullptr,
                   int dp_rank = 0)
        : settings_(settings), shards_(shards) {
        std::vector<Piece> tensors;
        int64_t at = 0;
        for (const TensorSpec& t : model.parameter_specs) {
            tensors.push_back({at, at, t.elements(), settings.decay_all || parameter_is_matrix(t.name)});
            at += t.elements();
        }
        state_elements_ = shards ? shards->shard_elements() : model.num_parameters;
        pieces_ = shards ? pieces_of(tensors, *shards, dp_rank) : tensors;
        moment_specs_ = {tensor("m", {{state_elements_, shards ? "N/d" : "N"}}, &m),
                         tensor("v", {{state_elements_, shards ? "N/d" : "N"}}, &v)};
        arena_ = Arena(moment_specs_, Backend::memory());
    }
    // One update of the parameters this rank's state covers; step counts from 1.
    void update(GPTModel<Backend>& model, float lr, float grad_scale, int64_t step) {
        const float b1 = settings_.beta1, b2 = settings_.beta2;
        const AdamWStep s{
            lr, b1, b2, settings_.eps, grad_scale, 1.0f - std::pow(b1, float(step)), 1.0f - std::pow(b2, float(step))};
        for (const Piece& p : pieces_)
            Backend::adamw_update(model.params.wte + p.parameter, model.grads.wte + p.parameter, m + p.state,
                                  v + p.state, p.count, p.decay ? settings_.weight_decay : 0.0f, s);
    }
    bool sharded() const { return shards_ != nullptr; }
    size_t bytes() const { return arena_.bytes(); }             // m and v
    int64_t state_elements() const { return state_elements_; }  // of m, and of v
    // With shards: whole [N] (host memory) = one moment (the backend's
    // memory) of every parameter of this rank's TP shard, from every DP
    // rank's pieces. Collective over dp (the replica group, on the host).
    void gather_moment(const float* moment, float* whole, Communicator& dp) const {
        for (const Piece& p : pieces_) Backend::download(whole + p.parameter, moment + p.state, size_t(p.count) * 4);
        for (size_t b = 0; b < shards_->buckets().size(); b++) {
            dp.all_gather_blocks(whole + shards_->buckets()[b].begin, shards_->counts(b), shards_->offsets(b),
                                 "DP all-gather of AdamW's state");
        }
    }
    // The inverse, on this rank alone: its pieces of whole [N] (host memory), into moment.
    void scatter_moment(const float* whole, float* moment) const {
        for (const Piece& p : pieces_) Backend::upload(moment + p.state, whole + p.parameter, size_t(p.count) * 4);
    }
    float* m = nullptr;  // first and second moments
    float* v = nullptr;

private:
    // count parameters from `parameter` in the flat buffer, their moments from
    // `state`, with one weight decay
    struct Piece {
        int64_t parameter, state, count;
        bool decay;
    };
    // this rank's piece of each bucket, cut at the tensors' boundaries
    static std::vector<Piece> pieces_of(const std::vector<Piece>& tensors, const BucketLayout& shards, int dp_rank) {
        std::vector<Piece> pieces;
        int64_t state = 0;
        for (size_t b = 0; b < shards.buckets().size(); b++) {
            const FlatRange mine = shards.piece(b, dp_rank);
            for (const Piece& t : tensors) {
                const int64_t from = std::max(mine.begin, t.parameter);
                const int64_t to = std::min(mine.begin + mine.count, t.parameter + t.count);
                if (from < to) pieces.push_back({from, state + (from - mine.begin), to - from, t.decay});
            }
            state += shards.buckets()[b].shard;
        }
        return pieces;
    }
    std::vector<TensorSpec> moment_specs_;
    Arena arena_;
    std::vector<Piece> pieces_;
    AdamWSettings settings_;
    const BucketLayout* shards_;
    int64_t state_elements_ = 0;
};

using AdamW = AdamWOptimizer<CpuBackend>;

// The units a bucket is made of: each tensor, or for a tensor of every
// layer ([L, …] in llm.c's layout) each layer's slice, in buffer order, with
// the stage of backward at which each is final (parallel/dp_buckets.h):
// layer l's slice of a TP-sharded tensor after block l's backward, stage
// L − l; the embeddings and the replicated tensors (summed over the TP group
// after backward) at its end, stage L + 1. And the stage of forward that
// first reads it: the embeddings 0, layer l's slices l + 1, the final
// LayerNorm L + 1 (the LM head reads wte, gathered before the embeddings).
inline std::vector<BucketUnit> bucket_units(const std::vector<TensorSpec>& parameters) {
    std::vector<BucketUnit> units;
    int layers = 0;
    for (const TensorSpec& t : parameters)
        if (t.shape.size() > 1 && t.shape[0].symbol == "L") layers = int(t.shape[0].size);
    for (size_t i = 0; i < parameters.size(); i++) {
        const TensorSpec& t = parameters[i];
        const bool layered = t.shape.size() > 1 && t.shape[0].symbol == "L";
        const bool per_block = layered && !parameter_is_replicated(t.name);
        const int64_t slices = layered ? t.shape[0].size : 1;
        const int whole_needed_at = t.name == "lnfw" || t.name == "lnfb" ? layers + 1 : 0;
        if (t.elements() == 0) continue;  // a tensor this pipeline stage does not hold
        for (int64_t l = 0; l < slices; l++)
            units.push_back({t.elements() / slices, int(i), per_block ? layers - int(l) : layers + 1,
                             layered ? int(l) + 1 : whole_needed_at});
    }
    return units;
}

// What one rank holds of the model's state, N its TP shard's parameters:
// fp32 parameters, gradients and AdamW moments, 16N bytes, or with the
// distributed optimizer 8N + 8·(N + padding)/d: Megatron's "16 → 8 + 8/d"
// bytes per parameter. The CUDA backend (gemm_copies) holds bf16 copies of
// the GEMM weights beside them, 2G bytes for G copied elements (G ≈ N): the
// fp32 parameters are the masters, the copies what the GEMMs read. Its
// distributed optimizer shards only the moments, since the kernels other than
// the GEMMs (LayerNorm, biases, embeddings) read every fp32 parameter:
// 18 → 10 + 8/d, where Megatron's bf16 parameters give 6 + 12/d.
struct ModelStateBytes {
    int64_t parameters = 0, gemm_copies = 0, gradients = 0, optimizer = 0;
    int64_t buckets = 0, padding = 0;  // of the layout: elements never sent
    int64_t total() const { return parameters + gemm_copies + gradients + optimizer; }
};
ModelStateBytes model_state_bytes(const GPTConfig& config, int tp, int64_t bucket_size, int dp, bool distributed,
                                  bool gemm_copies = false);
// `tpsp memory`'s table of it for d = 1, 2, 4, 8, plain and distributed (on_gpu: the CUDA backend's).
std::string model_state_table(const GPTConfig& config, int tp, int64_t bucket_size, bool on_gpu = false);

struct LrSchedule {
    float lr, min_lr_ratio;
    int warmup_steps, total_steps;
    bool cosine;
    // step counts from 0
    float at(int step) const;
};

}  // namespace tpsp
