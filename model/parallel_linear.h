// The column- and row-parallel linears of a TP group, with the
// communication that borders them (g before a column-parallel linear, ḡ
// after a row-parallel one) either plain or overlapped with the GEMMs by
// the schedules of parallel/overlap.h, as the tp_comm_* switches say.
//
// Rows: N = s·b of the full activations, N_local = N/t of a sequence shard
// (N without SP). Tensors are sequence-major, so rank c's shard is rows
// [c·N_local, (c+1)·N_local).
//
// Comm is the MPI Communicator or the NcclCommunicator, Act the activation
// element (float or bf16); weights are in Act, weight gradients fp32.
#pragma once
#include <algorithm>
#include <cstddef>

#include "model/kernels/kernels.h"
#include "parallel/group.h"
#include "parallel/layout.h"
#include "parallel/mappings.h"
#include "parallel/overlap.h"
#include "parallel/trace.h"

namespace tpsp {

// A weight (or bias) as the GEMMs read it, in the activation dtype: on the
// CPU the fp32 parameter itself, on the GPU the bf16 copy that the model
// refreshes from the fp32 master at every forward. A type of its own, so
// that a master parameter cannot be handed to a GEMM by mistake, nor a GEMM
// copy to an elementwise kernel: the linears take only this.
template <class Act>
struct GemmWeight {
    const Act* data = nullptr;
};

template <class Comm, class Act>
class ParallelLinears {
    static_assert(TensorParallelGroup<Comm, Act>);

public:
    // rs_scratch: 3 · N_local · h elements when an overlapped reduce-scatter is on
    // (the ring's buffers in flight, or the pipeline's received parts).
    ParallelLinears(Comm* group, const TensorParallelism& tp, int N, int N_local, Act* rs_scratch)
        : group_(group), mappings_(group, tp.sequence_parallel_active()), overlap_(tp.overlap), N_(N),
          N_local_(N_local), rs_scratch_(rs_scratch) {}

    // Column-parallel: out [N, OC] = g(x_local [N_local, C]) @ weight^T + bias.
    // gathered [N, C] is scratch (the all-gathered input). With pre_gelu
    // (fc1), the product goes there and out = gelu(pre_gelu): one GEMM with
    // a GELU epilogue on the GPU, tile by tile as the overlap gives them.
    void column_forward(const char* name, Act* out, const Act* x_local, Act* gathered, GemmWeight<Act> weight,
                        GemmWeight<Act> bias, int C, int OC, Act* pre_gelu = nullptr);
    // Its backward: dweight, dbias accumulate; returns dL/dx_local [N_local, C]
    // (in local_grad, or in partial without SP). Re-gathers the saved shard
    // x_local into gathered; partial [N, C] holds the dgrad before its reduction.
    const Act* column_backward(const char* name, const Act* dout, const Act* x_local, Act* gathered, Act* partial,
                               Act* local_grad, GemmWeight<Act> weight, float* dweight, float* dbias, int C, int OC);

