// Faults: what a run trusted with a week of compute meets, each provoked on
// purpose against the tpsp executable on the corpus (docs/design.md §7).
// Every case checks the exit status, the one line that says what happened,
// that the run ended within a bound where it could have hung, and that no
// earlier good file was damaged.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/checksum.h"
#include "tests/e2e_support.h"

namespace fs = std::filesystem;
using namespace tpsp::e2e;

namespace {

// Small steps: a few milliseconds each on one thread.
const std::string fast = "train.batch_size=4 train.seq_len=64 train.val_every=0 train.threads=1 ";

// A command that could hang is given this long before `timeout` ends it (exit 124).
const std::string bounded = "timeout -k 5 60 ";

const std::string mpi_env =
    "env OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_pml=ob1 ";

bool have_mpirun() { return TPSP_BUILT_WITH_MPI && std::system("command -v mpirun > /dev/null 2>&1") == 0; }

// The lines tpsp itself printed on stderr (not mpirun's summary).
std::string tpsp_lines(const std::string& err) {
    std::string own;
    std::istringstream lines(err);
    for (std::string line; std::getline(lines, line);)
        if (line.rfind("tpsp", 0) == 0) own += line + "\n";
    return own;
}

void expect_one_line(const Outcome& r, const std::string& says) {
    EXPECT_EQ(count_lines(tpsp_lines(r.err)), 1) << r.err;
    EXPECT_NE(r.err.find(says), std::string::npos) << "stderr: " << r.err << "expected: " << says;
}

void expect_ended_in_time(const Outcome& r) {
    EXPECT_NE(r.exit_code, 124) << "the run hung until timeout ended it";
    EXPECT_NE(r.exit_code, 137) << "the run hung until timeout killed it";
}

// Every file of a directory with its bytes: what "nothing was damaged" compares.
// Each file's name, size and hash (not its bytes: a failure then prints no checkpoint).
std::map<std::string, std::string> fingerprints(const fs::path& dir);

std::map<std::string, std::string> contents(const fs::path& dir) {
    std::map<std::string, std::string> files;
    for (const fs::directory_entry& entry : fs::directory_iterator(dir))
        if (entry.path().filename() != "lock") files[entry.path().filename().string()] = read_text(entry.path());
    return files;
}

std::map<std::string, std::string> fingerprints(const fs::path& dir) {
    std::map<std::string, std::string> prints;
    for (const auto& [name, bytes] : contents(dir))
        prints[name] = std::to_string(bytes.size()) + " bytes, hash " + std::to_string(std::hash<std::string>{}(bytes));
    return prints;
}

std::vector<std::string> names_in(const fs::path& dir) {
    std::vector<std::string> names;
    for (const fs::directory_entry& entry : fs::directory_iterator(dir)) names.push_back(entry.path().filename());
    std::sort(names.begin(), names.end());
    return names;
}

bool holds_a_temporary(const fs::path& dir) {
    for (const std::string& name : names_in(dir))
        if (name.find(".tpsp-tmp.") != std::string::npos) return true;
    return false;
}

// A float written over element `index` of a file's data after `header` bytes.
void poison(const fs::path& file, int64_t header, int64_t index, float value) {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(header + index * 4);
    f.write(reinterpret_cast<const char*>(&value), 4);
}

// Bit 0 of byte `offset` of a file flipped in place.
void flip_bit(const fs::path& file, int64_t offset) {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    char byte;
    f.seekg(offset);
    f.get(byte);
    f.seekp(offset);
    f.put(char(byte ^ 1));
}

// A model file's header[254..255] set to 0: no checksum recorded, as llm.c writes it.
void drop_checksum(const fs::path& model_file) {
    std::fstream f(model_file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(4 * 254);
    f.write(std::string(8, '\0').data(), 8);
}

// A state file's last 4 bytes set to the CRC-32C of the rest: what a writer
// that saved these bytes (a bug) would have recorded.
void reseal_state(const fs::path& state_file) {
    const std::string bytes = read_text(state_file);
    const uint32_t crc = tpsp::crc32c(bytes.data(), bytes.size() - 4);
    std::fstream f(state_file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(std::streamoff(bytes.size() - 4));
    f.write(reinterpret_cast<const char*>(&crc), 4);
}

// A command running in the background (sh -c "exec COMMAND", so the pid is
// the command's), its stdout and stderr in files of `dir`.
class Background {
public:
    Background(const std::string& command, const fs::path& dir) : out_(dir / "bg_out.txt"), err_(dir / "bg_err.txt") {
        pid_ = fork();
        if (pid_ == 0) {
            const int out = open(out_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
            const int err = open(err_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
            dup2(out, 1);
            dup2(err, 2);
            const std::string exec = "exec " + command;
            execl("/bin/sh", "sh", "-c", exec.c_str(), (char*)nullptr);
            _exit(127);
        }
    }
    ~Background() {
        if (running()) kill(pid_, SIGKILL), wait(5);
    }
    pid_t pid() const { return pid_; }
    bool running() const { return exit_code_ == not_ended; }
    std::string out() const { return read_text(out_); }
    std::string err() const { return read_text(err_); }

    // Whether stdout came to hold `text` within `seconds`, the command still running.
    bool wait_for_output(const std::string& text, double seconds) {
        for (auto start = now(); poll() && since(start) < seconds;
             std::this_thread::sleep_for(std::chrono::milliseconds(50)))
            if (out().find(text) != std::string::npos) return true;
        return false;
    }
    // The exit code, or -1 if the command had not ended within `seconds` (it is then killed).
    int wait(double seconds) {
        for (auto start = now(); poll() && since(start) < seconds;
             std::this_thread::sleep_for(std::chrono::milliseconds(50))) {
        }
        if (!running()) return exit_code_;
        kill(pid_, SIGKILL);
        waitpid(pid_, nullptr, 0);
        exit_code_ = -1;
        return -1;
    }

private:
    static constexpr int not_ended = -1000;
    // Whether the command is still running (it may just have ended).
    bool poll() {
        int status = 0;
        if (running() && waitpid(pid_, &status, WNOHANG) == pid_)
            exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : -2;
        return running();
    }
    static std::chrono::steady_clock::time_point now() { return std::chrono::steady_clock::now(); }
    static double since(std::chrono::steady_clock::time_point start) {
        return std::chrono::duration<double>(now() - start).count();
    }
    fs::path out_, err_;
    pid_t pid_ = -1;
    int exit_code_ = not_ended;
};

}  // namespace

// ----------------------------------------------------------------------------
// preflight: every path the run will write is proven writable before step 1

TEST(Faults, AnUnwritableOutputIsOneLineBeforeAnyTraining) {
    fs::path dir = scratch_dir();
    const fs::path file = write_file(dir / "a_file", "not a directory\n");
    const std::vector<std::pair<std::string, std::string>> cases = {
        {"checkpoint.dir=" + file.string(), "a_file: cannot create the checkpoint directory"},
        {"checkpoint.dir=" + (file / "sub").string(), "a_file/sub: cannot create the checkpoint directory"},
        {"checkpoint.dir=" + (dir / std::string(300, 'x')).string(), "File name too long"},
        {"checkpoint.dir=/proc/tpsp_faults", "/proc/tpsp_faults: cannot create the checkpoint directory"},
        {"logging.metrics=" + (file / "metrics.jsonl").string(), "cannot create the metrics directory"},
        {"logging.metrics=/dev/full", "/dev/full: the metrics file must be a regular file"},
        {"logging.trace=" + (file / "trace.json").string(), "cannot create the trace directory"},
    };
    for (const auto& [setting, says] : cases) {
        SCOPED_TRACE(setting);
        Outcome r = run(bounded + tiny_train(dir, fast + "train.steps=3 " + setting), dir);
        EXPECT_EQ(r.exit_code, 1);
        expect_one_line(r, says);
        EXPECT_EQ(r.out.find("step "), std::string::npos) << "it trained: " << r.out;
        EXPECT_FALSE(fs::exists(dir / "ckpt")) << "a checkpoint directory was made";
        EXPECT_FALSE(fs::exists(dir / "metrics.jsonl")) << "a metrics file was made";
    }
    EXPECT_EQ(read_text(file), "not a directory\n");
}

TEST(Faults, AnUnwritableCheckpointDirectoryUnderMpirunIsOneLineAndEveryRankExits) {
    if (!have_mpirun()) GTEST_SKIP() << "mpirun not installed, or tpsp built without MPI";
    fs::path dir = scratch_dir();
    const fs::path file = write_file(dir / "a_file", "x");
    Outcome r = run(mpi_env + bounded + "mpirun --oversubscribe -np 2 " +
                        tiny_train(dir, fast + "parallel.tp=2 checkpoint.dir=" + (file / "sub").string()),
                    dir);
    EXPECT_NE(r.exit_code, 0);
    expect_ended_in_time(r);
    expect_one_line(r, "tpsp: rank 0: error: " + (file / "sub").string() + ": cannot create the checkpoint directory");
}

// Set-up is collective: every rank parses its own command line and config, and
// the ranks compare outcomes and resolved configs before any goes on. Rank 1
// here runs its own words (a wrapper script): a config missing on its node,
// a per-node typo, another learning rate, another command.
TEST(Faults, AMistakeOnOneRankEndsTheJobWithinSecondsWithOneLineNamingIt) {
    if (!have_mpirun()) GTEST_SKIP() << "mpirun not installed, or tpsp built without MPI";
    fs::path dir = scratch_dir();
    const std::string train = tiny_train(dir, fast + "train.steps=3 parallel.tp=2 checkpoint.dir=");
    const std::vector<std::pair<std::string, std::string>> cases = {
        {tpsp_binary + " train " + (dir / "missing.yaml").string(),
         "tpsp: rank 1: config error: " + (dir / "missing.yaml").string() + ": cannot open config"},
        {train + " train.bogus=1", "tpsp: rank 1: config error: override train.bogus: unknown key train.bogus"},
        {train + " train.lr=0.0123", "tpsp: rank 1: its command or config differs from rank 0's: train.lr=0.0123"},
        {train.substr(0, train.find(" train ")) + " eval " + tiny,
         "tpsp: rank 1: its command or config differs from rank 0's: command=eval"},
        // a one-process command under mpirun: each rank would print it all (prepare's would write one directory)
        {tpsp_binary + " memory " + tiny,
         "tpsp: rank 1: config error: tpsp memory runs in one process, not on 2 ranks"},
    };
    for (const auto& [rank_one_runs, says] : cases) {
        SCOPED_TRACE(rank_one_runs);
        const fs::path wrapper = write_file(
            dir / "per_rank.sh", "#!/bin/sh\nif [ \"$OMPI_COMM_WORLD_RANK\" = 1 ]; then exec " + rank_one_runs +
                                     "; else exec " + train + "; fi\n");
        fs::permissions(wrapper, fs::perms::owner_all);
        const auto start = std::chrono::steady_clock::now();
        Outcome r = run(mpi_env + bounded + "mpirun --oversubscribe -np 2 " + wrapper.string(), dir);
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        EXPECT_NE(r.exit_code, 0);
        expect_ended_in_time(r);
        EXPECT_LT(seconds, 30.0) << "the job waited for its mistaken rank";
        expect_one_line(r, says);
        EXPECT_EQ(r.out.find("step "), std::string::npos) << "it trained: " << r.out;
    }
    Outcome r = run(mpi_env + bounded + "mpirun --oversubscribe -np 2 " + tpsp_binary + " sample none.bin", dir);
    EXPECT_EQ(r.exit_code, 1);
    expect_one_line(r,
                    "tpsp: rank 0: config error: tpsp sample runs in one process, not on 2 ranks: start it "
                    "without mpirun");
}

// ----------------------------------------------------------------------------
// non-finite numbers: never applied, never saved, never loaded

void expect_a_diverging_run_stopped_unsaved(const fs::path& dir, const std::string& launcher, const std::string& grid);

TEST(Faults, ADivergingRunStopsAtTheStepWithoutApplyingOrSavingIt) {
    expect_a_diverging_run_stopped_unsaved(scratch_dir(), "", "");
    if (!have_mpirun()) return;
    SCOPED_TRACE(
        "dp = 2, distributed optimizer, overlap_grad_reduce");  // each rank updates a piece: none may apply the step
    expect_a_diverging_run_stopped_unsaved(
        scratch_dir() / "dp", mpi_env + "mpirun --oversubscribe -np 2 ",
        " parallel.distributed_optimizer=true parallel.overlap_grad_reduce=true parallel.overlap_param_gather=true " +
            fast);
}

void expect_a_diverging_run_stopped_unsaved(const fs::path& dir, const std::string& launcher, const std::string& grid) {
    fs::create_directories(dir);
    Outcome r = run(
        bounded + launcher + tiny_train(dir, "train.lr=1e6 train.steps=30 train.val_every=0 checkpoint.every=1" + grid),
        dir);
    EXPECT_EQ(r.exit_code, 1);
    expect_ended_in_time(r);
    std::smatch m;
    ASSERT_TRUE(std::regex_search(r.err, m,
                                  std::regex("step ([0-9]+): the loss is \\S+ and the gradient norm \\S+: "
                                             "the step was not applied and is not saved")))
        << r.err;
    expect_one_line(r, "tpsp: error: step ");
    const int bad = std::stoi(m[1]);
    ASSERT_GE(bad, 2) << "step 1 of a fresh model is finite";
    EXPECT_EQ(read_text(dir / "ckpt" / "latest"), std::to_string(bad - 1) + "\n") << "latest moved";
    char name[32];
    std::snprintf(name, sizeof name, "model_%08d.bin", bad);
    EXPECT_FALSE(fs::exists(dir / "ckpt" / name)) << "the non-finite step was saved";
    // the metrics are JSON lines (field() parses every one), the last one the bad step with a null
    std::vector<std::string> norms = field(dir / "metrics.jsonl", "grad_norm"),
                             losses = field(dir / "metrics.jsonl", "loss");
    ASSERT_EQ(int(norms.size()), bad);
    EXPECT_TRUE(norms.back() == "null" || losses.back() == "null") << norms.back() << " " << losses.back();
    // the checkpoint latest names loads: its weights are finite
    std::snprintf(name, sizeof name, "model_%08d.bin", bad - 1);
    Outcome eval = run(bounded + tpsp_binary + " eval " + tiny + " data.val='" + corpus +
                           "/val_*.bin' train.val_batches=1 checkpoint.init=" + (dir / "ckpt" / name).string() + grid,
                       dir);
    EXPECT_EQ(eval.exit_code, 0) << eval.err;
}

TEST(Faults, ANonFiniteNumberInALoadedFileIsOneLineNamingTheFileAndTensor) {
    fs::path dir = scratch_dir(), source = dir / "source";
    fs::create_directories(source);
    ASSERT_EQ(run(tiny_train(source, fast + "train.steps=1"), source).exit_code, 0);
    const fs::path good = source / "ckpt" / "model_00000001.bin";
    const fs::path nan_weights = dir / "nan_weights.bin", inf_weights = dir / "inf_weights.bin";
    fs::copy_file(good, nan_weights);
    fs::copy_file(good, inf_weights);
    drop_checksum(nan_weights);  // the finite check is what stands between llm.c's files and the model
    drop_checksum(inf_weights);
    poison(nan_weights, 1024, 0, NAN);
    poison(inf_weights, 1024, int64_t(fs::file_size(good) - 1024) / 4 - 1, INFINITY);  // lnfb's last element
    const std::string nan_says = "nan_weights.bin: tensor wte of the weights holds nan at element 0";
    const std::string val = " data.val='" + corpus + "/val_*.bin' ";

    Outcome r = run(bounded + tiny_train(dir, fast + "train.steps=2 checkpoint.init=" + nan_weights.string()), dir);
    EXPECT_EQ(r.exit_code, 1);
    expect_one_line(r, nan_says);
    r = run(bounded + tiny_train(dir, fast + "train.steps=2 checkpoint.init=" + inf_weights.string()), dir);
    EXPECT_EQ(r.exit_code, 1);
    expect_one_line(r, "inf_weights.bin: tensor lnfb of the weights holds inf at element 127");
    r = run(bounded + tpsp_binary + " eval " + tiny + val + fast + "checkpoint.init=" + nan_weights.string(), dir);
    EXPECT_EQ(r.exit_code, 1);
    expect_one_line(r, nan_says);
    r = run(bounded + tpsp_binary + " sample " + nan_weights.string() + " --tokens 5", dir);
    EXPECT_EQ(r.exit_code, 1);
    expect_one_line(r, nan_says);
    // AdamW's moments, on resume
    const fs::path run_copy = dir / "copy";
    fs::copy(source / "ckpt", run_copy);
    poison(run_copy / "state_00000001.bin", 64, 5, NAN);
    reseal_state(run_copy / "state_00000001.bin");
    r = run(bounded + tiny_train(dir, fast + "train.steps=2 checkpoint.dir=" + run_copy.string() +
                                          " checkpoint.resume=" + run_copy.string()),
            dir);
    EXPECT_EQ(r.exit_code, 1);
    expect_one_line(r, "state_00000001.bin: tensor wte of AdamW's m holds nan at element 5");
    EXPECT_FALSE(fs::exists(dir / "ckpt")) << "a checkpoint directory was made";
    EXPECT_FALSE(fs::exists(dir / "metrics.jsonl")) << "a metrics file was made";
}

// ----------------------------------------------------------------------------
// the run directory: one trainer, no run started over another by mistake

TEST(Faults, ASecondTrainerIsRefusedAndSigtermSavesAndStopsTheFirst) {
    fs::path dir = scratch_dir(), second = dir / "second";
    fs::create_directories(second);
    Background first(tiny_train(dir, fast + "train.steps=1000000 logging.every=1"), dir);
    ASSERT_TRUE(first.wait_for_output("data: ", 60)) << first.err();  // set up: the directory is claimed

    Outcome refused = run(
        bounded + tiny_train(second, fast + "train.steps=3 checkpoint.dir=" + (dir / "ckpt").string()), second);
    EXPECT_EQ(refused.exit_code, 1);
    expect_one_line(refused, "ckpt: another tpsp trainer is running in this checkpoint directory");

    ASSERT_TRUE(first.wait_for_output("step     2/", 60)) << first.err();
    kill(first.pid(), SIGTERM);
    EXPECT_EQ(first.wait(60), 128 + SIGTERM) << first.err();
    std::smatch m;
    const std::string err = first.err();
    ASSERT_TRUE(std::regex_search(err, m,
                                  std::regex("tpsp: stopped by SIGTERM after step ([0-9]+): saved; continue "
                                             "with checkpoint.resume=")))
        << err;
    const int stopped = std::stoi(m[1]);
    EXPECT_EQ(read_text(dir / "ckpt" / "latest"), std::to_string(stopped) + "\n");
    EXPECT_EQ(int(field(dir / "metrics.jsonl", "loss").size()), stopped);

    // and the run goes on from there
    Outcome resumed = run(bounded + tiny_train(dir, fast + "train.steps=" + std::to_string(stopped + 2) +
                                                        " checkpoint.resume=" + (dir / "ckpt").string()),
                          dir);
    EXPECT_EQ(resumed.exit_code, 0) << resumed.err;
    EXPECT_EQ(int(field(dir / "metrics.jsonl", "loss").size()), stopped + 2);
}

TEST(Faults, SigintWithoutACheckpointDirectoryStopsAndSaysNothingWasSaved) {
    fs::path dir = scratch_dir();
    Background job(tiny_train(dir, fast + "train.steps=1000000 logging.every=1 checkpoint.dir="), dir);
    ASSERT_TRUE(job.wait_for_output("step     2/", 60)) << job.err();
    kill(job.pid(), SIGINT);
    EXPECT_EQ(job.wait(60), 128 + SIGINT) << job.err();
    EXPECT_NE(job.err().find("tpsp: stopped by SIGINT after step"), std::string::npos) << job.err();
    EXPECT_NE(job.err().find("nothing saved (no checkpoint.dir)"), std::string::npos) << job.err();
    EXPECT_GE(field(dir / "metrics.jsonl", "loss").size(), 2u);
}

// The tiny model trained on 2 TP ranks under mpirun for as long as it is let
// run, each rank first writing its pid to DIR/pid.sh.RANK, so that a test
// can signal one of them as a scheduler (or a fault) would one node.
static std::string two_ranks_training(const fs::path& dir, const std::string& extra, int ranks = 2) {
    fs::path wrapper = write_file(dir / "pid.sh", "#!/bin/bash\necho $$ > \"$0.$OMPI_COMM_WORLD_RANK\"\nexec \"$@\"\n");
    fs::permissions(wrapper, fs::perms::owner_all);
    return mpi_env + "mpirun --oversubscribe -np " + std::to_string(ranks) + " " + wrapper.string() + " " +
           tiny_train(dir, fast + "parallel.tp=2 train.steps=1000000 logging.every=1 " + extra);
}

static int pid_of_rank(const fs::path& dir, int rank) {
    return std::stoi(read_text(dir / ("pid.sh." + std::to_string(rank))));
}

int stop_one_rank_with_sigterm(const fs::path& dir, const std::string& grid);

TEST(Faults, SigtermToOneRankStopsAndSavesOnEveryRank) {
    if (!have_mpirun()) GTEST_SKIP() << "mpirun not installed, or tpsp built without MPI";
    for (const std::string grid :
         {"", " parallel.tp=1 parallel.distributed_optimizer=true parallel.overlap_param_gather=true"}) {
        SCOPED_TRACE(grid.empty() ? "t = 2" : "dp = 2, distributed optimizer");
        fs::path dir = scratch_dir();
        const int saved = stop_one_rank_with_sigterm(dir, grid);
        if (saved < 1) continue;
        // what was saved resumes: the DP ranks' pieces of AdamW's state were gathered into it
        Outcome resumed = run(
            bounded + mpi_env + "mpirun --oversubscribe -np 2 " +
                tiny_train(dir, fast + "parallel.tp=2" + grid + " train.steps=" + std::to_string(saved + 1) +
                                    " checkpoint.resume=" + (dir / "ckpt").string()),
            dir);
        EXPECT_EQ(resumed.exit_code, 0) << resumed.err;
    }
}

// Rank 1 of a running job gets SIGTERM: every rank stops after the step and it
// is saved. Returns the saved step (0 on a failure already reported).
int stop_one_rank_with_sigterm(const fs::path& dir, const std::string& grid) {
    Background job(two_ranks_training(dir, grid), dir);
    if (!job.wait_for_output("step     2/", 60)) {
        ADD_FAILURE() << job.err();
        return 0;
    }
    const int rank_1 = pid_of_rank(dir, 1);
    kill(rank_1, SIGTERM);
    EXPECT_EQ(job.wait(60), 128 + SIGTERM) << job.err();
    std::smatch m;
    const std::string err = job.err();
    if (!std::regex_search(err, m, std::regex("tpsp: stopped by SIGTERM after step ([0-9]+): saved"))) {
        ADD_FAILURE() << err;
        return 0;
    }
    EXPECT_EQ(read_text(dir / "ckpt" / "latest"), std::string(m[1]) + "\n");
    EXPECT_FALSE(holds_a_temporary(dir / "ckpt"));
    return std::stoi(m[1]);
}

void expect_a_stopped_rank_named(const fs::path& dir, const std::string& grid, int ranks = 2, int stopped = 1);

TEST(Faults, AStoppedRankEndsTheJobAfterParallelTimeoutInsteadOfHangingIt) {
    if (!have_mpirun()) GTEST_SKIP() << "mpirun not installed, or tpsp built without MPI";
    for (const std::string grid : {"",
                                   " parallel.tp=1 parallel.distributed_optimizer=true "
                                   "parallel.overlap_grad_reduce=true parallel.overlap_param_gather=true",
                                   " parallel.tp=1 parallel.cp=2", " parallel.tp=1 parallel.pp=2"}) {
        SCOPED_TRACE(grid.empty()                             ? "t = 2"
                     : grid.find("cp=2") != std::string::npos ? "cp = 2, the all-to-alls among the collectives"
                     : grid.find("pp=2") != std::string::npos ? "pp = 2, a stage waiting for the other's boundary"
                                                              : "dp = 2, distributed optimizer, overlap_grad_reduce");
        expect_a_stopped_rank_named(scratch_dir() / std::to_string(grid.size()), grid);
    }
    // three survivors, each timing out in another wait: still one line
    SCOPED_TRACE("4 ranks: t = 2, dp = 2");
    expect_a_stopped_rank_named(scratch_dir() / "four", "", 4, 3);
    // rank 0 stopped: rank 1 names it, and rank 0, woken by mpirun's SIGCONT as it ends the job, blames no one
    SCOPED_TRACE("rank 0 stopped");
    expect_a_stopped_rank_named(scratch_dir() / "first", "", 2, 0);
}

// Rank `stopped` of a running job stopped (SIGSTOP) after step 2: the job
// ends after parallel.timeout_s = 3 s, with one line, from the lowest rank
// that waited, naming the stopped one.
void expect_a_stopped_rank_named(const fs::path& dir, const std::string& grid, int ranks, int stopped) {
    fs::create_directories(dir);
    Background job(two_ranks_training(dir, "parallel.timeout_s=3" + grid, ranks), dir);
    ASSERT_TRUE(job.wait_for_output("step     2/", 60)) << job.err();
    const int pid = pid_of_rank(dir, stopped);
    kill(pid, SIGSTOP);  // alive, holding its sockets, making no progress
    const int status = job.wait(60);
    kill(pid, SIGKILL);  // in case the job did not end it
    EXPECT_NE(status, 0);
    EXPECT_NE(status, -1) << "the job hung past 60 s";
    const std::string err = job.err(), stopped_rank = std::to_string(stopped);
    ASSERT_EQ(count_lines(tpsp_lines(err)), 1) << err;
    EXPECT_NE(err.find(stopped == 0 ? "tpsp: rank 1: the " : "tpsp: rank 0: the "), std::string::npos) << err;
    // the rank that waited names the one that stopped: a transfer's peer, and
    // the rank that did not answer the roll call of the job
    const std::regex names_the_stopped_rank(
        "waited 3 s( for rank [0-9] of the group)? without progress "
        "\\(parallel.timeout_s\\): rank " +
        stopped_rank + " of the job did not answer within 3 s: stopped; ending the job");
    EXPECT_TRUE(std::regex_search(err, names_the_stopped_rank)) << err;
}

// A rank that never reaches MPI_Init (a node gone before the job started, a
// wrapper that hangs): the others wait there for it, where no MPI_Abort
// reaches, until parallel.timeout_s (at least 10 s) ends the job.
TEST(Faults, ARankThatNeverStartsEndsTheJobFromMpiInit) {
    if (!have_mpirun()) GTEST_SKIP() << "mpirun not installed, or tpsp built without MPI";
    fs::path dir = scratch_dir();
    // `ranks` ranks under mpirun, rank `missing` running sleep instead of tpsp
    auto run_without = [&](int missing, int ranks) {
        const fs::path wrapper = write_file(
            dir / "never.sh", "#!/bin/sh\n[ \"$OMPI_COMM_WORLD_RANK\" = " + std::to_string(missing) +
                                  " ] && exec sleep 120\nexec " + tpsp_binary + " train " + tiny + " " + fast +
                                  "train.steps=2 parallel.timeout_s=2 data.train='" + corpus +
                                  "/train_*.bin' checkpoint.dir= logging.metrics=\n");
        fs::permissions(wrapper, fs::perms::owner_all);
        return run(mpi_env + bounded + "mpirun --oversubscribe -np " + std::to_string(ranks) + " " + wrapper.string(),
                   dir);
    };
    const auto start = std::chrono::steady_clock::now();
    Outcome r = run_without(1, 2);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_LT(seconds, 40.0) << "the job waited for the rank that never started";
    expect_one_line(r,
                    "tpsp: rank 0: MPI_Init waited 10 s for the other ranks to start (parallel.timeout_s, at "
                    "least 10 s): one has stopped or never started; ending the job");
    // 3 ranks, rank 0 the one that never starts: rank r waits 3r s more, so rank 1's line ends the job alone
    r = run_without(0, 3);
    EXPECT_EQ(r.exit_code, 1) << r.err;
    expect_one_line(r, "tpsp: rank 1: MPI_Init waited 13 s for the other ranks to start");
}

// The gathers after the last step (a save's, the trace file's) wait under the
// same deadline: rank 1 of a small program stalls 30 s before one of them.
TEST(Faults, AStalledPeerInACollectiveEndsTheJobAfterParallelTimeout) {
    if (!have_mpirun()) GTEST_SKIP() << "mpirun not installed, or tpsp built without MPI";
    fs::path dir = scratch_dir();
    for (const auto& [which, says] :
         {std::pair{"trace", "the gather of the trace's lengths"},
          std::pair{"gather", "the gather (rank 0 of a group of 2)"},
          std::pair{"all-to-all", "the all-to-all (rank 0 of a group of 2)"},
          std::pair{"bucket", "the DP reduce-scatter of gradients (rank 0 of a group of 2)"}}) {
        SCOPED_TRACE(which);
        const auto start = std::chrono::steady_clock::now();
        Outcome r = run(mpi_env + bounded + "mpirun --oversubscribe -np 2 " + TPSP_STALLED_COLLECTIVE + " " + which,
                        dir);
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        EXPECT_NE(r.exit_code, 0);
        EXPECT_LT(seconds, 20.0) << "rank 0 waited for the stalled rank";
        expect_one_line(r, std::string("tpsp: rank 0: ") + says);
        EXPECT_NE(r.err.find("waited 2 s without progress (parallel.timeout_s)"), std::string::npos) << r.err;
    }
}

// The trace is written after the traced steps, but its room on disk is
// reserved before step 1: a disk (here a file-size limit) without it is one
// line before any training, and leaves neither the trace nor its temporary.
TEST(Faults, ATraceWithoutRoomOnDiskIsOneLineBeforeStepOne) {
    fs::path dir = scratch_dir();
    const fs::path trace = dir / "trace.json";
    Outcome r = run(bounded + "bash -c 'ulimit -f 20000; " +
                        tiny_train(dir, fast + "train.steps=3 checkpoint.dir= logging.trace=" + trace.string()) + "'",
                    dir);
    EXPECT_EQ(r.exit_code, 1) << r.err;
    expect_one_line(r, "trace.json: cannot reserve the 48 MiB it may need (File too large)");
    EXPECT_EQ(r.out.find("step "), std::string::npos) << "a step ran before the refusal:\n" << r.out;
    EXPECT_FALSE(fs::exists(trace));
    EXPECT_FALSE(holds_a_temporary(dir));
    // with the room, the same run writes it, cut to its size
    r = run(bounded + tiny_train(dir, fast + "train.steps=3 checkpoint.dir= logging.trace=" + trace.string() +
                                          " checkpoint.overwrite=true"),
            dir);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const std::string text = read_text(trace);
    EXPECT_LT(text.size(), size_t(1) << 20);
    EXPECT_EQ(text.substr(text.size() - 4), "\n]}\n");
    EXPECT_FALSE(holds_a_temporary(dir));
}

// The red-team's ways past the output rules: a link (dangling, or into the
// checkpoint directory), validation shards the run does not read, a user's
// `latest`, notes or JSON where an output goes, a user's directory named like
// a temporary. Each is refused with one line (or left alone) and every file
// stays byte for byte as it was.
TEST(Faults, NoOutputReplacesAUsersFileThroughALinkOrAnUnreadInput) {
    fs::path dir = scratch_dir();
    ASSERT_EQ(run(tiny_train(dir, fast + "train.steps=2 logging.metrics="), dir).exit_code, 0);
    const fs::path ck = dir / "ckpt", val = dir / "val_000000.bin";
    fs::copy_file(corpus + "/val_000000.bin", val);
    fs::create_symlink(ck / "model_00000002.bin", dir / "init.bin");
    fs::create_symlink(dir / "t.json", dir / "m.json");  // dangling: writing m.json creates t.json
    write_file(dir / "notes.txt", "my notes\n");
    write_file(dir / "notes.json", "{\"mine\": 1}\n");
    const fs::path user_ck = dir / "user_ck";
    fs::create_directories(user_ck);
    write_file(user_ck / "latest", "hello\n");
    fs::create_directories(dir / "other");  // (a refused run may create its checkpoint.dir, empty)
    const std::string other_ck = " checkpoint.dir=" + (dir / "other").string();
    const std::vector<std::pair<std::string, std::string>> refused = {
        {"checkpoint.overwrite=true checkpoint.init=" + (dir / "init.bin").string(),
         "lies among the files that the run in checkpoint.dir"},
        {other_ck + " train.val_every=0 data.val=" + val.string() + " logging.trace=" + val.string(),
         "is also read by this run (data.val"},
        {other_ck + " logging.metrics=" + (dir / "m.json").string() + " logging.trace=" + (dir / "t.json").string(),
         "logging.trace: "},
        {other_ck + " checkpoint.overwrite=true logging.metrics=" + (dir / "notes.txt").string(),
         "holds something other than tpsp metrics"},
        {other_ck + " logging.trace=" + (dir / "notes.json").string(), "holds something other than a tpsp trace"},
        {" checkpoint.dir=" + user_ck.string(), "latest is not a tpsp run's (it names no step)"},
    };
    for (const auto& [setting, says] : refused) {
        SCOPED_TRACE(setting);
        const auto before = fingerprints(dir), before_ck = fingerprints(ck), before_user = fingerprints(user_ck);
        Outcome r = run(bounded + tiny_train(dir, fast + "train.steps=1 logging.metrics= " + setting), dir);
        EXPECT_EQ(r.exit_code, 1) << r.err;
        expect_one_line(r, says);
        EXPECT_EQ(fingerprints(dir), before);
        EXPECT_EQ(fingerprints(ck), before_ck);
        EXPECT_EQ(fingerprints(user_ck), before_user);
    }
    // a directory named like a temporary is the user's: a new run leaves it
    const fs::path temp_like = dir / "fresh" / "sub.tpsp-tmp.123";
    fs::create_directories(temp_like);
    write_file(temp_like / "f", "u\n");
    Outcome r = run(
        bounded + tiny_train(dir, fast + "train.steps=1 logging.metrics= checkpoint.dir=" + (dir / "fresh").string()),
        dir);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(read_text(temp_like / "f"), "u\n");
}

TEST(Faults, AClosedStdoutDoesNotStopTheRun) {
    fs::path dir = scratch_dir();
    Outcome r = run(bounded + "bash -c '" + tiny_train(dir, fast + "train.steps=40 logging.every=1") +
                        " | head -n 1; exit ${PIPESTATUS[0]}'",
                    dir);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(read_text(dir / "ckpt" / "latest"), "40\n");
}

TEST(Faults, ADirectoryThatHoldsARunIsNotStartedOverByMistake) {
    fs::path dir = scratch_dir();
    ASSERT_EQ(run(tiny_train(dir, fast + "train.steps=2"), dir).exit_code, 0);
    const auto before = contents(dir / "ckpt");
    const std::string resume = " checkpoint.resume=" + (dir / "ckpt").string();
    const std::vector<std::pair<std::string, std::string>> refused = {
        {"train.steps=4", "ckpt already holds a run (latest step 2): continue it with checkpoint.resume="},
        {"train.steps=2" + resume, "train.steps: 2 is not above step 2, where"},
        {"train.steps=1" + resume, "train.steps: 1 is not above step 2, where"},
        {"train.steps=4 checkpoint.overwrite=true" + resume, "checkpoint.overwrite: checkpoint.resume continues"},
    };
    for (const auto& [setting, says] : refused) {
        SCOPED_TRACE(setting);
        Outcome r = run(bounded + tiny_train(dir, fast + setting), dir);
        EXPECT_EQ(r.exit_code, 1);
        expect_one_line(r, says);
        EXPECT_EQ(contents(dir / "ckpt"), before) << "a refused run changed the run directory";
    }
    Outcome r = run(bounded + tiny_train(dir, fast + "train.steps=1 checkpoint.overwrite=true"), dir);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(names_in(dir / "ckpt"),
              (std::vector<std::string>{"latest", "lock", "model_00000001.bin", "state_00000001.bin"}));
}

// A save that fails half way (here a directory has taken the name of one of
// its files, so that file's rename fails after the other may have been
// committed) takes back what it committed: the run directory is exactly as
// it was before the save began, and the job ends with one line.
TEST(Faults, ASaveThatFailsHalfWayLeavesTheRunDirectoryAsItWas) {
    for (const char* taken : {"state_00000002.bin", "model_00000002.bin"}) {
        SCOPED_TRACE(taken);
        fs::path dir = scratch_dir();
        ASSERT_EQ(run(tiny_train(dir, fast + "train.steps=1"), dir).exit_code, 0);
        fs::create_directory(dir / "ckpt" / taken);
        const auto before = fingerprints(dir / "ckpt");
        Outcome r = run(bounded + tiny_train(dir, fast + "train.steps=2 checkpoint.resume=" + (dir / "ckpt").string()),
                        dir);
        EXPECT_EQ(r.exit_code, 1) << r.err;
        expect_one_line(r, taken);
        EXPECT_EQ(fingerprints(dir / "ckpt"), before) << "the failed save left part of itself behind";
        EXPECT_EQ(read_text(dir / "ckpt" / "latest"), "1\n");
    }
    // the same after `latest` was set back: the save of step 2 replaces the
    // other timeline's model_00000002.bin, then fails at the state file: the
    // old model file is put back, byte for byte
    fs::path dir = scratch_dir(), ck = dir / "ckpt";
    ASSERT_EQ(run(tiny_train(dir, fast + "train.steps=3 checkpoint.every=1"), dir).exit_code, 0);
    write_file(ck / "latest", "1\n");
    fs::remove(ck / "state_00000002.bin");
    fs::create_directory(ck / "state_00000002.bin");
    const auto before = fingerprints(ck);
    Outcome r = run(bounded + tiny_train(dir, fast + "train.steps=2 checkpoint.resume=" + ck.string()), dir);
    EXPECT_EQ(r.exit_code, 1) << r.err;
    expect_one_line(r, "state_00000002.bin");
    EXPECT_EQ(fingerprints(ck), before) << "the failed save lost the model file it replaced";
}

// keep_last after `latest` was set back: the checkpoints after `latest` are
// another timeline, never counted among the newest, so pruning keeps the
// resumed run's own (step 2 here) and leaves the other timeline alone.
TEST(Faults, KeepLastAfterARewoundLatestPrunesOnlyTheResumedTimeline) {
    fs::path dir = scratch_dir();
    ASSERT_EQ(run(tiny_train(dir, fast + "train.steps=4 checkpoint.every=2 checkpoint.keep_last=2"), dir).exit_code, 0);
    write_file(dir / "ckpt" / "latest", "2\n");  // back to step 2
    Outcome r = run(bounded + tiny_train(dir, fast +
                                                  "train.steps=3 checkpoint.every=1 checkpoint.keep_last=2 "
                                                  "checkpoint.resume=" +
                                                  (dir / "ckpt").string()),
                    dir);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(
        names_in(dir / "ckpt"),
        (std::vector<std::string>{"latest", "lock", "model_00000002.bin", "model_00000003.bin", "model_00000004.bin",
                                  "state_00000002.bin", "state_00000003.bin", "state_00000004.bin"}));
    EXPECT_EQ(read_text(dir / "ckpt" / "latest"), "3\n");
}

TEST(Faults, ANewRunDoesNotTruncateAnotherRunsMetricsUnlessToldToOverwrite) {
    fs::path dir = scratch_dir();
    const fs::path metrics = dir / "metrics.jsonl";
    ASSERT_EQ(run(tiny_train(dir, fast + "train.steps=2 checkpoint.dir="), dir).exit_code, 0);
    const std::string before = read_text(metrics);
    ASSERT_EQ(count_lines(before), 2);
    const std::string says = "tpsp: config error: logging.metrics: " + metrics.string() +
                             " already holds another run's metrics (";
    // without a checkpoint directory, and with a new one: neither makes the metrics this run's
    for (const std::string& where : {std::string("checkpoint.dir="), "checkpoint.dir=" + (dir / "new").string()}) {
        SCOPED_TRACE(where);
        Outcome r = run(bounded + tiny_train(dir, fast + "train.steps=3 " + where), dir);
        EXPECT_EQ(r.exit_code, 1);
        expect_one_line(r, says);
        EXPECT_EQ(r.out.find("step "), std::string::npos) << "it trained: " << r.out;
        EXPECT_EQ(read_text(metrics), before) << "the metrics were changed";
    }
    EXPECT_FALSE(fs::exists(dir / "new" / "latest"));
    Outcome r = run(bounded + tiny_train(dir, fast + "train.steps=3 checkpoint.dir= checkpoint.overwrite=true"), dir);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(field(metrics, "loss").size(), 3u) << "overwrite starts the metrics over";
}

// ----------------------------------------------------------------------------
// outputs never destroy inputs: every output path is compared with every
// input and every other output before anything is written (docs/design.md §7)

// Every regular file under dir with its bytes (the lock aside).
std::map<std::string, std::string> tree_contents(const fs::path& dir) {
    std::map<std::string, std::string> files;
    for (const fs::directory_entry& entry : fs::recursive_directory_iterator(dir))
        if (entry.is_regular_file() && entry.path().filename() != "lock")
            files[fs::relative(entry.path(), dir).string()] = read_text(entry.path());
    return files;
}

TEST(Faults, AnOutputThatIsAnInputOrAnotherOutputIsOneLineAndChangesNothing) {
    fs::path dir = scratch_dir(), data = dir / "data", ck = dir / "ckpt";
    fs::create_directories(data);
    // the run's own copies of the corpus and the config: if a case wrote over them, only this test's files suffer
    fs::copy_file(corpus + "/train_000000.bin", data / "train_000000.bin");
    fs::copy_file(corpus + "/val_000000.bin", data / "val_000000.bin");
    fs::copy_file(tiny, dir / "tiny.yaml");
    fs::create_symlink(data / "val_000000.bin", dir / "link_to_val.bin");
    const std::string own_data = " data.train=" + (data / "train_*.bin").string() +
                                 " data.val=" + (data / "val_*.bin").string() + " train.val_every=1 ";
    auto train = [&](const std::string& extra) {
        std::string command = tiny_train(dir, fast + "train.steps=2 " + extra) + own_data;
        return bounded + std::regex_replace(command, std::regex(tiny), (dir / "tiny.yaml").string());
    };
    ASSERT_EQ(run(train("checkpoint.every=1"), dir).exit_code, 0);
    fs::rename(dir / "metrics.jsonl", dir / "first_metrics.jsonl");
    const std::string resume = " train.steps=3 checkpoint.resume=" + ck.string() + " ";
    const std::vector<std::pair<std::string, std::string>> cases = {
        {"checkpoint.overwrite=true logging.metrics=" + (data / "train_000000.bin").string(),
         "logging.metrics: " + (data / "train_000000.bin").string() + " is also read by this run (data.train"},
        {"checkpoint.dir=" + (dir / "new").string() + " logging.trace=" + (dir / "link_to_val.bin").string(),
         "is also read by this run (data.val: " + (data / "val_000000.bin").string()},
        {"checkpoint.dir=" + (dir / "new").string() + " logging.trace=" + (dir / "tiny.yaml").string(),
         "is also read by this run (the config: "},
        {"checkpoint.dir=" + (dir / "new").string() + " logging.metrics=" + (dir / "m.jsonl").string() +
             " logging.trace=" + (dir / "." / "m.jsonl").string(),
         "logging.trace: " + (dir / "." / "m.jsonl").string() + " is also written as logging.metrics"},
        {resume + "logging.metrics=" + (ck / "lock").string(),
         "logging.metrics: " + (ck / "lock").string() + " is one of the files the run in checkpoint.dir"},
        {resume + "logging.metrics=" + (dir / "m.jsonl").string() +
             " logging.trace=" + (ck / "model_00000002.bin").string(),
         "logging.trace: " + (ck / "model_00000002.bin").string() + " is also read by this run (checkpoint.resume"},
        {"checkpoint.overwrite=true checkpoint.init=" + (ck / "model_00000001.bin").string(),
         "checkpoint.init: " + (ck / "model_00000001.bin").string() + " lies among the files that the run in"},
    };
    const auto before = tree_contents(dir);
    for (const auto& [setting, says] : cases) {
        SCOPED_TRACE(setting);
        Outcome r = run(train(setting), dir);
        EXPECT_EQ(r.exit_code, 1);
        expect_ended_in_time(r);
        expect_one_line(r, says);
        EXPECT_EQ(r.out.find("step "), std::string::npos) << "it trained: " << r.out;
        EXPECT_EQ(tree_contents(dir), before) << "a refused run changed a file";
    }
    // outputs that do not exist yet, spelt relative and relative-with-dot, from the test's directory
    const std::vector<std::pair<std::string, std::string>> relative = {
        {"checkpoint.dir=new logging.metrics=o.json logging.trace=./o.json",
         "logging.trace: ./o.json is also written as logging.metrics (o.json)"},
        {"checkpoint.dir=./new2 logging.metrics=new2/latest",
         "logging.metrics: new2/latest is one of the files the run in checkpoint.dir"},
    };
    for (const auto& [setting, says] : relative) {
        SCOPED_TRACE(setting);
        Outcome r = run("cd " + dir.string() + " && " + train(setting), dir);
        EXPECT_EQ(r.exit_code, 1);
        expect_one_line(r, says);
        EXPECT_EQ(r.out.find("step "), std::string::npos) << "it trained: " << r.out;
        EXPECT_FALSE(fs::exists(dir / "o.json"));
        EXPECT_FALSE(fs::exists(dir / "new2" / "latest"));
    }
}

TEST(Faults, PrepareNeverRemovesItsOwnInput) {
    fs::path dir = scratch_dir(), out = dir / "out";
    fs::create_directories(out);
    fs::copy_file(corpus + "/kjv.txt", dir / "text.txt");
    ASSERT_EQ(run(tpsp_binary + " prepare --tokenizer byte " + (dir / "text.txt").string() + " " + out.string(), dir)
                  .exit_code,
              0);
    const std::string input = (out / "train_000000.bin").string();  // an earlier prepare's shard, now an input
    const auto before = tree_contents(dir);
    Outcome r = run(bounded + tpsp_binary + " prepare --tokenizer byte --replace " + input + " " + out.string(), dir);
    EXPECT_EQ(r.exit_code, 1);
    expect_one_line(r, input + ": this input is one of the shard files that prepare writes into");
    EXPECT_EQ(tree_contents(dir), before);
}

// ----------------------------------------------------------------------------
// resume continues only what it can continue

TEST(Faults, AResumedRunCutsTheMetricsBackToTheStepItResumesAndNeedsACheckpointDirectory) {
    fs::path dir = scratch_dir(), ck = dir / "ckpt";
    ASSERT_EQ(run(tiny_train(dir, fast + "train.steps=4 checkpoint.every=2"), dir).exit_code, 0);
    const std::vector<std::string> straight = field(dir / "metrics.jsonl", "loss");
    ASSERT_EQ(straight.size(), 4u);
    // as after kill -9 between step 4's metrics and its `latest`: the metrics hold steps 3 and 4, `latest` says 2
    write_file(ck / "latest", "2\n");
    Outcome r = run(bounded + tiny_train(dir, fast + "train.steps=4 checkpoint.resume=" + ck.string()), dir);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(field(dir / "metrics.jsonl", "step"), (std::vector<std::string>{"1", "2", "3", "4"}));
    EXPECT_EQ(field(dir / "metrics.jsonl", "loss"), straight) << "resume is bit-exact, each step once";

    Outcome nowhere = run(
        bounded + tiny_train(dir, fast + "train.steps=6 checkpoint.dir= checkpoint.resume=" + ck.string()), dir);
    EXPECT_EQ(nowhere.exit_code, 1);
    expect_one_line(nowhere, "checkpoint.dir: checkpoint.resume continues a run, but with no checkpoint.dir");
}

TEST(Faults, AResumeWithAnotherBatchShapeIsRefusedInsteadOfReindexingTheData) {
    fs::path dir = scratch_dir(), ck = dir / "ckpt";
    ASSERT_EQ(run(tiny_train(dir, fast + "train.steps=2"), dir).exit_code, 0);
    const auto before = contents(ck);
    const std::string metrics = read_text(dir / "metrics.jsonl");
    const std::string resume = " train.steps=4 checkpoint.resume=" + ck.string();
    const std::vector<std::pair<std::string, std::string>> refused = {
        {"train.batch_size=8", "train.batch_size: 8, but the run in " + ck.string() + " was saved at 4"},
        // the same model (wpe's 64 rows), shorter sequences
        {"model.max_seq_len=64 train.seq_len=32",
         "train.seq_len: 32, but the run in " + ck.string() + " was saved at 64"},
    };
    for (const auto& [setting, says] : refused) {
        SCOPED_TRACE(setting);
        Outcome r = run(bounded + tiny_train(dir, fast + setting + resume), dir);
        EXPECT_EQ(r.exit_code, 1);
        expect_one_line(r, says);
        EXPECT_EQ(contents(ck), before) << "a refused resume changed the run directory";
        EXPECT_EQ(read_text(dir / "metrics.jsonl"), metrics);
    }
    Outcome accum = run(bounded + tiny_train(dir, fast + "train.grad_accum=2" + resume), dir);
    EXPECT_EQ(accum.exit_code, 0) << "train.grad_accum does not re-index the data: " << accum.err;
}

// An llm.c token shard of `tokens` without a checksum (read unverified, as llm.c's own).
fs::path write_shard(const fs::path& path, const std::vector<uint16_t>& tokens) {
    std::vector<int32_t> header(256, 0);
    header[0] = 20240520, header[1] = 1, header[2] = int32_t(tokens.size());
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(header.data()), 1024);
    out.write(reinterpret_cast<const char*>(tokens.data()), std::streamsize(tokens.size() * 2));
    return path;
}

TEST(Faults, BadDataFoundLateCostsNoTraining) {
    fs::path dir = scratch_dir(), data = dir / "data", ck = dir / "ckpt";
    fs::create_directories(data);
    std::vector<uint16_t> good(4 * 64 * 3 + 1);  // three batches of b = 4, s = 64
    for (size_t i = 0; i < good.size(); i++) good[i] = uint16_t('a' + i % 26);
    std::vector<uint16_t> bad = good;
    bad[100] = 300;  // not below model.vocab_size = 256
    write_shard(data / "train_000000.bin", good);
    write_shard(data / "train_000001.bin", bad);
    write_shard(data / "val_000000.bin", good);
    write_shard(data / "bad_val_000000.bin", bad);
    const std::string shards = " data.train=" + (data / "train_*.bin").string();

    // a bad validation shard: found before step 1, not at the first validation
    Outcome val = run(bounded + tiny_train(dir, fast + "train.steps=5 train.val_every=1000 train.val_batches=2" +
                                                    shards + " data.val=" + (data / "bad_val_*.bin").string()),
                      dir);
    EXPECT_EQ(val.exit_code, 1);
    expect_one_line(val, "bad_val_000000.bin: token 300 at offset 100 is not below model.vocab_size = 256");
    EXPECT_EQ(val.out.find("step "), std::string::npos) << "it trained: " << val.out;

    // a bad training shard met at step 4: steps 1-3 are saved first
    Outcome train = run(bounded + tiny_train(dir, fast + "train.steps=10 data.val=" + shards), dir);
    EXPECT_EQ(train.exit_code, 1);
    expect_ended_in_time(train);
    expect_one_line(train,
                    "train_000001.bin: token 300 at offset 100 is not below model.vocab_size = 256; step 3 "
                    "is saved: continue with checkpoint.resume=" +
                        ck.string());
    EXPECT_EQ(read_text(ck / "latest"), "3\n");
    EXPECT_EQ(field(dir / "metrics.jsonl", "step"), (std::vector<std::string>{"1", "2", "3"}));
}

// The ranks agree on the files' names; a node whose copy of a shard or of a
// checkpoint holds other bytes is refused before step 1. Here each rank reads
// the same relative paths from its own directory, as two nodes read their
// own disks.
TEST(Faults, ARankWhoseCopyOfAShardOrCheckpointDiffersIsRefusedBeforeStepOne) {
    if (!have_mpirun()) GTEST_SKIP() << "mpirun not installed, or tpsp built without MPI";
    fs::path dir = scratch_dir();
    // an llm.c shard (no CRC recorded) of 600k tokens, rank 1's copy one token different after its first MiB
    std::vector<uint16_t> tokens(600000);
    for (size_t i = 0; i < tokens.size(); i++) tokens[i] = uint16_t('a' + i % 26);
    for (int rank = 0; rank < 2; rank++) {
        const fs::path node = dir / ("node" + std::to_string(rank));
        fs::create_directories(node);
        if (rank == 1) tokens[550000] = 'z';
        write_shard(node / "train_000000.bin", tokens);
        if (rank == 1) tokens[550000] = uint16_t('a' + 550000 % 26);
        write_shard(node / "same_000000.bin", tokens);
        // two steps saved, from another seed on rank 1: another model at the same step
        const std::string seed = rank == 0 ? "train.seed=1 " : "train.seed=2 ";
        ASSERT_EQ(
            run(tiny_train(node, fast + seed + "train.steps=2 checkpoint.every=1 logging.metrics="), node).exit_code,
            0);
        fs::copy_file(node / "ckpt" / "model_00000002.bin", node / "init.bin");
        fs::create_directories(node / "rewound");
        fs::copy(node / "ckpt", node / "rewound");
        write_file(node / "rewound" / "latest", rank == 0 ? "2\n" : "1\n");
    }
    const auto before = fingerprints(dir);
    auto expect_rank_one_refused = [&](const std::string& args, const std::string& says) {
        SCOPED_TRACE(args);
        const fs::path wrapper = write_file(
            dir / "per_node.sh", "#!/bin/sh\ncd " + dir.string() + "/node$OMPI_COMM_WORLD_RANK && exec " + tpsp_binary +
                                     " train " + tiny + " " + fast +
                                     "train.steps=4 data.val= checkpoint.dir= logging.metrics= " + args + "\n");
        fs::permissions(wrapper, fs::perms::owner_all);
        Outcome r = run(mpi_env + bounded + "mpirun --oversubscribe -np 2 " + wrapper.string(), dir);
        fs::remove(wrapper);
        EXPECT_EQ(r.exit_code, 1);
        expect_ended_in_time(r);
        expect_one_line(r, "tpsp: rank 1: error: its copy of an input differs from rank 0's: " + says);
        EXPECT_EQ(r.out.find("step "), std::string::npos) << "it trained: " << r.out;
        EXPECT_EQ(fingerprints(dir), before);
    };
    expect_rank_one_refused(
        "data.train=train_000000.bin",
        "train_000000.bin: 600000 tokens, 1201024 bytes, CRC-32C ");  // read whole, not its first MiB
    const std::string model_bytes = std::to_string(fs::file_size(dir / "node0" / "init.bin"));
    expect_rank_one_refused("data.train=same_000000.bin checkpoint.init=init.bin",
                            "init.bin: " + model_bytes + " bytes, CRC-32C ");
    expect_rank_one_refused("data.train=same_000000.bin checkpoint.resume=ckpt checkpoint.dir=out",
                            "ckpt/model_00000002.bin: " + model_bytes + " bytes, CRC-32C ");
    expect_rank_one_refused("data.train=same_000000.bin checkpoint.resume=rewound checkpoint.dir=out",
                            "rewound/latest: step 1 (rank 0: rewound/latest: step 2)");
}

// tpsp eval under mpirun, its checkpoint missing on one node: that rank's one
// line, and every rank ends, instead of the others waiting in the first sum.
TEST(Faults, ACheckpointMissingOrDifferentOnOneRankOfAnEvalIsOneLine) {
    if (!have_mpirun()) GTEST_SKIP() << "mpirun not installed, or tpsp built without MPI";
    fs::path dir = scratch_dir();
    ASSERT_EQ(run(tiny_train(dir, fast + "train.steps=1"), dir).exit_code, 0);
    std::vector<uint16_t> bad(4 * 64 * 2 + 1, uint16_t('a'));
    bad[100] = 300;  // not below model.vocab_size = 256
    for (int rank = 0; rank < 2; rank++) {
        fs::create_directories(dir / ("node" + std::to_string(rank)));
        fs::copy_file(corpus + "/val_000000.bin", dir / ("node" + std::to_string(rank)) / "val_000000.bin");
    }
    fs::copy_file(dir / "ckpt" / "model_00000001.bin", dir / "node0" / "init.bin");  // node 1 has none
    const fs::path wrapper = write_file(
        dir / "per_node.sh", "#!/bin/sh\ncd " + dir.string() + "/node$OMPI_COMM_WORLD_RANK && exec " + tpsp_binary +
                                 " eval " + tiny + " " + fast +
                                 "data.val=val_000000.bin train.val_batches=1 checkpoint.init=init.bin\n");
    fs::permissions(wrapper, fs::perms::owner_all);
    Outcome r = run(mpi_env + bounded + "mpirun --oversubscribe -np 2 " + wrapper.string(), dir);
    EXPECT_EQ(r.exit_code, 1);
    expect_ended_in_time(r);
    expect_one_line(r, "tpsp: rank 1: error: init.bin");
    EXPECT_EQ(r.out.find("val loss"), std::string::npos) << r.out;
    // and a validation shard that is bad on node 1 only (its checkpoint there now)
    fs::copy_file(dir / "node0" / "init.bin", dir / "node1" / "init.bin");
    fs::remove(dir / "node1" / "val_000000.bin");
    write_shard(dir / "node1" / "val_000000.bin", bad);
    r = run(mpi_env + bounded + "mpirun --oversubscribe -np 2 " + wrapper.string(), dir);
    EXPECT_EQ(r.exit_code, 1);
    expect_ended_in_time(r);
    expect_one_line(r, "tpsp: rank 1: error: val_000000.bin: token 300 at offset 100");
    // and another model on node 1 (its shard good again): each rank's loss would be of another model
    fs::remove(dir / "node1" / "val_000000.bin");
    fs::copy_file(corpus + "/val_000000.bin", dir / "node1" / "val_000000.bin");
    ASSERT_EQ(run(tiny_train(dir / "node1", fast + "train.steps=1 train.seed=7"), dir).exit_code, 0);
    fs::copy_file(dir / "node1" / "ckpt" / "model_00000001.bin", dir / "node1" / "init.bin",
                  fs::copy_options::overwrite_existing);
    r = run(mpi_env + bounded + "mpirun --oversubscribe -np 2 " + wrapper.string(), dir);
    EXPECT_EQ(r.exit_code, 1);
    expect_ended_in_time(r);
    expect_one_line(r, "tpsp: rank 1: error: its copy of an input differs from rank 0's: init.bin: ");
    EXPECT_EQ(r.out.find("val loss"), std::string::npos) << r.out;
}

TEST(Faults, TwoRunsOnOneMetricsFileAreRefusedByItsLock) {
    fs::path dir = scratch_dir(), second = dir / "second";
    fs::create_directories(second);
    Background first(tiny_train(dir, fast + "train.steps=1000000 logging.every=1"), dir);
    ASSERT_TRUE(first.wait_for_output("data: ", 60)) << first.err();
    Outcome refused = run(
        bounded + tiny_train(second, fast + "train.steps=3 checkpoint.overwrite=true logging.metrics=" +
                                         (dir / "metrics.jsonl").string()),
        second);
    EXPECT_EQ(refused.exit_code, 1);
    expect_one_line(refused, "metrics.jsonl: another tpsp run is writing these metrics");
    kill(first.pid(), SIGTERM);
    EXPECT_EQ(first.wait(60), 128 + SIGTERM) << first.err();
    const std::vector<std::string> steps = field(dir / "metrics.jsonl", "step");  // valid JSON lines, one run's
    for (size_t i = 0; i < steps.size(); i++) EXPECT_EQ(steps[i], std::to_string(i + 1));
}

// ----------------------------------------------------------------------------
// a command whose product is its output fails when the output is lost

TEST(Faults, ACommandWhoseOutputIsLostExitsNonZero) {
    fs::path dir = scratch_dir();
    ASSERT_EQ(run(tiny_train(dir, fast + "train.steps=1"), dir).exit_code, 0);
    const std::string model = (dir / "ckpt" / "model_00000001.bin").string();
    for (const std::string& command : {tpsp_binary + " config-reference", tpsp_binary + " memory " + tiny,
                                       tpsp_binary + " sample " + model + " --tokens 8"}) {
        SCOPED_TRACE(command);
        Outcome full = run(bounded + "sh -c '" + command + " > /dev/full'", dir);
        EXPECT_EQ(full.exit_code, 1);
        expect_one_line(full, "cannot write to standard output");
    }
    for (const std::string& command : {tpsp_binary + " --help", tpsp_binary + " train --help"}) {
        SCOPED_TRACE(command);
        Outcome full = run(bounded + "sh -c '" + command + " > /dev/full'", dir);
        EXPECT_EQ(full.exit_code, 1);
        expect_one_line(full, "cannot write the help to standard output");
    }
}

// `tpsp export` of a trained model writes the directory and says so; its
// mistakes are one line each and leave an earlier export as it was
// (model/hf_gpt2.h; the files themselves: test_hf_gpt2.cpp).
TEST(Faults, ExportWritesATrainedModelAndItsMistakesAreOneLine) {
    fs::path dir = scratch_dir();
    ASSERT_EQ(run(tiny_train(dir, fast + "train.steps=1"), dir).exit_code, 0);
    const std::string model = (dir / "ckpt" / "model_00000001.bin").string(), out = (dir / "hf").string();
    Outcome exported = run(bounded + tpsp_binary + " export " + model + " " + out, dir);
    EXPECT_EQ(exported.exit_code, 0) << exported.err;
    EXPECT_NE(exported.out.find("model.safetensors config.json generation_config.json"), std::string::npos)
        << exported.out;
    const std::string before = read_text(dir / "hf" / "model.safetensors");
    EXPECT_GT(before.size(), 8u);
    // and back: `tpsp import` gives the trained checkpoint's bytes again
    const std::string back = (dir / "back.bin").string();
    Outcome imported = run(bounded + tpsp_binary + " import " + out + " " + back, dir);
    EXPECT_EQ(imported.exit_code, 0) << imported.err;
    EXPECT_EQ(read_text(back), read_text(model)) << "export → import is not the checkpoint";
    Outcome exists = run(bounded + tpsp_binary + " import " + out + " " + back, dir);
    EXPECT_EQ(exists.exit_code, 1);
    expect_one_line(exists, "back.bin: exists: give --replace to overwrite it");
    Outcome not_hf = run(bounded + tpsp_binary + " import " + (dir / "ckpt").string() + " " + back + " --replace", dir);
    EXPECT_EQ(not_hf.exit_code, 1);
    expect_one_line(not_hf, "config.json: missing: not a Hugging Face model directory");
    Outcome again = run(bounded + tpsp_binary + " export " + model + " " + out + " --dtype bfloat16", dir);
    EXPECT_EQ(again.exit_code, 1);
    expect_one_line(again, "model.safetensors: exists (an earlier export?): give --replace to overwrite it");
    EXPECT_EQ(read_text(dir / "hf" / "model.safetensors"), before);
    Outcome dtype = run(bounded + tpsp_binary + " export " + model + " " + out + " --dtype float16", dir);
    EXPECT_EQ(dtype.exit_code, 2);
    expect_one_line(dtype, "--dtype");
    Outcome missing = run(bounded + tpsp_binary + " export " + (dir / "none.bin").string() + " " + out, dir);
    EXPECT_EQ(missing.exit_code, 1);
    expect_one_line(missing, "none.bin");
    Outcome replaced = run(bounded + tpsp_binary + " export " + model + " " + out + " --dtype bfloat16 --replace", dir);
    EXPECT_EQ(replaced.exit_code, 0) << replaced.err;
    EXPECT_LT(read_text(dir / "hf" / "model.safetensors").size(), before.size()) << "bf16 is half the bytes";
}

// `tpsp eval --hellaswag` (train/hellaswag.h) and train.hellaswag_every: a
// file with a mistake is one line naming the line, before any work.
TEST(Faults, AHellaSwagFileWithAMistakeIsOneLineNamingItsLine) {
    fs::path dir = scratch_dir();
    ASSERT_EQ(run(tiny_train(dir, fast + "train.steps=1"), dir).exit_code, 0);
    const std::string good = "{\"ctx\": \"And God said\", \"endings\": [\"a\", \"b\", \"c\", \"d\"], \"label\": 0}\n";
    const fs::path file = write_file(
        dir / "hellaswag.jsonl",
        good + good + "{\"ctx\": \"x\", \"endings\": [\"a\", \"\", \"c\", \"d\"], \"label\": 0}\n");
    Outcome eval = run(bounded + tpsp_binary + " eval " + tiny + " " + fast + "checkpoint.init=" +
                           (dir / "ckpt" / "model_00000001.bin").string() + " --hellaswag " + file.string(),
                       dir);
    EXPECT_EQ(eval.exit_code, 1);
    expect_one_line(eval, "hellaswag.jsonl:3: ending 1 is empty");
    write_file(file, good + "{\"ctx\": \"x\", \"endings\": [\"a\", \"b\", \"c\", \"d\"], \"label\": 7}\n");
    Outcome training = run(tiny_train(dir, fast +
                                               "train.steps=2 checkpoint.dir= train.hellaswag_every=1 "
                                               "data.hellaswag=" +
                                               file.string()),
                           dir);
    EXPECT_EQ(training.exit_code, 1);
    expect_one_line(training, "hellaswag.jsonl:2: label 7 is not an ending's index (0 to 3)");
    Outcome no_file = run(tiny_train(dir, fast + "train.steps=2 checkpoint.dir= train.hellaswag_every=1"), dir);
    EXPECT_EQ(no_file.exit_code, 1);
    expect_one_line(no_file, "data.hellaswag: train.hellaswag_every needs the HellaSwag file");
}

// Only tpsp's own temporaries (NAME.tpsp-tmp.<pid>, .tpsp-probe.<pid>) are
// cleaned up: a user's files that merely look temporary are left alone.
TEST(Faults, StaleTemporariesAreRemovedAndKeepLastPrunesOlderCheckpoints) {
    fs::path dir = scratch_dir();
    fs::create_directories(dir / "ckpt");
    // pid 9999999 is above Linux's largest (2^22): no process has it, so their writer has ended
    write_file(dir / "ckpt" / "model_00000007.bin.tpsp-tmp.9999999", "a crashed writer's");
    write_file(dir / "ckpt" / ".tpsp-probe.9999999", "a crashed probe");
    // a live process's temporary (this test's: another run writing its trace here) is that run's
    const std::string live = "trace.json.tpsp-tmp." + std::to_string(::getpid());
    const std::vector<std::string> users = {"results.tmp.csv", "notes.tmp",     "a.tmp.7",
                                            "x.tpsp-tmp.",     "y.tpsp-tmp.1a", live};
    for (const std::string& name : users) write_file(dir / "ckpt" / name, "the user's");
    Outcome r = run(bounded + tiny_train(dir, fast + "train.steps=5 checkpoint.every=1 checkpoint.keep_last=2"), dir);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    std::vector<std::string> expected = {
        "latest", "lock", "model_00000004.bin", "model_00000005.bin", "state_00000004.bin", "state_00000005.bin"};
    expected.insert(expected.end(), users.begin(), users.end());
    std::sort(expected.begin(), expected.end());
    EXPECT_EQ(names_in(dir / "ckpt"), expected);
    for (const std::string& name : users) EXPECT_EQ(read_text(dir / "ckpt" / name), "the user's") << name;
    EXPECT_EQ(read_text(dir / "ckpt" / "latest"), "5\n");
}

// A file named like a checkpoint that holds none (no llm.c model header, no
// tpsp state header) is the user's: keep_last never prunes it, and
// checkpoint.overwrite refuses to remove it, in one line.
TEST(Faults, AUsersFileNamedLikeACheckpointIsNeitherPrunedNorOverwritten) {
    fs::path dir = scratch_dir(), ck = dir / "ckpt";
    ASSERT_EQ(run(tiny_train(dir, fast + "train.steps=2"), dir).exit_code, 0);
    fs::remove(ck / "model_00000001.bin");  // none was saved at step 1: the user's file takes its name
    write_file(ck / "model_00000001.bin", "the user's");
    Outcome pruned = run(bounded + tiny_train(dir, fast +
                                                       "train.steps=4 checkpoint.every=1 checkpoint.keep_last=1 "
                                                       "checkpoint.resume=" +
                                                       ck.string()),
                         dir);
    EXPECT_EQ(pruned.exit_code, 0) << pruned.err;
    EXPECT_EQ(read_text(ck / "model_00000001.bin"), "the user's");
    EXPECT_FALSE(fs::exists(ck / "model_00000003.bin")) << "keep_last=1 pruned nothing";
    const auto before = fingerprints(dir);
    Outcome overwrite = run(bounded + tiny_train(dir, fast + "train.steps=2 checkpoint.overwrite=true"), dir);
    EXPECT_EQ(overwrite.exit_code, 1);
    expect_one_line(overwrite, "model_00000001.bin is not a tpsp checkpoint");
    EXPECT_EQ(fingerprints(dir), before);
}

// ----------------------------------------------------------------------------
// writes that fail (a file-size limit stands in for a full disk)

// Without a launcher, Open MPI's MPI_Init would start a helper daemon whose
// shared-memory files fail under the limit with pages of errors; tpsp, alone,
// asks for none (main.cpp), and under the tightest limit still runs.
TEST(Faults, AFileSizeLimitWithoutMpirunLeavesMpiStartingAlone) {
    fs::path dir = scratch_dir();
    // the limit binds tpsp alone; what it prints goes through a pipe, merged
    const auto limited = [&](const std::string& command) {
        return run(bounded + "bash -c 'set -o pipefail; (ulimit -f 0; exec " + command + ") 2>&1 | cat'", dir);
    };
    Outcome versions = limited(tpsp_binary + " versions");
    EXPECT_EQ(versions.exit_code, 0) << versions.out;
    EXPECT_NE(versions.out.find("MPI: Open MPI"), std::string::npos) << versions.out;
    EXPECT_EQ(versions.out.find("ERROR"), std::string::npos) << versions.out;
    Outcome train = limited(tiny_train(dir, fast + "train.steps=2"));
    EXPECT_EQ(train.exit_code, 1);
    expect_ended_in_time(train);
    EXPECT_EQ(count_lines(train.out), 1) << train.out;  // tpsp's one line, nothing of MPI's
    EXPECT_NE(train.out.find("File too large"), std::string::npos) << train.out;
}

TEST(Faults, AFailedMetricsWriteIsOneLineAndTheFileKeepsWholeLines) {
    fs::path dir = scratch_dir();
    Outcome r = run(
        bounded + "bash -c 'ulimit -f 4; exec " + tiny_train(dir, fast + "train.steps=200 checkpoint.dir=") + "'", dir);
    EXPECT_EQ(r.exit_code, 1);
    expect_ended_in_time(r);
    expect_one_line(r, "metrics.jsonl: cannot write the metrics of step");
    const size_t lines = field(dir / "metrics.jsonl", "loss").size();  // throws on a cut line
    EXPECT_GE(lines, 1u);
    EXPECT_LT(lines, 200u);
}

TEST(Faults, AFailedTraceWriteIsOneLineAndNeverSaysWrote) {
    fs::path dir = scratch_dir();
    Outcome r = run(bounded + "bash -c 'ulimit -f 2; exec " +
                        tiny_train(dir, fast + "train.steps=2 checkpoint.dir= logging.metrics= logging.trace=" +
                                            (dir / "trace.json").string()) +
                        "'",
                    dir);
    EXPECT_EQ(r.exit_code, 1);
    expect_one_line(r, "trace.json: cannot reserve the 48 MiB it may need (File too large)");  // before step 1
    EXPECT_EQ(r.out.find("wrote"), std::string::npos) << r.out;
    EXPECT_FALSE(fs::exists(dir / "trace.json")) << "a broken trace was left";
    EXPECT_FALSE(holds_a_temporary(dir));
}

TEST(Faults, AFailedSaveLeavesTheLastCheckpointAsItWas) {
    fs::path dir = scratch_dir();
    ASSERT_EQ(run(tiny_train(dir, fast + "train.steps=2"), dir).exit_code, 0);
    const auto before = contents(dir / "ckpt");
    // the model file is 3.4 MB: past a limit of 1 MiB
    Outcome r = run(
        bounded + "bash -c 'ulimit -f 1024; exec " +
            tiny_train(dir, fast + "train.steps=4 checkpoint.every=1 checkpoint.resume=" + (dir / "ckpt").string()) +
            "'",
        dir);
    EXPECT_EQ(r.exit_code, 1);
    expect_ended_in_time(r);
    expect_one_line(r, "model_00000003.bin.tpsp-tmp.");
    EXPECT_NE(r.err.find("write failed"), std::string::npos) << r.err;
    EXPECT_EQ(contents(dir / "ckpt"), before) << "the failed save changed the run directory";
}

// ----------------------------------------------------------------------------
// integrity: a changed byte in a file tpsp wrote is refused by every reader
// (each file's CRC-32C, common/checksum.h), and the file is left as it is

TEST(Faults, AFlippedBitInAModelFileIsRefusedByResumeEvalSampleAndInit) {
    fs::path dir = scratch_dir(), other = dir / "other";
    fs::create_directories(other);
    ASSERT_EQ(run(tiny_train(dir, fast + "train.steps=1"), dir).exit_code, 0);
    const fs::path ckpt = dir / "ckpt", model = ckpt / "model_00000001.bin";
    flip_bit(model, 1024 + 4 * 1000);  // a weight of wte, finite still
    const auto damaged = contents(ckpt);
    const std::string val = " data.val='" + corpus + "/val_*.bin' ";
    const std::vector<std::string> readers = {
        tiny_train(dir, fast + "train.steps=2 checkpoint.resume=" + ckpt.string()),
        tpsp_binary + " eval " + tiny + val + fast + "checkpoint.init=" + model.string(),
        tpsp_binary + " sample " + model.string() + " --tokens 5",
        tiny_train(other, fast + "train.steps=2 checkpoint.init=" + model.string()),
    };
    for (const std::string& command : readers) {
        SCOPED_TRACE(command);
        Outcome r = run(bounded + command, dir);
        EXPECT_EQ(r.exit_code, 1);
        expect_one_line(r, "tpsp: error: " + model.string() + ": damaged: its CRC-32C is ");
        EXPECT_TRUE(std::regex_search(r.err, std::regex(": damaged: its CRC-32C is [0-9a-f]{8}, the header records "
                                                        "[0-9a-f]{8}\n$")))
            << r.err;
        EXPECT_EQ(r.out.find("step "), std::string::npos) << "it trained: " << r.out;
        EXPECT_EQ(contents(ckpt), damaged) << "the file was changed";
    }
    EXPECT_FALSE(fs::exists(other / "ckpt" / "latest"));
}

TEST(Faults, AFlippedBitInAStateFileIsRefusedByResumeAndAnEarlierFormatIsOneClearLine) {
    fs::path dir = scratch_dir(), source = dir / "source";
    fs::create_directories(source);
    ASSERT_EQ(run(tiny_train(source, fast + "train.steps=1"), source).exit_code, 0);
    const std::string damaged = "state_00000001.bin: damaged: its CRC-32C is ";
    const std::vector<std::pair<std::function<void(const fs::path&)>, std::string>> cases = {
        {[](const fs::path& state) { flip_bit(state, 64 + 4 * 5); }, damaged},  // AdamW's m
        {[](const fs::path& state) { flip_bit(state, 16); }, damaged},          // the loader's position: 1 -> 0
        {[](const fs::path& state) {  // the layout before the checksum: no last 4 bytes, another magic
             const int64_t magic_without_checksum = 0x7470737073746174;
             std::string bytes = read_text(state);
             bytes.resize(bytes.size() - 4);
             std::memcpy(bytes.data(), &magic_without_checksum, 8);
             std::ofstream(state, std::ios::binary | std::ios::trunc) << bytes;
         },
         "state_00000001.bin: optimizer state of an earlier tpsp, which recorded no checksum: this one cannot "
         "resume it; start from its weights with checkpoint.init="},
        {[](const fs::path& state) {  // the layout before the data's shape: a 32-byte header
             const int64_t magic_without_data_shape = 0x7470737073746132;
             std::string bytes = read_text(state);
             bytes.erase(32, 32);
             std::memcpy(bytes.data(), &magic_without_data_shape, 8);
             std::ofstream(state, std::ios::binary | std::ios::trunc) << bytes;
             reseal_state(state);
         },
         "state_00000001.bin: optimizer state of an earlier tpsp, which recorded no shape of its data: this one "
         "cannot resume it; start from its weights with checkpoint.init="},
    };
    for (size_t i = 0; i < cases.size(); i++) {
        SCOPED_TRACE(cases[i].second);
        const fs::path copy = dir / ("copy" + std::to_string(i));
        fs::copy(source / "ckpt", copy);
        cases[i].first(copy / "state_00000001.bin");
        const auto before = contents(copy);
        Outcome r = run(bounded + tiny_train(dir, fast + "train.steps=2 checkpoint.dir=" + copy.string() +
                                                      " checkpoint.resume=" + copy.string()),
                        dir);
        EXPECT_EQ(r.exit_code, 1);
        expect_one_line(r, cases[i].second);
        EXPECT_EQ(contents(copy), before) << "the run directory was changed";
        EXPECT_FALSE(fs::exists(dir / "metrics.jsonl")) << "a metrics file was made";
    }
}

TEST(Faults, AFlippedBitInAPreparedShardIsRefusedBeforeItTrains) {
    fs::path dir = scratch_dir();
    const fs::path text = write_file(dir / "text.txt", std::string(100000, 'a') + std::string(100000, 'b'));
    ASSERT_EQ(run(tpsp_binary + " prepare --tokenizer byte --val-fraction 0.5 " + text.string() + " " +
                      (dir / "out").string(),
                  dir)
                  .exit_code,
              0);
    const fs::path shard = dir / "out" / "train_000000.bin";
    flip_bit(shard, 1024 + 2 * 100);  // 'a' -> '`': a token of the vocabulary still
    const std::string damaged = read_text(shard);
    Outcome r = run(bounded + tiny_train(dir, fast + "train.steps=2 data.train=" + shard.string() +
                                                  " data.val=" + (dir / "out" / "val_000000.bin").string()),
                    dir);
    EXPECT_EQ(r.exit_code, 1);
    expect_one_line(r, "tpsp: error: " + shard.string() + ": damaged: its CRC-32C is ");
    EXPECT_EQ(r.out.find("step "), std::string::npos) << "it trained: " << r.out;
    EXPECT_EQ(read_text(shard), damaged);
}

// Wrong data never trains silently.
TEST(Faults, WrongDataIsOneLineBeforeItTrains) {
    fs::path dir = scratch_dir();
    // a token id at or above the vocabulary: a shard of GPT-2 ids into the byte model
    fs::path shards = dir / "shards";
    fs::create_directories(shards);
    std::vector<uint16_t> tokens(5000, 65);
    tokens[4321] = 65535;
    int header[256] = {20240520, 1, int(tokens.size())};
    std::ofstream(shards / "train_000000.bin", std::ios::binary)
            .write(reinterpret_cast<const char*>(header), sizeof header)
        << std::string(reinterpret_cast<const char*>(tokens.data()), tokens.size() * 2);
    Outcome r = run(bounded + tiny_train(dir, fast + "train.steps=2 data.train=" + (shards / "train_*.bin").string()),
                    dir);
    EXPECT_EQ(r.exit_code, 1);
    expect_one_line(r, "train_000000.bin: token 65535 at offset 4321 is not below model.vocab_size = 256");
    // the validation shard inside the training glob
    r = run(tiny_train(dir, fast + "train.steps=2 train.val_every=1 data.train='" + corpus + "/*.bin'"), dir);
    EXPECT_EQ(r.exit_code, 1);
    expect_one_line(r, "val_000000.bin: this validation shard is also a training shard");
    // a FIFO as a shard or as the config: refused, never read (which would block)
    ASSERT_EQ(mkfifo((dir / "fifo.bin").c_str(), 0600), 0);
    r = run(bounded + tiny_train(dir, fast + "train.steps=2 data.train=" + (dir / "fifo.bin").string()), dir);
    expect_ended_in_time(r);
    expect_one_line(r, "fifo.bin: the token shard is a FIFO, not a regular file");
    r = run(bounded + tpsp_binary + " train " + (dir / "fifo.bin").string(), dir);
    expect_ended_in_time(r);
    expect_one_line(r, "fifo.bin: the config is a FIFO, not a regular file");
    // a key given twice in a config file
    fs::path twice = write_file(dir / "twice.yaml", "train:\n  steps: 5\n  lr: 0.1\n  steps: 6\n");
    r = run(tpsp_binary + " train " + twice.string(), dir);
    EXPECT_EQ(r.exit_code, 1);
    expect_one_line(r, "twice.yaml:4: train.steps is given twice");
}

TEST(Faults, PrepareIntoADirectoryOfShardsIsRefusedUnlessToldToReplaceThem) {
    fs::path dir = scratch_dir();
    fs::path text = write_file(dir / "text.txt", std::string(200000, 'a'));
    const std::string prepare = tpsp_binary + " prepare --tokenizer byte --shard-tokens 20000 --val-fraction 0.5 " +
                                text.string() + " " + (dir / "out").string();
    ASSERT_EQ(run(prepare, dir).exit_code, 0);
    ASSERT_TRUE(fs::exists(dir / "out" / "train_000005.bin"));
    const auto before = contents(dir / "out");
    write_file(text, std::string(50000, 'b'));  // a smaller corpus would leave train_000002.. behind
    Outcome r = run(prepare, dir);
    EXPECT_EQ(r.exit_code, 1);
    expect_one_line(r, "holds 7 shard file(s) of an earlier prepare (train_000000.bin, ...); give --replace");
    EXPECT_EQ(contents(dir / "out"), before) << "the earlier shards are untouched";
    r = run(prepare + " --replace", dir);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_TRUE(fs::exists(dir / "out" / "train_000000.bin"));
    EXPECT_FALSE(fs::exists(dir / "out" / "train_000002.bin")) << "no shard of the earlier corpus is left";
}

// A FIFO, a directory or a device where a file is read: one line naming what
// it is, at once (opening a FIFO would block until a writer came; reading a
// directory would say "truncated").
TEST(Faults, AFifoDirectoryOrDeviceGivenAsAnInputIsOneLineAtOnce) {
    fs::path dir = scratch_dir();
    const fs::path fifo = dir / "fifo.bin", folder = dir / "folder.bin";
    ASSERT_EQ(mkfifo(fifo.c_str(), 0644), 0);
    fs::create_directory(folder);
    const std::vector<std::pair<fs::path, std::string>> specials = {
        {fifo, "a FIFO"}, {folder, "a directory"}, {"/dev/zero", "a device"}};
    for (const auto& [special, kind] : specials) {
        const std::string path = special.string();
        const std::vector<std::pair<std::string, std::string>> commands = {
            {tpsp_binary + " sample " + path + " --tokens 3", "the checkpoint is " + kind},
            {tpsp_binary + " eval " + tiny + " data.val='" + corpus + "/val_*.bin' checkpoint.init=" + path,
             "the checkpoint is " + kind},
            {tiny_train(dir, fast + "train.steps=1 checkpoint.dir= checkpoint.init=" + path),
             "the checkpoint is " + kind},
            {tpsp_binary + " train " + path, "the config is " + kind},
            {tiny_train(dir, fast + "train.steps=1 checkpoint.dir= data.train=" + path), "the token shard is " + kind},
        };
        for (const auto& [command, says] : commands) {
            SCOPED_TRACE(command);
            Outcome r = run(bounded + command, dir);
            expect_ended_in_time(r);
            EXPECT_EQ(r.exit_code, 1);
            expect_one_line(r, path + ": " + says + ", not a regular file");
        }
    }
    // a FIFO as a run directory's `latest`, of a new run's checkpoint.dir and of a resumed one: never read
    fs::path ck = dir / "fifo_run";
    fs::create_directories(ck);
    ASSERT_EQ(mkfifo((ck / "latest").c_str(), 0644), 0);
    for (const auto& [run_args, says] : std::vector<std::pair<std::string, std::string>>{
             {"checkpoint.dir=" + ck.string(), "latest is not a tpsp run's (it names no step)"},
             {"checkpoint.resume=" + ck.string(), "latest: missing or unreadable: not a tpsp run directory"}}) {
        SCOPED_TRACE(run_args);
        Outcome r = run(bounded + tiny_train(dir, fast + "train.steps=2 " + run_args), dir);
        expect_ended_in_time(r);
        EXPECT_EQ(r.exit_code, 1);
        expect_one_line(r, says);
    }
    // a FIFO as the resumed step's state or model file: the ranks' comparison of their inputs opened it (it hung)
    fs::path saved = dir / "saved_run";
    ASSERT_EQ(run(tiny_train(saved, fast + "train.steps=1 checkpoint.dir=" + saved.string()), dir).exit_code, 0);
    for (const char* stem : {"state", "model"}) {
        SCOPED_TRACE(stem);
        const fs::path file = saved / (std::string(stem) + "_00000001.bin");
        fs::rename(file, saved / "kept.bin");
        ASSERT_EQ(mkfifo(file.c_str(), 0644), 0);
        Outcome r = run(bounded + tiny_train(dir, fast + "train.steps=2 checkpoint.dir=" + saved.string() +
                                                      " checkpoint.resume=" + saved.string()),
                        dir);
        expect_ended_in_time(r);
        EXPECT_EQ(r.exit_code, 1);
        expect_one_line(r, file.string() + ": the " + (stem[0] == 's' ? "state file" : "checkpoint") +
                               " is a FIFO, not a regular file");
        fs::remove(file);
        fs::rename(saved / "kept.bin", file);
    }
}

// Sizes from a file or a config are bounded before anything is allocated for them.
TEST(Faults, AHeaderOrConfigBeyondTheLimitsIsOneLineBeforeAnyAllocation) {
    fs::path dir = scratch_dir();
    // a 2 KB file whose header describes GPT-2 124M: its size is checked against the header first
    int header[256] = {20240326, 3, 1024, 50257, 12, 12, 768, 50304};
    std::ofstream(dir / "fake.bin", std::ios::binary).write(reinterpret_cast<const char*>(header), sizeof header)
        << std::string(1000, '\0');
    Outcome r = run(tpsp_binary + " sample " + (dir / "fake.bin").string() + " --tokens 5", dir);
    EXPECT_EQ(r.exit_code, 1);
    expect_one_line(r, "fake.bin: checkpoint is 2024 bytes, its header says 497904640 (truncated)");
    // a header beyond the limits, whose sizes would overflow
    header[6] = 1 << 29, header[5] = 1;
    std::ofstream(dir / "huge.bin", std::ios::binary).write(reinterpret_cast<const char*>(header), sizeof header);
    r = run(tpsp_binary + " sample " + (dir / "huge.bin").string() + " --tokens 5", dir);
    EXPECT_EQ(r.exit_code, 1);
    expect_one_line(r, "huge.bin: checkpoint header describes a model beyond tpsp's limits");
    // a config whose sizes would not fit the kernels' indices
    r = run(tpsp_binary + " memory " + tiny + " model.channels=536870912 model.heads=1", dir);
    EXPECT_EQ(r.exit_code, 1);
    expect_one_line(r, "model.channels: at most 65536");
    r = run(tpsp_binary + " memory " + tiny + " train.batch_size=100000 train.seq_len=100000", dir);
    EXPECT_EQ(r.exit_code, 1);
    expect_one_line(r, "train.batch_size: b·s·max(4h, Vp) = 5120000000000 elements");
}

// ----------------------------------------------------------------------------
// bounds: every key and option is checked on the value the run will use

TEST(Faults, EveryKeyAndOptionIsBoundedByTheValueItWillUse) {
    fs::path dir = scratch_dir();
    auto expect_refused = [&](const std::string& command, const std::string& says) {
        SCOPED_TRACE(command);
        Outcome r = run(bounded + command, dir);
        EXPECT_EQ(r.exit_code, 1) << r.err;
        expect_one_line(r, says);
        expect_ended_in_time(r);
    };
    auto memory = [&](const std::string& extra) { return tpsp_binary + " memory " + tiny + " " + extra; };
    // a float checked as a double and stored as 1.0f: β1 = 1 made NaNs at step 2
    expect_refused(memory("train.beta1=0.999999999"), "train.beta1: must be in [0, 1), got 0.999999999, which is 1");
    expect_refused(memory("model.dropout=0.99999999"), "model.dropout: must be in [0, 1), got 0.99999999, which is 1");
    // no upper bound: 100000 threads crashed, 2^31 − 1 splits hung
    expect_refused(memory("train.threads=100000"), "train.threads: must be at most 1024");
    expect_refused(memory("parallel.tp_comm_num_splits=2147483647"), "parallel.tp_comm_num_splits: must be at most 64");
    expect_refused(memory("model.channels=32 model.heads=4 parallel.tp_comm_num_splits=33"),
                   "parallel.tp_comm_num_splits: 33 is more than model.channels = 32");
    // a link so slow that its delay overflowed into none
    expect_refused(memory("parallel.emulated_link.gbps=1e-30"),
                   "parallel.emulated_link.gbps: 0 (off) or at least 0.001");
    expect_refused(memory("parallel.emulated_link.latency_us=1e7"), "parallel.emulated_link.latency_us: must be in");
    // beyond int and uint64: the range, not "must be ≥ 0" or "expected an integer"
    expect_refused(memory("train.steps=2147483648"), "train.steps: must be at most 2147483647, got 2147483648");
    expect_refused(memory("train.steps=99999999999999999999"), "train.steps: must be at most 2147483647");
    expect_refused(memory("train.seed=18446744073709551616"), "train.seed: must be in [0, 18446744073709551615]");
    expect_refused(memory("train.seed=-1"), "train.seed: must be in [0, 18446744073709551615]");
    Outcome r = run(bounded + tpsp_binary + " sample none.bin --seed 18446744073709551616", dir);
    EXPECT_EQ(r.exit_code, 2) << r.err;  // the command line's: it read 2^64 − 1
    expect_one_line(r, "--seed: must be in [0, 18446744073709551615], got 18446744073709551616");
    r = run(memory("train.seed=18446744073709551615"), dir);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    // a map where no section is, a map for a value, nesting beyond yaml-cpp's depth, a second document
    fs::path nested = write_file(dir / "nested.yaml", "parallel:\n  emulated_link: {a: {b: {c: 1}}}\n");
    expect_refused(tpsp_binary + " memory " + nested.string(),
                   "nested.yaml:2: unknown key parallel.emulated_link.a\n");  // not .a.b.c
    fs::path map_for_value = write_file(dir / "value.yaml", "train:\n  steps: {a: 1}\n");
    expect_refused(tpsp_binary + " memory " + map_for_value.string(),
                   "value.yaml:2: train.steps: expected a single value");
    std::string deep = "parallel:\n  emulated_link: ";
    for (int i = 0; i < 5000; i++) deep += "{a: ";
    deep += "1" + std::string(5000, '}') + "\n";
    fs::path deep_file = write_file(dir / "deep.yaml", deep);
    expect_refused(tpsp_binary + " memory " + deep_file.string(), "deep.yaml:2: malformed YAML: nested too deeply");
    fs::path two = write_file(dir / "two.yaml", "train:\n  steps: 3\n---\ntrain:\n  steps: 4\n");
    expect_refused(tpsp_binary + " memory " + two.string(), "two.yaml:3: a second YAML document begins here");
    // an empty first document, or a `...` before the config: yaml-cpp read the empty one and dropped the config
    fs::path empty_first = write_file(dir / "empty_first.yaml", "---\n---\ntrain:\n  steps: 3\n");
    expect_refused(tpsp_binary + " memory " + empty_first.string(), "empty_first.yaml:2: a second YAML document");
    fs::path end_first = write_file(dir / "end_first.yaml", "# notes\n...\ntrain:\n  steps: 3\n");
    expect_refused(tpsp_binary + " memory " + end_first.string(), "end_first.yaml:3: a second YAML document");
    // a directive after the content: yaml-cpp began a second document there, and dropped it
    fs::path late_directive = write_file(dir / "late.yaml", "model:\n  layers: 1\n%YAML 1.2\ntrain:\n  lr: 0.5\n");
    expect_refused(tpsp_binary + " memory " + late_directive.string(), "late.yaml:3: a second YAML document");
    // a byte order mark and a comment before `---`: one document
    fs::path bom = write_file(dir / "bom.yaml", "\xEF\xBB\xBF# notes\n---\nmodel:\n  layers: 6\n");
    r = run(tpsp_binary + " memory " + bom.string(), dir);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("L=6"), std::string::npos) << r.out;
    // a directive, one `---`, a `...` and a comment after it: one document, read whole
    fs::path directive = write_file(dir / "directive.yaml", "%YAML 1.2\n---\nmodel:\n  layers: 7\n...\n# the end\n");
    r = run(tpsp_binary + " memory " + directive.string(), dir);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("L=7"), std::string::npos) << r.out;
    // the key whose bound it is, not another
    expect_refused(memory("model.max_seq_len=1048577"), "model.max_seq_len: at most 1048576");
    // a switch that has nothing to act on
    expect_refused(memory("parallel.overlap_param_gather=true"),
                   "parallel.overlap_param_gather: needs parallel.distributed_optimizer: true");
    // prepare: a validation share it cannot honour, one input given twice (through a link)
    fs::path text = write_file(dir / "text.txt", std::string(20000, 'a'));
    fs::create_symlink(text, dir / "link.txt");
    const std::string prepare = tpsp_binary + " prepare " + text.string() + " ";
    expect_refused(prepare + (dir / "out").string() + " --tokenizer byte --val-fraction 0.7",
                   "--val-fraction must be in [1e-9, 0.5], got 0.7");
    expect_refused(prepare + (dir / "out").string() + " --tokenizer byte --val-fraction 1e-300",
                   "--val-fraction must be in [1e-9, 0.5]");
    expect_refused(prepare + (dir / "link.txt").string() + " " + (dir / "out").string() + " --tokenizer byte",
                   "link.txt are the same file");
    // more validation batches than the validation set holds were read round and round
    expect_refused(tiny_train(dir, fast + "train.steps=1 train.val_every=1 train.val_batches=1000000"),
                   "train.val_batches: 1000000 is more than the");
}
