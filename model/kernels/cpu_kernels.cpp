#include "model/kernels/cpu_kernels.h"

#include <cblas.h>
#include <omp.h>
#ifdef TPSP_WITH_ONEDNN
#include <oneapi/dnnl/dnnl.h>
#endif

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

namespace tpsp {

// exp(x) written so that `omp simd` loops vectorise it (libm's expf and tanhf
// do not, short of -ffast-math; the clamp needs -fno-trapping-math, which
// CMakeLists.txt sets, or GCC keeps it a branch and the loop scalar):
// x = k·ln2 + r with |r| ≤ ln2/2, e^r by its degree-6 Taylor polynomial (relative error < 3e-7), 2^k built in the
// exponent bits. Inputs are clamped to [-87, 88], the range of normal floats.
// k is rounded by adding and subtracting 1.5·2^23 (std::round and std::floor
// would keep the loop scalar).
static inline float vector_exp(float x) {
    x = std::min(std::max(x, -87.0f), 88.0f);
    float k = (x * 1.44269504f + 12582912.0f) - 12582912.0f;
    float r = x - k * 0.693145751953125f - k * 1.428606765330187e-6f;
    float p = 1.0f + r * (1.0f + r * (0.5f + r * (1.0f / 6 + r * (1.0f / 24 + r * (1.0f / 120 + r * (1.0f / 720))))));
    return p * std::bit_cast<float>((int32_t(k) + 127) << 23);
}

// tanh(u) = 1 − 2 / (e^{2u} + 1), vectorisable through vector_exp.
static inline float vector_tanh(float u) { return 1.0f - 2.0f / (vector_exp(2.0f * u) + 1.0f); }

// ----------------------------------------------------------------------------
// dropout (the keying is in dropout_rng.h)

// One contiguous run of n elements starting at global index g0.
static void dropout_row(float* out, uint8_t* mask, const float* inp, int64_t n, uint64_t g0, float p, float scale,
                        const DropoutKey& key) {
    PhiloxCounter bits = dropout_block(key, g0 / 4);
    for (int64_t i = 0; i < n; i++) {
        uint64_t g = g0 + i;
        if (g % 4 == 0 && i > 0) bits = dropout_block(key, g / 4);
        uint8_t keep = uniform_from_bits(bits[g % 4]) >= p;
        mask[i] = keep;
        out[i] = keep ? inp[i] * scale : 0.0f;
    }
}

void dropout_forward(float* out, uint8_t* mask, const float* inp, const DropoutBox& box, float p,
                     const DropoutKey& key) {
    const int64_t rows = box.n0 * box.n1;
    if (p == 0.0f) {
        if (out != inp) std::memcpy(out, inp, sizeof(float) * rows * box.n2);
        return;
    }
    float scale = 1.0f / (1.0f - p);
#pragma omp parallel for
    for (int64_t r = 0; r < rows; r++) {
        int64_t at = r * box.n2;
        dropout_row(out + at, mask + at, inp + at, box.n2, box.row_start(r), p, scale, key);
    }
}

void dropout_backward(float* dinp, const uint8_t* mask, const float* dout, int64_t n, float p) {
    if (p == 0.0f) {
        if (dinp != dout) std::memcpy(dinp, dout, sizeof(float) * n);
        return;
    }
    float scale = 1.0f / (1.0f - p);
#pragma omp parallel for simd if (n > 65536)
    for (int64_t i = 0; i < n; i++) dinp[i] = mask[i] ? dout[i] * scale : 0.0f;
}

// ----------------------------------------------------------------------------
// embedding

void token_embedding_forward(float* out, const int* inp, const float* wte, int vocab_start, int V_local, int B, int T,
                             int C) {
#pragma omp parallel for collapse(2)
    for (int t = 0; t < T; t++) {
        for (int b = 0; b < B; b++) {
            float* o = out + (int64_t(t) * B + b) * C;
            int row = inp[b * T + t] - vocab_start;
            if (row >= 0 && row < V_local) std::memcpy(o, wte + int64_t(row) * C, sizeof(float) * C);
            else std::memset(o, 0, sizeof(float) * C);
        }
    }
}

void token_embedding_backward(float* dwte, const float* dout, const int* inp, int vocab_start, int V_local, int B,
                              int T, int C) {
    // Threads split the channels, so two tokens with the same id never race.
#pragma omp parallel
    {
        int threads = omp_get_num_threads(), id = omp_get_thread_num();
        int c0 = int(int64_t(C) * id / threads), c1 = int(int64_t(C) * (id + 1) / threads);
        for (int t = 0; t < T; t++) {
            for (int b = 0; b < B; b++) {
                int row = inp[b * T + t] - vocab_start;
                if (row < 0 || row >= V_local) continue;
                const float* d = dout + (int64_t(t) * B + b) * C;
                float* token = dwte + int64_t(row) * C;
                for (int c = c0; c < c1; c++) token[c] += d[c];
            }
        }
    }
}

void position_embedding_forward(float* out, const float* wpe, int pos_start, int T_local, int B, int C) {
#pragma omp parallel for collapse(2)
    for (int t = 0; t < T_local; t++) {
        for (int b = 0; b < B; b++) {
            float* o = out + (int64_t(t) * B + b) * C;
            const float* position = wpe + int64_t(pos_start + t) * C;
#pragma omp simd
            for (int c = 0; c < C; c++) o[c] += position[c];
        }
    }
}

void position_embedding_backward(float* dwpe, const float* dout, int pos_start, int T_local, int B, int C) {
#pragma omp parallel for
    for (int t = 0; t < T_local; t++) {
        float* position = dwpe + int64_t(pos_start + t) * C;
        for (int b = 0; b < B; b++) {
            const float* d = dout + (int64_t(t) * B + b) * C;
#pragma omp simd
            for (int c = 0; c < C; c++) position[c] += d[c];
        }
    }
}

// ----------------------------------------------------------------------------
// layernorm

static constexpr float layernorm_eps = 1e-5f;

static void row_statistics(const float* x, int C, float* mean_out, float* rstd_out) {
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int c = 0; c < C; c++) sum += x[c];
    float mean = sum / C;
    float var = 0.0f;
#pragma omp simd reduction(+ : var)
    for (int c = 0; c < C; c++) var += (x[c] - mean) * (x[c] - mean);
    *mean_out = mean;
    *rstd_out = 1.0f / std::sqrt(var / C + layernorm_eps);
}

