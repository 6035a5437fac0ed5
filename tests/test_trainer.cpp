// End to end: `tpsp train` on the real corpus (the Bible shards the ctest
// fixture prepares), resume bit for bit, reload, and every kind of bad input
// ending in one clear line and no file left behind.
#include <gtest/gtest.h>

#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "common/checksum.h"
#include "data/token_shards.h"
#include "model/checkpoint.h"
#include "parallel/process_grid.h"
#include "tests/e2e_support.h"
#include "train/adamw.h"
#include "train/run_checkpoint.h"

namespace fs = std::filesystem;
using namespace tpsp::e2e;

// Bad input: a non-zero exit, one line on stderr that says what is wrong,
// and nothing written.
namespace {

void expect_clean_failure(const fs::path& dir, const std::string& extra, const std::string& says,
                          const std::string& config = tiny) {
    std::string command = tiny_train(dir, extra);
    command.replace(command.find(tiny), tiny.size(), config);
    Outcome r = run(command, dir);
    EXPECT_NE(r.exit_code, 0);
    EXPECT_EQ(count_lines(r.err), 1) << r.err;
    EXPECT_NE(r.err.find(says), std::string::npos) << "stderr: " << r.err << "expected: " << says;
    EXPECT_FALSE(fs::exists(dir / "ckpt")) << "a checkpoint directory was left behind";
    EXPECT_FALSE(fs::exists(dir / "metrics.jsonl")) << "a metrics file was left behind";
}

}  // namespace

TEST(Trainer, LossFallsOnTheBible) {
    fs::path dir = scratch_dir();
    Outcome r = run(tiny_train(dir, "train.steps=80 train.warmup_steps=10 train.val_every=80"), dir);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    std::vector<std::string> losses = field(dir / "metrics.jsonl", "loss");
    ASSERT_EQ(losses.size(), 80u);
    double first = std::stod(losses.front()), last = std::stod(losses.back());
    EXPECT_GT(first, 5.0) << "a fresh byte model starts near ln 256 = 5.55";
    EXPECT_LT(last, first - 2.5) << "80 steps must take at least 2.5 nats off";
    ASSERT_EQ(field(dir / "metrics.jsonl", "val_loss").size(), 1u);
    EXPECT_LT(std::stod(field(dir / "metrics.jsonl", "val_loss")[0]), 3.0);
}

TEST(Trainer, SamplesOfATrainedModelAreTextOfTheCorpusAlphabet) {
    fs::path dir = scratch_dir();
    Outcome r = run(tiny_train(dir, "train.steps=150 train.warmup_steps=30 train.val_every=0 logging.sample_every=150"),
                    dir);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("sample at step 150: "), std::string::npos) << "the trainer prints its sample";
    Outcome sample = run(tpsp_binary + " sample " + (dir / "ckpt" / "model_00000150.bin").string() +
                             " --prompt 'And God said' --tokens 100 --temperature 0.8 --seed 7",
                         dir);
    ASSERT_EQ(sample.exit_code, 0) << sample.err;
    std::string corpus_text = read_text(fs::path(corpus) / "kjv.txt");
    bool in_corpus[256] = {};
    for (unsigned char c : corpus_text) in_corpus[c] = true;
    ASSERT_GE(sample.out.size(), 112u);
    EXPECT_EQ(sample.out.rfind("And God said", 0), 0u);
    int letters = 0;
    for (unsigned char c : sample.out) {
        EXPECT_TRUE(in_corpus[c] || c == '\n') << "byte " << int(c) << " is not in the corpus";
        letters += std::isalpha(c) != 0;
    }
    EXPECT_GT(letters, 60) << sample.out;
}

TEST(Trainer, PreparesGpt2TokenShards) {
    const std::string tokenizer_dir = std::string(TPSP_BINARY_DIR) + "/gpt2_tokenizer";
    if (!fs::exists(tokenizer_dir + "/encoder.json")) GTEST_SKIP() << "GPT-2 tokenizer files not fetched";
    fs::path dir = scratch_dir();
    Outcome r = run(tpsp_binary + " prepare --tokenizer gpt2 --tokenizer-dir " + tokenizer_dir + " " + corpus +
                        "/kjv.txt " + (dir / "shards").string() + " --shard-tokens 400000",
                    dir);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("(vocabulary 50257)"), std::string::npos) << r.out;
    EXPECT_NE(r.err.find("MB/s"), std::string::npos) << "a progress bar with MB/s";
    EXPECT_TRUE(fs::exists(dir / "shards" / "train_000001.bin")) << "shards of --shard-tokens";
    EXPECT_TRUE(fs::exists(dir / "shards" / "val_000000.bin"));
    EXPECT_TRUE(fs::exists(dir / "shards" / "gpt2_tokenizer.bin"));
    tpsp::TokenLoader loader((dir / "shards" / "train_*.bin").string(), 4, 64, 0, 1, 50257);
    std::vector<int> inputs(256), targets(256);
    loader.next_batch(inputs.data(), targets.data());
    EXPECT_EQ(inputs[0], 50256) << "the document starts with <|endoftext|>";
    fs::path bad = write_file(dir / "bad.txt", "fine \xff\xfe not\n");
    r = run(tpsp_binary + " prepare --tokenizer gpt2 --tokenizer-dir " + tokenizer_dir + " " + bad.string() + " " +
                (dir / "bad").string(),
            dir);
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.err.find("bad.txt: invalid UTF-8 at byte offset 5"), std::string::npos) << r.err;
}

TEST(Trainer, ResumeReproducesTheUninterruptedRunBitForBit) {
    fs::path dir = scratch_dir();
    const std::string schedule = "train.steps=30 train.warmup_steps=5 checkpoint.every=15 model.dropout=0.1";
    ASSERT_EQ(run(tiny_train(dir, schedule), dir).exit_code, 0);
    // a second run stops after step 15: its directory says so
    fs::path cut = dir / "cut";
    fs::create_directories(cut);
    fs::copy(dir / "ckpt", cut / "ckpt");
    std::ofstream(cut / "ckpt" / "latest") << "15\n";
    fs::remove(cut / "ckpt" / "model_00000030.bin");
    fs::remove(cut / "ckpt" / "state_00000030.bin");
    Outcome resumed = run(tiny_train(cut, schedule + " checkpoint.resume=" + (cut / "ckpt").string()), cut);
    ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
    EXPECT_NE(resumed.out.find("resumed"), std::string::npos);

    std::vector<std::string> whole = field(dir / "metrics.jsonl", "loss");
    std::vector<std::string> tail = field(cut / "metrics.jsonl", "loss");
    ASSERT_EQ(whole.size(), 30u);
    ASSERT_EQ(tail.size(), 15u);
    for (int i = 0; i < 15; i++) EXPECT_EQ(tail[i], whole[15 + i]) << "step " << 16 + i;
    EXPECT_EQ(read_text(cut / "ckpt" / "model_00000030.bin"), read_text(dir / "ckpt" / "model_00000030.bin"))
        << "the final weights differ";
}

// The validation loss an `eval` printed ("val loss X over ..."), as the float it was.
float printed_val_loss(const std::string& out) {
    std::smatch m;
    if (!std::regex_search(out, m, std::regex("val loss ([-0-9.e+]+) over"))) return NAN;
    return float(std::stod(m[1]));
}

TEST(Trainer, ACheckpointReloadsToTheSameLoss) {
    fs::path dir = scratch_dir();
    ASSERT_EQ(run(tiny_train(dir, "train.steps=20 train.warmup_steps=5 train.val_every=20"), dir).exit_code, 0);
    std::vector<std::string> val = field(dir / "metrics.jsonl", "val_loss");
    ASSERT_EQ(val.size(), 1u);
    const float logged = float(std::stod(val[0]));  // the same float, bit for bit
    Outcome eval = run(
        tpsp_binary + " eval " + tiny + " data.val='" + corpus +
            "/val_*.bin' train.threads=2 checkpoint.init=" + (dir / "ckpt" / "model_00000020.bin").string(),
        dir);
    ASSERT_EQ(eval.exit_code, 0) << eval.err;
    EXPECT_EQ(printed_val_loss(eval.out), logged) << eval.out << " vs " << val[0];
    // the config of a run on cuDNN's attention evaluates (on the CPU, with the explicit kernels) to the same
    Outcome cudnn_config = run(tpsp_binary + " eval " + tiny + " data.val='" + corpus +
                                   "/val_*.bin' train.threads=2 train.device=cuda model.attention=cudnn" +
                                   " checkpoint.init=" + (dir / "ckpt" / "model_00000020.bin").string(),
                               dir);
    ASSERT_EQ(cudnn_config.exit_code, 0) << cudnn_config.err;
    EXPECT_EQ(printed_val_loss(cudnn_config.out), logged) << cudnn_config.out;
}

// The save's own guard against non-finite numbers stands behind the step's
// (which never applies a non-finite step), so no run reaches it: here a save
// is made in-process, on one rank, after a weight or a moment is set to NaN.
TEST(Trainer, ASaveOfANonFiniteWeightOrMomentWritesNoFileAndLeavesLatest) {
    static const bool mpi = [] {  // a singleton (ctest runs each test in a process of its own)
        MPI_Init(nullptr, nullptr);
        std::atexit([] { MPI_Finalize(); });
        return true;
    }();
    ASSERT_TRUE(mpi);
    const fs::path dir = scratch_dir() / "ckpt";
    fs::create_directories(dir);
    tpsp::GPTConfig c;
    c.max_seq_len = 8, c.vocab_size = 16, c.padded_vocab_size = 16, c.num_layers = 1, c.num_heads = 2, c.channels = 8;
    tpsp::ProcessGrid grid = tpsp::make_process_grid(1);
    tpsp::GPT model(c, tpsp::RunShape{1, 8, 0.0f});
    model.init_random(1);
    tpsp::AdamWOptimizer<tpsp::CpuBackend> optimizer(model, {});
    tpsp::ShardGatherer<tpsp::CpuBackend> gatherer(model, grid);
    tpsp::Communicator dp_group;                                                      // a group of one
    tpsp::save_run(dir.string(), model, optimizer, grid, gatherer, 1, {}, dp_group);  // a good step 1
    auto every_file = [&] {                                                           // name -> CRC-32C of its bytes
        std::map<std::string, uint32_t> files;
        for (const fs::directory_entry& entry : fs::directory_iterator(dir)) {
            const std::string bytes = read_text(entry.path());
            files[entry.path().filename().string()] = tpsp::crc32c(bytes.data(), bytes.size());
        }
        return files;
    };
    const std::map<std::string, uint32_t> saved = every_file();
    ASSERT_EQ(saved.size(), 3u) << "latest, model_00000001.bin, state_00000001.bin";

    auto expect_refused = [&](const std::string& says) {
        try {
            tpsp::save_run(dir.string(), model, optimizer, grid, gatherer, 2, {}, dp_group);
            ADD_FAILURE() << "step 2 was saved";
        } catch (const tpsp::FileError& e) {
            EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
        }
        EXPECT_EQ(every_file(), saved) << "a file was written, changed or left behind (latest, a temporary)";
    };
    model.params.wte[3] = NAN;
    expect_refused("model_00000002.bin: not written: tensor wte of the weights holds nan at element 3");
    model.params.wte[3] = 0.0f;
    optimizer.v[tpsp::full_parameter_count(c) - 1] = INFINITY;  // the last element of lnfb
    expect_refused("state_00000002.bin: not written: tensor lnfb of AdamW's v holds inf at element 7");
}

