// The whole model against PyTorch on the same weights and tokens (the file
// scripts/make_torch_reference.py writes), against finite differences with
// dropout on, and its activation arena against the formula of docs/design.md §2.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <vector>

#include "model/gpt.h"
#include "model/memory_report.h"
#include "model/sampler.h"
#include "tests/test_support.h"
#include "train/adamw.h"

using namespace tpsp;

namespace {

struct TorchReference {
    GPTConfig config;
    int B = 0, T = 0, steps = 0;
    double lr, beta1, beta2, eps, weight_decay;
    std::vector<int> inputs, targets;
    std::vector<float> params, logits, grads;
    double loss;
    std::vector<double> step_losses;
};

template <class T>
void read_exactly(FILE* f, T* data, size_t count) {
    ASSERT_EQ(std::fread(data, sizeof(T), count, f), count) << "reference file is truncated";
}

void load_reference(TorchReference& r) {
    const char* path = TPSP_TEST_DATA "/tiny_gpt2.bin";
    FILE* f = std::fopen(path, "rb");
    ASSERT_NE(f, nullptr) << path << ": missing; run /usr/bin/python3 scripts/make_torch_reference.py";
    int header[10];
    read_exactly(f, header, 10);
    ASSERT_EQ(header[0], 20241201) << "bad magic";
    r.config = {header[6], header[4], header[5], header[1], header[2], header[3]};
    r.B = header[7];
    r.T = header[8];
    r.steps = header[9];
    double hyper[5];
    read_exactly(f, hyper, 5);
    r.lr = hyper[0], r.beta1 = hyper[1], r.beta2 = hyper[2], r.eps = hyper[3], r.weight_decay = hyper[4];
    GPT probe(r.config, {r.B, r.T, 0.0f});
    size_t n = size_t(probe.num_parameters), tokens = size_t(r.B) * r.T;
    r.inputs.resize(tokens);
    r.targets.resize(tokens);
    r.params.resize(n);
    r.grads.resize(n);
    r.logits.resize(tokens * r.config.padded_vocab_size);
    r.step_losses.resize(size_t(r.steps));
    read_exactly(f, r.inputs.data(), tokens);
    read_exactly(f, r.targets.data(), tokens);
    read_exactly(f, r.params.data(), n);
    read_exactly(f, r.logits.data(), r.logits.size());
    read_exactly(f, &r.loss, 1);
    read_exactly(f, r.grads.data(), n);
    read_exactly(f, r.step_losses.data(), r.step_losses.size());
    std::fclose(f);
}

}  // namespace

TEST(ModelVsTorch, LossLogitsAndEveryGradient) {
    TorchReference ref;
    load_reference(ref);
    if (HasFatalFailure()) return;
    GPT model(ref.config, {ref.B, ref.T, 0.0f});
    std::memcpy(model.params.wte, ref.params.data(), ref.params.size() * 4);
    const int N = ref.B * ref.T;
    model.zero_grad();
    float loss = model.forward(ref.inputs.data(), ref.targets.data(), {});
    EXPECT_NEAR(loss, ref.loss, 1e-5 * ref.loss);
    // tpsp's logits are sequence-major [T, B, Vp], PyTorch's [B, T, Vp]
    const int Vp = ref.config.padded_vocab_size;
    std::vector<float> logits(ref.logits.size());
    for (int b = 0; b < ref.B; b++)
        for (int t = 0; t < ref.T; t++)
            std::memcpy(&logits[(size_t(b) * ref.T + t) * Vp], model.outside.logits + (size_t(t) * ref.B + b) * Vp,
                        sizeof(float) * Vp);
    EXPECT_LT(tpsp::testing::relative_error(logits.data(), ref.logits.data(), int64_t(ref.logits.size())), 1e-5);
    model.backward(1.0f / N);
    model.finish_grads();
    int64_t at = 0;
    for (const TensorSpec& t : model.parameter_specs) {
        double err = tpsp::testing::relative_error(model.grads.wte + at, ref.grads.data() + at, t.elements());
        EXPECT_LT(err, 1e-4) << "gradient of " << t.name;
        at += t.elements();
    }
}