void layernorm_forward(float* out, const float* inp, const float* weight, const float* bias, int N, int C) {
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float* x = inp + int64_t(n) * C;
        float* o = out + int64_t(n) * C;
        float mean, rstd;
        row_statistics(x, C, &mean, &rstd);
#pragma omp simd
        for (int c = 0; c < C; c++) o[c] = (x[c] - mean) * rstd * weight[c] + bias[c];
    }
}

void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, float* scratch, int N, int C) {
    float* mean = scratch;
    float* rstd = scratch + N;
    // rows in parallel: recompute the statistics, then the input gradient
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float* x = inp + int64_t(n) * C;
        const float* d = dout + int64_t(n) * C;
        float* dx = dinp + int64_t(n) * C;
        row_statistics(x, C, &mean[n], &rstd[n]);
        float m = mean[n], r = rstd[n];
        float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
#pragma omp simd reduction(+ : dnorm_mean, dnorm_norm_mean)
        for (int c = 0; c < C; c++) {
            float dnorm = weight[c] * d[c];
            dnorm_mean += dnorm;
            dnorm_norm_mean += dnorm * (x[c] - m) * r;
        }
        dnorm_mean /= C;
        dnorm_norm_mean /= C;
#pragma omp simd
        for (int c = 0; c < C; c++) {
            float norm = (x[c] - m) * r;
            dx[c] += (weight[c] * d[c] - dnorm_mean - norm * dnorm_norm_mean) * r;
        }
    }
    // channels in parallel: the parameter gradients sum over rows
#pragma omp parallel
    {
        int threads = omp_get_num_threads(), id = omp_get_thread_num();
        int c0 = int(int64_t(C) * id / threads), c1 = int(int64_t(C) * (id + 1) / threads);
        for (int n = 0; n < N; n++) {
            const float* x = inp + int64_t(n) * C;
            const float* d = dout + int64_t(n) * C;
            float m = mean[n], r = rstd[n];
#pragma omp simd
            for (int c = c0; c < c1; c++) {
                dweight[c] += (x[c] - m) * r * d[c];
                dbias[c] += d[c];
            }
        }
    }
}

// ----------------------------------------------------------------------------
// matmul

