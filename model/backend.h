// What the GPT model needs from the machine it runs on, for the CPU: fp32
// activations in host memory, the kernels of cpu_kernels.h, the MPI
// communicator. cuda_backend.h is the same list for CUDA. The model code
// (gpt_model.h) is written once against this list: kernels are called by
// name and overloaded on the activation type, and the few operations whose
// arguments differ between the backends are the static functions below.
#pragma once
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "model/kernels/cpu_kernels.h"
#include "model/tensor_table.h"
#include "parallel/communicator.h"
#include "parallel/thread_group.h"

namespace tpsp {

// One AdamW update's constants (train/adamw.h computes them).
struct AdamWStep {
    float lr, beta1, beta2, eps, grad_scale;
    float correction1, correction2;  // 1 − β^step
};

// A range of a float buffer and which of two sums its squares add to
// (GPTModel::grad_square_sums: 0 the sharded tensors, 1 the replicated ones).
struct SquareSumRange {
    int64_t begin, count;
    int sum;
};

// The CUDA attention kernels' scratch (attention_scratch.h), as a table
// dimension; here so that the memory report can size a GPU run anywhere.
Dim cuda_attention_scratch(int64_t b, int64_t s, int64_t h, int64_t a, int64_t t);
// ring attention's, s = s/cp this rank's positions
Dim cuda_ring_attention_scratch(int64_t b, int64_t s, int64_t h, int64_t a, int64_t t);

// What the model needs of a backend, checked where each backend is defined
// (below for the CPU, cuda_backend.h for CUDA) and by GPTModel<Backend>.
template <class B>
concept ModelBackend = requires(void* dst, const void* src, size_t bytes, float* f, const float* cf, int64_t n,
                                int rows, const std::vector<SquareSumRange>& ranges, double* sums,
                                const AdamWStep& step) {
    typename B::Act;      // the activation element: float (e = 4) or bf16 (e = 2)
    typename B::Comm;     // the tensor-parallel group: Communicator or NcclCommunicator
    typename B::Runtime;  // what a rank holds while it computes (its GPU)
    { B::name } -> std::convertible_to<const char*>;
    { B::copies_gemm_weights } -> std::convertible_to<bool>;
    { B::has_fused_attention } -> std::convertible_to<bool>;
    { B::memory() } -> std::same_as<const Memory&>;
    B::copy(dst, src, bytes);
    B::upload(dst, src, bytes);
    B::download(dst, src, bytes);
    B::zero(dst, bytes);
    B::add(f, cf, n);
    B::square_sums(cf, ranges, sums);
    { B::attention_scratch(n, n, n, n, n) } -> std::same_as<Dim>;
    { B::ring_attention_scratch(n, n, n, n, n) } -> std::same_as<Dim>;
    B::finish_losses(f, f, cf, cf, rows);
    { B::mean_loss(cf, rows) } -> std::convertible_to<float>;
    B::adamw_update(f, cf, f, f, n, 0.0f, step);
    B::synchronize();
    { B::peak_flops() } -> std::convertible_to<double>;
    { B::peak_flops_name() } -> std::convertible_to<const char*>;
    { B::kernels() } -> std::convertible_to<std::string>;
};

struct CpuBackend {
    using Act = float;          // activation element: e = 4
    using Comm = Communicator;  // MPI
    // what a rank holds while it computes: nothing on the CPU (a GPU on CUDA)
    struct Runtime {
        explicit Runtime(int /*local rank*/) {}
    };
    static constexpr const char* name = "cpu";
    // the communicator of an MPI group
    static std::unique_ptr<Comm> make_group(MPI_Comm comm) { return std::make_unique<Communicator>(comm); }
    // the GEMMs read the fp32 parameters themselves
    static constexpr bool copies_gemm_weights = false;
    // no cuDNN: attention is the explicit kernels only
    static constexpr bool has_fused_attention = false;

    static const Memory& memory() { return host_memory; }
    static void copy(void* dst, const void* src, size_t bytes) { std::memmove(dst, src, bytes); }
    static void upload(void* dst, const void* host, size_t bytes) { std::memcpy(dst, host, bytes); }
    static void download(void* host, const void* src, size_t bytes) { std::memcpy(host, src, bytes); }
    // in 1 MiB pieces across the OpenMP threads: the gradients of GPT-2 124M
    // (500 MB) zero in about 12 ms on 2 threads, 20 ms on one
    static void zero(void* data, size_t bytes);
    static void add(float* acc, const float* x, int64_t n);  // acc += x
    // sums[r.sum] = Σ x² over every range r, in double
    static void square_sums(const float* x, const std::vector<SquareSumRange>& ranges, double sums[2]);

    // attention_backward's scratch: one [s, s] score gradient per OpenMP thread
    static Dim attention_scratch(int64_t b, int64_t s, int64_t h, int64_t a, int64_t t);
    // ring attention's (s = s/cp): a pair of chunks' 4·c² floats per OpenMP thread, c = s/2
    static Dim ring_attention_scratch(int64_t b, int64_t s, int64_t h, int64_t a, int64_t t) {
        return attention_scratch(b, s, h, a, t);
    }
    // after the cross-entropy's all-reduces: lse = max + log Σ, loss = lse − target logit
    static void finish_losses(float* losses, float* lse, const float* maxes, const float* stats, int N);
    // mean of losses [N], to the host
    static float mean_loss(const float* losses, int N);

    // AdamW on n parameters with one weight decay: params, m, v updated in place
    static void adamw_update(float* params, const float* grads, float* m, float* v, int64_t n, float weight_decay,
                             const AdamWStep& step);
    // waits for the work enqueued so far (nothing to wait for on the CPU)
    static void synchronize() {}
    // the denominator of MFU: the best sgemm rate held for this machine and thread count (cpu_blas.h)
    static double peak_flops();
    static const char* peak_flops_name() { return "sgemm peak"; }
    // the GEMM kernels in use, for the banners
    static std::string kernels();
};

static_assert(ModelBackend<CpuBackend>);

// The CPU backend with a tensor-parallel group of threads (parallel/thread_group.h):
// t ranks in one process, giving the MPI group's bits; the tests prove the stand-in with it.
struct CpuThreadGroupBackend : CpuBackend {
    using Comm = ThreadCommunicator;
};
static_assert(ModelBackend<CpuThreadGroupBackend>);

}  // namespace tpsp
