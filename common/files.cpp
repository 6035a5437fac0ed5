#include "common/files.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
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

void check_regular_input(const std::string& path, const std::string& what) {
    struct stat status {};
    if (::stat(path.c_str(), &status) != 0) return;  // the open that follows says why it cannot
    if (S_ISREG(status.st_mode)) return;
    const char* kind = S_ISDIR(status.st_mode)    ? "a directory"
                       : S_ISFIFO(status.st_mode) ? "a FIFO"
                       : S_ISSOCK(status.st_mode) ? "a socket"
                                                  : "a device";
    throw FileError(path + ": the " + what + " is " + kind + ", not a regular file");
}

FILE* open_input_file(const std::string& path, const std::string& what) {
    check_regular_input(path, what);
    FILE* f = std::fopen(path.c_str(), "rb");
    if (!f) throw FileError(path + ": cannot open " + what);
    return f;
}

std::string read_whole_file(const std::string& path, const std::string& what) {
    check_regular_input(path, what);
    std::ifstream in(path, std::ios::binary);
    if (!in) throw FileError(path + ": cannot open " + what);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

AtomicFile::AtomicFile(const std::string& path)
    : path_(path), tmp_(path + temporary_infix + std::to_string(::getpid())) {
    file_ = std::fopen(tmp_.c_str(), "wb");
    if (!file_) throw FileError(tmp_ + ": cannot open for writing (" + std::strerror(errno) + ")");
}

AtomicFile::~AtomicFile() {
    if (file_) std::fclose(file_);
    if (!committed_) std::remove(tmp_.c_str());
}

void AtomicFile::write(const void* data, size_t bytes) {
    ok_ = ok_ && std::fwrite(data, 1, bytes, file_) == bytes;
    written_ += bytes;
}

void AtomicFile::reserve(size_t bytes) {
    const int error = ::posix_fallocate(::fileno(file_), 0, off_t(bytes));
    if (error != 0)
        throw FileError(path_ + ": cannot reserve the " + std::to_string(bytes >> 20) + " MiB it may need (" +
                        std::strerror(error) + ")");
    reserved_ = true;
}

void AtomicFile::finish() {
    if (file_) {
        ok_ = std::fflush(file_) == 0 && ok_;
        if (reserved_) ok_ = ok_ && ::ftruncate(::fileno(file_), off_t(written_)) == 0;  // the reserve's unused tail
        ok_ = ok_ && ::fsync(::fileno(file_)) == 0;  // the bytes on disk before the name points at them
        ok_ = std::fclose(file_) == 0 && ok_;
        file_ = nullptr;
    }
    if (!ok_) throw FileError(tmp_ + ": write failed (disk full?)");
}

void AtomicFile::commit() {
    finish();
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

// The pid a temporary's name ends in, or -1 for a name that is no temporary.
static long temporary_owner(const std::string& name) {
    for (const char* infix : {temporary_infix, probe_infix}) {
        const size_t at = name.rfind(infix);
        if (at == std::string::npos) continue;
        const std::string pid = name.substr(at + std::strlen(infix));
        if (!pid.empty() && pid.size() < 10 &&
            std::all_of(pid.begin(), pid.end(), [](char c) { return c >= '0' && c <= '9'; }))
            return std::stol(pid);
    }
    return -1;
}

bool is_temporary_name(const std::string& name) { return temporary_owner(name) >= 0; }

bool is_stale_temporary_name(const std::string& name) {
    const long pid = temporary_owner(name);
    if (pid < 0) return false;
    return pid == 0 || (::kill(pid_t(pid), 0) != 0 && errno == ESRCH);  // no such process
}

void make_writable_directory(const std::string& dir, const std::string& what) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) throw FileError(dir + ": cannot create the " + what + " directory (" + ec.message() + ")");
    if (!std::filesystem::is_directory(dir)) throw FileError(dir + ": the " + what + " directory is not a directory");
    const std::string probe = dir + "/" + probe_infix + std::to_string(::getpid());  // a crash leaves a temporary
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

std::string resolved_path(const std::string& path) {
    namespace fs = std::filesystem;
    std::error_code ec;
    fs::path p = path;
    // a link whose target does not exist yet is where a write through it goes: follow it by hand
    for (int hops = 0; hops < 40 && fs::is_symlink(fs::symlink_status(p, ec)); hops++) {
        const fs::path target = fs::read_symlink(p, ec);
        if (ec) break;
        p = target.is_absolute() ? target : p.parent_path() / target;
    }
    // absolute first: "o.json" and "./o.json", not yet there, are one file
    const fs::path absolute = fs::absolute(p, ec);
    const fs::path resolved = ec ? p : fs::weakly_canonical(absolute, ec);
    return ec ? absolute.string() : resolved.string();
}

bool same_file(const std::string& a, const std::string& b) {
    namespace fs = std::filesystem;
    std::error_code ec_a, ec_b;
    const bool both_exist = fs::exists(a, ec_a) && fs::exists(b, ec_b);
    if (both_exist) return fs::equivalent(a, b, ec_a);
    return resolved_path(a) == resolved_path(b);
}

void check_outputs_apart(const std::vector<NamedFile>& inputs, const std::vector<NamedFile>& outputs) {
    for (size_t o = 0; o < outputs.size(); o++) {
        const NamedFile& out = outputs[o];
        for (const NamedFile& in : inputs)
            if (same_file(out.path, in.path))
                throw ConfigError(out.named_by + ": " + out.path + " is also read by this run (" + in.named_by + ": " +
                                  in.path + "): writing it would destroy an input; choose another file");
        for (size_t other = 0; other < o; other++)
            if (same_file(out.path, outputs[other].path))
                throw ConfigError(out.named_by + ": " + out.path + " is also written as " + outputs[other].named_by +
                                  " (" + outputs[other].path + "): give each output a file of its own");
    }
}

}  // namespace tpsp
