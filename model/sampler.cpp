#include "model/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <stdexcept>

#include "model/kernels/cpu_kernels.h"
#include "model/kernels/philox.h"

namespace tpsp {

Generator::Generator(const GPTConfig& config, const float* params) : c_(config) {
    int64_t at = 0;
    for (const TensorSpec& t : parameter_table(c_, 1, &p_, &blocks_)) {
        t.place(const_cast<float*>(params) + at);
        at += t.elements();
    }
    const size_t C = size_t(c_.channels);
    keys_.resize(size_t(c_.num_layers) * c_.max_seq_len * C);
    values_.resize(keys_.size());
    x_.resize(C), ln_.resize(C), qkv_.resize(3 * C), att_.resize(C), branch_.resize(C), fc_.resize(4 * C),
        gelu_.resize(4 * C);
    scores_.resize(size_t(c_.max_seq_len));
    logits_.resize(size_t(c_.padded_vocab_size));
}

const float* Generator::step(int token) {
    if (position_ >= c_.max_seq_len) throw std::out_of_range("Generator: the context is full (maxT positions)");
    const int C = c_.channels, NH = c_.num_heads, hs = C / NH, t = position_;
    for (int i = 0; i < C; i++) x_[i] = p_.wte[int64_t(token) * C + i] + p_.wpe[int64_t(t) * C + i];
    for (int l = 0; l < c_.num_layers; l++) {
        const BlockParameters& p = blocks_[size_t(l)];
        float* keys = keys_.data() + int64_t(l) * c_.max_seq_len * C;
        float* values = values_.data() + int64_t(l) * c_.max_seq_len * C;
        layernorm_forward(ln_.data(), x_.data(), p.ln1w, p.ln1b, 1, C);
        matmul_forward(qkv_.data(), ln_.data(), p.qkvw, p.qkvb, 1, C, 3 * C);
        std::memcpy(keys + int64_t(t) * C, qkv_.data() + C, sizeof(float) * C);  // this position joins the cache
        std::memcpy(values + int64_t(t) * C, qkv_.data() + 2 * C, sizeof(float) * C);
        for (int h = 0; h < NH; h++) {  // one query against every cached key
            const float* q = qkv_.data() + h * hs;
            float maxval = -INFINITY;
            for (int j = 0; j <= t; j++) {
                const float* k = keys + int64_t(j) * C + h * hs;
                float dot = 0.0f;
                for (int i = 0; i < hs; i++) dot += q[i] * k[i];
                scores_[j] = dot / std::sqrt(float(hs));
                maxval = std::max(maxval, scores_[j]);
            }
            float sum = 0.0f;
            for (int j = 0; j <= t; j++) sum += (scores_[j] = std::exp(scores_[j] - maxval));
            float* out = att_.data() + h * hs;
            std::fill(out, out + hs, 0.0f);
            for (int j = 0; j <= t; j++) {
                const float* v = values + int64_t(j) * C + h * hs;
                for (int i = 0; i < hs; i++) out[i] += scores_[j] / sum * v[i];
            }
        }
        matmul_forward(branch_.data(), att_.data(), p.attprojw, p.attprojb, 1, C, C);
        for (int i = 0; i < C; i++) x_[i] += branch_[i];
        layernorm_forward(ln_.data(), x_.data(), p.ln2w, p.ln2b, 1, C);
        matmul_forward(fc_.data(), ln_.data(), p.fcw, p.fcb, 1, C, 4 * C);
        gelu_forward(gelu_.data(), fc_.data(), 4 * C);
        matmul_forward(branch_.data(), gelu_.data(), p.fcprojw, p.fcprojb, 1, 4 * C, C);
        for (int i = 0; i < C; i++) x_[i] += branch_[i];
    }
    layernorm_forward(ln_.data(), x_.data(), p_.lnfw, p_.lnfb, 1, C);
    matmul_forward(logits_.data(), ln_.data(), p_.wte, nullptr, 1, C, c_.padded_vocab_size);
    position_++;
    return logits_.data();
}

int sample_token(const float* logits, int V, float temperature, int top_k, float coin) {
    if (temperature <= 0.0f) return int(std::max_element(logits, logits + V) - logits);
    std::vector<int> order(static_cast<size_t>(V));
    std::iota(order.begin(), order.end(), 0);
    int k = top_k > 0 ? std::min(top_k, V) : V;
    std::partial_sort(order.begin(), order.begin() + k, order.end(),
                      [&](int a, int b) { return logits[a] > logits[b]; });
    std::vector<double> weights(static_cast<size_t>(k));
    double sum = 0.0;
    for (int i = 0; i < k; i++) sum += weights[i] = std::exp((logits[order[i]] - logits[order[0]]) / temperature);
    double target = coin * sum;
    for (int i = 0; i < k; i++) {
        target -= weights[i];
        if (target < 0) return order[i];
    }
    return order[k - 1];
}

int generate(Generator& generator, const GPTConfig& config, const std::vector<int>& prompt, int count,
             float temperature, int top_k, uint64_t seed, const std::function<void(int)>& emit) {
    generator.reset();
    const float* logits = nullptr;
    for (int token : prompt) logits = generator.step(token);
    int made = 0;
    for (; made < count && generator.position() < config.max_seq_len; made++) {
        PhiloxCounter bits = philox4x32_10({uint32_t(made), 0, 0, 0}, {uint32_t(seed), uint32_t(seed >> 32)});
        int token = sample_token(logits, config.vocab_size, temperature, top_k, uniform_from_bits(bits[0]));
        emit(token);
        if (generator.position() < config.max_seq_len) logits = generator.step(token);
    }
    return made;
}

}  // namespace tpsp
