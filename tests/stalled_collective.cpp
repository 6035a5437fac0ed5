// For Faults.AStalledPeerInAGatherEndsTheJobAfterParallelTimeout: under
// mpirun -np 2, rank 1 stalls 30 s before the gather WHAT (trace: the trace
// file's two gathers; gather: the Communicator's, which saves use), and
// rank 0, whose deadline is 2 s, must give up on it and end the job.
//   stalled_gather trace|gather
#include <mpi.h>
#include <unistd.h>

#include <string>

#include "parallel/communicator.h"
#include "parallel/trace.h"

int main(int argc, char** argv) {
    MPI_Init(&argc, &argv);
    tpsp::set_peer_timeout(2.0);
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm world = MPI_COMM_WORLD;
    if (rank == 1) sleep(30);
    if (argc > 1 && std::string(argv[1]) == "trace") {
        tpsp::Tracer tracer;
        tracer.enable(1);
        tracer.record("forward", tpsp::Track::compute, 0.0, 1.0);
        tracer.write(std::string(P_tmpdir) + "/tpsp_stalled_gather_trace.json", rank, &world);
    } else {
        const float shard[2] = {1.0f, 2.0f};
        float full[4];
        tpsp::Communicator(world).gather(shard, full, 2, 0);
    }
    MPI_Finalize();
    return 0;
}
