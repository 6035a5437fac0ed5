// Under mpirun with 4 ranks (ctest launches it): the model split over TP
// groups of 2 and 4, with sequence parallelism and without, against the
// single-rank model on every rank — loss, every parameter gradient (the
// shards gathered), the gradient norm, the dropout masks, and the arena against the formula.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "model/gpt.h"
#include "model/memory_report.h"
#include "parallel/communicator.h"
#include "parallel/mappings.h"
#include "parallel/overlap.h"
#include "parallel/pipeline_channels.h"
#include "parallel/process_grid.h"
#include "parallel/thread_group.h"
#include "parallel/trace.h"
#include "tests/data_parallel_training.h"
#include "tests/test_support.h"
#include "train/config.h"

using namespace tpsp;

namespace {

GPTConfig tiny_config() {
    GPTConfig c;
    c.max_seq_len = 16;
    c.vocab_size = 61;
    c.padded_vocab_size = 64;
    c.num_layers = 2;
    c.num_heads = 4;
    c.channels = 32;
    return c;
}

const RunShape shape{3, 16, 0.1f};

// The world's 4 ranks as TP groups of t adjacent ranks.
struct TpGroup {
    explicit TpGroup(int t) {
        int world_rank;
        MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
        MPI_Comm_split(MPI_COMM_WORLD, world_rank / t, world_rank % t, &comm);
        group = Communicator(comm);
    }
    ~TpGroup() { MPI_Comm_free(&comm); }
    MPI_Comm comm;
    Communicator group;
};

// Every gradient tensor of `split`, its TP shards gathered on rank 0 of `group`
// into the whole model's layout, against `one`'s within `tolerance` relative.
void expect_gathered_gradients(Communicator& group, const GPT& split, const GPT& one, double tolerance) {
    const int t = group.size();
    std::vector<float> shards(size_t(split.num_parameters) * t), full(size_t(one.num_parameters));
    group.gather(split.grads.wte, shards.data(), size_t(split.num_parameters), 0);
    if (group.rank() != 0) return;
    for (int r = 0; r < t; r++)
        copy_parameter_shards(one.config, t, r, full.data(), shards.data() + size_t(r) * split.num_parameters,
                              ShardDirection::shard_to_full);
    int64_t at = 0;
    for (const TensorSpec& spec : one.parameter_specs) {
        EXPECT_LT(tpsp::testing::relative_error(full.data() + at, one.grads.wte + at, spec.elements()), tolerance)
            << "gradient of " << spec.name;
        at += spec.elements();
    }
}

void compare_with_one_rank(int t, bool sequence_parallel) {
    SCOPED_TRACE("t=" + std::to_string(t) + (sequence_parallel ? " TP+SP" : " TP only"));
    TpGroup tp_group(t);
    Communicator& group = tp_group.group;
    const GPTConfig config = tiny_config();
    const int N = shape.batch * shape.seq_len;
    std::vector<int> tokens = tpsp::testing::random_tokens(N, config.vocab_size, 99);
    const DropoutStep draw{7, 3, 0};

    GPT one(config, shape);
    one.init_random(11);
    one.zero_grad();
    float one_loss = one.forward(tokens.data(), tokens.data() + 1, draw);
    one.backward(1.0f / N);
    one.finish_grads();

    TensorParallelism tp{t, group.rank(), sequence_parallel, {}};
    GPT split(config, shape, tp, &group);
    split.init_random(11);
    split.zero_grad();
    float split_loss = split.forward(tokens.data(), tokens.data() + 1, draw);
    split.backward(1.0f / N);
    split.finish_grads();
    EXPECT_NEAR(split_loss, one_loss, 1e-6 * one_loss);

    // the masks: this rank's part of every mask is the same part of the one-rank mask
    const int heads = config.num_heads / t, S = shape.seq_len, B = shape.batch, C = config.channels;
    const int rows = sequence_parallel ? S / t * B : S * B, first_row = sequence_parallel ? group.rank() * rows : 0;
    for (int l = 0; l < config.num_layers; l++) {
        for (int b = 0; b < B; b++) {
            size_t block = size_t(heads) * S * S;
            EXPECT_EQ(0, std::memcmp(split.blocks[l].attn_dropout_mask + b * block,
                                     one.blocks[l].attn_dropout_mask +
                                         (size_t(b) * config.num_heads + size_t(group.rank()) * heads) * S * S,
                                     block))
                << "attention mask, layer " << l;
        }
        EXPECT_EQ(0, std::memcmp(split.blocks[l].proj_dropout_mask,
                                 one.blocks[l].proj_dropout_mask + size_t(first_row) * C, size_t(rows) * C))
            << "attention proj mask, layer " << l;
        EXPECT_EQ(0, std::memcmp(split.blocks[l].fc2_dropout_mask,
                                 one.blocks[l].fc2_dropout_mask + size_t(first_row) * C, size_t(rows) * C))
            << "fc2 mask, layer " << l;
    }
    EXPECT_EQ(0, std::memcmp(split.outside.embedding_dropout_mask,
                             one.outside.embedding_dropout_mask + size_t(first_row) * C, size_t(rows) * C))
        << "embedding mask";

    expect_gathered_gradients(group, split, one, 1e-4);

    // the gradient norm: the shards' squares add up over the group, the replicated tensors count once
    double direct = 0.0;
    for (int64_t i = 0; i < one.num_parameters; i++) direct += double(one.grads.wte[i]) * one.grads.wte[i];
    double one_sharded, one_replicated, split_sharded, split_replicated;
    one.grad_square_sums(&one_sharded, &one_replicated);
    split.grad_square_sums(&split_sharded, &split_replicated);
    group.all_reduce_sum(&split_sharded, 1);
    EXPECT_NEAR(one_sharded + one_replicated, direct, 1e-12 * direct);
    EXPECT_NEAR(split_sharded + split_replicated, direct, 1e-4 * direct);
    EXPECT_NEAR(split_replicated, one_replicated, 1e-4 * one_replicated);

    // the arena this rank allocated is the per-rank formula
    int64_t formula = block_activation_formula_bytes(B, S, C, config.num_heads, 4, t, sequence_parallel);
    std::vector<TensorSpec> outside = outside_activation_table(config, shape, tp, &split.outside);
    EXPECT_EQ(int64_t(split.activation_arena.bytes()), config.num_layers * formula + int64_t(table_bytes(outside)));
}

}  // namespace

