// One training step's forwards and backwards on a pipeline stage
// (docs/design.md §10): the stage's schedule (parallel/pipeline_schedule.h)
// run action by action, each forward's output sent to the stage holding the
// next model chunk and each backward's input gradient to the one holding the
// previous, as [s/t, b, h]: the SP shard of the boundary, TP rank to the same
// TP rank, over the stage's four channels (parallel/pipeline_channels.h).
//
// Sends never wait: each goes out from a buffer of its own, taken from a pool
// that keeps a buffer until its send is complete (the pool grows in the first
// step to what the schedule needs). Receives are posted one action ahead and
// waited for when the action needs them. So a stage waits only for data that
// another stage's schedule sends before it needs anything back, which the
// schedules' simulation (tests/test_pipeline.cpp) proves always arrives.
// On the CPU every transfer in flight is moved on between the GEMM tiles
// (Open MPI moves a transfer only inside MPI calls); on a GPU the buffers are
// device memory, the transfers run on the channels' streams, and a wait
// makes the compute stream wait, not the host.
#pragma once
#include <cstddef>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "model/gpt.h"
#include "parallel/overlap.h"
#include "parallel/pipeline_channels.h"
#include "parallel/pipeline_schedule.h"
#include "train/data_parallel.h"

namespace tpsp {

// A boundary's buffer, [s/t, b, h], in the backend's memory (host or device).
template <class Backend>
class BoundaryBuffer {
public:
    using Act = typename Backend::Act;
    explicit BoundaryBuffer(size_t count) : data_(static_cast<Act*>(Backend::memory().allocate(count * sizeof(Act)))) {}
    BoundaryBuffer(const BoundaryBuffer&) = delete;
    BoundaryBuffer& operator=(const BoundaryBuffer&) = delete;
    ~BoundaryBuffer() { Backend::memory().release(data_); }
    Act* data() const { return data_; }

private:
    Act* data_;
};

template <class Backend>
class PipelineStep {
public:
    using Comm = typename Backend::Comm;
    using Act = typename Backend::Act;
    using Transfer = typename Comm::Transfer;

    PipelineStep(GPTModel<Backend>& model, PipelineChannels<Comm> channels, const PipelineShape& shape, int stage)
        : model_(model), channels_(std::move(channels)), channel_groups_(channels_.groups()), shape_(shape),
          stage_(stage), schedule_(pipeline_schedule(shape, stage)),
          rows_(size_t(model.tp.local_seq(model.shape.seq_len)) * model.shape.batch * model.config.channels),
          received_{Received(rows_), Received(rows_)}, set_free_(size_t(model.part.block_sets), true),
          sets_(size_t(shape.chunks) * size_t(shape.micro_batches), 0) {
        for (const PipelineAction& a : schedule_) {  // the trace's span names, one per action
            std::string name = a.kind == PipelineAction::forward ? "forward mb " : "backward mb ";
            name += std::to_string(a.micro_batch);
            if (shape.chunks > 1) name += " chunk " + std::to_string(a.chunk);
            span_names_.push_back(name);
        }
        for (int c = 0; c < shape.chunks; c++) forward_pass_.push_back({PipelineAction::forward, c, 0});
    }

    Tracer* tracer = nullptr;  // where set: each action's span, and the waits before them, on the pipeline row

    // every group the channels use: their bytes (CollectiveBytes::pipeline) and times
    const std::vector<Comm*>& channel_groups() const { return channel_groups_; }

    // Of the last run(): its length, and the part of it this stage computed
    // (the rest, waiting for the neighbours' boundaries, is its bubble).
    double seconds() const { return seconds_; }
    double busy_seconds() const { return busy_seconds_; }

    // The step's micro-batches: inputs and targets of micro-batch j at
    // j · micro_elements, its dropout draw draw(j). Returns the sum of the
    // micro-batches' mean losses on the stage holding the head, 0 elsewhere.
    // data_parallel (where set): the stage's gradient buckets and parameter
    // gathers, overlapped with the schedule as the switches say
    // (DataParallelStep::pipeline_begins); reduce_grads() after it.
    template <class Draw>
    double run(const int* inputs, const int* targets, size_t micro_elements, const Draw& draw, float dloss,
               DataParallelStep<Backend>* data_parallel = nullptr) {
        data_parallel_ = data_parallel;
        if (data_parallel_) data_parallel_->pipeline_begins();
        const double loss = run_actions(schedule_, inputs, targets, micro_elements, draw, dloss, true);
        if (data_parallel_) data_parallel_->parameters_ready();  // any gather no forward waited for
        data_parallel_ = nullptr;
        return loss;
    }

