// The trainer's steps (trainer.h), written once for both backends:
// trainer.cpp instantiates them on the CPU, cuda_commands.cpp on CUDA.
#pragma once
#include <mpi.h>
#include <omp.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <string>

#include "common/checksum.h"
#include "common/files.h"
#include "data/gpt2_tokenizer.h"
#include "train/start_agreement.h"
#include "train/stop_signals.h"
#include "train/trainer.h"

namespace tpsp {

namespace trainer_detail {

// The shards a glob matches, or none (an empty pattern, no match, a match
// that is not a file: the run that would read them says so, not this).
inline std::vector<std::string> shards_if_any(const std::string& pattern) {
    if (pattern.empty()) return {};
    try {
        return expand_shard_glob(pattern);
    } catch (const FileError&) {
        return {};
    }
}

inline double seconds_since(std::chrono::steady_clock::time_point start) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Mean loss over `batches` validation batches of every DP rank; under a
// pipeline each batch goes through the stages in turn, and the last stage's
// sum reaches every stage.
template <class Backend>
float validation_loss(GPTModel<Backend>& model, TokenLoader& loader, ProcessGrid& grid, int batches, int* inputs,
                      int* targets, PipelineStep<Backend>* pipeline = nullptr) {
    loader.reset();
    double sum = 0.0;
    for (int i = 0; i < batches; i++) {
        loader.next_batch(inputs, targets);
        sum += pipeline ? pipeline->forward_only(inputs, targets) : model.forward(inputs, targets, {}, false);
    }
    grid.dp_group.all_reduce_sum(&sum, 1);
    if (grid.pp > 1) grid.stage_group.all_reduce_sum(&sum, 1);
    return float(sum / (double(batches) * grid.dp));
}

// "NAME: what it holds", or "NAME: unreadable (why)": compared as well, so
// that no rank leaves the comparison (check_same_inputs) for its error.
template <class F>
std::string input_line(const std::string& name, F&& identity) {
    try {
        return name + ": " + identity() + "\n";
    } catch (const FileError& e) {
        return name + ": unreadable (" + e.what() + ")\n";
    }
}

// The lines of every shard a loader reads, for check_same_inputs.
inline std::string shard_lines(const TokenLoader* loader) {
    std::string lines;
    if (loader)
        for (const std::string& shard : loader->shard_paths())
            lines += input_line(shard, [&] { return shard_identity(shard); });
    return lines;
}

// The ranks agreed on the files' names (agree_on_start); a node whose copy of
// one holds other bytes would train on it silently (another model, other
// tokens), so the files themselves are compared, by size and CRC-32C:
// collective over the job, a FileError on the lowest rank whose copy differs.
inline void check_same_inputs(const std::string& lines) {
    std::string difference;
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (lowest_rank_differing(lines, difference) == rank)
        throw FileError("its copy of an input differs from rank 0's: " + difference +
                        "; every rank must read the same files");
}

// Runs `work` on every rank; if it failed anywhere, the lowest failing rank
// prints its one line and every rank returns false together: no rank is
// left waiting in a collective.
template <class F>
bool on_every_rank(F&& work);

// Runs `work` on every rank; returns the lowest rank where it failed (the
// world's size where it failed nowhere), with this rank's line in `error`.
template <class F>
int first_failing_rank(F&& work, std::string& error) {
    try {
        work();
    } catch (const ConfigError& e) {
        error = std::string("config error: ") + e.what();
    } catch (const FileError& e) {
        error = std::string("error: ") + e.what();
    } catch (const std::bad_alloc&) {
        error = "error: out of memory (reduce train.batch_size or the model, or raise parallel.tp)";
    } catch (const std::runtime_error& e) {  // CUDA, cuBLAS, NCCL
        error = std::string("error: ") + e.what();
    }
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int first_failure = error.empty() ? size : rank;
    all_reduce_ints(&first_failure, 1, MPI_MIN, MPI_COMM_WORLD, "agreement on errors");
    return first_failure;
}

// The lowest failing rank's one line, printed by that rank.
inline void say_error(const std::string& error) {
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size > 1) std::fprintf(stderr, "tpsp: rank %d: %s\n", rank, error.c_str());
    else std::fprintf(stderr, "tpsp: %s\n", error.c_str());
}

// Runs `work` on every rank; if it failed anywhere, the lowest failing rank
// prints its one line and every rank returns false together.
template <class F>
bool on_every_rank(F&& work) {
    std::string error;
    const int failed = first_failing_rank(work, error);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (failed == size) return true;
    if (rank == failed) say_error(error);
    return false;
}

inline LrSchedule schedule_of(const Config::Train& t) {
    return {t.lr, t.min_lr_ratio, t.warmup_steps, t.steps, t.lr_schedule == "cosine"};
}

inline const char* stop_signal_name(int signal) { return signal == SIGINT ? "SIGINT" : "SIGTERM"; }

// Which GPU this rank drives: its rank on the node (0 without a launcher
// that says); the CPU backend ignores it.
int local_rank();

// A validation of more batches than the set holds would read some of them
// twice, silently, as the loader starts over at the first.
inline void check_val_batches_fit(int val_batches, const TokenLoader& val_loader) {
    if (val_batches > val_loader.batches_per_epoch())
        throw ConfigError("train.val_batches: " + std::to_string(val_batches) + " is more than the " +
                          std::to_string(val_loader.batches_per_epoch()) + " batches the validation set holds");
}

// Every stage's part of the model, for the checkpoint gather; none without a pipeline.
inline std::vector<ModelPart> stage_parts(const PipelineShape& pipeline) {
    std::vector<ModelPart> parts;
    for (int stage = 0; pipeline.stages > 1 && stage < pipeline.stages; stage++)
        parts.push_back(pipeline_part(pipeline, stage));
    return parts;
}

}  // namespace trainer_detail