TEST(TensorParallel, TwoRanksWithSequenceParallelEqualOneRank) { compare_with_one_rank(2, true); }
TEST(TensorParallel, TwoRanksTensorOnlyEqualOneRank) { compare_with_one_rank(2, false); }
TEST(TensorParallel, FourRanksWithSequenceParallelEqualOneRank) { compare_with_one_rank(4, true); }
TEST(TensorParallel, FourRanksTensorOnlyEqualOneRank) { compare_with_one_rank(4, false); }

// The one-process stand-in (parallel/thread_group.h): t threads of world
// rank 0 against the MPI group of world ranks 0 … t − 1, the same model on
// the same weights and tokens, dropout on. The loss of every rank, every
// gradient shard and the gradient norm's parts must be the same bits.
struct OneRankStep {
    float loss = 0.0f;
    std::vector<float> grads;
    double sharded = 0.0, replicated = 0.0;  // the norm's parts, the sharded one summed over the group
};

template <class Model, class Group>
OneRankStep one_step(Group* group, bool sequence_parallel, const OverlapSettings& overlap,
                     const std::vector<int>& tokens) {
    const int N = shape.batch * shape.seq_len;
    Model model(tiny_config(), shape, {group->size(), group->rank(), sequence_parallel, overlap}, group);
    model.init_random(11);
    model.zero_grad();
    OneRankStep step;
    step.loss = model.forward(tokens.data(), tokens.data() + 1, {7, 3, 0});
    model.backward(1.0f / N);
    model.finish_grads();
    step.grads.assign(model.grads.wte, model.grads.wte + model.num_parameters);
    model.grad_square_sums(&step.sharded, &step.replicated);
    group->all_reduce_sum(&step.sharded, 1);
    return step;
}

void compare_thread_group_with_mpi_group(int t, bool sequence_parallel, const OverlapSettings& overlap,
                                         const char* what) {
    SCOPED_TRACE("t=" + std::to_string(t) + (sequence_parallel ? " TP+SP " : " TP only ") + what);
    const std::vector<int> tokens = tpsp::testing::random_tokens(shape.batch * shape.seq_len, tiny_config().vocab_size,
                                                                 23);
    TpGroup tp_group(t);
    Communicator& group = tp_group.group;
    const OneRankStep mpi = one_step<GPT>(&group, sequence_parallel, overlap, tokens);
    const size_t n = mpi.grads.size();
    std::vector<float> mpi_grads(n * size_t(t)), mpi_losses(static_cast<size_t>(t));
    group.gather(mpi.grads.data(), mpi_grads.data(), n, 0);
    group.gather(&mpi.loss, mpi_losses.data(), 1, 0);
    int world_rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    if (world_rank == 0) {
        ThreadGroup threads(t);
        std::vector<OneRankStep> stand_in(static_cast<size_t>(t));
        std::vector<std::thread> ranks;
        for (int r = 0; r < t; r++)
            ranks.emplace_back([&, r] {
                ThreadCommunicator rank(&threads, r);
                stand_in[size_t(r)] = one_step<ThreadGroupGPT>(&rank, sequence_parallel, overlap, tokens);
            });
        for (std::thread& rank : ranks) rank.join();
        for (int r = 0; r < t; r++) {
            SCOPED_TRACE("rank " + std::to_string(r));
            EXPECT_EQ(stand_in[size_t(r)].loss, mpi_losses[size_t(r)]);
            ASSERT_EQ(stand_in[size_t(r)].grads.size(), n);
            EXPECT_EQ(0, std::memcmp(stand_in[size_t(r)].grads.data(), mpi_grads.data() + size_t(r) * n, n * 4))
                << "a gradient shard differs";
        }
        EXPECT_EQ(stand_in[0].sharded, mpi.sharded);
        EXPECT_EQ(stand_in[0].replicated, mpi.replicated);
    }
    MPI_Barrier(MPI_COMM_WORLD);
}

TEST(ThreadGroup, TheOneProcessStandInGivesTheMpiGroupsBits) {
    OverlapSettings ring;  // every switch, the reduce-scatter as a ring
    ring.ag = ring.rs = ring.bulk_dgrad = ring.bulk_wgrad = true;
    OverlapSettings pipelined = ring;  // and as a pipeline, dgrad's reduce-scatter overlapped (the bulk ones give way)
    pipelined.bulk_dgrad = pipelined.bulk_wgrad = false;
    pipelined.rs_pipeline = pipelined.rs_dgrad = true;
    pipelined.num_splits = 3;
    for (int t : {2, 4}) {
        compare_thread_group_with_mpi_group(t, true, {}, "no overlap");
        compare_thread_group_with_mpi_group(t, false, {}, "no overlap");
        compare_thread_group_with_mpi_group(t, true, ring, "every switch, ring");
        compare_thread_group_with_mpi_group(t, true, pipelined, "every switch, pipeline, rs_dgrad");
    }
}

// Every overlap switch alone, and all of them, against the same TP group
// without overlap: the loss and every gradient shard to 1e-5.
void compare_overlap_with_plain(int t, const OverlapSettings& overlap, const std::string& what) {
    SCOPED_TRACE("t=" + std::to_string(t) + " " + what);
    TpGroup tp_group(t);
    Communicator& group = tp_group.group;
    const GPTConfig config = tiny_config();
    const int N = shape.batch * shape.seq_len;
    std::vector<int> tokens = tpsp::testing::random_tokens(N, config.vocab_size, 5);
    std::vector<float> losses, grads[2];
    for (int run = 0; run < 2; run++) {
        TensorParallelism tp{t, group.rank(), true, run == 0 ? OverlapSettings{} : overlap};
        GPT model(config, shape, tp, &group);
        model.init_random(3);
        model.zero_grad();
        losses.push_back(model.forward(tokens.data(), tokens.data() + 1, {1, 2, 0}));
        model.backward(1.0f / N);
        model.finish_grads();
        grads[run].assign(model.grads.wte, model.grads.wte + model.num_parameters);
        if (run == 1) {
            EXPECT_NEAR(losses[1], losses[0], 1e-6 * losses[0]);
            int64_t at = 0;
            for (const TensorSpec& spec : model.parameter_specs) {
                EXPECT_LT(tpsp::testing::relative_error(grads[1].data() + at, grads[0].data() + at, spec.elements()),
                          1e-5)
                    << "gradient of " << spec.name;
                at += spec.elements();
            }
        }
    }
}

