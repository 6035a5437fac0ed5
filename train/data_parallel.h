// The data-parallel side of one training step (docs/design.md §8), on any
// backend: the gradient buffer cut into buckets, their sum over the replica
// group (dp × cp) as a reduce-scatter and, unless each rank updates only its
// piece (the distributed optimizer), an all-gather; the gradient norm,
// computed one way in every mode; and with the distributed optimizer the
// all-gather of the updated pieces. The trainer runs it over MPI or NCCL,
// and the stand-in tests run the very same code over a group of threads
// (tests/data_parallel_training.h).
//
// In a step:
//   first_forward        the step's first forward, waiting per stage for the
//                        parameters whose gathers are still in flight
//   last_backward        the last micro-batch's backward, starting each
//                        bucket's reduction once backward has made it final
//                        (parallel.overlap_grad_reduce)
//   reduce_grads         starts what is left, waits for every bucket
//   grad_norm            ‖g‖ over the whole model
//   (the optimizer's update)
//   gather_updated_parameters   the distributed optimizer's pieces, to every
//                        rank; with parallel.overlap_param_gather behind the
//                        next forward
// and parameters_ready before anything else reads the parameters.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "model/gpt.h"
#include "parallel/dp_buckets.h"
#include "parallel/dp_reduction.h"
#include "parallel/overlap.h"
#include "train/adamw.h"

namespace tpsp {

struct DataParallelSettings {
    int64_t bucket_size = 250000;  // parameters per bucket (parallel.bucket_size)
    bool distributed_optimizer = false, overlap_grad_reduce = false, overlap_param_gather = false;
};

template <class Backend>
class DataParallelStep {
public:
    using Comm = typename Backend::Comm;
    // replicas: every rank holding these parameters (dp × cp), which sums
    // the gradients and gathers the parameters; gathers: the same ranks again,
    // for the gradients' all-gathers (dp_reduction.h; unused where the group
    // runs in enqueue order, which may pass replicas); tp: the model's group.
    DataParallelStep(GPTModel<Backend>& model, Comm& replicas, Comm& gathers, Comm& tp,
                     const DataParallelSettings& settings)
        : model_(model), replicas_(replicas), tp_(tp), settings_(settings),
          buckets_(bucket_units(model.parameter_specs), settings.bucket_size, replicas.size()),
          reduction_(replicas, gathers, buckets_, model.grads.wte, !settings.distributed_optimizer) {
        if (settings.distributed_optimizer)
            parameter_gather_ = std::make_unique<ParameterGather<Comm>>(replicas, buckets_, model.params.wte);
        cut_norm_ranges();
        norm_parts_.assign(2 * buckets_.buckets().size() * size_t(replicas.size()), 0.0);  // the step allocates nothing
        norm_sums_.assign(2 * buckets_.buckets().size(), 0.0);
    }
    // the reduction and the gather hold references to buckets_: never copied or moved
    DataParallelStep(const DataParallelStep&) = delete;
    DataParallelStep& operator=(const DataParallelStep&) = delete;

    const BucketLayout& buckets() const { return buckets_; }
    // what the optimizer's state covers: this rank's pieces (distributed), or everything (null)
    const BucketLayout* optimizer_shards() const { return settings_.distributed_optimizer ? &buckets_ : nullptr; }

    // The step's first forward, waiting before each stage for the parameters
    // it reads where their gathers are still in flight, and moving the others
    // on between its GEMM tiles.
    float first_forward(const int* inputs, const int* targets, const DropoutStep& draw) {
        if (!parameter_gather_ || !parameter_gather_->pending()) return model_.forward(inputs, targets, draw);
        background_transfers.move_on = [this] { return parameter_gather_->move_on(); };
        const float loss = model_.forward(inputs, targets, draw, true,
                                          [this](int stage) { parameter_gather_->wait_needed(stage); });
        background_transfers = {};
        return loss;
    }

    // The step's last backward. With parallel.overlap_grad_reduce each
    // bucket's reduction starts once backward has made it final, and moves on
    // between the GEMM tiles of the rest of backward (on the GPU, on the
    // group's own stream).
    void last_backward(float dloss) {
        reduction_.begin();
        reduction_begun_ = true;
        if (!settings_.overlap_grad_reduce || replicas_.size() == 1) {
            model_.backward(dloss);
            return;
        }
        background_transfers.move_on = [this] { return reduction_.move_on(); };
        model_.backward(dloss, [this](int stage) {
            reduction_.start_final(stage);
            background_transfers.poll();
        });
        background_transfers = {};
    }

    // A pipeline's step (train/pipeline_step.h) runs its schedule between
    // pipeline_begins() and reduce_grads(): each chunk's first forward waits
    // per stage for the parameters it reads (overlap_param_gather), each
    // chunk's last backward starts the buckets it makes final
    // (overlap_grad_reduce: a stage's chunks finish last block first, as one
    // model's backward does), and move_on() moves both on between GEMM tiles.
    void pipeline_begins() {
        if (!settings_.overlap_grad_reduce || replicas_.size() == 1) return;
        reduction_.begin();
        reduction_begun_ = true;
    }
    bool gathers_pending() const { return parameter_gather_ && parameter_gather_->pending(); }
    void wait_parameters(int stage) {
        if (gathers_pending()) parameter_gather_->wait_needed(stage);
    }
    bool overlaps_grad_reduce() const { return reduction_begun_; }
    void grads_final(int stage) { reduction_.start_final(stage); }
    bool move_on() {
        bool in_flight = false;
        if (gathers_pending()) in_flight |= parameter_gather_->move_on();
        if (reduction_begun_) in_flight |= reduction_.move_on();
        return in_flight;
    }