TEST(Trainer, GradientAccumulationEqualsTheLargerBatch) {
    // two micro-batches of 8 read the same tokens as one batch of 16, and
    // draw the same dropout masks (the batch coordinate is global)
    fs::path one = scratch_dir() / "one", two = one.parent_path() / "two";
    fs::create_directories(one);
    fs::create_directories(two);
    const std::string common = "train.steps=4 train.warmup_steps=1 train.val_every=0 model.dropout=0.1 ";
    ASSERT_EQ(run(tiny_train(one, common + "train.batch_size=16"), one).exit_code, 0);
    ASSERT_EQ(run(tiny_train(two, common + "train.batch_size=8 train.grad_accum=2"), two).exit_code, 0);
    std::vector<std::string> a = field(one / "metrics.jsonl", "loss"), b = field(two / "metrics.jsonl", "loss");
    ASSERT_EQ(a.size(), 4u);
    ASSERT_EQ(b.size(), 4u);
    for (int i = 0; i < 4; i++)
        EXPECT_NEAR(std::stod(b[i]), std::stod(a[i]), 1e-5 * std::stod(a[i])) << "step " << i + 1;
}

TEST(Trainer, RecomputationTrainsTheSameLossesBitForBit) {
    // model.recompute: selective and full keep less and compute it again: the same numbers
    fs::path kept = scratch_dir() / "kept";
    fs::create_directories(kept);
    const std::string common = "train.steps=5 train.warmup_steps=1 train.val_every=5 model.dropout=0.1 ";
    ASSERT_EQ(run(tiny_train(kept, common), kept).exit_code, 0);
    const std::pair<std::string, std::string> modes[] = {{"selective", "model.recompute=selective"},
                                                         {"full", "model.recompute=full model.recompute_layers=2"}};
    for (const auto& [name, mode] : modes) {
        SCOPED_TRACE(mode);
        fs::path recomputed = kept.parent_path() / name;
        fs::create_directories(recomputed);
        Outcome r = run(tiny_train(recomputed, common + mode), recomputed);
        ASSERT_EQ(r.exit_code, 0) << r.err;
        EXPECT_EQ(field(recomputed / "metrics.jsonl", "loss"), field(kept / "metrics.jsonl", "loss"));
        EXPECT_EQ(field(recomputed / "metrics.jsonl", "val_loss"), field(kept / "metrics.jsonl", "val_loss"));
        EXPECT_EQ(field(recomputed / "metrics.jsonl", "loss").size(), 5u);
    }
}

// mpirun is there, and tpsp was built with MPI (not on the single-process stand-in)
static bool have_mpirun() { return TPSP_BUILT_WITH_MPI && std::system("command -v mpirun > /dev/null 2>&1") == 0; }

TEST(Trainer, RunsUnderMpirunOnOneRank) {
    if (!have_mpirun()) GTEST_SKIP() << "mpirun not installed, or tpsp built without MPI";
    fs::path dir = scratch_dir();
    std::string mpirun = "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_pml=ob1 mpirun -np 1 ";
    Outcome r = run(mpirun + tiny_train(dir, "train.steps=3 train.val_every=0"), dir);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(field(dir / "metrics.jsonl", "loss").size(), 3u);
}

// ----------------------------------------------------------------------------
// tensor parallelism end to end, under mpirun

namespace {

const std::string mpi_env = "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_pml=ob1 ";

std::string mpirun(int ranks) { return mpi_env + "mpirun --oversubscribe -np " + std::to_string(ranks) + " "; }

// A shortened tiny config: 20 steps of 8 sequences of 64 bytes, dropout 0.1.
const std::string short_run =
    "train.steps=20 train.warmup_steps=5 train.batch_size=8 train.seq_len=64 model.dropout=0.1 train.val_every=0 "
    "train.threads=1 ";

}  // namespace

TEST(TensorParallelTraining, LossesOfTwoAndFourRanksEqualOneRank) {
    if (!have_mpirun()) GTEST_SKIP() << "mpirun not installed";
    fs::path root = scratch_dir();
    auto losses = [&](int t, bool sp) {
        fs::path dir = root / "t";
        dir += std::to_string(t) + (sp ? "sp" : "tp");
        fs::create_directories(dir);
        std::string args = short_run + "parallel.tp=" + std::to_string(t) +
                           " parallel.sequence_parallel=" + (sp ? "true" : "false");
        Outcome r = run(mpirun(t) + tiny_train(dir, args), dir);
        EXPECT_EQ(r.exit_code, 0) << r.err;
        return field(dir / "metrics.jsonl", "loss");
    };
    std::vector<std::string> one = losses(1, true);
    ASSERT_EQ(one.size(), 20u);
    for (int t : {2, 4}) {
        for (bool sp : {true, false}) {
            SCOPED_TRACE("t=" + std::to_string(t) + (sp ? " TP+SP" : " TP only"));
            std::vector<std::string> split = losses(t, sp);
            ASSERT_EQ(split.size(), 20u);
            EXPECT_NEAR(std::stod(split[0]), std::stod(one[0]), 1e-6 * std::stod(one[0])) << "first step";
            for (int i = 0; i < 20; i++)
                EXPECT_NEAR(std::stod(split[i]), std::stod(one[i]), 1e-4 * std::stod(one[i])) << "step " << i + 1;
        }
    }
}

TEST(TensorParallelTraining, EveryOverlapSwitchLeavesTheLossesUnchanged) {
    if (!have_mpirun()) GTEST_SKIP() << "mpirun not installed";
    fs::path root = scratch_dir();
    const std::string only =
        "parallel.tp_comm_overlap=true parallel.tp_comm_overlap_ag=false "
        "parallel.tp_comm_overlap_rs=false parallel.tp_comm_bulk_dgrad=false "
        "parallel.tp_comm_bulk_wgrad=false ";
    const std::vector<std::pair<std::string, std::string>> switches = {
        {"ag", only + "parallel.tp_comm_overlap_ag=true"},
        {"rs_ring", only + "parallel.tp_comm_overlap_rs=true"},
        {"rs_pipeline", only + "parallel.tp_comm_overlap_rs=true parallel.tp_comm_rs_method=pipeline"},
        {"bulk_dgrad", only + "parallel.tp_comm_bulk_dgrad=true"},
        {"bulk_wgrad", only + "parallel.tp_comm_bulk_wgrad=true"},
        {"rs_dgrad", only + "parallel.tp_comm_overlap_rs_dgrad=true"},
        {"all", "parallel.tp_comm_overlap=true parallel.tp_comm_overlap_rs_dgrad=true"},
    };
    for (int t : {2, 4}) {
        auto losses = [&](const std::string& name, const std::string& flags) {
            fs::path dir = root / (name + std::to_string(t));
            fs::create_directories(dir);
            Outcome r = run(mpirun(t) + tiny_train(dir, short_run + "parallel.tp=" + std::to_string(t) + " " + flags),
                            dir);
            EXPECT_EQ(r.exit_code, 0) << r.err;
            return field(dir / "metrics.jsonl", "loss");
        };
        std::vector<std::string> off = losses("off", "");
        ASSERT_EQ(off.size(), 20u);
        for (const auto& [name, flags] : switches) {
            SCOPED_TRACE("t=" + std::to_string(t) + " " + name);
            std::vector<std::string> on = losses(name, flags);
            ASSERT_EQ(on.size(), 20u);
            EXPECT_NEAR(std::stod(on[0]), std::stod(off[0]), 1e-6 * std::stod(off[0])) << "first step";
            for (int i = 0; i < 20; i++)
                EXPECT_NEAR(std::stod(on[i]), std::stod(off[i]), 1e-5 * std::stod(off[i])) << "step " << i + 1;
        }
    }
}

TEST(TensorParallelTraining, OverlapWithoutSequenceParallelIsAClearError) {
    fs::path dir = scratch_dir();
    expect_clean_failure(dir, "parallel.tp_comm_overlap=true parallel.sequence_parallel=false",
                         "parallel.tp_comm_overlap: the overlap schedules need parallel.sequence_parallel: true");
}

TEST(TensorParallelTraining, CudnnAttentionOnTheCpuIsAClearError) {
    fs::path dir = scratch_dir();
    expect_clean_failure(dir, "model.attention=cudnn",
                         "model.attention: cudnn is cuDNN's fused attention on the GPU: it needs train.device: cuda");
}

TEST(TensorParallelTraining, TheTraceShowsComputeAndCommunicationOfEveryRank) {
    if (!have_mpirun()) GTEST_SKIP() << "mpirun not installed";
    fs::path dir = scratch_dir();
    fs::path trace = dir / "trace.json";
    Outcome r = run(mpirun(2) + tiny_train(dir, short_run +
                                                    "train.steps=3 parallel.tp=2 parallel.tp_comm_overlap=true "
                                                    "logging.trace=" +
                                                    trace.string() + " logging.trace_steps=2"),
                    dir);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    std::string json = read_text(trace);
    for (const char* needle : {"\"traceEvents\"", "\"pid\": 0, \"tid\": 0", "\"pid\": 1, \"tid\": 1", "ring all-gather",
                               "ring reduce-scatter", "bulk all-gather", "\"fc1 + gelu\"", "rank 1"})
        EXPECT_NE(json.find(needle), std::string::npos) << "the trace lacks " << needle;
    std::vector<std::string> exposed = field(dir / "metrics.jsonl", "exposed_comm_ms");
    std::vector<std::string> total = field(dir / "metrics.jsonl", "comm_ms");
    ASSERT_EQ(exposed.size(), 3u);
    EXPECT_GT(std::stod(total[2]), 0.0);
    EXPECT_LE(std::stod(exposed[2]), std::stod(total[2]));
}

