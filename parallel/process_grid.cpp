#include "parallel/process_grid.h"

namespace tpsp {

static Communicator split(int color, int key) {
    MPI_Comm comm;
    MPI_Comm_split(MPI_COMM_WORLD, color, key, &comm);
    return Communicator(comm);
}

ProcessGrid make_process_grid(int tp, int cp, int pp) {
    ProcessGrid g;
    MPI_Comm_rank(MPI_COMM_WORLD, &g.world_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g.world_size);
    g.tp = tp;
    g.cp = cp;
    g.pp = pp;
    g.dp = g.world_size / (tp * cp * pp);
    g.tp_rank = g.world_rank % tp;
    g.cp_rank = g.world_rank / tp % cp;
    g.dp_rank = g.world_rank / (tp * cp) % g.dp;
    g.pp_rank = g.world_rank / (tp * cp * g.dp);
    g.replicas = g.dp * cp;
    g.replica_rank = g.dp_rank * cp + g.cp_rank;
    const int stage = g.pp_rank;
    g.tp_group = split(g.world_rank / tp, g.tp_rank);                            // the same pp, dp and cp index
    g.cp_group = split((stage * g.dp + g.dp_rank) * tp + g.tp_rank, g.cp_rank);  // the same pp, dp and tp index
    g.dp_group = split((stage * cp + g.cp_rank) * tp + g.tp_rank, g.dp_rank);    // the same pp, cp and tp index
    g.replica_group = split(stage * tp + g.tp_rank, g.replica_rank);             // the same pp and tp index
    g.stage_group = split(g.world_rank % (tp * cp * g.dp), g.pp_rank);           // the same dp, cp and tp index
    return g;
}

}  // namespace tpsp
