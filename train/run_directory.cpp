#include "train/run_directory.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

#include "common/files.h"
#include "model/checkpoint.h"
#include "train/run_checkpoint.h"

namespace fs = std::filesystem;

namespace tpsp {

namespace {

// The step of a checkpoint file's name (model_00000500.bin, state_00000500.bin), or -1.
int step_of_checkpoint_name(const std::string& name) {
    for (const char* stem : {"model_", "state_"}) {
        const std::string prefix = stem;
        if (name.size() != prefix.size() + 12 || name.rfind(prefix, 0) != 0 || !name.ends_with(".bin")) continue;
        const std::string digits = name.substr(prefix.size(), 8);
        if (std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
            return std::stoi(digits);
    }
    return -1;
}

// Whether a file named like a checkpoint holds one: a regular file that
// begins as llm.c's model files (magic 20240326) or tpsp's state files (a
// "tpspst…" magic, of any layout) begin. Any other is the user's.
bool holds_a_checkpoint(const fs::path& path) {
    std::error_code ec;
    if (!fs::is_regular_file(fs::symlink_status(path, ec))) return false;
    std::ifstream in(path, std::ios::binary);
    int64_t head = 0;
    if (!in.read(reinterpret_cast<char*>(&head), sizeof head)) return false;
    const bool model = path.filename().string().rfind("model_", 0) == 0;
    return model
               ? int32_t(head) == checkpoint_magic
               : head == state_magic || head == state_magic_without_data_shape || head == state_magic_without_checksum;
}

// Every checkpoint file in dir (with its step), the temporaries aside.
std::vector<std::pair<int, fs::path>> checkpoint_files(const std::string& dir) {
    std::vector<std::pair<int, fs::path>> files;
    for (const fs::directory_entry& entry : fs::directory_iterator(dir)) {
        const int step = step_of_checkpoint_name(entry.path().filename().string());
        if (step >= 0) files.push_back({step, entry.path()});
    }
    return files;
}

}  // namespace

bool is_run_file_name(const std::string& name) {
    return name == "latest" || name == "lock" || step_of_checkpoint_name(name) >= 0;
}

bool is_run_file(const std::string& dir, const std::string& path) {
    const fs::path file(resolved_path(path));  // through links: where a write or a removal lands
    const fs::path folder = file.has_parent_path() ? file.parent_path() : fs::path(".");
    return is_run_file_name(file.filename().string()) && same_file(folder.string(), dir);
}

int latest_step(const std::string& dir) {
    std::error_code ec;  // a FIFO, a directory or a device is no run's `latest` (and a FIFO would block)
    if (!fs::is_regular_file(dir + "/latest", ec)) return -1;
    std::ifstream latest(dir + "/latest");
    int step = -1;
    if (!(latest >> step) || step < 0) return -1;
    return step;
}

RunDirectory::~RunDirectory() {
    if (lock_fd_ >= 0) ::close(lock_fd_);
}

void RunDirectory::claim(const std::string& dir, const std::string& resume, bool overwrite) {
    make_writable_directory(dir, "checkpoint");
    dir_ = dir;
    const std::string lock = dir + "/lock";
    lock_fd_ = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (lock_fd_ < 0) throw FileError(lock + ": cannot open the run's lock file (" + std::strerror(errno) + ")");
    if (::flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
        if (errno == EWOULDBLOCK)
            throw FileError(dir + ": another tpsp trainer is running in this checkpoint directory (it holds " + lock +
                            ")");
        throw FileError(lock + ": cannot lock the run's lock file (" + std::strerror(errno) + ")");
    }
    // the lock is ours: a temporary here whose writer has ended is a crashed
    // writer's (files only: a user's directory of such a name is left alone;
    // a live process's, another run's trace, say, is that run's)
    for (const fs::directory_entry& entry : fs::directory_iterator(dir))
        if (entry.symlink_status().type() == fs::file_type::regular &&
            is_stale_temporary_name(entry.path().filename().string()))
            fs::remove(entry.path());

    const bool resumes_here = !resume.empty() && same_file(resume, dir);
    if (resumes_here && overwrite)
        throw ConfigError("checkpoint.overwrite: checkpoint.resume continues the run in " + dir +
                          "; it cannot also start over there");
    const int step = latest_step(dir);
    if (step < 0 && fs::exists(fs::symlink_status(dir + "/latest")))  // a file of the user's: never replaced
        throw ConfigError("checkpoint.dir: " + dir + "/latest is not a tpsp run's (it names no step): move it, " +
                          "or choose another checkpoint.dir");
    const bool holds_a_run = step >= 0 || !checkpoint_files(dir).empty();
    if (!holds_a_run || resumes_here) return;
    if (!overwrite && step < 0)
        throw ConfigError("checkpoint.dir: " + dir +
                          " holds checkpoint files but no `latest` (a first save that never completed): nothing "
                          "there can be resumed; start over with checkpoint.overwrite=true");
    if (!overwrite)
        throw ConfigError("checkpoint.dir: " + dir + " already holds a run (latest step " + std::to_string(step) +
                          "): continue it with checkpoint.resume=" + dir +
                          ", or start over with checkpoint.overwrite=true");
    for (const auto& [unused, path] : checkpoint_files(dir))
        if (!holds_a_checkpoint(path))
            throw ConfigError("checkpoint.overwrite: " + path.string() +
                              " is not a tpsp checkpoint (neither a model nor a state file): it is not removed; "
                              "move it, or choose another checkpoint.dir");
    fs::remove(dir + "/latest");  // first: a crash from here on leaves no `latest` that names a removed step
    for (const auto& [unused, path] : checkpoint_files(dir)) fs::remove(path);
}

void RunDirectory::prune(int keep_last) const {
    if (keep_last <= 0) return;
    const int latest = latest_step(dir_);
    std::vector<std::pair<int, fs::path>> files;
    for (const auto& file : checkpoint_files(dir_))
        if (holds_a_checkpoint(file.second)) files.push_back(file);  // a user's file of such a name stays
    std::vector<int> steps;
    for (const auto& [step, unused] : files)
        if (step <= latest) steps.push_back(step);
    std::sort(steps.begin(), steps.end());
    steps.erase(std::unique(steps.begin(), steps.end()), steps.end());
    if (int(steps.size()) <= keep_last) return;
    const int oldest_kept = steps[steps.size() - size_t(keep_last)];
    for (const auto& [step, path] : files)
        if (step < oldest_kept) fs::remove(path);
}

}  // namespace tpsp