TEST(TensorParallelTraining, TheEmulatedLinkIsANestedMapInTheConfig) {
    fs::path dir = scratch_dir();
    fs::path config = write_file(dir / "link.yaml", "parallel:\n  emulated_link: {gbps: 2.5, latency_us: 7}\n");
    std::string command = tiny_train(dir, "train.steps=1 train.val_every=0");
    command.replace(command.find(tiny), tiny.size(), config.string());
    Outcome r = run(command, dir);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("emulated link: 2.5 Gbit/s, 7 µs per message"), std::string::npos) << r.out;
    fs::path typo = write_file(dir / "typo.yaml", "parallel:\n  emulated_link:\n    gbs: 2\n");
    command = tiny_train(dir, "train.steps=1");
    command.replace(command.find(tiny), tiny.size(), typo.string());
    r = run(command, dir);
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.err.find("typo.yaml:3: unknown key parallel.emulated_link.gbs"), std::string::npos) << r.err;
}

TEST(TensorParallelTraining, CollectiveBytesAreWhatTheLayoutImplies) {
    if (!have_mpirun()) GTEST_SKIP() << "mpirun not installed";
    fs::path root = scratch_dir();
    // per step, in units of one [s, b, h] tensor (8·64·128 floats): with SP each block
    // all-gathers 2 (forward) + 2 (ḡ backward) + 2 (re-gather for wgrad) and
    // reduce-scatters 2 + 2; the embedding adds RS + AG, the LM head AG + AG + RS.
    // Without SP each block all-reduces 2 + 2, the embedding and the LM head one each.
    const int64_t unit = int64_t(8) * 64 * 128 * 4, L = 4;
    for (bool sp : {true, false}) {
        fs::path dir = root / (sp ? "sp" : "tp");
        fs::create_directories(dir);
        std::string args = short_run +
                           "train.steps=2 parallel.tp=2 parallel.sequence_parallel=" + (sp ? "true" : "false");
        ASSERT_EQ(run(mpirun(2) + tiny_train(dir, args), dir).exit_code, 0);
        int64_t ag = std::stoll(field(dir / "metrics.jsonl", "all_gather_bytes")[0]);
        int64_t rs = std::stoll(field(dir / "metrics.jsonl", "reduce_scatter_bytes")[0]);
        int64_t ar = std::stoll(field(dir / "metrics.jsonl", "all_reduce_bytes")[0]);
        if (sp) {
            EXPECT_EQ(ag, (6 * L + 3) * unit);
            EXPECT_EQ(rs, (4 * L + 2) * unit);
            EXPECT_LT(ar, unit) << "only the cross-entropy statistics and the replicated gradients";
        } else {
            EXPECT_EQ(ag, 0);
            EXPECT_EQ(rs, 0);
            EXPECT_GE(ar, (4 * L + 2) * unit);
            EXPECT_LT(ar, (4 * L + 3) * unit);
        }
    }
}

TEST(TensorParallelTraining, TwoDataParallelTimesTwoTensorParallelEqualsOneRankWithTwiceTheBatch) {
    if (!have_mpirun()) GTEST_SKIP() << "mpirun not installed";
    fs::path root = scratch_dir(), one = root / "one", four = root / "four";
    fs::create_directories(one);
    fs::create_directories(four);
    ASSERT_EQ(run(mpirun(1) + tiny_train(one, short_run + "train.steps=10 train.batch_size=16"), one).exit_code, 0);
    ASSERT_EQ(run(mpirun(4) + tiny_train(four, short_run + "train.steps=10 parallel.tp=2"), four).exit_code, 0);
    std::vector<std::string> a = field(one / "metrics.jsonl", "loss"), b = field(four / "metrics.jsonl", "loss");
    ASSERT_EQ(a.size(), 10u);
    ASSERT_EQ(b.size(), 10u);
    for (int i = 0; i < 10; i++)
        EXPECT_NEAR(std::stod(b[i]), std::stod(a[i]), 1e-4 * std::stod(a[i])) << "step " << i + 1;
}

TEST(TensorParallelTraining, ACheckpointSavedAtTwoRanksResumesAtOneAndFour) {
    if (!have_mpirun()) GTEST_SKIP() << "mpirun not installed";
    fs::path root = scratch_dir(), whole = root / "whole";
    fs::create_directories(whole);
    const std::string args = short_run + "checkpoint.every=10 parallel.tp=2";
    ASSERT_EQ(run(mpirun(2) + tiny_train(whole, args), whole).exit_code, 0);
    std::vector<std::string> reference = field(whole / "metrics.jsonl", "loss");
    ASSERT_EQ(reference.size(), 20u);
    for (int t : {1, 4}) {
        SCOPED_TRACE("resumed at t=" + std::to_string(t));
        fs::path cut = root / "t";
        cut += std::to_string(t);
        fs::create_directories(cut);
        fs::copy(whole / "ckpt", cut / "ckpt");
        std::ofstream(cut / "ckpt" / "latest") << "10\n";
        std::string resume = short_run + "checkpoint.every=10 parallel.tp=" + std::to_string(t) +
                             " checkpoint.resume=" + (cut / "ckpt").string();
        Outcome r = run(mpirun(t) + tiny_train(cut, resume), cut);
        ASSERT_EQ(r.exit_code, 0) << r.err;
        std::vector<std::string> tail = field(cut / "metrics.jsonl", "loss");
        ASSERT_EQ(tail.size(), 10u);
        for (int i = 0; i < 10; i++)
            EXPECT_NEAR(std::stod(tail[i]), std::stod(reference[10 + i]), 1e-4 * std::stod(reference[10 + i]))
                << "step " << 11 + i;
    }
}

// Context parallelism end to end (docs/design.md §9): the same 10 steps at
// cp = 2 and 4, and cp = 2 × t = 2, dropout 0.1, against one rank. The
// arithmetic differs from cp = 1 only in the order of fp32 sums (the
// gradients over the CP ranks, the loss's mean), so 1e-5 relative.
// 10 steps at cp = 2 and 4 (t = 1) and cp = 2 × t = 2, dropout 0.1, with
// the all-to-alls (a2a) and with ring attention (p2p): every loss within
// 1e-5 of one rank's, and p2p's within 1e-5 of a2a's.
TEST(ContextParallelTraining, LossesAtCpTwoAndFourEqualOneRank) {
    if (!have_mpirun()) GTEST_SKIP() << "mpirun not installed";
    fs::path root = scratch_dir();
    auto losses = [&](int cp, int t, const std::string& type) {
        fs::path dir = root / ("cp" + std::to_string(cp) + "t" + std::to_string(t) + type);
        fs::create_directories(dir);
        Outcome r = run(mpirun(cp * t) +
                            tiny_train(dir, short_run + "train.steps=10 parallel.cp=" + std::to_string(cp) +
                                                " parallel.tp=" + std::to_string(t) + " parallel.cp_comm_type=" + type),
                        dir);
        EXPECT_EQ(r.exit_code, 0) << r.err;
        if (cp > 1) {
            EXPECT_NE(r.out.find(type == "p2p" ? "| CP P2P " : "| CP A2A "), std::string::npos)
                << "the step line shows the CP transfers";
        }
        return field(dir / "metrics.jsonl", "loss");
    };
    const std::vector<std::string> one = losses(1, 1, "a2a");
    ASSERT_EQ(one.size(), 10u);
    for (auto [cp, t] : {std::pair{2, 1}, std::pair{4, 1}, std::pair{2, 2}}) {
        SCOPED_TRACE("cp=" + std::to_string(cp) + " t=" + std::to_string(t));
        const std::vector<std::string> all_to_all = losses(cp, t, "a2a"), ring = losses(cp, t, "p2p");
        ASSERT_EQ(all_to_all.size(), 10u);
        ASSERT_EQ(ring.size(), 10u);
        for (int i = 0; i < 10; i++) {
            const double reference = std::stod(one[i]);
            EXPECT_NEAR(std::stod(all_to_all[i]), reference, 1e-5 * reference) << "a2a, step " << i + 1;
            EXPECT_NEAR(std::stod(ring[i]), reference, 1e-5 * reference) << "p2p, step " << i + 1;
            EXPECT_NEAR(std::stod(ring[i]), std::stod(all_to_all[i]), 1e-5 * reference) << "p2p vs a2a, step " << i + 1;
        }
    }
}

// A file's bytes, to compare two checkpoints whole.
static std::string file_bytes(const fs::path& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
}

