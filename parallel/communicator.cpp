#include "parallel/communicator.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <string>
#include <thread>
#include <vector>

namespace tpsp {

static double peer_timeout_seconds = 300.0;

void set_peer_timeout(double seconds) { peer_timeout_seconds = seconds; }
double peer_timeout() { return peer_timeout_seconds; }

// The ranks of the job that do not answer a roll call within `seconds`.
// Every rank still running the job times out too, in whichever wait it is
// (a stopped rank stops the others within about a step of each other), and
// calls the roll: each sends its rank to every other and listens for theirs.
// The ones never heard from are the stopped ones, or ranks that are busy
// elsewhere for longer than the roll call.
static constexpr int roll_call_tag = 32766;  // MPI guarantees tags up to 32767; rings use their step
static std::vector<int> ranks_not_answering(int rank, int size, double seconds) {
    std::vector<int> heard(size_t(size), 0);
    std::vector<MPI_Request> sends(size_t(size), MPI_REQUEST_NULL), receives(size_t(size), MPI_REQUEST_NULL);
    for (int peer = 0; peer < size; peer++) {
        if (peer == rank) continue;
        MPI_Isend(&rank, 1, MPI_INT, peer, roll_call_tag, MPI_COMM_WORLD, &sends[size_t(peer)]);
        MPI_Irecv(&heard[size_t(peer)], 1, MPI_INT, peer, roll_call_tag, MPI_COMM_WORLD, &receives[size_t(peer)]);
    }
    std::vector<int> answered(size_t(size), 0);
    answered[size_t(rank)] = 1;
    const double start = now_seconds();
    int missing = size - 1;
    while (missing > 0 && now_seconds() - start < seconds) {
        for (int peer = 0; peer < size; peer++) {
            if (answered[size_t(peer)]) continue;
            int done = 0;
            MPI_Test(&receives[size_t(peer)], &done, MPI_STATUS_IGNORE);
            if (done) answered[size_t(peer)] = 1, missing--;
        }
    }
    std::vector<int> silent;
    for (int peer = 0; peer < size; peer++)
        if (!answered[size_t(peer)]) silent.push_back(peer);
    return silent;  // the requests still pending are left to MPI_Abort
}

// The lowest rank of 0..size-1 not in `silent` (sorted).
static int lowest_answering(const std::vector<int>& silent) {
    int rank = 0;
    for (int r : silent)
        if (r == rank) rank++;
    return rank;
}

// Waits for request like MPI_Wait (which also polls), but gives up after
// peer_timeout_seconds and ends the job with MPI_Abort. Every waiting rank
// calls the roll of the job; the lowest rank that answered prints the one
// line, naming what it waited in and the ranks that did not answer. The
// others print theirs only if the job is still running a while later.
static void wait_or_give_up(MPI_Request* request, const char* what, MPI_Comm comm, int peer) {
    double start = now_seconds(), last = start;
    for (;;) {
        int done = 0;
        MPI_Test(request, &done, MPI_STATUS_IGNORE);
        if (done) return;
        // a gap between two polls: this rank itself was stopped (SIGSTOP, and
        // SIGCONT before mpirun ends the job): its deadline starts again, and
        // it does not blame the peers it could not hear while it slept
        const double now = now_seconds();
        if (now - last > 1.0) start = now;
        last = now;
        if (now - start < peer_timeout_seconds) continue;
        int world_rank = 0, world_size = 1, rank = 0, size = 1;
        MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
        MPI_Comm_size(MPI_COMM_WORLD, &world_size);
        MPI_Comm_rank(comm, &rank);
        MPI_Comm_size(comm, &size);
        std::string waited_for;
        if (peer >= 0) waited_for = " for rank " + std::to_string(peer) + " of the group";
        const double roll_call_seconds = std::clamp(peer_timeout_seconds, 1.0, 10.0);
        const std::vector<int> silent = ranks_not_answering(world_rank, world_size, roll_call_seconds);
        std::string named;
        for (int r : silent) named += (named.empty() ? "" : ", ") + std::to_string(r);
        const std::string verdict =
            silent.empty() ? "every rank answered the roll call, so none has stopped: they wait in different places"
                           : (silent.size() > 1 ? "ranks " : "rank ") + named + " of the job did not answer within " +
                                 std::to_string(int(roll_call_seconds)) + " s: stopped";
        if (world_rank != lowest_answering(silent))  // its line, and its abort, end the job first
            std::this_thread::sleep_for(std::chrono::duration<double>(2 * roll_call_seconds));
        std::fprintf(stderr,
                     "tpsp: rank %d: the %s (rank %d of a group of %d) waited %.0f s%s without progress "
                     "(parallel.timeout_s): %s; ending the job\n",
                     world_rank, what, rank, size, peer_timeout_seconds, waited_for.c_str(), verdict.c_str());
        std::fflush(stderr);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
}

void wait_for_collective(MPI_Request* request, MPI_Comm comm, const char* what) {
    wait_or_give_up(request, what, comm, -1);
}

void all_reduce_ints(int* data, int count, MPI_Op op, MPI_Comm comm, const char* what) {
    MPI_Request request;
    MPI_Iallreduce(MPI_IN_PLACE, data, count, MPI_INT, op, comm, &request);
    wait_for_collective(&request, comm, what);
}

Communicator::Communicator(MPI_Comm comm) : comm_(comm) {
    MPI_Comm_rank(comm, &rank_);
    MPI_Comm_size(comm, &size_);
}

void Communicator::connect_one_way(bool sender) {
    float element = 0.0f;
    Transfer t = sender ? start_send(&element, 1, 1 - rank(), 0)
                        : start_receive(&element, 1, 1 - rank(), 0, "connection");
    wait(t);
}

static void sleep_until(double when) {
    double left = when - now_seconds();
    if (left <= 0) return;
    timespec ts{time_t(left), long((left - double(time_t(left))) * 1e9)};
    nanosleep(&ts, nullptr);
}

// A ring all-gather or reduce-scatter: t − 1 messages of one shard each.
double Communicator::ring_seconds(size_t shard_count) const {
    return link.on() ? (size_ - 1) * link.message_seconds(double(shard_count) * 4) : 0.0;
}

MpiTransfer Communicator::begin(const char* name, double link_seconds, bool counts) {
    Transfer t;
    t.name = name;
    t.started = now_seconds();
    t.ready_at = t.started;
    if (link_seconds > 0.0) {  // after the transfers before it on the one link
        t.ready_at = std::max(t.started, *link.busy_until) + link_seconds;
        *link.busy_until = t.ready_at;
    }
    t.counts = counts;
    t.active = true;
    if (counts && in_flight_++ == 0) busy_since_ = t.started;
    return t;
}

int Communicator::take_scratch(size_t count) {
    size_t slot = 0;
    while (slot < scratch_.size() && scratch_[slot]->in_use) slot++;
    if (slot == scratch_.size()) scratch_.push_back(std::make_unique<Scratch>());
    Scratch& s = *scratch_[slot];
    if (s.data.size() < count) s.data.resize(count);
    s.in_use = true;
    return int(slot);
}

double Communicator::finish(Transfer& t) {
    if (t.sum_into) {  // a reduce-scatter's blocks have arrived: add them up
        Scratch& blocks = *scratch_[size_t(t.scratch)];
        sum_in_rank_order(t.sum_into, blocks.data.data(), t.sum_count, size_, t.sum_count);
        blocks.in_use = false;
        t.sum_into = nullptr;
    }
    const double end = now_seconds();
    t.active = false;
    if (!t.counts) return end;
    if (--in_flight_ == 0) time.total += end - busy_since_;
    if (tracer) tracer->record(t.name, track, t.started, end);
    return end;
}

bool Communicator::test(Transfer& t) {
    if (!t.active) return true;
    int done = 0;
    MPI_Test(&t.request, &done, MPI_STATUS_IGNORE);
    if (!done || now_seconds() < t.ready_at) {
        if (done) t.request = MPI_REQUEST_NULL;  // complete in MPI; only the emulated link holds it back
        return false;
    }
    finish(t);
    return true;
}

void Communicator::wait(Transfer& t) {
    if (!t.active) return;
    const double start = now_seconds();
    wait_or_give_up(&t.request, t.name, comm_, t.peer);
    sleep_until(t.ready_at);
    const double end = finish(t);
    if (t.counts) time.exposed += end - start;  // a part of the transfer's time, so never more than the total
}

MpiTransfer Communicator::start_send(const float* data, size_t count, int peer, int tag) {
    Transfer t = begin("send", 0.0, false);
    t.peer = peer;
    MPI_Isend(data, int(count), MPI_FLOAT, peer, tag, comm_, &t.request);
    return t;
}

MpiTransfer Communicator::start_receive(float* data, size_t count, int peer, int tag, const char* name) {
    Transfer t = begin(name, link.on() ? link.message_seconds(double(count) * 4) : 0.0, true);
    t.peer = peer;
    MPI_Irecv(data, int(count), MPI_FLOAT, peer, tag, comm_, &t.request);
    return t;
}

void Communicator::start_exchange(const float* send, float* receive, size_t count, int to, int from, int tag,
                                  const char* name, Transfer* sent, Transfer* received) {
    *sent = start_send(send, count, to, tag);
    *received = start_receive(receive, count, from, tag, name);
}

MpiTransfer Communicator::start_all_gather(const float* shard, float* full, size_t count, const char* name) {
    if (size_ == 1) {
        if (full != shard) std::memcpy(full, shard, count * 4);
        return {};
    }
    bytes.all_gather += int64_t(count) * size_ * 4;
    Transfer t = begin(name, ring_seconds(count), true);
    MPI_Iallgather(shard, int(count), MPI_FLOAT, full, int(count), MPI_FLOAT, comm_, &t.request);
    return t;
}

MpiTransfer Communicator::start_reduce_scatter(const float* full, float* shard, size_t count, const char* name) {
    if (size_ == 1) {
        if (full != shard) std::memcpy(shard, full, count * 4);
        return {};
    }
    bytes.reduce_scatter += int64_t(count) * size_ * 4;
    Transfer t = begin(name, ring_seconds(count), true);
    t.scratch = take_scratch(count * size_t(size_));
    t.sum_into = shard;
    t.sum_count = count;
    // block q of every rank's full goes to rank q; finish() adds them up
    MPI_Ialltoall(full, int(count), MPI_FLOAT, scratch_[size_t(t.scratch)]->data.data(), int(count), MPI_FLOAT, comm_,
                  &t.request);
    return t;
}

// Each rank sends t − 1 of its blocks and receives as many: a ring's time.
MpiTransfer Communicator::start_all_to_all(const float* send, float* receive, size_t count, const char* name) {
    if (size_ == 1) {
        if (receive != send) std::memcpy(receive, send, count * 4);
        return {};
    }
    bytes.all_to_all += int64_t(count) * size_ * 4;
    Transfer t = begin(name, ring_seconds(count), true);
    MPI_Ialltoall(send, int(count), MPI_FLOAT, receive, int(count), MPI_FLOAT, comm_, &t.request);
    return t;
}

void Communicator::all_to_all(const float* send, float* receive, size_t count) {
    Transfer t = start_all_to_all(send, receive, count, "all-to-all");
    wait(t);
}

void Communicator::all_gather(const float* shard, float* full, size_t count) {
    Transfer t = start_all_gather(shard, full, count, "all-gather");
    wait(t);
}

void Communicator::reduce_scatter(const float* full, float* shard, size_t count) {
    Transfer t = start_reduce_scatter(full, shard, count, "reduce-scatter");
    wait(t);
}

// Rank q adds up block q of every rank's data in rank order: the blocks
// travel by all-to-all.
void Communicator::sum_blocks(float* data, const std::vector<int>& counts, const std::vector<int>& offsets,
                              const char* name) {
    MPI_Request request;
    const int slot = start_summing_blocks(data, counts, offsets, &request);
    wait_or_give_up(&request, name, comm_, -1);
    Scratch& blocks = *scratch_[size_t(slot)];
    sum_in_rank_order(data + offsets[size_t(rank_)], blocks.data.data(), size_t(counts[size_t(rank_)]), size_,
                      size_t(counts[size_t(rank_)]));
    blocks.in_use = false;
}

// Starts the all-to-all of sum_blocks into a scratch buffer: its slot.
int Communicator::start_summing_blocks(float* data, const std::vector<int>& counts, const std::vector<int>& offsets,
                                       MPI_Request* request) {
    const size_t t = size_t(size_);
    const int block = counts[size_t(rank_)];
    const int slot = take_scratch(size_t(block) * t);
    Scratch& blocks = *scratch_[size_t(slot)];
    blocks.counts.assign(t, block);  // every rank's copy of this rank's block, one after another
    blocks.offsets.resize(t);
    for (size_t q = 0; q < t; q++) blocks.offsets[q] = int(q) * block;
    MPI_Ialltoallv(data, counts.data(), offsets.data(), MPI_FLOAT, blocks.data.data(), blocks.counts.data(),
                   blocks.offsets.data(), MPI_FLOAT, comm_, request);
    return slot;
}

void Communicator::gather_blocks(float* data, const std::vector<int>& counts, const std::vector<int>& offsets,
                                 const char* name) {
    MPI_Request request;
    MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_FLOAT, data, counts.data(), offsets.data(), MPI_FLOAT, comm_, &request);
    wait_or_give_up(&request, name, comm_, -1);
}

// One piece of an all-reduce sum: a reduce-scatter, then an all-gather, on
// t blocks as even as the count allows. Pieces bound the buffer the blocks
// arrive in.
void Communicator::all_reduce_piece(float* data, size_t count) {
    const size_t t = size_t(size_);
    std::vector<int> counts(t), offsets(t);
    for (size_t q = 0; q < t; q++) {
        offsets[q] = int(count * q / t);
        counts[q] = int(count * (q + 1) / t) - offsets[q];
    }
    sum_blocks(data, counts, offsets, "all-reduce");
    gather_blocks(data, counts, offsets, "all-reduce");
}

static int64_t total_of(const std::vector<int>& counts) {
    int64_t n = 0;
    for (int c : counts) n += c;
    return n;
}

// A blocking collective's bookkeeping around `work`: its time, held back to
// the emulated link's, all of it exposed.
template <class Work>
void Communicator::blocking(const char* name, double link_seconds, const Work& work) {
    Transfer t = begin(name, link_seconds, true);
    work();
    sleep_until(t.ready_at);
    const double end = finish(t);
    time.exposed += end - t.started;  // blocking: all of it
}

void Communicator::all_gather_blocks(float* data, const std::vector<int>& counts, const std::vector<int>& offsets,
                                     const char* name) {
    Transfer t = start_all_gather_blocks(data, counts, offsets, name);
    wait(t);
}

MpiTransfer Communicator::start_reduce_scatter_blocks(float* data, const std::vector<int>& counts,
                                                      const std::vector<int>& offsets, const char* name) {
    if (size_ == 1) return {};
    const int64_t count = total_of(counts);
    bytes.reduce_scatter += count * 4;
    Transfer t = begin(name, ring_seconds(size_t(count) / size_), true);
    t.scratch = start_summing_blocks(data, counts, offsets, &t.request);
    t.sum_into = data + offsets[size_t(rank_)];  // finish() adds up the blocks that arrived
    t.sum_count = size_t(counts[size_t(rank_)]);
    return t;
}

MpiTransfer Communicator::start_all_gather_blocks(float* data, const std::vector<int>& counts,
                                                  const std::vector<int>& offsets, const char* name) {
    if (size_ == 1) return {};
    const int64_t count = total_of(counts);
    bytes.all_gather += count * 4;
    Transfer t = begin(name, ring_seconds(size_t(count) / size_), true);
    MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_FLOAT, data, counts.data(), offsets.data(), MPI_FLOAT, comm_, &t.request);
    return t;
}