TEST(ModelVsTorch, TenAdamWSteps) {
    TorchReference ref;
    load_reference(ref);
    if (HasFatalFailure()) return;
    GPT model(ref.config, {ref.B, ref.T, 0.0f});
    std::memcpy(model.params.wte, ref.params.data(), ref.params.size() * 4);
    AdamW opt(model, {float(ref.beta1), float(ref.beta2), float(ref.eps), float(ref.weight_decay), false});
    const int N = ref.B * ref.T;
    for (int step = 0; step < ref.steps; step++) {
        model.zero_grad();
        float loss = model.forward(ref.inputs.data(), ref.targets.data(), {});
        EXPECT_NEAR(loss, ref.step_losses[step], 1e-4 * ref.step_losses[step]) << "step " << step;
        model.backward(1.0f / N);
        model.finish_grads();
        opt.update(model, float(ref.lr), 1.0f, step + 1);
    }
}

// ----------------------------------------------------------------------------

namespace {
GPTConfig small_config() {
    GPTConfig c;
    c.max_seq_len = 9;
    c.vocab_size = 23;
    c.padded_vocab_size = 32;
    c.num_layers = 2;
    c.num_heads = 3;
    c.channels = 24;
    return c;
}
std::vector<int> tokens_for(const GPTConfig& c, int n, uint32_t seed) {
    return tpsp::testing::random_tokens(n, c.vocab_size, seed);
}
}  // namespace

TEST(Model, BackwardWithDropoutMatchesFiniteDifferencesWithMasksHeldFixed) {
    GPTConfig c = small_config();
    RunShape shape{2, 7, 0.2f};
    GPT model(c, shape);
    model.init_random(5);
    // larger weights than GPT-2's init, so that every path carries gradient
    for (int64_t i = 0; i < model.num_parameters; i++) model.params.wte[i] *= 2.0f;
    const int N = shape.batch * shape.seq_len;
    std::vector<int> tokens = tokens_for(c, N, 77);
    const int* inputs = tokens.data();
    const int* targets = tokens.data() + 1;
    DropoutStep draw{11, 3, 0};  // the same draw every time: the masks stay fixed
    model.zero_grad();
    model.forward(inputs, targets, draw);
    model.backward(1.0f / N);
    model.finish_grads();
    std::vector<float> analytic(model.grads.wte, model.grads.wte + model.num_parameters);
    auto loss = [&] { return double(model.forward(inputs, targets, draw)); };
    int64_t at = 0;
    for (const TensorSpec& t : model.parameter_specs) {
        double err = tpsp::testing::gradient_error(loss, model.params.wte + at, analytic.data() + at, t.elements(),
                                                   3e-3f, 40);
        // the padded wte rows and wpe rows past s get no gradient: the check still holds (0 = 0)
        EXPECT_LT(err, 1e-2) << "parameter " << t.name;
        at += t.elements();
    }
}

TEST(Model, SameSeedAndStepDrawSameLossesAndOtherStepsDoNot) {
    GPTConfig c = small_config();
    RunShape shape{2, 7, 0.3f};
    GPT a(c, shape), b(c, shape);
    a.init_random(1);
    b.init_random(1);
    std::vector<int> tokens = tokens_for(c, 14, 3);
    float la = a.forward(tokens.data(), tokens.data() + 1, {9, 4, 0});
    float lb = b.forward(tokens.data(), tokens.data() + 1, {9, 4, 0});
    EXPECT_EQ(la, lb);
    EXPECT_EQ(
        0, std::memcmp(a.blocks[1].attn_dropout_mask, b.blocks[1].attn_dropout_mask, size_t(2) * c.num_heads * 7 * 7));
    float other = b.forward(tokens.data(), tokens.data() + 1, {9, 5, 0});
    EXPECT_NE(la, other);
    float eval = b.forward(tokens.data(), tokens.data() + 1, {9, 5, 0}, false);
    GPT plain(c, {2, 7, 0.0f});
    plain.init_random(1);
    EXPECT_EQ(eval, plain.forward(tokens.data(), tokens.data() + 1, {}));
}

