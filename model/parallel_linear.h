// The column- and row-parallel linears of a TP group, with the
// communication that borders them (g before a column-parallel linear, ḡ
// after a row-parallel one) either plain or overlapped with the GEMMs by
// the schedules of parallel/overlap.h, as the tp_comm_* switches say.
//
// Rows: N = s·b of the full activations, N_local = N/t of a sequence shard
// (N without SP). Tensors are sequence-major, so rank c's shard is rows
// [c·N_local, (c+1)·N_local).
#pragma once
#include "parallel/communicator.h"
#include "parallel/mappings.h"

namespace tpsp {

// DESIGN §4's switches, resolved: the master switch and rs_dgrad already applied.
struct OverlapSettings {
    bool ag = false;          // tp_comm_overlap_ag
    bool rs = false;          // tp_comm_overlap_rs
    bool rs_pipeline = false; // tp_comm_rs_method: pipeline (else ring)
    bool bulk_dgrad = false;  // tp_comm_bulk_dgrad
    bool bulk_wgrad = false;  // tp_comm_bulk_wgrad
    bool rs_dgrad = false;    // tp_comm_overlap_rs_dgrad
    int num_splits = 4;       // tp_comm_num_splits
    bool any() const { return ag || rs || bulk_dgrad || bulk_wgrad || rs_dgrad; }
};

class ParallelLinears {
public:
    // rs_scratch: 3 · N_local · h floats when an overlapped reduce-scatter is on
    // (the ring's buffers in flight, or the pipeline's received parts).
    ParallelLinears(Communicator* group, bool sequence_parallel, const OverlapSettings& overlap, int N, int N_local,
                    float* rs_scratch);

    // Column-parallel: out [N, OC] = g(x_local [N_local, C]) @ weight^T + bias.
    // gathered [N, C] is scratch (the all-gathered input).
    void column_forward(const char* name, float* out, const float* x_local, float* gathered, const float* weight,
                        const float* bias, int C, int OC);
    // Its backward: dweight, dbias accumulate; returns dL/dx_local [N_local, C]
    // (in local_grad, or in partial without SP). Re-gathers the saved shard
    // x_local into gathered; partial [N, C] holds the dgrad before its reduction.
    const float* column_backward(const char* name, const float* dout, const float* x_local, float* gathered,
                                 float* partial, float* local_grad, const float* weight, float* dweight,
                                 float* dbias, int C, int OC);

    // Row-parallel without its bias: y_local [N_local, OC] = ḡ(inp [N, K] @ weight^T).
    // Returns y (local, or partial without SP); partial [N, OC] is scratch.
    float* row_forward(const char* name, const float* inp, float* partial, float* local, const float* weight, int K,
                       int OC);
    // Its backward: dinp [N, K] (overwritten) from dy_local [N_local, OC]; dweight accumulates.
    // gathered [N, OC] receives ḡ's all-gather of dy.
    void row_backward(const char* name, float* dinp, const float* dy_local, float* gathered, const float* inp,
                      const float* weight, float* dweight, int K, int OC);

private:
    bool overlapping() const { return sequence_parallel_ && group_->size() > 1; }
    Communicator* group_;
    TensorParallelMappings mappings_;
    bool sequence_parallel_;
    OverlapSettings overlap_;
    int N_, N_local_;
    float* rs_scratch_;
};

}  // namespace tpsp