void Communicator::all_reduce_sum(float* data, size_t count) {
    if (size_ == 1) return;
    bytes.all_reduce += int64_t(count) * 4;
    const size_t piece = size_t(1) << 22;                          // 16 MiB
    blocking("all-reduce", 2 * ring_seconds(count / size_), [&] {  // reduce-scatter + all-gather
        for (size_t at = 0; at < count; at += piece) all_reduce_piece(data + at, std::min(piece, count - at));
    });
}

void Communicator::all_reduce_max(float* data, size_t count) {
    if (size_ == 1) return;
    bytes.all_reduce += int64_t(count) * 4;
    Transfer t = begin("all-reduce", 2 * ring_seconds(count / size_), true);
    MPI_Iallreduce(MPI_IN_PLACE, data, int(count), MPI_FLOAT, MPI_MAX, comm_, &t.request);
    wait(t);
}

void Communicator::all_reduce_sum(double* data, size_t count) {
    if (size_ == 1) return;
    std::vector<double> every(count * size_t(size_));
    MPI_Request request;
    MPI_Iallgather(data, int(count), MPI_DOUBLE, every.data(), int(count), MPI_DOUBLE, comm_, &request);
    wait_for_collective(&request, comm_, "all-reduce of doubles");
    sum_in_rank_order(data, every.data(), count, size_, count);
}

void Communicator::copy(float* dst, const float* src, size_t count) { std::memmove(dst, src, count * 4); }

void Communicator::add(float* acc, const float* x, size_t count) {
    for (size_t i = 0; i < count; i++) acc[i] += x[i];
}

void Communicator::copy_rows(float* dst, size_t dst_stride, const float* src, size_t src_stride, size_t rows,
                             size_t width) {
    for (size_t r = 0; r < rows; r++) std::memcpy(dst + r * dst_stride, src + r * src_stride, width * 4);
}

void Communicator::gather(const float* send, float* receive, size_t count, int root) {
    if (size_ == 1) {
        if (receive != send) std::memcpy(receive, send, count * 4);
        return;
    }
    MPI_Request request;
    MPI_Igather(send, int(count), MPI_FLOAT, receive, int(count), MPI_FLOAT, root, comm_, &request);
    wait_for_collective(&request, comm_, "gather");
}

}  // namespace tpsp
