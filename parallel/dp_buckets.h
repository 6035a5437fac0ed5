// Data parallelism's view of one rank's gradient buffer (docs/design.md §8).
//
// The buffer is the model's parameters in their order, flat (model.grads),
// made of units (a tensor, or one layer's slice of one). The buckets are cut
// from the end: bucket 0 holds the last units, and each bucket takes whole
// units until it holds at least bucket_size elements. Bucket b of L elements
// is split into dp shards of ⌈L/dp⌉ (the last ones shorter, or empty: the
// padding is never sent, and only the optimizer state is sized with it).
// Rank q's piece of bucket b is its q-th shard: the part of every gradient
// that rank q sums over the ranks and, with the distributed optimizer,
// updates.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace tpsp {

// [begin, begin + count) of the flat buffer
struct FlatRange {
    int64_t begin = 0, count = 0;
};

struct GradientBucket {
    int64_t begin = 0, end = 0;  // the flat buffer's [begin, end), whole units
    int64_t shard = 0;           // ⌈(end − begin) / dp⌉
};

class BucketLayout {
public:
    BucketLayout() = default;
    // unit_sizes: the elements of each unit, in buffer order
    BucketLayout(const std::vector<int64_t>& unit_sizes, int64_t bucket_size, int dp);

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
