// Every CUDA kernel, forward and backward, against its CPU twin on the same
// random inputs (rounded to bf16 first, so both sides see identical values),
// at bf16 tolerances; dropout masks bit-identical to the CPU's. Skipped, not
// failed, where no GPU is present.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "model/kernels/cpu_kernels.h"
#include "model/kernels/cuda_device.h"
#include "model/kernels/cuda_kernels.h"
#ifdef TPSP_WITH_CUDNN
#include <cudnn.h>

#include "model/kernels/cudnn_attention.h"
#endif
#include "tests/test_support.h"

using namespace tpsp;
using namespace tpsp::testing;
using gpu::DeviceBuffer;

namespace {

// Odd-sized where a kernel loops over rows or channels, multiples of 8 where
// a dimension is a GEMM's leading dimension (bf16 rows of 16 bytes).
constexpr int B = 3, T = 40, C = 48, NH = 4, OC = 40;
constexpr int N = B * T;
// ||gpu − cpu|| / ||cpu||: one bf16 rounding of each output is 2^-9 relative.
constexpr double bf16_tolerance = 1e-2;

std::vector<float> rounded_to_bf16(std::vector<float> v) {
    for (float& x : v) x = __bfloat162float(__float2bfloat16(x));
    return v;
}

std::vector<bf16> to_bf16(const std::vector<float>& v) {
    std::vector<bf16> out(v.size());
    for (size_t i = 0; i < v.size(); i++) out[i] = __float2bfloat16(v[i]);
    return out;
}

std::vector<float> to_float(const std::vector<bf16>& v) {
    std::vector<float> out(v.size());
    for (size_t i = 0; i < v.size(); i++) out[i] = __bfloat162float(v[i]);
    return out;
}

// Random values exactly representable in bf16.
std::vector<float> random_bf16_values(size_t n, uint32_t seed, float scale = 1.0f) {
    return rounded_to_bf16(random_vector(n, seed, scale));
}

double relative_error(const std::vector<float>& got, const std::vector<float>& want) {
    double diff = 0.0, norm = 0.0;
    for (size_t i = 0; i < want.size(); i++) {
        diff += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
        norm += double(want[i]) * want[i];
    }
    return std::sqrt(diff / std::max(norm, 1e-30));
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want, const std::string& what,
                  double tolerance = bf16_tolerance) {
    ASSERT_EQ(got.size(), want.size()) << what;
    EXPECT_LT(relative_error(got, want), tolerance) << what;
}

DropoutBox full_box(int64_t n0, int64_t n1, int64_t n2) { return {n0, n1, n2, n1 * n2, n2, 0, 0}; }

class CudaKernels : public ::testing::Test {
protected:
    void SetUp() override {
        if (gpu::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
        runtime_ = std::make_unique<gpu::GpuRuntime>(0);
    }
    void sync() const { runtime_->synchronize(); }
    // a device copy of v in bf16
    static DeviceBuffer<bf16> device_bf16(const std::vector<float>& v) { return DeviceBuffer<bf16>(to_bf16(v)); }
    std::vector<float> host_float(const DeviceBuffer<bf16>& d) const {
        sync();
        return to_float(d.download());
    }
    template <class T>
    std::vector<T> host(const DeviceBuffer<T>& d) const {
        sync();
        return d.download();
    }

private:
    std::unique_ptr<gpu::GpuRuntime> runtime_;
};

}  // namespace

TEST_F(CudaKernels, DropoutMasksAreBitIdenticalToTheCpus) {
    // a sequence shard [T/2, B, C] of a [B, T, C] tensor, offset in both coordinates
    const DropoutBox box{T / 2, B, C, C, int64_t(2 * T) * C, T / 2, 5};
    const DropoutKey key{0x1234567890ull, 17, 3, DropoutSite::mlp_fc2};
    const float p = 0.15f;
    const int64_t n = int64_t(T / 2) * B * C;
    auto inp = random_bf16_values(n, 1);
    std::vector<float> cpu_out(n);
    std::vector<uint8_t> cpu_mask(n);
    dropout_forward(cpu_out.data(), cpu_mask.data(), inp.data(), box, p, key);

    auto d_inp = device_bf16(inp);
    DeviceBuffer<bf16> d_out(n);
    DeviceBuffer<uint8_t> d_mask(n);
    dropout_forward(d_out.data(), d_mask.data(), d_inp.data(), box, p, key);
    EXPECT_EQ(host(d_mask), cpu_mask);
    expect_close(host_float(d_out), cpu_out, "dropout out");

    auto dout = random_bf16_values(n, 2);
    std::vector<float> cpu_dinp(n);
    dropout_backward(cpu_dinp.data(), cpu_mask.data(), dout.data(), n, p);
    auto d_dout = device_bf16(dout);
    dropout_backward(d_dout.data(), d_mask.data(), d_dout.data(), n, p);
    expect_close(host_float(d_dout), cpu_dinp, "dropout dinp");
}

// The fused end of a residual branch against the CPU's bias, dropout and
// residual kernels, on a sequence shard offset in both coordinates.
TEST_F(CudaKernels, BiasDropoutResidualMatchesCpu) {
    const DropoutBox box{T / 2, B, C, C, int64_t(2 * T) * C, T / 2, 5};
    const DropoutKey key{0x1234567890ull, 17, 3, DropoutSite::attention_proj};
    const int64_t n = int64_t(T / 2) * B * C;
    for (float p : {0.0f, 0.15f}) {
        SCOPED_TRACE("dropout " + std::to_string(p));
        auto y = random_bf16_values(n, 50), residual = random_bf16_values(n, 51), bias = random_vector(C, 52);
        std::vector<float> cpu_y = y, cpu_out(n);
        std::vector<uint8_t> cpu_mask(n);
        uint8_t* mask = p > 0.0f ? cpu_mask.data() : nullptr;  // a model without dropout keeps no mask
        bias_dropout_residual_forward(cpu_out.data(), mask, cpu_y.data(), residual.data(), bias.data(), box, p, key);

        auto d_y = device_bf16(y), d_residual = device_bf16(residual);
        DeviceBuffer<float> d_bias(bias);
        DeviceBuffer<bf16> d_out(n);
        DeviceBuffer<uint8_t> d_mask(n);
        bias_dropout_residual_forward(d_out.data(), p > 0.0f ? d_mask.data() : nullptr, d_y.data(), d_residual.data(),
                                      d_bias.data(), box, p, key);
        if (p > 0.0f) {
            EXPECT_EQ(host(d_mask), cpu_mask);
        }
        expect_close(host_float(d_out), cpu_out, "residual + dropout(y + bias)");
    }
}

TEST_F(CudaKernels, LayerNormMatchesCpu) {
    const int rows = N + 3, channels = C + 5;  // not multiples of the warp
    auto inp = random_bf16_values(int64_t(rows) * channels, 3), weight = random_vector(channels, 4),
         bias = random_vector(channels, 5), dout = random_bf16_values(int64_t(rows) * channels, 6),
         dinp0 = random_bf16_values(int64_t(rows) * channels, 7);
    std::vector<float> out(inp.size()), dinp = dinp0, dweight(channels, 0.5f), dbias(channels, -0.5f),
                                        scratch(2 * rows);
    layernorm_forward(out.data(), inp.data(), weight.data(), bias.data(), rows, channels);
    layernorm_backward(dinp.data(), dweight.data(), dbias.data(), dout.data(), inp.data(), weight.data(),
                       scratch.data(), rows, channels);

    auto d_inp = device_bf16(inp), d_dout = device_bf16(dout), d_dinp = device_bf16(dinp0);
    DeviceBuffer<float> d_weight(weight), d_bias(bias), d_dweight(std::vector<float>(channels, 0.5f)),
        d_dbias(std::vector<float>(channels, -0.5f));
    DeviceBuffer<bf16> d_out(inp.size());
    layernorm_forward(d_out.data(), d_inp.data(), d_weight.data(), d_bias.data(), rows, channels);
    DeviceBuffer<float> d_scratch(2 * rows);
    layernorm_backward(d_dinp.data(), d_dweight.data(), d_dbias.data(), d_dout.data(), d_inp.data(), d_weight.data(),
                       d_scratch.data(), rows, channels);
    expect_close(host_float(d_out), out, "layernorm out");
    expect_close(host_float(d_dinp), dinp, "layernorm dinp (accumulated)");
    expect_close(host(d_dweight), dweight, "layernorm dweight", 1e-3);
    expect_close(host(d_dbias), dbias, "layernorm dbias", 1e-3);
}

TEST_F(CudaKernels, MatmulMatchesCpu) {
    auto inp = random_bf16_values(N * C, 8), weight = random_bf16_values(OC * C, 9, 0.2f),
         bias = random_bf16_values(OC, 10), dout = random_bf16_values(N * OC, 11);
    std::vector<float> out(N * OC), dinp(N * C), dinp_columns(N * 16), dweight(OC * C, 0.25f), dbias(OC, 0.25f);
    matmul_forward(out.data(), inp.data(), weight.data(), bias.data(), N, C, OC);
    matmul_backward_input(dinp.data(), dout.data(), weight.data(), N, C, OC);
    matmul_backward_input_columns(dinp_columns.data(), dout.data(), weight.data(), N, C, OC, 16, 32);
    matmul_backward_weight(dweight.data(), dbias.data(), dout.data(), inp.data(), N, C, OC, 8, 32);

    auto d_inp = device_bf16(inp), d_weight = device_bf16(weight), d_bias = device_bf16(bias),
         d_dout = device_bf16(dout);
    DeviceBuffer<bf16> d_out(N * OC), d_dinp(N * C), d_dinp_columns(N * 16);
    DeviceBuffer<float> d_dweight(std::vector<float>(OC * C, 0.25f)), d_dbias(std::vector<float>(OC, 0.25f));
    matmul_forward(d_out.data(), d_inp.data(), d_weight.data(), d_bias.data(), N, C, OC);
    matmul_backward_input(d_dinp.data(), d_dout.data(), d_weight.data(), N, C, OC);
    matmul_backward_input_columns(d_dinp_columns.data(), d_dout.data(), d_weight.data(), N, C, OC, 16, 32);
    matmul_backward_weight(d_dweight.data(), d_dbias.data(), d_dout.data(), d_inp.data(), N, C, OC, 8, 32);
    expect_close(host_float(d_out), out, "matmul out (bias epilogue)");
    expect_close(host_float(d_dinp), dinp, "matmul dinp");
    expect_close(host_float(d_dinp_columns), dinp_columns, "matmul dinp columns 16..32");
    expect_close(host(d_dweight), dweight, "matmul dweight rows 8..32 (accumulated, fp32)", 1e-4);
    expect_close(host(d_dbias), dbias, "matmul dbias rows 8..32", 1e-4);
}

// fc1's GELU_AUX_BIAS and fc2's DGELU epilogues against the CPU's GEMM then
// GELU. The GELU side is `width` wide: 40 takes the epilogues, 36 (not a
// multiple of 8) the GEMM and the GELU kernel apart.
TEST_F(CudaKernels, MatmulGeluEpiloguesMatchCpu) {
    for (int width : {OC, 36}) {
        const std::string shape = " (width " + std::to_string(width) + ")";
        // forward: [N, C] → [N, width];  backward: dout [N, C] through a [C, width] weight to [N, width]
        auto inp = random_bf16_values(N * C, 30), weight = random_bf16_values(width * C, 31, 0.3f),
             bias = random_bf16_values(width, 32), pre_gelu_in = random_bf16_values(N * width, 33, 2.0f);
        const std::vector<float>& dout = inp;
        std::vector<float> out(N * width), pre_gelu(N * width), dinp(N * width);
        matmul_forward_gelu(out.data(), pre_gelu.data(), inp.data(), weight.data(), bias.data(), N, C, width);
        matmul_backward_input_gelu(dinp.data(), dout.data(), weight.data(), pre_gelu_in.data(), N, width, C);

        auto d_inp = device_bf16(inp), d_weight = device_bf16(weight), d_bias = device_bf16(bias),
             d_pre_gelu_in = device_bf16(pre_gelu_in);
        DeviceBuffer<bf16> d_out(N * width), d_pre_gelu(N * width), d_dinp(N * width);
        matmul_forward_gelu(d_out.data(), d_pre_gelu.data(), d_inp.data(), d_weight.data(), d_bias.data(), N, C, width);
        matmul_backward_input_gelu(d_dinp.data(), d_inp.data(), d_weight.data(), d_pre_gelu_in.data(), N, width, C);
        expect_close(host_float(d_pre_gelu), pre_gelu, "fc1 pre-GELU output" + shape);
        expect_close(host_float(d_out), out, "fc1 GELU output" + shape);
        expect_close(host_float(d_dinp), dinp, "fc2 dgrad through the GELU" + shape);
    }
}

TEST_F(CudaKernels, GeluResidualAndBiasMatchCpu) {
    const int64_t n = int64_t(N) * OC;
    auto inp = random_bf16_values(n, 12, 2.0f), other = random_bf16_values(n, 13), dout = random_bf16_values(n, 14),
         bias = random_vector(OC, 15);
    std::vector<float> gelu(n), dgelu(n), sum(n), biased = inp, dbias(OC, 1.0f);
    gelu_forward(gelu.data(), inp.data(), n);
    gelu_backward(dgelu.data(), inp.data(), dout.data(), n);
    residual_forward(sum.data(), inp.data(), other.data(), n);
    bias_forward(biased.data(), bias.data(), N, OC);
    bias_backward(dbias.data(), dout.data(), N, OC);

    auto d_inp = device_bf16(inp), d_other = device_bf16(other), d_dout = device_bf16(dout),
         d_biased = device_bf16(inp);
    DeviceBuffer<bf16> d_gelu(n), d_dgelu(n), d_sum(n);
    DeviceBuffer<float> d_bias(bias), d_dbias(std::vector<float>(OC, 1.0f));
    gelu_forward(d_gelu.data(), d_inp.data(), n);
    gelu_backward(d_dgelu.data(), d_inp.data(), d_dout.data(), n);
    residual_forward(d_sum.data(), d_inp.data(), d_other.data(), n);
    bias_forward(d_biased.data(), d_bias.data(), N, OC);
    bias_backward(d_dbias.data(), d_dout.data(), N, OC);
    expect_close(host_float(d_gelu), gelu, "gelu out");
    expect_close(host_float(d_dgelu), dgelu, "gelu dinp");
    expect_close(host_float(d_sum), sum, "residual out");
    expect_close(host_float(d_biased), biased, "bias out");
    expect_close(host(d_dbias), dbias, "bias dbias", 1e-4);
}

TEST_F(CudaKernels, EmbeddingsMatchCpu) {
    const int V_local = 50, vocab_start = 25, maxT = T + 4, pos_start = 3, T_local = T / 2;
    std::vector<int> tokens(B * T);
    for (int i = 0; i < B * T; i++) tokens[i] = (i * 37) % 100;  // half of them outside this rank's range
    auto wte = random_vector(V_local * C, 16), wpe = random_vector(maxT * C, 17);
    auto dout = random_bf16_values(int64_t(T) * B * C, 18);
    std::vector<float> out(int64_t(T) * B * C), dwte(V_local * C, 0.0f), dwpe(maxT * C, 0.0f);
    token_embedding_forward(out.data(), tokens.data(), wte.data(), vocab_start, V_local, B, T, C);
    position_embedding_forward(out.data(), wpe.data(), pos_start, T_local, B, C);
    token_embedding_backward(dwte.data(), dout.data(), tokens.data(), vocab_start, V_local, B, T, C);
    position_embedding_backward(dwpe.data(), dout.data(), pos_start, T_local, B, C);

    DeviceBuffer<int> d_tokens(tokens);
    DeviceBuffer<float> d_wte(wte), d_wpe(wpe), d_dwte(V_local * C), d_dwpe(maxT * C);
    auto d_dout = device_bf16(dout);
    DeviceBuffer<bf16> d_out(int64_t(T) * B * C);
    token_embedding_forward(d_out.data(), d_tokens.data(), d_wte.data(), vocab_start, V_local, B, T, C);
    position_embedding_forward(d_out.data(), d_wpe.data(), pos_start, T_local, B, C);
    token_embedding_backward(d_dwte.data(), d_dout.data(), d_tokens.data(), vocab_start, V_local, B, T, C);
    position_embedding_backward(d_dwpe.data(), d_dout.data(), pos_start, T_local, B, C);
    expect_close(host_float(d_out), out, "embedding out");
    expect_close(host(d_dwte), dwte, "dwte", 1e-5);
    expect_close(host(d_dwpe), dwpe, "dwpe", 1e-5);
}

TEST_F(CudaKernels, AttentionMatchesCpuWithTheSameMasks) {
    for (float p : {0.0f, 0.2f}) {
        SCOPED_TRACE("dropout " + std::to_string(p));
        const DropoutKey key{99, 4, 2, DropoutSite::attention_probs};
        // heads NH .. 2NH of 2NH, of the second sequence
        const DropoutBox box{B, NH, int64_t(T) * T, int64_t(2 * NH) * T * T, int64_t(T) * T, 1, NH};
        const int64_t scores = int64_t(B) * NH * T * T;
        auto qkv = random_bf16_values(int64_t(N) * 3 * C, 19), dout = random_bf16_values(int64_t(N) * C, 20);
        std::vector<float> out(N * C), softmax_out(scores), dropped(scores), dqkv(N * 3 * C), scratch(64 * T * T);
        std::vector<uint8_t> mask(scores);
        // at p = 0 there is no mask and no S: the kernels take null for both
        const bool dropout = p > 0.0f;
        uint8_t* mask_at = dropout ? mask.data() : nullptr;
        float* dropped_at = dropout ? dropped.data() : nullptr;
        attention_forward(out.data(), softmax_out.data(), mask_at, dropped_at, qkv.data(), nullptr, B, T, C, NH, p, box,
                          key);
        attention_backward(dqkv.data(), dout.data(), qkv.data(), softmax_out.data(), mask_at, dropped_at,
                           scratch.data(), B, T, C, NH, p);

        auto d_qkv = device_bf16(qkv), d_dout = device_bf16(dout);
        DeviceBuffer<bf16> d_out(N * C), d_softmax(scores), d_dropped(scores), d_dqkv(N * 3 * C),
            d_scratch(cuda_attention_scratch_elements(B, T, C, NH));
        DeviceBuffer<uint8_t> d_mask(scores);
        uint8_t* d_mask_at = dropout ? d_mask.data() : nullptr;
        bf16* d_dropped_at = dropout ? d_dropped.data() : nullptr;
        attention_forward(d_out.data(), d_softmax.data(), d_mask_at, d_dropped_at, d_qkv.data(), d_scratch.data(), B, T,
                          C, NH, p, box, key);
        attention_backward(d_dqkv.data(), d_dout.data(), d_qkv.data(), d_softmax.data(), d_mask_at, d_dropped_at,
                           d_scratch.data(), B, T, C, NH, p);
        expect_close(host_float(d_softmax), softmax_out, "softmax out S'", 2e-2);
        if (dropout) {
            EXPECT_EQ(host(d_mask), mask);
            expect_close(host_float(d_dropped), dropped, "dropout out S", 2e-2);
        }
        expect_close(host_float(d_out), out, "attention out", 2e-2);
        expect_close(host_float(d_dqkv), dqkv, "attention dqkv", 3e-2);
    }
}

// Ring attention's CUDA kernels (context parallelism's p2p) against the
// CPU's, which test_kernels.cpp proves against the unsplit attention: every
// CP rank of cp = 2 and 3 simulated here on the same bf16 inputs, the K|V
// blocks in the ring's order (the rank's own, then r − 1, r − 2, …), S'
// kept or (selective recomputation) rebuilt from the rows' log-sum-exp,
// dropout 0 and 0.2, heads NH .. 2NH of 2NH of the micro-batch's second
// sequence onwards (the global dropout coordinates). The output, S' and S,
// the log-sum-exp, each block's dK|dV part and dQ at bf16 tolerances; the
// masks bit for bit.
TEST_F(CudaKernels, RingAttentionMatchesTheCpusRingKernels) {
    constexpr int S = 48, RB = 2;
    const DropoutKey key{5, 2, 1, DropoutSite::attention_probs};
    const auto qkv = random_bf16_values(size_t(S) * RB * 3 * C, 61), dout = random_bf16_values(size_t(S) * RB * C, 62);
    for (int cp : {2, 3})
        for (float p : {0.0f, 0.2f})
            for (bool recompute : {false, true}) {
                SCOPED_TRACE("cp " + std::to_string(cp) + " dropout " + std::to_string(p) +
                             (recompute ? " recomputed" : " S' kept"));
                const int c = S / (2 * cp), T_loc = S / cp;
                const auto chunk_of = [&](int r, int half) { return half == 0 ? r : 2 * cp - 1 - r; };
                // rank r's rows of a [S, RB, full_width] tensor: columns [offset, offset + width)
                const auto rows_of = [&](const std::vector<float>& full, int r, int width, int offset, int full_width) {
                    std::vector<float> local(size_t(T_loc) * RB * width);
                    for (int i = 0; i < T_loc; i++)
                        for (int b = 0; b < RB; b++)
                            for (int j = 0; j < width; j++)
                                local[(size_t(i) * RB + b) * width + j] =
                                    full[(size_t(chunk_of(r, i / c) * c + i % c) * RB + b) * full_width + offset + j];
                    return local;
                };
                // columns [0, C) of a rank's [T_loc, RB, 3C]
                const auto q_columns = [&](const std::vector<float>& dqkv) {
                    std::vector<float> q(size_t(T_loc) * RB * C);
                    for (size_t row = 0; row < size_t(T_loc) * RB; row++)
                        std::copy_n(dqkv.begin() + int64_t(row) * 3 * C, C, q.begin() + int64_t(row) * C);
                    return q;
                };
                for (int r = 0; r < cp; r++) {
                    SCOPED_TRACE("rank " + std::to_string(r));
                    const RingAttention ra{RB, T_loc, S, C, NH, c, {chunk_of(r, 0), chunk_of(r, 1)}, 2 * NH, NH, 1};
                    const std::vector<float> q = rows_of(qkv, r, 3 * C, 0, 3 * C), d = rows_of(dout, r, C, 0, C);
                    const size_t rows = size_t(RB) * NH * T_loc, scores = size_t(RB) * 2 * NH * c * S;
                    std::vector<float> o(size_t(T_loc) * RB * C), stats(2 * rows), sp(scores), sd(scores), lse(rows);
                    std::vector<float> scratch(size_t(omp_get_max_threads()) * T_loc * T_loc);
                    std::vector<uint8_t> mask(scores);
                    auto g_q = device_bf16(q), g_d = device_bf16(d);
                    DeviceBuffer<bf16> g_o(o.size()), g_sp(scores), g_sd(scores), g_kv(size_t(T_loc) * RB * 2 * C),
                        g_scratch(size_t(cuda_ring_attention_scratch_elements(RB, T_loc, C, NH)));
                    DeviceBuffer<float> g_stats(2 * rows), g_lse(rows);
                    DeviceBuffer<uint8_t> g_mask(scores);
                    bf16* g_kept = recompute ? nullptr : g_sp.data();

                    ring_attention_start(o.data(), stats.data(), ra, scratch.data());
                    ring_attention_start(g_o.data(), g_stats.data(), ra, g_scratch.data());
                    for (int step = 0; step < cp; step++) {
                        const int source = (r - step + cp) % cp, chunks[2] = {chunk_of(source, 0), chunk_of(source, 1)};
                        const std::vector<float> kv = rows_of(qkv, source, 2 * C, C, 3 * C);
                        sync();  // the last block's kernels have read g_kv
                        g_kv.upload(to_bf16(kv));
                        for (int b = 0; b < RB; b++) {
                            ring_attention_forward_block(o.data(), stats.data(), recompute ? nullptr : sp.data(),
                                                         q.data(), kv.data(), chunks, ra, b, p, key, scratch.data());
                            ring_attention_forward_block(g_o.data(), g_stats.data(), g_kept, g_q.data(), g_kv.data(),
                                                         chunks, ra, b, p, key, g_scratch.data());
                        }
                    }
                    ring_attention_finish(o.data(), recompute ? nullptr : sp.data(), mask.data(), sd.data(), lse.data(),
                                          stats.data(), ra, p, key, scratch.data());
                    ring_attention_finish(g_o.data(), g_kept, g_mask.data(), g_sd.data(), g_lse.data(), g_stats.data(),
                                          ra, p, key, g_scratch.data());
                    expect_close(host_float(g_o), o, "ring attention out", 2e-2);
                    expect_close(host(g_lse), lse, "the rows' log-sum-exp", 1e-2);
                    if (!recompute) {
                        expect_close(host_float(g_sp), sp, "S'", 2e-2);
                        if (p > 0.0f) {
                            EXPECT_EQ(host(g_mask), mask);
                            expect_close(host_float(g_sd), sd, "S", 2e-2);
                        }
                    }

                    std::vector<float> dqkv(size_t(T_loc) * RB * 3 * C, 7.0f), partial(size_t(T_loc) * RB * 2 * C);
                    DeviceBuffer<bf16> g_dqkv(dqkv.size()), g_partial(partial.size());
                    ring_attention_backward_start(stats.data(), dqkv.data(), d.data(), o.data(), ra, scratch.data());
                    ring_attention_backward_start(g_stats.data(), g_dqkv.data(), g_d.data(), g_o.data(), ra,
                                                  g_scratch.data());
                    for (int step = 0; step < cp; step++) {
                        const int source = (r - step + cp) % cp, chunks[2] = {chunk_of(source, 0), chunk_of(source, 1)};
                        const std::vector<float> kv = rows_of(qkv, source, 2 * C, C, 3 * C);
                        sync();
                        g_kv.upload(to_bf16(kv));
                        std::fill(partial.begin(), partial.end(), 0.0f);
                        for (int b = 0; b < RB; b++) {
                            ring_attention_backward_block(dqkv.data(), partial.data(), d.data(), q.data(), kv.data(),
                                                          recompute ? nullptr : sp.data(), mask.data(), sd.data(),
                                                          lse.data(), stats.data(), chunks, ra, b, p, key,
                                                          scratch.data());
                            ring_attention_backward_block(g_dqkv.data(), g_partial.data(), g_d.data(), g_q.data(),
                                                          g_kv.data(), g_kept, g_mask.data(), g_sd.data(), g_lse.data(),
                                                          g_stats.data(), chunks, ra, b, p, key, g_scratch.data());
                        }
                        expect_close(host_float(g_partial), partial, "dK|dV of block " + std::to_string(source), 3e-2);
                    }
                    ring_attention_backward_finish(dqkv.data(), scratch.data(), ra);
                    ring_attention_backward_finish(g_dqkv.data(), g_scratch.data(), ra);
                    expect_close(q_columns(host_float(g_dqkv)), q_columns(dqkv), "dQ", 3e-2);
                }
            }
}

#ifdef TPSP_WITH_CUDNN
// cuDNN's fused attention against the CPU's explicit kernels (3 heads of 16:
// cuDNN wants a head size that is a multiple of 8), its statistics against
// log Σ exp computed here, and its dropout by the identity Σ dO·O = Σ dV·V
// (O is linear in V for a fixed mask, so dV must use the forward's mask).
TEST_F(CudaKernels, FusedAttentionMatchesTheExplicitKernels) {
    const int heads = 3, hs = C / heads;
    const int64_t scores = int64_t(B) * heads * T * T;
    auto qkv = random_bf16_values(int64_t(N) * 3 * C, 40), dout = random_bf16_values(int64_t(N) * C, 41);
    std::vector<float> out(N * C), softmax_out(scores), dropped(scores), dqkv(N * 3 * C), scratch(64 * T * T);
    std::vector<uint8_t> mask(scores);
    const DropoutKey key{1, 1, 0, DropoutSite::attention_probs};
    attention_forward(out.data(), softmax_out.data(), mask.data(), dropped.data(), qkv.data(), nullptr, B, T, C, heads,
                      0.0f, full_box(B, heads, int64_t(T) * T), key);
    attention_backward(dqkv.data(), dout.data(), qkv.data(), softmax_out.data(), mask.data(), dropped.data(),
                       scratch.data(), B, T, C, heads, 0.0f);
    std::vector<float> lse(size_t(B) * heads * T);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < heads; h++)
            for (int i = 0; i < T; i++) {
                std::vector<double> row(size_t(i) + 1);
                double max = -1e30, sum = 0.0;
                for (int j = 0; j <= i; j++) {
                    double dot = 0.0;
                    for (int d = 0; d < hs; d++)
                        dot += double(qkv[(size_t(i) * B + b) * 3 * C + h * hs + d]) *
                               qkv[(size_t(j) * B + b) * 3 * C + C + h * hs + d];
                    row[j] = dot / std::sqrt(double(hs));
                    max = std::max(max, row[j]);
                }
                for (double x : row) sum += std::exp(x - max);
                lse[(size_t(b) * heads + h) * T + i] = float(max + std::log(sum));
            }