void linear_sgemm(bool transpose_a, bool transpose_b, int M, int N, int K, float alpha, const float* A, int lda,
                  const float* B, int ldb, float beta, float* C, int ldc) {
#ifdef TPSP_WITH_ONEDNN
    dnnl_sgemm(transpose_a ? 'T' : 'N', transpose_b ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
#else
    cblas_sgemm(CblasRowMajor, transpose_a ? CblasTrans : CblasNoTrans, transpose_b ? CblasTrans : CblasNoTrans, M, N,
                K, alpha, A, lda, B, ldb, beta, C, ldc);
#endif
}

std::string linear_gemm_library() {
#ifdef TPSP_WITH_ONEDNN
    const dnnl_version_t* v = dnnl_version();
    const int isa = int(dnnl_get_effective_cpu_isa());
    auto has = [&](dnnl_cpu_isa_t set) { return (isa & int(set)) == int(set); };
    const char* kernels = has(dnnl_cpu_isa_avx512_core) ? "AVX-512"
                          : has(dnnl_cpu_isa_avx2)      ? "AVX2"
                          : has(dnnl_cpu_isa_avx)       ? "AVX"
                                                        : "SSE4.1";
    return "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch) +
           " sgemm, " + kernels + " JIT kernels";
#else
    return "OpenBLAS";
#endif
}

// Where thread `thread` of `threads` starts its block of output columns: the
// blocks are even, and start at multiples of 16 (one AVX-512 vector of floats).
static int column_block_start(int columns, int threads, int thread) {
    if (thread == threads) return columns;
    return int(int64_t(columns) * thread / threads) / 16 * 16;
}

// out [N, o_begin:o_end] = inp [N, C] @ weight [o_begin:o_end, C]^T + bias [o_begin:o_end]
// (bias may be null). Called inside a parallel region, its bias loop and its
// GEMM run on the calling thread alone.
static void matmul_forward_columns(float* out, const float* inp, const float* weight, const float* bias, int N, int C,
                                   int OC, int o_begin, int o_end) {
    const int width = o_end - o_begin;
    float beta = 0.0f;
    if (bias) {
#pragma omp parallel for
        for (int n = 0; n < N; n++) std::memcpy(out + int64_t(n) * OC + o_begin, bias + o_begin, sizeof(float) * width);
        beta = 1.0f;
    }
    linear_sgemm(false, true, N, width, C, 1.0f, inp, C, weight + int64_t(o_begin) * C, C, beta, out + o_begin, OC);
}

// With fewer rows than output columns (N = b·s of a few hundred against
// OC = 768 … 50304 at GPT-2 124M), the libraries' own threading splits the
// forward GEMM badly: fc2's forward at b·s = 256 ran at about 230 GFLOP/s on
// 2 threads, and at about 330 split by columns (docs/performance.md). With
// more rows than columns (the tiny config: N = 2048) their threading is the
// faster one.
void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N, int C, int OC) {
    if (N >= OC) {
        matmul_forward_columns(out, inp, weight, bias, N, C, OC, 0, OC);  // the library threads the GEMM
        return;
    }
    // one block of output columns (of weight rows) per thread, each a
    // single-threaded GEMM: the cut of a column-parallel linear, across threads
#pragma omp parallel
    {
        const int threads = omp_get_num_threads(), thread = omp_get_thread_num();
        const int o_begin = column_block_start(OC, threads, thread);
        const int o_end = column_block_start(OC, threads, thread + 1);
        if (o_end > o_begin) matmul_forward_columns(out, inp, weight, bias, N, C, OC, o_begin, o_end);
    }
}

void matmul_backward_input(float* dinp, const float* dout, const float* weight, int N, int C, int OC) {
    linear_sgemm(false, false, N, C, OC, 1.0f, dout, OC, weight, C, 0.0f, dinp, C);
}

void matmul_forward_gelu(float* out, float* pre_gelu, const float* inp, const float* weight, const float* bias, int N,
                         int C, int OC) {
    matmul_forward(pre_gelu, inp, weight, bias, N, C, OC);
    gelu_forward(out, pre_gelu, int64_t(N) * OC);
}

void matmul_backward_input_gelu(float* dinp, const float* dout, const float* weight, const float* pre_gelu, int N,
                                int C, int OC) {
    matmul_backward_input(dinp, dout, weight, N, C, OC);
    gelu_backward(dinp, pre_gelu, dinp, int64_t(N) * C);
}

void matmul_backward_input_columns(float* dinp, const float* dout, const float* weight, int N, int C, int OC,
                                   int c_begin, int c_end) {
    const int width = c_end - c_begin;
    linear_sgemm(false, false, N, width, OC, 1.0f, dout, OC, weight + c_begin, C, 0.0f, dinp, width);
}