TEST(Overlap, EverySwitchAloneAndAllTogetherLeaveTheNumbersUnchanged) {
    struct Case {
        const char* name;
        OverlapSettings settings;
    };
    OverlapSettings ag, rs_ring, rs_pipeline, bulk_dgrad, bulk_wgrad, rs_dgrad, all;
    ag.ag = true;
    rs_ring.rs = true;
    rs_pipeline.rs = rs_pipeline.rs_pipeline = true;
    bulk_dgrad.bulk_dgrad = true;
    bulk_wgrad.bulk_wgrad = true;
    rs_dgrad.rs_dgrad = true;
    all.ag = all.rs = all.bulk_dgrad = all.bulk_wgrad = true;
    OverlapSettings all_rs_dgrad = all;
    all_rs_dgrad.bulk_dgrad = all_rs_dgrad.bulk_wgrad = false;
    all_rs_dgrad.rs_dgrad = all_rs_dgrad.rs_pipeline = true;
    all_rs_dgrad.num_splits = 3;
    for (int t : {2, 4})
        for (const Case& c :
             {Case{"ag", ag}, Case{"rs ring", rs_ring}, Case{"rs pipeline", rs_pipeline},
              Case{"bulk dgrad", bulk_dgrad}, Case{"bulk wgrad", bulk_wgrad}, Case{"rs dgrad", rs_dgrad},
              Case{"all (bulk)", all}, Case{"all (rs dgrad, pipeline, 3 splits)", all_rs_dgrad}})
            compare_overlap_with_plain(t, c.settings, c.name);
}

// The numbers above would not change if a switch silently fell back to the
// plain path; the trace says which path ran. The communication spans of one
// forward+backward at t = 2, counted by name.
using SpanCounts = std::map<std::string, int>;

SpanCounts communication_spans(int t, const OverlapSettings& overlap) {
    TpGroup tp_group(t);
    Communicator& group = tp_group.group;
    Tracer tracer;
    tracer.enable(100000);
    group.tracer = &tracer;
    const GPTConfig config = tiny_config();
    const int N = shape.batch * shape.seq_len;
    std::vector<int> tokens = tpsp::testing::random_tokens(N, config.vocab_size, 5);
    GPT model(config, shape, {t, group.rank(), true, overlap}, &group);
    model.init_random(3);
    model.zero_grad();
    model.forward(tokens.data(), tokens.data() + 1, {1, 2, 0});
    model.backward(1.0f / N);
    model.finish_grads();
    SpanCounts counts;
    for (const char* name :
         {"all-gather", "reduce-scatter", "ring all-gather", "ring reduce-scatter", "pipelined reduce-scatter",
          "bulk all-gather", "bulk reduce-scatter", "all-gather for wgrad"})
        counts[name] = tracer.count(name, Track::communication);
    return counts;
}

// The switches as a config gives them to the model (Config::overlap()
// applies the master switch and rs_dgrad's precedence): the master switch on,
// every other off.
Config::Parallel master_switch_alone() {
    Config::Parallel p;
    p.tp_comm_overlap = true;
    p.tp_comm_overlap_ag = p.tp_comm_overlap_rs = p.tp_comm_bulk_dgrad = p.tp_comm_bulk_wgrad = false;
    p.tp_comm_overlap_rs_dgrad = false;
    return p;
}

// Each switch replaces the plain collectives of its linears by its schedule's
// transfers. The column-parallel linears are qkv and fc1 of every layer and
// the LM head (2L + 1), the row-parallel ones attention proj and fc2 (2L); a
// ring at t = 2 is one receive, a pipelined reduce-scatter one transfer per
// split.
TEST(Overlap, EverySwitchRunsItsScheduleInPlaceOfThePlainCollectives) {
    const int t = 2, L = tiny_config().num_layers, splits = Config::Parallel{}.tp_comm_num_splits;
    const int columns = 2 * L + 1, rows = 2 * L;
    const SpanCounts plain = communication_spans(t, OverlapSettings{});
    // per layer AG: 2 forward, 2 ḡ backward, 2 re-gathers; RS: 2 forward, 2 g backward;
    // the embedding adds RS + AG, the LM head AG + AG + RS
    EXPECT_EQ(plain.at("all-gather"), 6 * L + 3);
    EXPECT_EQ(plain.at("reduce-scatter"), 4 * L + 2);
    auto expect_spans = [&](const char* what, const Config::Parallel& switches, const SpanCounts& change) {
        SCOPED_TRACE(what);
        Config config;
        config.parallel = switches;
        SpanCounts expected = plain;
        for (const auto& [name, delta] : change) expected[name] += delta;
        EXPECT_EQ(communication_spans(t, config.overlap()), expected);
    };
    Config::Parallel p = master_switch_alone();
    p.tp_comm_overlap_ag = true;  // column forward, row backward
    expect_spans("tp_comm_overlap_ag", p, {{"all-gather", -columns - rows}, {"ring all-gather", columns + rows}});
    p = master_switch_alone();
    p.tp_comm_overlap_rs = true;  // row forward
    expect_spans("tp_comm_overlap_rs, ring", p, {{"reduce-scatter", -rows}, {"ring reduce-scatter", rows}});
    p.tp_comm_rs_method = "pipeline";
    expect_spans("tp_comm_overlap_rs, pipeline", p,
                 {{"reduce-scatter", -rows}, {"pipelined reduce-scatter", rows * splits}});
    p = master_switch_alone();
    p.tp_comm_bulk_dgrad = true;  // column backward's re-gather
    expect_spans("tp_comm_bulk_dgrad", p, {{"all-gather", -columns}, {"bulk all-gather", columns}});
    p = master_switch_alone();
    p.tp_comm_bulk_wgrad = true;  // column backward's reduce-scatter
    expect_spans("tp_comm_bulk_wgrad", p, {{"reduce-scatter", -columns}, {"bulk reduce-scatter", columns}});
    p = master_switch_alone();
    p.tp_comm_overlap_rs_dgrad = p.tp_comm_bulk_dgrad = p.tp_comm_bulk_wgrad = true;  // the bulk ones give way
    expect_spans("tp_comm_overlap_rs_dgrad", p,
                 {{"all-gather", -columns},
                  {"all-gather for wgrad", columns},
                  {"reduce-scatter", -columns},
                  {"pipelined reduce-scatter", columns * splits}});
    p = Config::Parallel{};
    p.tp_comm_overlap_rs_dgrad = true;  // every switch on but the master one
    p.tp_comm_overlap = false;
    expect_spans("tp_comm_overlap=false", p, {});
}

