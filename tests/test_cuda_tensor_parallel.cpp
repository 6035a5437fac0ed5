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
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "model/cuda_backend.h"
#include "model/gpt.h"
#include "parallel/cuda_thread_group.h"
#include "tests/cuda_test_support.h"
#include "tests/data_parallel_training.h"
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
// positions of the same whole batch, through the all-to-alls or (ring_attention)
// the ring. The model is tiny_gpu_config's, its attention kernels `attention`.
template <class Backend>
RankStep one_step(const TensorParallelism& tp, typename Backend::Comm* group, const std::vector<int>& tokens,
                  typename Backend::Comm* cp_group = nullptr, const RunShape& run = shape,
                  AttentionKernel attention = AttentionKernel::explicit_scores, bool ring_attention = false) {
    GPTConfig config = tpsp::testing::tiny_gpu_config();
    config.attention = attention;
    const int N = run.batch * run.seq_len, cp = cp_group ? cp_group->size() : 1;
    RunShape rank_shape = run;
    rank_shape.seq_len = run.seq_len / cp;
    GPTModel<Backend> model(config, rank_shape, tp, group, cp_group, ring_attention);
    model.init_random(42);
    model.zero_grad();
    RankStep step;
    step.loss = model.forward(tokens.data(), tokens.data() + 1, draw);
    model.backward(1.0f / N);
    model.finish_grads();
    step.grads = download_floats(model.grads.wte, model.num_parameters);
    step.parameter_specs = model.parameter_specs;
    // a2a: [b, a/(t·cp), s, s]; the ring: [b, 2, a/t, s/(2cp), s], as many
    const int64_t scores = int64_t(run.batch) * (config.num_heads / (tp.size * cp)) * run.seq_len * run.seq_len;
    const int64_t rows = int64_t(tp.local_seq(rank_shape.seq_len)) * run.batch;
    for (int l = 0; l < config.num_layers && run.dropout > 0.0f; l++) {
        if (model.blocks[l].attn_dropout_mask)  // (cuDNN keeps none)
            step.attention_masks.push_back(download_bytes(model.blocks[l].attn_dropout_mask, scores));
        step.fc2_masks.push_back(download_bytes(model.blocks[l].fc2_dropout_mask, rows * config.channels));
    }
    return step;
}

