// Every kernel's backward against central finite differences, on shapes
// that are not powers of two; Philox against its published test vectors;
// dropout's masks and keep rate.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>

#include "model/kernels/cpu_kernels.h"
#include "model/kernels/philox.h"
#include "tests/test_support.h"

using namespace tpsp;
using namespace tpsp::testing;

namespace {
constexpr int B = 2, T = 7, C = 12, NH = 3;
constexpr int N = B * T;
constexpr double tolerance = 2e-3;
}  // namespace

TEST(Philox, MatchesRandom123KnownAnswers) {
    // kat_vectors of Random123: philox4x32 with 10 rounds
    EXPECT_EQ(philox4x32_10({0, 0, 0, 0}, {0, 0}), (PhiloxCounter{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}));
    EXPECT_EQ(philox4x32_10({~0u, ~0u, ~0u, ~0u}, {~0u, ~0u}),
              (PhiloxCounter{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}));
    EXPECT_EQ(philox4x32_10({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}, {0xa4093822u, 0x299f31d0u}),
              (PhiloxCounter{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}));
}

TEST(Kernels, LayerNormBackwardMatchesFiniteDifferences) {
    auto inp = random_vector(N * C, 1), weight = random_vector(C, 2), bias = random_vector(C, 3);
    auto dout = random_vector(N * C, 4);
    std::vector<float> out(N * C), dinp(N * C, 0.0f), dweight(C, 0.0f), dbias(C, 0.0f), scratch(2 * N);
    layernorm_backward(dinp.data(), dweight.data(), dbias.data(), dout.data(), inp.data(), weight.data(),
                       scratch.data(), N, C);
    auto loss = [&] {
        layernorm_forward(out.data(), inp.data(), weight.data(), bias.data(), N, C);
        return weighted_sum(out.data(), dout);
    };
    EXPECT_LT(gradient_error(loss, inp.data(), dinp.data(), N * C), tolerance);
    EXPECT_LT(gradient_error(loss, weight.data(), dweight.data(), C), tolerance);
    EXPECT_LT(gradient_error(loss, bias.data(), dbias.data(), C), tolerance);
}

TEST(Kernels, LayerNormBackwardAccumulatesIntoDinp) {
    auto inp = random_vector(N * C, 1), weight = random_vector(C, 2), dout = random_vector(N * C, 4);
    std::vector<float> once(N * C, 0.0f), twice(N * C, 0.0f), dw(C), db(C), scratch(2 * N);
    layernorm_backward(once.data(), dw.data(), db.data(), dout.data(), inp.data(), weight.data(), scratch.data(), N, C);
    layernorm_backward(twice.data(), dw.data(), db.data(), dout.data(), inp.data(), weight.data(), scratch.data(), N,
                       C);
    layernorm_backward(twice.data(), dw.data(), db.data(), dout.data(), inp.data(), weight.data(), scratch.data(), N,
                       C);
    for (int i = 0; i < N * C; i++) EXPECT_NEAR(twice[i], 2 * once[i], 1e-5f * (1 + std::fabs(once[i])));
}

TEST(Kernels, MatmulBackwardMatchesFiniteDifferences) {
    constexpr int OC = 10;
    auto inp = random_vector(N * C, 5), weight = random_vector(OC * C, 6), bias = random_vector(OC, 7);
    auto dout = random_vector(N * OC, 8);
    std::vector<float> out(N * OC), dinp(N * C, 7.0f), dweight(OC * C, 0.0f), dbias(OC, 0.0f);
    matmul_backward(dinp.data(), dweight.data(), dbias.data(), dout.data(), inp.data(), weight.data(), N, C, OC);
    auto loss = [&] {
        matmul_forward(out.data(), inp.data(), weight.data(), bias.data(), N, C, OC);
        return weighted_sum(out.data(), dout);
    };
    EXPECT_LT(gradient_error(loss, inp.data(), dinp.data(), N * C), tolerance);
    EXPECT_LT(gradient_error(loss, weight.data(), dweight.data(), OC * C), tolerance);
    EXPECT_LT(gradient_error(loss, bias.data(), dbias.data(), OC), tolerance);
}