void matmul_backward_weight(float* dweight, float* dbias, const float* dout, const float* inp, int N, int C, int OC,
                            int o_begin, int o_end) {
    // dweight [o_end − o_begin, C] += dout[:, o_begin:o_end]^T @ inp [N, C]
    linear_sgemm(true, false, o_end - o_begin, C, N, 1.0f, dout + o_begin, OC, inp, C, 1.0f,
                 dweight + int64_t(o_begin) * C, C);
    if (dbias) {
        for (int n = 0; n < N; n++) {
            const float* d = dout + int64_t(n) * OC;
#pragma omp simd
            for (int o = o_begin; o < o_end; o++) dbias[o] += d[o];
        }
    }
}

void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int N, int C, int OC) {
    matmul_backward_input(dinp, dout, weight, N, C, OC);
    // dweight [OC, C] += dout^T [OC, N] @ inp [N, C]
    linear_sgemm(true, false, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dweight, C);
    if (dbias) bias_backward(dbias, dout, N, OC);
}

// ----------------------------------------------------------------------------
// gelu, tanh approximation

static constexpr float gelu_scale = 0.7978845608028654f;  // sqrt(2 / pi)

void gelu_forward(float* out, const float* inp, int64_t N) {
#pragma omp parallel for simd
    for (int64_t i = 0; i < N; i++) {
        float x = inp[i];
        out[i] = 0.5f * x * (1.0f + vector_tanh(gelu_scale * (x + 0.044715f * x * x * x)));
    }
}

void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t N) {
#pragma omp parallel for simd
    for (int64_t i = 0; i < N; i++) {
        float x = inp[i];
        float u = gelu_scale * (x + 0.044715f * x * x * x);
        float th = vector_tanh(u);
        float sech2 = 1.0f - th * th;
        float du_dx = gelu_scale * (1.0f + 3.0f * 0.044715f * x * x);
        dinp[i] = dout[i] * (0.5f * (1.0f + th) + 0.5f * x * sech2 * du_dx);
    }
}

// ----------------------------------------------------------------------------
// residual

void residual_forward(float* out, const float* inp1, const float* inp2, int64_t N) {
#pragma omp parallel for simd if (N > 65536)
    for (int64_t i = 0; i < N; i++) out[i] = inp1[i] + inp2[i];
}

// ----------------------------------------------------------------------------
// attention: per (batch, head) pair, small GEMMs on strided views of qkv.
// Inside an OpenMP parallel region the OpenMP build of OpenBLAS runs each
// GEMM on the calling thread, so the pairs run in parallel.

// Causal softmax of each row of scores [T, T], in place; zero above the diagonal.
static void causal_softmax(float* scores, int T) {
    for (int t = 0; t < T; t++) {
        float* row = scores + int64_t(t) * T;
        float maxval = -INFINITY;
        for (int t2 = 0; t2 <= t; t2++) maxval = std::max(maxval, row[t2]);
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int t2 = 0; t2 <= t; t2++) {
            row[t2] = vector_exp(row[t2] - maxval);
            sum += row[t2];
        }
        float inv = 1.0f / sum;
        for (int t2 = 0; t2 <= t; t2++) row[t2] *= inv;
        for (int t2 = t + 1; t2 < T; t2++) row[t2] = 0.0f;
    }
}

void attention_forward(float* out, float* softmax_out, uint8_t* dropout_mask, float* dropout_out, const float* qkv,
                       float* /*scratch*/, int B, int T, int C, int NH, float p, const DropoutBox& box,
                       const DropoutKey& key) {
    const int hs = C / NH, qkv_stride = B * 3 * C, out_stride = B * C;  // row strides of one sequence
    const float scale = 1.0f / std::sqrt(float(hs));
    // S' = causal softmax(Q K^T · scale)
#pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            const float* q = qkv + int64_t(b) * 3 * C + h * hs;  // [T, hs], row stride B·3C
            const float* k = q + C;
            float* scores = softmax_out + (int64_t(b) * NH + h) * T * T;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, scale, q, qkv_stride, k, qkv_stride, 0.0f,
                        scores, T);
            causal_softmax(scores, T);
        }
    }
    // S = dropout(S'); S' itself at p = 0
    if (p > 0.0f) dropout_forward(dropout_out, dropout_mask, softmax_out, box, p, key);
    const float* scores = p > 0.0f ? dropout_out : softmax_out;
    // out = S V
#pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            const float* v = qkv + int64_t(b) * 3 * C + 2 * C + h * hs;
            const float* s = scores + (int64_t(b) * NH + h) * T * T;
            float* o = out + int64_t(b) * C + h * hs;  // [T, hs], row stride B·C
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, 1.0f, s, T, v, qkv_stride, 0.0f, o,
                        out_stride);
        }
    }
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* softmax_out,
                        const uint8_t* dropout_mask, const float* dropout_out, float* scratch, int B, int T, int C,
                        int NH, float p) {
    const int hs = C / NH, qkv_stride = B * 3 * C, out_stride = B * C;
    const float scale = 1.0f / std::sqrt(float(hs));
    // (b, h) pairs in parallel: each owns its columns of dqkv.
#pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            int64_t pair = int64_t(b) * NH + h;
            const float* q = qkv + int64_t(b) * 3 * C + h * hs;
            const float* k = q + C;
            const float* v = q + 2 * C;
            float* dq = dqkv + int64_t(b) * 3 * C + h * hs;
            float* dk = dq + C;
            float* dv = dq + 2 * C;
            const float* d = dout + int64_t(b) * C + h * hs;
            const float* sp = softmax_out + pair * T * T;                 // S'
            const float* s = p > 0.0f ? dropout_out + pair * T * T : sp;  // S
            float* ds = scratch + int64_t(omp_get_thread_num()) * T * T;
            // dV = S^T dO, dS = dO V^T
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, 1.0f, s, T, d, out_stride, 0.0f, dv,
                        qkv_stride);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, 1.0f, d, out_stride, v, qkv_stride, 0.0f, ds,
                        T);
            // dS' = dropout backward of dS (the mask only); then softmax backward
            // from its output: dD = S' ∘ (dS' − Σ_row S' ∘ dS'), times the score scale
            if (p > 0.0f) dropout_backward(ds, dropout_mask + pair * T * T, ds, int64_t(T) * T, p);
            for (int t = 0; t < T; t++) {
                float* row = ds + int64_t(t) * T;
                const float* sp_row = sp + int64_t(t) * T;
                float weighted = 0.0f;
#pragma omp simd reduction(+ : weighted)
                for (int t2 = 0; t2 <= t; t2++) weighted += sp_row[t2] * row[t2];
#pragma omp simd
                for (int t2 = 0; t2 < T; t2++) row[t2] = sp_row[t2] * (row[t2] - weighted) * scale;
            }
            // dQ = dD K, dK = dD^T Q
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, 1.0f, ds, T, k, qkv_stride, 0.0f, dq,
                        qkv_stride);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, 1.0f, ds, T, q, qkv_stride, 0.0f, dk,
                        qkv_stride);
        }
    }
}

// ----------------------------------------------------------------------------
// ring attention (context parallelism's p2p)

void ring_attention_start(float* out, float* stats, const RingAttention& ra, float* /*scratch*/) {
    std::memset(out, 0, sizeof(float) * int64_t(ra.T) * ra.B * ra.C);
    const int64_t rows = int64_t(ra.B) * ra.NH * ra.T;
    std::fill(stats, stats + rows, -INFINITY);
    std::fill(stats + rows, stats + 2 * rows, 0.0f);
}