template <class Backend>
Trainer<Backend>::Trainer(const Config& config)
    : cfg_(config), gpt_(config.gpt()), shape_(config.run_shape()),
      schedule_(trainer_detail::schedule_of(config.train)),
      inputs_(size_t(shape_.batch) * shape_.seq_len * size_t(config.train.grad_accum)), targets_(inputs_.size()) {
    sample_prompt_ = {gpt_.vocab_size == 256 ? int('\n') : gpt2_end_of_text};  // a line break, or <|endoftext|>
}

template <class Backend>
bool Trainer<Backend>::set_up() {
    if (cfg_.train.threads > 0) omp_set_num_threads(cfg_.train.threads);
    set_peer_timeout(cfg_.parallel.timeout_s);
    if (!trainer_detail::on_every_rank([&] { open_data(); })) return false;
    if (!trainer_detail::on_every_rank([&] { check_same_inputs_on_every_rank(); })) return false;
    if (!trainer_detail::on_every_rank([&] { build(); })) return false;
    tokens_per_step_ = shape_.batch * shape_.seq_len * cfg_.train.grad_accum * grid_.dp;
    flops_per_step_ = model_flops_per_token(gpt_, shape_.seq_len) * tokens_per_step_ / grid_.world_size;
    peak_flops_ = Backend::peak_flops();
    print_header();
    return true;
}

// The process grid and the data loaders, every shard's header read (and the
// validation shards whole): a bad shard costs no set-up.
template <class Backend>
void Trainer<Backend>::open_data() {
    int world;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    const int tp = cfg_.parallel.tp, cp = cfg_.parallel.cp, pp = cfg_.parallel.pp;
    if (world % (tp * cp * pp) != 0)
        throw ConfigError((pp > 1   ? "parallel.pp: pp · cp · tp = " + std::to_string(pp * cp * tp)
                           : cp > 1 ? "parallel.cp: tp · cp = " + std::to_string(tp * cp)
                                    : "parallel.tp: " + std::to_string(tp)) +
                          " does not divide the " + std::to_string(world) + " ranks launched");
    grid_ = make_process_grid(tp, cp, pp);
    train_loader_ = std::make_unique<TokenLoader>(cfg_.data.train, shape_.batch, shape_.seq_len, grid_.dp_rank,
                                                  grid_.dp, gpt_.vocab_size);
    if (!cfg_.data.val.empty() && cfg_.train.val_every > 0) {
        check_train_and_val_apart(cfg_.data.train, cfg_.data.val);
        val_loader_ = std::make_unique<TokenLoader>(cfg_.data.val, shape_.batch, shape_.seq_len, grid_.dp_rank,
                                                    grid_.dp, gpt_.vocab_size);
        trainer_detail::check_val_batches_fit(cfg_.train.val_batches, *val_loader_);
        val_loader_->check_every_shard();  // small: a bad one is found now, not at the first validation
    }
    if (cfg_.train.hellaswag_every > 0) {
        hellaswag_ = load_hellaswag(cfg_.data.hellaswag, gpt_.vocab_size, cfg_.data.bpe_dir, shape_.seq_len);
        const int cut = hellaswag_cut_examples(hellaswag_, shape_.seq_len);
        if (cut > 0 && grid_.world_rank == 0)
            std::fprintf(stderr,
                         "tpsp: note: %d of %zu HellaSwag examples lose the start of their context to fit "
                         "train.seq_len = %d\n",
                         cut, hellaswag_.size(), shape_.seq_len);
    }
}