// Pipeline parallelism (docs/design.md §10) trains the bits of one stage:
// each stage accumulates its micro-batches' gradients in the same order, the
// tied wte's two sums (the LM head's and the lookup's) are added once, after
// the step's last backward, on every layout alike, and the dropout masks
// are keyed by global block. Losses, gradient norms and validation losses
// (each batch through the stages) are compared as the metrics file writes
// them (the shortest text that round-trips), and the weights and AdamW's
// moments after 8 steps as the checkpoint holds them, byte for byte. Under
// another t or cp the reference is one stage at that t or cp.
TEST(PipelineParallelTraining, EveryScheduleTrainsTheBitsOfOneStage) {
    if (!have_mpirun()) GTEST_SKIP() << "mpirun not installed";
    fs::path root = scratch_dir();
    struct Trained {
        std::vector<std::string> losses, norms, val_losses;  // validation at steps 4 and 8, through the stages
        std::string model, state;                            // step 8's files
    };
    auto trained = [&](const std::string& name, int ranks, const std::string& args) {
        fs::path dir = root / name;
        fs::create_directories(dir);
        Outcome r = run(mpirun(ranks) + tiny_train(dir, short_run +
                                                            "train.steps=8 train.batch_size=4 train.val_every=4 "
                                                            "train.val_batches=2 " +
                                                            args),
                        dir);
        EXPECT_EQ(r.exit_code, 0) << name << ": " << r.err;
        if (args.find("parallel.pp=") != std::string::npos) {
            EXPECT_NE(r.out.find("| PP "), std::string::npos) << "the step line shows the stages' transfers";
        }
        return Trained{field(dir / "metrics.jsonl", "loss"), field(dir / "metrics.jsonl", "grad_norm"),
                       field(dir / "metrics.jsonl", "val_loss"), file_bytes(dir / "ckpt" / "model_00000008.bin"),
                       file_bytes(dir / "ckpt" / "state_00000008.bin")};
    };
    const Trained one = trained("one", 1, "train.grad_accum=4");
    const Trained one_dp2 = trained("one_dp2", 2, "train.grad_accum=4 train.batch_size=2");
    const Trained one_accum8 = trained("one_accum8", 1, "train.grad_accum=8");
    const Trained one_t2 = trained("one_t2", 2, "train.grad_accum=4 parallel.tp=2");    // t changes the GEMMs' sums
    const Trained one_cp2 = trained("one_cp2", 2, "train.grad_accum=4 parallel.cp=2");  // and cp the gradients' sums
    ASSERT_EQ(one.losses.size(), 8u);
    ASSERT_FALSE(one.model.empty());
    struct Layout {
        const char* name;
        int ranks;
        std::string args;
        const Trained& reference;
    };
    const Layout layouts[] = {
        {"pp2", 2, "train.grad_accum=4 parallel.pp=2", one},
        {"pp4", 4, "train.grad_accum=4 parallel.pp=4", one},
        {"pp2_t2", 4, "train.grad_accum=4 parallel.pp=2 parallel.tp=2", one_t2},
        {"pp2_vpp2", 2, "train.grad_accum=4 parallel.pp=2 parallel.vpp=2", one},
        {"pp2_vpp2_t2", 4, "train.grad_accum=4 parallel.pp=2 parallel.vpp=2 parallel.tp=2", one_t2},
        {"pp2_cp2", 4, "train.grad_accum=4 parallel.pp=2 parallel.cp=2", one_cp2},
        {"pp2_vpp2_accum8", 2, "train.grad_accum=8 parallel.pp=2 parallel.vpp=2", one_accum8},
        {"pp2_full_recompute", 2, "train.grad_accum=4 parallel.pp=2 model.recompute=full model.recompute_layers=1",
         one},
        {"pp2_dp2_distributed", 4,
         "train.grad_accum=4 train.batch_size=2 parallel.pp=2 parallel.distributed_optimizer=true "
         "parallel.overlap_grad_reduce=true parallel.overlap_param_gather=true",
         one_dp2},
    };
    for (const Layout& layout : layouts) {
        SCOPED_TRACE(layout.name);
        const Trained run = trained(layout.name, layout.ranks, layout.args);
        EXPECT_EQ(run.losses, layout.reference.losses);
        EXPECT_EQ(run.norms, layout.reference.norms);
        EXPECT_EQ(run.val_losses, layout.reference.val_losses);
        EXPECT_TRUE(run.model == layout.reference.model) << "the weights after 8 steps differ";
        EXPECT_TRUE(run.state == layout.reference.state) << "AdamW's moments after 8 steps differ";
    }
}

// A checkpoint of a pipeline holds the whole model and its whole optimizer
// state: saved at pp = 2, it resumes at pp = 1, at pp = 4 and interleaved
// (the same bits as the run never stopped: its step 8 files, byte for byte)
// and at another t (the next losses within 1e-5); tpsp eval of the saved
// model through each layout's stages gives one loss.
TEST(PipelineParallelTraining, ACheckpointSavedAtTwoStagesResumesAtOneFourInterleavedAndAnotherT) {
    if (!have_mpirun()) GTEST_SKIP() << "mpirun not installed";
    fs::path root = scratch_dir(), whole = root / "whole", cut = root / "cut";
    const std::string args = short_run + "train.steps=8 train.batch_size=4 train.grad_accum=4 ";
    fs::create_directories(whole);
    ASSERT_EQ(run(mpirun(1) + tiny_train(whole, args), whole).exit_code, 0);
    fs::create_directories(cut);
    Outcome saved = run(mpirun(2) + tiny_train(cut, args + "train.steps=4 parallel.pp=2"), cut);
    ASSERT_EQ(saved.exit_code, 0) << saved.err;
    const std::vector<std::string> reference = field(whole / "metrics.jsonl", "loss");
    ASSERT_EQ(reference.size(), 8u);
    std::set<std::string> evals;  // the losses tpsp eval printed at the layouts of t = 1: one
    for (auto [ranks, layout] :
         {std::pair{1, "parallel.pp=1"}, std::pair{4, "parallel.pp=4"}, std::pair{2, "parallel.pp=2 parallel.vpp=2"},
          std::pair{4, "parallel.pp=2 parallel.tp=2"}}) {
        SCOPED_TRACE(layout);
        fs::path dir = root / ("resumed_" + std::to_string(ranks) + "_" + std::to_string(std::string(layout).size()));
        fs::create_directories(dir);
        fs::copy(cut / "ckpt", dir / "ckpt");
        Outcome r = run(
            mpirun(ranks) + tiny_train(dir, args + layout + " checkpoint.resume=" + (dir / "ckpt").string()), dir);
        ASSERT_EQ(r.exit_code, 0) << r.err;
        const std::vector<std::string> tail = field(dir / "metrics.jsonl", "loss");
        ASSERT_EQ(tail.size(), 4u);
        const bool same_t = std::string(layout).find("parallel.tp=2") == std::string::npos;
        for (int i = 0; i < 4; i++) {
            if (same_t) EXPECT_EQ(tail[size_t(i)], reference[size_t(4 + i)]) << "step " << 5 + i;
            else EXPECT_NEAR(std::stod(tail[size_t(i)]), std::stod(reference[size_t(4 + i)]), 1e-5) << "step " << 5 + i;
        }
        // tpsp eval of the saved model through this layout's stages: one stage's loss
        Outcome evaluated = run(
            mpirun(ranks) + tpsp_binary + " eval " + tiny + " data.val='" + corpus +
                "/val_*.bin' train.val_batches=2 train.batch_size=4 train.seq_len=64 train.grad_accum=4 " + layout +
                " checkpoint.init=" + (cut / "ckpt" / "model_00000004.bin").string(),
            dir);
        ASSERT_EQ(evaluated.exit_code, 0) << evaluated.err;
        std::smatch loss;
        ASSERT_TRUE(std::regex_search(evaluated.out, loss, std::regex("val loss ([0-9.]+)"))) << evaluated.out;
        if (same_t) evals.insert(loss[1].str());
        else EXPECT_NEAR(std::stod(loss[1].str()), std::stod(*evals.begin()), 1e-5);
        if (same_t) {
            EXPECT_TRUE(file_bytes(dir / "ckpt" / "model_00000008.bin") ==
                        file_bytes(whole / "ckpt" / "model_00000008.bin"));
            EXPECT_TRUE(file_bytes(dir / "ckpt" / "state_00000008.bin") ==
                        file_bytes(whole / "ckpt" / "state_00000008.bin"));
        }
    }
    EXPECT_EQ(evals.size(), 1u) << "tpsp eval gave another loss at another pp";
}

// The trace's "pipeline schedule" row of each stage holds one span per
// action of its schedule, in its order (stage 0 of p = 2, m = 4: F0 F1 B0 F2
// B1 F3 B2 B3), with a bubble span before each action that waited for a
// neighbour; the step line and the metrics report the bubble fraction beside
// the theory's (p − 1)/(m + p − 1).
TEST(PipelineParallelTraining, TheTraceShowsEachStagesMicroBatchesAndTheStepLineItsBubble) {
    if (!have_mpirun()) GTEST_SKIP() << "mpirun not installed";
    fs::path dir = scratch_dir();
    Outcome r = run(mpirun(2) + tiny_train(dir, short_run +
                                                    "train.steps=1 train.grad_accum=4 train.batch_size=4 "
                                                    "parallel.pp=2 checkpoint.dir= logging.trace=" +
                                                    (dir / "trace.json").string()),
                    dir);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("(theory 20.0%)"), std::string::npos) << r.out;  // (2 − 1)/(4 + 2 − 1)
    EXPECT_EQ(field(dir / "metrics.jsonl", "pp_bubble_theory"), std::vector<std::string>{"0.2"});
    const nlohmann::json trace = nlohmann::json::parse(std::ifstream(dir / "trace.json"));
    const std::vector<std::vector<std::string>> expected = {
        {"forward mb 0", "forward mb 1", "backward mb 0", "forward mb 2", "backward mb 1", "forward mb 3",
         "backward mb 2", "backward mb 3"},
        {"forward mb 0", "backward mb 0", "forward mb 1", "backward mb 1", "forward mb 2", "backward mb 2",
         "forward mb 3", "backward mb 3"}};
    for (int rank = 0; rank < 2; rank++) {
        std::vector<std::pair<double, std::string>> row;
        int bubbles = 0;
        for (const nlohmann::json& e : trace["traceEvents"])
            if (e["ph"] == "X" && e["pid"] == rank && e["tid"] == 3) {
                if (e["name"] == "bubble") bubbles++;
                else row.push_back({e["ts"].get<double>(), e["name"].get<std::string>()});
            }
        std::sort(row.begin(), row.end());
        std::vector<std::string> names;
        for (const auto& [at, name] : row) names.push_back(name);
        EXPECT_EQ(names, expected[size_t(rank)]) << "rank " << rank;
        // stage 0 waits for the 4 gradients, stage 1 for the 4 boundaries
        EXPECT_EQ(bubbles, 4) << "rank " << rank;
    }
}

