#include "parallel/communicator.h"

#include <cstring>

namespace tpsp {

Communicator::Communicator(MPI_Comm comm) : comm_(comm) {
    MPI_Comm_rank(comm, &rank_);
    MPI_Comm_size(comm, &size_);
}

void Communicator::all_gather(const float* shard, float* full, size_t count) {
    if (size_ == 1) {
        if (full != shard) std::memcpy(full, shard, count * 4);
        return;
    }
    bytes.all_gather += int64_t(count) * size_ * 4;
    MPI_Allgather(shard, int(count), MPI_FLOAT, full, int(count), MPI_FLOAT, comm_);
}

void Communicator::reduce_scatter(const float* full, float* shard, size_t count) {
    if (size_ == 1) {
        if (full != shard) std::memcpy(shard, full, count * 4);
        return;
    }
    bytes.reduce_scatter += int64_t(count) * size_ * 4;
    MPI_Reduce_scatter_block(full, shard, int(count), MPI_FLOAT, MPI_SUM, comm_);
}

void Communicator::all_reduce_sum(float* data, size_t count) {
    if (size_ == 1) return;
    bytes.all_reduce += int64_t(count) * 4;
    MPI_Allreduce(MPI_IN_PLACE, data, int(count), MPI_FLOAT, MPI_SUM, comm_);
}

void Communicator::all_reduce_max(float* data, size_t count) {
    if (size_ == 1) return;
    bytes.all_reduce += int64_t(count) * 4;
    MPI_Allreduce(MPI_IN_PLACE, data, int(count), MPI_FLOAT, MPI_MAX, comm_);
}

void Communicator::all_reduce_sum(double* data, size_t count) {
    if (size_ > 1) MPI_Allreduce(MPI_IN_PLACE, data, int(count), MPI_DOUBLE, MPI_SUM, comm_);
}

MPI_Request Communicator::start_send(const float* data, size_t count, int peer, int tag) {
    MPI_Request request;
    MPI_Isend(data, int(count), MPI_FLOAT, peer, tag, comm_, &request);
    return request;
}

MPI_Request Communicator::start_receive(float* data, size_t count, int peer, int tag) {
    MPI_Request request;
    MPI_Irecv(data, int(count), MPI_FLOAT, peer, tag, comm_, &request);
    return request;
}

bool Communicator::test(MPI_Request& request) {
    int done = 0;
    MPI_Test(&request, &done, MPI_STATUS_IGNORE);
    return done != 0;
}

void Communicator::wait(MPI_Request& request) { MPI_Wait(&request, MPI_STATUS_IGNORE); }

void Communicator::gather(const float* send, float* receive, size_t count, int root) {
    if (size_ == 1) {
        if (receive != send) std::memcpy(receive, send, count * 4);
        return;
    }
    MPI_Gather(send, int(count), MPI_FLOAT, receive, int(count), MPI_FLOAT, root, comm_);
}

}  // namespace tpsp
