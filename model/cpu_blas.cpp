#include "model/cpu_blas.h"

#include <cblas.h>
#include <cpuid.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "model/kernels/cpu_kernels.h"

namespace tpsp {

const char* kernel_set_name(KernelSet set) {
    switch (set) {
    case KernelSet::sse: return "SSE";
    case KernelSet::avx: return "AVX";
    case KernelSet::avx2: return "AVX2";
    case KernelSet::avx512: return "AVX-512";
    default: return "unknown";
    }
}

// The register state the operating system saves (XCR0): AVX needs XMM and YMM,
// AVX-512 also the opmask and the upper ZMM registers.
static uint64_t saved_register_state() {
    uint32_t eax = 0, edx = 0;
    __asm__("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
    return uint64_t(edx) << 32 | eax;
}

CpuFeatures cpu_features() {
    CpuFeatures cpu;
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return cpu;
    const bool osxsave = c & (1u << 27);
    const uint64_t state = osxsave ? saved_register_state() : 0;
    const bool ymm = (state & 0x6) == 0x6, zmm = (state & 0xe6) == 0xe6;
    cpu.avx = ymm && (c & (1u << 28));
    cpu.fma = ymm && (c & (1u << 12));
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return cpu;
    cpu.avx2 = cpu.avx && (b & (1u << 5));
    const uint32_t f = 1u << 16, dq = 1u << 17, bw = 1u << 30, vl = 1u << 31;
    cpu.avx512 = zmm && (b & f) && (b & dq) && (b & bw) && (b & vl);
    return cpu;
}

std::string cpu_model_name() {
    std::ifstream in("/proc/cpuinfo");
    for (std::string line; std::getline(in, line);)
        if (line.rfind("model name", 0) == 0 && line.find(':') != std::string::npos)
            return line.substr(line.find(':') + 2);
    return "unknown CPU";
}

KernelSet widest_kernel_set(const CpuFeatures& cpu) {
    if (cpu.avx512) return KernelSet::avx512;
    if (cpu.avx2 && cpu.fma) return KernelSet::avx2;
    if (cpu.avx) return KernelSet::avx;
    return KernelSet::sse;
}

const char* openblas_core_for(KernelSet set) {
    switch (set) {
    case KernelSet::avx512: return "SkylakeX";
    case KernelSet::avx2: return "Haswell";
    case KernelSet::avx: return "Sandybridge";
    default: return "";
    }
}

KernelSet kernel_set_of_openblas_core(const std::string& core) {
    std::string name;
    for (char c : core) name += char(std::tolower(static_cast<unsigned char>(c)));
    for (const char* n : {"skylakex", "cooperlake", "sapphirerapids"})
        if (name == n) return KernelSet::avx512;
    for (const char* n : {"haswell", "zen", "excavator"})
        if (name == n) return KernelSet::avx2;
    for (const char* n : {"sandybridge", "bulldozer", "piledriver", "steamroller"})
        if (name == n) return KernelSet::avx;
    for (const char* n : {"prescott", "core2", "penryn", "dunnington", "nehalem", "atom", "barcelona", "opteron",
                          "opteron_sse3", "katmai", "coppermine", "northwood", "banias", "yonah", "nano"})
        if (name == n) return KernelSet::sse;
    return KernelSet::unknown;
}

BlasKernelChoice choose_blas_kernels(const CpuFeatures& cpu, const std::string& chosen, const char* user_coretype) {
    if (user_coretype && *user_coretype)
        return {"", std::string("OPENBLAS_CORETYPE=") + user_coretype + " from the environment"};
    const KernelSet have = kernel_set_of_openblas_core(chosen), best = widest_kernel_set(cpu);
    if (have == KernelSet::unknown) return {"", "OpenBLAS's own choice (a core tpsp does not rank)"};
    if (int(have) >= int(best)) return {"", "OpenBLAS's own choice"};
    return {openblas_core_for(best),
            std::string("chosen by tpsp: OpenBLAS took this ") + kernel_set_name(best) + " CPU for " + chosen};
}

std::string openblas_core() { return openblas_get_corename(); }

std::string blas_kernels_description() {
    const std::string core = openblas_core();
    std::string reason;
    if (const char* ours = std::getenv("TPSP_BLAS_KERNELS_REASON")) reason = ours;  // set before the re-run
    else reason = choose_blas_kernels(cpu_features(), core, std::getenv("OPENBLAS_CORETYPE")).reason;
    const std::string openblas = "OpenBLAS " + core + " kernels (" +
                                 kernel_set_name(kernel_set_of_openblas_core(core)) + "; " + reason + ")";
    const std::string linears = linear_gemm_library();
    if (linears == "OpenBLAS") return openblas;
    return "linears: " + linears + "; attention: " + openblas;
}

void run_with_the_widest_blas_kernels(char** argv) {
    const char* setting = std::getenv("TPSP_BLAS_KERNELS");
    if ((setting && std::strcmp(setting, "keep") == 0) || std::getenv("TPSP_BLAS_KERNELS_REASON")) return;
    const BlasKernelChoice choice = choose_blas_kernels(cpu_features(), openblas_core(),
                                                        std::getenv("OPENBLAS_CORETYPE"));
    if (choice.core.empty()) return;
    setenv("OPENBLAS_CORETYPE", choice.core.c_str(), 1);
    setenv("TPSP_BLAS_KERNELS_REASON", choice.reason.c_str(), 1);
    execv("/proc/self/exe", argv);  // returns only if it failed: then run on as we are
    unsetenv("OPENBLAS_CORETYPE");
    unsetenv("TPSP_BLAS_KERNELS_REASON");
    std::fprintf(stderr, "tpsp: note: could not restart with OPENBLAS_CORETYPE=%s; running OpenBLAS's %s kernels\n",
                 choice.core.c_str(), openblas_core().c_str());
}

double measure_sgemm_flops(GemmLibrary library) {
    const int n = 1024;
    std::vector<float> a(size_t(n) * n, 0.5f), b(size_t(n) * n, 0.25f), c(size_t(n) * n);
    double best = 1e30;
    for (int rep = 0; rep < 11; rep++) {
        const auto start = std::chrono::steady_clock::now();
        if (library == GemmLibrary::linears)
            linear_sgemm(false, true, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
        else
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f,
                        c.data(), n);
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        if (rep > 0) best = std::min(best, seconds);  // the first warms up
    }
    return 2.0 * n * n * n / best;
}

// ~/.cache/tpsp/sgemm_peak: one line per CPU model and thread count, "threads<TAB>GFLOP/s<TAB>model".
static std::filesystem::path held_peak_file() {
    const char* cache = std::getenv("XDG_CACHE_HOME");
    const char* home = std::getenv("HOME");
    if (cache && *cache) return std::filesystem::path(cache) / "tpsp" / "sgemm_peak";
    if (home && *home) return std::filesystem::path(home) / ".cache" / "tpsp" / "sgemm_peak";
    return {};
}

double held_sgemm_peak(double measured_now, int threads) {
    const std::filesystem::path file = held_peak_file();
    if (file.empty()) return measured_now;
    const std::string model = cpu_model_name();
    std::vector<std::string> others;
    double held = 0.0;
    std::ifstream in(file);
    for (std::string line; std::getline(in, line);) {
        std::istringstream fields(line);
        int t = 0;
        double gflops = 0.0;
        std::string rest;
        if (fields >> t >> gflops && std::getline(fields >> std::ws, rest) && t == threads && rest == model)
            held = std::max(held, gflops * 1e9);
        else if (!line.empty()) others.push_back(line);
    }
    if (measured_now <= held) return held;
    std::error_code ec;
    std::filesystem::create_directories(file.parent_path(), ec);
    const std::string tmp = file.string() + "." + std::to_string(getpid());
    std::ofstream out(tmp);
    for (const std::string& line : others) out << line << "\n";
    out << threads << "\t" << measured_now / 1e9 << "\t" << model << "\n";
    out.close();
    if (out) std::filesystem::rename(tmp, file, ec);  // atomic: ranks may race, none sees half a file
    else std::filesystem::remove(tmp, ec);
    return measured_now;
}

int measure_every_kernel_set(const char* self, int threads) {
    const CpuFeatures cpu = cpu_features();
    std::printf("%s, %d threads: sgemm 1024³, best of ten after a warm-up\n", cpu_model_name().c_str(), threads);
    double best = 0.0;
    for (KernelSet set : {KernelSet::avx, KernelSet::avx2, KernelSet::avx512}) {
        if (int(set) > int(widest_kernel_set(cpu))) break;
        const std::string command = std::string("OPENBLAS_CORETYPE=") + openblas_core_for(set) +
                                    " TPSP_BLAS_KERNELS=keep OMP_NUM_THREADS=" + std::to_string(threads) + " '" + self +
                                    "' blas-peak --this-process";
        FILE* child = popen(command.c_str(), "r");
        double gflops = 0.0;
        if (!child || std::fscanf(child, "%lf", &gflops) != 1) gflops = 0.0;
        if (child) pclose(child);
        std::printf("  %-8s (OpenBLAS %-11s) %8.1f GFLOP/s\n", kernel_set_name(set), openblas_core_for(set), gflops);
        best = std::max(best, gflops * 1e9);
    }
    if (linear_gemm_library() != "OpenBLAS") {  // oneDNN chooses its own kernels, in this process as in any
        const double flops = measure_sgemm_flops(GemmLibrary::linears);
        std::printf("  %s: %.1f GFLOP/s\n", linear_gemm_library().c_str(), flops / 1e9);
        best = std::max(best, flops);
    }
    const double held = held_sgemm_peak(best, threads);
    std::printf("held for this machine: %.1f GFLOP/s (the denominator of MFU on the CPU)\n", held / 1e9);
    return best > 0.0 ? 0 : 1;
}

}  // namespace tpsp
