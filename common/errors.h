// The errors a user can cause, each worded for one line. main() prints the
// line and exits 1; nothing below train/ prints or exits on its own.
#pragma once
#include <stdexcept>

namespace tpsp {

// A problem with the config or the command line: "FILE:LINE: key: what is wrong".
struct ConfigError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// A problem with a file the user gave or asked for: "FILE: what is wrong".
struct FileError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

}  // namespace tpsp