// The model, its optimizer and communicators, and the weights to start from.
template <class Backend>
void Trainer<Backend>::build() {
    if (!cfg_.checkpoint.init.empty()) check_checkpoint_model(cfg_.checkpoint.init, gpt_);
    runtime_ = std::make_unique<typename Backend::Runtime>(trainer_detail::local_rank());
    tp_comm_ = Backend::make_group(*grid_.tp_group.mpi());
    // the gradients' and the optimizer's group: every rank holding these parameters (dp × cp)
    dp_comm_ = Backend::make_group(*grid_.replica_group.mpi());
    if (grid_.cp > 1) cp_comm_ = Backend::make_group(*grid_.cp_group.mpi());
    PipelineChannels<Comm> channels;  // a pipeline's, handed to pipeline_ below (parallel/pipeline_channels.h)
    if (grid_.pp > 1) {
        if constexpr (Comm::runs_in_enqueue_order) {  // NCCL: a group of two for each channel
            channels = pipeline_channels_in_pairs<Comm>(*grid_.stage_group.mpi(), Backend::make_group);
        } else {  // MPI: the stage group carries all four
            stage_comm_ = Backend::make_group(*grid_.stage_group.mpi());
            channels = pipeline_channels_over(*stage_comm_);
        }
    }
    tp_comm_->link = {cfg_.parallel.emulated_link_gbps, cfg_.parallel.emulated_link_latency_us};
    dp_comm_->link = tp_comm_->link;  // the one link every group's transfers cross
    if (cp_comm_) cp_comm_->link = tp_comm_->link;
    for (Comm* stages : channels.groups()) stages->link = tp_comm_->link;
    if constexpr (!Comm::runs_in_enqueue_order) {
        MPI_Comm gathers;  // the all-gathers start in an order of their own (parallel/dp_reduction.h)
        MPI_Comm_dup(*grid_.replica_group.mpi(), &gathers);
        dp_gather_comm_ = Backend::make_group(gathers);
        dp_gather_comm_->link = tp_comm_->link;
    }
    if (!cfg_.logging.trace.empty()) {
        tracer_.enable(size_t(200000));
        tracer_.fence = Backend::synchronize;  // on a GPU the spans then time the kernels, not their launches
        tp_comm_->tracer = &tracer_;
        if (cp_comm_) cp_comm_->tracer = &tracer_;  // on the TP row: both are the model's own transfers
        for (Comm* stages : channels.groups()) stages->tracer = &tracer_;
        for (Comm* dp : {dp_comm_.get(), dp_gather_comm_.get()})
            if (dp) {
                dp->tracer = &tracer_;
                dp->track = Track::data_parallel;  // a row of its own
            }
    }
    const TensorParallelism tp{grid_.tp, grid_.tp_rank, cfg_.parallel.sequence_parallel, cfg_.overlap()};
    RunShape rank_shape = shape_;  // under CP the model holds s/cp positions of each sequence (§9)
    rank_shape.seq_len = shape_.seq_len / grid_.cp;
    const PipelineShape pipeline{grid_.pp, cfg_.parallel.vpp, cfg_.train.grad_accum, gpt_.num_layers};
    model_ = std::make_unique<GPTModel<Backend>>(gpt_, rank_shape, tp, tp_comm_.get(), cp_comm_.get(),
                                                 cfg_.parallel.cp_comm_type == "p2p",
                                                 grid_.pp > 1 ? pipeline_part(pipeline, grid_.pp_rank) : ModelPart{});
    if (grid_.pp > 1) {
        pipeline_ = std::make_unique<PipelineStep<Backend>>(*model_, std::move(channels), pipeline, grid_.pp_rank);
        if (tracer_.enabled()) pipeline_->tracer = &tracer_;
    }
    const Config::Parallel& parallel = cfg_.parallel;
    data_parallel_ = std::make_unique<DataParallelStep<Backend>>(
        *model_, *dp_comm_, dp_gather_comm_ ? *dp_gather_comm_ : *dp_comm_, *tp_comm_,
        DataParallelSettings{parallel.bucket_size, parallel.distributed_optimizer, parallel.overlap_grad_reduce,
                             parallel.overlap_param_gather});
    const Config::Train& t = cfg_.train;
    optimizer_ = std::make_unique<AdamWOptimizer<Backend>>(
        *model_, AdamWSettings{t.beta1, t.beta2, t.eps, t.weight_decay, t.decay_all},
        data_parallel_->optimizer_shards(), grid_.replica_rank);
    if (!cfg_.checkpoint.dir.empty() || cfg_.logging.sample_every > 0)
        gatherer_ = std::make_unique<ShardGatherer<Backend>>(*model_, grid_, trainer_detail::stage_parts(pipeline));
    if (cfg_.logging.sample_every > 0) {
        if (gpt_.vocab_size == 256)
            for (int b = 0; b < 256; b++) token_text_.push_back(std::string(1, char(b)));
        else token_text_ = read_llmc_tokenizer(cfg_.data.tokenizer).token_bytes;
        sampler_ = std::make_unique<Generator>(gpt_, gatherer_->full());
    }
    restore();
    if (grid_.world_rank == 0) claim_outputs();
}

// Every rank reads the same files: its shards, and the run or checkpoint it
// starts from (trainer_detail::check_same_inputs).
template <class Backend>
void Trainer<Backend>::check_same_inputs_on_every_rank() const {
    using trainer_detail::input_line;
    std::string lines = trainer_detail::shard_lines(train_loader_.get()) +
                        trainer_detail::shard_lines(val_loader_.get());
    if (!hellaswag_.empty()) lines += hellaswag_input_lines(cfg_.data.hellaswag, gpt_.vocab_size, cfg_.data.bpe_dir);
    const Config::Checkpoint& ck = cfg_.checkpoint;
    if (!ck.resume.empty()) {
        const int step = latest_step(ck.resume);
        lines += ck.resume + "/latest: step " + std::to_string(step) + "\n";
        const std::string model = step_file(ck.resume, "model", step), state = step_file(ck.resume, "state", step);
        if (step >= 0) lines += input_line(model, [&] { return llmc_file_identity(model); });
        if (step >= 0) lines += input_line(state, [&] { return state_file_identity(state); });
    } else if (!ck.init.empty()) {
        lines += input_line(ck.init, [&] { return llmc_file_identity(ck.init); });
    }
    trainer_detail::check_same_inputs(lines);
}

