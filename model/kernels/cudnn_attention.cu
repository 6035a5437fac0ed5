// cuDNN's fused (flash) attention through the backend graph API. cuDNN
// fuses a graph of matmuls, pointwise operations and reductions into one
// kernel when the graph has the shape of attention; the frontend library
// that usually writes that graph is not a dependency here, so the two
// graphs below are written out node by node, in the order of cuDNN
// frontend's composite SDPA nodes (the form cuDNN ≤ 9.20 recognises).
//
// Tensors are 4-D [batch, head, row, column]. Q, K, V are strided views of
// qkv [T, B, 3C]: element (b, h, t, d) of Q is qkv[(t·B + b)·3C + h·hs + d],
// K and V the same C and 2C columns further. Virtual tensors live only inside
// the fused kernel; the others are bound to device (or, by value, host)
// pointers when the plan runs.
#include "model/kernels/cudnn_attention.h"

#include <cudnn.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common/loaded_library.h"
#include "model/kernels/cuda_device.h"

namespace tpsp {
namespace {

void check(cudnnStatus_t status, const char* what) {
    if (status == CUDNN_STATUS_SUCCESS) return;
    char detail[1024] = "";
    cudnnGetLastErrorString(detail, sizeof detail);
    throw std::runtime_error(std::string("cuDNN fused attention: ") + what + ": " + cudnnGetErrorString(status) +
                             (detail[0] ? std::string(" (") + detail + ")" : std::string()) +
                             "; model.attention: explicit runs without cuDNN");
}

// One cuDNN handle per thread, on the kernels' stream (as cuBLASLt's: the
// rank threads of the one-GPU stand-in each have their stream).
cudnnHandle_t handle() {
    thread_local cudnnHandle_t h = [] {
        cudnnHandle_t created;
        check(cudnnCreate(&created), "cudnnCreate");
        return created;
    }();
    check(cudnnSetStream(h, gpu::context().stream), "cudnnSetStream");
    return h;
}

using Shape = std::array<int64_t, 4>;

// What a plan is made for: this process's GPU, through its cuDNN handle, or
// a GPU described to cuDNN by its properties, which needs no device (cuDNN's
// deviceless compilation, 9.8 and later).
struct Target {
    cudnnHandle_t handle = nullptr;
    cudnnBackendDescriptor_t device_properties = nullptr;
};

enum class Storage { device, virtual_, by_value };

struct Tensor {
    cudnnBackendDescriptor_t desc;
    int64_t uid;
    Shape dims;
};

// The descriptors of one operation graph, kept for as long as the plan made
// from them runs.
class Graph {
public:
    Graph() = default;
    Graph(const Graph&) = delete;
    ~Graph() {
        for (auto it = descriptors_.rbegin(); it != descriptors_.rend(); ++it) cudnnBackendDestroyDescriptor(*it);
    }

