// TP+SP on one GPU, through the one-GPU stand-in (parallel/cuda_thread_group.h):
// t = 2 and 4 rank threads, each with its own stream, run the model with SP
// and without, with every overlap switch and both reduce-scatter methods,
// against the model of one rank on the same GPU. Skipped without a GPU.
//
// Tolerances: the loss to 1e-2 relative and every gathered gradient tensor to
// 5e-2, those of the GPU model against the CPU model (test_cuda_model.cpp),
// for the same reason: bf16 activations are rounded at other places. Here a
// row-parallel output is rounded per rank before the ranks' partial sums are
// added (t = 1 rounds the GEMM's fp32 sum once), and the vocabulary-parallel
// cross-entropy adds t partial sums. Each rounding is at most 2⁻⁹ relative;
// a wrong shard, chunk order or missing sum is an error of order 1. The
// dropout masks are integers drawn from the same keys: every rank's masks
// must be its slice of the one-rank masks, bit for bit.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "model/cuda_backend.h"
#include "model/gpt.h"
#include "parallel/cuda_thread_group.h"
#include "tests/cuda_test_support.h"
#include "tests/test_support.h"

using namespace tpsp;
using tpsp::testing::download_bytes;
using tpsp::testing::download_floats;
using tpsp::testing::relative_error;

