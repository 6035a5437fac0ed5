// What one optimizer step did, and the metrics file that records it: one
// JSON object per step (JSON lines), written with nlohmann-json so that every
// line is valid JSON (a non-finite number is written as null).
#pragma once
#include <cmath>
#include <string>

#include "parallel/communicator.h"

namespace tpsp {

struct StepMetrics {
    int step = 0;  // optimizer steps done
    double loss = 0.0;
    float lr = 0.0f, grad_norm = 0.0f;
    double seconds = 0.0, tokens_per_second = 0.0;
    double mfu = 0.0;               // model FLOP/s over the backend's peak, a fraction
    CollectiveBytes bytes;          // what the TP group's collectives moved
    CommunicationTime comm;         // and how long they took (exposed: waited for)
    CollectiveBytes dp_bytes;       // what the DP group's gradient and parameter collectives moved
    CommunicationTime dp_comm;      // and how long they took (all exposed: they block, §8)
    CollectiveBytes cp_bytes;       // what the CP group's all-to-alls moved (sp2hp / hp2sp, §9)
    CommunicationTime cp_comm;      // and how long they took (all exposed: they block)
    CollectiveBytes pp_bytes;       // what this rank received from its neighbouring pipeline stages (§10)
    CommunicationTime pp_comm;      // and how long the receives took
    double pp_bubble = NAN;         // the fraction of the schedule's time this stage waited (pp > 1, CPU)
    double pp_bubble_theory = NAN;  // (p − 1)/(m·vpp + p − 1): the first stage's under the schedule
    float val_loss = NAN;           // NaN where no validation ran at this step
    float hellaswag_acc_norm = NAN, hellaswag_acc = NAN;  // fractions; NaN where HellaSwag was not scored
};

class MetricsFile {
public:
    MetricsFile() = default;
    MetricsFile(const MetricsFile&) = delete;
    MetricsFile& operator=(const MetricsFile&) = delete;
    ~MetricsFile();
    // Creates the file's directory and locks the file for as long as this
    // object lives (a second run on it is refused), then: a resumed run cuts
    // the file back to its lines up to `resumed_step` (the steps after it,
    // which a killed run wrote but never saved, are trained again) and
    // appends; a new run refuses a file that already holds metrics (another
    // run's: a ConfigError) unless told to overwrite it. Throws FileError.
    enum class Start { resume, new_run, overwrite };
    void open(const std::string& path, Start start, int resumed_step);
    bool is_open() const { return fd_ >= 0; }
    // One line, written whole or not at all: a FileError if it did not
    // reach the file (disk full), and the file keeps only whole lines.
    void write(const StepMetrics& m);

private:
    std::string path_;
    int fd_ = -1;
};

}  // namespace tpsp
