#include "common/files.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace tpsp {

namespace {

std::string folder_of(const std::string& path) {
    const std::string parent = std::filesystem::path(path).parent_path().string();
    return parent.empty() ? "." : parent;
}

// fsync of a folder: makes a rename inside it durable.
bool sync_directory(const std::string& dir) {
    const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
    if (fd < 0) return false;
    const bool ok = ::fsync(fd) == 0;
    return ::close(fd) == 0 && ok;
}

}  // namespace

std::string read_whole_file(const std::string& path, const std::string& what) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw FileError(path + ": cannot open " + what);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

AtomicFile::AtomicFile(const std::string& path) : path_(path), tmp_(path + ".tmp." + std::to_string(::getpid())) {
    file_ = std::fopen(tmp_.c_str(), "wb");
    if (!file_) throw FileError(tmp_ + ": cannot open for writing (" + std::strerror(errno) + ")");
}

AtomicFile::~AtomicFile() {
    if (file_) std::fclose(file_);
    if (!committed_) std::remove(tmp_.c_str());
}

void AtomicFile::write(const void* data, size_t bytes) { ok_ = ok_ && std::fwrite(data, 1, bytes, file_) == bytes; }

void AtomicFile::commit() {
    ok_ = std::fflush(file_) == 0 && ok_;
    ok_ = ok_ && ::fsync(::fileno(file_)) == 0;  // the bytes on disk before the name points at them
    ok_ = std::fclose(file_) == 0 && ok_;
    file_ = nullptr;
    if (!ok_) throw FileError(tmp_ + ": write failed (disk full?)");
    if (std::rename(tmp_.c_str(), path_.c_str()) != 0)
        throw FileError(path_ + ": cannot rename " + tmp_ + " into place");
    committed_ = true;
    if (!sync_directory(folder_of(path_))) throw FileError(folder_of(path_) + ": cannot sync the folder");
}

void write_file_atomically(const std::string& path, std::initializer_list<FilePart> parts) {
    AtomicFile file(path);
    for (const FilePart& part : parts) file.write(part.data, part.bytes);
    file.commit();
}

bool is_temporary_name(const std::string& name) {
    return name.find(".tmp.") != std::string::npos || name.ends_with(".tmp");
}

void make_writable_directory(const std::string& dir, const std::string& what) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) throw FileError(dir + ": cannot create the " + what + " directory (" + ec.message() + ")");
    if (!std::filesystem::is_directory(dir)) throw FileError(dir + ": the " + what + " directory is not a directory");
    const std::string probe = dir + "/.probe.tmp." + std::to_string(::getpid());  // a crash leaves a temporary
    FILE* f = std::fopen(probe.c_str(), "wb");
    if (!f) throw FileError(dir + ": the " + what + " directory is not writable (" + std::strerror(errno) + ")");
    const bool written = std::fputc('\n', f) != EOF && std::fflush(f) == 0;
    const int write_errno = errno;
    const bool closed = std::fclose(f) == 0;
    std::remove(probe.c_str());
    if (!written || !closed)
        throw FileError(dir + ": cannot write in the " + what + " directory (" + std::strerror(write_errno) + ")");
}

void check_writable_file(const std::string& path, const std::string& what) {
    std::error_code ec;
    const auto status = std::filesystem::status(path, ec);
    if (std::filesystem::exists(status) && !std::filesystem::is_regular_file(status))
        throw FileError(path + ": the " + what + " file must be a regular file");
    make_writable_directory(folder_of(path), what);
}

}  // namespace tpsp
