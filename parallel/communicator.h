// The communicator of one process group, over MPI (on CPU). The model calls
// only these collectives, so the CUDA backend can put NCCL behind the same
// names. Knows nothing about GPT.
//
// Every collective of the model counts the bytes of the *full* tensor it
// produces or consumes (an all-gather of a [s, b, h] result counts s·b·h·4),
// which is the volume a layout implies and what the log reports. A group of
// one moves nothing and counts nothing.
#pragma once
#include <mpi.h>

#include <cstddef>
#include <cstdint>

namespace tpsp {

struct CollectiveBytes {
    int64_t all_gather = 0, reduce_scatter = 0, all_reduce = 0;
};

class Communicator {
public:
    Communicator() = default;  // a group of one: every collective is a copy or nothing
    explicit Communicator(MPI_Comm comm);
    int rank() const { return rank_; }
    int size() const { return size_; }

    // full [size · count] = concatenation of every rank's shard [count]
    void all_gather(const float* shard, float* full, size_t count);
    // shard [count] = this rank's block of Σ_ranks full [size · count]
    void reduce_scatter(const float* full, float* shard, size_t count);
    // data [count] = Σ_ranks data, in place
    void all_reduce_sum(float* data, size_t count);
    void all_reduce_max(float* data, size_t count);
    // Point-to-point, non-blocking, for the ring exchanges of the overlap
    // schedules. Open MPI moves a transfer only inside MPI calls: a caller
    // that computes meanwhile polls test() between tiles.
    MPI_Request start_send(const float* data, size_t count, int peer, int tag);
    MPI_Request start_receive(float* data, size_t count, int peer, int tag);
    bool test(MPI_Request& request);  // true once the transfer is done
    void wait(MPI_Request& request);

    // receive [size · count] on root = every rank's send [count] (checkpoints; not counted)
    void gather(const float* send, float* receive, size_t count, int root);
    // doubles, for reductions of norms and losses (not counted)
    void all_reduce_sum(double* data, size_t count);

    CollectiveBytes bytes;  // since the last reset, for the step log

private:
    MPI_Comm comm_ = MPI_COMM_NULL;
    int rank_ = 0, size_ = 1;
};

}  // namespace tpsp
