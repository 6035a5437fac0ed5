// A tensor-parallel group whose t ranks are t threads of one process: the
// stand-in that lets one device (or one process on the CPU) run the model,
// the mappings and every overlap schedule of a group of t, unchanged.
//
// Every operation is a rendezvous of the whole group: each rank offers its
// buffer, all wait at the group's barrier, each rank reads from the others'
// buffers what it needs, and all wait again before anyone reuses a buffer.
// A transfer is therefore complete when its start returns: the overlap
// schedules still run step by step, their computation simply never waits.
// Sums are taken in rank order, left to right, as Communicator takes them
// over MPI, so a group of t threads gives the MPI group's bits exactly
// (tests/test_tensor_parallel.cpp proves it at t = 2 and 4).
//
// The ranks must call the same operations in the same order, as they do
// under MPI; a rank that stops coming leaves the others at the barrier for
// peer_timeout() seconds, after which the process ends with one line.
#pragma once
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

#include "parallel/communicator.h"
#include "parallel/trace.h"

namespace tpsp {

// What the t threads share: the barrier and each rank's offer.
class ThreadGroup {
public:
    explicit ThreadGroup(int size);
    int size() const { return size_; }

    struct Offer {
        const void* data = nullptr;
        int to = -1, tag = -1;  // a ring exchange's receiver and step
    };
    // rank offers `offer` and waits until every rank has offered
    void offer_and_wait(int rank, const Offer& offer, const char* what);
    const Offer& offer_of(int rank) const { return offers_[size_t(rank)]; }
    // waits until every rank is done reading the offers
    void wait_for_everyone(const char* what);

private:
    void barrier(const char* what);
    int size_;
    std::vector<Offer> offers_;
    std::mutex mutex_;
    std::condition_variable arrived_;
    int waiting_ = 0;
    int64_t generation_ = 0;
};

// One thread's rank of a ThreadGroup, with Communicator's operations
// (parallel/group.h) on float buffers.
class ThreadCommunicator {
public:
    struct Transfer {
        bool active = false;  // complete on start: never in flight
    };
    static constexpr bool runs_in_enqueue_order = false;  // as Communicator, whose bits it gives
    ThreadCommunicator() = default;                       // a group of one
    ThreadCommunicator(ThreadGroup* group, int rank) : group_(group), rank_(rank), size_(group->size()) {}
    int rank() const { return rank_; }
    int size() const { return size_; }

    void all_gather(const float* shard, float* full, size_t count);
    void reduce_scatter(const float* full, float* shard, size_t count);
    void all_reduce_sum(float* data, size_t count);
    void all_reduce_max(float* data, size_t count);
    void all_reduce_sum(double* data, size_t count);
    void all_to_all(const float* send, float* receive, size_t count);

    void start_exchange(const float* send, float* receive, size_t count, int to, int from, int tag, const char* name,
                        Transfer* sent, Transfer* received);
    Transfer start_all_gather(const float* shard, float* full, size_t count, const char* name);
    Transfer start_reduce_scatter(const float* full, float* shard, size_t count, const char* name);
    // the data-parallel buckets' collectives, on blocks of uneven size (as Communicator's)
    Transfer start_reduce_scatter_blocks(float* data, const std::vector<int>& counts, const std::vector<int>& offsets,
                                         const char* name);
    Transfer start_all_gather_blocks(float* data, const std::vector<int>& counts, const std::vector<int>& offsets,
                                     const char* name);
    bool test(Transfer&) { return true; }
    void wait(Transfer&) {}

    // the buffer work of the schedules: host memory, as over MPI
    void copy(float* dst, const float* src, size_t count) { Communicator::copy(dst, src, count); }
    void add(float* acc, const float* x, size_t count) { Communicator::add(acc, x, count); }
    void copy_rows(float* dst, size_t dst_stride, const float* src, size_t src_stride, size_t rows, size_t width) {
        Communicator::copy_rows(dst, dst_stride, src, src_stride, rows, width);
    }

    CollectiveBytes bytes;
    CommunicationTime time;  // all of it exposed: nothing is in flight while computing
    Tracer* tracer = nullptr;
    Track track = Track::communication;  // the trace's row for this group's transfers

private:
    template <class T>
    void all_reduce(T* data, size_t count, bool maximum, const char* name);
    const float* offered(int rank) const { return static_cast<const float*>(group_->offer_of(rank).data); }
    void record(const char* name, double started);
    ThreadGroup* group_ = nullptr;
    int rank_ = 0, size_ = 1;
    std::vector<float> block_sum_;  // a bucket's reduce-scatter sums here until no rank reads its block
};

}  // namespace tpsp
