// For Faults.AStalledPeerInACollectiveEndsTheJobAfterParallelTimeout: under
// mpirun -np 2, rank 1 stalls 30 s before the collective WHAT, and rank 0,
// whose deadline is 2 s, must give up on it and end the job with one line
// naming the collective:
//   trace       the trace file's two gathers
//   gather      the Communicator's gather (which saves use)
//   all-to-all  context parallelism's sp2hp / hp2sp all-to-all
//   bucket      a data-parallel gradient bucket's reduce-scatter
//   stalled_collective trace|gather|all-to-all|bucket
#include <mpi.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "parallel/communicator.h"
#include "parallel/trace.h"

int main(int argc, char** argv) {
    MPI_Init(&argc, &argv);
    tpsp::set_peer_timeout(2.0);
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm world = MPI_COMM_WORLD;
    const std::string what = argc > 1 ? argv[1] : "gather";
    if (rank == 1) sleep(30);
    tpsp::Communicator group(world);
    if (what == "trace") {
        tpsp::Tracer tracer;
        tracer.enable(1);
        tracer.record("forward", tpsp::Track::compute, 0.0, 1.0);
        tracer.write(std::string(P_tmpdir) + "/tpsp_stalled_collective_trace.json", rank, &world);
    } else if (what == "all-to-all") {
        const float send[4] = {1.0f, 2.0f, 3.0f, 4.0f};
        float receive[4];
        group.all_to_all(send, receive, 2);
    } else if (what == "bucket") {
        float grads[4] = {1.0f, 2.0f, 3.0f, 4.0f};
        const std::vector<int> counts = {2, 2}, offsets = {0, 2};
        tpsp::MpiTransfer reduce = group.start_reduce_scatter_blocks(grads, counts, offsets,
                                                                     "DP reduce-scatter of gradients");
        group.wait(reduce);
    } else {
        const float shard[2] = {1.0f, 2.0f};
        float full[4];
        group.gather(shard, full, 2, 0);
    }
    MPI_Finalize();
    return 0;
}
