#include "parallel/cuda_thread_group.h"

#include <array>
#include <stdexcept>
#include <string>

#include "parallel/device_buffer_work.h"

namespace tpsp {

static void check_cuda(cudaError_t status, const char* what) {
    if (status != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(status));
}

CudaThreadCommunicator::CudaThreadCommunicator(ThreadGroup* group, int rank, cudaStream_t stream)
    : group_(group), rank_(rank), size_(group->size()), stream_(stream), host_(group, rank) {
    if (size_ > gpu::max_reduced_ranks)
        throw std::invalid_argument("the one-GPU stand-in takes at most " + std::to_string(gpu::max_reduced_ranks) +
                                    " ranks, not " + std::to_string(size_));
}

CudaThreadCommunicator::~CudaThreadCommunicator() {
    if (scratch_) cudaFree(scratch_);  // cudaFree waits for the device
}

void* CudaThreadCommunicator::scratch(size_t bytes) {
    if (bytes > scratch_bytes_) {
        if (scratch_) check_cuda(cudaFree(scratch_), "cudaFree");
        scratch_ = nullptr;
        check_cuda(cudaMalloc(&scratch_, bytes), "cudaMalloc");
        scratch_bytes_ = bytes;
    }
    return scratch_;
}

double CudaThreadCommunicator::offer(const void* data, const char* name, int to, int tag) {
    const double started = now_seconds();
    check_cuda(cudaStreamSynchronize(stream_), name);  // what this rank sends is written
    group_->offer_and_wait(rank_, {data, to, tag}, name);
    return started;
}

void CudaThreadCommunicator::finish(const char* name, double started) {
    check_cuda(cudaStreamSynchronize(stream_), name);  // this rank's reads of the others are done
    group_->wait_for_everyone(name);
    const double end = now_seconds();
    time.total += end - started;
    time.exposed += end - started;
    if (tracer) tracer->record(name, track, started, end);
}

CudaThreadCommunicator::Transfer CudaThreadCommunicator::start_all_gather(const bf16* shard, bf16* full, size_t count,
                                                                          const char* name) {
    if (size_ == 1) {
        if (full != shard) copy(full, shard, count);
        return {};
    }
    bytes.all_gather += int64_t(count) * size_ * int64_t(sizeof(bf16));
    const double started = offer(shard, name);
    for (int q = 0; q < size_; q++)
        if (full + size_t(q) * count != offered<bf16>(q)) copy(full + size_t(q) * count, offered<bf16>(q), count);
    finish(name, started);
    return {};
}

// shard = Σ over the ranks q of rank q's block rank_ of `full`
CudaThreadCommunicator::Transfer CudaThreadCommunicator::start_reduce_scatter(const bf16* full, bf16* shard,
                                                                              size_t count, const char* name) {
    if (size_ == 1) {
        if (full != shard) copy(shard, full, count);
        return {};
    }
    bytes.reduce_scatter += int64_t(count) * size_ * int64_t(sizeof(bf16));
    const double started = offer(full, name);
    std::array<const bf16*, gpu::max_reduced_ranks> blocks{};  // on the stack: a step allocates nothing
    for (int q = 0; q < size_; q++) blocks[size_t(q)] = offered<bf16>(q) + size_t(rank_) * count;
    gpu::reduce_on_stream(stream_, shard, blocks.data(), size_, count, false);
    finish(name, started);
    return {};
}

// data's block rank_ = Σ over the ranks q of rank q's data's block rank_, in
// rank order, summed into the scratch and copied over the block once no rank
// reads it any more
CudaThreadCommunicator::Transfer CudaThreadCommunicator::start_reduce_scatter_blocks(float* data,
                                                                                     const std::vector<int>& counts,
                                                                                     const std::vector<int>& offsets,
                                                                                     const char* name) {
    if (size_ == 1) return {};
    for (int c : counts) bytes.reduce_scatter += int64_t(c) * int64_t(sizeof(float));
    const double started = offer(data, name);
    const size_t at = size_t(offsets[size_t(rank_)]), count = size_t(counts[size_t(rank_)]);
    std::array<const float*, gpu::max_reduced_ranks> blocks{};
    for (int q = 0; q < size_; q++) blocks[size_t(q)] = offered<float>(q) + at;
    float* sum = static_cast<float*>(scratch(count * sizeof(float)));
    gpu::reduce_on_stream(stream_, sum, blocks.data(), size_, count, false);
    finish(name, started);
    check_cuda(cudaMemcpyAsync(data + at, sum, count * sizeof(float), cudaMemcpyDeviceToDevice, stream_), name);
    return {};
}

// data's block q = rank q's data's block q, for every q (each rank reads only
// the others' own blocks, which nobody writes)
CudaThreadCommunicator::Transfer CudaThreadCommunicator::start_all_gather_blocks(float* data,
                                                                                 const std::vector<int>& counts,
                                                                                 const std::vector<int>& offsets,
                                                                                 const char* name) {
    if (size_ == 1) return {};
    for (int c : counts) bytes.all_gather += int64_t(c) * int64_t(sizeof(float));
    const double started = offer(data, name);
    for (int q = 0; q < size_; q++) {
        if (q == rank_) continue;
        const size_t at = size_t(offsets[size_t(q)]);
        check_cuda(cudaMemcpyAsync(data + at, offered<float>(q) + at, size_t(counts[size_t(q)]) * sizeof(float),
                                   cudaMemcpyDeviceToDevice, stream_),
                   name);
    }
    finish(name, started);
    return {};
}

// receive's block q = rank q's send's block rank_
void CudaThreadCommunicator::all_to_all(const bf16* send, bf16* receive, size_t count) {
    if (size_ == 1) {
        if (receive != send) copy(receive, send, count);
        return;
    }
    bytes.all_to_all += int64_t(count) * size_ * int64_t(sizeof(bf16));
    const double started = offer(send, "all-to-all");
    for (int q = 0; q < size_; q++) copy(receive + size_t(q) * count, offered<bf16>(q) + size_t(rank_) * count, count);
    finish("all-to-all", started);
}

void CudaThreadCommunicator::all_gather(const bf16* shard, bf16* full, size_t count) {
    start_all_gather(shard, full, count, "all-gather");
}

void CudaThreadCommunicator::reduce_scatter(const bf16* full, bf16* shard, size_t count) {
    start_reduce_scatter(full, shard, count, "reduce-scatter");
}

// Every rank works out the whole result into its scratch from the offers,
// and copies it over its data once no rank reads that data any more.
template <class T>
void CudaThreadCommunicator::all_reduce(T* data, size_t count, bool maximum) {
    if (size_ == 1) return;
    bytes.all_reduce += int64_t(count * sizeof(T));
    const double started = offer(data, "all-reduce");
    std::array<const T*, gpu::max_reduced_ranks> inputs{};
    for (int q = 0; q < size_; q++) inputs[size_t(q)] = offered<T>(q);
    T* result = static_cast<T*>(scratch(count * sizeof(T)));
    gpu::reduce_on_stream(stream_, result, inputs.data(), size_, count, maximum);
    finish("all-reduce", started);
    check_cuda(cudaMemcpyAsync(data, result, count * sizeof(T), cudaMemcpyDeviceToDevice, stream_), "all-reduce");
}

void CudaThreadCommunicator::all_reduce_sum(bf16* data, size_t count) { all_reduce(data, count, false); }
void CudaThreadCommunicator::all_reduce_sum(float* data, size_t count) { all_reduce(data, count, false); }
void CudaThreadCommunicator::all_reduce_max(float* data, size_t count) { all_reduce(data, count, true); }

// One ring step: this rank's `send` goes to rank `to`, rank `from`'s arrives
// in `receive`; every rank of the group takes the step together.
void CudaThreadCommunicator::start_exchange(const bf16* send, bf16* receive, size_t count, int to, int from, int tag,
                                            const char* name, Transfer* sent, Transfer* received) {
    *sent = *received = {};
    const double started = offer(send, name, to, tag);
    const ThreadGroup::Offer& incoming = group_->offer_of(from);
    if (incoming.to != rank_ || incoming.tag != tag)
        throw std::logic_error("CudaThreadCommunicator: the ranks of the group are out of step in a ring exchange");
    copy(receive, static_cast<const bf16*>(incoming.data), count);
    finish(name, started);
}

void CudaThreadCommunicator::copy(bf16* dst, const bf16* src, size_t count) {
    gpu::copy_on_stream(stream_, dst, src, count);
}

void CudaThreadCommunicator::add(bf16* acc, const bf16* x, size_t count) { gpu::add_on_stream(stream_, acc, x, count); }

void CudaThreadCommunicator::copy_rows(bf16* dst, size_t dst_stride, const bf16* src, size_t src_stride, size_t rows,
                                       size_t width) {
    gpu::copy_rows_on_stream(stream_, dst, dst_stride, src, src_stride, rows, width);
}

}  // namespace tpsp