// Ring attention's transfers: each K/V and dK/dV transfer of the trace
// overlaps the ring's compute on the same rank, but for each block's last
// dK/dV hop home, which follows the last compute (one per layer in
// backward); and the bytes per step are
// the layout's: per block L·((cp − 1) K|V blocks forward, cp − 1 again and
// cp gradient blocks backward), a block being [s/cp, b, 2h] fp32.
TEST(ContextParallelTraining, RingAttentionsTransfersRunUnderItsCompute) {
    if (!have_mpirun()) GTEST_SKIP() << "mpirun not installed";
    fs::path dir = scratch_dir();
    const fs::path trace = dir / "trace.json";
    Outcome r = run(mpirun(2) + tiny_train(dir, short_run +
                                                    "train.steps=3 parallel.cp=2 parallel.cp_comm_type=p2p "
                                                    "logging.trace=" +
                                                    trace.string() + " logging.trace_steps=2"),
                    dir);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const int64_t block = int64_t(64 / 2) * 8 * 2 * 128 * 4, L = 4, cp = 2;
    const std::vector<std::string> bytes = field(dir / "metrics.jsonl", "cp_ring_bytes");
    ASSERT_EQ(bytes.size(), 3u);
    EXPECT_EQ(std::stoll(bytes[2]), L * ((cp - 1) + (cp - 1) + cp) * block);
    const nlohmann::json events = nlohmann::json::parse(read_text(trace)).at("traceEvents");
    struct Span {
        double begin, end;
    };
    std::vector<Span> compute, transfers;
    int home = 0;
    for (const nlohmann::json& e : events) {
        if (!e.contains("dur") || e.at("pid") != 0) continue;
        const std::string name = e.at("name");
        const Span span{e.at("ts").get<double>(), e.at("ts").get<double>() + e.at("dur").get<double>()};
        if (name == "ring attention" || name == "ring attention backward") compute.push_back(span);
        if (name == "ring K/V" || name == "ring dK/dV") transfers.push_back(span);
        home += name == "ring dK/dV home";
    }
    EXPECT_EQ(home, L * 2) << "one hop home per layer, in each of the 2 traced steps";
    ASSERT_FALSE(transfers.empty()) << "the trace shows no ring transfer";
    int alone = 0;
    for (const Span& t : transfers) {
        bool under = false;
        for (const Span& c : compute) under = under || (c.begin < t.end && t.begin < c.end);
        alone += !under;
    }
    EXPECT_EQ(alone, 0) << "of " << transfers.size() << " ring transfers, these overlap no ring compute";
}

// Ring attention where a2a cannot go: a = 6 heads at cp = 4, against one rank.
TEST(ContextParallelTraining, RingAttentionRunsHeadsThatTheAllToAllsCannotCut) {
    if (!have_mpirun()) GTEST_SKIP() << "mpirun not installed";
    fs::path root = scratch_dir();
    const std::string six_heads = short_run + "train.steps=5 model.heads=6 model.channels=96 ";
    std::vector<std::string> losses[2];
    for (int cp : {1, 4}) {
        fs::path dir = root / ("cp" + std::to_string(cp));
        fs::create_directories(dir);
        Outcome r = run(
            mpirun(cp) + tiny_train(dir, six_heads + "parallel.cp_comm_type=p2p parallel.cp=" + std::to_string(cp)),
            dir);
        ASSERT_EQ(r.exit_code, 0) << r.err;
        losses[cp == 4] = field(dir / "metrics.jsonl", "loss");
    }
    ASSERT_EQ(losses[0].size(), 5u);
    ASSERT_EQ(losses[1].size(), 5u);
    for (int i = 0; i < 5; i++)
        EXPECT_NEAR(std::stod(losses[1][i]), std::stod(losses[0][i]), 1e-5 * std::stod(losses[0][i]))
            << "step " << i + 1;
    Outcome a2a = run(mpirun(4) + tiny_train(root, six_heads + "parallel.cp=4"), root);
    EXPECT_NE(a2a.exit_code, 0);
    EXPECT_NE(a2a.err.find("tp · cp = 4 does not divide model.heads = 6"), std::string::npos) << a2a.err;
}

// dp = 2 × cp = 2 against dp = 2 alone, the same batch a DP rank: the
// replica group (dp × cp) sums the gradients and shards the distributed
// optimizer, both overlap switches on, validation and a save on the way;
// the losses and the validation losses to 1e-5.
TEST(ContextParallelTraining, TwoDataParallelTimesTwoContextParallelEqualTwoDataParallel) {
    if (!have_mpirun()) GTEST_SKIP() << "mpirun not installed";
    fs::path root = scratch_dir();
    const std::string args = short_run +
                             "train.steps=8 train.val_every=4 train.val_batches=2 checkpoint.every=4 "
                             "parallel.distributed_optimizer=true parallel.overlap_grad_reduce=true "
                             "parallel.overlap_param_gather=true parallel.cp=";
    std::vector<std::string> losses[2], val[2];
    for (int cp : {1, 2}) {
        fs::path dir = root / ("cp" + std::to_string(cp));
        fs::create_directories(dir);
        Outcome r = run(mpirun(2 * cp) + tiny_train(dir, args + std::to_string(cp)), dir);
        ASSERT_EQ(r.exit_code, 0) << r.err;
        losses[cp - 1] = field(dir / "metrics.jsonl", "loss");
        val[cp - 1] = field(dir / "metrics.jsonl", "val_loss");
    }
    ASSERT_EQ(losses[0].size(), 8u);
    ASSERT_EQ(losses[1].size(), 8u);
    ASSERT_EQ(val[0].size(), 2u);
    ASSERT_EQ(val[1].size(), 2u);
    for (int i = 0; i < 8; i++)
        EXPECT_NEAR(std::stod(losses[1][i]), std::stod(losses[0][i]), 1e-5 * std::stod(losses[0][i]))
            << "step " << i + 1;
    for (int i = 0; i < 2; i++)
        EXPECT_NEAR(std::stod(val[1][i]), std::stod(val[0][i]), 1e-5 * std::stod(val[0][i])) << "validation " << i;
}

// Checkpoints know nothing of cp: saved at cp = 2, resumed at cp = 1 and 4,
// and evaluated at cp = 1, 2 and 4.
TEST(ContextParallelTraining, ACheckpointSavedAtCpTwoResumesAtCpOneAndFour) {
    if (!have_mpirun()) GTEST_SKIP() << "mpirun not installed";
    fs::path root = scratch_dir(), whole = root / "whole";
    fs::create_directories(whole);
    const std::string args = short_run + "train.steps=10 checkpoint.every=5 parallel.cp=";
    ASSERT_EQ(run(mpirun(2) + tiny_train(whole, args + "2"), whole).exit_code, 0);
    const std::vector<std::string> reference = field(whole / "metrics.jsonl", "loss");
    ASSERT_EQ(reference.size(), 10u);
    for (int cp : {1, 4}) {
        SCOPED_TRACE("resumed at cp=" + std::to_string(cp));
        fs::path cut = root / ("cp" + std::to_string(cp));
        fs::create_directories(cut);
        fs::copy(whole / "ckpt", cut / "ckpt");
        std::ofstream(cut / "ckpt" / "latest") << "5\n";
        Outcome r = run(
            mpirun(cp) + tiny_train(cut, args + std::to_string(cp) + " checkpoint.resume=" + (cut / "ckpt").string()),
            cut);
        ASSERT_EQ(r.exit_code, 0) << r.err;
        const std::vector<std::string> tail = field(cut / "metrics.jsonl", "loss");
        ASSERT_EQ(tail.size(), 5u);
        for (int i = 0; i < 5; i++)
            EXPECT_NEAR(std::stod(tail[i]), std::stod(reference[5 + i]), 1e-5 * std::stod(reference[5 + i]))
                << "step " << 6 + i;
    }
    // tpsp eval of the cp = 2 run's model at cp = 1, 2 and 4: one validation loss
    std::vector<float> evaluated;
    for (int cp : {1, 2, 4}) {
        Outcome eval = run(mpirun(cp) + tpsp_binary + " eval " + tiny + " data.val='" + corpus +
                               "/val_*.bin' train.batch_size=8 train.seq_len=64 train.val_batches=2 train.threads=1 "
                               "parallel.cp=" +
                               std::to_string(cp) +
                               " checkpoint.init=" + (whole / "ckpt" / "model_00000010.bin").string(),
                           whole);
        ASSERT_EQ(eval.exit_code, 0) << eval.err;
        evaluated.push_back(printed_val_loss(eval.out));
    }
    EXPECT_NEAR(evaluated[1], evaluated[0], 1e-5 * evaluated[0]) << "eval at cp = 2";
    EXPECT_NEAR(evaluated[2], evaluated[0], 1e-5 * evaluated[0]) << "eval at cp = 4";
}

TEST(ContextParallelTraining, ALayoutCpCannotCutIsOneConfigLine) {
    fs::path dir = scratch_dir();
    const std::pair<std::string, std::string> cases[] = {
        {"parallel.cp=3", "tp · cp = 3 does not divide model.heads = 4"},
        {"parallel.cp=2 train.seq_len=66", "2 · cp · tp = 4 does not divide train.seq_len = 66"},
        {"parallel.cp=2 parallel.cp_comm_type=p2p train.device=cuda model.attention=cudnn",
         "cudnn runs under parallel.cp_comm_type: a2a only"},
        {"parallel.cp=2", "tp · cp = 2 does not divide the 1 ranks launched"},
    };
    for (const auto& [bad, line] : cases) {
        SCOPED_TRACE(bad);
        Outcome r = run(tiny_train(dir, short_run + bad), dir);
        EXPECT_NE(r.exit_code, 0);
        EXPECT_NE(r.err.find("parallel.cp"), std::string::npos) << r.err;
        EXPECT_NE(r.err.find(line), std::string::npos) << r.err;
    }
}

TEST(TensorParallelTraining, AKilledRankEndsTheRunInsteadOfHanging) {
    if (!have_mpirun()) GTEST_SKIP() << "mpirun not installed";
    fs::path dir = scratch_dir();
    // rank 1 is killed mid-run, once the first step's metrics line shows that
    // training has begun (a clock could fire before the first step on a busy
    // machine): the other rank must not wait for it forever. The watcher ends
    // with the rank should it never see the line, and holds none of mpirun's
    // pipes, which mpirun would wait for.
    const fs::path metrics = dir / "metrics.jsonl", killed = dir / "killed";
    const std::string kill_after_the_first_step = "until [ -s " + metrics.string() +
                                                  " ]; do kill -0 $$ || exit; sleep 0.05; done; touch " +
                                                  killed.string() + "; kill -9 $$";
    fs::path wrapper = write_file(dir / "kill_rank_1.sh", "#!/bin/bash\nif [ \"$OMPI_COMM_WORLD_RANK\" = 1 ]; then (" +
                                                              kill_after_the_first_step +
                                                              ") < /dev/null &> /dev/null & fi\nexec \"$@\"\n");
    fs::permissions(wrapper, fs::perms::owner_all);
    std::string command = mpi_env + "timeout 60 mpirun --oversubscribe -np 2 " + wrapper.string() + " " +
                          tiny_train(dir, short_run + "train.steps=100000 parallel.tp=2");
    auto start = std::chrono::steady_clock::now();
    Outcome r = run(command, dir);
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.exit_code, 124) << "the run hung until timeout killed it";
    EXPECT_LT(seconds, 33.0);
    EXPECT_TRUE(fs::exists(killed)) << "rank 1 was never killed: " << r.err;
    EXPECT_GE(field(metrics, "loss").size(), 1u) << "the run never started: " << r.err;
}