// Recomputation changes what is kept, never the numbers: with dropout on,
// the loss and every gradient are the same bits under selective and full
// recomputation (uniform runs of 2 and of 1 over 3 blocks, so one run is
// shorter; the first 2 blocks alone) as without it, at t = 1, 2, 4, with SP
// and without, with overlap off and every switch on. The arena is the
// formula of what the mode keeps, and the workspace grows by exactly the
// formula of what it recomputes into.
struct RecomputeCase {
    Recompute recompute;
    RecomputeMethod method;
    int layers;
};
const RecomputeCase recompute_cases[] = {
    {Recompute::none, RecomputeMethod::uniform, 1}, {Recompute::selective, RecomputeMethod::uniform, 1},
    {Recompute::full, RecomputeMethod::uniform, 2}, {Recompute::full, RecomputeMethod::uniform, 1},
    {Recompute::full, RecomputeMethod::block, 2},
};

void compare_recompute_modes_with_none(int t, bool sequence_parallel, const OverlapSettings& overlap, float dropout) {
    SCOPED_TRACE("t=" + std::to_string(t) + (sequence_parallel ? " TP+SP" : " TP only") +
                 (overlap.any() ? " every overlap switch" : "") + " dropout=" + std::to_string(dropout));
    TpGroup tp_group(t);
    Communicator& group = tp_group.group;
    GPTConfig config = tiny_config();
    config.num_layers = 3;
    const int N = shape.batch * shape.seq_len;
    std::vector<int> tokens = tpsp::testing::random_tokens(N, config.vocab_size, 17);
    const TensorParallelism tp{t, group.rank(), sequence_parallel, overlap};
    std::vector<float> none_grads;
    float none_loss = 0.0f;
    int64_t none_workspace = 0;
    for (const RecomputeCase& mode : recompute_cases) {
        RunShape run = shape;
        run.dropout = dropout;
        run.recompute = mode.recompute, run.recompute_method = mode.method, run.recompute_layers = mode.layers;
        SCOPED_TRACE("recompute " + recompute_description(run));
        GPT model(config, run, tp, &group);
        model.init_random(5);
        model.zero_grad();
        const float loss = model.forward(tokens.data(), tokens.data() + 1, {4, 9, 0});
        model.backward(1.0f / N);
        model.finish_grads();
        const std::vector<TensorSpec> outside = outside_activation_table(config, run, tp, &model.outside);
        EXPECT_EQ(int64_t(model.activation_arena.bytes()),
                  saved_blocks_formula_bytes(config, run, tp, 4) + int64_t(table_bytes(outside)));
        if (mode.recompute == Recompute::none) {
            none_loss = loss;
            none_grads.assign(model.grads.wte, model.grads.wte + model.num_parameters);
            none_workspace = int64_t(model.workspace_arena.bytes());
            continue;
        }
        EXPECT_EQ(int64_t(model.workspace_arena.bytes()) - none_workspace,
                  recompute_workspace_formula_bytes(config, run, tp, 4));
        EXPECT_EQ(loss, none_loss);
        ASSERT_EQ(size_t(model.num_parameters), none_grads.size());
        EXPECT_EQ(0, std::memcmp(model.grads.wte, none_grads.data(), none_grads.size() * sizeof(float)))
            << "a gradient differs under recomputation";
    }
}

TEST(Recompute, SelectiveAndFullGiveTheSameLossAndGradientsBitForBit) {
    OverlapSettings ring;  // every switch, the reduce-scatter as a ring
    ring.ag = ring.rs = ring.bulk_dgrad = ring.bulk_wgrad = true;
    OverlapSettings pipelined = ring;  // and as a pipeline, dgrad's reduce-scatter overlapped too
    pipelined.rs_pipeline = pipelined.rs_dgrad = true;
    for (int t : {1, 2, 4}) {
        compare_recompute_modes_with_none(t, true, {}, 0.1f);
        compare_recompute_modes_with_none(t, false, {}, 0.1f);
        if (t > 1) {
            compare_recompute_modes_with_none(t, true, ring, 0.1f);
            compare_recompute_modes_with_none(t, true, pipelined, 0.1f);
        }
    }
    compare_recompute_modes_with_none(2, true, {}, 0.0f);  // no masks, S is S'
}

// tpsp's own overlap schedules (parallel/overlap.h) on the 4 ranks of the
// world, against the plain collectives, on whole numbers so that any order of
// summation gives the same bits. Each compute callback records which chunk it
// was handed at which step, and checks that the chunk's data had arrived.
float value_of(int rank, int chunk, size_t i) { return float(1000 * rank + 100 * chunk + int(i)); }

TEST(Communicator, TheRingAllGatherHandsEachChunkOverAsItArrives) {
    Communicator world(MPI_COMM_WORLD);
    const int t = world.size(), me = world.rank();
    const size_t count = 5;
    std::vector<float> mine(count), ring(count * t), plain(count * t);
    for (size_t i = 0; i < count; i++) mine[i] = value_of(me, 0, i);
    world.all_gather(mine.data(), plain.data(), count);
    std::vector<int> order;
    ring_all_gather_overlapped(world, mine.data(), ring.data(), count,
                               [&](int chunk, const float* data, const Poll<Communicator>& poll) {
                                   order.push_back(chunk);
                                   EXPECT_EQ(data, ring.data() + size_t(chunk) * count);
                                   EXPECT_TRUE(std::equal(data, data + count, plain.begin() + chunk * count))
                                       << "chunk " << chunk << " handed over before it arrived";
                                   poll();
                               });
    EXPECT_EQ(ring, plain);
    std::vector<int> expected;  // its own chunk first, then the next rank's, around the ring
    for (int step = 0; step < t; step++) expected.push_back((me + step) % t);
    EXPECT_EQ(order, expected);
}

TEST(Communicator, TheRingReduceScatterAddsEachPartialAsItsAccumulatorPasses) {
    Communicator world(MPI_COMM_WORLD);
    const int t = world.size(), me = world.rank();
    const size_t count = 5;
    std::vector<float> full(count * t), plain(count), ring(count), scratch(3 * count);
    for (int chunk = 0; chunk < t; chunk++)
        for (size_t i = 0; i < count; i++) full[chunk * count + i] = value_of(me, chunk, i);
    world.reduce_scatter(full.data(), plain.data(), count);
    std::vector<int> order;
    ring_reduce_scatter_overlapped(world, ring.data(), scratch.data(), count,
                                   [&](int chunk, float* out, const Poll<Communicator>& poll) {
                                       order.push_back(chunk);
                                       std::copy_n(full.begin() + chunk * count, count, out);
                                       poll();
                                   });
    EXPECT_EQ(ring, plain);
    std::vector<int> expected;  // the accumulator of chunk me − 1 starts here; its own comes home last
    for (int step = 0; step < t; step++) expected.push_back((me - step - 1 + t) % t);
    EXPECT_EQ(order, expected);
}

