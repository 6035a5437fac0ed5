// What a tensor-parallel group must provide to the model, the linears and
// the overlap schedules: the operations of communicator.h, on buffers of the
// activation element T. Communicator (MPI, T = float) and NcclCommunicator
// (NCCL, T = bf16) both do; the templates that take a group check it here,
// so a missing or misspelt operation is one error naming this concept.
#pragma once
#include <concepts>
#include <cstddef>

#include "parallel/trace.h"

namespace tpsp {

template <class Comm, class T>
concept TensorParallelGroup = requires(Comm& comm, const T* in, T* out, float* f, double* d, size_t n, int peer,
                                       const char* name, typename Comm::Transfer& transfer) {
    typename Comm::Transfer;
    { comm.rank() } -> std::convertible_to<int>;
    { comm.size() } -> std::convertible_to<int>;
    // blocking collectives: activations, fp32 statistics, host doubles
    comm.all_gather(in, out, n);
    comm.reduce_scatter(in, out, n);
    comm.all_reduce_sum(out, n);
    comm.all_reduce_sum(f, n);
    comm.all_reduce_max(f, n);
    comm.all_reduce_sum(d, n);
    comm.all_to_all(in, out, n);  // context parallelism's sp2hp / hp2sp (mappings.h)
    // non-blocking transfers, for the overlap schedules
    comm.start_exchange(in, out, n, peer, peer, peer, name, &transfer, &transfer);
    { comm.start_all_gather(in, out, n, name) } -> std::same_as<typename Comm::Transfer>;
    { comm.start_reduce_scatter(in, out, n, name) } -> std::same_as<typename Comm::Transfer>;
    { comm.test(transfer) } -> std::convertible_to<bool>;
    comm.wait(transfer);
    { transfer.active } -> std::convertible_to<bool>;
    // buffer work between transfers
    comm.copy(out, in, n);
    comm.add(out, in, n);
    comm.copy_rows(out, n, in, n, n, n);
    // what the step log and the trace read
    comm.bytes.all_gather;
    comm.time.exposed;
    { comm.tracer } -> std::convertible_to<Tracer*>;
};

}  // namespace tpsp