TEST(TensorParallelTraining, ALayoutThatDoesNotFitIsOneLineFromRankZero) {
    if (!have_mpirun()) GTEST_SKIP() << "mpirun not installed";
    fs::path dir = scratch_dir();
    Outcome r = run(mpirun(2) + tiny_train(dir, short_run + "parallel.tp=4"), dir);
    EXPECT_NE(r.exit_code, 0);
    std::string own;  // tpsp's lines, not mpirun's own summary
    std::istringstream lines(r.err);
    for (std::string line; std::getline(lines, line);)
        if (line.rfind("tpsp:", 0) == 0) own += line + "\n";
    EXPECT_EQ(count_lines(own), 1) << r.err;
    EXPECT_NE(own.find("parallel.tp: 4 does not divide the 2 ranks launched"), std::string::npos) << r.err;
    r = run(mpirun(2) + tiny_train(dir, short_run + "parallel.tp=2 model.heads=3 model.channels=96"), dir);
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.err.find("parallel.tp: 2 does not divide model.heads = 3"), std::string::npos) << r.err;
}

// The command line: a malformed number or a value out of bounds is one line
// that names the option, exit 2, and nothing runs.
TEST(BadInput, AMalformedNumberOnTheCommandLineIsOneLineNamingTheOption) {
    fs::path dir = scratch_dir();
    const std::string text = (dir / "in.txt").string();
    std::ofstream(text) << "text";
    const std::vector<std::pair<std::string, std::string>> cases = {
        {" bench " + tiny + " --steps abc", "--steps"},
        {" bench " + tiny + " --steps 0", "--steps"},
        {" prepare --tokenizer byte --shard-tokens 1e3 " + text + " " + (dir / "out").string(), "--shard-tokens"},
        {" prepare --tokenizer byte --val-fraction 0.5junk " + text + " " + (dir / "out").string(), "--val-fraction"},
        {" prepare --tokenizer bytes " + text + " " + (dir / "out").string(), "--tokenizer"},
        {" sample " + text + " --tokens -3", "--tokens"},
        {" sample " + text + " --temperature 1.5x", "--temperature"},
        {" frobnicate", "frobnicate"},
    };
    for (const auto& [arguments, option] : cases) {
        SCOPED_TRACE(arguments);
        Outcome r = run(tpsp_binary + arguments, dir);
        EXPECT_EQ(r.exit_code, 2);
        EXPECT_EQ(count_lines(r.err), 1) << r.err;
        EXPECT_NE(r.err.find(option), std::string::npos) << r.err;
        EXPECT_TRUE(r.out.empty()) << r.out;
    }
    EXPECT_FALSE(fs::exists(dir / "out")) << "prepare wrote although its options were wrong";
}

// bench times one rank: a layout it would not honour is refused, not ignored.
TEST(BadInput, BenchRefusesTheSwitchesItWouldIgnore) {
    fs::path dir = scratch_dir();
    for (const std::string setting : {"parallel.tp=2", "parallel.tp_comm_overlap=true"}) {
        SCOPED_TRACE(setting);
        Outcome r = run(tpsp_binary + " bench " + tiny + " --steps 1 " + setting, dir);
        EXPECT_EQ(r.exit_code, 1);
        EXPECT_EQ(count_lines(r.err), 1) << r.err;
        EXPECT_NE(r.err.find("parallel.tp: tpsp bench times one rank"), std::string::npos) << r.err;
        EXPECT_TRUE(r.out.empty()) << r.out;
    }
}

// `tpsp bench --breakdown`: a row for every part of the model, each of which
// timed some work, and spans that cover the step without counting any of it
// twice. The last row is the step less the spans, so the rows add up to the
// step by construction; what can fail is that remainder: negative when spans
// nest or overlap, large when work runs outside every span. A span that
// moved off its work shows as a zero row and its time outside.
TEST(Bench, TheBreakdownNamesEveryPartAndItsSpansCoverTheStep) {
    fs::path dir = scratch_dir();
    Outcome r = run(tpsp_binary + " bench " + tiny +
                        " train.batch_size=8 train.seq_len=128 train.threads=2 model.dropout=0.1 --steps 1 --breakdown",
                    dir);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    std::smatch m;
    ASSERT_TRUE(std::regex_search(r.out, m, std::regex("breakdown of one forward\\+backward, ([0-9.]+) ms"))) << r.out;
    const double step_ms = std::stod(m[1]);
    std::map<std::string, double> rows;
    std::regex row("\n  (\\S.*\\S) +(-?[0-9.]+) ms +-?[0-9.]+%");
    for (auto it = std::sregex_iterator(r.out.begin(), r.out.end(), row); it != std::sregex_iterator(); ++it)
        rows[(*it)[1]] = std::stod((*it)[2]);
    for (const char* part : {"zero gradients",
                             "embeddings",
                             "layernorm",
                             "qkv",
                             "attention",
                             "attention proj",
                             "bias, dropout, residual",
                             "fc1 + gelu",
                             "fc2",
                             "lm head",
                             "cross-entropy",
                             "cross-entropy backward",
                             "lm head backward",
                             "layernorm backward",
                             "dropout, bias backward",
                             "fc2 + gelu backward",
                             "fc1 backward",
                             "attention proj backward",
                             "attention backward",
                             "qkv backward",
                             "embeddings backward"}) {
        ASSERT_EQ(rows.count(part), 1u) << "no row for " << part << "\n" << r.out;
        EXPECT_GT(rows[part], 0.0) << part << " timed no work\n" << r.out;
    }
    ASSERT_EQ(rows.count("(outside every span)"), 1u) << r.out;
    const double outside = rows["(outside every span)"];
    EXPECT_GE(outside, 0.0) << "spans nested or overlapped and counted some work twice\n" << r.out;
    // the code between spans only hands pointers on (about 0.1% of this step
    // on 2 cores, loaded or not): 2% is room for a preemption there, not for a
    // part of the model left untimed
    EXPECT_LT(outside, 0.02 * step_ms) << "work ran outside every span\n" << r.out;
}

// ----------------------------------------------------------------------------
// bad input

// train.device: cuda trains on a GPU where there is one; elsewhere it is one
// clear line and exit 1, and auto falls back to the CPU.
TEST(Device, CudaWithoutAGpuIsOneLineAndAutoFallsBack) {
    fs::path dir = scratch_dir();
    const std::string short_run = "train.steps=2 train.val_every=0 checkpoint.dir= ";
    Outcome r = run(tiny_train(dir, short_run + "train.device=cuda"), dir);
    if (r.exit_code == 0) {
        EXPECT_NE(r.out.find("| cuda, "), std::string::npos) << r.out;  // a GPU is here: it trained on it
    } else {
        EXPECT_EQ(count_lines(r.err), 1) << r.err;
        EXPECT_TRUE(r.err.find("train.device: cuda: this tpsp was built without CUDA") != std::string::npos ||
                    r.err.find("train.device: cuda: no CUDA device is visible") != std::string::npos)
            << r.err;
    }
    r = run(tiny_train(dir, short_run + "train.device=auto checkpoint.overwrite=true"), dir);  // after a GPU's run
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(field(dir / "metrics.jsonl", "loss").size(), 2u);
}

TEST(BadInput, MalformedYaml) {
    fs::path dir = scratch_dir();
    fs::path config = write_file(dir / "bad.yaml", "model:\n  layers: [1, 2\ntrain:\n  steps: 3\n");
    expect_clean_failure(dir, "", "bad.yaml:", config.string());
    expect_clean_failure(dir, "", "malformed YAML", config.string());
}

TEST(BadInput, UnknownKeyNamesTheKeyAndTheLine) {
    fs::path dir = scratch_dir();
    fs::path config = write_file(dir / "typo.yaml", "model:\n  layers: 2\ntrain:\n  stpes: 3\n");
    expect_clean_failure(dir, "", "typo.yaml:4: unknown key train.stpes", config.string());
    expect_clean_failure(dir, "trian.steps=3", "unknown key trian.steps");
}

TEST(BadInput, WrongTypeAndImpossibleValue) {
    fs::path dir = scratch_dir();
    expect_clean_failure(dir, "train.steps=abc", "train.steps: expected an integer, got 'abc'");
    expect_clean_failure(dir, "model.dropout=1.5", "model.dropout: must be in");
    expect_clean_failure(dir, "model.heads=3", "model.heads: 3 does not divide model.channels = 128");
    // with ε = 0 the padded vocabulary's rows (gradient always 0) became 0/0 at step 1
    expect_clean_failure(dir, "train.eps=0 model.vocab_size=250", "train.eps: must be above 0");
    fs::path config = write_file(dir / "type.yaml", "train:\n  lr: fast\n");
    expect_clean_failure(dir, "", "type.yaml:2: train.lr: expected a number, got 'fast'", config.string());
}

// The range is of the value stored: a float after rounding, an int within int.
TEST(BadInput, ARangeIsCheckedOnTheValueStored) {
    fs::path dir = scratch_dir();
    expect_clean_failure(dir, "train.beta2=0.9999999999",
                         "train.beta2: must be in [0, 1), got 0.9999999999, which is 1 as a float");
    expect_clean_failure(dir, "train.lr=999999999.9",
                         "train.lr: must be in [0, 1e+09), got 999999999.9, which is 1e+09");
    expect_clean_failure(dir, "logging.every=4294967297", "logging.every: must be at most 2147483647, got 4294967297");
    expect_clean_failure(dir, "train.seed=99999999999999999999", "train.seed: must be in [0, 18446744073709551615]");
    fs::path config = write_file(dir / "map.yaml", "model:\n  dropout: {p: 0.1}\nlogging:\n  every: 1\n");
    expect_clean_failure(dir, "", "map.yaml:2: model.dropout: expected a single value", config.string());
}

TEST(BadInput, BatchLargerThanTheShard) {
    fs::path dir = scratch_dir();
    tpsp::write_token_shard((dir / "small_000.bin").string(), std::vector<uint16_t>(1000, 65));
    expect_clean_failure(dir, "data.train=" + (dir / "small_*.bin").string(),
                         "small_000.bin: token shard has 1000 tokens, too few for one batch of 2048+1");
}

