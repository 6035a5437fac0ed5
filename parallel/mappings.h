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

}  // namespace tpsp