// ----------------------------------------------------------------------------
// memory

TEST(Memory, ArenaEqualsTheFormulaExactly) {
    struct Case {
        int L, a, h, b, s;
    };
    for (Case k : {Case{2, 4, 64, 2, 32}, Case{3, 3, 48, 3, 37}, Case{1, 12, 96, 1, 100}}) {
        SCOPED_TRACE("b=" + std::to_string(k.b) + " s=" + std::to_string(k.s));
        GPTConfig c;
        c.num_layers = k.L, c.num_heads = k.a, c.channels = k.h, c.max_seq_len = k.s;
        c.vocab_size = 50, c.padded_vocab_size = 64;
        RunShape shape{k.b, k.s, 0.1f};
        GPT model(c, shape);
        int64_t per_block = block_activation_formula_bytes(k.b, k.s, k.h, k.a, 4, 1, true);
        MemoryReport report = memory_report(c, shape, {}, Device::cpu);
        EXPECT_EQ(report.block_bytes, per_block);
        // the arena holds L blocks of exactly that, plus the tensors outside the blocks
        int64_t outside = int64_t(k.b) * k.s * (k.h * (1 + 4 + 4) + 4 * c.padded_vocab_size + 8);
        EXPECT_EQ(int64_t(model.activation_arena.bytes()), k.L * per_block + outside);
        EXPECT_EQ(report.outside_bytes, outside);
    }
}

TEST(Memory, SelectiveRecomputationKeepsNoScoresAndHoldsOneSetInTheWorkspace) {
    // per block: 34sbh/t (TP+SP), sbh(10 + 24/t) (TP only), 34sbh (t = 1) with e = 2; the
    // workspace grows by one block's S', mask and S, b·a·s²·(2e + 1)/t, whatever L is
    GPTConfig c;
    c.num_layers = 3, c.num_heads = 8, c.channels = 64, c.max_seq_len = 48, c.vocab_size = 50, c.padded_vocab_size = 64;
    const int64_t b = 3, s = 48, h = 64, a = 8;
    RunShape none{int(b), int(s), 0.1f}, selective = none;
    selective.recompute = Recompute::selective;
    for (Device device : {Device::cpu, Device::cuda}) {
        const int64_t e = device == Device::cuda ? 2 : 4;
        for (int64_t t : {1, 2, 4}) {
            for (bool sp : {true, false}) {
                const TensorParallelism tp{int(t), 0, sp, {}};
                MemoryReport kept = memory_report(c, none, tp, device),
                             recomputed = memory_report(c, selective, tp, device);
                const int64_t sbh = s * b * h;
                const int64_t expected = e == 2 ? (t == 1 ? 34 * sbh
                                                   : sp   ? 34 * sbh / t
                                                          : sbh * 10 + 24 * sbh / t)
                                                : (t == 1 || sp ? sbh * 66 / t : sbh * 18 + 48 * sbh / t);
                EXPECT_EQ(recomputed.block_bytes, expected) << "e=" << e << " t=" << t << " sp=" << sp;
                EXPECT_EQ(recomputed.block_bytes, recomputed.block_formula_bytes);
                EXPECT_EQ(kept.block_bytes - recomputed.block_bytes, b * a * s * s * (2 * e + 1) / t);
                EXPECT_EQ(recomputed.workspace_bytes - kept.workspace_bytes, b * a * s * s * (2 * e + 1) / t);
            }
        }
    }
    GPT model(c, selective);  // the arena itself: L blocks of the formula and the outside tensors
    EXPECT_EQ(int64_t(model.activation_arena.bytes()),
              c.num_layers * block_activation_formula_bytes(b, s, h, a, 4, 1, true, c.attention, Recompute::selective) +
                  memory_report(c, selective, {}, Device::cpu).outside_bytes);
}

