// The point-to-point channels of a pipeline stage (docs/design.md §10).
//
// A stage sends on two channels and receives on two: its forwards' outputs
// go to the next stage and the previous stage's come in; its backwards'
// input gradients go to the previous stage and the next stage's come in.
// The next stage of the last is the first: the interleaved schedule's model
// chunk c·p + p − 1 hands its output to chunk (c + 1)·p on stage 0, and the
// tied wte's gradients travel between the last stage and the first.
//
// A channel delivers its messages in the order they were sent, and nothing
// tells them apart: no micro-batch, no chunk. The receiver takes them in that
// order because every stage runs its (chunk, micro-batch) pairs in one order,
// whatever its warm-up (tests/test_pipeline.cpp proves it of every schedule:
// EachChannelsReceiverTakesItsMessagesInTheOrderSent).
//
// Where a group runs its operations on one stream in the order enqueued
// (NCCL), a send queued ahead of a receive holds the receive back until the
// peer takes the send: two stages that each queue a send first wait for each
// other for ever. There each channel is a group of two of its own, used one
// way, on a stream of its own, so that no send ever waits behind a receive or
// a receive behind a send (Megatron groups each step's sends and receives
// into one batch instead). Over MPI, which matches a message by its sender
// and tag and never holds one operation behind another, the stage group
// carries all four: the tag is the direction.
#pragma once
#include <mpi.h>

#include <memory>
#include <vector>

namespace tpsp {

template <class Comm>
struct PipelineChannel {
    Comm* group = nullptr;
    int peer = 0;  // the other end's rank in group
    int tag = 0;
};

template <class Comm>
struct PipelineChannels {
    PipelineChannel<Comm> forward_out, forward_in;    // to the next stage, from the previous
    PipelineChannel<Comm> backward_out, backward_in;  // to the previous stage, from the next
    std::vector<std::unique_ptr<Comm>> own_groups;    // the groups of two, where the channels have them

    // every group the channels use, once: their bytes and times
    std::vector<Comm*> groups() const {
        std::vector<Comm*> all;
        for (const std::unique_ptr<Comm>& group : own_groups) all.push_back(group.get());
        if (all.empty() && forward_out.group) all.push_back(forward_out.group);  // the one stage group
        return all;
    }
};

// The four channels over the stage group itself (stage i = rank i; MPI):
// tag 1 forward, 2 backward.
template <class Comm>
PipelineChannels<Comm> pipeline_channels_over(Comm& stages) {
    const int p = stages.size(), next = (stages.rank() + 1) % p, previous = (stages.rank() + p - 1) % p;
    PipelineChannels<Comm> channels;
    channels.forward_out = {&stages, next, 1};
    channels.forward_in = {&stages, previous, 1};
    channels.backward_out = {&stages, previous, 2};
    channels.backward_in = {&stages, next, 2};
    return channels;
}

// A new MPI group of two for link s (stage s and stage s + 1 mod p, in that
// order: stage s is rank 0), or MPI_COMM_NULL on the stages outside it; each
// call makes another (at p = 2 the four channels' groups hold the same two
// stages). Collective over `stages`.
MPI_Comm pipeline_link_group(MPI_Comm stages, int link);

// The four channels on groups of two of their own (NCCL), made by
// make_group(MPI_Comm) → std::unique_ptr<Comm> and connected at once
// (Comm::connect_one_way: NCCL's first transfer on a group waits for the
// peer's). Collective over `stages`: every stage makes and connects the
// groups link by link, in one order, so that a group's set-up (collective
// over its pair) never waits on a stage that is setting up another.
template <class Comm, class MakeGroup>
PipelineChannels<Comm> pipeline_channels_in_pairs(MPI_Comm stages, const MakeGroup& make_group) {
    int stage = 0, p = 1;
    MPI_Comm_rank(stages, &stage);
    MPI_Comm_size(stages, &p);
    PipelineChannels<Comm> channels;
    for (int link = 0; link < p; link++)
        for (bool forward : {true, false}) {
            MPI_Comm pair = pipeline_link_group(stages, link);
            if (pair == MPI_COMM_NULL) continue;
            channels.own_groups.push_back(make_group(pair));
            Comm* group = channels.own_groups.back().get();
            const PipelineChannel<Comm> channel{group, 1 - group->rank(), 0};
            const bool sender = (stage == link) == forward;  // forward: stage s sends; backward: s + 1
            group->connect_one_way(sender);
            if (forward) (sender ? channels.forward_out : channels.forward_in) = channel;
            else (sender ? channels.backward_out : channels.backward_in) = channel;
        }
    return channels;
}

}  // namespace tpsp
