#include "common/files.h"

#include <fstream>
#include <sstream>

namespace tpsp {

std::string read_whole_file(const std::string& path, const std::string& what) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw FileError(path + ": cannot open " + what);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

AtomicFile::AtomicFile(const std::string& path) : path_(path), tmp_(path + ".tmp") {
    file_ = std::fopen(tmp_.c_str(), "wb");
    if (!file_) throw FileError(tmp_ + ": cannot open for writing");
}

AtomicFile::~AtomicFile() {
    if (file_) std::fclose(file_);
    if (!committed_) std::remove(tmp_.c_str());
}

void AtomicFile::write(const void* data, size_t bytes) { ok_ = ok_ && std::fwrite(data, 1, bytes, file_) == bytes; }

void AtomicFile::commit() {
    ok_ = std::fflush(file_) == 0 && ok_;
    ok_ = std::fclose(file_) == 0 && ok_;
    file_ = nullptr;
    if (!ok_) throw FileError(tmp_ + ": write failed (disk full?)");
    if (std::rename(tmp_.c_str(), path_.c_str()) != 0)
        throw FileError(path_ + ": cannot rename " + tmp_ + " into place");
    committed_ = true;
}

void write_file_atomically(const std::string& path, std::initializer_list<FilePart> parts) {
    AtomicFile file(path);
    for (const FilePart& part : parts) file.write(part.data, part.bytes);
    file.commit();
}

}  // namespace tpsp