TEST(Memory, CudaTablesAreThePapersFormulaWithBf16) {
    // the CUDA model's tables (bf16, e = 2) are Korthikanti et al.'s
    // sbh(34/t + 5as/(ht)) under SP, sbh(10 + 24/t + 5as/(ht)) without, 34sbh + 5as²b at t = 1
    GPTConfig c;
    c.num_layers = 2, c.num_heads = 8, c.channels = 64, c.max_seq_len = 48, c.vocab_size = 50, c.padded_vocab_size = 64;
    const int64_t b = 3, s = 48, h = 64, a = 8;
    RunShape shape{int(b), int(s), 0.1f};
    for (int64_t t : {1, 2, 4}) {
        for (bool sp : {true, false}) {
            MemoryReport report = memory_report(c, shape, {int(t), 0, sp, {}}, Device::cuda);
            int64_t paper = t == 1 ? 34 * s * b * h + 5 * a * s * s * b
                            : sp   ? s * b * h * 34 / t + 5 * a * s * s * b / t
                                   : s * b * h * 10 + s * b * h * 24 / t + 5 * a * s * s * b / t;
            EXPECT_EQ(report.block_bytes, paper) << "t=" << t << (sp ? " TP+SP" : " TP only");
            EXPECT_EQ(report.block_bytes, block_activation_formula_bytes(b, s, h, a, 2, t, sp || t == 1));
            EXPECT_NE(report.text.find("bf16 activations (e=2)"), std::string::npos);
        }
    }
}

TEST(Memory, CudnnAttentionKeepsOnlyTheSoftmaxStatistics) {
    // model.attention: cudnn drops S', its mask and S (the 5as²b/t term) for
    // fp32 row statistics [b, a/t, s]: 34sbh/t + 4·a·s·b/t under SP
    GPTConfig c;
    c.num_layers = 2, c.num_heads = 8, c.channels = 64, c.max_seq_len = 48, c.vocab_size = 50, c.padded_vocab_size = 64;
    c.attention = AttentionKernel::cudnn_fused;
    const int64_t b = 3, s = 48, h = 64, a = 8;
    RunShape shape{int(b), int(s), 0.1f};
    for (int64_t t : {1, 2, 4}) {
        for (bool sp : {true, false}) {
            MemoryReport report = memory_report(c, shape, {int(t), 0, sp, {}}, Device::cuda);
            int64_t expected = (t == 1 || sp ? 34 * s * b * h / t : s * b * h * 10 + s * b * h * 24 / t) +
                               4 * a * s * b / t;
            EXPECT_EQ(report.block_bytes, expected) << "t=" << t << (sp ? " TP+SP" : " TP only");
            EXPECT_EQ(report.block_bytes,
                      block_activation_formula_bytes(b, s, h, a, 2, t, sp || t == 1, AttentionKernel::cudnn_fused));
            EXPECT_EQ(report.text.find("softmax_out"), std::string::npos);
            EXPECT_NE(report.text.find("softmax_stats"), std::string::npos);
            EXPECT_NE(report.text.find("4·b·a·s"), std::string::npos);
        }
    }
    EXPECT_THROW(memory_report(c, shape, {}, Device::cpu), std::invalid_argument);
}

TEST(Memory, EveryRanksTableEqualsItsModesFormula) {
    GPTConfig c;
    c.num_layers = 2, c.num_heads = 8, c.channels = 64, c.max_seq_len = 36, c.vocab_size = 50, c.padded_vocab_size = 64;
    RunShape shape{3, 36, 0.1f};
    for (int t : {1, 2, 4}) {
        for (bool sp : {true, false}) {
            MemoryReport report = memory_report(c, shape, {t, 0, sp, {}}, Device::cpu);
            int64_t formula = block_activation_formula_bytes(3, 36, 64, 8, 4, t, sp || t == 1);
            EXPECT_EQ(report.block_bytes, formula) << "t=" << t << (sp ? " TP+SP" : " TP only");
        }
    }
    // SP divides the (4e + 2)·b·s·h that TP alone keeps whole
    int64_t tp_only = block_activation_formula_bytes(3, 36, 64, 8, 4, 4, false);
    int64_t tp_sp = block_activation_formula_bytes(3, 36, 64, 8, 4, 4, true);
    EXPECT_EQ(tp_only - tp_sp, int64_t(3) * 36 * 64 * 18 * 3 / 4);
}

