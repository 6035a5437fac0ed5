// The communication–computation overlap schedules of Megatron /
// TransformerEngine (docs/design.md §4), on a communicator (Communicator over MPI,
// or NcclCommunicator on the GPU: the same operations, on T = float or bf16
// buffers). They know nothing about GPT: each takes the computation as a
// callable, which is handed a Poll to call between its tiles — on CPU, Open
// MPI moves a transfer only while the program is inside MPI, so the compute
// side keeps it moving. On CUDA the transfers run on their own stream and
// Poll only asks whether they are done.
//
// Chunks: a tensor split over the t ranks of the group is t chunks of
// `count` elements, chunk c being rank c's sequence shard.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <utility>

namespace tpsp {

// Transfers of another group that move on while a linear computes: the
// gradient buckets' during backward (parallel/dp_reduction.h). Open MPI moves them only inside MPI
// calls, so the linears poll them between their tiles, as they poll their
// own transfers, and tile while any is in flight (model/parallel_linear.h).
// One per thread; nothing to move unless someone set move_on.
struct BackgroundTransfers {
    std::function<bool()> move_on;  // moves them on; true while any is in flight
    bool in_flight = false;
    void poll() {
        if (move_on) in_flight = move_on();
    }
};
inline thread_local BackgroundTransfers background_transfers;

// What the compute side calls between tiles: moves the watched transfers on.
template <class Comm>
class Poll {
public:
    using Transfer = typename Comm::Transfer;
    Poll(Comm& comm, std::initializer_list<Transfer*> watched) : comm_(comm) {
        for (Transfer* t : watched)
            if (t && n_ < 4) watched_[n_++] = t;
    }
    void operator()() const {
        for (int i = 0; i < n_; i++) comm_.test(*watched_[i]);
    }
    // Nothing left in flight: the compute side may stop tiling.
    bool idle() const {
        for (int i = 0; i < n_; i++)
            if (watched_[i]->active) return false;
        return true;
    }

private:
    Comm& comm_;
    Transfer* watched_[4] = {};
    int n_ = 0;
};

// tp_comm_overlap_ag. full [t, count] receives the all-gather of `local`
// while compute(chunk, data, poll) runs once per chunk, on the chunk this
// rank holds at that step of the ring: at step i it computes chunk r + i
// while it sends that chunk to rank r − 1 and receives chunk r + i + 1 from
// rank r + 1. No step waits for the whole gathered input.
template <class Comm, class T, class Compute>
void ring_all_gather_overlapped(Comm& comm, const T* local, T* full, size_t count, Compute&& compute) {
    using Transfer = typename Comm::Transfer;
    const int t = comm.size(), r = comm.rank();
    if (full + size_t(r) * count != local) comm.copy(full + size_t(r) * count, local, count);
    if (t > 1) comm.bytes.all_gather += int64_t(count) * t * int64_t(sizeof(T));
    for (int step = 0; step < t; step++) {
        const int chunk = (r + step) % t, next = (r + step + 1) % t;
        Transfer send, receive;
        if (step + 1 < t)
            comm.start_exchange(full + size_t(chunk) * count, full + size_t(next) * count, count, (r - 1 + t) % t,
                                (r + 1) % t, step, "ring all-gather", &send, &receive);
        compute(chunk, full + size_t(chunk) * count, Poll<Comm>(comm, {&send, &receive}));
        comm.wait(receive);
        comm.wait(send);
    }
}

// tp_comm_overlap_rs, ring. local [count] = Σ_ranks of each rank's partial
// for chunk r, where produce(chunk, out, poll) writes this rank's partial of
// a chunk. The accumulator of chunk c starts at rank c + 1 and travels the
// ring, each rank adding its partial, until it is home after t − 1 hops;
// each partial is computed while the accumulator it joins is in flight.
// scratch: 3 · count elements.
template <class Comm, class T, class Produce>
void ring_reduce_scatter_overlapped(Comm& comm, T* local, T* scratch, size_t count, Produce&& produce) {
    using Transfer = typename Comm::Transfer;
    const int t = comm.size(), r = comm.rank();
    T* work = scratch;              // this step's partial, then the accumulator
    T* outgoing = scratch + count;  // the accumulator being sent
    T* incoming = scratch + 2 * count;
    Transfer send, receive;
    if (t > 1) comm.bytes.reduce_scatter += int64_t(count) * t * int64_t(sizeof(T));
    for (int step = 0; step < t; step++) {
        const int chunk = (r - step - 1 + 2 * t) % t;
        produce(chunk, step + 1 == t ? local : work, Poll<Comm>(comm, {&send, &receive}));
        T* acc = step + 1 == t ? local : work;
        if (step > 0) {
            comm.wait(receive);
            comm.add(acc, incoming, count);
        }
        if (step + 1 < t) {
            comm.wait(send);
            std::swap(work, outgoing);
            comm.start_exchange(outgoing, incoming, count, (r + 1) % t, (r - 1 + t) % t, step, "ring reduce-scatter",
                                &send, &receive);
        }
    }
    comm.wait(send);
}

// tp_comm_overlap_rs, pipeline (and tp_comm_overlap_rs_dgrad). local
// [rows, cols] = this rank's rows of Σ_ranks of a [t·rows, cols] tensor
// produced in `splits` column ranges: produce(k, c0, c1, part, poll) writes
// columns [c0, c1) of all t·rows rows, packed as [t·rows, c1 − c0] — one
// GEMM of every row against a slice of the weight — and that part is
// reduce-scattered while the next is produced. then(poll) runs while the last
// parts drain. packed: t·rows·cols elements; received: rows·cols elements.
// `also`: another transfer of the caller's to keep moving meanwhile.
template <class Comm, class T, class Produce, class Then>
void pipelined_reduce_scatter_overlapped(Comm& comm, T* local, T* packed, T* received, size_t rows, size_t cols,
                                         int splits, Produce&& produce, Then&& then,
                                         typename Comm::Transfer* also = nullptr) {
    using Transfer = typename Comm::Transfer;
    const size_t t = size_t(comm.size());
    auto column = [&](int k) { return cols * size_t(k) / size_t(splits); };
    Transfer inflight[2];
    int inflight_split[2] = {-1, -1};
    auto land = [&](int slot) {  // wait for a part and move it into its columns of local
        comm.wait(inflight[slot]);
        const int k = inflight_split[slot];
        if (k < 0) return;
        const size_t c0 = column(k), width = column(k + 1) - c0;
        comm.copy_rows(local + c0, cols, received + rows * c0, width, rows, width);
        inflight_split[slot] = -1;
    };
    for (int k = 0; k < splits; k++) {
        const size_t c0 = column(k), c1 = column(k + 1);
        T* part = packed + t * rows * c0;
        produce(k, c0, c1, part, Poll<Comm>(comm, {&inflight[0], &inflight[1], also}));
        land(k % 2);  // at most two parts in flight
        inflight[k % 2] = comm.start_reduce_scatter(part, received + rows * c0, rows * (c1 - c0),
                                                    "pipelined reduce-scatter");
        inflight_split[k % 2] = k;
    }
    then(Poll<Comm>(comm, {&inflight[0], &inflight[1], also}));
    land(0);
    land(1);
}

// tp_comm_bulk_dgrad: the all-gather of `local` into full runs while work(poll) runs.
template <class Comm, class T, class Work>
void all_gather_during(Comm& comm, const T* local, T* full, size_t count, Work&& work) {
    typename Comm::Transfer gather = comm.start_all_gather(local, full, count, "bulk all-gather");
    work(Poll<Comm>(comm, {&gather}));
    comm.wait(gather);
}

// tp_comm_bulk_wgrad: the reduce-scatter of full into local runs while work(poll) runs.
template <class Comm, class T, class Work>
void reduce_scatter_during(Comm& comm, const T* full, T* local, size_t count, Work&& work) {
    typename Comm::Transfer scatter = comm.start_reduce_scatter(full, local, count, "bulk reduce-scatter");
    work(Poll<Comm>(comm, {&scatter}));
    comm.wait(scatter);
}

// Context parallelism's ring (cp_comm_type p2p, docs/design.md §9),
// forward: `block` [count] starts as this rank's K|V and travels the ring.
// At step i this rank holds rank r − i's block and runs
// compute(source, block, poll) on it while sending it on to rank r + 1 and
// receiving rank r − i − 1's into `spare`; only the last step sends nothing.
template <class Comm, class T, class Compute>
void ring_pass_overlapped(Comm& comm, T* block, T* spare, size_t count, Compute&& compute) {
    using Transfer = typename Comm::Transfer;
    const int n = comm.size(), r = comm.rank(), next = (r + 1) % n, previous = (r - 1 + n) % n;
    comm.bytes.ring += int64_t(count) * (n - 1) * int64_t(sizeof(T));
    for (int step = 0; step < n; step++) {
        Transfer send, receive;
        if (step + 1 < n) comm.start_exchange(block, spare, count, next, previous, step, "ring K/V", &send, &receive);
        compute((r - step + n) % n, static_cast<const T*>(block), Poll<Comm>(comm, {&send, &receive}));
        comm.wait(receive);
        comm.wait(send);
        std::swap(block, spare);
    }
}

// The ring in backward: the K|V blocks travel again as in forward, and each
// block's gradient dK|dV follows one step behind. At step i this rank runs
// compute(source, block, partial, poll), which writes its own part of block
// r − i's gradient into `partial` (overwriting it); the accumulator rank r − 1
// sent meanwhile (the parts of the ranks before) is added, and the sum goes
// on to rank r + 1. After the last step every accumulator holds every rank's
// part and makes one more hop, home: this rank's arrives in `home`.
// accumulators: 2 · count elements (the one going out, the one coming in).
template <class Comm, class T, class Compute>
void ring_pass_with_gradients_overlapped(Comm& comm, T* block, T* spare, T* partial, T* accumulators, T* home,
                                         size_t count, Compute&& compute) {
    using Transfer = typename Comm::Transfer;
    const int n = comm.size(), r = comm.rank(), next = (r + 1) % n, previous = (r - 1 + n) % n;
    if (n == 1) {
        compute(r, static_cast<const T*>(block), partial, Poll<Comm>(comm, {}));
        comm.copy(home, partial, count);
        return;
    }
    T* outgoing = accumulators;
    T* incoming = accumulators + count;
    comm.bytes.ring += int64_t(count) * (2 * n - 1) * int64_t(sizeof(T));
    Transfer send_sum, receive_sum;
    for (int step = 0; step < n; step++) {
        Transfer send, receive;
        if (step + 1 < n)
            comm.start_exchange(block, spare, count, next, previous, 2 * step, "ring K/V", &send, &receive);
        compute((r - step + n) % n, static_cast<const T*>(block), partial,
                Poll<Comm>(comm, {&send, &receive, &send_sum, &receive_sum}));
        if (step > 0) {
            comm.wait(receive_sum);
            comm.add(partial, incoming, count);
        }
        comm.wait(send_sum);  // the buffer going out is free again
        std::swap(partial, outgoing);
        // the last hop, home, has no compute left to hide under: its wait is exposed
        comm.start_exchange(outgoing, step + 1 < n ? incoming : home, count, next, previous, 2 * step + 1,
                            step + 1 < n ? "ring dK/dV" : "ring dK/dV home", &send_sum, &receive_sum);
        comm.wait(receive);
        comm.wait(send);
        std::swap(block, spare);
    }
    comm.wait(receive_sum);
    comm.wait(send_sum);
}

}  // namespace tpsp
