// How a rank takes part in tensor parallelism: the group's size and this
// rank's place in it, whether sequence parallelism is on, and which
// communication hides behind which GEMM (docs/design.md §3, §4). Plain
// values: no MPI, no kernels, so that the config and the memory report can
// describe a layout without launching one.
#pragma once

namespace tpsp {

// The tp_comm_* switches resolved: the master switch and rs_dgrad already applied.
struct OverlapSettings {
    bool ag = false;           // tp_comm_overlap_ag
    bool rs = false;           // tp_comm_overlap_rs
    bool rs_pipeline = false;  // tp_comm_rs_method: pipeline (else ring)
    bool bulk_dgrad = false;   // tp_comm_bulk_dgrad
    bool bulk_wgrad = false;   // tp_comm_bulk_wgrad
    bool rs_dgrad = false;     // tp_comm_overlap_rs_dgrad
    int num_splits = 4;        // tp_comm_num_splits
    bool any() const { return ag || rs || bulk_dgrad || bulk_wgrad || rs_dgrad; }
};

struct TensorParallelism {
    int size = 1;  // t
    int rank = 0;
    bool sequence_parallel = true;  // SP; false: Megatron's TP-only f / f̄
    OverlapSettings overlap;        // which communication hides behind which GEMM

    // SP shards anything only in a group of more than one rank: then
    // LayerNorm, dropout and the residual run on a sequence shard, g / ḡ
    // all-gather and reduce-scatter, and the replicated parameters'
    // gradients are partial per rank.
    bool sequence_parallel_active() const { return sequence_parallel && size > 1; }
    // Rows of the sequence this rank holds outside the TP region: s/t under SP, s without.
    int local_seq(int seq_len) const { return sequence_parallel ? seq_len / size : seq_len; }
    // The first of them.
    int seq_start(int seq_len) const { return sequence_parallel ? rank * local_seq(seq_len) : 0; }
};

}  // namespace tpsp
