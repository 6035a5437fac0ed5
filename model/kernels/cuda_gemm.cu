// The GEMMs of cuda_kernels.h through cuBLASLt: bf16 inputs, fp32
// accumulation, bf16 outputs (fp32 for the weight gradients, which
// accumulate into the fp32 gradient buffers). The bias, and fc1's GELU and
// fc2's GELU gradient, are applied in the GEMM's epilogue, on the fp32
// accumulator, so the product is written once (where cuBLASLt has no such
// algorithm, the GELU kernels run after a plain GEMM, and stderr says so once).
//
// cuBLASLt is column-major, and a row-major [r, c] matrix is a column-major
// [c, r] one. So out [N, OC] = inp [N, C] @ weight [OC, C]^T is, to cuBLASLt,
// out^T [OC, N] = (weight seen as [C, OC])^T · (inp seen as [C, N]).
#include <atomic>
#include <compare>
#include <cstdint>
#include <cstdio>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

#include "model/kernels/cuda_kernels.h"

namespace tpsp {
using gpu::batched_gemm;
using gpu::check_cublas;
using gpu::check_cuda;
using gpu::check_launch;
using gpu::GpuContext;

// The largest power of two ≤ 256 that divides the address: cuBLASLt's
// heuristics assume 256-byte alignment unless told otherwise.
static uint32_t pointer_alignment(const void* p) {
    uintptr_t address = reinterpret_cast<uintptr_t>(p);
    uint32_t alignment = 256;
    while (alignment > 1 && address % alignment != 0) alignment /= 2;
    return alignment;
}

// One column-major operand: `rows × cols` with leading dimension ld, `batch`
// of them `stride` elements apart.
struct Operand {
    const void* data;
    cudaDataType type;
    uint64_t rows, cols;
    int64_t ld, stride;
};

static cublasLtMatrixLayout_t make_layout(const Operand& x, int batch) {
    cublasLtMatrixLayout_t layout;
    check_cublas(cublasLtMatrixLayoutCreate(&layout, x.type, x.rows, x.cols, x.ld), "matrix layout");
    if (batch > 1) {
        int32_t count = batch;
        check_cublas(
            cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)),
            "batch count");
        check_cublas(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &x.stride,
                                                      sizeof(x.stride)),
                     "batch stride");
    }
    return layout;
}

// What cuBLASLt does to the product before it stores D (m × n).
struct Epilogue {
    cublasLtEpilogue_t kind = CUBLASLT_EPILOGUE_DEFAULT;
    const bf16* bias = nullptr;  // [m], added to every column (BIAS, GELU_AUX_BIAS)
    // m × n, ld m: GELU_AUX_BIAS writes the GELU's input there; DGELU reads it
    const bf16* aux = nullptr;
};

static Epilogue plain() { return {}; }
static Epilogue with_bias(const bf16* bias) { return bias ? Epilogue{CUBLASLT_EPILOGUE_BIAS, bias, nullptr} : plain(); }

// Everything the choice of algorithm depends on.
struct GemmKey {
    bool transa, transb;
    int m, n, k;
    int64_t lda, ldb, ldd, stride_a, stride_b, stride_d;
    int batch;
    cudaDataType d_type;
    cublasLtEpilogue_t epilogue;
    uint32_t align_a, align_b, align_d, align_aux;  // bytes
    auto operator<=>(const GemmKey&) const = default;
};

static void set_epilogue(cublasLtMatmulDesc_t desc, const Epilogue& epilogue, int m) {
    if (epilogue.kind == CUBLASLT_EPILOGUE_DEFAULT) return;
    check_cublas(
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue.kind, sizeof(epilogue.kind)),
        "epilogue");
    if (epilogue.bias)
        check_cublas(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &epilogue.bias,
                                                    sizeof(epilogue.bias)),
                     "bias pointer");
    if (epilogue.aux) {
        const int64_t aux_ld = m;
        check_cublas(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &epilogue.aux,
                                                    sizeof(epilogue.aux)),
                     "GELU input pointer");
        check_cublas(
            cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof(aux_ld)),
            "GELU input leading dimension");
    }
}

