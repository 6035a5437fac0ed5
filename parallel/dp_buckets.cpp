#include "parallel/dp_buckets.h"

#include <algorithm>
#include <limits>
#include <stdexcept>

namespace tpsp {

BucketLayout::BucketLayout(const std::vector<BucketUnit>& units, int64_t bucket_size, int dp) : dp_(dp) {
    if (bucket_size < 1 || dp < 1) throw std::invalid_argument("BucketLayout: bucket_size and dp must be positive");
    int64_t end = 0;
    for (const BucketUnit& u : units) end += u.elements;
    // from the last unit back, closing a bucket once it holds bucket_size or its tensor begins
    const int never = std::numeric_limits<int>::max();
    GradientBucket open{end, end, 0, 0, never};
    for (size_t i = units.size(); i-- > 0;) {
        open.begin -= units[i].elements;
        open.final_at = std::max(open.final_at, units[i].final_at);
        open.needed_at = std::min(open.needed_at, units[i].needed_at);
        if (open.end - open.begin >= bucket_size || i == 0 || units[i - 1].tensor != units[i].tensor) {
            open.shard = (open.end - open.begin + dp - 1) / dp;
            buckets_.push_back(open);
            open = {open.begin, open.begin, 0, 0, never};
        }
    }
    for (size_t b = 0; b < buckets_.size(); b++) {
        counts_.emplace_back(size_t(dp));
        offsets_.emplace_back(size_t(dp));
        for (int q = 0; q < dp; q++) {
            const FlatRange p = piece(b, q);
            counts_[b][size_t(q)] = int(p.count);
            offsets_[b][size_t(q)] = int(p.begin - buckets_[b].begin);
        }
    }
}

FlatRange BucketLayout::piece(size_t b, int q) const {
    const GradientBucket& bucket = buckets_[b];
    const int64_t begin = std::min(bucket.begin + int64_t(q) * bucket.shard, bucket.end);
    return {begin, std::min(bucket.shard, bucket.end - begin)};
}

int64_t BucketLayout::shard_elements() const {
    int64_t n = 0;
    for (const GradientBucket& b : buckets_) n += b.shard;
    return n;
}

int64_t BucketLayout::padding() const {
    int64_t n = 0;
    for (const GradientBucket& b : buckets_) n += b.end - b.begin;
    return int64_t(dp_) * shard_elements() - n;
}

}  // namespace tpsp