// Context parallelism (§9): a rank's tables are its s/cp positions and its
// a/(t·cp) heads over every position, so every formula is the paper's
// divided by cp: (34·s·b·h/t + 5·a·s²·b/t) / cp at e = 2 with TP+SP. On shapes
// no config ships, every recompute mode, dropout on and off, SP and TP-only,
// both dtypes; the tables are the ones the model allocates from.
TEST(Memory, UnderContextParallelismEveryTableIsTheFormulaDividedByCp) {
    GPTConfig c;
    c.num_layers = 3, c.num_heads = 8, c.channels = 64, c.max_seq_len = 96, c.vocab_size = 50, c.padded_vocab_size = 64;
    for (Device device : {Device::cpu, Device::cuda})
        for (int cp : {1, 2, 4})
            for (int t : {1, 2})
                for (bool sp : {true, false})
                    for (Recompute recompute : {Recompute::none, Recompute::selective, Recompute::full})
                        for (float p : {0.0f, 0.1f}) {
                            SCOPED_TRACE("cp=" + std::to_string(cp) + " t=" + std::to_string(t) +
                                         " sp=" + std::to_string(sp) + " p=" + std::to_string(p) + " " +
                                         recompute_description(RunShape{2, 96, p, recompute}) +
                                         (device == Device::cuda ? " cuda" : " cpu"));
                            const RunShape shape{2, 96, p, recompute};
                            const TensorParallelism tp{t, 0, sp, {}};
                            const MemoryReport whole = memory_report(c, shape, tp, device);
                            const MemoryReport rank = memory_report(c, shape, tp, device, {cp, 0});
                            EXPECT_TRUE(rank.equal());
                            EXPECT_EQ(rank.block_bytes * cp, whole.block_bytes);
                            EXPECT_EQ(rank.blocks_bytes * cp, whole.blocks_bytes);
                            EXPECT_EQ(rank.recompute_bytes * cp, whole.recompute_bytes);
                        }
    // the paper's form, e = 2, TP+SP, t = 2, cp = 4
    const int64_t s = 96, b = 2, h = 64, a = 8, t = 2, cp = 4;
    EXPECT_EQ(memory_report(c, RunShape{2, 96, 0.1f}, {2, 0, true, {}}, Device::cuda, {4, 0}).block_bytes,
              (34 * s * b * h / t + 5 * a * s * s * b / t) / cp);
}