    Tensor tensor(const Shape& dims, const Shape& strides, cudnnDataType_t type, Storage storage) {
        cudnnBackendDescriptor_t d = make(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
        const int64_t uid = next_uid_++, alignment = 16;
        const bool is_virtual = storage == Storage::virtual_, by_value = storage == Storage::by_value;
        set(d, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type);
        set(d, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims.data());
        set(d, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides.data());
        set(d, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
        set(d, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment);
        set(d, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual);
        if (by_value) set(d, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value);
        finalize(d, "tensor descriptor");
        return {d, uid, dims};
    }
    // A contiguous intermediate of the given dims.
    Tensor virtual_tensor(const Shape& dims, cudnnDataType_t type = CUDNN_DATA_FLOAT) {
        return tensor(dims, contiguous(dims), type, Storage::virtual_);
    }
    Tensor scalar(cudnnDataType_t type) { return tensor({1, 1, 1, 1}, {1, 1, 1, 1}, type, Storage::by_value); }

    // y = mode(inputs...), computed in `math`; axis for GEN_INDEX
    void pointwise(cudnnPointwiseMode_t mode, std::initializer_list<const Tensor*> inputs, const Tensor& y,
                   cudnnDataType_t math = CUDNN_DATA_FLOAT, int64_t axis = -1) {
        cudnnBackendDescriptor_t pw = make(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
        set(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
        set(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &math);
        if (axis >= 0) set(pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis);
        finalize(pw, "pointwise descriptor");
        cudnnBackendDescriptor_t op = make(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
        link(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw);
        const cudnnBackendAttributeName_t slots[] = {CUDNN_ATTR_OPERATION_POINTWISE_XDESC,
                                                     CUDNN_ATTR_OPERATION_POINTWISE_BDESC,
                                                     CUDNN_ATTR_OPERATION_POINTWISE_TDESC};
        int slot = 0;
        for (const Tensor* x : inputs) link(op, slots[slot++], x->desc);
        link(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y.desc);
        add_operation(op, "pointwise operation");
    }
    // c = a @ b per (batch, head), fp32 accumulation
    void matmul(const Tensor& a, const Tensor& b, const Tensor& c) {
        cudnnBackendDescriptor_t mm = make(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
        const cudnnDataType_t compute = CUDNN_DATA_FLOAT;
        set(mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute);
        finalize(mm, "matmul descriptor");
        cudnnBackendDescriptor_t op = make(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
        link(op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, a.desc);
        link(op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, b.desc);
        link(op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, c.desc);
        link(op, CUDNN_ATTR_OPERATION_MATMUL_DESC, mm);
        add_operation(op, "matmul operation");
    }
    // y [.., 1] = reduce(x) over the last dimension
    void reduction(cudnnReduceTensorOp_t mode, const Tensor& x, const Tensor& y) {
        cudnnBackendDescriptor_t r = make(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
        const cudnnDataType_t compute = CUDNN_DATA_FLOAT;
        set(r, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode);
        set(r, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute);
        finalize(r, "reduction descriptor");
        cudnnBackendDescriptor_t op = make(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
        link(op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x.desc);
        link(op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y.desc);
        link(op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, r);
        add_operation(op, "reduction operation");
    }
    // mask = Bernoulli(keep) drawn by Philox from (seed, offset)
    void bernoulli(const Tensor& mask, const Tensor& seed, const Tensor& offset, double keep) {
        cudnnBackendDescriptor_t rng = make(CUDNN_BACKEND_RNG_DESCRIPTOR);
        const cudnnRngDistribution_t distribution = CUDNN_RNG_DISTRIBUTION_BERNOULLI;
        set(rng, CUDNN_ATTR_RNG_DISTRIBUTION, CUDNN_TYPE_RNG_DISTRIBUTION, 1, &distribution);
        set(rng, CUDNN_ATTR_RNG_BERNOULLI_DIST_PROBABILITY, CUDNN_TYPE_DOUBLE, 1, &keep);
        finalize(rng, "rng descriptor");
        cudnnBackendDescriptor_t op = make(CUDNN_BACKEND_OPERATION_RNG_DESCRIPTOR);
        link(op, CUDNN_ATTR_OPERATION_RNG_YDESC, mask.desc);
        link(op, CUDNN_ATTR_OPERATION_RNG_DESC, rng);
        link(op, CUDNN_ATTR_OPERATION_RNG_SEED, seed.desc);
        link(op, CUDNN_ATTR_OPERATION_RNG_OFFSET_DESC, offset.desc);
        add_operation(op, "rng operation");
    }
    // y: the same elements as x seen through other dims and strides (a transpose)
    void reshape(const Tensor& x, const Tensor& y) {
        cudnnBackendDescriptor_t op = make(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
        link(op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x.desc);
        link(op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y.desc);
        add_operation(op, "reshape operation");
    }

    // The execution plan of the first engine cuDNN's heuristics offer that
    // accepts the graph, for `target`; its workspace bytes in *workspace.
    // For a described GPU with no driver to load the kernel into: null once
    // cuDNN has compiled it.
    cudnnBackendDescriptor_t plan(const Target& target, int64_t* workspace) {
        cudnnBackendDescriptor_t graph = make(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
        if (target.handle) set(graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &target.handle);
        set(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, int64_t(operations_.size()),
            operations_.data());
        finalize(graph, "operation graph");
        cudnnBackendDescriptor_t heuristics = make(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
        const cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
        link(heuristics, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph);
        set(heuristics, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
        if (target.device_properties) describe_device(heuristics, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, target);
        finalize(heuristics, "engine heuristics");
        int64_t count = 0;
        check(cudnnBackendGetAttribute(heuristics, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0,
                                       &count, nullptr),
              "engine heuristics results");
        std::vector<cudnnBackendDescriptor_t> configs(static_cast<size_t>(count));
        for (cudnnBackendDescriptor_t& c : configs) c = make(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
        check(cudnnBackendGetAttribute(heuristics, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, count,
                                       &count, configs.data()),
              "engine configs");
        cudnnStatus_t last = CUDNN_STATUS_NOT_SUPPORTED;
        for (int64_t i = 0; i < count; i++) {
            cudnnBackendDescriptor_t plan = make(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
            if (target.handle) set(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &target.handle);
            else describe_device(plan, CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, target);
            link(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, configs[i]);
            last = cudnnBackendFinalize(plan);
            if (last != CUDNN_STATUS_SUCCESS) continue;
            int64_t returned = 0;
            check(cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1,
                                           &returned, workspace),
                  "plan workspace size");
            return plan;
        }
        // without a device, cuDNN generates and compiles the fused kernel, then cannot load it
        if (!target.handle && last == CUDNN_STATUS_EXECUTION_FAILED_CUDA_DRIVER) return nullptr;
        check(last, count ? "no engine cuDNN offered takes this attention graph"
                          : "cuDNN's heuristics offer no engine for this attention graph");
        return nullptr;
    }

    static Shape contiguous(const Shape& dims) { return {dims[1] * dims[2] * dims[3], dims[2] * dims[3], dims[3], 1}; }

private:
    // Tells the heuristics or a plan which GPU it is for (cuDNN 9.8 and later).
    static void describe_device(cudnnBackendDescriptor_t d, cudnnBackendDescriptorType_t type, const Target& target) {
#if CUDNN_VERSION >= 90800
        const cudnnBackendAttributeName_t name = type == CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR
                                                     ? CUDNN_ATTR_EXECUTION_PLAN_DEVICEPROP
                                                     : CUDNN_ATTR_ENGINEHEUR_DEVICEPROP;
        link(d, name, target.device_properties);
#else
        (void)d, (void)type, (void)target;
        check(CUDNN_STATUS_NOT_SUPPORTED, "planning for a described GPU needs cuDNN 9.8 or later");
#endif
    }
    cudnnBackendDescriptor_t make(cudnnBackendDescriptorType_t type) {
        cudnnBackendDescriptor_t d;
        check(cudnnBackendCreateDescriptor(type, &d), "create descriptor");
        descriptors_.push_back(d);
        return d;
    }
    static void set(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type,
                    int64_t count, const void* values) {
        check(cudnnBackendSetAttribute(d, name, type, count, values), "set attribute");
    }
    // the attribute `name` of d is the descriptor `other` (a tensor, an operation's settings, ...)
    static void link(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name, cudnnBackendDescriptor_t other) {
        set(d, name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &other);
    }
    static void finalize(cudnnBackendDescriptor_t d, const char* what) { check(cudnnBackendFinalize(d), what); }
    void add_operation(cudnnBackendDescriptor_t op, const char* what) {
        finalize(op, what);
        operations_.push_back(op);
    }

    std::vector<cudnnBackendDescriptor_t> descriptors_;
    std::vector<cudnnBackendDescriptor_t> operations_;
    int64_t next_uid_ = 1;
};

// The causal mask on scores [b, h, row, column]: keep column ≤ row, else the
// lowest float (exp of which is 0).
Tensor causal_mask(Graph& g, const Tensor& scores, const Tensor& lowest) {
    const Shape& dims = scores.dims;
    Tensor row = g.virtual_tensor(dims, CUDNN_DATA_INT32), column = g.virtual_tensor(dims, CUDNN_DATA_INT32);
    g.pointwise(CUDNN_POINTWISE_GEN_INDEX, {&scores}, row, CUDNN_DATA_FLOAT, 2);
    g.pointwise(CUDNN_POINTWISE_GEN_INDEX, {&scores}, column, CUDNN_DATA_FLOAT, 3);
    Tensor visible = g.virtual_tensor(dims, CUDNN_DATA_BOOLEAN);
    g.pointwise(CUDNN_POINTWISE_CMP_GE, {&row, &column}, visible, CUDNN_DATA_BOOLEAN);
    Tensor masked = g.virtual_tensor(dims);
    g.pointwise(CUDNN_POINTWISE_BINARY_SELECT, {&scores, &lowest, &visible}, masked);
    return masked;
}

// The shapes of one attention call and the strided views of qkv.
struct AttentionShape {
    int B, T, C, NH;
    int hs() const { return C / NH; }
    Shape heads() const { return {B, NH, T, hs()}; }
    // [b, h, t, d] of a [T, B, width] tensor, head h at columns h·hs
    Shape strides(int64_t width) const { return {width, hs(), int64_t(B) * width, 1}; }
    Shape transposed_dims() const { return {B, NH, hs(), T}; }  // K^T, V^T
    Shape transposed_strides(int64_t width) const { return {width, hs(), 1, int64_t(B) * width}; }
    Shape scores() const { return {B, NH, T, T}; }
    Shape rows() const { return {B, NH, T, 1}; }
    // [b, h, column, row]: scores read transposed
    Shape scores_transposed_strides() const { return {int64_t(NH) * T * T, int64_t(T) * T, 1, T}; }
};

using PlanKey = std::tuple<int, int, int, int, float, bool>;  // B, T, C, NH, p, backward

// A finalised plan with the uids of the tensors bound at each run, and the
// by-value scalars it reads from host memory when it runs.
struct Plan {
    Graph graph;
    cudnnBackendDescriptor_t plan = nullptr;
    int64_t workspace_bytes = 0;
    float attention_scale = 0, lowest = std::numeric_limits<float>::lowest(), dropout_scale = 1, keep = 1;
    // uids; 0 where this graph has no such tensor
    int64_t q = 0, k = 0, v = 0, o = 0, stats = 0, dout = 0, dq = 0, dk = 0, dv = 0, dq_accum = 0, softmax_sum = 0;
    int64_t attention_scale_uid = 0, lowest_uid = 0, dropout_scale_uid = 0, keep_uid = 0, seed = 0, offset = 0;
};

// Q, K^T (or K), V (or V^T), the scalars and the dropout's RNG: the start of both graphs.
struct Inputs {
    Tensor q, k, v, scale, lowest, seed, offset;
};

Inputs attention_inputs(Graph& g, Plan& plan, const AttentionShape& s, bool v_transposed) {
    const int64_t width = 3 * int64_t(s.C);
    Inputs in{g.tensor(s.heads(), s.strides(width), CUDNN_DATA_BFLOAT16, Storage::device),
              g.tensor(s.transposed_dims(), s.transposed_strides(width), CUDNN_DATA_BFLOAT16, Storage::device),
              v_transposed
                  ? g.tensor(s.transposed_dims(), s.transposed_strides(width), CUDNN_DATA_BFLOAT16, Storage::device)
                  : g.tensor(s.heads(), s.strides(width), CUDNN_DATA_BFLOAT16, Storage::device),
              g.scalar(CUDNN_DATA_FLOAT),
              g.scalar(CUDNN_DATA_FLOAT),
              g.tensor({1, 1, 1, 1}, {1, 1, 1, 1}, CUDNN_DATA_INT64, Storage::device),
              g.tensor({1, 1, 1, 1}, {1, 1, 1, 1}, CUDNN_DATA_INT64, Storage::device)};
    plan.q = in.q.uid, plan.k = in.k.uid, plan.v = in.v.uid;
    plan.attention_scale_uid = in.scale.uid, plan.lowest_uid = in.lowest.uid;
    plan.attention_scale = 1.0f / std::sqrt(float(s.hs()));
    return in;
}

// scores = causal_mask(scale · Q K^T)
Tensor masked_scores(Graph& g, const AttentionShape& s, const Inputs& in, bool subtract_stats, const Tensor* stats) {
    Tensor product = g.virtual_tensor(s.scores()), scaled = g.virtual_tensor(s.scores());
    g.matmul(in.q, in.k, product);
    g.pointwise(CUDNN_POINTWISE_MUL, {&product, &in.scale}, scaled);
    if (!subtract_stats) return causal_mask(g, scaled, in.lowest);
    Tensor shifted = g.virtual_tensor(s.scores());  // backward: scores − lse, before the mask (as cuDNN's)
    g.pointwise(CUDNN_POINTWISE_SUB, {&scaled, stats}, shifted);
    return causal_mask(g, shifted, in.lowest);
}

void bind_dropout(Graph& g, Plan& plan, const Inputs& in, float p, Tensor* mask, Tensor* dropout_scale) {
    *mask = g.virtual_tensor(mask->dims);
    g.bernoulli(*mask, in.seed, in.offset, 1.0 - p);
    *dropout_scale = g.scalar(CUDNN_DATA_FLOAT);
    plan.seed = in.seed.uid, plan.offset = in.offset.uid;
    plan.dropout_scale_uid = dropout_scale->uid;
    plan.dropout_scale = 1.0f / (1.0f - p);
}

// out = dropout(softmax(masked scores)) V, stats = lse of the masked scores.
void build_forward(Plan& plan, const AttentionShape& s, float p) {
    Graph& g = plan.graph;
    Inputs in = attention_inputs(g, plan, s, false);
    Tensor scores = masked_scores(g, s, in, false, nullptr);
    Tensor max = g.virtual_tensor(s.rows()), shifted = g.virtual_tensor(s.scores()),
           exps = g.virtual_tensor(s.scores()), sum = g.virtual_tensor(s.rows()), log_sum = g.virtual_tensor(s.rows());
    Tensor stats = g.tensor(s.rows(), Graph::contiguous(s.rows()), CUDNN_DATA_FLOAT, Storage::device);
    g.reduction(CUDNN_REDUCE_TENSOR_MAX, scores, max);
    g.pointwise(CUDNN_POINTWISE_SUB, {&scores, &max}, shifted);
    g.pointwise(CUDNN_POINTWISE_EXP, {&shifted}, exps);
    g.reduction(CUDNN_REDUCE_TENSOR_ADD, exps, sum);
    g.pointwise(CUDNN_POINTWISE_LOG, {&sum}, log_sum);
    g.pointwise(CUDNN_POINTWISE_ADD, {&max, &log_sum}, stats);
    // the probabilities go into the second matmul in bf16
    Tensor probs = g.virtual_tensor(s.scores(), p > 0 ? CUDNN_DATA_FLOAT : CUDNN_DATA_BFLOAT16);
    g.pointwise(CUDNN_POINTWISE_DIV, {&exps, &sum}, probs);
    if (p > 0) {
        Tensor mask{nullptr, 0, s.scores()}, dropout_scale{};
        bind_dropout(g, plan, in, p, &mask, &dropout_scale);
        Tensor kept = g.virtual_tensor(s.scores()), dropped = g.virtual_tensor(s.scores(), CUDNN_DATA_BFLOAT16);
        g.pointwise(CUDNN_POINTWISE_MUL, {&probs, &mask}, kept);
        g.pointwise(CUDNN_POINTWISE_MUL, {&kept, &dropout_scale}, dropped);
        probs = dropped;
    }
    Tensor out = g.tensor(s.heads(), s.strides(s.C), CUDNN_DATA_BFLOAT16, Storage::device);
    g.matmul(probs, in.v, out);
    plan.o = out.uid, plan.stats = stats.uid;
}

// dV = Pᵀ dO, dS = P ⊙ (dP − Σ dO ⊙ O) · scale, dK = dSᵀ Q, dQ = dS K with
// P rebuilt from the stats; dQ accumulates in fp32 first, as cuDNN requires.
void build_backward(Plan& plan, const AttentionShape& s, float p) {
    Graph& g = plan.graph;
    const int64_t width = 3 * int64_t(s.C);
    Inputs in = attention_inputs(g, plan, s, true);
    Tensor out = g.tensor(s.heads(), s.strides(s.C), CUDNN_DATA_BFLOAT16, Storage::device),
           dout = g.tensor(s.heads(), s.strides(s.C), CUDNN_DATA_BFLOAT16, Storage::device),
           stats = g.tensor(s.rows(), Graph::contiguous(s.rows()), CUDNN_DATA_FLOAT, Storage::device);
    Tensor mask{nullptr, 0, s.scores()}, dropout_scale{};
    if (p > 0) bind_dropout(g, plan, in, p, &mask, &dropout_scale);

    // softmax_sum [b, h, t, 1] = Σ_d dO ⊙ O, times 1 − p (the O of the forward carries 1/(1 − p))
    Tensor product = g.virtual_tensor(s.heads()), row_sum = g.virtual_tensor(s.rows()),
           keep = g.scalar(CUDNN_DATA_FLOAT);
    Tensor softmax_sum = g.tensor(s.rows(), Graph::contiguous(s.rows()), CUDNN_DATA_FLOAT, Storage::device);
    g.pointwise(CUDNN_POINTWISE_MUL, {&dout, &out}, product);
    g.reduction(CUDNN_REDUCE_TENSOR_ADD, product, row_sum);
    g.pointwise(CUDNN_POINTWISE_MUL, {&row_sum, &keep}, softmax_sum);
    plan.keep_uid = keep.uid, plan.keep = 1.0f - p;

    // P = exp(masked scores − lse), dropped as in forward
    Tensor masked = masked_scores(g, s, in, true, &stats);
    Tensor probs = g.virtual_tensor(s.scores());
    g.pointwise(CUDNN_POINTWISE_EXP, {&masked}, probs);
    Tensor dropped = probs;
    if (p > 0) {
        Tensor kept = g.virtual_tensor(s.scores());
        dropped = g.virtual_tensor(s.scores());
        g.pointwise(CUDNN_POINTWISE_MUL, {&probs, &mask}, kept);
        g.pointwise(CUDNN_POINTWISE_MUL, {&kept, &dropout_scale}, dropped);
    }
    // dV = Pᵀ dO
    Tensor probs_t = g.tensor(s.scores(), s.scores_transposed_strides(), CUDNN_DATA_BFLOAT16, Storage::virtual_);
    g.reshape(dropped, probs_t);
    Tensor dv = g.tensor(s.heads(), s.strides(width), CUDNN_DATA_BFLOAT16, Storage::device);
    g.matmul(probs_t, dout, dv);

    // dS = P ⊙ (dropout_backward(dO Vᵀ) − softmax_sum) · scale
    Tensor dprobs = g.virtual_tensor(s.scores());
    g.matmul(dout, in.v, dprobs);
    if (p > 0) {
        Tensor masked_grad = g.virtual_tensor(s.scores());
        g.pointwise(CUDNN_POINTWISE_MUL, {&dprobs, &mask}, masked_grad);
        dprobs = masked_grad;
    }
    Tensor centred = g.virtual_tensor(s.scores()), dscores = g.virtual_tensor(s.scores());
    g.pointwise(CUDNN_POINTWISE_SUB, {&dprobs, &softmax_sum}, centred);
    g.pointwise(CUDNN_POINTWISE_MUL, {&centred, &probs}, dscores);
    if (p > 0) {
        Tensor rescaled = g.virtual_tensor(s.scores());
        g.pointwise(CUDNN_POINTWISE_MUL, {&dscores, &dropout_scale}, rescaled);
        dscores = rescaled;
    }
    Tensor ds = g.virtual_tensor(s.scores());
    g.pointwise(CUDNN_POINTWISE_MUL, {&dscores, &in.scale}, ds);

    // dK = dSᵀ Q
    Tensor ds_t = g.tensor(s.scores(), s.scores_transposed_strides(), CUDNN_DATA_BFLOAT16, Storage::virtual_);
    g.reshape(ds, ds_t);
    Tensor dk = g.tensor(s.heads(), s.strides(width), CUDNN_DATA_BFLOAT16, Storage::device);
    g.matmul(ds_t, in.q, dk);

    // dQ = dS K, through an fp32 accumulator
    Tensor k = g.tensor(s.heads(), s.strides(width), CUDNN_DATA_BFLOAT16, Storage::virtual_);
    g.reshape(in.k, k);
    Tensor dq_accum = g.tensor(s.heads(), Graph::contiguous(s.heads()), CUDNN_DATA_FLOAT, Storage::device);
    Tensor dq = g.tensor(s.heads(), s.strides(width), CUDNN_DATA_BFLOAT16, Storage::device);
    g.matmul(ds, k, dq_accum);
    g.pointwise(CUDNN_POINTWISE_IDENTITY, {&dq_accum}, dq);

    plan.o = out.uid, plan.dout = dout.uid, plan.stats = stats.uid, plan.softmax_sum = softmax_sum.uid;
    plan.dq = dq.uid, plan.dk = dk.uid, plan.dv = dv.uid, plan.dq_accum = dq_accum.uid;
}

Plan& plan_for(const AttentionShape& s, float p, bool backward) {
    // per thread, as the handle they are made for; never destroyed: destroying
    // a plan after the CUDA runtime has shut down at exit is not safe
    thread_local auto* plans = new std::map<PlanKey, std::unique_ptr<Plan>>;
    std::unique_ptr<Plan>& plan = (*plans)[{s.B, s.T, s.C, s.NH, p, backward}];
    if (!plan) {
        plan = std::make_unique<Plan>();
        if (backward) build_backward(*plan, s, p);
        else build_forward(*plan, s, p);
        plan->plan = plan->graph.plan({handle(), nullptr}, &plan->workspace_bytes);
    }
    return *plan;
}

// Device memory the plans use between calls: the workspace cuDNN asks for,
// backward's fp32 scratch (softmax_sum, dQ's accumulator) and the RNG's
// seed and offset. Grows to the largest request.
struct Scratch {
    std::unique_ptr<gpu::DeviceBuffer<char>> bytes;
    char* at_least(size_t n) {
        if (!bytes || bytes->size() < n) bytes = std::make_unique<gpu::DeviceBuffer<char>>(n);  // cudaFree waits
        return bytes->data();
    }
};
Scratch& scratch() {
    thread_local auto* s = new Scratch;  // per thread and never destroyed, as the plans
    return *s;
}

size_t aligned(size_t n) { return (n + 255) / 256 * 256; }

// Runs the plan on the tensors `bound` (uid, pointer); uid 0 is a tensor this
// graph does not have. On the stack: the step loop allocates nothing.
void run(const Plan& plan, std::initializer_list<std::pair<int64_t, void*>> bound, void* workspace) {
    constexpr size_t most = 24;
    std::array<int64_t, most> uids{};
    std::array<void*, most> pointers{};
    size_t n = 0;
    for (const auto& [uid, pointer] : bound)
        if (uid && n < most) uids[n] = uid, pointers[n++] = pointer;
    cudnnBackendDescriptor_t pack;
    check(cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &pack), "variant pack");
    check(cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, int64_t(n), uids.data()),
          "variant pack uids");
    check(cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, int64_t(n),
                                   pointers.data()),
          "variant pack pointers");
    check(cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace),
          "variant pack workspace");
    check(cudnnBackendFinalize(pack), "variant pack");
    const cudnnStatus_t status = cudnnBackendExecute(handle(), plan.plan, pack);
    cudnnBackendDestroyDescriptor(pack);
    check(status, "execute");
}

// The graphs declare 16-byte aligned tensors (as cuDNN's fused kernels load
// them); the arenas pack tensors without padding, so say so if one is not.
void check_aligned(std::initializer_list<const void*> tensors) {
    for (const void* t : tensors)
        if (reinterpret_cast<uintptr_t>(t) % 16 != 0)
            throw std::runtime_error(
                "cuDNN fused attention: a tensor is not 16-byte aligned (b·s and h/t "
                "multiples of 8 keep them so); model.attention: explicit has no such need");
}

// The seed and offset the RNG reads from device memory, at the start of
// scratch, each 16-byte aligned as the graph's tensors declare them.
struct DeviceSeed {
    int64_t* seed;
    int64_t* offset;
};
DeviceSeed upload_seed(char* at, uint64_t seed) {
    const int64_t values[4] = {int64_t(seed & 0x7fffffffffffffffull), 0, 0, 0};  // seed at 0, offset 0 at 16
    int64_t* device = reinterpret_cast<int64_t*>(at);
    gpu::check_cuda(cudaMemcpyAsync(device, values, sizeof values, cudaMemcpyHostToDevice, gpu::context().stream),
                    "upload the dropout seed");
    return {device, device + 2};
}

// An H100 / H200 (sm_90, 132 SMs) as cuDNN's device-properties JSON: the
// fields cuDNN reads from cudaDeviceGetAttribute when it has the device.
const char* const hopper_properties = R"({"cudaDeviceId": 0, "deviceName": "NVIDIA H200", "deviceVer": 900,
    "driverVer": 13000, "isTccDriver": 0, "l2CacheSize": 52428800, "maxCtasPerSM": 32,
    "maxRegistersPerSM": 65536, "maxSharedMemoryPerBlock": 49152, "maxSharedMemoryPerBlockOptin": 232448,
    "maxThreadsPerBlock": 1024, "maxThreadsPerSM": 2048, "memClockRateKHz": 3201000,
    "multiProcessorCount": 132, "pciDeviceId": 0, "regsPerBlock": 65536, "reservedSharedMemoryPerBlock": 1024,
    "smClockRateKHz": 1980000, "supportCoopLaunch": 1, "totalGlobalMem": 150754820096, "warpSize": 32,
    "maxBlockSize": [1024, 1024, 64], "maxGridSize": [2147483647, 65535, 65535]})";

cudnnBackendDescriptor_t described_hopper() {
#if CUDNN_VERSION >= 90800
    cudnnBackendDescriptor_t properties;
    check(cudnnBackendCreateDescriptor(CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR, &properties), "device properties");
    const std::string json = hopper_properties;
    check(cudnnBackendSetAttribute(properties, CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION, CUDNN_TYPE_CHAR,
                                   int64_t(json.size()), json.data()),
          "device properties");
    check(cudnnBackendFinalize(properties), "device properties");
    return properties;
#else
    check(CUDNN_STATUS_NOT_SUPPORTED, "describing a GPU to cuDNN needs cuDNN 9.8 or later");
    return nullptr;
#endif
}

}  // namespace

FusedAttentionPlanCheck check_fused_attention_plans_for_hopper(int B, int T, int C, int NH, float p) {
    const AttentionShape s{B, T, C, NH};
    cudnnBackendDescriptor_t properties = described_hopper();
    FusedAttentionPlanCheck result;
    try {
        Plan forward, backward;
        build_forward(forward, s, p);
        build_backward(backward, s, p);
        const bool forward_planned = forward.graph.plan({nullptr, properties}, &result.forward_workspace_bytes);
        const bool backward_planned = backward.graph.plan({nullptr, properties}, &result.backward_workspace_bytes);
        result.planned = forward_planned && backward_planned;
    } catch (...) {
        cudnnBackendDestroyDescriptor(properties);
        throw;
    }
    cudnnBackendDestroyDescriptor(properties);
    return result;
}

void fused_attention_forward(bf16* out, float* stats, const bf16* qkv, int B, int T, int C, int NH, float p,
                             uint64_t seed) {
    const AttentionShape s{B, T, C, NH};
    check_aligned({qkv, qkv + C, out, stats});
    Plan& plan = plan_for(s, p, false);
    char* base = scratch().at_least(256 + aligned(size_t(plan.workspace_bytes)));
    const DeviceSeed rng = upload_seed(base, seed);
    bf16* q = const_cast<bf16*>(qkv);
    run(plan,
        {{plan.q, q},
         {plan.k, q + C},
         {plan.v, q + 2 * C},
         {plan.o, out},
         {plan.stats, stats},
         {plan.attention_scale_uid, &plan.attention_scale},
         {plan.lowest_uid, &plan.lowest},
         {plan.dropout_scale_uid, &plan.dropout_scale},
         {plan.seed, rng.seed},
         {plan.offset, rng.offset}},
        base + 256);
}

void fused_attention_backward(bf16* dqkv, const bf16* dout, const bf16* qkv, const bf16* out, const float* stats, int B,
                              int T, int C, int NH, float p, uint64_t seed) {
    const AttentionShape s{B, T, C, NH};
    check_aligned({qkv, qkv + C, out, stats, dout, dqkv});
    Plan& plan = plan_for(s, p, true);
    const size_t rows = size_t(B) * NH * T, accum = rows * (C / NH);
    char* base = scratch().at_least(256 + aligned(rows * 4) + aligned(accum * 4) +
                                    aligned(size_t(plan.workspace_bytes)));
    const DeviceSeed rng = upload_seed(base, seed);
    float* softmax_sum = reinterpret_cast<float*>(base + 256);
    float* dq_accum = reinterpret_cast<float*>(base + 256 + aligned(rows * 4));
    gpu::check_cuda(cudaMemsetAsync(dq_accum, 0, accum * 4, gpu::context().stream), "zero dQ's accumulator");
    bf16* q = const_cast<bf16*>(qkv);
    run(plan,
        {{plan.q, q},
         {plan.k, q + C},
         {plan.v, q + 2 * C},
         {plan.o, const_cast<bf16*>(out)},
         {plan.dout, const_cast<bf16*>(dout)},
         {plan.stats, const_cast<float*>(stats)},
         {plan.softmax_sum, softmax_sum},
         {plan.dq_accum, dq_accum},
         {plan.dq, dqkv},
         {plan.dk, dqkv + C},
         {plan.dv, dqkv + 2 * C},
         {plan.attention_scale_uid, &plan.attention_scale},
         {plan.lowest_uid, &plan.lowest},
         {plan.keep_uid, &plan.keep},
         {plan.dropout_scale_uid, &plan.dropout_scale},
         {plan.seed, rng.seed},
         {plan.offset, rng.offset}},
        base + 256 + aligned(rows * 4) + aligned(accum * 4));
}

std::string cudnn_version() {
    const size_t loaded = cudnnGetVersion();  // major·10000 + minor·100 + patch
    const auto text = [](size_t v) {
        return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
    };
    const std::string file = library_file_of("cudnnGetVersion");
    return "cuDNN: " + text(loaded) + (file.empty() ? "" : " (" + file + ")") + ", compiled against " +
           text(CUDNN_VERSION);
}

}  // namespace tpsp
