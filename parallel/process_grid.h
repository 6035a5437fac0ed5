// world = pp × dp × cp × tp: tensor-parallel ranks adjacent (ranks 0..t−1 form the
// first TP group), so that on a multi-GPU machine a TP group shares the
// fastest links; then the context-parallel ranks, then the data-parallel
// ones, and the pipeline stages outermost (Megatron's order: tp innermost,
// pp outermost, so that a stage's ranks are adjacent too).
//
//   world rank = ((pp_rank · dp + dp_rank) · cp + cp_rank) · tp + tp_rank
//
// The dp × cp ranks of one tp_rank hold the same parameters (the CP ranks of
// a replica see other positions of the same sequences) and sum their
// gradients: that is the replica group, over which the gradient buckets and
// the distributed optimizer's pieces are cut (Megatron's data-parallel group
// with context parallelism), within one pipeline stage. The data is read per
// DP rank. The pp ranks of one (dp, cp, tp) index form a pipeline: stage_group.
#pragma once
#include <mpi.h>

#include "parallel/communicator.h"

namespace tpsp {

struct ProcessGrid {
    int world_rank = 0, world_size = 1;
    int tp = 1, cp = 1, dp = 1, pp = 1;  // group sizes
    int tp_rank = 0, cp_rank = 0, dp_rank = 0, pp_rank = 0;
    int replicas = 1, replica_rank = 0;  // dp · cp, and dp_rank · cp + cp_rank
    Communicator tp_group, cp_group, dp_group, replica_group, stage_group;
};

// Splits MPI_COMM_WORLD; tp · cp · pp must divide the world size (checked by the caller).
ProcessGrid make_process_grid(int tp, int cp = 1, int pp = 1);

}  // namespace tpsp
