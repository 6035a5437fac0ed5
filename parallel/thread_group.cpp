#include "parallel/thread_group.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

namespace tpsp {

ThreadGroup::ThreadGroup(int size) : size_(size), offers_(size_t(size)) {
    if (size < 1) throw std::invalid_argument("ThreadGroup: a group needs at least one rank");
}

// Every rank waits here until the last one arrives; one that never comes
// ends the process after peer_timeout() seconds, as a stopped MPI peer would.
void ThreadGroup::barrier(const char* what) {
    std::unique_lock<std::mutex> lock(mutex_);
    const int64_t generation = generation_;
    if (++waiting_ == size_) {
        waiting_ = 0;
        generation_++;
        arrived_.notify_all();
        return;
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(peer_timeout());
    if (!arrived_.wait_until(lock, deadline, [&] { return generation_ != generation; })) {
        std::fprintf(stderr,
                     "tpsp: the %s of a one-process group of %d waited %.0f s for a rank that never came "
                     "(parallel.timeout_s): ending the process\n",
                     what, size_, peer_timeout());
        std::fflush(stderr);
        std::_Exit(1);
    }
}

void ThreadGroup::offer_and_wait(int rank, const Offer& offer, const char* what) {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        offers_[size_t(rank)] = offer;
    }
    barrier(what);
}

void ThreadGroup::wait_for_everyone(const char* what) { barrier(what); }

void ThreadCommunicator::record(const char* name, double started) {
    const double end = now_seconds();
    time.total += end - started;
    time.exposed += end - started;
    if (tracer) tracer->record(name, track, started, end);
}

ThreadCommunicator::Transfer ThreadCommunicator::start_all_gather(const float* shard, float* full, size_t count,
                                                                  const char* name) {
    if (size_ == 1) {
        if (full != shard) std::memcpy(full, shard, count * 4);
        return {};
    }
    const double started = now_seconds();
    bytes.all_gather += int64_t(count) * size_ * 4;
    group_->offer_and_wait(rank_, {shard}, name);
    for (int q = 0; q < size_; q++)
        if (full + size_t(q) * count != offered(q)) std::memcpy(full + size_t(q) * count, offered(q), count * 4);
    group_->wait_for_everyone(name);
    record(name, started);
    return {};
}

ThreadCommunicator::Transfer ThreadCommunicator::start_reduce_scatter(const float* full, float* shard, size_t count,
                                                                      const char* name) {
    if (size_ == 1) {
        if (full != shard) std::memcpy(shard, full, count * 4);
        return {};
    }
    const double started = now_seconds();
    bytes.reduce_scatter += int64_t(count) * size_ * 4;
    group_->offer_and_wait(rank_, {full}, name);
    // shard = Σ_q of rank q's block rank_, in rank order (sum_in_rank_order with each block at its own rank)
    const size_t block = size_t(rank_) * count;
    std::memcpy(shard, offered(0) + block, count * 4);
    for (int q = 1; q < size_; q++) {
        const float* x = offered(q) + block;
        for (size_t i = 0; i < count; i++) shard[i] += x[i];
    }
    group_->wait_for_everyone(name);
    record(name, started);
    return {};
}

// data's block rank_ = Σ over the ranks q of rank q's data's block rank_, in
// rank order; written once no rank reads that block any more
ThreadCommunicator::Transfer ThreadCommunicator::start_reduce_scatter_blocks(float* data,
                                                                             const std::vector<int>& counts,
                                                                             const std::vector<int>& offsets,
                                                                             const char* name) {
    if (size_ == 1) return {};
    const double started = now_seconds();
    for (int c : counts) bytes.reduce_scatter += int64_t(c) * 4;
    group_->offer_and_wait(rank_, {data}, name);
    const size_t at = size_t(offsets[size_t(rank_)]), count = size_t(counts[size_t(rank_)]);
    block_sum_.assign(offered(0) + at, offered(0) + at + count);
    for (int q = 1; q < size_; q++) {
        const float* x = offered(q) + at;
        for (size_t i = 0; i < count; i++) block_sum_[i] += x[i];
    }
    group_->wait_for_everyone(name);
    std::copy(block_sum_.begin(), block_sum_.end(), data + at);
    record(name, started);
    return {};
}

// data's block q = rank q's data's block q, for every q (each rank reads only
// the others' own blocks, which nobody writes)
ThreadCommunicator::Transfer ThreadCommunicator::start_all_gather_blocks(float* data, const std::vector<int>& counts,
                                                                         const std::vector<int>& offsets,
                                                                         const char* name) {
    if (size_ == 1) return {};
    const double started = now_seconds();
    for (int c : counts) bytes.all_gather += int64_t(c) * 4;
    group_->offer_and_wait(rank_, {data}, name);
    for (int q = 0; q < size_; q++)
        if (q != rank_)
            std::memcpy(data + offsets[size_t(q)], offered(q) + offsets[size_t(q)], size_t(counts[size_t(q)]) * 4);
    group_->wait_for_everyone(name);
    record(name, started);
    return {};
}

// receive's block q = rank q's send's block rank_
void ThreadCommunicator::all_to_all(const float* send, float* receive, size_t count) {
    if (size_ == 1) {
        if (receive != send) std::memcpy(receive, send, count * 4);
        return;
    }
    const double started = now_seconds();
    bytes.all_to_all += int64_t(count) * size_ * 4;
    group_->offer_and_wait(rank_, {send}, "all-to-all");
    for (int q = 0; q < size_; q++)
        std::memcpy(receive + size_t(q) * count, offered(q) + size_t(rank_) * count, count * 4);
    group_->wait_for_everyone("all-to-all");
    record("all-to-all", started);
}

void ThreadCommunicator::all_gather(const float* shard, float* full, size_t count) {
    start_all_gather(shard, full, count, "all-gather");
}

void ThreadCommunicator::reduce_scatter(const float* full, float* shard, size_t count) {
    start_reduce_scatter(full, shard, count, "reduce-scatter");
}

// data = Σ (or max) over the ranks, element by element in rank order: each
// rank works out the whole result from the offers, then writes it once no
// rank reads its data any more.
template <class T>
void ThreadCommunicator::all_reduce(T* data, size_t count, bool maximum, const char* name) {
    if (size_ == 1) return;
    const double started = now_seconds();
    group_->offer_and_wait(rank_, {data}, name);
    std::vector<T> result(static_cast<const T*>(group_->offer_of(0).data),
                          static_cast<const T*>(group_->offer_of(0).data) + count);
    for (int q = 1; q < size_; q++) {
        const T* x = static_cast<const T*>(group_->offer_of(q).data);
        for (size_t i = 0; i < count; i++) result[i] = maximum ? std::max(result[i], x[i]) : result[i] + x[i];
    }
    group_->wait_for_everyone(name);
    std::copy(result.begin(), result.end(), data);
    if constexpr (sizeof(T) == 4) {  // the doubles of norms and losses are neither counted nor timed, as over MPI
        bytes.all_reduce += int64_t(count) * 4;
        record(name, started);
    }
}

void ThreadCommunicator::all_reduce_sum(float* data, size_t count) { all_reduce(data, count, false, "all-reduce"); }
void ThreadCommunicator::all_reduce_max(float* data, size_t count) { all_reduce(data, count, true, "all-reduce"); }
void ThreadCommunicator::all_reduce_sum(double* data, size_t count) {
    all_reduce(data, count, false, "all-reduce of doubles");
}

// One ring step: this rank's `send` goes to rank `to`, rank `from`'s send
// arrives in `receive`. Every rank of the group takes the step together.
void ThreadCommunicator::start_exchange(const float* send, float* receive, size_t count, int to, int from, int tag,
                                        const char* name, Transfer* sent, Transfer* received) {
    *sent = *received = {};
    const double started = now_seconds();
    group_->offer_and_wait(rank_, {send, to, tag}, name);
    const ThreadGroup::Offer& incoming = group_->offer_of(from);
    if (incoming.to != rank_ || incoming.tag != tag)
        throw std::logic_error("ThreadCommunicator: the ranks of the group are out of step in a ring exchange");
    std::memcpy(receive, incoming.data, count * 4);
    group_->wait_for_everyone(name);
    record(name, started);
}

}  // namespace tpsp