    auto d_qkv = device_bf16(qkv), d_dout = device_bf16(dout);
    DeviceBuffer<bf16> d_out(N * C), d_dqkv(N * 3 * C);
    DeviceBuffer<float> d_stats(size_t(B) * heads * T);
    fused_attention_forward(d_out.data(), d_stats.data(), d_qkv.data(), B, T, C, heads, 0.0f, 7);
    fused_attention_backward(d_dqkv.data(), d_dout.data(), d_qkv.data(), d_out.data(), d_stats.data(), B, T, C, heads,
                             0.0f, 7);
    expect_close(host_float(d_out), out, "fused attention out", 2e-2);
    expect_close(host(d_stats), lse, "fused attention statistics (log Σ exp)", 1e-3);
    expect_close(host_float(d_dqkv), dqkv, "fused attention dqkv", 3e-2);

    // dropout 0.2: the same seed draws the same mask in forward, again, and in backward
    DeviceBuffer<bf16> d_out_again(N * C), d_out_other(N * C);
    fused_attention_forward(d_out.data(), d_stats.data(), d_qkv.data(), B, T, C, heads, 0.2f, 7);
    fused_attention_forward(d_out_again.data(), d_stats.data(), d_qkv.data(), B, T, C, heads, 0.2f, 7);
    fused_attention_forward(d_out_other.data(), d_stats.data(), d_qkv.data(), B, T, C, heads, 0.2f, 8);
    const std::vector<float> dropped_out = host_float(d_out);
    EXPECT_EQ(host_float(d_out_again), dropped_out) << "the same seed drew another mask";
    EXPECT_GT(relative_error(host_float(d_out_other), dropped_out), 1e-2) << "another seed drew the same mask";
    EXPECT_GT(relative_error(dropped_out, out), 1e-2) << "dropout 0.2 changed nothing";
    fused_attention_backward(d_dqkv.data(), d_dout.data(), d_qkv.data(), d_out.data(), d_stats.data(), B, T, C, heads,
                             0.2f, 7);
    const std::vector<float> grads = host_float(d_dqkv);
    double out_dot = 0.0, value_dot = 0.0;
    for (int64_t n = 0; n < N; n++)
        for (int c = 0; c < C; c++) {
            out_dot += double(dout[n * C + c]) * dropped_out[n * C + c];
            value_dot += double(grads[n * 3 * C + 2 * C + c]) * qkv[n * 3 * C + 2 * C + c];
        }
    EXPECT_NEAR(value_dot, out_dot, 2e-2 * std::abs(out_dot) + 1e-3) << "Σ dV·V ≠ Σ dO·O: backward's mask differs";
}

