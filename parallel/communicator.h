// The communicator of one process group, over MPI (on CPU). The model and
// the overlap schedules call only these operations; the CUDA backend's
// NcclCommunicator has the same ones. Knows nothing about GPT.
//
// Bytes: every collective counts the bytes of the *full* tensor it produces
// or consumes (an all-gather of a [s, b, h] result counts s·b·h·4), the
// volume a layout implies and what the log reports. The overlap schedules
// count their rings of point-to-point transfers as the collective they
// carry out. A group of one moves and counts nothing.
//
// Time: a receive or a collective counts as communication from its start to
// its completion; the part spent in wait() — blocked, with nothing left to
// compute — is the exposed part. A blocking collective is all exposed.
//
// Sums: every sum over ranks is taken in rank order, left to right
// (((x₀ + x₁) + x₂) + …), whatever algorithm MPI would pick for the size at
// hand: the blocks travel by all-to-all and each rank adds up its own block.
// The bits of a run then depend on t alone, never on the MPI library or the
// message size, and the one-process stand-in (thread_group.h) reproduces
// them exactly. A maximum needs no order and stays MPI's.
//
// Open MPI moves a non-blocking transfer only inside MPI calls: a caller that
// computes meanwhile must poll test() between its tiles.
#pragma once
#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "parallel/trace.h"

namespace tpsp {

struct CollectiveBytes {
    int64_t all_gather = 0, reduce_scatter = 0, all_reduce = 0, all_to_all = 0;
    int64_t ring = 0;      // sent around a ring by sends and receives (context parallelism's p2p)
    int64_t pipeline = 0;  // received from the neighbouring pipeline stages
};

// total: the time during which at least one of the group's transfers was in
// flight (transfers in flight together count once); exposed: the time the
// host spent waiting for them.
struct CommunicationTime {
    double total = 0.0, exposed = 0.0;  // seconds
};

// A measuring aid: a link of this bandwidth and latency. Every transfer is
// held back until such a link would have delivered it (by sleeping, not
// spinning). Collectives cost what a ring of t − 1 messages would. The link
// carries one transfer at a time, in the order they start: communicators
// given copies of one link share it (busy_until), as the TP and DP groups of
// a rank share its one network link.
struct EmulatedLink {
    double gbps = 0.0;                                                   // gigabits per second; 0 is off
    double latency_us = 0.0;                                             // per message
    std::shared_ptr<double> busy_until = std::make_shared<double>(0.0);  // when the link is next free
    bool on() const { return gbps > 0.0; }
    double message_seconds(double bytes) const { return latency_us * 1e-6 + bytes * 8.0 / (gbps * 1e9); }
};

// One non-blocking operation in flight.
struct MpiTransfer {
    MPI_Request request = MPI_REQUEST_NULL;
    const char* name = "";
    double started = 0.0;
    double ready_at = 0.0;  // when the emulated link would have delivered it
    bool counts = true;     // sends complete in a receive's shadow and do not count
    bool active = false;    // started and not yet complete
    int peer = -1;          // the one rank it waits for (a send or receive), or -1 (a collective)
    // a reduce-scatter: on completion, sum_into [sum_count] = Σ in rank order of the blocks received
    float* sum_into = nullptr;
    size_t sum_count = 0;
    int scratch = -1;  // the communicator's buffer the blocks arrive in
};

// out [count] = Σ_q blocks[q · stride …] over q = 0 … ranks − 1, left to right.
template <class T>
void sum_in_rank_order(T* out, const T* blocks, size_t count, int ranks, size_t stride) {
    for (size_t i = 0; i < count; i++) out[i] = blocks[i];
    for (int q = 1; q < ranks; q++)
        for (size_t i = 0; i < count; i++) out[i] += blocks[size_t(q) * stride + i];
}

// How long one wait for peers may last (parallel.timeout_s) before this
// process gives up on them, as PyTorch's NCCL watchdog does: a rank that
// stopped (SIGSTOP, a hung device, a node MPI has not noticed is gone) would
// otherwise leave every other rank waiting forever. On expiry the waiting
// rank prints one line naming what it waited in, its group and the peer where
// one is known, and ends the whole job with MPI_Abort. Process-wide: every
// group of the process waits under the same deadline.
void set_peer_timeout(double seconds);
double peer_timeout();
// MPI_Wait of a collective's request over comm under that deadline; `what`
// names it in the line.
void wait_for_collective(MPI_Request* request, MPI_Comm comm, const char* what);
// MPI_Allreduce of ints over comm under that deadline; `what` names it in the line.
void all_reduce_ints(int* data, int count, MPI_Op op, MPI_Comm comm, const char* what);

class Communicator {
public:
    using Transfer = MpiTransfer;
    // MPI moves a transfer only inside MPI calls and matches a communicator's
    // collectives by their start order: see dp_reduction.h
    static constexpr bool runs_in_enqueue_order = false;
    Communicator() = default;  // a group of one
    explicit Communicator(MPI_Comm comm);
    int rank() const { return rank_; }
    int size() const { return size_; }
    MPI_Comm* mpi() { return &comm_; }
    // the group for host buffers: itself (NcclCommunicator's is its MPI twin)
    Communicator& host() { return *this; }

