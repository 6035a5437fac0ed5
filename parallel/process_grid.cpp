#include "parallel/process_grid.h"

namespace tpsp {

static Communicator split(int color, int key) {
    MPI_Comm comm;
    MPI_Comm_split(MPI_COMM_WORLD, color, key, &comm);
    return Communicator(comm);
}

ProcessGrid make_process_grid(int tp, int cp) {
    ProcessGrid g;
    MPI_Comm_rank(MPI_COMM_WORLD, &g.world_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g.world_size);
    g.tp = tp;
    g.cp = cp;
    g.dp = g.world_size / (tp * cp);
    g.tp_rank = g.world_rank % tp;
    g.cp_rank = g.world_rank / tp % cp;
    g.dp_rank = g.world_rank / (tp * cp);
    g.replicas = g.dp * cp;
    g.replica_rank = g.dp_rank * cp + g.cp_rank;
    g.tp_group = split(g.world_rank / tp, g.tp_rank);           // the same dp and cp index
    g.cp_group = split(g.dp_rank * tp + g.tp_rank, g.cp_rank);  // the same dp and tp index
    g.dp_group = split(g.cp_rank * tp + g.tp_rank, g.dp_rank);  // the same cp and tp index
    g.replica_group = split(g.tp_rank, g.replica_rank);         // the same tp index
    return g;
}

}  // namespace tpsp