// Runs without a GPU: cuDNN accepts every descriptor of both attention graphs
// (dims, strides and dtypes of each matmul, pointwise, reduction, RNG and
// reshape), its heuristics pick a fused engine for an H100 / H200, and it
// compiles the fused forward and backward kernels; with dropout and without,
// for the test's shape and GPT-2's. cuDNN compiles through the driver
// library: where there is none, the toolkit's stub stands in (it loads, and
// refuses to load modules, which is where the check stops).
TEST(FusedAttentionGraph, CudnnCompilesBothGraphsForHopperWithoutAGpu) {
    if (gpu::cuda_device_count() > 0) GTEST_SKIP() << "a GPU is here: the CudaKernels/CudaModel tests run the plans";
    if (cudnnGetVersion() < 90800) GTEST_SKIP() << "cuDNN " << cudnnGetVersion() << " cannot plan without a GPU";
    if (!dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL)) {
        ASSERT_NE(dlopen(TPSP_CUDA_DRIVER_STUB, RTLD_NOW | RTLD_GLOBAL), nullptr) << dlerror();
    }
    // Where the driver refused to load the compiled kernels (the stub always
    // does), `planned` is false and no plan is proven: only that cuDNN took
    // every descriptor and its heuristics offered an engine. Said, not hidden.
    for (float p : {0.0f, 0.1f}) {
        FusedAttentionPlanCheck tiny, gpt2;
        EXPECT_NO_THROW(tiny = check_fused_attention_plans_for_hopper(B, T, C, 3, p)) << "dropout " << p;
        EXPECT_NO_THROW(gpt2 = check_fused_attention_plans_for_hopper(16, 1024, 768, 12, p)) << "GPT-2, dropout " << p;
        for (const FusedAttentionPlanCheck& check : {tiny, gpt2})
            std::printf("dropout %.1f: %s\n", p,
                        check.planned ? "both plans finalised"
                                      : "graphs and engines accepted; the driver did not load the kernels, so no "
                                        "plan is proven");
    }
}