TEST(Communicator, ThePipelinedReduceScatterSendsEachColumnRangeAsItIsProduced) {
    Communicator world(MPI_COMM_WORLD);
    const int t = world.size(), me = world.rank(), splits = 3;
    const size_t rows = 2, cols = 7;  // column ranges of 2, 2 and 3
    std::vector<float> full(size_t(t) * rows * cols), plain(rows * cols), pipelined(rows * cols);
    std::vector<float> packed(full.size()), received(rows * cols);
    for (size_t row = 0; row < t * rows; row++)
        for (size_t col = 0; col < cols; col++) full[row * cols + col] = value_of(me, int(row), col);
    world.reduce_scatter(full.data(), plain.data(), rows * cols);
    std::vector<int> order;
    bool then_ran = false;
    pipelined_reduce_scatter_overlapped(
        world, pipelined.data(), packed.data(), received.data(), rows, cols, splits,
        [&](int k, size_t c0, size_t c1, float* part, const Poll<Communicator>& poll) {
            order.push_back(k);
            EXPECT_EQ(c1 - c0, k + 1 < splits ? 2u : 3u);
            for (size_t row = 0; row < t * rows; row++)
                std::copy(full.begin() + row * cols + c0, full.begin() + row * cols + c1, part + row * (c1 - c0));
            poll();
        },
        [&](const Poll<Communicator>& poll) {
            EXPECT_EQ(int(order.size()), splits) << "then() ran before every part was produced";
            then_ran = true;
            poll();
        });
    EXPECT_EQ(pipelined, plain);
    EXPECT_EQ(order, (std::vector<int>{0, 1, 2}));
    EXPECT_TRUE(then_ran);
}

// Context parallelism's layout: the load-balanced chunks of design.md's drawing.
TEST(ContextParallel, EachRankHoldsChunkRAndChunkTwoCpMinusOneMinusR) {
    const auto positions = [](int cp, int rank, int s) {
        std::vector<int> p;
        const ContextParallelism layout{cp, rank};
        for (int i = 0; i < layout.local_seq(s); i++) p.push_back(layout.global_position(i, s));
        return p;
    };
    EXPECT_EQ(positions(2, 0, 8), (std::vector<int>{0, 1, 6, 7}));
    EXPECT_EQ(positions(2, 1, 8), (std::vector<int>{2, 3, 4, 5}));
    EXPECT_EQ(positions(4, 1, 16), (std::vector<int>{2, 3, 12, 13}));
    EXPECT_EQ(positions(1, 0, 4), (std::vector<int>{0, 1, 2, 3}));
    // an SP shard of a rank's positions as runs of global ones: s = 24, cp = 2, rank 1 holds 6..11 and 12..17
    const ContextParallelism rank1{2, 1};
    const auto runs = [&](int first, int count) {
        std::vector<std::vector<int>> out;
        const ContextParallelism::PositionRuns r = rank1.runs(first, count, 24);
        for (int i = 0; i < r.count; i++) out.push_back({r.run[i].offset, r.run[i].count, r.run[i].global_start});
        return out;
    };
    EXPECT_EQ(runs(0, 12), (std::vector<std::vector<int>>{{0, 6, 6}, {6, 6, 12}}));  // both chunks
    EXPECT_EQ(runs(4, 4), (std::vector<std::vector<int>>{{0, 2, 10}, {2, 2, 12}}));  // across the boundary
    EXPECT_EQ(runs(6, 3), (std::vector<std::vector<int>>{{0, 3, 12}}));              // inside the second chunk
    EXPECT_EQ(runs(1, 4), (std::vector<std::vector<int>>{{0, 4, 7}}));               // inside the first
    EXPECT_EQ(ContextParallelism{}.runs(3, 5, 16).run[0].global_start, 3);           // cp = 1: one run, as given
    // every position is some rank's, once
    std::vector<int> seen(64, 0);
    for (int rank = 0; rank < 4; rank++)
        for (int p : positions(4, rank, 64)) seen[size_t(p)]++;
    EXPECT_EQ(seen, std::vector<int>(64, 1));
}

// sp2hp and hp2sp against a gather-then-slice reference: every rank knows the
// whole [s, b, sections·heads·hs] tensor X; its local side is X's rows at its
// positions, and sp2hp must give X's every row (in global order) with only
// this rank's heads of each section; hp2sp must give the local side back.
// Each element encodes its position, sequence and column, so a wrong chunk,
// row or head is a wrong value.
void check_context_parallel_mappings(int cp, int sections) {
    SCOPED_TRACE("cp=" + std::to_string(cp) + " sections=" + std::to_string(sections));
    int world_rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    MPI_Comm comm;
    MPI_Comm_split(MPI_COMM_WORLD, world_rank / cp, world_rank % cp, &comm);
    Communicator group(comm);
    const int s = 4 * cp, b = 3, heads = 2 * cp, hs = 5, width = sections * heads * hs;
    const ContextParallelism layout{cp, group.rank()};
    auto x = [&](int position, int sequence, int column) { return float(position * 10000 + sequence * 1000 + column); };
    std::vector<float> local(size_t(layout.local_seq(s)) * b * width);
    for (int i = 0; i < layout.local_seq(s); i++)
        for (int seq = 0; seq < b; seq++)
            for (int col = 0; col < width; col++)
                local[(size_t(i) * b + seq) * width + col] = x(layout.global_position(i, s), seq, col);

    ContextParallelMappings<Communicator> mappings(&group, sections, heads, hs, s, b);
    ASSERT_EQ(mappings.count(), local.size());
    std::vector<float> full(local.size()), send(local.size()), receive(local.size()), back(local.size());
    mappings.sequence_to_heads(local.data(), full.data(), send.data(), receive.data());
    const int my_heads = heads / cp, full_width = sections * my_heads * hs;
    int wrong = 0;
    for (int position = 0; position < s; position++)
        for (int seq = 0; seq < b; seq++)
            for (int section = 0; section < sections; section++)
                for (int j = 0; j < my_heads * hs; j++) {
                    const int column = section * heads * hs + group.rank() * my_heads * hs + j;
                    wrong += full[(size_t(position) * b + seq) * full_width + section * my_heads * hs + j] !=
                             x(position, seq, column);
                }
    EXPECT_EQ(wrong, 0) << "elements of sp2hp's output that are not X's";
    mappings.heads_to_sequence(full.data(), back.data(), send.data(), receive.data());
    EXPECT_EQ(back, local) << "hp2sp did not undo sp2hp";
    // the full tensor, once each way; a group of one moves nothing
    EXPECT_EQ(group.bytes.all_to_all, cp == 1 ? 0 : int64_t(2 * local.size() * 4));
    MPI_Comm_free(&comm);
}

