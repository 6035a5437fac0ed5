// Which shared library a symbol was loaded from: what `tpsp versions` prints
// beside each version, so that a log says which cuDNN or NCCL actually ran,
// not which one the build was configured with.
#pragma once
#include <string>

namespace tpsp {

// The path of the loaded object that defines `symbol` (the executable
// itself when it is linked in statically); "" when no loaded object has it.
// `library`: look only in that already-loaded library (by soname), for one
// that was opened privately (libcuda, which the CUDA runtime dlopens).
std::string library_file_of(const char* symbol, const char* library = nullptr);

}  // namespace tpsp