#endif  // TPSP_WITH_CUDNN

TEST_F(CudaKernels, CrossEntropyMatchesCpu) {
    const int Vp_local = 72, V_real = 60, vocab_start = 100;
    auto logits = random_bf16_values(int64_t(N) * Vp_local, 21, 3.0f);
    std::vector<int> targets(N);
    for (int n = 0; n < N; n++) targets[n] = vocab_start - 10 + (n * 13) % 80;  // some on other ranks
    std::vector<float> maxes(N), stats(2 * N), grads = logits, lse(N), losses(N);
    crossentropy_max_forward(maxes.data(), logits.data(), N, V_real, Vp_local);
    crossentropy_sum_forward(stats.data(), logits.data(), maxes.data(), targets.data(), vocab_start, N, V_real,
                             Vp_local);
    for (int n = 0; n < N; n++) {
        lse[n] = maxes[n] + std::log(stats[n]);
        losses[n] = lse[n] - stats[N + n];
    }
    crossentropy_backward(grads.data(), lse.data(), targets.data(), vocab_start, 0.5f, N, V_real, Vp_local);

    auto d_logits = device_bf16(logits);
    DeviceBuffer<int> d_targets(targets);
    DeviceBuffer<float> d_maxes(N), d_stats(2 * N), d_lse(N), d_losses(N);
    crossentropy_max_forward(d_maxes.data(), d_logits.data(), N, V_real, Vp_local);
    crossentropy_sum_forward(d_stats.data(), d_logits.data(), d_maxes.data(), d_targets.data(), vocab_start, N, V_real,
                             Vp_local);
    crossentropy_loss_forward(d_losses.data(), d_lse.data(), d_maxes.data(), d_stats.data(), N);
    crossentropy_backward(d_logits.data(), d_lse.data(), d_targets.data(), vocab_start, 0.5f, N, V_real, Vp_local);
    EXPECT_EQ(host(d_maxes), maxes);  // a max of bf16 values is exact
    expect_close(host(d_stats), stats, "Σ exp and target logits", 1e-5);
    expect_close(host(d_lse), lse, "log-sum-exp", 1e-5);
    expect_close(host_float(d_logits), grads, "dlogits");
}

TEST_F(CudaKernels, CastRoundsToNearestBf16) {
    auto values = random_vector(1000, 22);
    DeviceBuffer<float> d_values(values);
    DeviceBuffer<bf16> d_cast(values.size());
    cast_to_bf16(d_cast.data(), d_values.data(), int64_t(values.size()));
    EXPECT_EQ(host_float(d_cast), rounded_to_bf16(values));
}