// Both ways matmul_forward runs: the library threading the whole GEMM (rows
// ≥ output columns) and one block of columns per thread (fewer rows), with
// widths that are no multiple of the 16-column blocks and thread counts
// that leave a thread without a block.
TEST(Kernels, MatmulForwardIsThePlainProductWithAndWithoutBias) {
    const int threads_before = omp_get_max_threads();
    for (int threads : {1, 2, 3, 4})
        for (auto [rows, OC] : {std::pair{N, 5}, std::pair{3, 10}, std::pair{3, 50}, std::pair{2, 97}}) {
            omp_set_num_threads(threads);
            auto inp = random_vector(rows * C, 9), weight = random_vector(OC * C, 10), bias = random_vector(OC, 11);
            for (bool with_bias : {false, true}) {
                std::vector<float> out(rows * OC, 99.0f);
                matmul_forward(out.data(), inp.data(), weight.data(), with_bias ? bias.data() : nullptr, rows, C, OC);
                for (int n = 0; n < rows; n++)
                    for (int o = 0; o < OC; o++) {
                        double ref = with_bias ? bias[o] : 0.0;
                        for (int c = 0; c < C; c++) ref += double(inp[n * C + c]) * weight[o * C + c];
                        ASSERT_NEAR(out[n * OC + o], ref, 1e-4)
                            << threads << " threads, " << rows << "×" << OC << (with_bias ? " with bias" : "");
                    }
            }
        }
    omp_set_num_threads(threads_before);
}

TEST(Kernels, GeluBackwardMatchesFiniteDifferences) {
    auto inp = random_vector(N * C, 11, 2.0f), dout = random_vector(N * C, 12);
    std::vector<float> out(N * C), dinp(N * C);
    gelu_backward(dinp.data(), inp.data(), dout.data(), N * C);
    auto loss = [&] {
        gelu_forward(out.data(), inp.data(), N * C);
        return weighted_sum(out.data(), dout);
    };
    EXPECT_LT(gradient_error(loss, inp.data(), dinp.data(), N * C), tolerance);
    // the tanh approximation itself, at one point: gelu(1) = 0.841192
    float one = 1.0f, g;
    gelu_forward(&g, &one, 1);
    EXPECT_NEAR(g, 0.8411920f, 1e-6f);
}

TEST(Kernels, EmbeddingBackwardMatchesFiniteDifferences) {
    constexpr int V = 11, maxT = 9;
    std::vector<int> tokens = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7};  // repeats on purpose
    auto wte = random_vector(V * C, 13), wpe = random_vector(maxT * C, 14), dout = random_vector(N * C, 15);
    std::vector<float> out(N * C), dwte(V * C, 0.0f), dwpe(maxT * C, 0.0f);
    token_embedding_backward(dwte.data(), dout.data(), tokens.data(), 0, V, B, T, C);
    position_embedding_backward(dwpe.data(), dout.data(), 0, T, B, C);
    auto loss = [&] {
        token_embedding_forward(out.data(), tokens.data(), wte.data(), 0, V, B, T, C);
        position_embedding_forward(out.data(), wpe.data(), 0, T, B, C);
        return weighted_sum(out.data(), dout);
    };
    EXPECT_LT(gradient_error(loss, wte.data(), dwte.data(), V * C), tolerance);
    EXPECT_LT(gradient_error(loss, wpe.data(), dwpe.data(), maxT * C), tolerance);
}

TEST(Kernels, VocabularyShardsOfTheEmbeddingSumToTheWhole) {
    constexpr int V = 12;
    std::vector<int> tokens = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 11, 7};
    auto wte = random_vector(V * C, 23);
    std::vector<float> whole(N * C), sum(N * C, 0.0f), part(N * C);
    token_embedding_forward(whole.data(), tokens.data(), wte.data(), 0, V, B, T, C);
    for (int r = 0; r < 3; r++) {  // three ranks of 4 rows each
        token_embedding_forward(part.data(), tokens.data(), wte.data() + r * 4 * C, r * 4, 4, B, T, C);
        for (int i = 0; i < N * C; i++) sum[i] += part[i];
    }
    EXPECT_EQ(sum, whole);
}