TEST(BadInput, ShardWithABadHeader) {
    fs::path dir = scratch_dir();
    std::vector<char> bytes(1024 + 20000, 0);
    reinterpret_cast<int*>(bytes.data())[0] = 12345;
    std::ofstream(dir / "junk_000.bin", std::ios::binary).write(bytes.data(), std::streamsize(bytes.size()));
    expect_clean_failure(dir, "data.train=" + (dir / "junk_*.bin").string(),
                         "junk_000.bin: not an llm.c token shard (magic 12345");
    expect_clean_failure(dir, "data.train=" + (dir / "nothing_*.bin").string(), "no token shard matches");
}

TEST(BadInput, TruncatedCheckpointAndCheckpointOfAnotherModel) {
    fs::path dir = scratch_dir();
    fs::path source = dir / "source";
    fs::create_directories(source);
    ASSERT_EQ(run(tiny_train(source, "train.steps=1 train.val_every=0"), source).exit_code, 0);
    fs::path good = source / "ckpt" / "model_00000001.bin";
    fs::path truncated = dir / "truncated.bin";
    fs::copy_file(good, truncated);
    fs::resize_file(truncated, fs::file_size(good) - 1000);
    expect_clean_failure(dir, "checkpoint.init=" + truncated.string(), "truncated.bin: checkpoint is");
    expect_clean_failure(dir, "checkpoint.init=" + truncated.string(), "(truncated)");
    expect_clean_failure(dir, "model.layers=2 checkpoint.init=" + good.string(),
                         "model_00000001.bin: checkpoint is for another model");
    expect_clean_failure(dir, "checkpoint.resume=" + (dir / "nowhere").string(), "not a tpsp run directory");
}

// `tpsp versions` says which file each library was loaded from: the files
// the dynamic loader resolves for the binary (ldd), and on a CUDA build one
// for each of cuBLASLt, cuDNN (where built in) and NCCL.
TEST(Versions, EachLibraryIsNamedWithTheFileTheLoaderResolved) {
    fs::path dir = scratch_dir();
    Outcome versions = run(tpsp_binary + " versions", dir);
    ASSERT_EQ(versions.exit_code, 0) << versions.err;
    EXPECT_NE(versions.out.find("\nMPI: "), std::string::npos) << versions.out;
    Outcome ldd = run("ldd " + tpsp_binary, dir);
    ASSERT_EQ(ldd.exit_code, 0) << ldd.err;
    std::vector<fs::path> resolved;
    const std::regex arrow(R"(=> (/\S+) \()");
    for (std::sregex_iterator m(ldd.out.begin(), ldd.out.end(), arrow), end; m != end; ++m)
        resolved.push_back((*m)[1].str());
    const std::regex named(R"(^([A-Za-z ]+): [0-9.]+ \((/[^)]+)\))");
    std::map<std::string, fs::path> files;
    std::istringstream lines(versions.out);
    for (std::string line; std::getline(lines, line);) {
        std::smatch m;
        if (!std::regex_search(line, m, named)) continue;
        files[m[1].str()] = m[2].str();
        bool found = false;
        for (const fs::path& r : resolved) found = found || fs::equivalent(r, m[2].str());
        EXPECT_TRUE(found) << line << ": not a library ldd resolves for tpsp";
    }
    if (versions.out.find("build: CUDA on") == std::string::npos) return;
    std::vector<std::string> expected = {"CUDA runtime", "cuBLASLt", "NCCL"};
    if (versions.out.find("cuDNN on") != std::string::npos) expected.push_back("cuDNN");
    for (const std::string& library : expected)
        EXPECT_TRUE(files.count(library)) << library << " has no file:\n" << versions.out;
}

TEST(Documentation, DocsConfigHoldsTheConfigReferenceOfTheCode) {
    fs::path dir = scratch_dir();
    Outcome reference = run(tpsp_binary + " config-reference", dir);
    ASSERT_EQ(reference.exit_code, 0);
    std::string page = read_text(fs::path(TPSP_SOURCE_DIR) / "docs" / "config.md");
    EXPECT_NE(page.find(reference.out), std::string::npos)
        << "docs/config.md's config reference is stale: paste the output of `tpsp config-reference` into it";
}

// ----------------------------------------------------------------------------
// data parallelism (docs/design.md §8), under mpirun

namespace {

// dp = 4 (t = 1) or dp = 2 × t = 2 on 4 ranks, 2 micro-batches, dropout 0.1
const std::string dp_run = short_run + "train.steps=8 train.batch_size=4 train.grad_accum=2 checkpoint.every=4 ";

// The run's losses, and its last model and state files (the whole model and
// the whole AdamW state, assembled from every rank's shards) as bytes.
struct DataParallelRun {
    std::vector<std::string> losses, norms;
    std::string model, state;
};

DataParallelRun dp_train(const fs::path& dir, int ranks, const std::string& flags) {
    fs::create_directories(dir);
    Outcome r = run(mpirun(ranks) + tiny_train(dir, dp_run + flags), dir);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return {field(dir / "metrics.jsonl", "loss"), field(dir / "metrics.jsonl", "grad_norm"),
            read_text(dir / "ckpt" / "model_00000008.bin"), read_text(dir / "ckpt" / "state_00000008.bin")};
}

}  // namespace

// Every element of the gradient is summed over the DP ranks in rank order in
// every mode, and the norm is taken one way: the distributed optimizer and
// the gradient reduction overlapped with backward train the same bits as
// plain data parallelism, at any bucket size (the small one: a bucket per
// layer slice, started during backward), with the TP overlap on too.
TEST(DataParallelTraining, EveryDataParallelModeTrainsTheBitsOfPlainDataParallelism) {
    if (!have_mpirun()) GTEST_SKIP() << "mpirun not installed";
    fs::path root = scratch_dir();
    for (const std::string grid : {"parallel.tp=1", "parallel.tp=2"}) {
        for (const std::string buckets : {"", " parallel.bucket_size=30000"}) {
            SCOPED_TRACE(grid + buckets);
            const std::string name = grid.substr(9) + (buckets.empty() ? "" : "_small");
            DataParallelRun plain = dp_train(root / ("plain" + name), 4, grid + buckets);
            ASSERT_EQ(plain.losses.size(), 8u);
            ASSERT_FALSE(plain.model.empty());
            const std::string sharded = " parallel.distributed_optimizer=true",
                              reduce = " parallel.overlap_grad_reduce=true",
                              gather = " parallel.overlap_param_gather=true";
            std::vector<std::pair<std::string, std::string>> modes = {{"sharded", sharded},
                                                                      {"overlapped", reduce},
                                                                      {"sharded_reduce", sharded + reduce},
                                                                      {"sharded_gather", sharded + gather},
                                                                      {"sharded_both", sharded + reduce + gather}};
            if (grid == "parallel.tp=2")
                modes.push_back({"every_overlap", sharded + reduce + gather + " parallel.tp_comm_overlap=true"});
            for (const auto& [mode, flags] : modes) {
                SCOPED_TRACE(mode);
                DataParallelRun other = dp_train(root / (mode + name), 4, grid + buckets + flags);
                EXPECT_EQ(other.losses, plain.losses);
                EXPECT_EQ(other.norms, plain.norms);
                EXPECT_TRUE(other.model == plain.model) << "the weights after step 8 differ";
                EXPECT_TRUE(other.state == plain.state) << "AdamW's moments after step 8 differ";
            }
        }
    }
}

// What the DP group moved is in the step's metrics and in a row of its own
// in the trace: per step, each bucket's reduce-scatter of the gradients and
// all-gather of the parameters, each of the whole model's bytes.
TEST(DataParallelTraining, TheMetricsAndTheTraceShowTheDataParallelTransfers) {
    if (!have_mpirun()) GTEST_SKIP() << "mpirun not installed";
    fs::path dir = scratch_dir();
    DataParallelRun r = dp_train(
        dir, 2,
        "parallel.distributed_optimizer=true logging.trace_steps=2 logging.trace=" + (dir / "trace.json").string());
    const std::string parameter_bytes = std::to_string(int64_t(r.model.size()) - 1024);  // t = 1: the whole model
    for (const char* name : {"dp_reduce_scatter_bytes", "dp_all_gather_bytes"})
        EXPECT_EQ(field(dir / "metrics.jsonl", name), std::vector<std::string>(8, parameter_bytes)) << name;
    const nlohmann::json trace = nlohmann::json::parse(read_text(dir / "trace.json"));
    int reduce_scatters = 0, all_gathers = 0;
    for (const nlohmann::json& e : trace["traceEvents"]) {
        if (e["ph"] != "X" || e["pid"] != 0) continue;
        if (e["tid"] != 2) continue;  // the data-parallel row
        reduce_scatters += e["name"] == "DP reduce-scatter of gradients";
        all_gathers += e["name"] == "DP all-gather of parameters";
    }
    EXPECT_EQ(reduce_scatters, 2 * 16);  // 2 traced steps × the tiny model's 16 buckets (one per tensor)
    EXPECT_EQ(all_gathers, 2 * 16);
}

// With parallel.overlap_param_gather the next forward waits before each
// block only for the parameters it reads: in the trace, the all-gathers of
// the buckets later stages read first end after step 2's first qkv forward
// (block 0's) has begun, for nothing waits for them or moves them on before
// its GEMM polls; without the switch every all-gather of step 1 ends before
// step 2's embeddings begin.
TEST(DataParallelTraining, TheNextForwardWaitsOnlyForItsBlocksParametersWithOverlapParamGather) {
    if (!have_mpirun()) GTEST_SKIP() << "mpirun not installed";
    for (const bool overlap : {true, false}) {
        SCOPED_TRACE(overlap ? "overlap_param_gather" : "no overlap");
        fs::path dir = scratch_dir() / (overlap ? "on" : "off");
        dp_train(dir, 2,
                 std::string("parallel.bucket_size=30000 logging.trace_steps=2 parallel.distributed_optimizer=true "
                             "parallel.overlap_param_gather=") +
                     (overlap ? "true" : "false") + " logging.trace=" + (dir / "trace.json").string());
        const nlohmann::json trace = nlohmann::json::parse(read_text(dir / "trace.json"));
        std::vector<double> embeddings, qkv, gathers_end;  // rank 0's
        for (const nlohmann::json& e : trace["traceEvents"]) {
            if (e["ph"] != "X" || e["pid"] != 0) continue;
            const double begins = e["ts"].get<double>(), ends = begins + e["dur"].get<double>();
            if (e["name"] == "embeddings") embeddings.push_back(begins);
            if (e["name"] == "qkv") qkv.push_back(begins);
            if (e["name"] == "DP all-gather of parameters") gathers_end.push_back(ends);
        }
        for (std::vector<double>* v : {&embeddings, &qkv, &gathers_end}) std::sort(v->begin(), v->end());
        // 2 steps × 2 micro-batches: 4 forwards of 2 embedding spans and 4 blocks
        ASSERT_EQ(embeddings.size(), 8u);
        ASSERT_EQ(qkv.size(), 16u);
        // step 1's gathers (26 buckets), and without the switch step 2's (with it, they end in step 3, untraced)
        ASSERT_EQ(gathers_end.size(), overlap ? 26u : 52u);
        gathers_end.resize(26);
        const double step_2_begins = embeddings[4], step_2_block_0 = qkv[8];
        const auto late = std::count_if(gathers_end.begin(), gathers_end.end(),
                                        [&](double t) { return t > step_2_block_0; });
        if (overlap) {
            // read first by blocks 1-3 (qkvw, fcw, fcprojw of each; attprojw of blocks 2, 3) and the final
            // LayerNorm (lnfw, lnfb): 12 buckets
            EXPECT_EQ(late, 12) << "later stages' parameters were waited for before block 0 ran";
        } else {
            EXPECT_EQ(late, 0);
            EXPECT_LE(gathers_end.back(), step_2_begins);
        }
    }
}

