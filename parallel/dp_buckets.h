// Data parallelism's view of one rank's gradient buffer (docs/design.md §8).
//
// The buffer is the model's parameters in their order, flat (model.grads),
// made of units (a tensor, or one layer's slice of one), each final at a
// stage of backward: layer l's slice of a TP-sharded tensor once block l's
// backward is done, the rest (the embeddings, and the replicated tensors,
// which the TP group sums after backward) at its end. The buckets are cut
// from the end, within one tensor: a bucket takes the units of one tensor
// from its last layer back until it holds at least bucket_size elements, and
// a tensor's last bucket may hold fewer. So llm.c's layout, a tensor of
// every layer after another, still gives buckets that become final one
// layer at a time. Bucket b of L elements is split into dp shards of ⌈L/dp⌉
// (the last ones shorter, or empty: the padding is never sent, and only the
// optimizer state is sized with it). Rank q's piece of bucket b is its q-th
// shard: the part of every gradient that rank q sums over the ranks and,
// with the distributed optimizer, updates.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace tpsp {

// [begin, begin + count) of the flat buffer
struct FlatRange {
    int64_t begin = 0, count = 0;
};

// One unit of the buffer: its elements, the tensor it belongs to, the stage
// of backward after which its gradient is final (1 … L: block L − s's
// backward done; L + 1: the end of backward), and the stage of forward that
// first reads its parameters (0: the embeddings; 1 … L: block s − 1; L + 1:
// the final LayerNorm).
struct BucketUnit {
    int64_t elements = 0;
    int tensor = 0;
    int final_at = 0;
    int needed_at = 0;
};

struct GradientBucket {
    int64_t begin = 0, end = 0;  // the flat buffer's [begin, end), whole units
    int64_t shard = 0;           // ⌈(end − begin) / dp⌉
    int final_at = 0;            // the latest final_at of its units
    int needed_at = 0;           // the earliest needed_at of its units
};

class BucketLayout {
public:
    // units: in buffer order
    BucketLayout(const std::vector<BucketUnit>& units, int64_t bucket_size, int dp);

    const std::vector<GradientBucket>& buckets() const { return buckets_; }
    int dp() const { return dp_; }
    // rank q's shard of bucket b, in the flat buffer (count may be 0)
    FlatRange piece(size_t b, int q) const;
    // every rank's piece of bucket b, for one collective: its count, and its
    // offset from the bucket's begin, per rank (made once, with the layout)
    const std::vector<int>& counts(size_t b) const { return counts_[b]; }
    const std::vector<int>& offsets(size_t b) const { return offsets_[b]; }
    // the elements of a rank's optimizer state: Σ over buckets of ⌈L/dp⌉
    int64_t shard_elements() const;
    // dp · shard_elements − the buffer's elements: the padding, never sent
    int64_t padding() const;

private:
    std::vector<GradientBucket> buckets_;
    std::vector<std::vector<int>> counts_, offsets_;  // [bucket][rank]
    int dp_ = 1;
};

}  // namespace tpsp
