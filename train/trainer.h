// `tpsp train` and `tpsp eval`. The trainer is a small type whose named
// steps are the outline of a training run (trainer_impl.h defines them):
//
//   set_up()   every rank builds its grid, loaders, model and optimizer and
//              restores the weights; rank 0 claims the files the run will
//              write; anything a user got wrong ends here
//   run()      for each step: train_step(), then log(), and when due
//              validation_loss(), sample() and save(); a non-finite step or
//              a stop signal ends it early (docs/design.md §7)
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "data/token_shards.h"
#include "model/gpt.h"
#include "model/sampler.h"
#include "parallel/process_grid.h"
#include "parallel/trace.h"
#include "train/adamw.h"
#include "train/config.h"
#include "train/data_parallel.h"
#include "train/hellaswag.h"
#include "train/metrics.h"
#include "train/pipeline_step.h"
#include "train/run_checkpoint.h"
#include "train/run_directory.h"

namespace tpsp {

template <class Backend>
class Trainer {
public:
    explicit Trainer(const Config& config);
    // Collective: true when every rank is ready; else the lowest failing
    // rank has printed its one line and every rank returns false.
    bool set_up();
    // The step loop, from the restored step to train.steps; returns the exit
    // code: 0, 1 after an error, 128 + the signal's number after a stop signal.
    int run();

private:
    using Comm = typename Backend::Comm;
    void open_data();                              // set_up's work on this rank: the grid and the loaders,
    void check_same_inputs_on_every_rank() const;  // every rank's shards and checkpoint the same,
    void build();                                  // then the model and its state
    void restore();                                // checkpoint.resume, checkpoint.init, or random weights
    DataPosition data_position() const;            // the loader's position and the shape that gives it its meaning
    void check_same_data_shape(const DataPosition& saved) const;  // a resume that would re-index the data: refused
    void claim_outputs();            // rank 0: the checkpoint directory, metrics and trace, proven writable
    void check_files_apart() const;  // rank 0: no output is an input, another output or a run directory's file
    void print_header() const;
    int read_step_batches(int step);   // -1, or the exit code after a bad shard (the last step saved first)
    StepMetrics train_step(int step);  // one optimizer step: micro-batches, reductions, clip, AdamW
    int stop_diverged(const StepMetrics& m);
    int stop_on_signal(int done);
    float validation_loss();               // mean over train.val_batches batches of every DP rank
    void score_hellaswag(StepMetrics& m);  // data.hellaswag's acc_norm and acc, the DP ranks splitting it
    void log(const StepMetrics& m, bool last);
    void sample(int done);  // a short text from the model (rank 0 prints)
    void save(int done);    // checkpoint.dir: model, state, latest
    // a pipeline's first and last stage: wte's two gradient sums, each to the other
    void exchange_embedding_grads();
    std::string pipeline_text() const;  // the grid line's pipeline part
    void write_trace();

    const Config& cfg_;
    const GPTConfig gpt_;
    const RunShape shape_;
    const LrSchedule schedule_;
    ProcessGrid grid_;
    Tracer tracer_;
    std::unique_ptr<typename Backend::Runtime> runtime_;  // the GPU this rank drives, on CUDA
    std::unique_ptr<Comm> tp_comm_, dp_comm_;             // the model's and the gradients' (dp × cp) groups
    std::unique_ptr<Comm> cp_comm_;                       // context parallelism's, where cp > 1
    std::unique_ptr<Comm> stage_comm_;      // this rank's pipeline (its stages), where pp > 1 on the CPU: its channels'
    std::unique_ptr<Comm> dp_gather_comm_;  // the DP group again, for the gradients' all-gathers (not on NCCL)
    std::unique_ptr<TokenLoader> train_loader_, val_loader_;
    std::unique_ptr<GPTModel<Backend>> model_;
    std::unique_ptr<AdamWOptimizer<Backend>> optimizer_;
    std::unique_ptr<DataParallelStep<Backend>> data_parallel_;  // the gradients' buckets, their sum, the norm
    std::unique_ptr<PipelineStep<Backend>> pipeline_;           // the stage's schedule, where pp > 1
    std::unique_ptr<ShardGatherer<Backend>> gatherer_;          // for checkpoints and samples
    std::unique_ptr<Generator> sampler_;
    std::vector<std::string> token_text_;      // what each token prints as, for samples
    std::vector<int> sample_prompt_;           // a sample's first token
    std::vector<HellaSwagExample> hellaswag_;  // data.hellaswag, encoded, where train.hellaswag_every > 0
    MetricsFile metrics_;
    RunDirectory run_dir_;  // checkpoint.dir, locked while the run lasts (rank 0)
    int start_step_ = 0;
    bool diverged_ = false;  // the last step's loss or gradient norm was not finite, on some rank
    int stop_signal_ = 0;    // a rank caught SIGTERM or SIGINT (the signal's number)
    int tokens_per_step_ = 0;
    double flops_per_step_ = 0.0;  // model FLOPs of this rank's share of a step
    double peak_flops_ = 0.0;
    std::vector<int> inputs_, targets_;  // one step's micro-batches [accum, b, s], on the host
};

// Trains as the config says on one backend (CpuBackend, or CudaBackend in a
// CUDA build); returns the process exit code. train.device picks (main.cpp).
template <class Backend>
int train_on(const Config& config) {
    Trainer<Backend> trainer(config);
    if (!trainer.set_up()) return 1;
    return trainer.run();
}

// Loads checkpoint.init and prints the validation loss over
// train.val_batches batches, the same measurement train makes (CPU), or with
// `hellaswag` the score of data.hellaswag (train/hellaswag.h); at any tp,
// the ranks beyond one model splitting the batches or examples.
int evaluate(const Config& config, bool hellaswag = false);

}  // namespace tpsp