// n rank threads on this GPU, each with its own GpuRuntime; rank r's result
// is body(r, its runtime). False where a rank failed.
template <class Result>
bool run_rank_threads(int n, const std::function<Result(int, gpu::GpuRuntime&)>& body, std::vector<Result>* out) {
    set_peer_timeout(20);  // a rank that throws ends the process after 20 s, not the default 300
    std::vector<Result> results(static_cast<size_t>(n));
    std::vector<std::string> errors(static_cast<size_t>(n));
    std::vector<std::thread> ranks;
    for (int r = 0; r < n; r++)
        ranks.emplace_back([&, r] {
            try {
                gpu::GpuRuntime runtime(0);
                results[size_t(r)] = body(r, runtime);
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
    *out = std::move(results);
    return ok;
}

// n rank threads of one group of n (step(rank, its communicator) makes its RankStep)
bool stand_in_steps(int n, const std::function<RankStep(int, CudaThreadCommunicator*)>& step,
                    std::vector<RankStep>* steps_out) {
    ThreadGroup threads(n);
    return run_rank_threads<RankStep>(
        n,
        [&](int r, gpu::GpuRuntime& runtime) {
            CudaThreadCommunicator rank(&threads, r, runtime.context().stream);
            return step(r, &rank);
        },
        steps_out);
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

// Every CP rank's loss is the one rank's, and their gradients summed are its
// gradient, at the tolerances above.
void expect_context_parallel_ranks_equal_one_rank(const std::vector<RankStep>& ranks, const RankStep& one) {
    std::vector<float> summed(one.grads.size(), 0.0f);
    for (size_t r = 0; r < ranks.size(); r++) {
        EXPECT_NEAR(ranks[r].loss, one.loss, 1e-2 * one.loss) << "rank " << r;
        for (size_t i = 0; i < summed.size(); i++) summed[i] += ranks[r].grads[i];
    }
    int64_t at = 0;
    for (const TensorSpec& spec : one.parameter_specs) {
        EXPECT_LT(relative_error(summed.data() + at, one.grads.data() + at, spec.elements()), 5e-2)
            << "gradient of " << spec.name;
        at += spec.elements();
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
        expect_context_parallel_ranks_equal_one_rank(ranks, one);
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

// Ring attention on one GPU (cp_comm_type p2p, docs/design.md §9): cp = 2 and
// 4 rank threads (t = 1), the K|V blocks passed round them as device copies
// and their dK|dV parts added on the way, S' kept and (selective
// recomputation) rebuilt from the rows' log-sum-exp, against t = 1 on the
// same GPU: the loss and the summed gradients at the tolerances above, and
// where S' is kept every rank's attention masks the one-rank masks' rows of
// its positions (rank r's half h is chunk chunk_of(r, h)), bit for bit.
TEST_F(CudaTensorParallel, TheOneGpuStandInRunsRingAttention) {
    const GPTConfig config = tpsp::testing::tiny_gpu_config();
    const std::vector<int> tokens = tpsp::testing::random_tokens(shape.batch * shape.seq_len, config.vocab_size, 79);
    const RankStep one = one_step<CudaBackend>({}, nullptr, tokens);
    for (Recompute recompute : {Recompute::none, Recompute::selective})
        for (int cp : {2, 4}) {
            SCOPED_TRACE("cp=" + std::to_string(cp) + (recompute == Recompute::none ? "" : " selective"));
            RunShape run = shape;
            run.recompute = recompute;
            std::vector<RankStep> ranks;
            const auto cp_rank = [&](int, CudaThreadCommunicator* rank) {
                return one_step<CudaThreadGroupBackend>({}, nullptr, tokens, rank, run,
                                                        AttentionKernel::explicit_scores, true);
            };
            if (!stand_in_steps(cp, cp_rank, &ranks)) return;
            expect_context_parallel_ranks_equal_one_rank(ranks, one);
            if (recompute != Recompute::none) continue;  // (no mask is kept)
            const int S = shape.seq_len, B = shape.batch, a = config.num_heads, c = S / (2 * cp);
            int wrong = 0;
            for (int r = 0; r < cp; r++) {
                const ContextParallelism layout{cp, r, true};
                for (int l = 0; l < config.num_layers; l++)
                    for (int b = 0; b < B; b++)
                        for (int half = 0; half < 2; half++)
                            for (int h = 0; h < a; h++)
                                wrong += std::memcmp(
                                             ranks[size_t(r)].attention_masks[size_t(l)].data() +
                                                 (((size_t(b) * 2 + half) * a + h) * c) * S,
                                             one.attention_masks[size_t(l)].data() +
                                                 ((size_t(b) * a + h) * S + size_t(layout.chunk_of(r, half)) * c) * S,
                                             size_t(c) * S) != 0;
            }
            EXPECT_EQ(wrong, 0) << "masks that are not the one-rank masks at the same heads and positions";
        }
}

#ifdef TPSP_WITH_CUDNN
// cuDNN's fused attention under CP's a2a (docs/design.md §9): cp = 2 and 4
// rank threads, each running cuDNN on every position of its a/cp heads, and
// in backward sp2hp of the kept output back into the heads' layout, against
// t = 1 with cuDNN on the same GPU, without dropout (cuDNN's masks are its
// own, drawn per head group): the loss and the summed gradients at the
// tolerances above.
TEST_F(CudaTensorParallel, TheOneGpuStandInRunsCudnnsAttentionUnderContextParallelism) {
    const GPTConfig config = tpsp::testing::tiny_gpu_config();
    const RunShape no_dropout{shape.batch, shape.seq_len, 0.0f};
    const std::vector<int> tokens = tpsp::testing::random_tokens(shape.batch * shape.seq_len, config.vocab_size, 78);
    const RankStep one = one_step<CudaBackend>({}, nullptr, tokens, nullptr, no_dropout, AttentionKernel::cudnn_fused);
    for (int cp : {2, 4}) {
        SCOPED_TRACE("cp=" + std::to_string(cp));
        std::vector<RankStep> ranks;
        const auto cp_rank = [&](int, CudaThreadCommunicator* rank) {
            return one_step<CudaThreadGroupBackend>({}, nullptr, tokens, rank, no_dropout,
                                                    AttentionKernel::cudnn_fused);
        };
        if (!stand_in_steps(cp, cp_rank, &ranks)) return;
        expect_context_parallel_ranks_equal_one_rank(ranks, one);
    }
}
#endif  // TPSP_WITH_CUDNN

namespace {

using tpsp::testing::DataParallelRun;
using tpsp::testing::DataParallelTraining;

// dp × t rank threads on this GPU, rank r = dp_rank · t + tp_rank (t
// innermost, as the process grid), each training `run` through the
// trainer's DataParallelStep (tests/data_parallel_training.h) with its TP
// group's communicator and its DP group's two. False where a rank failed.
bool data_parallel_stand_in(int dp, int t, const DataParallelSettings& settings, const DataParallelTraining& run,
                            std::vector<DataParallelRun>* runs) {
    std::vector<std::unique_ptr<ThreadGroup>> tp_groups, dp_groups, twins;  // [dp rank], [tp rank], [tp rank]
    for (int q = 0; q < dp; q++) tp_groups.push_back(std::make_unique<ThreadGroup>(t));
    for (int r = 0; r < t; r++) {
        dp_groups.push_back(std::make_unique<ThreadGroup>(dp));
        twins.push_back(std::make_unique<ThreadGroup>(dp));
    }
    return run_rank_threads<DataParallelRun>(
        dp * t,
        [&](int r, gpu::GpuRuntime& runtime) {
            const int tp_rank = r % t, dp_rank = r / t;
            const cudaStream_t stream = runtime.context().stream;
            CudaThreadCommunicator tp(tp_groups[size_t(dp_rank)].get(), tp_rank, stream);
            CudaThreadCommunicator replicas(dp_groups[size_t(tp_rank)].get(), dp_rank, stream);
            CudaThreadCommunicator twin(twins[size_t(tp_rank)].get(), dp_rank, stream);
            return tpsp::testing::train_data_parallel_rank<CudaThreadGroupBackend>(
                run, {t, tp_rank, true, {}}, t > 1 ? &tp : nullptr, tp, replicas, twin, settings);
        },
        runs);
}

}  // namespace

// Data parallelism on one GPU (docs/design.md §8): dp = 2 rank threads (t = 1,
// and × t = 2: 4 threads) train 3 steps of 2 micro-batches, dropout 0.1,
// through the trainer's own DataParallelStep and AdamW, the DP buckets'
// reduce-scatters and all-gathers as device copies and fp32 sums in rank
// order (cuda_thread_group.h). Plain DP with overlap_grad_reduce, the
// distributed optimizer alone, with overlap_grad_reduce, and with both
// overlaps: every loss and norm `==` and every parameter byte-equal to plain
// DP's, on every rank, as on the CPU. This holds because the CUDA backward is
// deterministic (CudaModel.TheSameStepTwiceGivesTheSameGradientsBitForBit);
// with the atomics it had, the parameters after 3 steps differed in their
// last bits between any two runs (seen on the H200). Each rank's arenas under
// the distributed optimizer are the CUDA backend's formula (model_state_bytes
// with the bf16 copies). And dp = 2 against one rank with the same 4
// micro-batches per step: the losses to 1e-3 and the parameters to 1e-3
// relative (the order of the gradient's sums differs).
TEST_F(CudaTensorParallel, TheOneGpuStandInTrainsEveryDataParallelModeToTheBitsOfPlainDataParallelism) {
    DataParallelTraining run{tpsp::testing::tiny_gpu_config(), {4, 64, 0.1f}, 3, 2, {}};
    run.tokens = tpsp::testing::data_parallel_tokens(run, 2, 31);
    const int64_t bucket = 20000;  // the tiny model's 0.84M parameters: dozens of buckets
    const DataParallelSettings plain{bucket, false, false, false};
    const std::vector<std::pair<const char*, DataParallelSettings>> modes = {
        {"plain DP, overlap_grad_reduce", {bucket, false, true, false}},
        {"distributed optimizer", {bucket, true, false, false}},
        {"distributed optimizer, overlap_grad_reduce", {bucket, true, true, false}},
        {"distributed optimizer, both overlaps", {bucket, true, true, true}},
    };
    for (int t : {1, 2}) {
        SCOPED_TRACE("dp=2 t=" + std::to_string(t));
        std::vector<DataParallelRun> reference;
        if (!data_parallel_stand_in(2, t, plain, run, &reference)) return;
        for (const auto& [what, settings] : modes) {
            SCOPED_TRACE(what);
            std::vector<DataParallelRun> ranks;
            if (!data_parallel_stand_in(2, t, settings, run, &ranks)) return;
            for (size_t r = 0; r < ranks.size(); r++) {
                SCOPED_TRACE("rank " + std::to_string(r));
                const DataParallelRun &mode = ranks[r], &base = reference[r];
                EXPECT_EQ(mode.losses, base.losses);
                EXPECT_EQ(mode.norms, base.norms);
                ASSERT_EQ(mode.params.size(), base.params.size());
                EXPECT_EQ(0, std::memcmp(mode.params.data(), base.params.data(), base.params.size() * sizeof(float)))
                    << "the parameters differ from plain DP's after the last step";
                if (settings.distributed_optimizer) {
                    const ModelStateBytes formula = model_state_bytes(run.config, t, bucket, 2, true, true);
                    EXPECT_EQ(mode.held.parameters, formula.parameters);
                    EXPECT_EQ(mode.held.gemm_copies, formula.gemm_copies);
                    EXPECT_EQ(mode.held.gradients, formula.gradients);
                    EXPECT_EQ(mode.held.optimizer, formula.optimizer);
                }
            }
        }
    }
    DataParallelTraining whole = run;  // one rank, the 2 × 2 micro-batches of each step
    whole.grad_accum = 4;
    std::vector<DataParallelRun> one, two;
    if (!data_parallel_stand_in(1, 1, plain, whole, &one) || !data_parallel_stand_in(2, 1, plain, run, &two)) return;
    for (size_t k = 0; k < size_t(run.steps); k++)
        EXPECT_NEAR(two[0].losses[k], one[0].losses[k], 1e-3 * one[0].losses[k]) << "step " << k + 1;
    EXPECT_LT(relative_error(two[0].params.data(), one[0].params.data(), int64_t(one[0].params.size())), 1e-3);
}
