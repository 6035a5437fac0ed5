// The one-GPU stand-in for a tensor-parallel group on CUDA: t ranks as t
// threads of one process on one GPU. NCCL refuses two ranks on one device,
// so this is how one GPU runs the model, the mappings and every overlap
// schedule of a group of t unchanged, and proves TP+SP on the device against
// t = 1 (tests/test_cuda_tensor_parallel.cpp, scripts/gpu_check.sh).
//
// Each rank thread holds its own GpuRuntime (its stream, cuBLASLt handle and
// cuDNN handle: the kernels' context is per thread, cuda_kernels.h). The
// ranks meet at a ThreadGroup (thread_group.h), as the CPU stand-in does,
// and exchange by device copies between their buffers, which all live on
// the one GPU:
//
//   1. a rank finishes its stream's work, so its buffers hold what it sent,
//   2. offers its buffer and waits for every rank's offer,
//   3. enqueues on its own stream the copies or the sum it needs from the
//      others' buffers, and waits for them,
//   4. waits for every rank to be done reading before its buffers change.
//
// A transfer is therefore complete when its start returns (as on the CPU
// stand-in): the schedules run step by step, their compute never waits.
// What this proves on the device is the arithmetic and the buffer layout of
// TP+SP (the mappings, the vocabulary-parallel cross-entropy, the rings'
// chunk order, copy_rows, add), not NCCL's streams and events.
//
// Sums over the ranks are fp32 in rank order, rounded once to the buffer's
// type. At most gpu::max_reduced_ranks ranks.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <memory>
#include <vector>

#include "common/bf16.h"
#include "parallel/communicator.h"
#include "parallel/thread_group.h"
#include "parallel/trace.h"

namespace tpsp {

class CudaThreadCommunicator {
public:
    struct Transfer {
        bool active = false;  // complete on start: never in flight
    };
    static constexpr bool runs_in_enqueue_order = false;  // as the CPU stand-in
    CudaThreadCommunicator() = default;                   // a group of one, on the legacy default stream
    // Rank `rank` of `group`, whose work goes on `stream`: the stream of the
    // rank thread's GpuRuntime, the only thread that calls it.
    CudaThreadCommunicator(ThreadGroup* group, int rank, cudaStream_t stream);
    CudaThreadCommunicator(const CudaThreadCommunicator&) = delete;
    CudaThreadCommunicator& operator=(const CudaThreadCommunicator&) = delete;
    ~CudaThreadCommunicator();
    int rank() const { return rank_; }
    int size() const { return size_; }

    void all_gather(const bf16* shard, bf16* full, size_t count);
    void reduce_scatter(const bf16* full, bf16* shard, size_t count);
    void all_reduce_sum(bf16* data, size_t count);
    void all_reduce_sum(float* data, size_t count);
    void all_reduce_max(float* data, size_t count);
    void all_to_all(const bf16* send, bf16* receive, size_t count);
    // host doubles (norms and losses), as the CPU stand-in sums them
    void all_reduce_sum(double* data, size_t count) { host_.all_reduce_sum(data, count); }

    void start_exchange(const bf16* send, bf16* receive, size_t count, int to, int from, int tag, const char* name,
                        Transfer* sent, Transfer* received);
    Transfer start_all_gather(const bf16* shard, bf16* full, size_t count, const char* name);
    Transfer start_reduce_scatter(const bf16* full, bf16* shard, size_t count, const char* name);
    // the data-parallel buckets' collectives on fp32 gradients and parameters,
    // on blocks of uneven size (communicator.h): sums in rank order
    Transfer start_reduce_scatter_blocks(float* data, const std::vector<int>& counts, const std::vector<int>& offsets,
                                         const char* name);
    Transfer start_all_gather_blocks(float* data, const std::vector<int>& counts, const std::vector<int>& offsets,
                                     const char* name);
    bool test(Transfer&) { return true; }
    void wait(Transfer&) {}

    // buffer work on this rank's stream
    void copy(bf16* dst, const bf16* src, size_t count);
    void add(bf16* acc, const bf16* x, size_t count);
    void copy_rows(bf16* dst, size_t dst_stride, const bf16* src, size_t src_stride, size_t rows, size_t width);

    CollectiveBytes bytes;
    CommunicationTime time;  // all of it exposed: nothing is in flight while computing
    Tracer* tracer = nullptr;
    Track track = Track::communication;

private:
    template <class T>
    void all_reduce(T* data, size_t count, bool maximum);
    // steps 1 and 2 above: this rank's work done, `data` offered, every offer in
    double offer(const void* data, const char* name, int to = -1, int tag = -1);
    // steps 3 and 4: this rank's copies done, every rank done reading; counted
    void finish(const char* name, double started);
    template <class T>
    const T* offered(int rank) const {
        return static_cast<const T*>(group_->offer_of(rank).data);
    }
    // device scratch of at least `bytes`, for a reduction's result
    void* scratch(size_t bytes);

    ThreadGroup* group_ = nullptr;
    int rank_ = 0, size_ = 1;
    cudaStream_t stream_ = nullptr;
    ThreadCommunicator host_;  // the same rank, for host buffers
    void* scratch_ = nullptr;
    size_t scratch_bytes_ = 0;
};

}  // namespace tpsp