// The cross-entropy of a vocabulary shard, combined as the model combines it
// over ranks (max, then sums); here for one rank holding everything.
static double crossentropy_mean(const std::vector<float>& logits, const std::vector<int>& targets,
                                std::vector<float>& lse, int V, int Vp) {
    std::vector<float> maxes(N), stats(2 * N);
    crossentropy_max_forward(maxes.data(), logits.data(), N, V, Vp);
    crossentropy_sum_forward(stats.data(), logits.data(), maxes.data(), targets.data(), 0, N, V, Vp);
    double sum = 0;
    for (int n = 0; n < N; n++) {
        lse[n] = maxes[n] + std::log(stats[n]);
        sum += lse[n] - stats[N + n];
    }
    return sum / N;
}

TEST(Kernels, CrossEntropyBackwardMatchesFiniteDifferences) {
    constexpr int V = 11, Vp = 16;
    std::vector<int> targets = {0, 10, 3, 4, 7, 7, 1, 2, 9, 8, 6, 5, 0, 10};
    auto logits = random_vector(N * Vp, 16, 2.0f);
    std::vector<float> lse(N);
    auto loss = [&] { return crossentropy_mean(logits, targets, lse, V, Vp); };
    loss();
    std::vector<float> dlogits = logits;
    crossentropy_backward(dlogits.data(), lse.data(), targets.data(), 0, 1.0f / N, N, V, Vp);
    EXPECT_LT(gradient_error(loss, logits.data(), dlogits.data(), N * Vp), tolerance);
    for (int n = 0; n < N; n++)
        for (int v = V; v < Vp; v++) EXPECT_EQ(dlogits[n * Vp + v], 0.0f) << "padded column " << v;
}

TEST(Kernels, BiasBackwardMatchesFiniteDifferences) {
    constexpr int OC = 9;
    auto out0 = random_vector(N * OC, 24), bias = random_vector(OC, 25), dout = random_vector(N * OC, 26);
    std::vector<float> out(N * OC), dbias(OC, 0.0f);
    bias_backward(dbias.data(), dout.data(), N, OC);
    auto loss = [&] {
        out = out0;
        bias_forward(out.data(), bias.data(), N, OC);
        return weighted_sum(out.data(), dout);
    };
    EXPECT_LT(gradient_error(loss, bias.data(), dbias.data(), OC), tolerance);
}

static DropoutBox full_box(int64_t n0, int64_t n1, int64_t n2) { return {n0, n1, n2, n1 * n2, n2, 0, 0}; }

TEST(Kernels, DropoutBackwardMatchesFiniteDifferences) {
    const float p = 0.3f;
    DropoutKey key{42, 3, 1, DropoutSite::attention_proj};
    auto inp = random_vector(N * C, 17), dout = random_vector(N * C, 18);
    std::vector<float> out(N * C), dinp(N * C);
    std::vector<uint8_t> mask(N * C);
    auto loss = [&] {
        dropout_forward(out.data(), mask.data(), inp.data(), full_box(B, T, C), p, key);
        return weighted_sum(out.data(), dout);
    };
    loss();
    dropout_backward(dinp.data(), mask.data(), dout.data(), N * C, p);
    EXPECT_LT(gradient_error(loss, inp.data(), dinp.data(), N * C), tolerance);
}

static void attention_gradient_check(float p) {
    SCOPED_TRACE("dropout " + std::to_string(p));
    DropoutKey key{7, 2, 0, DropoutSite::attention_probs};
    DropoutBox box = full_box(B, NH, T * T);
    auto qkv = random_vector(N * 3 * C, 19), dout = random_vector(N * C, 20);
    std::vector<float> out(N * C), softmax_out(B * NH * T * T), dropped(B * NH * T * T), dqkv(N * 3 * C, 5.0f);
    std::vector<float> scratch(64 * T * T);
    std::vector<uint8_t> mask(B * NH * T * T);
    // at p = 0 a model keeps no mask and no S: the kernels take null for both
    uint8_t* mask_at = p > 0.0f ? mask.data() : nullptr;
    float* dropped_at = p > 0.0f ? dropped.data() : nullptr;
    auto loss = [&] {
        attention_forward(out.data(), softmax_out.data(), mask_at, dropped_at, qkv.data(), nullptr, B, T, C, NH, p, box,
                          key);
        return weighted_sum(out.data(), dout);
    };
    loss();
    attention_backward(dqkv.data(), dout.data(), qkv.data(), softmax_out.data(), mask_at, dropped_at, scratch.data(), B,
                       T, C, NH, p);
    EXPECT_LT(gradient_error(loss, qkv.data(), dqkv.data(), N * 3 * C, 1e-2f, 2000), tolerance);
    // causal: nothing above the diagonal, rows of S' sum to 1
    for (int r = 0; r < B * NH * T; r++) {
        int t = r % T;
        double sum = 0;
        for (int t2 = 0; t2 < T; t2++) {
            if (t2 > t) {
                EXPECT_EQ(softmax_out[r * T + t2], 0.0f);
            }
            sum += softmax_out[r * T + t2];
        }
        EXPECT_NEAR(sum, 1.0, 1e-5);
    }
}

