// One training step's forwards and backwards on a pipeline stage
// (docs/design.md §10): the stage's schedule (parallel/pipeline_schedule.h)
// run action by action, each forward's output sent to the stage holding the
// next model chunk and each backward's input gradient to the one holding the
// previous, as [s/t, b, h]: the SP shard of the boundary, TP rank to the same
// TP rank.
//
// Sends never wait: each goes out from a buffer of its own, taken from a pool
// that keeps a buffer until its send is complete (the pool grows in the first
// step to what the schedule needs). Receives are posted one action ahead and
// waited for when the action needs them. So a stage waits only for data that
// another stage's schedule sends before it needs anything back, which the
// schedules' simulation (tests/test_pipeline.cpp) proves always arrives.
// Between the GEMM tiles every transfer in flight is moved on (Open MPI
// moves a transfer only inside MPI calls).
#pragma once
#include <cstddef>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "model/gpt.h"
#include "parallel/overlap.h"
#include "parallel/pipeline_schedule.h"
#include "train/data_parallel.h"

namespace tpsp {

template <class Backend>
class PipelineStep {
public:
    using Comm = typename Backend::Comm;
    using Act = typename Backend::Act;
    using Transfer = typename Comm::Transfer;

    // stages: this rank's pipeline (the same dp, cp and tp index), rank = stage
    PipelineStep(GPTModel<Backend>& model, Comm& stages, const PipelineShape& shape)
        : model_(model), stages_(stages), shape_(shape), stage_(stages.rank()),
          schedule_(pipeline_schedule(shape, stage_)),
          rows_(size_t(model.tp.local_seq(model.shape.seq_len)) * model.shape.batch * model.config.channels),
          set_free_(size_t(model.part.block_sets), true), sets_(size_t(shape.chunks) * size_t(shape.micro_batches), 0) {
        for (Received& r : received_) r.data.assign(rows_, Act{});
        for (const PipelineAction& a : schedule_) {  // the trace's span names, one per action
            std::string name = a.kind == PipelineAction::forward ? "forward mb " : "backward mb ";
            name += std::to_string(a.micro_batch);
            if (shape.chunks > 1) name += " chunk " + std::to_string(a.chunk);
            span_names_.push_back(name);
        }
    }

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
        std::vector<PipelineAction> forwards;
        for (int c = 0; c < shape_.chunks; c++) forwards.push_back({PipelineAction::forward, c, 0});
        return run_actions(
            forwards, inputs, targets, 0, [](int) { return DropoutStep{}; }, 0.0f, false);
    }

private:
    template <class Draw>
    double run_actions(const std::vector<PipelineAction>& actions, const int* inputs, const int* targets,
                       size_t micro_elements, const Draw& draw, float dloss, bool training) {
        actions_ = &actions;
        const bool traced = &actions == &schedule_ && stages_.tracer && stages_.tracer->enabled();
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
                if (sends) send(output, next_stage(), tag(action, next_model_chunk(action)));
            } else {
                const bool sends = !shape_.first_in_model(stage_, action.chunk);
                Act* input_grad = sends ? send_buffer() : nullptr;
                model_.backward_chunk(action.chunk, slot, set, dloss, input, input_grad, grads_final(action));
                set_free_[size_t(set)] = true;
                if (sends) send(input_grad, previous_stage(), tag(action, previous_model_chunk(action)));
            }
            const double done = now_seconds();
            busy_seconds_ += done - computes;
            if (traced) {
                if (receives(a)) stages_.tracer->record("bubble", Track::pipeline, waits, computes);
                stages_.tracer->record(span_names_[a].c_str(), Track::pipeline, computes, done);
            }
        }
        for (std::unique_ptr<Sent>& s : sent_)
            if (s->in_flight) stages_.wait(s->transfer), s->in_flight = false;
        background_transfers = {};
        seconds_ = now_seconds() - start;
        return loss;
    }

    struct Sent {
        std::vector<Act> data;
        Transfer transfer;
        bool in_flight = false;
    };
    struct Received {
        std::vector<Act> data;
        Transfer transfer;
        size_t action = size_t(-1);  // the action it is for
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

    int next_stage() const { return (stage_ + 1) % shape_.stages; }
    int previous_stage() const { return (stage_ - 1 + shape_.stages) % shape_.stages; }
    int model_chunk(const PipelineAction& a) const { return shape_.model_chunk(stage_, a.chunk); }
    int next_model_chunk(const PipelineAction& a) const { return model_chunk(a) + 1; }
    int previous_model_chunk(const PipelineAction& a) const { return model_chunk(a) - 1; }
    // a message's tag: its direction and the model chunk it goes to. The
    // messages of one tag from one stage are its micro-batches in order, and
    // MPI delivers them in the order sent to the receives in the order posted,
    // which is the receiver's order too: no micro-batch in the tag (so the tags
    // stay below MPI's guaranteed 32767 for any m: 2·p·vpp ≤ 2L + 1). Tag 0 is
    // the tied wte's exchange and the checkpoint gather's.
    int tag(const PipelineAction& a, int to_model_chunk) const {
        return 1 + to_model_chunk * 2 + (a.kind == PipelineAction::backward ? 1 : 0);
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
        r.action = a;
        const PipelineAction& action = (*actions_)[a];
        const bool forward = action.kind == PipelineAction::forward;
        r.transfer = stages_.start_receive(r.data.data(), rows_, forward ? previous_stage() : next_stage(),
                                           tag(action, model_chunk(action)),
                                           forward ? "pipeline receive (forward)" : "pipeline receive (backward)");
        stages_.bytes.pipeline += int64_t(rows_ * sizeof(Act));
    }

    const Act* wait_received(size_t a) {
        if (!receives(a)) return nullptr;
        Received& r = received_[a % 2];
        stages_.wait(r.transfer);
        return r.data.data();
    }

    // a buffer whose send is complete, or a new one
    Act* send_buffer() {
        for (std::unique_ptr<Sent>& s : sent_)
            if (!s->in_flight || stages_.test(s->transfer)) {
                s->in_flight = false;
                return s->data.data();
            }
        sent_.push_back(std::make_unique<Sent>());
        sent_.back()->data.assign(rows_, Act{});
        return sent_.back()->data.data();
    }

    void send(Act* data, int peer, int message_tag) {
        for (std::unique_ptr<Sent>& s : sent_)
            if (s->data.data() == data) {
                s->transfer = stages_.start_send(data, rows_, peer, message_tag);
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
            if (r.transfer.active) in_flight |= !stages_.test(r.transfer);
        for (std::unique_ptr<Sent>& s : sent_)
            if (s->in_flight) in_flight |= !stages_.test(s->transfer);
        return in_flight;
    }

    GPTModel<Backend>& model_;
    Comm& stages_;
    PipelineShape shape_;
    int stage_;
    std::vector<PipelineAction> schedule_;                  // the training step's
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
