#include "train/start_agreement.h"

#include <mpi.h>

#include <cstdio>
#include <sstream>
#include <vector>

#include "common/checksum.h"
#include "parallel/communicator.h"

namespace tpsp {

namespace {

struct World {
    int rank = 0, size = 1;
};

World world() {
    World w;
    MPI_Comm_rank(MPI_COMM_WORLD, &w.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &w.size);
    return w;
}

// The lowest rank for which `mine` holds, or the world's size if none.
int lowest_rank_where(bool mine, const World& w) {
    int rank = mine ? w.rank : w.size;
    all_reduce_ints(&rank, 1, MPI_MIN, MPI_COMM_WORLD, "agreement at set-up");
    return rank;
}

// Rank 0's text on every rank: its length, then its bytes, each an all-reduce
// of the maximum to which the other ranks give 0.
std::string rank_zeros_text(const std::string& mine, const World& w) {
    int length = w.rank == 0 ? int(mine.size()) : 0;
    all_reduce_ints(&length, 1, MPI_MAX, MPI_COMM_WORLD, "agreement at set-up");
    std::vector<int> bytes(size_t(length), 0);
    if (w.rank == 0)
        for (int i = 0; i < length; i++) bytes[size_t(i)] = (unsigned char)mine[size_t(i)];
    all_reduce_ints(bytes.data(), length, MPI_MAX, MPI_COMM_WORLD, "agreement at set-up");
    return std::string(bytes.begin(), bytes.end());
}

// The first line in which two resolved texts differ, said as "A (rank 0: B)".
std::string first_difference(const std::string& mine, const std::string& rank_zeros) {
    std::istringstream a(mine), b(rank_zeros);
    std::string line_a, line_b;
    while (true) {
        const bool more_a = bool(std::getline(a, line_a)), more_b = bool(std::getline(b, line_b));
        if (!more_a && !more_b) return "the same lines";
        if (!more_a) line_a = "(nothing)";
        if (!more_b) line_b = "(nothing)";
        if (line_a != line_b) return line_a + " (rank 0: " + line_b + ")";
    }
}

}  // namespace

int agree_on_start(const StartOutcome& mine) {
    const World w = world();
    const int failed = lowest_rank_where(mine.exit_code > 0, w);
    if (failed < w.size) {
        if (w.rank == failed) {
            if (w.size > 1) std::fprintf(stderr, "tpsp: rank %d: %s\n", w.rank, mine.error.c_str());
            else std::fprintf(stderr, "tpsp: %s\n", mine.error.c_str());
        }
        return mine.exit_code > 0 ? mine.exit_code : 1;
    }
    std::string difference;
    const int differs = lowest_rank_differing(mine.resolved, difference);
    if (differs < 0) return mine.exit_code;  // every rank resolved the same
    if (w.rank == differs)
        std::fprintf(stderr,
                     "tpsp: rank %d: its command or config differs from rank 0's: %s; every rank must run the "
                     "same command and config\n",
                     w.rank, difference.c_str());
    return 1;
}

int lowest_rank_differing(const std::string& mine, std::string& difference) {
    const World w = world();
    const int digest = int(crc32c(mine.data(), mine.size()) >> 1);  // ≥ 0: it can be negated
    int lowest[2] = {digest, -digest};  // the minimum and minus the maximum, in one all-reduce
    all_reduce_ints(lowest, 2, MPI_MIN, MPI_COMM_WORLD, "agreement at set-up");
    if (lowest[0] == -lowest[1]) return -1;
    const std::string rank_zeros = rank_zeros_text(mine, w);
    const int differs = lowest_rank_where(mine != rank_zeros, w);
    if (w.rank == differs) difference = first_difference(mine, rank_zeros);
    return differs;
}

}  // namespace tpsp
