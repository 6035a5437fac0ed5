// The two mappings at the borders of the tensor-parallel region (DESIGN §3).
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
#pragma once
#include <cstddef>

#include "parallel/communicator.h"

namespace tpsp {

class TensorParallelMappings {
public:
    TensorParallelMappings(Communicator* group, bool sequence_parallel)
        : group_(group), sequence_parallel_(sequence_parallel) {}

    // full_count: elements of the full [s, b, h] tensor.
    // g forward: local → full. Returns the full tensor (`full`, or `local` without SP).
    const float* g_forward(const float* local, float* full, size_t full_count);
    // g backward: the partial gradient of the full tensor → this rank's local
    // gradient. Returns `local` (SP) or `partial_full`, all-reduced in place.
    float* g_backward(float* partial_full, float* local, size_t full_count);
    // ḡ forward: partial sums of the full tensor → local. Same returns as g_backward.
    float* gbar_forward(float* partial_full, float* local, size_t full_count);
    // ḡ backward: local gradient → full gradient. Same returns as g_forward.
    const float* gbar_backward(const float* local, float* full, size_t full_count);

    bool sequence_parallel() const { return sequence_parallel_; }
    Communicator& group() { return *group_; }

private:
    float* sum_to_local(float* partial_full, float* local, size_t full_count);
    const float* gather_to_full(const float* local, float* full, size_t full_count);
    Communicator* group_;
    bool sequence_parallel_;
};

}  // namespace tpsp