TEST(ContextParallel, Sp2hpIsTheWholeSequenceSlicedByHeadsAndHp2spItsInverse) {
    for (int cp : {1, 2, 4})
        for (int sections : {1, 3}) check_context_parallel_mappings(cp, sections);
}

// The model under context parallelism against the model of one rank: the
// world's 4 ranks as groups of t·cp (t innermost, then cp), every rank given
// the same whole batch, of which each CP rank reads its positions. The loss
// (the mean over every position), every gradient (summed over the CP group,
// the TP shards gathered), the dropout masks (each rank's slice of the
// one-rank masks, by global position and head), at dropout 0.1; and the
// arena, the paper's formula divided by cp. `ring`: ring attention
// (cp_comm_type p2p) instead of the all-to-alls; `heads`: the model's.
void compare_context_parallel_with_one_rank(int cp, int t, bool sequence_parallel, const RunShape& shape = ::shape,
                                            bool ring = false, int model_heads = 4) {
    SCOPED_TRACE("cp=" + std::to_string(cp) + " t=" + std::to_string(t) + (sequence_parallel ? " SP " : " TP only ") +
                 recompute_description(shape) + (ring ? " ring" : " a2a") + " heads=" + std::to_string(model_heads));
    int world_rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    const int tp_rank = world_rank % t, cp_rank = world_rank / t % cp, replica = world_rank / (t * cp);
    MPI_Comm tp_comm, cp_comm;
    MPI_Comm_split(MPI_COMM_WORLD, world_rank / t, tp_rank, &tp_comm);
    MPI_Comm_split(MPI_COMM_WORLD, replica * t + tp_rank, cp_rank, &cp_comm);
    Communicator tp_group(tp_comm), cp_group(cp_comm);
    GPTConfig config = tiny_config();
    config.num_heads = model_heads;
    config.channels = 8 * model_heads;  // head size 8
    const int B = shape.batch, S = shape.seq_len, C = config.channels, N = B * S;
    const std::vector<int> tokens = tpsp::testing::random_tokens(N, config.vocab_size, 31);
    const DropoutStep draw{5, 2, 0};

    RunShape whole = shape;  // the reference keeps everything
    whole.recompute = Recompute::none;
    GPT one(config, whole);
    one.init_random(11);
    one.zero_grad();
    const float one_loss = one.forward(tokens.data(), tokens.data() + 1, draw);
    one.backward(1.0f / N);
    one.finish_grads();

    const ContextParallelism layout{cp, cp_rank};
    RunShape rank_shape = shape;
    rank_shape.seq_len = layout.local_seq(S);
    GPT split(config, rank_shape, {t, tp_rank, sequence_parallel, {}}, &tp_group, &cp_group, ring);
    split.init_random(11);
    split.zero_grad();
    const float split_loss = split.forward(tokens.data(), tokens.data() + 1, draw);  // it reads its positions
    split.backward(1.0f / N);
    split.finish_grads();
    cp_group.all_reduce_sum(split.grads.wte, size_t(split.num_parameters));
    EXPECT_NEAR(split_loss, one_loss, 1e-6 * one_loss);

    expect_gathered_gradients(tp_group, split, one, 1e-5);  // summed over cp above

    // the masks: attention by (sequence, head), the others by global position
    const int heads = config.num_heads / (ring ? t : t * cp);
    const int first_head = (ring ? tp_rank : tp_rank * cp + cp_rank) * heads;
    const int rows = sequence_parallel ? rank_shape.seq_len / t : rank_shape.seq_len;
    const int first = sequence_parallel ? tp_rank * rows : 0;
    const int chunk = layout.chunk_len(S);
    int wrong = 0;
    for (int l = 0; l < config.num_layers; l++) {
        for (int b = 0; b < B; b++) {
            if (!ring) {
                wrong += std::memcmp(
                             split.blocks[l].attn_dropout_mask + size_t(b) * heads * S * S,
                             one.blocks[l].attn_dropout_mask + (size_t(b) * config.num_heads + first_head) * S * S,
                             size_t(heads) * S * S) != 0;
                continue;
            }
            // ring attention's rows [b, 2, a/t, chunk, S]: this rank's two chunks of queries
            // (none kept under selective recomputation, which keeps each row's log-sum-exp)
            if (!split.blocks[l].attn_dropout_mask) continue;
            for (int half = 0; half < 2; half++)
                for (int h = 0; h < heads; h++)
                    for (int i = 0; i < chunk; i++) {
                        const size_t row = ((size_t(b) * 2 + half) * heads + h) * chunk + i;
                        const int query = layout.chunk_of(cp_rank, half) * chunk + i;
                        const size_t one_row = (size_t(b) * config.num_heads + first_head + h) * S + query;
                        wrong += std::memcmp(split.blocks[l].attn_dropout_mask + row * S,
                                             one.blocks[l].attn_dropout_mask + one_row * S, S) != 0;
                    }
        }
        for (int i = 0; i < rows; i++) {
            const size_t global = size_t(layout.global_position(first + i, S)) * B * C;
            wrong += std::memcmp(split.blocks[l].fc2_dropout_mask + size_t(i) * B * C,
                                 one.blocks[l].fc2_dropout_mask + global, size_t(B) * C) != 0;
            wrong += std::memcmp(split.blocks[l].proj_dropout_mask + size_t(i) * B * C,
                                 one.blocks[l].proj_dropout_mask + global, size_t(B) * C) != 0;
            if (l == 0)
                wrong += std::memcmp(split.outside.embedding_dropout_mask + size_t(i) * B * C,
                                     one.outside.embedding_dropout_mask + global, size_t(B) * C) != 0;
        }
    }
    // (recomputation leaves the blocks' masks in the workspace, overwritten block by block)
    if (shape.recompute == Recompute::none) {
        EXPECT_EQ(wrong, 0) << "masks that are not the one-rank masks at the same heads and positions";
    }

    // the arena: the paper's per-rank block formula divided by cp, and the tables outside the blocks
    const int64_t formula = block_activation_formula_bytes(B, S, C, config.num_heads, 4, t, sequence_parallel);
    ASSERT_EQ(formula % cp, 0);
    const TensorParallelism tp{t, tp_rank, sequence_parallel, {}};
    const std::vector<TensorSpec> outside = outside_activation_table(config, rank_shape, tp, &split.outside);
    if (shape.recompute == Recompute::none) {
        EXPECT_EQ(int64_t(split.activation_arena.bytes()),
                  config.num_layers * (formula / cp) + int64_t(table_bytes(outside)));
    }
    if (ring && shape.recompute == Recompute::selective) {  // each row's log-sum-exp, as cuDNN's kernel keeps
        const int64_t rows_formula = block_activation_formula_bytes(B, S, C, config.num_heads, 4, t, sequence_parallel,
                                                                    AttentionKernel::cudnn_fused, Recompute::selective);
        EXPECT_EQ(int64_t(split.activation_arena.bytes()),
                  config.num_layers * (rows_formula / cp) + int64_t(table_bytes(outside)));
    }
    MPI_Comm_free(&tp_comm);
    MPI_Comm_free(&cp_comm);
}

