// The choice of OpenBLAS's kernels for a CPU (the decision, apart from the
// machine it runs on), and the sgemm peak held per machine.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "model/cpu_blas.h"

using namespace tpsp;

namespace {

CpuFeatures with_avx512() { return {true, true, true, true}; }
CpuFeatures with_avx2() { return {true, true, true, false}; }
CpuFeatures with_avx() { return {true, false, false, false}; }
CpuFeatures sse_only() { return {}; }

}  // namespace

TEST(BlasKernels, OpenBlasCoreNamesRankByTheirWidestVectors) {
    EXPECT_EQ(kernel_set_of_openblas_core("Prescott"), KernelSet::sse);
    EXPECT_EQ(kernel_set_of_openblas_core("Nehalem"), KernelSet::sse);
    EXPECT_EQ(kernel_set_of_openblas_core("Sandybridge"), KernelSet::avx);
    EXPECT_EQ(kernel_set_of_openblas_core("Haswell"), KernelSet::avx2);
    EXPECT_EQ(kernel_set_of_openblas_core("ZEN"), KernelSet::avx2);  // as OPENBLAS_CORETYPE may spell it
    EXPECT_EQ(kernel_set_of_openblas_core("SkylakeX"), KernelSet::avx512);
    EXPECT_EQ(kernel_set_of_openblas_core("Cooperlake"), KernelSet::avx512);
    EXPECT_EQ(kernel_set_of_openblas_core("ARMV8"), KernelSet::unknown);
}

TEST(BlasKernels, AnAvx512CpuTakenForPrescottGetsSkylakeXKernels) {
    // the Xeon of family 6 model 207 that Debian's OpenBLAS 0.3.21 does not know
    const BlasKernelChoice choice = choose_blas_kernels(with_avx512(), "Prescott", nullptr);
    EXPECT_EQ(choice.core, "SkylakeX");
    EXPECT_NE(choice.reason.find("Prescott"), std::string::npos) << choice.reason;
    EXPECT_EQ(choose_blas_kernels(with_avx512(), "Haswell", nullptr).core, "SkylakeX");
}

TEST(BlasKernels, EachCpuGetsTheWidestKernelsItSupports) {
    EXPECT_EQ(choose_blas_kernels(with_avx2(), "Prescott", nullptr).core, "Haswell");
    EXPECT_EQ(choose_blas_kernels(with_avx(), "Prescott", nullptr).core, "Sandybridge");
    EXPECT_EQ(choose_blas_kernels(with_avx2(), "Sandybridge", nullptr).core, "Haswell");
    CpuFeatures avx2_without_fma = with_avx2();
    avx2_without_fma.fma = false;  // OpenBLAS's Haswell kernels are FMA kernels
    EXPECT_EQ(choose_blas_kernels(avx2_without_fma, "Prescott", nullptr).core, "Sandybridge");
}

TEST(BlasKernels, AGoodChoiceOfOpenBlasIsKept) {
    EXPECT_EQ(choose_blas_kernels(with_avx512(), "SkylakeX", nullptr).core, "");
    EXPECT_EQ(choose_blas_kernels(with_avx512(), "Cooperlake", nullptr).core, "");
    EXPECT_EQ(choose_blas_kernels(with_avx2(), "Zen", nullptr).core, "");
    EXPECT_EQ(choose_blas_kernels(sse_only(), "Prescott", nullptr).core, "");           // nothing wider to run
    EXPECT_EQ(choose_blas_kernels(with_avx512(), "SomeFutureCore", nullptr).core, "");  // not ranked: not touched
}

TEST(BlasKernels, TheUsersOpenblasCoretypeIsRespected) {
    const BlasKernelChoice choice = choose_blas_kernels(with_avx512(), "Prescott", "Haswell");
    EXPECT_EQ(choice.core, "");
    EXPECT_NE(choice.reason.find("OPENBLAS_CORETYPE=Haswell"), std::string::npos) << choice.reason;
}

TEST(BlasKernels, TheHeldSgemmPeakRisesAndNeverFalls) {
    const std::filesystem::path cache = std::filesystem::temp_directory_path() / "tpsp_held_peak_test";
    std::filesystem::remove_all(cache);
    const char* before = std::getenv("XDG_CACHE_HOME");
    const std::string saved = before ? before : "";
    setenv("XDG_CACHE_HOME", cache.c_str(), 1);
    EXPECT_EQ(held_sgemm_peak(100e9, 2), 100e9);  // the first measurement is held
    EXPECT_EQ(held_sgemm_peak(40e9, 2), 100e9);   // a slow moment (or slow kernels) does not lower it
    EXPECT_EQ(held_sgemm_peak(150e9, 2), 150e9);  // a better one raises it
    EXPECT_EQ(held_sgemm_peak(10e9, 1), 10e9);    // another thread count is held apart
    EXPECT_EQ(held_sgemm_peak(20e9, 2), 150e9);
    if (before) setenv("XDG_CACHE_HOME", saved.c_str(), 1);
    else unsetenv("XDG_CACHE_HOME");
    std::filesystem::remove_all(cache);
}