// cuBLASLt's heuristic's first choice for a GEMM, asked once per shape: the
// query costs tens of microseconds, a step runs the same few shapes again
// and again. None where cuBLASLt has no algorithm (an epilogue it cannot do
// for this shape, say).
static std::optional<cublasLtMatmulAlgo_t> choose_algorithm(const GemmKey& key, cublasLtMatmulDesc_t desc,
                                                            cublasLtMatrixLayout_t a_layout,
                                                            cublasLtMatrixLayout_t b_layout,
                                                            cublasLtMatrixLayout_t d_layout) {
    // per thread, as the handle that asked (gpu::context())
    thread_local std::map<GemmKey, std::optional<cublasLtMatmulAlgo_t>> chosen;
    auto found = chosen.find(key);
    if (found != chosen.end()) return found->second;
    const GpuContext& ctx = gpu::context();
    cublasLtMatmulPreference_t preference;
    check_cublas(cublasLtMatmulPreferenceCreate(&preference), "matmul preference");
    const uint64_t workspace_bytes = ctx.blas_workspace_bytes;
    check_cublas(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                      &workspace_bytes, sizeof(workspace_bytes)),
                 "workspace size");
    const std::pair<cublasLtMatmulPreferenceAttributes_t, const uint32_t*> alignments[] = {
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &key.align_a},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &key.align_b},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &key.align_d},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &key.align_d}};
    for (const auto& [attribute, value] : alignments)
        check_cublas(cublasLtMatmulPreferenceSetAttribute(preference, attribute, value, sizeof(uint32_t)), "alignment");
    cublasLtMatmulHeuristicResult_t heuristic;
    int returned = 0;
    const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(ctx.blas, desc, a_layout, b_layout, d_layout, d_layout,
                                                                 preference, 1, &heuristic, &returned);
    cublasLtMatmulPreferenceDestroy(preference);
    std::optional<cublasLtMatmulAlgo_t> algo;
    if (status == CUBLAS_STATUS_SUCCESS && returned > 0) algo = heuristic.algo;
    else if (status != CUBLAS_STATUS_NOT_SUPPORTED && status != CUBLAS_STATUS_SUCCESS)
        check_cublas(status, "matmul heuristic");
    chosen.emplace(key, algo);
    return algo;
}

// D = epilogue(alpha · op(A) · op(B) + beta · D), D is m × n, op(A) m × k,
// op(B) k × n. False, with nothing enqueued, where cuBLASLt has no algorithm.
static bool try_lt_matmul(bool transa, bool transb, int m, int n, int k, float alpha, const void* A, int64_t lda,
                          int64_t strideA, const void* B, int64_t ldb, int64_t strideB, float beta, void* D,
                          cudaDataType d_type, int64_t ldd, int64_t strideD, int batch, const Epilogue& epilogue) {
    const GpuContext& ctx = gpu::context();
    cublasLtMatmulDesc_t desc;
    check_cublas(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "matmul descriptor");
    const cublasOperation_t op_a = transa ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = transb ? CUBLAS_OP_T : CUBLAS_OP_N;
    check_cublas(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)), "transa");
    check_cublas(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)), "transb");
    set_epilogue(desc, epilogue, m);
    const Operand a{A, CUDA_R_16BF, uint64_t(transa ? k : m), uint64_t(transa ? m : k), lda, strideA};
    const Operand b{B, CUDA_R_16BF, uint64_t(transb ? n : k), uint64_t(transb ? k : n), ldb, strideB};
    const Operand d{D, d_type, uint64_t(m), uint64_t(n), ldd, strideD};
    cublasLtMatrixLayout_t a_layout = make_layout(a, batch), b_layout = make_layout(b, batch),
                           d_layout = make_layout(d, batch);

    const std::optional<cublasLtMatmulAlgo_t> algo = choose_algorithm(
        {transa, transb, m, n, k, lda, ldb, ldd, strideA, strideB, strideD, batch, d_type, epilogue.kind,
         pointer_alignment(A), pointer_alignment(B), pointer_alignment(D),
         epilogue.aux ? pointer_alignment(epilogue.aux) : 256},
        desc, a_layout, b_layout, d_layout);
    if (algo)
        check_cublas(cublasLtMatmul(ctx.blas, desc, &alpha, A, a_layout, B, b_layout, &beta, D, d_layout, D, d_layout,
                                    &*algo, ctx.blas_workspace, ctx.blas_workspace_bytes, ctx.stream),
                     "cublasLtMatmul");

    cublasLtMatrixLayoutDestroy(d_layout);
    cublasLtMatrixLayoutDestroy(b_layout);
    cublasLtMatrixLayoutDestroy(a_layout);
    cublasLtMatmulDescDestroy(desc);
    return algo.has_value();
}

static void lt_matmul(bool transa, bool transb, int m, int n, int k, float alpha, const void* A, int64_t lda,
                      int64_t strideA, const void* B, int64_t ldb, int64_t strideB, float beta, void* D,
                      cudaDataType d_type, int64_t ldd, int64_t strideD, int batch, const Epilogue& epilogue) {
    if (!try_lt_matmul(transa, transb, m, n, k, alpha, A, lda, strideA, B, ldb, strideB, beta, D, d_type, ldd, strideD,
                       batch, epilogue))
        throw std::runtime_error("cuBLASLt has no algorithm for a " + std::to_string(m) + "×" + std::to_string(n) +
                                 "×" + std::to_string(k) + " GEMM");
}

// Said once: the GELU then runs as its own kernel, which the figures should know.
static void note_unfused_gelu(const char* which) {
    static std::atomic<bool> said{false};  // the stand-in's rank threads share the line
    if (!said.exchange(true))
        std::fprintf(stderr, "tpsp: cuBLASLt has no %s epilogue here: GEMM and GELU run apart\n", which);
}

void gpu::batched_gemm(bool transa, bool transb, int m, int n, int k, float alpha, const bf16* A, int lda,
                       int64_t strideA, const bf16* B, int ldb, int64_t strideB, float beta, bf16* D, int ldd,
                       int64_t strideD, int batch) {
    lt_matmul(transa, transb, m, n, k, alpha, A, lda, strideA, B, ldb, strideB, beta, D, CUDA_R_16BF, ldd, strideD,
              batch, plain());
}

