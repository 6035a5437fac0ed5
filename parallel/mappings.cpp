#include "parallel/mappings.h"

namespace tpsp {

const float* TensorParallelMappings::gather_to_full(const float* local, float* full, size_t full_count) {
    if (!sequence_parallel_) return local;
    group_->all_gather(local, full, full_count / group_->size());
    return full;
}

float* TensorParallelMappings::sum_to_local(float* partial_full, float* local, size_t full_count) {
    if (!sequence_parallel_) {
        group_->all_reduce_sum(partial_full, full_count);
        return partial_full;
    }
    group_->reduce_scatter(partial_full, local, full_count / group_->size());
    return local;
}

const float* TensorParallelMappings::g_forward(const float* local, float* full, size_t full_count) {
    return gather_to_full(local, full, full_count);
}

float* TensorParallelMappings::g_backward(float* partial_full, float* local, size_t full_count) {
    return sum_to_local(partial_full, local, full_count);
}

float* TensorParallelMappings::gbar_forward(float* partial_full, float* local, size_t full_count) {
    return sum_to_local(partial_full, local, full_count);
}

const float* TensorParallelMappings::gbar_backward(const float* local, float* full, size_t full_count) {
    return gather_to_full(local, full, full_count);
}

}  // namespace tpsp
