#include "parallel/process_grid.h"

namespace tpsp {

ProcessGrid make_process_grid(int tp) {
    ProcessGrid g;
    MPI_Comm_rank(MPI_COMM_WORLD, &g.world_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g.world_size);
    g.tp = tp;
    g.dp = g.world_size / tp;
    g.tp_rank = g.world_rank % tp;
    g.dp_rank = g.world_rank / tp;
    MPI_Comm tp_comm, dp_comm;
    MPI_Comm_split(MPI_COMM_WORLD, g.dp_rank, g.tp_rank, &tp_comm);  // same dp index: one TP group
    MPI_Comm_split(MPI_COMM_WORLD, g.tp_rank, g.dp_rank, &dp_comm);  // same tp index: one DP group
    g.tp_group = Communicator(tp_comm);
    g.dp_group = Communicator(dp_comm);
    return g;
}

}  // namespace tpsp
