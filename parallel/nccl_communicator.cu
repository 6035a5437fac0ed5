#include "parallel/nccl_communicator.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <thread>

#include "common/loaded_library.h"
#include "parallel/device_buffer_work.h"
#include "parallel/mappings.h"

namespace tpsp {

static void check_cuda(cudaError_t status, const char* what) {
    if (status != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(status));
}

static void check_nccl(ncclResult_t result, const char* what) {
    if (result != ncclSuccess) throw std::runtime_error(std::string(what) + ": " + ncclGetErrorString(result));
}

// This group's completion events. A transfer holds one from its start
// until test() finds it done or wait() has queued the compute stream's wait
// on it (the wait takes the event's record as it is at the call); then it is
// free for the next transfer. The pool grows to the most transfers of the
// group in flight at once: 4 in a TP schedule, up to one per bucket for the
// data-parallel buckets (60 for GPT-2 124M). Each communicator has its own.
cudaEvent_t NcclCommunicator::take_event() {
    if (free_events_.empty()) {
        cudaEvent_t event = nullptr;
        check_cuda(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreate");
        events_.push_back(event);
        return event;
    }
    cudaEvent_t event = free_events_.back();
    free_events_.pop_back();
    return event;
}

std::string NcclCommunicator::library_version() {
    int loaded = 0;  // major·10000 + minor·100 + patch
    ncclGetVersion(&loaded);
    const auto text = [](int v) {
        return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
    };
    const std::string file = library_file_of("ncclGetVersion");
    return "NCCL: " + text(loaded) + (file.empty() ? "" : " (" + file + ")") + ", compiled against " +
           text(NCCL_VERSION_CODE);
}

NcclCommunicator::NcclCommunicator(MPI_Comm comm, cudaStream_t compute_stream, bool nccl_even_alone)
    : host_(comm), compute_stream_(compute_stream) {
    if (size() == 1 && !nccl_even_alone) return;
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank_);
    ncclUniqueId id;
    if (rank() == 0) check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
    MPI_Bcast(&id, int(sizeof id), MPI_BYTE, 0, comm);
    check_nccl(ncclCommInitRank(&nccl_, size(), id, rank()), "ncclCommInitRank");
    check_cuda(cudaStreamCreateWithFlags(&comm_stream_, cudaStreamNonBlocking), "communication stream");
    check_cuda(cudaEventCreateWithFlags(&compute_ready_, cudaEventDisableTiming), "cudaEventCreate");
    // the watchdog's thread queries this rank's events: on this rank's GPU, not
    // on GPU 0 (where a thread's CUDA calls go until it sets its device)
    int device = 0;
    check_cuda(cudaGetDevice(&device), "cudaGetDevice");
    watchdog_ = std::make_unique<Watchdog>(
        peer_timeout(), [this](const char* name, double seconds) { give_up(name, seconds); },
        [device] { cudaSetDevice(device); });
}

// The watchdog's end of a stuck group, on the watchdog's thread: one line, the
// NCCL kernels aborted (so the device lets go), then this process. The abort
// frees memory and joins NCCL's threads, which can block behind the very work
// that is stuck, so it gets 5 s on a thread of its own and the process ends
// either way. MPI was started single-threaded, so this thread makes no MPI
// call: a rank that ends without MPI_Finalize makes mpirun end the whole job.
void NcclCommunicator::give_up(const char* name, double seconds) {
    std::fprintf(stderr,
                 "tpsp: rank %d: the %s (NCCL, rank %d of a group of %d) has not completed after %.0f s "
                 "(parallel.timeout_s): a peer has stopped; ending the job\n",
                 world_rank_, name, rank(), size(), seconds);
    std::fflush(stderr);
    std::atomic<bool> aborted{false};  // outlives the thread's use of it: this function never returns
    std::thread([&aborted, comm = nccl_] {
        ncclCommAbort(comm);
        aborted = true;
    }).detach();
    for (int tenth = 0; tenth < 50 && !aborted; tenth++) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    std::_Exit(1);
}

// The communication stream is drained while the watchdog still watches it:
// a peer that stopped ends the job here too instead of hanging its unwinding.
NcclCommunicator::~NcclCommunicator() {
    if (comm_stream_) cudaStreamSynchronize(comm_stream_);
    watchdog_.reset();
    if (nccl_) ncclCommDestroy(nccl_);
    if (comm_stream_) cudaStreamDestroy(comm_stream_);
    if (compute_ready_) cudaEventDestroy(compute_ready_);
    if (block_scratch_) cudaFree(block_scratch_);
    for (cudaEvent_t event : events_)
        if (event) cudaEventDestroy(event);
}

void NcclCommunicator::after_compute() {
    check_cuda(cudaEventRecord(compute_ready_, compute_stream_), "cudaEventRecord");
    check_cuda(cudaStreamWaitEvent(comm_stream_, compute_ready_, 0), "cudaStreamWaitEvent");
}

NcclTransfer NcclCommunicator::finish_enqueue(const char* name, bool counts) {
    Transfer t;
    t.done = take_event();
    check_cuda(cudaEventRecord(t.done, comm_stream_), "cudaEventRecord");
    t.name = name;
    t.started = now_seconds();
    t.counts = counts;
    t.active = true;
    if (watchdog_) watchdog_->watch(name, [done = t.done] { return cudaEventQuery(done) != cudaErrorNotReady; });
    return t;
}

bool NcclCommunicator::test(Transfer& t) {
    if (!t.active) return true;
    const cudaError_t status = cudaEventQuery(t.done);
    if (status == cudaErrorNotReady) return false;
    check_cuda(status, t.name);  // a fault on the stream is an error, not "not done yet"
    t.active = false;
    free_events_.push_back(t.done);
    if (t.counts) {
        const double end = now_seconds();
        time.total += end - t.started;
        if (tracer) tracer->record(t.name, track, t.started, end);
    }
    return true;
}

void NcclCommunicator::wait(Transfer& t) {
    if (!t.active) return;
    check_cuda(cudaStreamWaitEvent(compute_stream_, t.done, 0), "cudaStreamWaitEvent");
    t.active = false;
    free_events_.push_back(t.done);
    if (t.counts) time.total += now_seconds() - t.started;
}

void NcclCommunicator::start_exchange(const bf16* send, bf16* receive, size_t count, int to, int from, int,
                                      const char* name, Transfer* sent, Transfer* received) {
    after_compute();
    check_nccl(ncclGroupStart(), "ncclGroupStart");
    check_nccl(ncclSend(send, count, ncclBfloat16, to, nccl_, comm_stream_), "ncclSend");
    check_nccl(ncclRecv(receive, count, ncclBfloat16, from, nccl_, comm_stream_), "ncclRecv");
    check_nccl(ncclGroupEnd(), "ncclGroupEnd");
    *received = finish_enqueue(name, true);
    *sent = Transfer{};  // completes with the receive: one paired operation
}

NcclTransfer NcclCommunicator::send(const void* data, size_t count, ncclDataType_t type, int peer) {
    after_compute();  // the data is final
    check_nccl(ncclSend(data, count, type, peer, nccl_, comm_stream_), "ncclSend");
    return finish_enqueue("send", false);  // completes in the receive's shadow: not counted
}

NcclTransfer NcclCommunicator::receive(void* data, size_t count, ncclDataType_t type, int peer, const char* name) {
    after_compute();  // the buffer's last reader is done
    check_nccl(ncclRecv(data, count, type, peer, nccl_, comm_stream_), "ncclRecv");
    return finish_enqueue(name, true);
}

NcclTransfer NcclCommunicator::start_send(const bf16* data, size_t count, int peer, int) {
    return send(data, count, ncclBfloat16, peer);
}
NcclTransfer NcclCommunicator::start_send(const float* data, size_t count, int peer, int) {
    return send(data, count, ncclFloat32, peer);
}
NcclTransfer NcclCommunicator::start_receive(bf16* data, size_t count, int peer, int, const char* name) {
    return receive(data, count, ncclBfloat16, peer, name);
}
NcclTransfer NcclCommunicator::start_receive(float* data, size_t count, int peer, int, const char* name) {
    return receive(data, count, ncclFloat32, peer, name);
}

void NcclCommunicator::connect_one_way(bool sender) {
    float* element = block_scratch(1);
    const int peer = 1 - rank();
    Transfer t = sender ? send(element, 1, ncclFloat32, peer) : receive(element, 1, ncclFloat32, peer, "connection");
    wait(t);
}

NcclTransfer NcclCommunicator::start_all_gather(const bf16* shard, bf16* full, size_t count, const char* name) {
    if (!nccl_) {  // a group of one
        if (full != shard) copy(full, shard, count);
        return {};
    }
    bytes.all_gather += int64_t(count) * size() * int64_t(sizeof(bf16));
    after_compute();
    check_nccl(ncclAllGather(shard, full, count, ncclBfloat16, nccl_, comm_stream_), "ncclAllGather");
    return finish_enqueue(name, true);
}

NcclTransfer NcclCommunicator::start_reduce_scatter(const bf16* full, bf16* shard, size_t count, const char* name) {
    if (!nccl_) {  // a group of one
        if (full != shard) copy(shard, full, count);
        return {};
    }
    bytes.reduce_scatter += int64_t(count) * size() * int64_t(sizeof(bf16));
    after_compute();
    check_nccl(ncclReduceScatter(full, shard, count, ncclBfloat16, ncclSum, nccl_, comm_stream_), "ncclReduceScatter");
    return finish_enqueue(name, true);
}

// Grown in the first step (a bucket at most): the stream drains before the old buffer goes.
float* NcclCommunicator::block_scratch(size_t count) {
    if (count > block_scratch_count_) {
        check_cuda(cudaStreamSynchronize(comm_stream_), "the reduce-scatter's scratch");
        if (block_scratch_) check_cuda(cudaFree(block_scratch_), "cudaFree");
        block_scratch_ = nullptr;
        check_cuda(cudaMalloc(&block_scratch_, count * sizeof(float)), "cudaMalloc of the reduce-scatter's scratch");
        block_scratch_count_ = count;
    }
    return block_scratch_;
}

// data's block rank() = Σ over the ranks q of rank q's data's block rank(), in
// rank order: each rank's copy arrives in slot q of the scratch [size, count],
// this rank's own copied there, and one kernel adds the slots up over the
// block, all on the communication stream. Reusing the one scratch is safe:
// the stream runs the next transfer's receives after this one's sum.
NcclTransfer NcclCommunicator::start_reduce_scatter_blocks(float* data, const std::vector<int>& counts,
                                                           const std::vector<int>& offsets, const char* name) {
    if (!nccl_) return {};  // a group of one: its block is the sum
    for (int c : counts) bytes.reduce_scatter += int64_t(c) * int64_t(sizeof(float));
    const size_t at = size_t(offsets[size_t(rank())]), count = size_t(counts[size_t(rank())]);
    float* slots = block_scratch(size_t(size()) * count);
    after_compute();
    check_cuda(cudaMemcpyAsync(slots + size_t(rank()) * count, data + at, count * sizeof(float),
                               cudaMemcpyDeviceToDevice, comm_stream_),
               name);
    check_nccl(ncclGroupStart(), "ncclGroupStart");
    for (int q = 0; q < size(); q++) {
        if (q == rank()) continue;
        check_nccl(ncclSend(data + offsets[size_t(q)], size_t(counts[size_t(q)]), ncclFloat32, q, nccl_, comm_stream_),
                   "ncclSend");
        check_nccl(ncclRecv(slots + size_t(q) * count, count, ncclFloat32, q, nccl_, comm_stream_), "ncclRecv");
    }
    check_nccl(ncclGroupEnd(), "ncclGroupEnd");
    gpu::sum_blocks_on_stream(comm_stream_, data + at, slots, size(), count);
    return finish_enqueue(name, true);
}

// data's block q = rank q's data's block q, for every q: this rank's block
// to every other rank, theirs into place, in one NCCL group.
NcclTransfer NcclCommunicator::start_all_gather_blocks(float* data, const std::vector<int>& counts,
                                                       const std::vector<int>& offsets, const char* name) {
    if (!nccl_) return {};
    for (int c : counts) bytes.all_gather += int64_t(c) * int64_t(sizeof(float));
    const float* mine = data + offsets[size_t(rank())];
    after_compute();
    check_nccl(ncclGroupStart(), "ncclGroupStart");
    for (int q = 0; q < size(); q++) {
        if (q == rank()) continue;
        check_nccl(ncclSend(mine, size_t(counts[size_t(rank())]), ncclFloat32, q, nccl_, comm_stream_), "ncclSend");
        check_nccl(ncclRecv(data + offsets[size_t(q)], size_t(counts[size_t(q)]), ncclFloat32, q, nccl_, comm_stream_),
                   "ncclRecv");
    }
    check_nccl(ncclGroupEnd(), "ncclGroupEnd");
    return finish_enqueue(name, true);
}

// NCCL has no all-to-all: one grouped send and receive per peer.
void NcclCommunicator::all_to_all(const bf16* send, bf16* receive, size_t count) {
    if (!nccl_) {  // a group of one
        if (receive != send) copy(receive, send, count);
        return;
    }
    bytes.all_to_all += int64_t(count) * size() * int64_t(sizeof(bf16));
    after_compute();
    check_nccl(ncclGroupStart(), "ncclGroupStart");
    for (int q = 0; q < size(); q++) {
        check_nccl(ncclSend(send + size_t(q) * count, count, ncclBfloat16, q, nccl_, comm_stream_), "ncclSend");
        check_nccl(ncclRecv(receive + size_t(q) * count, count, ncclBfloat16, q, nccl_, comm_stream_), "ncclRecv");
    }
    check_nccl(ncclGroupEnd(), "ncclGroupEnd");
    Transfer t = finish_enqueue("all-to-all", true);
    wait(t);
}

void NcclCommunicator::all_gather(const bf16* shard, bf16* full, size_t count) {
    Transfer t = start_all_gather(shard, full, count, "all-gather");
    wait(t);
}

void NcclCommunicator::reduce_scatter(const bf16* full, bf16* shard, size_t count) {
    Transfer t = start_reduce_scatter(full, shard, count, "reduce-scatter");
    wait(t);
}

void NcclCommunicator::all_reduce(void* data, size_t count, ncclDataType_t type, ncclRedOp_t op, size_t element_bytes) {
    if (!nccl_) return;  // a group of one
    bytes.all_reduce += int64_t(count * element_bytes);
    after_compute();
    check_nccl(ncclAllReduce(data, data, count, type, op, nccl_, comm_stream_), "ncclAllReduce");
    Transfer t = finish_enqueue("all-reduce", true);
    wait(t);
}

void NcclCommunicator::all_reduce_sum(bf16* data, size_t count) {
    all_reduce(data, count, ncclBfloat16, ncclSum, sizeof(bf16));
}
void NcclCommunicator::all_reduce_sum(float* data, size_t count) {
    all_reduce(data, count, ncclFloat32, ncclSum, sizeof(float));
}
void NcclCommunicator::all_reduce_max(float* data, size_t count) {
    all_reduce(data, count, ncclFloat32, ncclMax, sizeof(float));
}

// buffer work on the compute stream (device_buffer_work.h)

void NcclCommunicator::copy(bf16* dst, const bf16* src, size_t count) {
    gpu::copy_on_stream(compute_stream_, dst, src, count);
}

void NcclCommunicator::add(bf16* acc, const bf16* x, size_t count) {
    gpu::add_on_stream(compute_stream_, acc, x, count);
}

void NcclCommunicator::copy_rows(bf16* dst, size_t dst_stride, const bf16* src, size_t src_stride, size_t rows,
                                 size_t width) {
    gpu::copy_rows_on_stream(compute_stream_, dst, dst_stride, src, src_stride, rows, width);
}

// Context parallelism's mappings on NCCL, instantiated here so that every
// CUDA build compiles them whatever the model calls (docs/design.md §9).
template void ContextParallelMappings<NcclCommunicator>::sequence_to_heads<bf16>(const bf16*, bf16*, bf16*, bf16*);
template void ContextParallelMappings<NcclCommunicator>::heads_to_sequence<bf16>(const bf16*, bf16*, bf16*, bf16*);

}  // namespace tpsp