namespace {

const RunShape shape{4, 64, 0.1f};
const DropoutStep draw{1234, 7, 0};

// What one rank's step leaves: its loss, its gradient (shards and the
// replicated tensors), and its part of two of the masks of every block.
struct RankStep {
    float loss = 0.0f;
    std::vector<float> grads;
    std::vector<TensorSpec> parameter_specs;
    std::vector<std::vector<uint8_t>> attention_masks, fc2_masks;
};

// One step of a rank; with a CP group (cp_group), of a CP rank holding s/cp
// positions of the same whole batch.
template <class Backend>
RankStep one_step(const TensorParallelism& tp, typename Backend::Comm* group, const std::vector<int>& tokens,
                  typename Backend::Comm* cp_group = nullptr) {
    const GPTConfig config = tpsp::testing::tiny_gpu_config();
    const int N = shape.batch * shape.seq_len, cp = cp_group ? cp_group->size() : 1;
    RunShape rank_shape = shape;
    rank_shape.seq_len = shape.seq_len / cp;
    GPTModel<Backend> model(config, rank_shape, tp, group, cp_group);
    model.init_random(42);
    model.zero_grad();
    RankStep step;
    step.loss = model.forward(tokens.data(), tokens.data() + 1, draw);
    model.backward(1.0f / N);
    model.reduce_replicated_grads();
    step.grads = download_floats(model.grads.wte, model.num_parameters);
    step.parameter_specs = model.parameter_specs;
    const int64_t scores = int64_t(shape.batch) * (config.num_heads / (tp.size * cp)) * shape.seq_len * shape.seq_len;
    const int64_t rows = int64_t(tp.local_seq(rank_shape.seq_len)) * shape.batch;
    for (int l = 0; l < config.num_layers; l++) {
        step.attention_masks.push_back(download_bytes(model.blocks[l].attn_dropout_mask, scores));
        step.fc2_masks.push_back(download_bytes(model.blocks[l].fc2_dropout_mask, rows * config.channels));
    }
    return step;
}

// n rank threads on this GPU, each with its own GpuRuntime and its rank of
// one group of n (step(rank, its communicator) makes its RankStep); false
// where a rank failed.
bool stand_in_steps(int n, const std::function<RankStep(int, CudaThreadCommunicator*)>& step,
                    std::vector<RankStep>* steps_out) {
    set_peer_timeout(20);  // a rank that throws ends the process after 20 s, not the default 300
    ThreadGroup threads(n);
    std::vector<RankStep> steps(static_cast<size_t>(n));
    std::vector<std::string> errors(static_cast<size_t>(n));
    std::vector<std::thread> ranks;
    for (int r = 0; r < n; r++)
        ranks.emplace_back([&, r] {
            try {
                gpu::GpuRuntime runtime(0);
                CudaThreadCommunicator rank(&threads, r, runtime.context().stream);
                steps[size_t(r)] = step(r, &rank);
            } catch (const std::exception& e) {
                // said at once: a rank that throws leaves the others at the barrier, which ends the process
                std::fprintf(stderr, "rank %d of %d: %s\n", r, n, e.what());
                std::fflush(stderr);
                errors[size_t(r)] = e.what();
            }
        });
    for (std::thread& rank : ranks) rank.join();
    bool ok = true;
    for (int r = 0; r < n; r++) {
        EXPECT_EQ(errors[size_t(r)], "") << "rank " << r;
        ok = ok && errors[size_t(r)].empty();
    }
    *steps_out = std::move(steps);
    return ok;
}

void expect_stand_in_equals_one_rank(const RankStep& one, int t, bool sequence_parallel, const OverlapSettings& overlap,
                                     const std::vector<int>& tokens, const std::string& what) {
    SCOPED_TRACE("t=" + std::to_string(t) + (sequence_parallel ? " TP+SP " : " TP only ") + what);
    const GPTConfig config = tpsp::testing::tiny_gpu_config();
    std::vector<RankStep> ranks;
    const auto tp_rank = [&](int r, CudaThreadCommunicator* rank) {
        return one_step<CudaThreadGroupBackend>({t, r, sequence_parallel, overlap}, rank, tokens);
    };
    if (!stand_in_steps(t, tp_rank, &ranks)) return;

    // every rank's loss is the whole batch's
    for (int r = 0; r < t; r++) EXPECT_NEAR(ranks[size_t(r)].loss, one.loss, 1e-2 * one.loss) << "rank " << r;

    // the shards gathered into the one-rank layout, tensor by tensor
    std::vector<float> full(one.grads.size());
    for (int r = 0; r < t; r++) {
        std::vector<float> shard = ranks[size_t(r)].grads;
        copy_parameter_shards(config, t, r, full.data(), shard.data(), ShardDirection::shard_to_full);
    }
    int64_t at = 0;
    for (const TensorSpec& spec : one.parameter_specs) {
        EXPECT_LT(relative_error(full.data() + at, one.grads.data() + at, spec.elements()), 5e-2)
            << "gradient of " << spec.name;
        at += spec.elements();
    }

    // every rank's masks are its slice of the one-rank masks
    const int S = shape.seq_len, B = shape.batch, C = config.channels, heads = config.num_heads / t;
    const size_t per_sequence = size_t(heads) * S * S;
    const size_t rows = size_t(sequence_parallel ? S / t : S) * B;
    for (int r = 0; r < t; r++) {
        const size_t first_row = sequence_parallel ? size_t(r) * rows : 0;
        for (int l = 0; l < config.num_layers; l++) {
            const RankStep& rank = ranks[size_t(r)];
            for (int b = 0; b < B; b++)
                EXPECT_EQ(0, std::memcmp(rank.attention_masks[size_t(l)].data() + size_t(b) * per_sequence,
                                         one.attention_masks[size_t(l)].data() +
                                             (size_t(b) * config.num_heads + size_t(r) * heads) * S * S,
                                         per_sequence))
                    << "attention mask, rank " << r << ", layer " << l;
            EXPECT_EQ(0, std::memcmp(rank.fc2_masks[size_t(l)].data(), one.fc2_masks[size_t(l)].data() + first_row * C,
                                     rows * C))
                << "fc2 mask, rank " << r << ", layer " << l;
        }
    }
}

class CudaTensorParallel : public tpsp::testing::GpuTest {};

}  // namespace

