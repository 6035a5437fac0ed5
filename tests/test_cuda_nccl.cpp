// NcclCommunicator on one GPU: a group of one made through NCCL (init, every
// collective, the ring step, test and wait), and the watchdog that ends a
// process whose operation never completes. Skipped without a GPU.
#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <cstdlib>
#include <thread>
#include <vector>

#include "common/bf16.h"
#include "model/kernels/cuda_device.h"
#include "parallel/nccl_communicator.h"
#include "tests/cuda_test_support.h"

using namespace tpsp;

namespace {

// MPI for the communicator's bootstrap (the one-process stand-in where built
// without MPI): this process alone is the world.
void ensure_mpi() {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (initialized) return;
    MPI_Init(nullptr, nullptr);
    std::atexit([] { MPI_Finalize(); });
}

std::vector<bf16> bf16_ramp(size_t n, float start) {
    std::vector<bf16> x(n);
    for (size_t i = 0; i < n; i++) x[i] = bf16(start + float(i % 97));  // integers: exact in bf16
    return x;
}

std::vector<float> as_floats(const std::vector<bf16>& x) { return std::vector<float>(x.begin(), x.end()); }

class CudaNccl : public tpsp::testing::GpuTest {
protected:
    void SetUp() override {
        tpsp::testing::GpuTest::SetUp();
        if (IsSkipped()) return;
        ensure_mpi();
    }
    cudaStream_t stream() const { return gpu::context().stream; }
};

}  // namespace

// In a group of one every collective is the identity, the ring step to
// itself a copy, and each goes through NCCL on the communication stream,
// ordered after the compute stream's work by events.
TEST_F(CudaNccl, AGroupOfOneThroughNcclGivesEveryCollectivesResult) {
    set_peer_timeout(15);  // an operation that hangs is named by the watchdog before ctest's 60 s
    NcclCommunicator group(MPI_COMM_WORLD, stream(), /*nccl_even_alone=*/true);
    ASSERT_EQ(group.size(), 1);
    const size_t n = 1000;
    const std::vector<bf16> x = bf16_ramp(n, 1.0f);
    gpu::DeviceBuffer<bf16> in(x), out(n);

    group.all_gather(in.data(), out.data(), n);
    EXPECT_EQ(as_floats(out.download()), as_floats(x)) << "all-gather";
    out.upload(std::vector<bf16>(n, bf16(0.0f)));
    group.reduce_scatter(in.data(), out.data(), n);
    EXPECT_EQ(as_floats(out.download()), as_floats(x)) << "reduce-scatter";
    group.all_reduce_sum(in.data(), n);
    EXPECT_EQ(as_floats(in.download()), as_floats(x)) << "all-reduce of bf16";

    const std::vector<float> f = {1.5f, -2.0f, 3.25f};
    gpu::DeviceBuffer<float> device_f(f);
    group.all_reduce_sum(device_f.data(), f.size());
    EXPECT_EQ(device_f.download(), f) << "all-reduce of floats";
    group.all_reduce_max(device_f.data(), f.size());
    EXPECT_EQ(device_f.download(), f) << "all-reduce max";
    double host[2] = {0.25, 4.0};
    group.all_reduce_sum(host, 2);
    EXPECT_EQ(host[0], 0.25);
    EXPECT_EQ(host[1], 4.0);

    // the non-blocking forms: done once the compute stream has waited for them
    out.upload(std::vector<bf16>(n, bf16(0.0f)));
    NcclTransfer sent, received;
    group.start_exchange(in.data(), out.data(), n, 0, 0, 0, "ring step", &sent, &received);
    group.wait(received);
    EXPECT_EQ(as_floats(out.download()), as_floats(x)) << "ring step to itself";
    NcclTransfer gather = group.start_all_gather(in.data(), out.data(), n, "started all-gather");
    EXPECT_TRUE(gather.active);
    gpu::check_cuda(cudaDeviceSynchronize(), "synchronize");
    EXPECT_TRUE(group.test(gather));
    EXPECT_FALSE(gather.active);
    EXPECT_EQ(group.bytes.all_gather,
              int64_t(2 * n * sizeof(bf16)));  // one blocking, one started (a ring step counts none)
    EXPECT_EQ(group.bytes.reduce_scatter, int64_t(n * sizeof(bf16)));

    // context parallelism's all-to-all (a block of one rank: its own)
    out.upload(std::vector<bf16>(n, bf16(0.0f)));
    group.all_to_all(in.data(), out.data(), n);
    EXPECT_EQ(as_floats(out.download()), as_floats(x)) << "all-to-all";
    EXPECT_EQ(group.bytes.all_to_all, int64_t(n * sizeof(bf16)));

    // the data-parallel buckets' collectives (a block of one rank: its data is the sum and the gather)
    const std::vector<int> counts = {3}, offsets = {0};
    NcclTransfer summed = group.start_reduce_scatter_blocks(device_f.data(), counts, offsets, "bucket");
    group.wait(summed);
    EXPECT_EQ(device_f.download(), f) << "the bucket's reduce-scatter";
    NcclTransfer gathered = group.start_all_gather_blocks(device_f.data(), counts, offsets, "bucket");
    gpu::check_cuda(cudaDeviceSynchronize(), "synchronize");
    EXPECT_TRUE(group.test(gathered));
    EXPECT_EQ(device_f.download(), f) << "the bucket's all-gather";
    EXPECT_EQ(group.bytes.reduce_scatter, int64_t(n * sizeof(bf16) + 3 * sizeof(float)));
}

// The watchdog's wiring: an operation stuck behind work that does not end
// (a host function sleeping on the compute stream, which the communication
// stream waits for) ends the process after parallel.timeout_s with its line,
// while the host is blocked in a synchronisation no deadline reaches.
TEST_F(CudaNccl, AnOperationThatNeverCompletesEndsTheProcessThroughTheWatchdog) {
    GTEST_FLAG_SET(death_test_style, "threadsafe");  // the child starts afresh: no CUDA across fork
    EXPECT_EXIT(
        {
            set_peer_timeout(2);
            NcclCommunicator group(MPI_COMM_WORLD, stream(), /*nccl_even_alone=*/true);
            gpu::DeviceBuffer<float> x(16);
            gpu::check_cuda(
                cudaLaunchHostFunc(
                    stream(), [](void*) { std::this_thread::sleep_for(std::chrono::seconds(10)); }, nullptr),
                "cudaLaunchHostFunc");
            group.all_reduce_sum(x.data(), 16);
            cudaDeviceSynchronize();  // blocks for 10 s: the watchdog must end the process first
            std::this_thread::sleep_for(std::chrono::seconds(30));  // exit 0 only if it never fires
            std::_Exit(0);
        },
        ::testing::ExitedWithCode(1), "all-reduce \\(NCCL, rank 0 of a group of 1\\) has not completed after");
}