// Ring attention (cp_comm_type p2p): the same comparisons; with a = 6 heads,
// which a2a cannot cut 4 ways, at cp = 4.
TEST(ContextParallel, RingAttentionOnCpRanksEqualsOneRank) {
    const bool ring = true;
    compare_context_parallel_with_one_rank(2, 1, true, ::shape, ring);
    compare_context_parallel_with_one_rank(4, 1, true, ::shape, ring);
    compare_context_parallel_with_one_rank(2, 2, true, ::shape, ring);
    compare_context_parallel_with_one_rank(2, 2, false, ::shape, ring);
    compare_context_parallel_with_one_rank(4, 1, true, ::shape, ring, 6);
    compare_context_parallel_with_one_rank(2, 2, true, ::shape, ring, 6);
    // selective recomputation runs the ring again in backward; full recomputes the whole block
    for (const RunShape& recompute : {RunShape{3, 16, 0.1f, Recompute::selective},
                                      RunShape{3, 16, 0.1f, Recompute::full, RecomputeMethod::uniform, 1}}) {
        compare_context_parallel_with_one_rank(2, 1, true, recompute, ring);
        compare_context_parallel_with_one_rank(2, 2, true, recompute, ring);
    }
}

TEST(ContextParallel, TheModelOnCpRanksEqualsOneRank) {
    compare_context_parallel_with_one_rank(2, 1, true);
    compare_context_parallel_with_one_rank(4, 1, true);
    compare_context_parallel_with_one_rank(2, 2, true);
    compare_context_parallel_with_one_rank(2, 2, false);
    // recomputation repeats the all-to-alls (full) or rebuilds S' and S over every position (selective)
    for (const RunShape& recompute : {RunShape{3, 16, 0.1f, Recompute::selective},
                                      RunShape{3, 16, 0.1f, Recompute::full, RecomputeMethod::uniform, 1},
                                      RunShape{3, 16, 0.1f, Recompute::full, RecomputeMethod::block, 2}}) {
        compare_context_parallel_with_one_rank(2, 1, true, recompute);
        compare_context_parallel_with_one_rank(2, 2, true, recompute);
    }
}

// The process grid: world rank = (dp_rank · cp + cp_rank) · tp + tp_rank, and
// each group holds the ranks that share every other index.
TEST(ContextParallel, TheGridPutsTpInnermostThenCpThenDp) {
    int world_rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    for (auto [tp, cp] : {std::pair{1, 2}, std::pair{2, 2}, std::pair{1, 4}, std::pair{2, 1}}) {
        SCOPED_TRACE("tp=" + std::to_string(tp) + " cp=" + std::to_string(cp));
        ProcessGrid g = make_process_grid(tp, cp);
        EXPECT_EQ(g.dp, 4 / (tp * cp));
        EXPECT_EQ(world_rank, (g.dp_rank * cp + g.cp_rank) * tp + g.tp_rank);
        EXPECT_EQ(g.replicas, g.dp * cp);
        EXPECT_EQ(g.replica_rank, g.dp_rank * cp + g.cp_rank);
        // each group's ranks: every rank offers its world rank, the group gathers them
        auto members = [&](Communicator& group) {
            std::vector<float> all(size_t(group.size()));
            const float me = float(world_rank);
            group.gather(&me, all.data(), 1, 0);
            int count = group.size();
            MPI_Bcast(all.data(), count, MPI_FLOAT, 0, *group.mpi());
            return all;
        };
        std::vector<float> expected;
        for (int r = 0; r < tp; r++) expected.push_back(float((g.dp_rank * cp + g.cp_rank) * tp + r));
        EXPECT_EQ(members(g.tp_group), expected) << "TP group";
        expected.clear();
        for (int r = 0; r < cp; r++) expected.push_back(float((g.dp_rank * cp + r) * tp + g.tp_rank));
        EXPECT_EQ(members(g.cp_group), expected) << "CP group";
        expected.clear();
        for (int r = 0; r < g.dp; r++) expected.push_back(float((r * cp + g.cp_rank) * tp + g.tp_rank));
        EXPECT_EQ(members(g.dp_group), expected) << "DP group";
        expected.clear();
        for (int r = 0; r < g.replicas; r++) expected.push_back(float(r * tp + g.tp_rank));
        EXPECT_EQ(members(g.replica_group), expected) << "replica group, in replica rank order";
    }
}