    // One batch through every model chunk, forward only and without dropout
    // (validation): its mean loss on the stage holding the head, 0 elsewhere.
    double forward_only(const int* inputs, const int* targets) {
        return run_actions(
            forward_pass_, inputs, targets, 0, [](int) { return DropoutStep{}; }, 0.0f, false);
    }

    // The tied wte's two gradient sums meet (docs/design.md §10): the first
    // stage holds the embedding lookup's, the last the LM head's, [count]
    // each. Each sends `own` and receives the other's into `theirs`, over the
    // link from the last stage to the first (the schedule's sends are done).
    void exchange_tied_embedding_grads(const float* own, float* theirs, size_t count) {
        const bool first = stage_ == 0;
        const PipelineChannel<Comm>& out = first ? channels_.backward_out : channels_.forward_out;
        const PipelineChannel<Comm>& in = first ? channels_.forward_in : channels_.backward_in;
        Transfer sent = out.group->start_send(own, count, out.peer, out.tag);
        Transfer received = in.group->start_receive(theirs, count, in.peer, in.tag, "tied wte gradients");
        in.group->wait(received);
        out.group->wait(sent);
    }

private:
    template <class Draw>
    double run_actions(const std::vector<PipelineAction>& actions, const int* inputs, const int* targets,
                       size_t micro_elements, const Draw& draw, float dloss, bool training) {
        actions_ = &actions;
        const bool traced = &actions == &schedule_ && tracer && tracer->enabled();
        const double start = now_seconds();
        busy_seconds_ = 0.0;
        double loss = 0.0;
        background_transfers.move_on = [this] { return move_on(); };
        post_receive(0);
        for (size_t a = 0; a < actions.size(); a++) {
            post_receive(a + 1);
            const PipelineAction& action = actions[a];
            // the chunk's slot: its micro-batches come and go in order; a set of block tables: any free one
            const int slot = action.micro_batch % model_.part.in_flight[size_t(action.chunk)];
            int& set = set_of(action.chunk, action.micro_batch);
            const double waits = now_seconds();
            const Act* input = wait_received(a);
            const double computes = now_seconds();
            if (action.kind == PipelineAction::forward) {
                const size_t at = size_t(action.micro_batch) * micro_elements;
                const bool sends = !shape_.last_in_model(stage_, action.chunk);
                Act* output = sends ? send_buffer() : nullptr;
                set = training ? take_set() : 0;  // validation keeps nothing for a backward
                loss += model_.forward_chunk(action.chunk, slot, set, inputs + at, targets + at,
                                             draw(action.micro_batch), input, output, training,
                                             parameters_needed(action));
                if (sends) send(output, channels_.forward_out);
            } else {
                const bool sends = !shape_.first_in_model(stage_, action.chunk);
                Act* input_grad = sends ? send_buffer() : nullptr;
                model_.backward_chunk(action.chunk, slot, set, dloss, input, input_grad, grads_final(action));
                set_free_[size_t(set)] = true;
                if (sends) send(input_grad, channels_.backward_out);
            }
            const double done = now_seconds();
            busy_seconds_ += done - computes;
            if (traced) {
                if (receives(a)) tracer->record("bubble", Track::pipeline, waits, computes);
                tracer->record(span_names_[a].c_str(), Track::pipeline, computes, done);
            }
        }
        for (std::unique_ptr<Sent>& s : sent_)
            if (s->in_flight) s->group->wait(s->transfer), s->in_flight = false;
        background_transfers = {};
        seconds_ = now_seconds() - start;
        return loss;
    }

    struct Sent {
        explicit Sent(size_t count) : data(count) {}
        BoundaryBuffer<Backend> data;
        Comm* group = nullptr;  // the channel's, while in flight
        Transfer transfer;
        bool in_flight = false;
    };
    struct Received {
        explicit Received(size_t count) : data(count) {}
        BoundaryBuffer<Backend> data;
        Comm* group = nullptr;  // the channel's, while in flight
        Transfer transfer;
    };

