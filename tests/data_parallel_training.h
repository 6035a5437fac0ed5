// A few training steps of one data-parallel rank, through the trainer's own
// DataParallelStep (train/data_parallel.h) and AdamW, on any backend and any
// group: MPI ranks (tests/test_tensor_parallel.cpp), the CPU stand-in's
// threads (the same file) or the one-GPU stand-in's
// (tests/test_cuda_tensor_parallel.cpp). The step is the trainer's
// train_step without the files: grad_accum micro-batches, the last one's
// backward starting the buckets, the DP sum, the norm, clipping at 1, AdamW,
// the gather of the updated pieces.
//
// Every rank reads the same token array: micro-batch m of DP rank r in step
// k is batch (k · grad_accum + m) · dp + r of it, with the dropout keys of
// that batch, as the trainer's loader and keys make it; so dp ranks with
// grad_accum a see the batches of one rank with grad_accum a · dp, in
// another order of summation.
#pragma once
#include <cstdint>
#include <vector>

#include "model/gpt.h"
#include "tests/test_support.h"
#include "train/adamw.h"
#include "train/data_parallel.h"

namespace tpsp::testing {

struct DataParallelTraining {
    GPTConfig config;
    RunShape shape;  // one micro-batch of one rank
    int steps = 3, grad_accum = 2;
    std::vector<int> tokens;  // batches of shape.batch · shape.seq_len tokens, and one more token
};

// What one rank leaves: the loss and the norm of every step, and its TP
// shard of the parameters after the last, with the bytes its arenas hold.
struct DataParallelRun {
    std::vector<float> losses, norms;
    std::vector<float> params;
    ModelStateBytes held;  // parameters, bf16 copies, gradients, AdamW m and v
};

// `tp_group`: the model's group (null for t = 1, where the model makes its
// own); `tp`: the same group for the norm's sum (a group of one for t = 1).
template <class Backend>
DataParallelRun train_data_parallel_rank(const DataParallelTraining& run, const TensorParallelism& tp_shape,
                                         typename Backend::Comm* tp_group, typename Backend::Comm& tp,
                                         typename Backend::Comm& replicas, typename Backend::Comm& gathers,
                                         const DataParallelSettings& settings) {
    GPTModel<Backend> model(run.config, run.shape, tp_shape, tp_group);
    model.init_random(42);
    DataParallelStep<Backend> data_parallel(model, replicas, gathers, tp, settings);
    AdamWOptimizer<Backend> optimizer(model, {}, data_parallel.optimizer_shards(), replicas.rank());
    const int dp = replicas.size(), rank = replicas.rank();
    const size_t batch_tokens = size_t(run.shape.batch) * run.shape.seq_len;
    const float dloss = 1.0f / float(batch_tokens * run.grad_accum * dp);
    DataParallelRun out;
    for (int step = 0; step < run.steps; step++) {
        model.zero_grad();
        double loss = 0.0;
        for (int micro = 0; micro < run.grad_accum; micro++) {
            const int64_t batch = int64_t(step * run.grad_accum + micro) * dp + rank;
            const int* inputs = run.tokens.data() + size_t(batch) * batch_tokens;
            const DropoutStep draw{1337, uint32_t(step), (int64_t(micro) * dp + rank) * run.shape.batch};
            loss += micro == 0 ? data_parallel.first_forward(inputs, inputs + 1, draw)
                               : model.forward(inputs, inputs + 1, draw);
            if (micro + 1 == run.grad_accum) data_parallel.last_backward(dloss);
            else model.backward(dloss);
        }
        model.finish_grads();
        data_parallel.reduce_grads();
        replicas.all_reduce_sum(&loss, 1);
        const float norm = data_parallel.grad_norm();
        optimizer.update(model, 1e-3f, norm > 1.0f ? 1.0f / norm : 1.0f, step + 1);
        data_parallel.gather_updated_parameters();
        out.losses.push_back(float(loss / (run.grad_accum * dp)));
        out.norms.push_back(norm);
    }
    data_parallel.parameters_ready();
    out.params.resize(size_t(model.num_parameters));
    Backend::download(out.params.data(), model.params.wte, out.params.size() * sizeof(float));
    out.held.parameters = int64_t(model.param_arena.bytes());
    out.held.gemm_copies = int64_t(model.weight_arena.bytes());
    out.held.gradients = int64_t(model.grad_arena.bytes());
    out.held.optimizer = int64_t(optimizer.bytes());
    return out;
}

// Batches enough for `run` at dp ranks: steps · grad_accum · dp of them.
inline std::vector<int> data_parallel_tokens(const DataParallelTraining& run, int dp, uint32_t seed) {
    const int batches = run.steps * run.grad_accum * dp;
    return random_tokens(batches * run.shape.batch * run.shape.seq_len + 1, run.config.vocab_size, seed);
}

}  // namespace tpsp::testing