template <class Backend>
void Trainer<Backend>::restore() {
    if (!cfg_.checkpoint.resume.empty()) {
        const int saved = latest_step(cfg_.checkpoint.resume);
        if (saved >= cfg_.train.steps)
            throw ConfigError("train.steps: " + std::to_string(cfg_.train.steps) + " is not above step " +
                              std::to_string(saved) + ", where " + cfg_.checkpoint.resume +
                              " was saved: nothing to train (raise train.steps)");
        const ResumedRun resumed = load_run(cfg_.checkpoint.resume, *model_, *optimizer_);
        check_same_data_shape(resumed.data);
        start_step_ = resumed.step;
        train_loader_->seek(resumed.data.batches_read);
    } else if (!cfg_.checkpoint.init.empty()) {
        load_weights(*model_, cfg_.checkpoint.init);
    } else {
        model_->init_random(cfg_.train.seed);
    }
}

template <class Backend>
DataPosition Trainer<Backend>::data_position() const {
    return {train_loader_->position(), shape_.batch, shape_.seq_len, grid_.dp};
}

// A resumed run reads on from the token where the saved run stopped only if
// its micro-batches cover the saved run's tokens: batch k of DP rank r starts
// at token (k·dp + r)·b·s, so another s, or another dp·b (the sequences of
// one micro-batch over the DP ranks), gives the saved position another
// meaning (tokens skipped or trained twice) and is refused. Another dp with
// the same dp·b reads the same tokens, and draws the same dropout masks
// (each sequence's are keyed by its index in the step: DropoutStep, model/gpt.h).
template <class Backend>
void Trainer<Backend>::check_same_data_shape(const DataPosition& saved) const {
    const DataPosition now = data_position();
    const std::string& dir = cfg_.checkpoint.resume;
    if (saved.seq_len != now.seq_len)
        throw ConfigError("train.seq_len: " + std::to_string(now.seq_len) + ", but the run in " + dir +
                          " was saved at " + std::to_string(saved.seq_len) +
                          ": its data position would then skip or repeat tokens; resume with " +
                          std::to_string(saved.seq_len));
    const int64_t saved_sequences = saved.batch_size * saved.dp, sequences = now.batch_size * now.dp;
    if (saved_sequences != sequences)
        throw ConfigError("train.batch_size: " + std::to_string(now.batch_size) + ", but the run in " + dir +
                          " was saved at " + std::to_string(saved.batch_size) + " on " + std::to_string(saved.dp) +
                          " data-parallel rank(s): its data position would then skip or repeat tokens; resume with "
                          "train.batch_size × dp = " +
                          std::to_string(saved_sequences) + " (here dp = " + std::to_string(now.dp) +
                          "; train.grad_accum may change)");
}

// Every file the run will write is proven writable before step 1, and the
// checkpoint directory becomes this run's (locked, checked, cleaned): a
// mistake here costs nothing, after a week of training it would cost the week.
template <class Backend>
void Trainer<Backend>::claim_outputs() {
    check_files_apart();
    if (!cfg_.logging.metrics.empty()) check_writable_file(cfg_.logging.metrics, "metrics");
    if (!cfg_.logging.trace.empty()) {
        check_writable_file(cfg_.logging.trace, "trace");
        if (!Tracer::replaceable(cfg_.logging.trace))
            throw ConfigError("logging.trace: " + cfg_.logging.trace +
                              " holds something other than a tpsp trace: choose another file");
        tracer_.reserve_file(cfg_.logging.trace, grid_.world_size);  // its room, before step 1
    }
    if (!cfg_.checkpoint.dir.empty())
        run_dir_.claim(cfg_.checkpoint.dir, cfg_.checkpoint.resume, cfg_.checkpoint.overwrite);
    using Start = MetricsFile::Start;
    if (!cfg_.logging.metrics.empty())
        metrics_.open(cfg_.logging.metrics,
                      start_step_ > 0             ? Start::resume
                      : cfg_.checkpoint.overwrite ? Start::overwrite
                                                  : Start::new_run,
                      start_step_);
}

