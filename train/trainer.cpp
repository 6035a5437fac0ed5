#include "train/trainer.h"

#include <cstdlib>

#include "train/trainer_impl.h"

namespace tpsp {

int trainer_detail::local_rank() {
    // what the launchers say: Open MPI, MPICH / Intel MPI, Slurm, torchrun-style
    for (const char* name : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID", "LOCAL_RANK"})
        if (const char* value = std::getenv(name)) return std::atoi(value);
    return 0;
}

template class Trainer<CpuBackend>;

int evaluate(const Config& cfg) {
    if (cfg.train.threads > 0) omp_set_num_threads(cfg.train.threads);
    set_peer_timeout(cfg.parallel.timeout_s);
    if (cfg.checkpoint.init.empty()) throw ConfigError("tpsp eval: checkpoint.init: give the checkpoint to evaluate");
    if (cfg.data.val.empty()) throw ConfigError("tpsp eval: data.val: give the validation shards");
    if (cfg.parallel.tp != 1)
        throw ConfigError(
            "tpsp eval: parallel.tp: evaluation runs at t = 1 (its ranks split the validation batches: data "
            "parallelism)");
    // evaluation runs on the CPU, whose explicit attention computes what cuDNN's does on the same weights
    GPTConfig gc = cfg.gpt();
    gc.attention = AttentionKernel::explicit_scores;
    const RunShape shape = cfg.run_shape();
    // at cp > 1 each sequence is cut across cp ranks (§9): its ranks split the batches over dp = ranks / cp
    const int cp = cfg.parallel.cp;
    int world;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    if (world % cp != 0)
        throw ConfigError("tpsp eval: parallel.cp: " + std::to_string(cp) + " does not divide the " +
                          std::to_string(world) + " ranks launched");
    ProcessGrid grid = make_process_grid(1, cp);
    RunShape rank_shape = shape;
    rank_shape.seq_len = shape.seq_len / cp;
    // every rank opens its data and checkpoint before the first collective: a
    // file missing on one rank is its one line, not the others' wait
    std::unique_ptr<TokenLoader> val_loader;
    std::unique_ptr<GPT> model;
    const bool ready = trainer_detail::on_every_rank([&] {
        val_loader = std::make_unique<TokenLoader>(cfg.data.val, shape.batch, shape.seq_len, grid.dp_rank, grid.dp,
                                                   gc.vocab_size);
        val_loader->check_every_shard();  // a bad one is this rank's line, not a wait in the sum
        check_checkpoint_model(cfg.checkpoint.init, gc);
        model = std::make_unique<GPT>(gc, rank_shape, TensorParallelism{}, nullptr, cp > 1 ? &grid.cp_group : nullptr);
        load_checkpoint(*model, cfg.checkpoint.init);
    });
    if (!ready) return 1;
    // every rank's copy of the shards and the checkpoint the same
    if (!trainer_detail::on_every_rank([&] {
            trainer_detail::check_same_inputs(trainer_detail::shard_lines(val_loader.get()) +
                                              trainer_detail::input_line(cfg.checkpoint.init, [&] {
                                                  return llmc_file_identity(cfg.checkpoint.init);
                                              }));
        }))
        return 1;
    std::vector<int> inputs(size_t(shape.batch) * shape.seq_len), targets(inputs.size());
    float val = trainer_detail::validation_loss(*model, *val_loader, grid, cfg.train.val_batches, inputs.data(),
                                                targets.data());
    if (grid.world_rank == 0)
        std::printf("val loss %.9g over %d batches of %d×%d tokens\n", val, cfg.train.val_batches, shape.batch,
                    shape.seq_len);
    return 0;
}

}  // namespace tpsp
