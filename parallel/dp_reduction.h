// The data-parallel sum of one rank's gradient buffer, bucket by bucket
// (docs/design.md §8). Each bucket is reduce-scattered (each rank sums its
// piece over the ranks, in rank order) and then, unless each rank updates
// only its piece (the distributed optimizer), all-gathered. With
// parallel.overlap_grad_reduce a bucket starts as soon as backward has made
// it final, and its transfers move on while backward computes; without, all
// start after backward. Every element is summed in the same order either
// way, so every mode trains the same bits.
//
// MPI matches the collectives of a communicator by the order the ranks start
// them in. The reduce-scatters start in one order on every rank (by stage,
// then bucket); an all-gather starts once its reduce-scatter has completed,
// which each rank sees at its own moment, so the all-gathers run on a second
// communicator of the same ranks, in the same order as the reduce-scatters.
// A group whose operations run in the order they are enqueued on its one
// stream (NCCL: Comm::runs_in_enqueue_order) needs neither: each bucket's
// all-gather is enqueued right behind its reduce-scatter on the same group,
// so every rank enqueues the same sequence and no rank's order depends on
// when it polls (two NCCL groups enqueued in different orders on different
// ranks can deadlock).
#pragma once
#include <algorithm>
#include <cstddef>
#include <limits>
#include <vector>

#include "parallel/dp_buckets.h"

namespace tpsp {

template <class Comm>
class GradientReduction {
public:
    using Transfer = typename Comm::Transfer;
    // grads: the flat buffer the layout describes; gather_comm: the same
    // ranks as comm, for the all-gathers (comm itself where it runs in enqueue order)
    GradientReduction(Comm& comm, Comm& gather_comm, const BucketLayout& layout, float* grads, bool gather_after)
        : comm_(comm), gather_comm_(Comm::runs_in_enqueue_order ? comm : gather_comm), layout_(layout), grads_(grads),
          gather_after_(gather_after) {
        for (size_t b = 0; b < layout.buckets().size(); b++) order_.push_back(b);
        std::stable_sort(order_.begin(), order_.end(), [&](size_t a, size_t b) {
            return layout.buckets()[a].final_at < layout.buckets()[b].final_at;
        });
        flights_.resize(order_.size());
    }

    // A new step: nothing started yet.
    void begin() {
        started_ = gathered_ = 0;
        for (Flight& f : flights_) f = {};
    }
    // Starts the reduce-scatter of every bucket final at `stage` or before.
    void start_final(int stage) {
        while (started_ < order_.size() && layout_.buckets()[order_[started_]].final_at <= stage) {
            const size_t b = order_[started_];
            flights_[started_].reduce = comm_.start_reduce_scatter_blocks(grads_ + layout_.buckets()[b].begin,
                                                                          layout_.counts(b), layout_.offsets(b),
                                                                          "DP reduce-scatter of gradients");
            started_++;
            if constexpr (Comm::runs_in_enqueue_order) start_gather(gathered_++);  // right behind it
        }
    }
    // Moves every transfer on; a completed reduce-scatter's all-gather starts
    // (in start order). True while any is in flight.
    bool move_on() {
        bool any = false;
        for (size_t i = 0; i < started_; i++) {
            if (!comm_.test(flights_[i].reduce)) any = true;
            if (gather_after_ && !gather_comm_.test(flights_[i].gather)) any = true;
        }
        start_gathers();
        return any || gathered_ < started_;
    }
    // Starts what is left and waits for every bucket: the time spent here is exposed.
    void finish() {
        start_final(std::numeric_limits<int>::max());
        for (size_t i = 0; i < started_; i++) {
            comm_.wait(flights_[i].reduce);
            start_gathers();
        }
        for (size_t i = 0; i < started_ && gather_after_; i++) gather_comm_.wait(flights_[i].gather);
    }

private:
    struct Flight {
        Transfer reduce, gather;
    };
    // the all-gathers of the completed reduce-scatters, in start order
    void start_gathers() {
        while (gathered_ < started_ && !flights_[gathered_].reduce.active) start_gather(gathered_++);
    }
    // the all-gather of the i-th bucket started, where the buckets are gathered
    void start_gather(size_t i) {
        if (!gather_after_) return;
        const size_t b = order_[i];
        flights_[i].gather = gather_comm_.start_all_gather_blocks(
            grads_ + layout_.buckets()[b].begin, layout_.counts(b), layout_.offsets(b), "DP all-gather of gradients");
    }
    Comm& comm_;
    Comm& gather_comm_;
    const BucketLayout& layout_;
    float* grads_;
    bool gather_after_;
    std::vector<size_t> order_;    // the buckets in the order they start: by final_at, then index
    std::vector<Flight> flights_;  // [i]: the transfers of bucket order_[i]
    size_t started_ = 0, gathered_ = 0;
};

// The distributed optimizer's updated pieces, all-gathered to every rank
// after the update. With parallel.overlap_param_gather they start then, in
// the order the next forward reads them (by needed_at, then bucket), and
// that forward waits before each stage only for the buckets the stage reads
// (wait_needed), the linears polling the others between their GEMM tiles;
// anything else that reads the parameters (validation, sampling, a save)
// waits for all first (finish). Without the switch, start() and finish()
// follow each other.
template <class Comm>
class ParameterGather {
public:
    using Transfer = typename Comm::Transfer;
    ParameterGather(Comm& comm, const BucketLayout& layout, float* params)
        : comm_(comm), layout_(layout), params_(params) {
        for (size_t b = 0; b < layout.buckets().size(); b++) order_.push_back(b);
        std::stable_sort(order_.begin(), order_.end(), [&](size_t a, size_t b) {
            return layout.buckets()[a].needed_at < layout.buckets()[b].needed_at;
        });
        gathers_.resize(order_.size());
    }

    void start() {
        for (size_t i = 0; i < order_.size(); i++) {
            const size_t b = order_[i];
            gathers_[i] = comm_.start_all_gather_blocks(params_ + layout_.buckets()[b].begin, layout_.counts(b),
                                                        layout_.offsets(b), "DP all-gather of parameters");
        }
        waited_ = 0;
        pending_ = true;
    }
    // Waits for every bucket that forward stage `stage` reads.
    void wait_needed(int stage) {
        for (; waited_ < order_.size() && layout_.buckets()[order_[waited_]].needed_at <= stage; waited_++)
            comm_.wait(gathers_[waited_]);
        pending_ = waited_ < order_.size();
    }
    // Moves the gathers on; true while any is in flight.
    bool move_on() {
        bool any = false;
        for (size_t i = waited_; i < order_.size(); i++)
            if (!comm_.test(gathers_[i])) any = true;
        return any;
    }
    void finish() { wait_needed(std::numeric_limits<int>::max()); }
    bool pending() const { return pending_; }

private:
    Comm& comm_;
    const BucketLayout& layout_;
    float* params_;
    std::vector<size_t> order_;      // the buckets in the order forward reads them
    std::vector<Transfer> gathers_;  // [i]: bucket order_[i]'s
    size_t waited_ = 0;              // gathers_[0, waited_) are complete
    bool pending_ = false;
};

}  // namespace tpsp
