// Pipeline parallelism's schedules (parallel/pipeline_schedule.h) against
// Megatron's definitions, written out by hand for small cases, and against a
// simulation of every stage running together: no schedule waits forever, and
// the bubble it leaves is the theory's. And each stage's memory against the
// paper's formula: the arena a stage's model allocates, and the bf16 tables.
#include <gtest/gtest.h>

#include "model/gpt.h"
#include "model/gpt_model.h"
#include "model/memory_report.h"
#include "parallel/pipeline_schedule.h"

namespace tpsp {
namespace {

PipelineAction F(int chunk, int micro) { return {PipelineAction::forward, chunk, micro}; }
PipelineAction B(int chunk, int micro) { return {PipelineAction::backward, chunk, micro}; }

TEST(PipelineSchedule, OneForwardOneBackwardIsWarmUpSteadyStateAndCoolDown) {
    const PipelineShape s{2, 1, 4, 4};  // p = 2, m = 4
    // stage 0: one warm-up forward, then F B pairs, then the last backward
    EXPECT_EQ(pipeline_schedule(s, 0),
              (std::vector<PipelineAction>{F(0, 0), F(0, 1), B(0, 0), F(0, 2), B(0, 1), F(0, 3), B(0, 2), B(0, 3)}));
    // the last stage: no warm-up
    EXPECT_EQ(pipeline_schedule(s, 1),
              (std::vector<PipelineAction>{F(0, 0), B(0, 0), F(0, 1), B(0, 1), F(0, 2), B(0, 2), F(0, 3), B(0, 3)}));
    // one stage: the plain gradient accumulation loop
    EXPECT_EQ(pipeline_schedule({1, 1, 2, 4}, 0), (std::vector<PipelineAction>{F(0, 0), B(0, 0), F(0, 1), B(0, 1)}));
}

TEST(PipelineSchedule, StageIKeepsTheLesserOfPMinusIAndMMicroBatchesInFlight) {
    for (int p : {1, 2, 3, 4})
        for (int m : {1, 2, 3, 4, 8})
            for (int i = 0; i < p; i++)
                EXPECT_EQ(pipeline_in_flight({p, 1, m, 12}, i), std::vector<int>{std::min(p - i, m)})
                    << "p " << p << " m " << m << " stage " << i;
}

TEST(PipelineSchedule, InterleavingTakesGroupsOfPMicroBatchesChunkByChunk) {
    const PipelineShape s{2, 2, 4, 8};  // p = 2, vpp = 2, m = 4
    // stage 0's warm-up: (p − 1)·2 + (vpp − 1)·p = 4 pairs; backwards from the last chunk
    EXPECT_EQ(pipeline_schedule(s, 0), (std::vector<PipelineAction>{
                                           F(0, 0), F(0, 1), F(1, 0), F(1, 1),  // warm-up
                                           F(0, 2), B(1, 0), F(0, 3), B(1, 1),  // steady
                                           F(1, 2), B(0, 0), F(1, 3), B(0, 1),  //
                                           B(1, 2), B(1, 3), B(0, 2), B(0, 3),  // cool-down
                                       }));
    // m = p: every forward first (Megatron's all-warm-up case)
    const std::vector<PipelineAction> all = pipeline_schedule({2, 2, 2, 8}, 1);
    EXPECT_EQ(all,
              (std::vector<PipelineAction>{F(0, 0), F(0, 1), F(1, 0), F(1, 1), B(1, 0), B(1, 1), B(0, 0), B(0, 1)}));
    // every pair once each way, on every stage
    for (int i = 0; i < 2; i++) {
        const std::vector<PipelineAction> actions = pipeline_schedule(s, i);
        for (int c = 0; c < 2; c++)
            for (int j = 0; j < 4; j++) {
                EXPECT_EQ(std::count(actions.begin(), actions.end(), F(c, j)), 1);
                EXPECT_EQ(std::count(actions.begin(), actions.end(), B(c, j)), 1);
            }
    }
}

TEST(PipelineSchedule, EveryScheduleRunsToTheEndAndLeavesTheBubbleOfTheTheory) {
    // forward 1, backward 2: the ideal step is m·vpp·3 units of each stage's share
    for (int p : {2, 3, 4})
        for (int vpp : {1, 2, 3})
            for (int m : {p, 2 * p, 4 * p}) {
                const PipelineShape s{p, vpp, m, p * vpp * 2};
                ASSERT_EQ(pipeline_shape_error(s), "");
                const double step = simulate_pipeline(s, 1.0 / vpp, 2.0 / vpp);  // a chunk is 1/vpp of a stage
                ASSERT_GT(step, 0.0) << "p " << p << " vpp " << vpp << " m " << m << " waits forever";
                const double ideal = m * 3.0;
                EXPECT_NEAR((step - ideal) / ideal, pipeline_bubble_theory(s), 1e-9)
                    << "p " << p << " vpp " << vpp << " m " << m;
            }
}

// The boundaries travel over four one-way channels per stage (forward to
// the next stage and from the previous, backward to the previous and from
// the next), each delivering its messages in the order sent, with no tag to
// tell them apart: sound only if every receiver takes a channel's messages
// in the order its sender sends them. Megatron's orders give that (every
// stage runs the (chunk, micro-batch) pairs in one order, whatever its
// warm-up): checked here for every link of every schedule.
TEST(PipelineSchedule, EachChannelsReceiverTakesItsMessagesInTheOrderSent) {
    struct Message {  // the model chunk it goes to, and the micro-batch
        int model_chunk, micro_batch;
        bool operator==(const Message&) const = default;
    };
    for (int p : {2, 3, 4})
        for (int vpp : {1, 2, 3})
            for (int m : {p, 2 * p, 3 * p}) {
                const PipelineShape s{p, vpp, m, p * vpp};
                // [from stage][direction]: what it sends, and what its receiver takes from it, in order
                std::vector<std::vector<Message>> sent(size_t(p) * 2), taken(size_t(p) * 2);
                for (int i = 0; i < p; i++)
                    for (const PipelineAction& a : pipeline_schedule(s, i)) {
                        const int here = s.model_chunk(i, a.chunk);
                        if (a.kind == PipelineAction::forward) {
                            if (!s.last_in_model(i, a.chunk)) sent[size_t(i) * 2].push_back({here + 1, a.micro_batch});
                            if (!s.first_in_model(i, a.chunk))
                                taken[size_t((i + p - 1) % p) * 2].push_back({here, a.micro_batch});
                        } else {
                            if (!s.first_in_model(i, a.chunk))
                                sent[size_t(i) * 2 + 1].push_back({here - 1, a.micro_batch});
                            if (!s.last_in_model(i, a.chunk))
                                taken[size_t((i + 1) % p) * 2 + 1].push_back({here, a.micro_batch});
                        }
                    }
                for (size_t channel = 0; channel < sent.size(); channel++)
                    EXPECT_TRUE(sent[channel] == taken[channel])
                        << "p " << p << " vpp " << vpp << " m " << m << ": stage " << channel / 2 << "'s "
                        << (channel % 2 ? "backward" : "forward") << " channel";
            }
}

TEST(PipelineSchedule, ALayoutThatDoesNotSplitIsOneLine) {
    EXPECT_EQ(pipeline_shape_error({2, 1, 4, 3}),
              "model.layers: 3 blocks do not split into pp · vpp = 2 equal model chunks");
    EXPECT_NE(pipeline_shape_error({2, 2, 3, 8}).find("a multiple of parallel.pp = 2"), std::string::npos);
    EXPECT_NE(pipeline_shape_error({1, 2, 4, 8}).find("needs parallel.pp > 1"), std::string::npos);
    EXPECT_NE(pipeline_shape_error({0, 1, 4, 8}).find("parallel.pp: 0"), std::string::npos);
    EXPECT_EQ(pipeline_shape_error({4, 1, 1, 8}), "");  // 1F1B takes any m, fewer than p too
}

GPTConfig eight_blocks() {
    GPTConfig c;
    c.num_layers = 8, c.num_heads = 4, c.channels = 64, c.vocab_size = 256, c.padded_vocab_size = 256;
    c.max_seq_len = 32;
    return c;
}

// The blocks' saved activations a stage's model allocates: its activation
// arena less what its chunks keep outside the blocks (the embeddings' mask,
// the head's tensors: not the paper's), against the formula, for 1F1B and
// interleaved, several p and m, every recompute mode, with and without dropout.
TEST(PipelineMemory, EachStagesArenaHoldsTheMicroBatchesItHasInFlightAsTheFormulaSays) {
    const GPTConfig c = eight_blocks();
    for (float dropout : {0.0f, 0.1f})
        for (Recompute recompute : {Recompute::none, Recompute::selective, Recompute::full})
            for (auto [p, vpp, m] : {std::tuple{2, 1, 1}, std::tuple{2, 1, 4}, std::tuple{4, 1, 2}, std::tuple{4, 1, 8},
                                     std::tuple{2, 2, 2}, std::tuple{2, 2, 4}, std::tuple{4, 2, 8}}) {
                RunShape r;
                r.batch = 2, r.seq_len = 16, r.dropout = dropout, r.recompute = recompute;
                const PipelineShape pipeline{p, vpp, m, c.num_layers};
                for (int stage = 0; stage < p; stage++) {
                    SCOPED_TRACE("p " + std::to_string(p) + " vpp " + std::to_string(vpp) + " m " + std::to_string(m) +
                                 " stage " + std::to_string(stage) + " dropout " + std::to_string(dropout) +
                                 " recompute " + recompute_description(r));
                    const ModelPart part = pipeline_part(pipeline, stage);
                    const GPT model(c, r, {}, nullptr, nullptr, false, part);
                    int64_t outside = 0;
                    for (size_t chunk = 0; chunk < part.chunks.size(); chunk++) {
                        OutsideActivations<float> unused{};
                        const bool first = chunk == 0 && part.embeddings;
                        const bool last = chunk + 1 == part.chunks.size() && part.head;
                        outside += part.in_flight[chunk] *
                                   int64_t(table_bytes(outside_activation_table(c, r, {}, &unused, first, last)));
                    }
                    EXPECT_EQ(int64_t(model.activation_arena.bytes()) - outside,
                              part_saved_blocks_formula_bytes(c, r, {}, 4, part));
                }
            }
}

// The paper's figures (Korthikanti et al. §4.2.3): under 1F1B with m ≥ p the
// first stage keeps the one-stage model's activations, whatever p;
// interleaved (m > p) 1 + (p − 1)/(p·vpp) times them. In bf16 (e = 2) and
// fp32 tables, every stage's tables equal to the formula.
TEST(PipelineMemory, TheFirstStageKeepsTheWholeModelsActivationsUnder1F1BAndMoreInterleaved) {
    const GPTConfig c = eight_blocks();
    RunShape r;
    r.batch = 2, r.seq_len = 16, r.dropout = 0.1f;
    for (Device device : {Device::cpu, Device::cuda})
        for (auto [p, vpp, m] : {std::tuple{2, 1, 2}, std::tuple{4, 1, 4}, std::tuple{4, 1, 16}, std::tuple{8, 1, 8},
                                 std::tuple{2, 2, 4}, std::tuple{2, 4, 4}, std::tuple{4, 2, 8}}) {
            SCOPED_TRACE("p " + std::to_string(p) + " vpp " + std::to_string(vpp) + " m " + std::to_string(m));
            const PipelineMemoryReport report = pipeline_memory_report(c, r, {}, device, {}, {p, vpp, m, 8});
            EXPECT_TRUE(report.equal()) << report.text;
            // the first stage against the whole model's blocks: × (p·vpp + p − 1)/(p·vpp)
            EXPECT_EQ(report.stage_bytes[0] * (p * vpp), report.one_stage_bytes * (p * vpp + (vpp > 1 ? p - 1 : 0)))
                << report.text;
            // the last stage, whose warm-up is shortest, keeps fewer
            EXPECT_LT(report.stage_bytes[size_t(p) - 1], report.stage_bytes[0]);
        }
}

}  // namespace
}  // namespace tpsp