// What the run reads and what it writes, compared before anything is
// written (docs/design.md §7): no output may be an input or another output,
// and no input or other output may be a file that the checkpoint directory
// manages (latest, lock, model_N.bin, state_N.bin), which saves replace and
// checkpoint.overwrite and checkpoint.keep_last remove.
template <class Backend>
void Trainer<Backend>::check_files_apart() const {
    const Config::Checkpoint& ck = cfg_.checkpoint;
    std::vector<NamedFile> inputs, outputs;
    if (!cfg_.file.empty()) inputs.push_back({cfg_.file, "the config"});
    for (const std::string& shard : train_loader_->shard_paths()) inputs.push_back({shard, "data.train"});
    // the validation shards are the user's data even when this run does not read them (val_every 0)
    for (const std::string& shard :
         val_loader_ ? val_loader_->shard_paths() : trainer_detail::shards_if_any(cfg_.data.val))
        inputs.push_back({shard, "data.val"});
    if (!ck.init.empty()) inputs.push_back({ck.init, "checkpoint.init"});
    if (sampler_ && !cfg_.data.tokenizer.empty()) inputs.push_back({cfg_.data.tokenizer, "data.tokenizer"});
    if (start_step_ > 0)
        for (const std::string& file : {ck.resume + "/latest", step_file(ck.resume, "model", start_step_),
                                        step_file(ck.resume, "state", start_step_)})
            inputs.push_back({file, "checkpoint.resume"});
    if (!cfg_.logging.metrics.empty()) outputs.push_back({cfg_.logging.metrics, "logging.metrics"});
    if (!cfg_.logging.trace.empty()) outputs.push_back({cfg_.logging.trace, "logging.trace"});
    check_outputs_apart(inputs, outputs);
    if (ck.dir.empty()) return;
    for (const NamedFile& out : outputs)
        if (is_run_file(ck.dir, out.path))
            throw ConfigError(out.named_by + ": " + out.path + " is one of the files the run in checkpoint.dir (" +
                              ck.dir + ") writes: choose another name");
    const bool resumes_here = start_step_ > 0 && same_file(ck.resume, ck.dir);
    for (const NamedFile& in : inputs)
        if (is_run_file(ck.dir, in.path) && !(resumes_here && in.named_by == "checkpoint.resume"))
            throw ConfigError(in.named_by + ": " + in.path + " lies among the files that the run in checkpoint.dir (" +
                              ck.dir + ") writes and removes: move it out, or choose another checkpoint.dir");
}

// "pp 2 (1F1B) × ", "pp 2 (interleaved, vpp 2) × ", or nothing without a pipeline
template <class Backend>
std::string Trainer<Backend>::pipeline_text() const {
    if (grid_.pp == 1) return "";
    const std::string schedule = cfg_.parallel.vpp > 1 ? "interleaved 1F1B, vpp " + std::to_string(cfg_.parallel.vpp)
                                                       : std::string("1F1B");
    std::string text = "pp ";
    text += std::to_string(grid_.pp);
    text += " (" + schedule;
    text += ") × ";
    return text;
}

template <class Backend>
void Trainer<Backend>::print_header() const {
    if (grid_.world_rank != 0) return;
    if (start_step_ > 0) std::printf("resumed %s at step %d\n", cfg_.checkpoint.resume.c_str(), start_step_);
    else if (!cfg_.checkpoint.init.empty()) std::printf("initialised from %s\n", cfg_.checkpoint.init.c_str());
    const GPTConfig& g = gpt_;
    std::printf(
        "model: L=%d a=%d h=%d V=%d (Vp %d) | %.2fM parameters | b=%d s=%d accum=%d | "
        "ranks %d = %sdp %d × %stp %d%s%s | %s, %d threads per rank | %s %.1f GFLOP/s\n",
        g.num_layers, g.num_heads, g.channels, g.vocab_size, g.padded_vocab_size, full_parameter_count(g) / 1e6,
        shape_.batch, shape_.seq_len, cfg_.train.grad_accum, grid_.world_size, pipeline_text().c_str(), grid_.dp,
        grid_.cp > 1 ? ("cp " + std::to_string(grid_.cp) + " (" + cfg_.parallel.cp_comm_type + ") × ").c_str() : "",
        grid_.tp, grid_.tp > 1 ? (cfg_.parallel.sequence_parallel ? " (TP+SP)" : " (TP only)") : "",
        optimizer_->sharded() ? " (distributed optimizer)"
        : grid_.dp > 1        ? " (plain DP)"
                              : "",
        Backend::name, omp_get_max_threads(), Backend::peak_flops_name(), peak_flops_ / 1e9);
    std::printf("kernels: %s\n", Backend::kernels().c_str());
    std::printf("data: %zu train shard(s), %lld batches per epoch\n", train_loader_->num_shards(),
                (long long)train_loader_->batches_per_epoch());
    const OverlapSettings o = cfg_.overlap();
    if (cfg_.parallel.tp_comm_overlap)
        std::printf("overlap: ag %s | rs %s (%s, %d splits) | bulk dgrad %s | bulk wgrad %s | rs dgrad %s%s\n",
                    o.ag ? "on" : "off", o.rs ? "on" : "off", o.rs_pipeline ? "pipeline" : "ring", o.num_splits,
                    o.bulk_dgrad ? "on" : "off", o.bulk_wgrad ? "on" : "off", o.rs_dgrad ? "on" : "off",
                    o.rs_dgrad && (cfg_.parallel.tp_comm_bulk_dgrad || cfg_.parallel.tp_comm_bulk_wgrad)
                        ? " (tp_comm_overlap_rs_dgrad turns the bulk switches off)"
                        : "");
    if (tp_comm_->link.on())
        std::printf("emulated link: %g Gbit/s, %g µs per message (a measuring aid: transfers are held back)\n",
                    tp_comm_->link.gbps, tp_comm_->link.latency_us);
    std::fflush(stdout);
}