TEST_F(CudaTensorParallel, TheOneGpuStandInTrainsTheModelOfOneRank) {
    const std::vector<int> tokens = tpsp::testing::random_tokens(shape.batch * shape.seq_len,
                                                                 tpsp::testing::tiny_gpu_config().vocab_size, 99);
    const RankStep one = one_step<CudaBackend>({}, nullptr, tokens);

    OverlapSettings ag, rs_ring, rs_pipeline, bulk, rs_dgrad, every_ring, every_pipeline;
    ag.ag = true;
    rs_ring.rs = true;
    rs_pipeline.rs = rs_pipeline.rs_pipeline = true;
    rs_pipeline.num_splits = 3;
    bulk.bulk_dgrad = bulk.bulk_wgrad = true;
    rs_dgrad.rs_dgrad = true;
    every_ring.ag = every_ring.rs = every_ring.bulk_dgrad = every_ring.bulk_wgrad = true;
    every_pipeline = every_ring;
    every_pipeline.rs_pipeline = every_pipeline.rs_dgrad = true;
    every_pipeline.bulk_dgrad = every_pipeline.bulk_wgrad = false;  // rs_dgrad turns the bulk ones off
    for (int t : {2, 4}) {
        expect_stand_in_equals_one_rank(one, t, true, {}, tokens, "no overlap");
        expect_stand_in_equals_one_rank(one, t, false, {}, tokens, "no overlap");
        expect_stand_in_equals_one_rank(one, t, true, ag, tokens, "tp_comm_overlap_ag");
        expect_stand_in_equals_one_rank(one, t, true, rs_ring, tokens, "tp_comm_overlap_rs, ring");
        expect_stand_in_equals_one_rank(one, t, true, bulk, tokens, "tp_comm_bulk_dgrad and _wgrad");
        expect_stand_in_equals_one_rank(one, t, true, rs_dgrad, tokens, "tp_comm_overlap_rs_dgrad");
        expect_stand_in_equals_one_rank(one, t, true, every_ring, tokens, "every switch, ring");
    }
    // last: 3 splits of h = 128 give GEMMs 42 and 43 columns wide (odd leading dimensions)
    for (int t : {2, 4}) {
        expect_stand_in_equals_one_rank(one, t, true, rs_pipeline, tokens, "tp_comm_overlap_rs, pipeline");
        expect_stand_in_equals_one_rank(one, t, true, every_pipeline, tokens, "every switch, pipeline");
    }
}

// Context parallelism on one GPU (docs/design.md §9): cp = 2 and 4 rank
// threads (t = 1), the all-to-alls of sp2hp / hp2sp as device copies between
// them, against t = 1 on the same GPU: the loss and the gradients (summed over
// the CP ranks) at the tolerances above, and every rank's masks its slice of
// the one-rank masks, by global head and global position, bit for bit.
TEST_F(CudaTensorParallel, TheOneGpuStandInRunsContextParallelism) {
    const GPTConfig config = tpsp::testing::tiny_gpu_config();
    const std::vector<int> tokens = tpsp::testing::random_tokens(shape.batch * shape.seq_len, config.vocab_size, 77);
    const RankStep one = one_step<CudaBackend>({}, nullptr, tokens);
    for (int cp : {2, 4}) {
        SCOPED_TRACE("cp=" + std::to_string(cp));
        std::vector<RankStep> ranks;
        const auto cp_rank = [&](int, CudaThreadCommunicator* rank) {
            return one_step<CudaThreadGroupBackend>({}, nullptr, tokens, rank);
        };
        if (!stand_in_steps(cp, cp_rank, &ranks)) return;
        std::vector<float> summed(one.grads.size(), 0.0f);
        for (int r = 0; r < cp; r++) {
            EXPECT_NEAR(ranks[size_t(r)].loss, one.loss, 1e-2 * one.loss) << "rank " << r;
            for (size_t i = 0; i < summed.size(); i++) summed[i] += ranks[size_t(r)].grads[i];
        }
        int64_t at = 0;
        for (const TensorSpec& spec : one.parameter_specs) {
            EXPECT_LT(relative_error(summed.data() + at, one.grads.data() + at, spec.elements()), 5e-2)
                << "gradient of " << spec.name;
            at += spec.elements();
        }
        const int S = shape.seq_len, B = shape.batch, C = config.channels, heads = config.num_heads / cp;
        int wrong = 0;
        for (int r = 0; r < cp; r++) {
            const ContextParallelism layout{cp, r};
            for (int l = 0; l < config.num_layers; l++) {
                for (int b = 0; b < B; b++)
                    wrong += std::memcmp(ranks[size_t(r)].attention_masks[size_t(l)].data() + size_t(b) * heads * S * S,
                                         one.attention_masks[size_t(l)].data() +
                                             (size_t(b) * config.num_heads + size_t(r) * heads) * S * S,
                                         size_t(heads) * S * S) != 0;
                for (int i = 0; i < layout.local_seq(S); i++)
                    wrong += std::memcmp(ranks[size_t(r)].fc2_masks[size_t(l)].data() + size_t(i) * B * C,
                                         one.fc2_masks[size_t(l)].data() + size_t(layout.global_position(i, S)) * B * C,
                                         size_t(B) * C) != 0;
            }
        }
        EXPECT_EQ(wrong, 0) << "masks that are not the one-rank masks at the same heads and positions";
    }
}
