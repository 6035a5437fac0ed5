#include "train/metrics.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/files.h"

namespace tpsp {

MetricsFile::~MetricsFile() {
    if (fd_ >= 0) ::close(fd_);
}

namespace {

// The bytes of the file's leading whole lines that are JSON objects whose
// "step" is at most `step`: what a run resumed at `step` keeps.
off_t bytes_up_to_step(const std::string& path, int step) {
    std::ifstream in(path, std::ios::binary);
    off_t kept = 0;
    for (std::string line; std::getline(in, line) && !in.eof();) {  // a last line without '\n' is cut
        const nlohmann::json record = nlohmann::json::parse(line, nullptr, false);
        if (!record.is_object() || !record.contains("step") || !record["step"].is_number_integer() ||
            record["step"].get<int64_t>() > step)
            break;
        kept += off_t(line.size() + 1);
    }
    return kept;
}

}  // namespace

void MetricsFile::open(const std::string& path, Start start, int resumed_step) {
    check_writable_file(path, "metrics");
    path_ = path;
    // opened without O_TRUNC: nothing is changed before the lock is held and the file checked
    fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) throw FileError(path + ": cannot open metrics file for writing (" + std::strerror(errno) + ")");
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0)
        throw FileError(path +
                        ": another tpsp run is writing these metrics (it holds the file's lock): choose "
                        "another logging.metrics");
    const off_t earlier = ::lseek(fd_, 0, SEEK_END);
    if (earlier > 0 && bytes_up_to_step(path, INT_MAX) == 0)  // not even one metrics line: a file of the user's
        throw ConfigError("logging.metrics: " + path + " holds something other than tpsp metrics (" +
                          std::to_string(earlier) + " bytes): choose another file (checkpoint.overwrite replaces " +
                          "only metrics)");
    if (start == Start::new_run && earlier > 0)
        throw ConfigError("logging.metrics: " + path + " already holds another run's metrics (" +
                          std::to_string(earlier) +
                          " bytes): choose another file, or replace it with checkpoint.overwrite=true");
    const off_t keep = start == Start::resume ? bytes_up_to_step(path, resumed_step) : 0;
    if (keep != earlier && ::ftruncate(fd_, keep) != 0)
        throw FileError(path + ": cannot cut the metrics back to step " + std::to_string(resumed_step) + " (" +
                        std::strerror(errno) + ")");
}

void MetricsFile::write(const StepMetrics& m) {
    nlohmann::ordered_json line = {
        {"step", m.step},
        {"loss", m.loss},
        {"lr", m.lr},
        {"grad_norm", m.grad_norm},
        {"ms", m.seconds * 1e3},
        {"tokens_per_s", m.tokens_per_second},
        {"mfu", m.mfu},
        {"all_gather_bytes", m.bytes.all_gather},
        {"reduce_scatter_bytes", m.bytes.reduce_scatter},
        {"all_reduce_bytes", m.bytes.all_reduce},
        {"comm_ms", m.comm.total * 1e3},
        {"exposed_comm_ms", m.comm.exposed * 1e3},
        {"dp_reduce_scatter_bytes", m.dp_bytes.reduce_scatter},
        {"dp_all_gather_bytes", m.dp_bytes.all_gather},
        {"dp_comm_ms", m.dp_comm.total * 1e3},
        {"dp_exposed_comm_ms", m.dp_comm.exposed * 1e3},
        {"cp_all_to_all_bytes", m.cp_bytes.all_to_all},
        {"cp_ring_bytes", m.cp_bytes.ring},
        {"cp_comm_ms", m.cp_comm.total * 1e3},
        {"cp_exposed_comm_ms", m.cp_comm.exposed * 1e3},
    };
    if (!std::isnan(m.pp_bubble_theory)) {  // a pipeline
        line["pp_received_bytes"] = m.pp_bytes.pipeline;
        line["pp_comm_ms"] = m.pp_comm.total * 1e3;
        line["pp_exposed_comm_ms"] = m.pp_comm.exposed * 1e3;
        if (!std::isnan(m.pp_bubble)) line["pp_bubble"] = m.pp_bubble;  // measured on the CPU only
        line["pp_bubble_theory"] = m.pp_bubble_theory;
    }
    if (!std::isnan(m.val_loss)) line["val_loss"] = m.val_loss;
    if (!std::isnan(m.hellaswag_acc_norm)) {
        line["hellaswag_acc_norm"] = m.hellaswag_acc_norm;
        line["hellaswag_acc"] = m.hellaswag_acc;
    }
    const std::string text = line.dump() + "\n";
    const off_t end = ::lseek(fd_, 0, SEEK_END);
    size_t written = 0;
    while (written < text.size()) {
        const ssize_t n = ::write(fd_, text.data() + written, text.size() - written);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            const int error = n < 0 ? errno : ENOSPC;
            const bool whole_lines = end >= 0 && ::ftruncate(fd_, end) == 0;  // drops what was written of it
            throw FileError(path_ + ": cannot write the metrics of step " + std::to_string(m.step) + " (" +
                            std::strerror(error) + ")" + (whole_lines ? "" : "; its last line may be cut"));
        }
        written += size_t(n);
    }
}

}  // namespace tpsp