// Every recompute mode with dropout and without, at t = 1, 2, 4 with SP and
// without, for the CPU's tables (e = 4) and the CUDA backend's (e = 2): each
// table equals its formula; a few closed forms besides, written out here.
TEST(Memory, EveryRecomputeModeWithAndWithoutDropoutEqualsItsFormula) {
    GPTConfig c;
    c.num_layers = 3, c.num_heads = 8, c.channels = 64, c.max_seq_len = 48, c.vocab_size = 50, c.padded_vocab_size = 64;
    const int64_t b = 3, s = 48, h = 64, a = 8, L = 3;
    struct Mode {
        Recompute recompute;
        RecomputeMethod method;
        int layers;
    };
    const Mode modes[] = {{Recompute::none, RecomputeMethod::uniform, 1},
                          {Recompute::selective, RecomputeMethod::uniform, 1},
                          {Recompute::full, RecomputeMethod::uniform, 1},
                          {Recompute::full, RecomputeMethod::uniform, 2},
                          {Recompute::full, RecomputeMethod::block, 2}};
    for (Device device : {Device::cpu, Device::cuda}) {
        const int64_t e = device == Device::cuda ? 2 : 4;
        for (int64_t t : {1, 2, 4}) {
            for (bool sp : {true, false}) {
                for (float p : {0.0f, 0.1f}) {
                    for (const Mode& mode : modes) {
                        RunShape run{int(b), int(s), p, mode.recompute, mode.method, mode.layers};
                        const TensorParallelism tp{int(t), 0, sp, {}};
                        const MemoryReport m = memory_report(c, run, tp, device);
                        SCOPED_TRACE("e=" + std::to_string(e) + " t=" + std::to_string(t) + " sp=" +
                                     std::to_string(sp) + " p=" + std::to_string(p) + " " + recompute_description(run));
                        EXPECT_TRUE(m.equal()) << m.text;
                        const int64_t rows = (sp || t == 1) ? s / t : s, input = rows * b * h * e;
                        const bool full = mode.recompute == Recompute::full;
                        const bool uniform = mode.method == RecomputeMethod::uniform;
                        if (p == 0.0f && mode.recompute == Recompute::none && t == 1) {  // the form at p = 0
                            EXPECT_EQ(m.block_bytes, b * s * h * 16 * e + b * a * s * s * e);
                        }
                        if (full && uniform && mode.layers == 1) {  // L inputs, one table recomputed
                            EXPECT_EQ(m.blocks_bytes, L * input);
                            EXPECT_EQ(m.recompute_bytes, m.block_bytes - input);
                        }
                        if (full && uniform && mode.layers == 2) {  // runs 0-1 and 2: two inputs, two tables
                            EXPECT_EQ(m.blocks_bytes, 2 * input);
                            EXPECT_EQ(m.recompute_bytes, 2 * m.block_bytes - input);
                        }
                        if (full && !uniform) {  // blocks 0 and 1 recomputed, block 2 keeps its table
                            EXPECT_EQ(m.blocks_bytes, 2 * input + m.block_bytes);
                        }
                        if (mode.recompute == Recompute::selective) {
                            EXPECT_EQ(m.recompute_bytes, b * a * s * s * (p > 0 ? 2 * e + 1 : e) / t);
                        }
                        if (p == 0.0f) {
                            EXPECT_EQ(m.text.find("mask"), std::string::npos);
                        }
                    }
                }
            }
        }
    }
    // the CPU model's own arenas (t = 1): what it keeps, and what recomputation adds to its workspace
    for (float p : {0.0f, 0.1f}) {
        RunShape none{int(b), int(s), p};
        GPT kept(c, none);
        for (const Mode& mode : modes) {
            RunShape run{int(b), int(s), p, mode.recompute, mode.method, mode.layers};
            GPT model(c, run);
            const MemoryReport m = memory_report(c, run, {}, Device::cpu);
            EXPECT_EQ(int64_t(model.activation_arena.bytes()), m.blocks_formula_bytes + m.outside_bytes);
            EXPECT_EQ(int64_t(model.workspace_arena.bytes() - kept.workspace_arena.bytes()), m.recompute_formula_bytes);
        }
    }
}

TEST(Memory, RecomputeLayersOutsideOneToLIsRefused) {
    GPTConfig c = small_config();
    EXPECT_THROW(GPT(c, RunShape{2, 7, 0.1f, Recompute::full, RecomputeMethod::uniform, 0}), std::invalid_argument);
    EXPECT_THROW(GPT(c, RunShape{2, 7, 0.1f, Recompute::full, RecomputeMethod::block, c.num_layers + 1}),
                 std::invalid_argument);
}

static void expect_backward_reads_nothing_forward_left_in_the_workspace(const GPTConfig& c, const RunShape& shape,
                                                                        const std::vector<int>& tokens) {
    SCOPED_TRACE("dropout " + std::to_string(shape.dropout) + ", recompute " + recompute_description(shape));
    const int N = shape.batch * shape.seq_len;
    std::vector<float> clean, poisoned;
    for (bool poison : {false, true}) {
        GPT model(c, shape);
        model.init_random(2);
        model.zero_grad();
        model.forward(tokens.data(), tokens.data() + 1, {1, 1, 0});
        if (poison) {
            float* w = static_cast<float*>(model.workspace_arena.data());
            for (size_t i = 0; i < model.workspace_arena.bytes() / 4; i++)
                w[i] = std::numeric_limits<float>::quiet_NaN();
        }
        model.backward(1.0f / N);
        model.finish_grads();
        (poison ? poisoned : clean).assign(model.grads.wte, model.grads.wte + model.num_parameters);
    }
    EXPECT_EQ(clean, poisoned);
}