void ring_attention_forward_block(float* out, float* stats, float* softmax_out, const float* qkv, const float* kv,
                                  const int kv_chunks[2], const RingAttention& ra, int b, float p,
                                  const DropoutKey& key, float* scratch) {
    const int B = ra.B, C = ra.C, NH = ra.NH, c = ra.chunk, S = ra.S, hs = C / NH;
    const float scale = 1.0f / std::sqrt(float(hs)), keep_scale = 1.0f / (1.0f - p);
    const int64_t rows = int64_t(B) * NH * ra.T;
#pragma omp parallel for
    for (int h = 0; h < NH; h++) {
        float* P = scratch + int64_t(omp_get_thread_num()) * 2 * c * c;  // one pair's exp(scores − m_new), dropped out
        float* z_scratch = P + int64_t(c) * c;                           // the pair's scores, where S' is not kept
        for (int qh = 0; qh < 2; qh++) {
            const int qc = ra.query_chunks[qh];
            const float* q = qkv + (int64_t(qh) * c * B + b) * 3 * C + h * hs;  // [c, hs], row stride B·3C
            float* o = out + (int64_t(qh) * c * B + b) * C + h * hs;            // [c, hs], row stride B·C
            float* row_max = stats + (int64_t(b) * NH + h) * ra.T + qh * c;
            float* row_sum = row_max + rows;
            for (int kh = 0; kh < 2; kh++) {
                const int kc = kv_chunks[kh];
                const ChunkPair pair = chunk_pair(qc, kc);
                if (pair == ChunkPair::none) continue;
                const float* k = kv + (int64_t(kh) * c * B + b) * 2 * C + h * hs;  // [c, hs], row stride B·2C
                const float* v = k + C;
                // [c, c]: in S' (row stride S), or in scratch under selective recomputation
                const int z_stride = softmax_out ? S : c;
                float* z = softmax_out ? softmax_out + ring_scores_at(ra, b, qh, h) + int64_t(kc) * c : z_scratch;
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, c, c, hs, scale, q, B * 3 * C, k, B * 2 * C, 0.0f,
                            z, z_stride);
                for (int i = 0; i < c; i++) {
                    const int valid = pair == ChunkPair::causal ? i + 1 : c;  // keys ≤ the query
                    const float* zi = z + int64_t(i) * z_stride;
                    float block_max = -INFINITY;
                    for (int j = 0; j < valid; j++) block_max = std::max(block_max, zi[j]);
                    const float m_new = std::max(row_max[i], block_max);
                    const float rescale = std::exp(row_max[i] - m_new);  // 0 for the first block a row meets
                    float sum = 0.0f;
                    float* Pi = P + int64_t(i) * c;
                    for (int j = 0; j < valid; j++) {
                        const float e = std::exp(zi[j] - m_new);
                        sum += e;
                        const int64_t g = ring_probs_index(ra, b, h, qc * c + i, kc * c + j);
                        Pi[j] = p == 0.0f ? e : dropout_uniform(key, uint64_t(g)) >= p ? e * keep_scale : 0.0f;
                    }
                    for (int j = valid; j < c; j++) Pi[j] = 0.0f;
                    row_sum[i] = row_sum[i] * rescale + sum;
                    row_max[i] = m_new;
                    float* oi = o + int64_t(i) * B * C;
                    for (int d = 0; d < hs; d++) oi[d] *= rescale;
                }
                // o += P V
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, c, hs, c, 1.0f, P, c, v, B * 2 * C, 1.0f, o,
                            B * C);
            }
        }
    }
}

void ring_attention_finish(float* out, float* softmax_out, uint8_t* dropout_mask, float* dropout_out, float* lse_out,
                           const float* stats, const RingAttention& ra, float p, const DropoutKey& key,
                           float* /*scratch*/) {
    const int B = ra.B, C = ra.C, NH = ra.NH, c = ra.chunk, S = ra.S, hs = C / NH;
    const int64_t rows = int64_t(B) * NH * ra.T;
#pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            for (int qh = 0; qh < 2; qh++) {
                const int qc = ra.query_chunks[qh];
                const float* row_max = stats + (int64_t(b) * NH + h) * ra.T + qh * c;
                const float* row_sum = row_max + rows;
                for (int i = 0; i < c; i++) {
                    const int last_key = qc * c + i;  // the query's own position
                    const float lse = row_max[i] + std::log(row_sum[i]);
                    if (lse_out) lse_out[(int64_t(b) * NH + h) * ra.T + qh * c + i] = lse;
                    if (softmax_out) {
                        float* si = softmax_out + ring_scores_at(ra, b, qh, h) + int64_t(i) * S;
                        for (int j = 0; j <= last_key; j++) si[j] = std::exp(si[j] - lse);
                        for (int j = last_key + 1; j < S; j++) si[j] = 0.0f;
                    }
                    float* oi = out + ((int64_t(qh) * c + i) * B + b) * C + h * hs;
                    const float inverse = 1.0f / row_sum[i];
                    for (int d = 0; d < hs; d++) oi[d] *= inverse;
                }
            }
        }
    }
    if (p == 0.0f || !softmax_out) return;
    for (int b = 0; b < B; b++)  // S = dropout(S'), one box per (sequence, half): [NH, chunk, S]
        for (int qh = 0; qh < 2; qh++) {
            const int64_t at = ring_scores_at(ra, b, qh, 0);
            const DropoutBox box{NH,
                                 c,
                                 S,
                                 int64_t(S) * S,
                                 S,
                                 (ra.batch_offset + b) * ra.heads_total + ra.first_head,
                                 int64_t(ra.query_chunks[qh]) * c};
            dropout_forward(dropout_out + at, dropout_mask + at, softmax_out + at, box, p, key);
        }
}