    // Blocking collectives.
    // full [size · count] = concatenation of every rank's shard [count]
    void all_gather(const float* shard, float* full, size_t count);
    // shard [count] = this rank's block of Σ_ranks full [size · count]
    void reduce_scatter(const float* full, float* shard, size_t count);
    // data [count] = Σ_ranks data (or the max), in place
    void all_reduce_sum(float* data, size_t count);
    void all_reduce_max(float* data, size_t count);
    // doubles, for norms and losses (neither counted nor emulated)
    void all_reduce_sum(double* data, size_t count);
    // In place, on blocks of uneven size: rank q's block of data is
    // [offsets[q], offsets[q] + counts[q]). data's block q = rank q's data's
    // block q, for every q (start_reduce_scatter_blocks below sums them)
    void all_gather_blocks(float* data, const std::vector<int>& counts, const std::vector<int>& offsets,
                           const char* name);
    // receive's block q [count] = rank q's send's block of this rank: send and
    // receive [size · count] (context parallelism's sp2hp / hp2sp, mappings.h)
    void all_to_all(const float* send, float* receive, size_t count);
    // receive [size · count] on root = every rank's send [count] (checkpoints; not counted)
    void gather(const float* send, float* receive, size_t count, int root);

    // Non-blocking: start, then test() between tiles of compute, then wait().
    Transfer start_send(const float* data, size_t count, int peer, int tag);
    Transfer start_receive(float* data, size_t count, int peer, int tag, const char* name);
    // A ring step: send `count` elements to rank `to` while receiving as many
    // from rank `from` (one paired operation on the GPU, so that neither side
    // can block the other).
    void start_exchange(const float* send, float* receive, size_t count, int to, int from, int tag, const char* name,
                        Transfer* sent, Transfer* received);
    // One element across a group of two, this end sending or receiving: what
    // NcclCommunicator does to connect a pipeline channel's pair when it is
    // made; over MPI nothing needs connecting, and it only shows that both
    // ends agree on their roles (pipeline_channels.h).
    void connect_one_way(bool sender);
    Transfer start_all_gather(const float* shard, float* full, size_t count, const char* name);
    Transfer start_reduce_scatter(const float* full, float* shard, size_t count, const char* name);
    Transfer start_all_to_all(const float* send, float* receive, size_t count, const char* name);
    // On blocks as all_gather_blocks: data's block of this rank = Σ_ranks
    // their data's block of this rank, in rank order (an all-reduce is this
    // and then the all-gather); the other blocks are left as they were. And
    // the all-gather, started. counts and offsets must outlive the transfer
    // (a BucketLayout's do).
    Transfer start_reduce_scatter_blocks(float* data, const std::vector<int>& counts, const std::vector<int>& offsets,
                                         const char* name);
    Transfer start_all_gather_blocks(float* data, const std::vector<int>& counts, const std::vector<int>& offsets,
                                     const char* name);
    bool test(Transfer& t);  // moves it on; true once complete (and delivered, on the emulated link)
    void wait(Transfer& t);  // the time spent here is exposed

    // What the overlap schedules do to the buffers between transfers.
    // (static: host memory needs no group; ThreadCommunicator uses them too)
    static void copy(float* dst, const float* src, size_t count);
    static void add(float* acc, const float* x, size_t count);  // acc += x
    // rows × width elements between two row-strided matrices
    static void copy_rows(float* dst, size_t dst_stride, const float* src, size_t src_stride, size_t rows,
                          size_t width);

    EmulatedLink link;
    CollectiveBytes bytes;   // since the last reset, for the step log
    CommunicationTime time;  // since the last reset
    Tracer* tracer = nullptr;
    Track track = Track::communication;  // the trace's row for this group's transfers

private:
    Transfer begin(const char* name, double link_seconds, bool counts);
    template <class Work>  // defined and used in communicator.cpp only
    void blocking(const char* name, double link_seconds, const Work& work);
    void all_reduce_piece(float* data, size_t count);
    void sum_blocks(float* data, const std::vector<int>& counts, const std::vector<int>& offsets, const char* name);
    int start_summing_blocks(float* data, const std::vector<int>& counts, const std::vector<int>& offsets,
                             MPI_Request* request);
    void gather_blocks(float* data, const std::vector<int>& counts, const std::vector<int>& offsets, const char* name);
    double finish(Transfer& t);  // returns when it finished
    int in_flight_ = 0;          // counted transfers started and not finished
    double busy_since_ = 0.0;    // when the first of them started
    double ring_seconds(size_t shard_count) const;
    // reduce-scatter buffers, reused: one per transfer in flight
    struct Scratch {
        std::vector<float> data;
        std::vector<int> counts, offsets;  // of the blocks arriving in data, while a transfer is in flight
        bool in_use = false;
    };
    int take_scratch(size_t count);
    std::vector<std::unique_ptr<Scratch>> scratch_;
    MPI_Comm comm_ = MPI_COMM_NULL;
    int rank_ = 0, size_ = 1;
};

}  // namespace tpsp
