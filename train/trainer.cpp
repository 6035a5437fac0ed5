#include "train/trainer.h"

#include <cstdlib>

#include "train/hellaswag.h"
#include "train/trainer_impl.h"

namespace tpsp {

int trainer_detail::local_rank() {
    // what the launchers say: Open MPI, MPICH / Intel MPI, Slurm, torchrun-style
    for (const char* name : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID", "LOCAL_RANK"})
        if (const char* value = std::getenv(name)) return std::atoi(value);
    return 0;
}

template class Trainer<CpuBackend>;

// The ranks split the validation batches (or HellaSwag's examples) over dp
// = ranks / (tp · cp); each TP group holds one model, each CP rank s/cp of
// its positions (§9).
int evaluate(const Config& cfg, bool hellaswag) {
    if (cfg.train.threads > 0) omp_set_num_threads(cfg.train.threads);
    set_peer_timeout(cfg.parallel.timeout_s);
    if (cfg.checkpoint.init.empty()) throw ConfigError("tpsp eval: checkpoint.init: give the checkpoint to evaluate");
    if (!hellaswag && cfg.data.val.empty()) throw ConfigError("tpsp eval: data.val: give the validation shards");
    if (hellaswag && cfg.parallel.cp > 1) throw ConfigError("tpsp eval --hellaswag: runs at parallel.cp = 1");
    // evaluation runs on the CPU, whose explicit attention computes what cuDNN's does on the same weights
    GPTConfig gc = cfg.gpt();
    gc.attention = AttentionKernel::explicit_scores;
    const RunShape shape = cfg.run_shape();
    const int tp = cfg.parallel.tp, cp = cfg.parallel.cp, pp = cfg.parallel.pp;
    int world;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    if (world % (tp * cp * pp) != 0)
        throw ConfigError("tpsp eval: parallel.tp · parallel.cp · parallel.pp = " + std::to_string(tp * cp * pp) +
                          " does not divide the " + std::to_string(world) + " ranks launched");
    ProcessGrid grid = make_process_grid(tp, cp, pp);
    // a pipeline's stage holds its blocks; each validation batch passes through the stages
    // (m = pp: a shape every schedule takes; only micro-batch 0's forwards run)
    const PipelineShape pipeline_shape{pp, cfg.parallel.vpp, pp, gc.num_layers};
    std::unique_ptr<PipelineStep<CpuBackend>> pipeline;
    RunShape rank_shape = shape;
    rank_shape.seq_len = shape.seq_len / cp;
    // every rank opens its data and checkpoint before the first collective: a
    // file missing on one rank is its one line, not the others' wait
    std::unique_ptr<TokenLoader> val_loader;
    std::vector<HellaSwagExample> examples;
    std::unique_ptr<GPT> model;
    const bool ready = trainer_detail::on_every_rank([&] {
        if (hellaswag) {
            examples = load_hellaswag(cfg.data.hellaswag, gc.vocab_size, cfg.data.bpe_dir, shape.seq_len);
        } else {
            val_loader = std::make_unique<TokenLoader>(cfg.data.val, shape.batch, shape.seq_len, grid.dp_rank, grid.dp,
                                                       gc.vocab_size);
            val_loader->check_every_shard();  // a bad one is this rank's line, not a wait in the sum
        }
        check_checkpoint_model(cfg.checkpoint.init, gc);
        const TensorParallelism parallelism{grid.tp, grid.tp_rank, cfg.parallel.sequence_parallel, cfg.overlap()};
        model = std::make_unique<GPT>(gc, rank_shape, parallelism, tp > 1 ? &grid.tp_group : nullptr,
                                      cp > 1 ? &grid.cp_group : nullptr, cfg.parallel.cp_comm_type == "p2p",
                                      pp > 1 ? pipeline_part(pipeline_shape, grid.pp_rank) : ModelPart{});
        if (pp > 1)
            pipeline = std::make_unique<PipelineStep<CpuBackend>>(*model, pipeline_channels_over(grid.stage_group),
                                                                  pipeline_shape, grid.pp_rank);
        load_checkpoint(*model, cfg.checkpoint.init);
    });
    if (!ready) return 1;
    // every rank's copy of the inputs the same
    std::string inputs_line = trainer_detail::shard_lines(val_loader.get());
    if (hellaswag) inputs_line += hellaswag_input_lines(cfg.data.hellaswag, gc.vocab_size, cfg.data.bpe_dir);
    inputs_line += trainer_detail::input_line(cfg.checkpoint.init,
                                              [&] { return llmc_file_identity(cfg.checkpoint.init); });
    if (!trainer_detail::on_every_rank([&] { trainer_detail::check_same_inputs(inputs_line); })) return 1;
    if (hellaswag) {
        const HellaSwagScore score = score_hellaswag(*model, examples, grid.dp_rank, grid.dp, grid.dp_group,
                                                     pipeline.get(), pp > 1 ? &grid.stage_group : nullptr);
        if (grid.world_rank == 0) {
            std::printf("%s\n", hellaswag_line(score).c_str());
            if (score.cut > 0)
                std::fprintf(stderr,
                             "tpsp: note: %d of %d examples lost the start of their context to fit train.seq_len = "
                             "%d\n",
                             score.cut, score.examples, shape.seq_len);
        }
        return 0;
    }
    std::vector<int> inputs(size_t(shape.batch) * shape.seq_len), targets(inputs.size());
    float val = trainer_detail::validation_loss(*model, *val_loader, grid, cfg.train.val_batches, inputs.data(),
                                                targets.data(), pipeline.get());
    if (grid.world_rank == 0)
        std::printf("val loss %.9g over %d batches of %d×%d tokens\n", val, cfg.train.val_batches, shape.batch,
                    shape.seq_len);
    return 0;
}

}  // namespace tpsp
