// The communicator of one process group on GPUs: the operations of
// communicator.h, on device buffers, through NCCL. Bootstrapped over MPI:
// rank 0 of the group makes the NCCL unique id and broadcasts it.
//
// Streams: every NCCL operation runs on the group's own communication
// stream. It first waits (an event) for the work already enqueued on the
// compute stream, so that it sends finished data; wait(t) makes the compute
// stream wait for t's completion event, without blocking the host. test(t)
// asks the event whether t is done. The schedules of overlap.h therefore run
// unchanged: their compute goes on the compute stream while the transfers
// they started move on the communication stream. A ring step sends and
// receives in one NCCL group, so no rank's send can wait on a receive queued
// behind it: correctness does not rest on CUDA_DEVICE_MAX_CONNECTIONS=1.
//
// A stopped peer: every operation enqueued is shown to a Watchdog (watchdog.h),
// which ends the job when the newest has been pending for parallel.timeout_s
// (one line naming it and the group, ncclCommAbort, the process ended), as
// the CPU communicator's waits do.
//
// Bytes count as on the CPU (the full tensor per collective). Time is the
// host's view: a transfer counts from its start to the poll or wait that
// finds it done, and "exposed" is left at 0 (waits do not block the host).
// The emulated link of the CPU communicator does not exist here.
#pragma once
#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "common/bf16.h"
#include "parallel/communicator.h"
#include "parallel/watchdog.h"

namespace tpsp {

struct NcclTransfer {
    cudaEvent_t done = nullptr;  // recorded on the communication stream after the operation
    const char* name = "";
    double started = 0.0;
    bool counts = true;
    bool active = false;
};

class NcclCommunicator {
public:
    using Transfer = NcclTransfer;
    // every operation runs on the group's one stream, in the order enqueued (dp_reduction.h)
    static constexpr bool runs_in_enqueue_order = true;
    NcclCommunicator() = default;  // a group of one
    // Collective over comm: every rank of it makes the NCCL communicator
    // together. compute_stream: where the kernels run (the model's stream).
    // A group of one makes none and copies on the compute stream, unless
    // nccl_even_alone: then it goes through NCCL and the watchdog as a larger
    // group does (the GPU tests: one GPU holds only a group of one).
    NcclCommunicator(MPI_Comm comm, cudaStream_t compute_stream, bool nccl_even_alone = false);
    NcclCommunicator(const NcclCommunicator&) = delete;
    NcclCommunicator& operator=(const NcclCommunicator&) = delete;
    ~NcclCommunicator();
    // "NCCL: 2.27.7 (its file), compiled against 2.x.y": the NCCL that loaded
    static std::string library_version();
    int rank() const { return host_.rank(); }
    int size() const { return host_.size(); }
    MPI_Comm* mpi() { return host_.mpi(); }
    // the same group over MPI, for host buffers (checkpoints)
    Communicator& host() { return host_; }

    // Blocking with respect to the compute stream (not the host).
    void all_gather(const bf16* shard, bf16* full, size_t count);
    void reduce_scatter(const bf16* full, bf16* shard, size_t count);
    void all_reduce_sum(bf16* data, size_t count);
    void all_reduce_sum(float* data, size_t count);
    void all_reduce_max(float* data, size_t count);
    // receive's block q [count] = rank q's send's block of this rank (grouped
    // sends and receives; context parallelism's sp2hp / hp2sp, mappings.h)
    void all_to_all(const bf16* send, bf16* receive, size_t count);
    // host doubles, over MPI (norms and losses)
    void all_reduce_sum(double* data, size_t count) { host_.all_reduce_sum(data, count); }
    // host floats, over MPI (checkpoints)
    void gather(const float* send, float* receive, size_t count, int root) { host_.gather(send, receive, count, root); }

