// The two mappings at the borders of the tensor-parallel region (docs/design.md §3).
//
//                      forward                      backward
//   g  (entering TP)   SP: all-gather the sequence   SP: reduce-scatter
//                      TP-only (f): identity         TP-only (f): all-reduce
//   ḡ  (leaving TP)    SP: reduce-scatter            SP: all-gather
//                      TP-only (f̄): all-reduce       TP-only (f̄): identity
//
// Tensors are sequence-major, so a sequence shard [s/t, b, h] is a
// contiguous 1/t of the full [s, b, h] and the collectives are plain
// concatenations. In TP-only mode "local" and "full" are the same tensor:
// the functions then return the pointer they were given instead of copying.
// Comm is the MPI Communicator or the NcclCommunicator; T its element (float
// or bf16).
#pragma once
#include <cstddef>

#include "parallel/layout.h"

namespace tpsp {

template <class Comm>
class TensorParallelMappings {
public:
    TensorParallelMappings(Comm* group, bool sequence_parallel)
        : group_(group), sequence_parallel_(sequence_parallel) {}

    // full_count: elements of the full [s, b, h] tensor.
    // g forward: local → full. Returns the full tensor (`full`, or `local` without SP).
    template <class T>
    const T* g_forward(const T* local, T* full, size_t full_count) {
        return gather_to_full(local, full, full_count);
    }
    // g backward: the partial gradient of the full tensor → this rank's local
    // gradient. Returns `local` (SP) or `partial_full`, all-reduced in place.
    template <class T>
    T* g_backward(T* partial_full, T* local, size_t full_count) {
        return sum_to_local(partial_full, local, full_count);
    }
    // ḡ forward: partial sums of the full tensor → local. Same returns as g_backward.
    template <class T>
    T* gbar_forward(T* partial_full, T* local, size_t full_count) {
        return sum_to_local(partial_full, local, full_count);
    }
    // ḡ backward: local gradient → full gradient. Same returns as g_forward.
    template <class T>
    const T* gbar_backward(const T* local, T* full, size_t full_count) {
        return gather_to_full(local, full, full_count);
    }

    bool sequence_parallel() const { return sequence_parallel_; }
    Comm& group() { return *group_; }

private:
    template <class T>
    T* sum_to_local(T* partial_full, T* local, size_t full_count) {
        if (!sequence_parallel_) {
            group_->all_reduce_sum(partial_full, full_count);
            return partial_full;
        }
        group_->reduce_scatter(partial_full, local, full_count / group_->size());
        return local;
    }
    template <class T>
    const T* gather_to_full(const T* local, T* full, size_t full_count) {
        if (!sequence_parallel_) return local;
        group_->all_gather(local, full, full_count / group_->size());
        return full;
    }
    Comm* group_;
    bool sequence_parallel_;
};

// Context parallelism's two mappings around the attention core (seed 002
// §5, Megatron's all_to_all_sp2hp / all_to_all_hp2sp, "Ulysses"), one
// all-to-all each over the CP group. A row of the attention's input holds
// `sections` parts (Q, K and V: 3; the output: 1) of `heads` heads of
// `head_size` channels, this TP rank's heads:
//
//   sp2hp: [s/cp, b, sections·heads·hs], this CP rank's positions (chunks
//          r and 2cp−1−r, layout.h)
//       →  [s, b, sections·(heads/cp)·hs], every position in global order,
//          for this CP rank's heads/cp of the heads (the r-th run of them)
//   hp2sp: the reverse.
//
// Each is a permutation of the elements across the group, so the backward
// of one is the other applied to the gradients: sp2hp's backward is hp2sp,
// and hp2sp's is sp2hp.
template <class Comm>
class ContextParallelMappings {
public:
    ContextParallelMappings(Comm* group, int sections, int heads, int head_size, int seq_len, int batch)
        : group_(group), cp_{group->size(), group->rank()}, sections_(sections), heads_(heads), head_size_(head_size),
          seq_len_(seq_len), batch_(batch) {}

    // Elements of either side: the local [s/cp, b, sections·heads·hs] and the
    // head-sharded [s, b, sections·(heads/cp)·hs] hold as many.
    size_t count() const { return size_t(seq_len_ / cp_.size) * batch_ * sections_ * heads_ * head_size_; }

    // sp2hp forward (hp2sp backward). send, receive: scratch of count() elements.
    template <class T>
    void sequence_to_heads(const T* local, T* full, T* send, T* receive) {
        // block c of send: every local row, the columns of CP rank c's heads
        for (int c = 0; c < cp_.size; c++)
            for (int section = 0; section < sections_; section++)
                group_->copy_rows(send + block(c) + size_t(section) * head_width(), full_width(),
                                  local + size_t(section) * heads_ * head_size_ + size_t(c) * head_width(),
                                  local_width(), size_t(local_rows()), head_width());
        group_->all_to_all(send, receive, block(1));
        // block c of receive: CP rank c's two chunks, for this rank's heads
        for (int c = 0; c < cp_.size; c++)
            for (int half = 0; half < 2; half++)
                group_->copy(full + chunk_at(cp_.chunk_of(c, half)), receive + block(c) + chunk_at(half),
                             chunk_elements());
    }

    // hp2sp forward (sp2hp backward). send, receive: scratch of count() elements.
    template <class T>
    void heads_to_sequence(const T* full, T* local, T* send, T* receive) {
        // block c of send: CP rank c's two chunks, this rank's heads
        for (int c = 0; c < cp_.size; c++)
            for (int half = 0; half < 2; half++)
                group_->copy(send + block(c) + chunk_at(half), full + chunk_at(cp_.chunk_of(c, half)),
                             chunk_elements());
        group_->all_to_all(send, receive, block(1));
        // block c of receive: this rank's rows, the columns of CP rank c's heads
        for (int c = 0; c < cp_.size; c++)
            for (int section = 0; section < sections_; section++)
                group_->copy_rows(local + size_t(section) * heads_ * head_size_ + size_t(c) * head_width(),
                                  local_width(), receive + block(c) + size_t(section) * head_width(), full_width(),
                                  size_t(local_rows()), head_width());
    }

private:
    int local_rows() const { return seq_len_ / cp_.size * batch_; }
    size_t head_width() const { return size_t(heads_ / cp_.size) * head_size_; }  // one section's, per CP rank
    size_t full_width() const { return size_t(sections_) * head_width(); }        // a row of the head-sharded side
    size_t local_width() const { return size_t(sections_) * heads_ * head_size_; }
    size_t block(int c) const { return size_t(c) * local_rows() * full_width(); }
    size_t chunk_elements() const { return size_t(cp_.chunk_len(seq_len_)) * batch_ * full_width(); }
    size_t chunk_at(int chunk) const { return size_t(chunk) * chunk_elements(); }  // rows are sequence-major
    Comm* group_;
    ContextParallelism cp_;
    int sections_, heads_, head_size_, seq_len_, batch_;
};

}  // namespace tpsp
