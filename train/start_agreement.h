// Set-up is collective (docs/design.md §7): every rank parses its own command
// line and loads its own config, and then all ranks compare their outcomes,
// and what each resolved, before any rank goes on. A rank whose config is
// missing or wrong, or that would run another command or another config,
// would otherwise leave the others blocked in their first collective.
#pragma once
#include <string>

namespace tpsp {

// What one rank is about to run: `exit_code` -1 means it goes on; 0 (after
// --help) or more means it stops, with `error` its one line where it failed.
// `resolved` is the command and every config value as this rank resolved
// them, one "key=value" a line.
struct StartOutcome {
    int exit_code = -1;
    std::string error;
    std::string resolved;
};

// Collective over MPI_COMM_WORLD, under parallel.timeout_s's default
// deadline: -1 when every rank goes on with the same `resolved`; else the
// lowest failing (or differing) rank has printed one line naming itself and
// the reason, and every rank gets the exit code to end with.
int agree_on_start(const StartOutcome& mine);

// Collective over MPI_COMM_WORLD: the lowest rank whose `mine` (lines of
// text) differs from rank 0's, or -1 when every rank holds the same; on that
// rank, `difference` is the first line that differs, as "LINE (rank 0: LINE)".
int lowest_rank_differing(const std::string& mine, std::string& difference);

}  // namespace tpsp