    void start_exchange(const bf16* send, bf16* receive, size_t count, int to, int from, int tag, const char* name,
                        Transfer* sent, Transfer* received);
    // A send or a receive alone, for a group used one way (a pipeline's
    // channel, pipeline_channels.h): on a group that also sent the other way,
    // a receive queued behind a send would wait until the peer took the send.
    // The tag is not NCCL's: a channel's messages arrive in the order sent.
    Transfer start_send(const bf16* data, size_t count, int peer, int tag);
    Transfer start_send(const float* data, size_t count, int peer, int tag);
    Transfer start_receive(bf16* data, size_t count, int peer, int tag, const char* name);
    Transfer start_receive(float* data, size_t count, int peer, int tag, const char* name);
    // NCCL connects a group's two ranks at their first send or receive, and
    // that first call waits, on the host, for the peer's first call on the
    // group: were that a pipeline's first transfer, two stages each sending
    // first on one group and receiving on another would wait for each other
    // for ever (the tied wte's exchange at vpp = 1). A channel is connected
    // when it is made instead, both ends there (one element, this end sending
    // or receiving).
    void connect_one_way(bool sender);
    Transfer start_all_gather(const bf16* shard, bf16* full, size_t count, const char* name);
    Transfer start_reduce_scatter(const bf16* full, bf16* shard, size_t count, const char* name);
    // The data-parallel buckets' collectives on fp32 device buffers, on blocks
    // of uneven size, as Communicator's: the reduce-scatter moves every rank's
    // copy of this rank's block into a scratch by grouped sends and receives,
    // then sums them in rank order (gpu::sum_blocks_on_stream), so its bits
    // are the CPU's whatever algorithm NCCL would pick. counts and offsets
    // are read while the call enqueues.
    Transfer start_reduce_scatter_blocks(float* data, const std::vector<int>& counts, const std::vector<int>& offsets,
                                         const char* name);
    Transfer start_all_gather_blocks(float* data, const std::vector<int>& counts, const std::vector<int>& offsets,
                                     const char* name);
    bool test(Transfer& t);
    void wait(Transfer& t);

    // Buffer work of the schedules, as kernels on the compute stream.
    void copy(bf16* dst, const bf16* src, size_t count);
    void add(bf16* acc, const bf16* x, size_t count);
    void copy_rows(bf16* dst, size_t dst_stride, const bf16* src, size_t src_stride, size_t rows, size_t width);

    EmulatedLink link;  // not supported on the GPU: must stay off
    CollectiveBytes bytes;
    CommunicationTime time;
    Tracer* tracer = nullptr;
    Track track = Track::communication;  // the trace's row for this group's transfers

private:
    // The communication stream waits for the compute stream's work so far.
    void after_compute();
    void give_up(const char* name, double seconds);  // the watchdog's expiry
    cudaEvent_t take_event();                        // a completion event no transfer holds
    float* block_scratch(size_t count);              // the reduce-scatter's blocks: one buffer, reused in stream order
    Transfer finish_enqueue(const char* name, bool counts);
    void all_reduce(void* data, size_t count, ncclDataType_t type, ncclRedOp_t op, size_t element_bytes);
    Transfer send(const void* data, size_t count, ncclDataType_t type, int peer);
    Transfer receive(void* data, size_t count, ncclDataType_t type, int peer, const char* name);
    Communicator host_;  // the same group over MPI, for what lives on the host
    cudaStream_t compute_stream_ = nullptr;
    ncclComm_t nccl_ = nullptr;
    cudaStream_t comm_stream_ = nullptr;
    cudaEvent_t compute_ready_ = nullptr;
    std::vector<cudaEvent_t> events_;       // every completion event made, destroyed with the group
    std::vector<cudaEvent_t> free_events_;  // those no transfer holds
    float* block_scratch_ = nullptr;
    size_t block_scratch_count_ = 0;
    int world_rank_ = 0;
    std::unique_ptr<Watchdog> watchdog_;  // groups of more than one rank
};

}  // namespace tpsp