    // the block tables micro-batch j of chunk c is kept in, from its forward to its backward
    int& set_of(int chunk, int micro_batch) { return sets_[size_t(chunk) * shape_.micro_batches + micro_batch]; }
    int take_set() {  // the lowest free one: as many as the schedule keeps in flight (part.block_sets)
        for (size_t set = 0; set < set_free_.size(); set++)
            if (set_free_[set]) {
                set_free_[set] = false;
                return int(set);
            }
        throw std::logic_error("pipeline: more micro-batches in flight than the part's activation sets");
    }

    // whether action a waits for a message: a forward not of the model's first chunk, a backward not of its last
    bool receives(size_t a) const {
        if (a >= actions_->size()) return false;
        const PipelineAction& action = (*actions_)[a];
        return action.kind == PipelineAction::forward ? !shape_.first_in_model(stage_, action.chunk)
                                                      : !shape_.last_in_model(stage_, action.chunk);
    }

    void post_receive(size_t a) {
        if (!receives(a)) return;
        Received& r = received_[a % 2];
        const bool forward = (*actions_)[a].kind == PipelineAction::forward;
        const PipelineChannel<Comm>& in = forward ? channels_.forward_in : channels_.backward_in;
        r.group = in.group;
        r.transfer = in.group->start_receive(r.data.data(), rows_, in.peer, in.tag,
                                             forward ? "pipeline receive (forward)" : "pipeline receive (backward)");
        in.group->bytes.pipeline += int64_t(rows_ * sizeof(Act));
    }

    const Act* wait_received(size_t a) {
        if (!receives(a)) return nullptr;
        Received& r = received_[a % 2];
        r.group->wait(r.transfer);
        return r.data.data();
    }

    // a buffer whose send is complete, or a new one
    Act* send_buffer() {
        for (std::unique_ptr<Sent>& s : sent_)
            if (!s->in_flight || s->group->test(s->transfer)) {
                s->in_flight = false;
                return s->data.data();
            }
        sent_.push_back(std::make_unique<Sent>(rows_));
        return sent_.back()->data.data();
    }

    void send(Act* data, const PipelineChannel<Comm>& out) {
        for (std::unique_ptr<Sent>& s : sent_)
            if (s->data.data() == data) {
                s->group = out.group;
                s->transfer = out.group->start_send(data, rows_, out.peer, out.tag);
                s->in_flight = true;
            }
    }

    // a chunk's first forward: wait for the parameters each stage reads, where gathers are in flight
    std::function<void(int)> parameters_needed(const PipelineAction& a) const {
        if (!data_parallel_ || a.micro_batch != 0 || !data_parallel_->gathers_pending()) return {};
        return [dp = data_parallel_](int stage) { dp->wait_parameters(stage); };
    }
    // a chunk's last backward: start the buckets it makes final
    std::function<void(int)> grads_final(const PipelineAction& a) const {
        if (!data_parallel_ || a.micro_batch + 1 != shape_.micro_batches || !data_parallel_->overlaps_grad_reduce())
            return {};
        return [dp = data_parallel_](int stage) {
            dp->grads_final(stage);
            background_transfers.poll();
        };
    }

    // between GEMM tiles: every receive and send in flight moved on, and the data-parallel transfers
    bool move_on() {
        bool in_flight = data_parallel_ && data_parallel_->move_on();
        for (Received& r : received_)
            if (r.transfer.active) in_flight |= !r.group->test(r.transfer);
        for (std::unique_ptr<Sent>& s : sent_)
            if (s->in_flight) in_flight |= !s->group->test(s->transfer);
        return in_flight;
    }

    GPTModel<Backend>& model_;
    PipelineChannels<Comm> channels_;
    std::vector<Comm*> channel_groups_;  // channels_.groups(), once
    PipelineShape shape_;
    int stage_;
    std::vector<PipelineAction> schedule_;                  // the training step's
    std::vector<PipelineAction> forward_pass_;              // validation's: micro-batch 0 through every chunk
    const std::vector<PipelineAction>* actions_ = nullptr;  // those running now
    size_t rows_;                                           // elements of one boundary tensor, [s/t, b, h]
    Received received_[2];
    std::vector<bool> set_free_;  // [block set]
    std::vector<int> sets_;       // [chunk · m + micro-batch] its block set, while in flight
    std::vector<std::unique_ptr<Sent>> sent_;
    std::vector<std::string> span_names_;  // [action of the schedule]: the trace's
    double seconds_ = 0.0, busy_seconds_ = 0.0;
    DataParallelStep<Backend>* data_parallel_ = nullptr;  // during run(), where given
};

}  // namespace tpsp