TEST(Memory, NothingOutsideTheTableIsKeptAcrossForwardAndBackward) {
    // Poison the whole workspace between forward and backward: if backward
    // read anything forward left there, the gradients would change.
    // Under recomputation the workspace also holds what backward recomputes:
    // poisoned, it must be written again before it is read.
    GPTConfig c = small_config();
    const int N = 14;
    std::vector<int> tokens = tokens_for(c, N, 5);
    for (const RunShape& shape :
         {RunShape{2, 7, 0.1f}, RunShape{2, 7, 0.0f}, RunShape{2, 7, 0.1f, Recompute::selective},
          RunShape{2, 7, 0.1f, Recompute::full, RecomputeMethod::uniform, 2},
          RunShape{2, 7, 0.0f, Recompute::full, RecomputeMethod::block, 1}})
        expect_backward_reads_nothing_forward_left_in_the_workspace(c, shape, tokens);
}

// ----------------------------------------------------------------------------
// generation

TEST(Sampling, TheKvCacheGivesTheLogitsAndTokensOfRecomputingFromScratch) {
    GPTConfig c = small_config();  // maxT 9
    GPT weights(c, {1, 1, 0.0f});
    weights.init_random(21);
    for (int64_t i = 0; i < weights.num_parameters; i++) weights.params.wte[i] *= 4.0f;  // sharper distributions
    Generator cached(c, weights.params.wte);
    std::vector<int> tokens = {3};
    const float* logits = cached.step(tokens[0]);
    for (int position = 1; position < c.max_seq_len; position++) {
        // the whole prefix through the training forward pass, on the same weights
        GPT full(c, {1, position, 0.0f});
        std::memcpy(full.params.wte, weights.params.wte, size_t(weights.num_parameters) * 4);
        std::vector<int> targets(tokens.size(), 0);
        full.forward(tokens.data(), targets.data(), {}, false);
        const float* recomputed = full.outside.logits + size_t(position - 1) * c.padded_vocab_size;
        EXPECT_LT(tpsp::testing::relative_error(logits, recomputed, c.vocab_size), 1e-5) << "position " << position;
        float coin = 0.37f * float(position % 3);
        int next = sample_token(logits, c.vocab_size, 0.9f, 5, coin);
        EXPECT_EQ(next, sample_token(recomputed, c.vocab_size, 0.9f, 5, coin)) << "position " << position;
        tokens.push_back(next);
        logits = cached.step(next);
    }
    EXPECT_EQ(cached.position(), c.max_seq_len);
}

TEST(Sampling, TemperatureZeroIsArgmaxAndTopKStaysInTheTopK) {
    std::vector<float> logits = {0.1f, 2.0f, -1.0f, 1.5f, 0.0f};
    EXPECT_EQ(sample_token(logits.data(), 5, 0.0f, 0, 0.99f), 1);
    for (float coin : {0.0f, 0.3f, 0.6f, 0.999f}) {
        int t = sample_token(logits.data(), 5, 1.0f, 2, coin);
        EXPECT_TRUE(t == 1 || t == 3) << t;
    }
    EXPECT_EQ(sample_token(logits.data(), 5, 1.0f, 0, 0.0f), 1);  // the smallest coin takes the likeliest
}

// ----------------------------------------------------------------------------
// data parallelism's buckets and the distributed optimizer's memory (docs/design.md §8)

