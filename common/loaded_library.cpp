#include "common/loaded_library.h"

#include <dlfcn.h>

namespace tpsp {

std::string library_file_of(const char* symbol, const char* library) {
    void* handle = RTLD_DEFAULT;  // (a null pointer: every loaded object, in load order)
    if (library && !(handle = dlopen(library, RTLD_LAZY | RTLD_NOLOAD))) return "";
    void* address = dlsym(handle, symbol);
    Dl_info info{};
    const bool found = address && dladdr(address, &info) && info.dli_fname;
    if (library) dlclose(handle);  // only drops the reference RTLD_NOLOAD took
    return found ? info.dli_fname : "";
}

}  // namespace tpsp