// A pipeline's channels on groups of two of their own (the GPU's layout,
// pipeline_channels_in_pairs), here over MPI: at p = 4 (the world) and p = 2
// (two pipelines, ranks {0, 2} and {1, 3}), each stage's forward channel
// brings the previous stage's message (the last stage's to the first) and its
// backward channel the next stage's (the first stage's to the last): the wrap
// link's two directions are also the tied wte's exchange.
TEST(PipelineChannels, InPairsEachStageHearsItsNeighbours) {
    int world_rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    for (int p : {4, 2}) {
        SCOPED_TRACE("p=" + std::to_string(p));
        MPI_Comm stages;
        MPI_Comm_split(MPI_COMM_WORLD, world_rank % (4 / p), world_rank, &stages);
        int stage;
        MPI_Comm_rank(stages, &stage);
        PipelineChannels<Communicator> channels = pipeline_channels_in_pairs<Communicator>(
            stages, [](MPI_Comm pair) { return std::make_unique<Communicator>(pair); });
        ASSERT_EQ(channels.groups().size(), 4u);
        const int next = (stage + 1) % p, previous = (stage + p - 1) % p;
        const float forward = float(stage * 10 + 1), backward = float(stage * 10 + 2);
        float from_previous = -1.0f, from_next = -1.0f;
        using Transfer = Communicator::Transfer;
        const auto receive = [](const PipelineChannel<Communicator>& c, float* into) {
            return c.group->start_receive(into, 1, c.peer, c.tag, "test");
        };
        const auto send = [](const PipelineChannel<Communicator>& c, const float* what) {
            return c.group->start_send(what, 1, c.peer, c.tag);
        };
        Transfer from_previous_t = receive(channels.forward_in, &from_previous);
        Transfer from_next_t = receive(channels.backward_in, &from_next);
        Transfer forward_t = send(channels.forward_out, &forward);
        Transfer backward_t = send(channels.backward_out, &backward);
        channels.forward_in.group->wait(from_previous_t);
        channels.backward_in.group->wait(from_next_t);
        channels.forward_out.group->wait(forward_t);
        channels.backward_out.group->wait(backward_t);
        EXPECT_EQ(from_previous, float(previous * 10 + 1)) << "stage " << stage << ": forward from the previous";
        EXPECT_EQ(from_next, float(next * 10 + 2)) << "stage " << stage << ": backward from the next";
    }
}

// Data parallelism through the trainer's own DataParallelStep
// (train/data_parallel.h, tests/data_parallel_training.h): the 4 ranks as
// dp = 2 × t = 2 over MPI, and the same grid as 4 threads of rank 0 (the
// stand-in, thread_group.h), train 3 steps of 2 micro-batches, dropout 0.1:
// every loss, norm and parameter the same bits, in plain DP and with the
// distributed optimizer and both overlap switches. The one-GPU stand-in runs
// this very step (test_cuda_tensor_parallel.cpp).
TEST(DataParallel, TheThreadStandInGivesTheMpiGridsBits) {
    using tpsp::testing::DataParallelRun;
    tpsp::testing::DataParallelTraining run{tiny_config(), shape, 3, 2, {}};
    run.tokens = tpsp::testing::data_parallel_tokens(run, 2, 5);
    const DataParallelSettings plain{500, false, false, false}, everything{500, true, true, true};
    for (const DataParallelSettings& settings : {plain, everything}) {
        SCOPED_TRACE(settings.distributed_optimizer ? "distributed optimizer, both overlaps" : "plain DP");
        ProcessGrid grid = make_process_grid(2);
        MPI_Comm gathers_comm;
        MPI_Comm_dup(*grid.replica_group.mpi(), &gathers_comm);
        Communicator gathers(gathers_comm);
        const DataParallelRun mpi = tpsp::testing::train_data_parallel_rank<CpuBackend>(
            run, {2, grid.tp_rank, true, {}}, &grid.tp_group, grid.tp_group, grid.replica_group, gathers, settings);
        const size_t n = mpi.params.size(), steps = size_t(run.steps);
        std::vector<float> all_params(4 * n), all_losses(4 * steps), all_norms(4 * steps);
        MPI_Gather(mpi.params.data(), int(n), MPI_FLOAT, all_params.data(), int(n), MPI_FLOAT, 0, MPI_COMM_WORLD);
        MPI_Gather(mpi.losses.data(), int(steps), MPI_FLOAT, all_losses.data(), int(steps), MPI_FLOAT, 0,
                   MPI_COMM_WORLD);
        MPI_Gather(mpi.norms.data(), int(steps), MPI_FLOAT, all_norms.data(), int(steps), MPI_FLOAT, 0, MPI_COMM_WORLD);
        if (grid.world_rank == 0) {
            // rank r = dp_rank · 2 + tp_rank: a TP group per DP rank, a DP group (and its twin for the gathers) per TP
            // rank
            ThreadGroup tp_threads[2] = {ThreadGroup(2), ThreadGroup(2)};
            ThreadGroup dp_threads[2] = {ThreadGroup(2), ThreadGroup(2)};
            ThreadGroup gather_threads[2] = {ThreadGroup(2), ThreadGroup(2)};
            std::vector<DataParallelRun> stand_in(4);
            std::vector<std::thread> ranks;
            for (int r = 0; r < 4; r++)
                ranks.emplace_back([&, r] {
                    const int tp_rank = r % 2, dp_rank = r / 2;
                    ThreadCommunicator tp(&tp_threads[dp_rank], tp_rank), replicas(&dp_threads[tp_rank], dp_rank),
                        twin(&gather_threads[tp_rank], dp_rank);
                    stand_in[size_t(r)] = tpsp::testing::train_data_parallel_rank<CpuThreadGroupBackend>(
                        run, {2, tp_rank, true, {}}, &tp, tp, replicas, twin, settings);
                });
            for (std::thread& rank : ranks) rank.join();
            for (size_t r = 0; r < 4; r++) {
                SCOPED_TRACE("rank " + std::to_string(r));
                for (size_t k = 0; k < steps; k++) {
                    EXPECT_EQ(stand_in[r].losses[k], all_losses[r * steps + k]) << "step " << k + 1;
                    EXPECT_EQ(stand_in[r].norms[k], all_norms[r * steps + k]) << "step " << k + 1;
                }
                EXPECT_EQ(0, std::memcmp(stand_in[r].params.data(), all_params.data() + r * n, n * 4))
                    << "the parameters differ after the last step";
            }
        }
        MPI_Comm_free(&gathers_comm);
        MPI_Barrier(MPI_COMM_WORLD);
    }
}

int main(int argc, char** argv) {
    MPI_Init(&argc, &argv);
    ::testing::InitGoogleTest(&argc, argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size != 4) {
        if (rank == 0) std::fprintf(stderr, "run under mpirun -np 4\n");
        MPI_Finalize();
        return 1;
    }
    int failed = RUN_ALL_TESTS();
    MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    MPI_Finalize();
    return failed;
}