TEST(Kernels, AttentionBackwardMatchesFiniteDifferences) { attention_gradient_check(0.0f); }
TEST(Kernels, AttentionBackwardWithDropoutMatchesFiniteDifferences) { attention_gradient_check(0.25f); }

// Ring attention's kernels (context parallelism's p2p) against the unsplit
// attention, every CP rank simulated here: rank r's rows of qkv are its two
// chunks of positions, the K|V blocks come in the ring's order (its own,
// then r − 1, r − 2, …), and the online softmax merges them. Rank 0's first
// chunk of queries meets no key of any other block (fully masked there), the
// causal pairs on the diagonal only partly. Out, S', the mask and S, dQ, and
// dK|dV summed over every rank's parts, against attention_forward/backward.
// `recompute`: backward rebuilds each pair's S', mask and S from the rows'
// log-sum-exp, as under selective recomputation.
static void ring_attention_check(int cp, float p, bool recompute) {
    SCOPED_TRACE("cp " + std::to_string(cp) + " dropout " + std::to_string(p) + (recompute ? " recomputed" : ""));
    constexpr int S = 12, RB = 2, RC = 8, RNH = 2;
    const int c = S / (2 * cp), T_loc = S / cp;
    const DropoutKey key{3, 1, 0, DropoutSite::attention_probs};
    auto qkv = random_vector(size_t(S) * RB * 3 * RC, 41, 2.0f), dout = random_vector(size_t(S) * RB * RC, 42);
    std::vector<float> out(size_t(S) * RB * RC), sp(size_t(RB) * RNH * S * S), sd(sp.size()), dqkv(qkv.size());
    std::vector<uint8_t> mask(sp.size());
    std::vector<float> scratch(size_t(omp_get_max_threads()) * S * S);
    attention_forward(out.data(), sp.data(), mask.data(), sd.data(), qkv.data(), nullptr, RB, S, RC, RNH, p,
                      full_box(RB, RNH, S * S), key);
    attention_backward(dqkv.data(), dout.data(), qkv.data(), sp.data(), mask.data(), sd.data(), scratch.data(), RB, S,
                       RC, RNH, p);
    const auto chunk_of = [&](int r, int half) { return half == 0 ? r : 2 * cp - 1 - r; };
    const auto global_row = [&](int r, int local) { return chunk_of(r, local / c) * c + local % c; };
    // each rank's rows of a [S, B, width] tensor, and back
    const auto rows_of = [&](const std::vector<float>& full, int r, int width, int offset, int full_width) {
        std::vector<float> local(size_t(T_loc) * RB * width);
        for (int i = 0; i < T_loc; i++)
            for (int b = 0; b < RB; b++)
                std::memcpy(&local[(size_t(i) * RB + b) * width],
                            &full[(size_t(global_row(r, i)) * RB + b) * full_width + offset], sizeof(float) * width);
        return local;
    };
    std::vector<float> dkv_sum(size_t(S) * RB * 2 * RC, 0.0f);  // every rank's dK|dV parts, by global position
    double worst_out = 0, worst_scores = 0, worst_dq = 0;
    int wrong_masks = 0;
    for (int r = 0; r < cp; r++) {
        const RingAttention ra{RB, T_loc, S, RC, RNH, c, {chunk_of(r, 0), chunk_of(r, 1)}, RNH, 0, 0};
        const std::vector<float> q = rows_of(qkv, r, 3 * RC, 0, 3 * RC), d = rows_of(dout, r, RC, 0, RC);
        std::vector<float> o(size_t(T_loc) * RB * RC), stats(2 * size_t(RB) * RNH * T_loc);
        std::vector<float> scores(size_t(RB) * 2 * RNH * c * S, -1.0f), dropped(scores.size());
        std::vector<uint8_t> m(scores.size());
        std::vector<float> lse(size_t(RB) * RNH * T_loc);
        ring_attention_start(o.data(), stats.data(), ra, scratch.data());
        for (int step = 0; step < cp; step++) {
            const int source = (r - step + cp) % cp;
            const std::vector<float> kv = rows_of(qkv, source, 2 * RC, RC, 3 * RC);
            const int chunks[2] = {chunk_of(source, 0), chunk_of(source, 1)};
            for (int b = 0; b < RB; b++)
                ring_attention_forward_block(o.data(), stats.data(), recompute ? nullptr : scores.data(), q.data(),
                                             kv.data(), chunks, ra, b, p, key, scratch.data());
        }
        ring_attention_finish(o.data(), recompute ? nullptr : scores.data(), m.data(), dropped.data(), lse.data(),
                              stats.data(), ra, p, key, scratch.data());
        const std::vector<float> expected_out = rows_of(out, r, RC, 0, RC);
        for (size_t i = 0; i < o.size(); i++)
            worst_out = std::max(worst_out, double(std::fabs(o[i] - expected_out[i])));
        for (int b = 0; b < RB && !recompute; b++)  // (selective recomputation keeps no S')
            for (int half = 0; half < 2; half++)
                for (int h = 0; h < RNH; h++)
                    for (int i = 0; i < c; i++) {
                        const size_t row = (((size_t(b) * 2 + half) * RNH + h) * c + i) * S;
                        const size_t one = ((size_t(b) * RNH + h) * S + chunk_of(r, half) * c + i) * S;
                        for (int k = 0; k < S; k++)
                            worst_scores = std::max(worst_scores, double(std::fabs(scores[row + k] - sp[one + k])));
                        if (p > 0.0f) wrong_masks += std::memcmp(&m[row], &mask[one], S) != 0;
                    }
        // backward: dQ here, each block's dK|dV part added at its positions
        std::vector<float> dq(q.size(), 7.0f), partial(size_t(T_loc) * RB * 2 * RC);
        ring_attention_backward_start(stats.data(), dq.data(), d.data(), o.data(), ra, scratch.data());
        for (int step = 0; step < cp; step++) {
            const int source = (r - step + cp) % cp;
            const std::vector<float> kv = rows_of(qkv, source, 2 * RC, RC, 3 * RC);
            const int chunks[2] = {chunk_of(source, 0), chunk_of(source, 1)};
            std::fill(partial.begin(), partial.end(), 0.0f);
            for (int b = 0; b < RB; b++)
                ring_attention_backward_block(dq.data(), partial.data(), d.data(), q.data(), kv.data(),
                                              recompute ? nullptr : scores.data(), m.data(), dropped.data(), lse.data(),
                                              stats.data(), chunks, ra, b, p, key, scratch.data());
            for (int i = 0; i < T_loc; i++)
                for (int b = 0; b < RB; b++)
                    for (int j = 0; j < 2 * RC; j++)
                        dkv_sum[(size_t(global_row(source, i)) * RB + b) * 2 * RC + j] +=
                            partial[(size_t(i) * RB + b) * 2 * RC + j];
        }
        ring_attention_backward_finish(dq.data(), scratch.data(), ra);
        const std::vector<float> expected_dq = rows_of(dqkv, r, RC, 0, 3 * RC);
        for (int i = 0; i < T_loc * RB; i++)
            for (int j = 0; j < RC; j++)
                worst_dq = std::max(worst_dq,
                                    double(std::fabs(dq[size_t(i) * 3 * RC + j] - expected_dq[size_t(i) * RC + j])));
    }
    double worst_dkv = 0;
    for (int n = 0; n < S * RB; n++)
        for (int j = 0; j < 2 * RC; j++)
            worst_dkv = std::max(
                worst_dkv, double(std::fabs(dkv_sum[size_t(n) * 2 * RC + j] - dqkv[size_t(n) * 3 * RC + RC + j])));
    EXPECT_LT(worst_out, 1e-5);
    EXPECT_LT(worst_scores, 1e-6);
    EXPECT_LT(worst_dq, 1e-5);
    EXPECT_LT(worst_dkv, 1e-5);
    EXPECT_EQ(wrong_masks, 0);
}