void ring_attention_backward_start(float* stats, float* dqkv, const float* dout, const float* out,
                                   const RingAttention& ra, float* /*scratch*/) {
    const int B = ra.B, C = ra.C, NH = ra.NH, T = ra.T, hs = C / NH;
#pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            for (int t = 0; t < T; t++) {
                const float* d = dout + (int64_t(t) * B + b) * C + h * hs;
                const float* o = out + (int64_t(t) * B + b) * C + h * hs;
                float sum = 0.0f;
                for (int j = 0; j < hs; j++) sum += d[j] * o[j];
                stats[(int64_t(b) * NH + h) * T + t] = sum;
                std::memset(dqkv + (int64_t(t) * B + b) * 3 * C + h * hs, 0, sizeof(float) * hs);
            }
        }
    }
}

void ring_attention_backward_block(float* dqkv, float* dkv, const float* dout, const float* qkv, const float* kv,
                                   const float* softmax_out, const uint8_t* dropout_mask, const float* dropout_out,
                                   const float* lse, const float* stats, const int kv_chunks[2],
                                   const RingAttention& ra, int b, float p, const DropoutKey& key, float* scratch) {
    const int B = ra.B, C = ra.C, NH = ra.NH, c = ra.chunk, S = ra.S, hs = C / NH;
    const float scale = 1.0f / std::sqrt(float(hs)), keep_scale = p > 0.0f ? 1.0f / (1.0f - p) : 1.0f;
#pragma omp parallel for
    for (int h = 0; h < NH; h++) {
        // per thread 4·c² floats (≤ s², as c ≤ s/4): dP then dZ of one pair [c, c]; where S' is not
        // kept (selective recomputation) S', S and the mask's bytes recomputed
        float* dz = scratch + int64_t(omp_get_thread_num()) * 4 * c * c;
        float* sp_scratch = dz + int64_t(c) * c;
        float* sd_scratch = sp_scratch + int64_t(c) * c;
        uint8_t* mask_scratch = reinterpret_cast<uint8_t*>(sd_scratch + int64_t(c) * c);
        for (int qh = 0; qh < 2; qh++) {
            const int qc = ra.query_chunks[qh];
            const float* q = qkv + (int64_t(qh) * c * B + b) * 3 * C + h * hs;
            float* dq = dqkv + (int64_t(qh) * c * B + b) * 3 * C + h * hs;
            const float* d = dout + (int64_t(qh) * c * B + b) * C + h * hs;
            const float* dot = stats + (int64_t(b) * NH + h) * ra.T + qh * c;  // Σ dO·O of each row
            const int64_t scores_at = ring_scores_at(ra, b, qh, h);
            for (int kh = 0; kh < 2; kh++) {
                const int kc = kv_chunks[kh];
                if (chunk_pair(qc, kc) == ChunkPair::none) continue;
                const float* k = kv + (int64_t(kh) * c * B + b) * 2 * C + h * hs;
                const float* v = k + C;
                float* dk = dkv + (int64_t(kh) * c * B + b) * 2 * C + h * hs;
                float* dv = dk + C;
                // the pair's [c, c] of S', its mask and S: kept (row stride S), or recomputed from the
                // scores and each row's log-sum-exp (selective recomputation; row stride c)
                const int64_t at = scores_at + int64_t(kc) * c;
                const int stride = softmax_out ? S : c;
                const float* sp = softmax_out ? softmax_out + at : sp_scratch;
                const float* sd = p == 0.0f ? sp : softmax_out ? dropout_out + at : sd_scratch;
                const uint8_t* mask = p == 0.0f ? nullptr : softmax_out ? dropout_mask + at : mask_scratch;
                if (!softmax_out) {
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, c, c, hs, scale, q, B * 3 * C, k, B * 2 * C,
                                0.0f, sp_scratch, c);
                    const float* row_lse = lse + (int64_t(b) * NH + h) * ra.T + qh * c;
                    for (int i = 0; i < c; i++) {
                        const int valid = chunk_pair(qc, kc) == ChunkPair::causal ? i + 1 : c;
                        float* si = sp_scratch + int64_t(i) * c;
                        for (int j = 0; j < c; j++) {
                            si[j] = j < valid ? std::exp(si[j] - row_lse[i]) : 0.0f;
                            if (p == 0.0f) continue;
                            const int64_t g = ring_probs_index(ra, b, h, qc * c + i, kc * c + j);
                            const bool keep = dropout_uniform(key, uint64_t(g)) >= p;
                            mask_scratch[int64_t(i) * c + j] = keep;
                            sd_scratch[int64_t(i) * c + j] = keep ? si[j] * keep_scale : 0.0f;
                        }
                    }
                }
                // dV += S^T dO, dP = dO V^T
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, c, hs, c, 1.0f, sd, stride, d, B * C, 1.0f, dv,
                            B * 2 * C);
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, c, c, hs, 1.0f, d, B * C, v, B * 2 * C, 0.0f, dz,
                            c);
                // dS' = dropout backward of dP; dZ = S' ∘ (dS' − Σ dO·O) · scale (S' is 0 above the diagonal)
                for (int i = 0; i < c; i++) {
                    float* row = dz + int64_t(i) * c;
                    const float* sp_row = sp + int64_t(i) * stride;
                    const uint8_t* mask_row = mask ? mask + int64_t(i) * stride : nullptr;
                    for (int j = 0; j < c; j++) {
                        const float ds = mask_row ? (mask_row[j] ? row[j] * keep_scale : 0.0f) : row[j];
                        row[j] = sp_row[j] * (ds - dot[i]) * scale;
                    }
                }
                // dQ += dZ K, dK += dZ^T Q
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, c, hs, c, 1.0f, dz, c, k, B * 2 * C, 1.0f, dq,
                            B * 3 * C);
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, c, hs, c, 1.0f, dz, c, q, B * 3 * C, 1.0f, dk,
                            B * 2 * C);
            }
        }
    }
}

