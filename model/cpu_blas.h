// Which GEMM kernels the CPU backend runs, and the sgemm rate its
// utilization (MFU) is measured against.
//
// OpenBLAS picks its kernels once, when it is loaded, from the CPU it
// recognises; a CPU newer than the library (Debian's 0.3.21 on some Xeons
// with AVX-512 and AMX) is taken for "Prescott" and runs SSE3 kernels, 3–8×
// slower. The choice can be corrected only before the library loads, through
// OPENBLAS_CORETYPE: main() asks for the widest kernel set the CPU supports
// and, where OpenBLAS chose a narrower one, runs itself again with that
// variable set. A user's own OPENBLAS_CORETYPE is respected.
#pragma once
#include <string>
#include <vector>

namespace tpsp {

// GEMM kernel families of x86-64, narrowest to widest.
enum class KernelSet { unknown, sse, avx, avx2, avx512 };
const char* kernel_set_name(KernelSet set);  // "SSE", "AVX", "AVX2", "AVX-512"

// What the CPU and the operating system support (cpuid, and xgetbv for the registers' state).
struct CpuFeatures {
    bool avx = false, avx2 = false, fma = false;
    bool avx512 = false;  // F, DQ, BW and VL, the set OpenBLAS's SkylakeX kernels use
};
CpuFeatures cpu_features();
std::string cpu_model_name();  // /proc/cpuinfo's "model name", or "unknown CPU"

// The widest kernel set the features allow, and OpenBLAS's name for its kernels of that set.
KernelSet widest_kernel_set(const CpuFeatures& cpu);
const char* openblas_core_for(KernelSet set);  // "SkylakeX", "Haswell", "Sandybridge"; "" for sse/unknown
// The kernel set of one of OpenBLAS's core names ("Prescott" → sse, "Zen" → avx2, ...).
KernelSet kernel_set_of_openblas_core(const std::string& core);

struct BlasKernelChoice {
    std::string core;    // OPENBLAS_CORETYPE to run with; "" to keep what OpenBLAS chose
    std::string reason;  // one line for the start-up banner
};
// The decision, apart from the machine: `chosen` is OpenBLAS's own core name,
// `user_coretype` the OPENBLAS_CORETYPE of the environment (null when unset).
BlasKernelChoice choose_blas_kernels(const CpuFeatures& cpu, const std::string& chosen, const char* user_coretype);

// OpenBLAS's name for the kernels it runs in this process, and a line for the
// banners: "OpenBLAS SkylakeX kernels (AVX-512; chosen by tpsp: OpenBLAS took this CPU for Prescott)".
std::string openblas_core();
std::string blas_kernels_description();

// main(), before anything else: where OpenBLAS runs narrower kernels than the
// CPU supports and the user did not choose them, runs this program again
// (same arguments) with OPENBLAS_CORETYPE set. TPSP_BLAS_KERNELS=keep turns it off.
void run_with_the_widest_blas_kernels(char** argv);

// sgemm FLOP/s of this process's OpenBLAS kernels, or of the library the
// linears run (linear_sgemm: oneDNN where built with it), on OpenMP's
// threads: 1024³, best of ten after a warm-up.
enum class GemmLibrary { openblas, linears };
double measure_sgemm_flops(GemmLibrary library);
// The denominator of the CPU's MFU: the best sgemm rate held for this machine
// and thread count (best over every kernel set `tpsp blas-peak` measured, and
// over every run), raised by `measured_now` and kept if that is higher. A slow
// library or a loaded moment cannot lower it, and a step cannot beat it.
double held_sgemm_peak(double measured_now, int threads);
// `tpsp blas-peak`: sgemm on every OpenBLAS kernel set this CPU supports
// (each in a child process started with its OPENBLAS_CORETYPE) and on
// oneDNN, printed; the best is held.
int measure_every_kernel_set(const char* self, int threads);

}  // namespace tpsp