// Units of odd sizes, dp = 3: the buckets cover the buffer from its end, each
// of whole units of one tensor and at least bucket_size but a tensor's first;
// each is final at its latest unit's stage and read from its earliest; each
// bucket's dp pieces cover it
// once, in rank order; the padding is what the ⌈L/dp⌉ shards add.
TEST(DataParallel, BucketsCoverTheBufferFromItsEndAndTheirPiecesCoverEachBucketOnce) {
    // tensor 0 [0, 12) and 1 [12, 25) final at the end (stage 5); tensor 2 [25, 39) of 4 layers, final layer by layer
    // (forward reads tensors 0 and 1 first, stage 0, and tensor 2's layer l at stage l + 1)
    const std::vector<BucketUnit> units = {{7, 0, 5, 0}, {5, 0, 5, 0}, {13, 1, 5, 0}, {1, 2, 4, 1},
                                           {9, 2, 3, 2}, {2, 2, 2, 3}, {2, 2, 1, 4}};
    const BucketLayout layout(units, 10, 3);
    const std::vector<GradientBucket>& buckets = layout.buckets();
    ASSERT_EQ(buckets.size(), 4u);  // [26, 39) = 9 + 2 + 2, [25, 26) = 1 (its tensor's first), [12, 25), [0, 12)
    const std::vector<int64_t> begins = {26, 25, 12, 0};
    const std::vector<int> final_at = {3, 4, 5, 5}, needed_at = {2, 1, 0, 0};
    int64_t end = 39, padded = 0;
    for (size_t b = 0; b < buckets.size(); b++) {
        EXPECT_EQ(buckets[b].end, end);
        EXPECT_EQ(buckets[b].begin, begins[b]);
        EXPECT_EQ(buckets[b].final_at, final_at[b]) << "bucket " << b;
        EXPECT_EQ(buckets[b].needed_at, needed_at[b]) << "bucket " << b;
        if (b != 1) {
            EXPECT_GE(buckets[b].end - buckets[b].begin, 10);
        }
        int64_t at = buckets[b].begin;
        for (int q = 0; q < 3; q++) {
            const FlatRange p = layout.piece(b, q);
            EXPECT_EQ(p.begin, at) << "bucket " << b << " rank " << q;
            EXPECT_LE(p.count, buckets[b].shard);
            at += p.count;
        }
        EXPECT_EQ(at, buckets[b].end);
        padded += 3 * buckets[b].shard;
        end = buckets[b].begin;
    }
    EXPECT_EQ(end, 0);
    EXPECT_EQ(layout.padding(), padded - 39);
    EXPECT_GT(layout.padding(), 0);
    EXPECT_EQ(layout.shard_elements() * 3, padded);
}

// The distributed optimizer's arena on each of d ranks is the formula's
// 8·(N + padding)/d bytes, the plain one's 8N, beside 4N of parameters and
// 4N of gradients: Megatron's 16 → 8 + 8/d bytes per parameter.
TEST(DataParallel, TheOptimizerArenaOfEveryRankEqualsTheFormula) {
    GPTConfig c;
    c.num_layers = 3, c.num_heads = 3, c.channels = 48, c.max_seq_len = 37;
    c.vocab_size = 50, c.padded_vocab_size = 61;  // odd sizes: the shards need padding
    GPT model(c, RunShape{1, 37, 0.0f});
    const int64_t n = model.num_parameters;
    bool padded_somewhere = false;
    for (int dp : {1, 2, 3, 4, 7}) {
        SCOPED_TRACE("d=" + std::to_string(dp));
        const BucketLayout layout(bucket_units(model.parameter_specs), 2000, dp);
        const ModelStateBytes formula = model_state_bytes(c, 1, 2000, dp, true);
        EXPECT_EQ(formula.parameters, 4 * n);
        EXPECT_EQ(int64_t(model.param_arena.bytes()), formula.parameters);
        EXPECT_EQ(int64_t(model.grad_arena.bytes()), formula.gradients);
        EXPECT_EQ(formula.optimizer * dp, 8 * (n + formula.padding));
        for (int rank = 0; rank < dp; rank++) {
            AdamW sharded(model, {}, &layout, rank);
            EXPECT_EQ(int64_t(sharded.bytes()), formula.optimizer) << "rank " << rank;
        }
        AdamW plain(model, {});
        EXPECT_EQ(int64_t(plain.bytes()), model_state_bytes(c, 1, 2000, dp, false).optimizer);
        EXPECT_EQ(int64_t(plain.bytes()), 8 * n);
        padded_somewhere = padded_somewhere || formula.padding > 0;
    }
    EXPECT_TRUE(padded_somewhere) << "no d needed padding: the case proves less than it says";
}