void ring_attention_backward_finish(float* /*dqkv*/, const float* /*scratch*/, const RingAttention& /*ra*/) {}

// ----------------------------------------------------------------------------
// fused softmax + cross-entropy

void crossentropy_max_forward(float* maxes, const float* logits, int N, int V_real, int Vp_local) {
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float* row = logits + int64_t(n) * Vp_local;
        float maxval = -INFINITY;  // a rank with no real column contributes −inf
#pragma omp simd reduction(max : maxval)
        for (int v = 0; v < V_real; v++) maxval = std::max(maxval, row[v]);
        maxes[n] = maxval;
    }
}

void crossentropy_sum_forward(float* stats, const float* logits, const float* maxes, const int* targets,
                              int vocab_start, int N, int V_real, int Vp_local) {
    float* sums = stats;
    float* target_logits = stats + N;
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float* row = logits + int64_t(n) * Vp_local;
        const float maxval = maxes[n];
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int v = 0; v < V_real; v++) sum += vector_exp(row[v] - maxval);
        sums[n] = sum;
        int column = targets[n] - vocab_start;
        target_logits[n] = column >= 0 && column < V_real ? row[column] : 0.0f;
    }
}

void crossentropy_backward(float* logits, const float* lse, const int* targets, int vocab_start, float dloss, int N,
                           int V_real, int Vp_local) {
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        float* row = logits + int64_t(n) * Vp_local;
        const float l = lse[n];
#pragma omp simd
        for (int v = 0; v < V_real; v++) row[v] = dloss * vector_exp(row[v] - l);
        int column = targets[n] - vocab_start;
        if (column >= 0 && column < V_real) row[column] -= dloss;
        for (int v = V_real; v < Vp_local; v++) row[v] = 0.0f;
    }
}

// ----------------------------------------------------------------------------
// bias

void bias_dropout_residual_forward(float* out, uint8_t* mask, float* y, const float* residual, const float* bias,
                                   const DropoutBox& box, float p, const DropoutKey& key) {
    const int N = int(box.n0 * box.n1), C = int(box.n2);
    bias_forward(y, bias, N, C);
    dropout_forward(y, mask, y, box, p, key);
    residual_forward(out, residual, y, int64_t(N) * C);
}

void bias_forward(float* out, const float* bias, int N, int OC) {
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        float* o = out + int64_t(n) * OC;
#pragma omp simd
        for (int c = 0; c < OC; c++) o[c] += bias[c];
    }
}

void bias_backward(float* dbias, const float* dout, int N, int OC) {
#pragma omp parallel
    {
        int threads = omp_get_num_threads(), id = omp_get_thread_num();
        int o0 = int(int64_t(OC) * id / threads), o1 = int(int64_t(OC) * (id + 1) / threads);
        for (int n = 0; n < N; n++) {
            const float* d = dout + int64_t(n) * OC;
#pragma omp simd
            for (int o = o0; o < o1; o++) dbias[o] += d[o];
        }
    }
}

}  // namespace tpsp