// Each step's outcome is agreed by every rank (train_step), and every error
// after it (a metrics, checkpoint or trace file that cannot be written) ends
// every rank together, with one line from the lowest failing rank.
template <class Backend>
int Trainer<Backend>::run() {
    defer_stop_signals();  // from step 1 on, SIGTERM and SIGINT stop after a saved step
    for (int step = start_step_; step < cfg_.train.steps; step++) {
        if (step - start_step_ == cfg_.logging.trace_steps) tracer_.disable();
        if (const int code = read_step_batches(step); code >= 0) return code;
        StepMetrics m = train_step(step);
        if (diverged_) return stop_diverged(m);
        const int done = step + 1;
        const bool last = done == cfg_.train.steps;
        const bool stopping = stop_signal_ != 0 && !last;
        if (val_loader_ && (done % cfg_.train.val_every == 0 || last)) m.val_loss = validation_loss();
        if (!hellaswag_.empty() && (done % cfg_.train.hellaswag_every == 0 || last)) score_hellaswag(m);
        if (!trainer_detail::on_every_rank([&] { log(m, last); })) return 1;
        if (cfg_.logging.sample_every > 0 && (done % cfg_.logging.sample_every == 0 || last)) sample(done);
        const bool save_due = last || stopping || (cfg_.checkpoint.every > 0 && done % cfg_.checkpoint.every == 0);
        if (!cfg_.checkpoint.dir.empty() && save_due && !trainer_detail::on_every_rank([&] { save(done); })) return 1;
        if (stopping) return stop_on_signal(done);
    }
    data_parallel_->parameters_ready();  // no request left pending at MPI_Finalize
    return trainer_detail::on_every_rank([&] { write_trace(); }) ? 0 : 1;
}

// The step's micro-batches [accum, b, s], read before it starts; returns -1
// to go on. A shard that turns out bad here (a CRC or a token out of range,
// met when the loader first opens it) ends the run, but not before the last
// applied step is saved, as after SIGTERM: the error costs no training.
template <class Backend>
int Trainer<Backend>::read_step_batches(int step) {
    const int64_t position = train_loader_->position();
    std::string error;
    const int failed = trainer_detail::first_failing_rank(
        [&] {
            const size_t batch = size_t(shape_.batch) * shape_.seq_len;
            for (int micro = 0; micro < cfg_.train.grad_accum; micro++)
                train_loader_->next_batch(inputs_.data() + micro * batch, targets_.data() + micro * batch);
        },
        error);
    if (failed == grid_.world_size) return -1;
    data_parallel_->parameters_ready();
    train_loader_->seek(position);  // the saved position is that of the step not taken
    std::string saved;
    const bool worth_saving = !cfg_.checkpoint.dir.empty() && step > start_step_;
    std::string save_error;
    const int save_failed = worth_saving ? trainer_detail::first_failing_rank([&] { save(step); }, save_error)
                                         : grid_.world_size;
    if (worth_saving && save_failed == grid_.world_size)
        saved = "; step " + std::to_string(step) + " is saved: continue with checkpoint.resume=" + cfg_.checkpoint.dir +
                " once the shard is fixed";
    if (grid_.world_rank == failed) trainer_detail::say_error(error + saved);
    if (save_failed < grid_.world_size && grid_.world_rank == save_failed) trainer_detail::say_error(save_error);
    return 1;
}

// A step whose loss or gradient norm was not finite was not applied
// (train_step) and is not saved: the weights and the checkpoints stay those of
// the step before. The metrics record it (null for nan), and the run stops.
template <class Backend>
int Trainer<Backend>::stop_diverged(const StepMetrics& m) {
    if (!trainer_detail::on_every_rank([&] { log(m, true); })) return 1;
    auto text = [](double x) {
        char number[32];
        std::snprintf(number, sizeof number, "%g", x);
        return std::string(std::isnan(x) ? "nan" : number);  // not "-nan"
    };
    if (grid_.world_rank == 0)
        std::fprintf(stderr,
                     "tpsp: error: step %d: the loss is %s and the gradient norm %s: the step was not applied and "
                     "is not saved (train.lr too high?)\n",
                     m.step, text(m.loss).c_str(), text(m.grad_norm).c_str());
    return 1;
}

// After SIGTERM or SIGINT: the step is done and saved (run), the trace written.
template <class Backend>
int Trainer<Backend>::stop_on_signal(int done) {
    data_parallel_->parameters_ready();
    if (!trainer_detail::on_every_rank([&] { write_trace(); })) return 1;
    if (grid_.world_rank == 0) {
        const std::string saved = cfg_.checkpoint.dir.empty()
                                      ? "nothing saved (no checkpoint.dir)"
                                      : "saved; continue with checkpoint.resume=" + cfg_.checkpoint.dir;
        std::fprintf(stderr, "tpsp: stopped by %s after step %d: %s\n", trainer_detail::stop_signal_name(stop_signal_),
                     done, saved.c_str());
    }
    return 128 + stop_signal_;
}

