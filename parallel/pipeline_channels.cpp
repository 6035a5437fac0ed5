#include "parallel/pipeline_channels.h"

namespace tpsp {

MPI_Comm pipeline_link_group(MPI_Comm stages, int link) {
    int stage = 0, p = 1;
    MPI_Comm_rank(stages, &stage);
    MPI_Comm_size(stages, &p);
    const int position = stage == link ? 0 : stage == (link + 1) % p ? 1 : -1;  // in the link, or outside it
    MPI_Comm pair = MPI_COMM_NULL;
    MPI_Comm_split(stages, position < 0 ? MPI_UNDEFINED : 0, position, &pair);
    return pair;
}

}  // namespace tpsp
