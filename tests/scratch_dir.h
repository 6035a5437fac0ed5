// A fresh directory per test, under the build tree (TPSP_SCRATCH, which each
// test binary that includes this defines).
#pragma once
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

namespace tpsp::testing {

inline std::filesystem::path scratch_dir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::filesystem::path dir = std::filesystem::path(TPSP_SCRATCH) /
                                (std::string(info->test_suite_name()) + "." + info->name());
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    return dir;
}

}  // namespace tpsp::testing
