#include "train/metrics.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "common/errors.h"

namespace tpsp {

MetricsFile::~MetricsFile() {
    if (file_) std::fclose(file_);
}

void MetricsFile::open(const std::string& path, bool append) {
    std::filesystem::path parent = std::filesystem::path(path).parent_path();
    std::error_code ec;
    if (!parent.empty()) std::filesystem::create_directories(parent, ec);
    file_ = std::fopen(path.c_str(), append ? "a" : "w");
    if (!file_) throw FileError(path + ": cannot open metrics file for writing");
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
    };
    if (!std::isnan(m.val_loss)) line["val_loss"] = m.val_loss;
    std::fputs(line.dump().c_str(), file_);
    std::fputc('\n', file_);
    std::fflush(file_);
}

}  // namespace tpsp
