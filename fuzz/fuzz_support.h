// What every fuzz target shares: the bytes libFuzzer hands over, written to a
// file in a directory of this process's own, for the reader under test to
// open as it opens a user's file.
#pragma once
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

namespace tpsp::fuzz {

inline const std::filesystem::path& scratch() {
    static const std::filesystem::path dir = [] {
        std::filesystem::path d = std::filesystem::temp_directory_path() / ("tpsp_fuzz_" + std::to_string(getpid()));
        std::filesystem::create_directories(d);
        return d;
    }();
    return dir;
}

inline std::string write_input(const std::string& name, std::string_view bytes) {
    const std::filesystem::path path = scratch() / name;
    std::ofstream(path, std::ios::binary | std::ios::trunc).write(bytes.data(), std::streamsize(bytes.size()));
    return path.string();
}

inline std::string_view as_text(const uint8_t* data, size_t size) {
    return {reinterpret_cast<const char*>(data), size};
}

}  // namespace tpsp::fuzz