// With parallel.overlap_grad_reduce the buckets of the last blocks start
// during backward: in the trace, reduce-scatters begin before the first
// block's backward (its qkv backward, the step's last) does; without it,
// none begins before backward has ended.
TEST(DataParallelTraining, TheGradientBucketsStartDuringBackwardWithOverlapGradReduce) {
    if (!have_mpirun()) GTEST_SKIP() << "mpirun not installed";
    for (const bool overlap : {true, false}) {
        SCOPED_TRACE(overlap ? "overlap_grad_reduce" : "no overlap");
        fs::path dir = scratch_dir() / (overlap ? "on" : "off");
        dp_train(dir, 2,
                 std::string("parallel.bucket_size=30000 logging.trace_steps=1 parallel.overlap_grad_reduce=") +
                     (overlap ? "true" : "false") + " logging.trace=" + (dir / "trace.json").string());
        const nlohmann::json trace = nlohmann::json::parse(read_text(dir / "trace.json"));
        double last_backward_begins = 0, last_backward_ends = 0;  // rank 0's last qkv backward
        std::vector<double> reduce_scatters;
        for (const nlohmann::json& e : trace["traceEvents"]) {
            if (e["ph"] != "X" || e["pid"] != 0) continue;
            const double begins = e["ts"].get<double>(), ends = begins + e["dur"].get<double>();
            if (e["name"] == "qkv backward" && begins > last_backward_begins)
                last_backward_begins = begins, last_backward_ends = ends;
            if (e["name"] == "DP reduce-scatter of gradients") reduce_scatters.push_back(begins);
        }
        ASSERT_EQ(reduce_scatters.size(), 26u);  // one traced step, 26 buckets at this size
        const auto early = std::count_if(reduce_scatters.begin(), reduce_scatters.end(),
                                         [&](double t) { return t < last_backward_begins; });
        if (overlap) {
            // final after blocks 3, 2, 1 (qkvw, fcw, fcprojw of each, attprojw of blocks 3 and 2): 10 buckets
            EXPECT_EQ(early, 10) << "the buckets of blocks 3, 2 and 1 did not start during backward";
        } else {
            EXPECT_EQ(early, 0);
            EXPECT_GE(*std::min_element(reduce_scatters.begin(), reduce_scatters.end()), last_backward_ends);
        }
    }
}

// Another order of sums (dp = 2 against dp = 1 with twice the batch): equal
// within float rounding, not bit for bit.
TEST(DataParallelTraining, TwoDataParallelRanksEqualOneWithTheirWholeBatch) {
    if (!have_mpirun()) GTEST_SKIP() << "mpirun not installed";
    fs::path root = scratch_dir();
    DataParallelRun one = dp_train(root / "one", 1, "train.batch_size=8");
    DataParallelRun two = dp_train(root / "two", 2, "parallel.distributed_optimizer=true");
    ASSERT_EQ(one.losses.size(), 8u);
    ASSERT_EQ(two.losses.size(), 8u);
    for (int i = 0; i < 8; i++)
        EXPECT_NEAR(std::stod(two.losses[i]), std::stod(one.losses[i]), 1e-4 * std::stod(one.losses[i]))
            << "step " << i + 1;
}

// The state file holds the whole optimizer state whatever the mode: a run
// saved with the distributed optimizer resumes without it (the same bits on
// the same grid), at another t, and at another dp that keeps dp × b (within
// float rounding).
TEST(DataParallelTraining, ACheckpointOfTheDistributedOptimizerResumesWithoutItAtAnotherTAndAnotherDp) {
    if (!have_mpirun()) GTEST_SKIP() << "mpirun not installed";
    fs::path root = scratch_dir();
    DataParallelRun straight = dp_train(root / "straight", 2, "parallel.distributed_optimizer=true");
    ASSERT_EQ(straight.losses.size(), 8u);
    int resumes = 0;
    for (const auto& [ranks, flags] :
         std::vector<std::pair<int, std::string>>{{2, "parallel.distributed_optimizer=false"},
                                                  {4, "parallel.distributed_optimizer=true parallel.tp=2"},
                                                  // another dp with the same dp × b: the same tokens and dropout masks
                                                  {1, "parallel.distributed_optimizer=false train.batch_size=8"},
                                                  {4, "parallel.distributed_optimizer=true train.batch_size=2"}}) {
        SCOPED_TRACE(std::to_string(ranks) + " ranks, " + flags);
        fs::path cut = root / ("resumed" + std::to_string(resumes++));
        fs::create_directories(cut);
        fs::copy(root / "straight" / "ckpt", cut / "ckpt");
        std::ofstream(cut / "ckpt" / "latest") << "4\n";
        DataParallelRun resumed = dp_train(cut, ranks, flags + " checkpoint.resume=" + (cut / "ckpt").string());
        ASSERT_EQ(resumed.losses.size(), 4u);  // steps 5-8
        for (int i = 4; i < 8; i++) {
            const std::string& loss = resumed.losses[size_t(i - 4)];
            if (ranks == 2) {
                EXPECT_EQ(loss, straight.losses[i]) << "step " << i + 1;
            } else {
                EXPECT_NEAR(std::stod(loss), std::stod(straight.losses[i]), 1e-4 * std::stod(straight.losses[i]))
                    << "step " << i + 1;
            }
        }
        if (ranks == 2) {
            EXPECT_TRUE(resumed.model == straight.model) << "the weights after step 8 differ";
        }
    }
}

// ----------------------------------------------------------------------------
// HellaSwag (train/hellaswag.h): scored in training at t = 2, and by tpsp
// eval of the saved model at t = 1, 2, 4, at dp = 2 and at dp = 2 × t = 2:
// the same counts every time.

TEST(HellaSwagTraining, TheCountsAreTheSameAtAnyTensorParallelSizeDataParallelRanksAndStages) {
    if (!have_mpirun()) GTEST_SKIP() << "mpirun not installed";
    fs::path dir = scratch_dir();
    // nine examples of the corpus' kind, each context with a right ending and three of other verses
    const char* verses[] = {"In the beginning God created the heaven and the earth.",
                            "And God said, Let there be light: and there was light.",
                            "The LORD is my shepherd; I shall not want.",
                            "For God so loved the world, that he gave his only begotten Son.",
                            "And the children of Israel went into the midst of the sea.",
                            "Blessed are the meek: for they shall inherit the earth.",
                            "Jesus wept.",
                            "Ask, and it shall be given you; seek, and ye shall find.",
                            "And the evening and the morning were the first day."};
    std::string lines;
    for (int e = 0; e < 9; e++) {
        const std::string verse = verses[e];
        const size_t cut = verse.find(' ', verse.size() / 2);
        nlohmann::json example = {{"ctx", verse.substr(0, cut)}, {"label", e % 4}};
        for (int k = 0; k < 4; k++) {
            const std::string other = verses[k == e % 4 ? e : (e + k + 1) % 9];
            example["endings"].push_back(k == e % 4 ? verse.substr(cut + 1) : other.substr(other.size() / 2));
        }
        lines += example.dump() + "\n";
    }
    const fs::path hellaswag = write_file(dir / "hellaswag.jsonl", lines);
    // trained (and scored) on two pipeline stages, evaluated at every layout
    Outcome trained = run(mpirun(2) + tiny_train(dir, short_run + "train.steps=4 parallel.pp=2 data.hellaswag=" +
                                                          hellaswag.string() + " train.hellaswag_every=4"),
                          dir);
    ASSERT_EQ(trained.exit_code, 0) << trained.err;
    const std::vector<std::string> in_training = field(dir / "metrics.jsonl", "hellaswag_acc_norm");
    ASSERT_EQ(in_training.size(), 1u);
    const std::pair<int, std::string> launches[] = {{1, ""},
                                                    {2, "parallel.tp=2"},
                                                    {4, "parallel.tp=4"},
                                                    {2, ""},
                                                    {4, "parallel.tp=2"},
                                                    {4, "parallel.pp=2 parallel.tp=2"},
                                                    {2, "parallel.pp=2 parallel.vpp=2 train.grad_accum=2"}};
    std::vector<std::string> printed;
    for (const auto& [ranks, layout] : launches) {
        SCOPED_TRACE(std::to_string(ranks) + " ranks " + layout);
        Outcome eval = run(mpirun(ranks) + tpsp_binary + " eval " + tiny + " train.batch_size=8 train.seq_len=64 " +
                               "train.threads=1 checkpoint.init=" + (dir / "ckpt" / "model_00000004.bin").string() +
                               " --hellaswag " + hellaswag.string() + " " + layout,
                           dir);
        ASSERT_EQ(eval.exit_code, 0) << eval.err;
        ASSERT_EQ(eval.out.rfind("hellaswag: acc_norm ", 0), 0u) << eval.out;
        printed.push_back(eval.out);
    }
    for (size_t i = 1; i < printed.size(); i++) EXPECT_EQ(printed[i], printed[0]) << "launch " << i;
    const int right = std::stoi(printed[0].substr(std::string("hellaswag: acc_norm ").size()));
    EXPECT_NE(printed[0].find("/9 ("), std::string::npos) << printed[0];
    EXPECT_EQ(std::stof(in_training[0]), float(right) / 9.0f) << "training's score differs from eval's";
}
