// The run directory (checkpoint.dir) while a trainer owns it: one trainer at
// a time (an flock on DIR/lock), no run started over another by mistake, no
// temporaries left from a crash, and at most checkpoint.keep_last
// checkpoints (docs/design.md §7).
#pragma once
#include <string>

namespace tpsp {

// The step DIR/latest names, or -1 where DIR holds no `latest`.
int latest_step(const std::string& dir);

// Whether a file name is one the run directory manages: `latest`, `lock`, or
// a checkpoint (model_N.bin, state_N.bin). A run writes, replaces and
// removes these, so none of them may be one of the run's inputs or other outputs.
bool is_run_file_name(const std::string& name);
// Whether PATH is (or would be) one of those files of the run directory DIR.
bool is_run_file(const std::string& dir, const std::string& path);

class RunDirectory {
public:
    RunDirectory() = default;
    RunDirectory(const RunDirectory&) = delete;
    RunDirectory& operator=(const RunDirectory&) = delete;
    ~RunDirectory();  // releases the lock (so does the process ending, however it ends)

    // Creates DIR and proves it writable, takes its lock (a second trainer
    // is refused), removes temporaries a crashed writer left, and checks what
    // DIR holds: another run's checkpoints are an error unless `resume` names
    // DIR (the run continues) or `overwrite` is set (they are removed).
    void claim(const std::string& dir, const std::string& resume, bool overwrite);

    // After a save: removes all but the newest keep_last checkpoints at or
    // before the step `latest` names (model and state files); 0 keeps all.
    // Checkpoints after it belong to a timeline that a resume from an earlier
    // `latest` left: they are never counted as newest, nor removed.
    void prune(int keep_last) const;

private:
    std::string dir_;
    int lock_fd_ = -1;
};

}  // namespace tpsp