// One optimizer step over train.grad_accum micro-batches of every DP rank:
// gradients summed over the TP group (replicated tensors) and the DP group,
// the global norm clipped, then AdamW.
template <class Backend>
StepMetrics Trainer<Backend>::train_step(int step) {
    GPTModel<Backend>& model = *model_;
    const auto start = std::chrono::steady_clock::now();
    model.zero_grad();
    tp_comm_->bytes = {};
    tp_comm_->time = {};
    for (Comm* group : {dp_comm_.get(), dp_gather_comm_.get(), cp_comm_.get()})
        if (group) group->bytes = {}, group->time = {};
    if (pipeline_)
        for (Comm* stages : pipeline_->channel_groups()) stages->bytes = {}, stages->time = {};
    const float dloss = 1.0f / float(tokens_per_step_);
    double loss = 0.0;
    auto draw = [&](int micro) {
        return DropoutStep{cfg_.train.seed, uint32_t(step), (int64_t(micro) * grid_.dp + grid_.dp_rank) * shape_.batch};
    };
    if (pipeline_) {
        loss = pipeline_->run(inputs_.data(), targets_.data(), size_t(shape_.batch) * shape_.seq_len, draw, dloss,
                              data_parallel_.get());
        exchange_embedding_grads();
    }
    for (int micro = 0; micro < (pipeline_ ? 0 : cfg_.train.grad_accum); micro++) {
        const size_t at = size_t(micro) * shape_.batch * shape_.seq_len;  // read_step_batches put it there
        const int* inputs = inputs_.data() + at;
        const int* targets = targets_.data() + at;
        loss += micro == 0 ? data_parallel_->first_forward(inputs, targets, draw(micro))
                           : model.forward(inputs, targets, draw(micro));
        if (micro + 1 == cfg_.train.grad_accum) data_parallel_->last_backward(dloss);
        else model.backward(dloss);
    }
    model.finish_grads();
    data_parallel_->reduce_grads();
    dp_comm_->all_reduce_sum(&loss, 1);                            // each CP rank's loss is already its replica's
    if (grid_.pp > 1) grid_.stage_group.all_reduce_sum(&loss, 1);  // the last stage's, to every stage
    loss /= double(cfg_.train.grad_accum) * grid_.replicas;
    const float norm = data_parallel_->grad_norm(grid_.pp > 1 ? &grid_.stage_group : nullptr);
    // every rank decides alike: a non-finite step is not applied; a caught signal stops the run after this step
    int verdict[2] = {std::isfinite(loss) && std::isfinite(norm) ? 0 : 1, stop_signal_caught()};
    all_reduce_ints(verdict, 2, MPI_MAX, MPI_COMM_WORLD, "agreement on the step");
    diverged_ = verdict[0] != 0;
    stop_signal_ = verdict[1];
    const float clip = cfg_.train.grad_clip > 0 && norm > cfg_.train.grad_clip ? cfg_.train.grad_clip / norm : 1.0f;
    const float lr = schedule_.at(step);
    if (!diverged_) optimizer_->update(model, lr, clip, step + 1);
    if (!diverged_) data_parallel_->gather_updated_parameters();
    Backend::synchronize();
    const double seconds = trainer_detail::seconds_since(start);
    tracer_.record("step", Track::compute, now_seconds() - seconds, now_seconds());

    StepMetrics m;
    m.step = step + 1;
    m.loss = loss;
    m.lr = lr;
    m.grad_norm = norm;
    m.seconds = seconds;
    m.tokens_per_second = tokens_per_step_ / seconds;
    m.mfu = flops_per_step_ / seconds / peak_flops_;
    m.bytes = tp_comm_->bytes;
    m.comm = tp_comm_->time;
    m.dp_bytes = dp_comm_->bytes;
    m.dp_comm = dp_comm_->time;
    if (cp_comm_) m.cp_bytes = cp_comm_->bytes, m.cp_comm = cp_comm_->time;
    if (pipeline_) {
        for (Comm* stages : pipeline_->channel_groups()) {
            m.pp_bytes.pipeline += stages->bytes.pipeline;
            m.pp_comm.total += stages->time.total;
            m.pp_comm.exposed += stages->time.exposed;
        }
        // on a GPU the host runs ahead of the streams: its clock says nothing of the bubble
        if constexpr (!Comm::runs_in_enqueue_order)
            m.pp_bubble = 1.0 - pipeline_->busy_seconds() / pipeline_->seconds();
        const double p = grid_.pp, slots = double(cfg_.train.grad_accum) * cfg_.parallel.vpp;
        m.pp_bubble_theory = (p - 1.0) / (slots + p - 1.0);
    }
    if (dp_gather_comm_) {
        m.dp_bytes.all_gather += dp_gather_comm_->bytes.all_gather;
        m.dp_comm.total += dp_gather_comm_->time.total;
        m.dp_comm.exposed += dp_gather_comm_->time.exposed;
    }
    return m;
}

// The tied wte's two gradient sums (GPTModel::add_embedding_grad) meet: the
// first stage holds the embedding lookup's, the last the LM head's; each
// sends its own and takes the other's, so that both add the same two.
template <class Backend>
void Trainer<Backend>::exchange_embedding_grads() {
    GPTModel<Backend>& model = *model_;
    if (!model.part.holds_wte()) return;
    const size_t count = model.embedding_grad_arena.bytes() / sizeof(float);
    const bool first = model.part.embeddings;
    // the first stage's grads.wte has no LM head share (zero): the head's arrives there
    float* own = first ? model.embedding_grad : model.grads.wte;
    float* theirs = first ? model.grads.wte : model.embedding_grad;
    pipeline_->exchange_tied_embedding_grads(own, theirs, count);
}