TEST(Kernels, RingAttentionsOnlineSoftmaxEqualsTheUnsplitAttention) {
    for (int cp : {1, 2, 3})
        for (float p : {0.0f, 0.2f})
            for (bool recompute : {false, true}) ring_attention_check(cp, p, recompute);
}

TEST(Kernels, ResidualForwardAdds) {
    auto a = random_vector(100, 21), b = random_vector(100, 22);
    std::vector<float> out(100);
    residual_forward(out.data(), a.data(), b.data(), 100);
    for (int i = 0; i < 100; i++) EXPECT_EQ(out[i], a[i] + b[i]);
}

// ----------------------------------------------------------------------------
// dropout masks

TEST(Dropout, SameKeyDrawsTheSameMaskAndOtherKeysDoNot) {
    const int n0 = 3, n1 = 17, n2 = 29;
    std::vector<float> inp(n0 * n1 * n2, 1.0f), out(inp.size());
    std::vector<uint8_t> first(inp.size()), again(inp.size()), other_step(inp.size()), other_site(inp.size());
    DropoutKey key{1234, 5, 2, DropoutSite::mlp_fc2};
    dropout_forward(out.data(), first.data(), inp.data(), full_box(n0, n1, n2), 0.5f, key);
    dropout_forward(out.data(), again.data(), inp.data(), full_box(n0, n1, n2), 0.5f, key);
    EXPECT_EQ(first, again);
    DropoutKey later = key;
    later.step = 6;
    dropout_forward(out.data(), other_step.data(), inp.data(), full_box(n0, n1, n2), 0.5f, later);
    EXPECT_NE(first, other_step);
    DropoutKey site = key;
    site.site = DropoutSite::attention_proj;
    dropout_forward(out.data(), other_site.data(), inp.data(), full_box(n0, n1, n2), 0.5f, site);
    EXPECT_NE(first, other_site);
}

