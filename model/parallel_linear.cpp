#include "model/parallel_linear.h"

#include <algorithm>

#include "model/kernels/cpu_kernels.h"
#include "parallel/overlap.h"

namespace tpsp {

namespace {

// Runs f(first_row, rows) over [0, rows) in up to four tiles of at least 64
// rows, polling between them so that transfers in flight keep moving; once
// nothing is in flight the rest is one GEMM. More tiles poll more often but
// make smaller, slower GEMMs.
template <class Poll, class F>
void in_row_tiles(int rows, const Poll& poll, F&& f) {
    const int tile = std::max(std::min(64, rows), (rows + 3) / 4);
    for (int r0 = 0; r0 < rows;) {
        const int count = poll.idle() ? rows - r0 : std::min(tile, rows - r0);
        f(r0, count);
        r0 += count;
        poll();
    }
}

// For the same code on the paths with nothing to overlap.
struct NoPoll {
    void operator()() const {}
    bool idle() const { return true; }
};
const NoPoll no_poll;

// A span of compute on the trace.
struct ComputeSpan {
    ComputeSpan(Communicator* group, const char* name) : group(group), name(name), start(now_seconds()) {}
    ~ComputeSpan() {
        if (group->tracer) group->tracer->record(name, Track::compute, start, now_seconds());
    }
    Communicator* group;
    const char* name;
    double start;
};

}  // namespace

ParallelLinears::ParallelLinears(Communicator* group, bool sequence_parallel, const OverlapSettings& overlap, int N,
                                 int N_local, float* rs_scratch)
    : group_(group), mappings_(group, sequence_parallel && group->size() > 1), sequence_parallel_(sequence_parallel),
      overlap_(overlap), N_(N), N_local_(N_local), rs_scratch_(rs_scratch) {}

void ParallelLinears::column_forward(const char* name, float* out, const float* x_local, float* gathered,
                                     const float* weight, const float* bias, int C, int OC) {
    if (!(overlapping() && overlap_.ag)) {
        const float* x = mappings_.g_forward(x_local, gathered, size_t(N_) * C);
        ComputeSpan span(group_, name);
        matmul_forward(out, x, weight, bias, N_, C, OC);
        return;
    }
    ring_all_gather_overlapped(*group_, x_local, gathered, size_t(N_local_) * C,
                               [&](int chunk, const float* data, const Poll& poll) {
                                   ComputeSpan span(group_, name);
                                   float* rows_out = out + size_t(chunk) * N_local_ * OC;
                                   in_row_tiles(N_local_, poll, [&](int r0, int rows) {
                                       matmul_forward(rows_out + size_t(r0) * OC, data + size_t(r0) * C, weight, bias,
                                                      rows, C, OC);
                                   });
                               });
}

const float* ParallelLinears::column_backward(const char* name, const float* dout, const float* x_local,
                                              float* gathered, float* partial, float* local_grad,
                                              const float* weight, float* dweight, float* dbias, int C, int OC) {
    const size_t shard = size_t(N_local_) * C;
    auto dgrad = [&](const auto& poll) {
        ComputeSpan span(group_, name);
        in_row_tiles(N_, poll, [&](int r0, int rows) {
            matmul_backward_input(partial + size_t(r0) * C, dout + size_t(r0) * OC, weight, rows, C, OC);
        });
    };
    auto wgrad = [&](const auto& poll) {  // tiles over the weight's rows, the gathered input whole
        ComputeSpan span(group_, name);
        in_row_tiles(OC, poll, [&](int o0, int count) {
            matmul_backward_weight(dweight, dbias, dout, gathered, N_, C, OC, o0, o0 + count);
        });
    };
    if (!overlapping() || !(overlap_.bulk_dgrad || overlap_.bulk_wgrad || overlap_.rs_dgrad)) {
        const float* x = mappings_.g_forward(x_local, gathered, size_t(N_) * C);  // re-gather the saved shard
        ComputeSpan span(group_, name);
        matmul_backward(partial, dweight, dbias, dout, x, weight, N_, C, OC);
        return mappings_.g_backward(partial, local_grad, size_t(N_) * C);
    }
    if (overlap_.rs_dgrad) {
        // the dgrad reduce-scattered part by part as its GEMM produces it, the
        // re-gather of x in flight meanwhile; wgrad while the last parts drain
        Transfer gather = group_->start_all_gather(x_local, gathered, shard, "all-gather for wgrad");
        pipelined_reduce_scatter_overlapped(
            *group_, local_grad, partial, rs_scratch_, size_t(N_local_), size_t(C), overlap_.num_splits,
            [&](int, size_t c0, size_t c1, float* part, const Poll& poll) {
                ComputeSpan span(group_, name);
                in_row_tiles(N_, poll, [&](int r0, int rows) {
                    matmul_backward_input_columns(part + size_t(r0) * (c1 - c0), dout + size_t(r0) * OC, weight,
                                                  rows, C, OC, int(c0), int(c1));
                });
            },
            [&](const Poll& poll) {
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

float* ParallelLinears::row_forward(const char* name, const float* inp, float* partial, float* local,
                                    const float* weight, int K, int OC) {
    const size_t shard = size_t(N_local_) * OC;
    if (!(overlapping() && overlap_.rs)) {
        {
            ComputeSpan span(group_, name);
            matmul_forward(partial, inp, weight, nullptr, N_, K, OC);
        }
        return mappings_.gbar_forward(partial, local, size_t(N_) * OC);
    }
    if (!overlap_.rs_pipeline) {
        ring_reduce_scatter_overlapped(*group_, local, rs_scratch_, shard, [&](int chunk, float* out, const Poll& poll) {
            ComputeSpan span(group_, name);
            const float* rows_in = inp + size_t(chunk) * N_local_ * K;
            in_row_tiles(N_local_, poll, [&](int r0, int rows) {
                matmul_forward(out + size_t(r0) * OC, rows_in + size_t(r0) * K, weight, nullptr, rows, K, OC);
            });
        });
        return local;
    }
    pipelined_reduce_scatter_overlapped(
        *group_, local, partial, rs_scratch_, size_t(N_local_), size_t(OC), overlap_.num_splits,
        [&](int, size_t c0, size_t c1, float* part, const Poll& poll) {
            ComputeSpan span(group_, name);
            in_row_tiles(N_, poll, [&](int r0, int rows) {
                matmul_forward(part + size_t(r0) * (c1 - c0), inp + size_t(r0) * K, weight + c0 * K, nullptr, rows,
                               K, int(c1 - c0));
            });
        },
        [](const Poll&) {});
    return local;
}

void ParallelLinears::row_backward(const char* name, float* dinp, const float* dy_local, float* gathered,
                                   const float* inp, const float* weight, float* dweight, int K, int OC) {
    if (!(overlapping() && overlap_.ag)) {
        const float* dy = mappings_.gbar_backward(dy_local, gathered, size_t(N_) * OC);
        ComputeSpan span(group_, name);
        matmul_backward(dinp, dweight, nullptr, dy, inp, weight, N_, K, OC);
        return;
    }
    // ḡ's all-gather of dy as a ring, each arriving chunk's dgrad computed at once
    ring_all_gather_overlapped(*group_, dy_local, gathered, size_t(N_local_) * OC,
                               [&](int chunk, const float* data, const Poll& poll) {
                                   ComputeSpan span(group_, name);
                                   float* rows_out = dinp + size_t(chunk) * N_local_ * K;
                                   in_row_tiles(N_local_, poll, [&](int r0, int rows) {
                                       matmul_backward_input(rows_out + size_t(r0) * K, data + size_t(r0) * OC,
                                                             weight, rows, K, OC);
                                   });
                               });
    ComputeSpan span(group_, name);
    matmul_backward_weight(dweight, nullptr, gathered, inp, N_, K, OC, 0, OC);
}

}  // namespace tpsp
