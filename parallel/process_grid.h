// world = dp × tp, tensor-parallel ranks adjacent (ranks 0..t−1 form the
// first TP group), so that on a multi-GPU machine a TP group shares the
// fastest links.
#pragma once
#include <mpi.h>

#include "parallel/communicator.h"

namespace tpsp {

struct ProcessGrid {
    int world_rank = 0, world_size = 1;
    int tp = 1, dp = 1;  // group sizes
    int tp_rank = 0, dp_rank = 0;
    Communicator tp_group, dp_group;
};

// Splits MPI_COMM_WORLD; tp must divide the world size (checked by the caller).
ProcessGrid make_process_grid(int tp);

}  // namespace tpsp