TEST(Dropout, AShardDrawsTheSameMaskAsItsPlaceInTheWholeTensor) {
    // The global tensor is [b, s, h] = [2, 12, 10] in batch-major order. The
    // shard is what a rank holds under sequence parallelism: positions 4..6
    // of every sequence, stored sequence-major [3, b, h].
    const int b = 2, s = 12, h = 10, s0 = 4, sn = 3;
    DropoutKey key{99, 1, 0, DropoutSite::embedding};
    std::vector<float> whole_in(b * s * h, 1.0f), whole_out(whole_in.size());
    std::vector<uint8_t> whole_mask(whole_in.size());
    dropout_forward(whole_out.data(), whole_mask.data(), whole_in.data(), full_box(b, s, h), 0.4f, key);
    std::vector<float> shard_in(sn * b * h, 1.0f), shard_out(shard_in.size());
    std::vector<uint8_t> shard_mask(shard_in.size());
    DropoutBox shard{sn, b, h, h, int64_t(s) * h, s0, 0};
    dropout_forward(shard_out.data(), shard_mask.data(), shard_in.data(), shard, 0.4f, key);
    for (int t = 0; t < sn; t++)
        for (int i = 0; i < b; i++)
            for (int c = 0; c < h; c++)
                EXPECT_EQ(shard_mask[(t * b + i) * h + c], whole_mask[(i * s + s0 + t) * h + c]);
}

TEST(Dropout, KeepRateIsWithinThreeSigmaOfOneMinusP) {
    for (float p : {0.1f, 0.5f}) {
        const int64_t n = 1 << 20;
        std::vector<float> inp(n, 1.0f), out(n);
        std::vector<uint8_t> mask(n);
        dropout_forward(out.data(), mask.data(), inp.data(), full_box(1, 1024, 1024), p,
                        {3, 0, 0, DropoutSite::embedding});
        double kept = 0, sum = 0;
        for (int64_t i = 0; i < n; i++) {
            kept += mask[i];
            sum += out[i];
        }
        double sigma = std::sqrt(p * (1 - p) / n);
        EXPECT_NEAR(kept / n, 1 - p, 3 * sigma) << "p = " << p;
        EXPECT_NEAR(sum / n, 1.0, 3 * sigma / (1 - p)) << "inverted dropout keeps the mean";
    }
}