void gpu::batched_gemm(bool transa, bool transb, int m, int n, int k, float alpha, const bf16* A, int lda,
                       int64_t strideA, const bf16* B, int ldb, int64_t strideB, float beta, float* D, int ldd,
                       int64_t strideD, int batch) {
    lt_matmul(transa, transb, m, n, k, alpha, A, lda, strideA, B, ldb, strideB, beta, D, CUDA_R_32F, ldd, strideD,
              batch, plain());
}

void matmul_forward(bf16* out, const bf16* inp, const bf16* weight, const bf16* bias, int N, int C, int OC) {
    // out^T [OC, N] = (weight as [C, OC])^T · (inp as [C, N]) + bias
    lt_matmul(true, false, OC, N, C, 1.0f, weight, C, 0, inp, C, 0, 0.0f, out, CUDA_R_16BF, OC, 0, 1, with_bias(bias));
}

// cuBLASLt's GELU matrix needs a leading dimension divisible by 8, and
// 16-byte aligned rows; other shapes take the GEMM and the GELU kernel apart.
static bool gelu_epilogue_fits(int OC, const void* aux) {
    return OC % 8 == 0 && reinterpret_cast<uintptr_t>(aux) % 16 == 0;
}

void matmul_forward_gelu(bf16* out, bf16* pre_gelu, const bf16* inp, const bf16* weight, const bf16* bias, int N, int C,
                         int OC) {
    // out^T [OC, N] = gelu(pre_gelu^T), pre_gelu^T = (weight as [C, OC])^T · (inp as [C, N]) + bias
    const bool fits = bias && gelu_epilogue_fits(OC, pre_gelu);
    if (fits && try_lt_matmul(true, false, OC, N, C, 1.0f, weight, C, 0, inp, C, 0, 0.0f, out, CUDA_R_16BF, OC, 0, 1,
                              {CUBLASLT_EPILOGUE_GELU_AUX_BIAS, bias, pre_gelu}))
        return;
    if (fits) note_unfused_gelu("GELU_AUX_BIAS");
    matmul_forward(pre_gelu, inp, weight, bias, N, C, OC);
    gelu_forward(out, pre_gelu, int64_t(N) * OC);
}

void matmul_backward(bf16* dinp, float* dweight, float* dbias, const bf16* dout, const bf16* inp, const bf16* weight,
                     int N, int C, int OC) {
    matmul_backward_input(dinp, dout, weight, N, C, OC);
    matmul_backward_weight(dweight, dbias, dout, inp, N, C, OC, 0, OC);
}

void matmul_backward_input(bf16* dinp, const bf16* dout, const bf16* weight, int N, int C, int OC) {
    matmul_backward_input_columns(dinp, dout, weight, N, C, OC, 0, C);
}

void matmul_backward_input_columns(bf16* dinp, const bf16* dout, const bf16* weight, int N, int C, int OC, int c_begin,
                                   int c_end) {
    // dinp^T [width, N] = (weight columns as [width, OC], ld C) · (dout as [OC, N])
    const int width = c_end - c_begin;
    lt_matmul(false, false, width, N, OC, 1.0f, weight + c_begin, C, 0, dout, OC, 0, 0.0f, dinp, CUDA_R_16BF, width, 0,
              1, plain());
}

void matmul_backward_input_gelu(bf16* dinp, const bf16* dout, const bf16* weight, const bf16* pre_gelu, int N, int C,
                                int OC) {
    // dinp^T [C, N] = gelu'(pre_gelu^T) ⊙ ((weight as [C, OC]) · (dout as [OC, N]))
    const bool fits = gelu_epilogue_fits(C, pre_gelu);
    if (fits && try_lt_matmul(false, false, C, N, OC, 1.0f, weight, C, 0, dout, OC, 0, 0.0f, dinp, CUDA_R_16BF, C, 0, 1,
                              {CUBLASLT_EPILOGUE_DGELU, nullptr, pre_gelu}))
        return;
    if (fits) note_unfused_gelu("DGELU");
    matmul_backward_input(dinp, dout, weight, N, C, OC);
    gelu_backward(dinp, pre_gelu, dinp, int64_t(N) * C);
}

void matmul_backward_weight(float* dweight, float* dbias, const bf16* dout, const bf16* inp, int N, int C, int OC,
                            int o_begin, int o_end) {
    // dweight rows [o_begin, o_end) as [C, width]: += (inp as [C, N]) · (dout columns as [width, N], ld OC)^T
    const int width = o_end - o_begin;
    lt_matmul(false, true, C, width, N, 1.0f, inp, C, 0, dout + o_begin, OC, 0, 1.0f, dweight + int64_t(o_begin) * C,
              CUDA_R_32F, C, 0, 1, plain());
    if (dbias) bias_backward_columns(dbias + o_begin, dout + o_begin, N, width, OC);
}

}  // namespace tpsp