    // The buckets backward did not start start now; the wait for them is
    // exposed. Every element is summed in the same order in every mode.
    // (A pipeline's step ran no last_backward: every bucket starts here.)
    void reduce_grads() {
        if (!reduction_begun_) reduction_.begin();
        reduction_begun_ = false;
        if (replicas_.size() > 1) reduction_.finish();
    }

    // ‖g‖ over the whole model, computed one way in every mode: the square
    // sums of each rank's piece of each bucket (sharded and replicated tensors
    // apart), added over the replicas in rank order, then over the buckets in
    // order; the sharded part over the TP group. Where every rank holds the
    // whole reduced gradient it computes every rank's pieces itself: the
    // same sums. Under a pipeline, each stage's sum of squares added over the
    // stages in order (`stages`), the tied wte counted on the first only.
    float grad_norm(Communicator* stages = nullptr) {
        const size_t buckets = buckets_.buckets().size();
        const int replicas = replicas_.size(), me = replicas_.rank();
        const bool own_pieces_only = settings_.distributed_optimizer;
        for (int q = 0; q < replicas; q++) {
            if (own_pieces_only && q != me) continue;
            for (size_t b = 0; b < buckets; b++)
                Backend::square_sums(model_.grads.wte, norm_ranges_[size_t(q)][b],
                                     &norm_parts_[(size_t(q) * buckets + b) * 2]);
        }
        if (own_pieces_only) {
            std::copy_n(&norm_parts_[size_t(me) * 2 * buckets], 2 * buckets, norm_sums_.data());
            replicas_.all_reduce_sum(norm_sums_.data(), norm_sums_.size());  // in rank order
        } else {
            sum_in_rank_order(norm_sums_.data(), norm_parts_.data(), norm_sums_.size(), replicas, norm_sums_.size());
        }
        double sharded = 0.0, replicated = 0.0;
        for (size_t b = 0; b < buckets; b++) sharded += norm_sums_[2 * b], replicated += norm_sums_[2 * b + 1];
        tp_.all_reduce_sum(&sharded, 1);  // shards add up; replicated tensors count once
        double squares = sharded + replicated;
        if (stages) stages->all_reduce_sum(&squares, 1);
        return float(std::sqrt(squares));
    }

    // The distributed optimizer's rank updated its piece of each bucket: every
    // rank gathers the others'. With parallel.overlap_param_gather the gathers
    // go on behind the next forward (first_forward).
    void gather_updated_parameters() {
        if (!parameter_gather_) return;
        parameter_gather_->start();
        if (!settings_.overlap_param_gather) parameter_gather_->finish();
    }

    // Those gathers complete: before validation, sampling, a save or the end.
    void parameters_ready() {
        if (parameter_gather_ && parameter_gather_->pending()) parameter_gather_->finish();
    }

private:
    // rank q's piece of bucket b, cut where its tensors change between
    // TP-sharded (sum 0) and replicated (sum 1): norm_ranges_[q][b]
    void cut_norm_ranges() {
        std::vector<SquareSumRange> tensors;
        int64_t at = 0;
        const bool wte_counted_elsewhere = !model_.part.embeddings;  // a pipeline's last stage: the first counts it
        for (const TensorSpec& p : model_.parameter_specs) {
            if (!(p.name == "wte" && wte_counted_elsewhere))
                tensors.push_back({at, p.elements(), parameter_is_replicated(p.name) ? 1 : 0});
            at += p.elements();
        }
        norm_ranges_.assign(size_t(buckets_.dp()), {});
        for (int q = 0; q < buckets_.dp(); q++)
            for (size_t b = 0; b < buckets_.buckets().size(); b++) {
                const FlatRange piece = buckets_.piece(b, q);
                std::vector<SquareSumRange> cut;
                for (const SquareSumRange& t : tensors) {
                    const int64_t from = std::max(piece.begin, t.begin);
                    const int64_t to = std::min(piece.begin + piece.count, t.begin + t.count);
                    if (from < to) cut.push_back({from, to - from, t.sum});
                }
                norm_ranges_[size_t(q)].push_back(cut);
            }
    }

    GPTModel<Backend>& model_;
    Comm& replicas_;
    Comm& tp_;
    DataParallelSettings settings_;
    BucketLayout buckets_;  // the gradient buffer's buckets and each rank's piece of them
    GradientReduction<Comm> reduction_;
    std::unique_ptr<ParameterGather<Comm>> parameter_gather_;            // with the distributed optimizer
    std::vector<std::vector<std::vector<SquareSumRange>>> norm_ranges_;  // [replica rank][bucket]
    std::vector<double> norm_parts_, norm_sums_;                         // grad_norm's, made once
    bool reduction_begun_ = false;                                       // by last_backward, this step
};

}  // namespace tpsp