    // Row-parallel without its bias: y_local [N_local, OC] = ḡ(inp [N, K] @ weight^T).
    // Returns y (local, or partial without SP); partial [N, OC] is scratch.
    Act* row_forward(const char* name, const Act* inp, Act* partial, Act* local, GemmWeight<Act> weight, int K, int OC);
    // Its backward: dinp [N, K] (overwritten) from dy_local [N_local, OC]; dweight accumulates.
    // gathered [N, OC] receives ḡ's all-gather of dy. With pre_gelu [N, K]
    // (fc2, whose input inp = gelu(pre_gelu)), dinp is the gradient of
    // pre_gelu: the GELU's backward in the dgrad GEMM's epilogue.
    void row_backward(const char* name, Act* dinp, const Act* dy_local, Act* gathered, const Act* inp,
                      GemmWeight<Act> weight, float* dweight, int K, int OC, const Act* pre_gelu = nullptr);

private:
    using Transfer = typename Comm::Transfer;
    // rows of out [.., OC] = x [rows, C] @ weight^T + bias, then GELU when pre_gelu is given
    static void linear_rows(Act* out, Act* pre_gelu, const Act* x, const Act* weight, const Act* bias, int rows, int C,
                            int OC) {
        if (pre_gelu) matmul_forward_gelu(out, pre_gelu, x, weight, bias, rows, C, OC);
        else matmul_forward(out, x, weight, bias, rows, C, OC);
    }
    // rows of dinp [.., K] = dy [rows, OC] @ weight, through the GELU's backward when pre_gelu is given
    static void dgrad_rows(Act* dinp, const Act* dy, const Act* weight, const Act* pre_gelu, int rows, int K, int OC) {
        if (pre_gelu) matmul_backward_input_gelu(dinp, dy, weight, pre_gelu, rows, K, OC);
        else matmul_backward_input(dinp, dy, weight, rows, K, OC);
    }
    // the schedules replace g / ḡ only where those are SP's all-gather and reduce-scatter
    bool overlapping() const { return mappings_.sequence_parallel(); }
    Comm* group_;
    TensorParallelMappings<Comm> mappings_;
    OverlapSettings overlap_;
    int N_, N_local_;
    Act* rs_scratch_;
};

namespace parallel_linear_detail {

// Runs f(first_row, rows) over [0, rows) in up to four tiles of at least 64
// rows, polling between them so that transfers in flight keep moving (this
// group's, and the background ones: the DP buckets'); once nothing is in
// flight the rest is one GEMM. More tiles poll more often but make smaller,
// slower GEMMs.
template <class Poll, class F>
inline void in_row_tiles(int rows, const Poll& poll, F&& f) {
    const int tile = std::max(std::min(64, rows), (rows + 3) / 4);
    for (int r0 = 0; r0 < rows;) {
        const bool idle = poll.idle() && !background_transfers.in_flight;
        const int count = idle ? rows - r0 : std::min(tile, rows - r0);
        f(r0, count);
        r0 += count;
        poll();
        background_transfers.poll();
    }
}

// For the same code on the paths with nothing to overlap.
struct NoPoll {
    void operator()() const {}
    bool idle() const { return true; }
};
inline const NoPoll no_poll;

}  // namespace parallel_linear_detail

template <class Comm, class Act>
void ParallelLinears<Comm, Act>::column_forward(const char* name, Act* out, const Act* x_local, Act* gathered,
                                                GemmWeight<Act> gemm_weight, GemmWeight<Act> gemm_bias, int C, int OC,
                                                Act* pre_gelu) {
    using namespace parallel_linear_detail;
    const Act *weight = gemm_weight.data, *bias = gemm_bias.data;
    if (!(overlapping() && overlap_.ag)) {
        const Act* x = mappings_.g_forward(x_local, gathered, size_t(N_) * C);
        ComputeSpan span(group_->tracer, name);
        linear_rows(out, pre_gelu, x, weight, bias, N_, C, OC);
        return;
    }
    ring_all_gather_overlapped(*group_, x_local, gathered, size_t(N_local_) * C,
                               [&](int chunk, const Act* data, const Poll<Comm>& poll) {
                                   ComputeSpan span(group_->tracer, name);
                                   in_row_tiles(N_local_, poll, [&](int r0, int rows) {
                                       const size_t first = size_t(chunk) * N_local_ + r0;  // row of out
                                       linear_rows(out + first * OC, pre_gelu ? pre_gelu + first * OC : nullptr,
                                                   data + size_t(r0) * C, weight, bias, rows, C, OC);
                                   });
                               });
}

template <class Comm, class Act>
const Act* ParallelLinears<Comm, Act>::column_backward(const char* name, const Act* dout, const Act* x_local,
                                                       Act* gathered, Act* partial, Act* local_grad,
                                                       GemmWeight<Act> gemm_weight, float* dweight, float* dbias, int C,
                                                       int OC) {
    using namespace parallel_linear_detail;
    const Act* weight = gemm_weight.data;
    const size_t shard = size_t(N_local_) * C;
    auto dgrad = [&](const auto& poll) {
        ComputeSpan span(group_->tracer, name);
        in_row_tiles(N_, poll, [&](int r0, int rows) {
            matmul_backward_input(partial + size_t(r0) * C, dout + size_t(r0) * OC, weight, rows, C, OC);
        });
    };
    auto wgrad = [&](const auto& poll) {  // tiles over the weight's rows, the gathered input whole
        ComputeSpan span(group_->tracer, name);
        in_row_tiles(OC, poll, [&](int o0, int count) {
            matmul_backward_weight(dweight, dbias, dout, gathered, N_, C, OC, o0, o0 + count);
        });
    };
    if (!overlapping() || !(overlap_.bulk_dgrad || overlap_.bulk_wgrad || overlap_.rs_dgrad)) {
        const Act* x = mappings_.g_forward(x_local, gathered, size_t(N_) * C);  // re-gather the saved shard
        ComputeSpan span(group_->tracer, name);
        matmul_backward(partial, dweight, dbias, dout, x, weight, N_, C, OC);
        return mappings_.g_backward(partial, local_grad, size_t(N_) * C);
    }
    if (overlap_.rs_dgrad) {
        // the dgrad reduce-scattered part by part as its GEMM produces it, the
        // re-gather of x in flight meanwhile; wgrad while the last parts drain
        Transfer gather = group_->start_all_gather(x_local, gathered, shard, "all-gather for wgrad");
        pipelined_reduce_scatter_overlapped(
            *group_, local_grad, partial, rs_scratch_, size_t(N_local_), size_t(C), overlap_.num_splits,
            [&](int, size_t c0, size_t c1, Act* part, const Poll<Comm>& poll) {
                ComputeSpan span(group_->tracer, name);
                in_row_tiles(N_, poll, [&](int r0, int rows) {
                    matmul_backward_input_columns(part + size_t(r0) * (c1 - c0), dout + size_t(r0) * OC, weight, rows,
                                                  C, OC, int(c0), int(c1));
                });
            },
            [&](const Poll<Comm>& poll) {
                group_->wait(gather);
                wgrad(poll);
            },
            &gather);
        return local_grad;
    }
    if (overlap_.bulk_dgrad) all_gather_during(*group_, x_local, gathered, shard, dgrad);
    else {
        group_->all_gather(x_local, gathered, shard);
        dgrad(no_poll);
    }
    if (overlap_.bulk_wgrad) reduce_scatter_during(*group_, partial, local_grad, shard, wgrad);
    else {
        wgrad(no_poll);
        group_->reduce_scatter(partial, local_grad, shard);
    }
    return local_grad;
}

template <class Comm, class Act>
Act* ParallelLinears<Comm, Act>::row_forward(const char* name, const Act* inp, Act* partial, Act* local,
                                             GemmWeight<Act> gemm_weight, int K, int OC) {
    using namespace parallel_linear_detail;
    const Act* weight = gemm_weight.data;
    const size_t shard = size_t(N_local_) * OC;
    if (!(overlapping() && overlap_.rs)) {
        {
            ComputeSpan span(group_->tracer, name);
            matmul_forward(partial, inp, weight, nullptr, N_, K, OC);
        }
        return mappings_.gbar_forward(partial, local, size_t(N_) * OC);
    }
    if (!overlap_.rs_pipeline) {
        ring_reduce_scatter_overlapped(
            *group_, local, rs_scratch_, shard, [&](int chunk, Act* out, const Poll<Comm>& poll) {
                ComputeSpan span(group_->tracer, name);
                const Act* rows_in = inp + size_t(chunk) * N_local_ * K;
                in_row_tiles(N_local_, poll, [&](int r0, int rows) {
                    matmul_forward(out + size_t(r0) * OC, rows_in + size_t(r0) * K, weight, nullptr, rows, K, OC);
                });
            });
        return local;
    }
    pipelined_reduce_scatter_overlapped(
        *group_, local, partial, rs_scratch_, size_t(N_local_), size_t(OC), overlap_.num_splits,
        [&](int, size_t c0, size_t c1, Act* part, const Poll<Comm>& poll) {
            ComputeSpan span(group_->tracer, name);
            in_row_tiles(N_, poll, [&](int r0, int rows) {
                matmul_forward(part + size_t(r0) * (c1 - c0), inp + size_t(r0) * K, weight + c0 * K, nullptr, rows, K,
                               int(c1 - c0));
            });
        },
        [](const Poll<Comm>&) {});
    return local;
}

template <class Comm, class Act>
void ParallelLinears<Comm, Act>::row_backward(const char* name, Act* dinp, const Act* dy_local, Act* gathered,
                                              const Act* inp, GemmWeight<Act> gemm_weight, float* dweight, int K,
                                              int OC, const Act* pre_gelu) {
    using namespace parallel_linear_detail;
    const Act* weight = gemm_weight.data;
    if (!(overlapping() && overlap_.ag)) {
        const Act* dy = mappings_.gbar_backward(dy_local, gathered, size_t(N_) * OC);
        ComputeSpan span(group_->tracer, name);
        dgrad_rows(dinp, dy, weight, pre_gelu, N_, K, OC);
        matmul_backward_weight(dweight, nullptr, dy, inp, N_, K, OC, 0, OC);
        return;
    }
    // ḡ's all-gather of dy as a ring, each arriving chunk's dgrad computed at once
    ring_all_gather_overlapped(*group_, dy_local, gathered, size_t(N_local_) * OC,
                               [&](int chunk, const Act* data, const Poll<Comm>& poll) {
                                   ComputeSpan span(group_->tracer, name);
                                   in_row_tiles(N_local_, poll, [&](int r0, int rows) {
                                       const size_t first = size_t(chunk) * N_local_ + r0;  // row of dinp
                                       dgrad_rows(dinp + first * K, data + size_t(r0) * OC, weight,
                                                  pre_gelu ? pre_gelu + first * K : nullptr, rows, K, OC);
                                   });
                               });
    ComputeSpan span(group_->tracer, name);
    matmul_backward_weight(dweight, nullptr, gathered, inp, N_, K, OC, 0, OC);
}

}  // namespace tpsp