template <class Backend>
float Trainer<Backend>::validation_loss() {
    data_parallel_->parameters_ready();
    return trainer_detail::validation_loss(*model_, *val_loader_, grid_, cfg_.train.val_batches, inputs_.data(),
                                           targets_.data(), pipeline_.get());
}

template <class Backend>
void Trainer<Backend>::score_hellaswag(StepMetrics& m) {
    data_parallel_->parameters_ready();
    const HellaSwagScore score = tpsp::score_hellaswag(*model_, hellaswag_, grid_.dp_rank, grid_.dp, grid_.dp_group,
                                                       pipeline_.get(), grid_.pp > 1 ? &grid_.stage_group : nullptr);
    m.hellaswag_acc_norm = float(score.correct_by_mean) / float(score.examples);
    m.hellaswag_acc = float(score.correct_by_sum) / float(score.examples);
}

// The step line every logging.every steps (and at the end, and with a
// validation loss), and the metrics file at every step.
template <class Backend>
void Trainer<Backend>::log(const StepMetrics& m, bool last) {
    if (grid_.world_rank != 0) return;
    const bool has_val = !std::isnan(m.val_loss), has_hellaswag = !std::isnan(m.hellaswag_acc_norm);
    if (m.step % cfg_.logging.every == 0 || last || has_val || has_hellaswag) {
        std::printf("step %5d/%d | loss %.6f | lr %.3e | grad norm %.4f | %7.1f ms | %8.0f tok/s | MFU %5.1f%%", m.step,
                    cfg_.train.steps, m.loss, m.lr, m.grad_norm, m.seconds * 1e3, m.tokens_per_second, 100.0 * m.mfu);
        if (grid_.tp > 1)
            std::printf(" | AG %.1f RS %.1f AR %.1f MB | comm %.1f ms, exposed %.1f ms", m.bytes.all_gather / 1e6,
                        m.bytes.reduce_scatter / 1e6, m.bytes.all_reduce / 1e6, m.comm.total * 1e3,
                        m.comm.exposed * 1e3);
        if (grid_.cp > 1)
            std::printf(" | CP %s %.1f MB | CP comm %.1f ms, exposed %.1f ms", model_->cp.ring ? "P2P" : "A2A",
                        (m.cp_bytes.all_to_all + m.cp_bytes.ring) / 1e6, m.cp_comm.total * 1e3,
                        m.cp_comm.exposed * 1e3);
        if (grid_.pp > 1) {
            std::printf(" | PP %.1f MB | PP comm %.1f ms, exposed %.1f ms | bubble ", m.pp_bytes.pipeline / 1e6,
                        m.pp_comm.total * 1e3, m.pp_comm.exposed * 1e3);
            if (!std::isnan(m.pp_bubble)) std::printf("%.1f%% ", 100.0 * m.pp_bubble);  // not measured on a GPU
            std::printf("(theory %.1f%%)", 100.0 * m.pp_bubble_theory);
        }
        if (grid_.replicas > 1)
            std::printf(" | DP RS %.1f AG %.1f MB | DP comm %.1f ms, exposed %.1f ms", m.dp_bytes.reduce_scatter / 1e6,
                        m.dp_bytes.all_gather / 1e6, m.dp_comm.total * 1e3, m.dp_comm.exposed * 1e3);
        if (has_val) std::printf(" | val loss %.4f", m.val_loss);
        if (has_hellaswag) std::printf(" | hellaswag %.4f (acc %.4f)", m.hellaswag_acc_norm, m.hellaswag_acc);
        std::printf("\n");
        std::fflush(stdout);
    }
    if (metrics_.is_open()) metrics_.write(m);
}

template <class Backend>
void Trainer<Backend>::sample(int done) {
    data_parallel_->parameters_ready();
    if (grid_.replica_rank != 0) return;
    gatherer_->gather(model_->params.wte);  // the whole model, into the sampler's weights on rank 0
    if (grid_.world_rank != 0) return;
    std::printf("sample at step %d: ", done);
    generate(*sampler_, gpt_, sample_prompt_, cfg_.logging.sample_tokens, 1.0f, 0, cfg_.train.seed + uint64_t(done),
             [&](int t) { std::fputs(size_t(t) < token_text_.size() ? token_text_[size_t(t)].c_str() : "?", stdout); });
    std::printf("\n");
    std::fflush(stdout);
}

template <class Backend>
void Trainer<Backend>::save(int done) {
    data_parallel_->parameters_ready();
    save_run(cfg_.checkpoint.dir, *model_, *optimizer_, grid_, *gatherer_, done, data_position(), *dp_comm_);
    if (grid_.world_rank != 0) return;
    run_dir_.prune(cfg_.checkpoint.keep_last);
    std::printf("saved %s\n", step_file(cfg_.checkpoint.dir, "model", done).c_str());
}

template <class Backend>
void Trainer<Backend>::write_trace() {
    if (cfg_.logging.trace.empty()) return;
    tracer_.disable();
    MPI_Comm world = MPI_COMM_WORLD;
    tracer_.write(cfg_.logging.trace, grid_.world_rank, &world);  // throws on rank 0 if it could not
    if (grid_.world_rank == 0)
        std::printf("wrote %s (a Chrome trace: open it in Perfetto)\n", cfg_.logging.trace.c_str());
}

}  // namespace tpsp
