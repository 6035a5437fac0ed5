// Reading and writing whole files, for every room that touches the disk
// (checkpoints, token shards, tokenizers, run state).
#pragma once
#include <cstddef>
#include <cstdio>
#include <initializer_list>
#include <string>
#include <vector>

#include "common/errors.h"

namespace tpsp {

// An input must be a regular file (links followed): a directory, a FIFO (whose
// open would block until a writer comes) or a device is a FileError naming
// PATH, WHAT and what it is, before anything opens it.
void check_regular_input(const std::string& path, const std::string& what);

// PATH opened for reading after check_regular_input; a FileError
// "PATH: cannot open WHAT" if it cannot be. The caller closes it.
FILE* open_input_file(const std::string& path, const std::string& what);

// The whole file, read as open_input_file opens it.
std::string read_whole_file(const std::string& path, const std::string& what);

// The names tpsp gives its temporaries, and the only names it ever cleans
// up: NAME.tpsp-tmp.<pid> (AtomicFile) and .tpsp-probe.<pid> (a writability
// probe). No user names a file so; a user's results.tmp.csv is never touched.
inline constexpr const char* temporary_infix = ".tpsp-tmp.";
inline constexpr const char* probe_infix = ".tpsp-probe.";

// A file written as PATH.tpsp-tmp.<pid> and renamed to PATH by commit(): a crash
// (or an error, or never committing) leaves no half-written PATH, and two
// writers never share a temporary. commit() syncs the file before the rename
// and the folder after it, so a committed PATH survives a power cut.
class AtomicFile {
public:
    explicit AtomicFile(const std::string& path);
    ~AtomicFile();  // removes the temporary unless committed
    AtomicFile(const AtomicFile&) = delete;
    AtomicFile& operator=(const AtomicFile&) = delete;
    void write(const void* data, size_t bytes);
    // Allocates `bytes` of disk for the temporary now (posix_fallocate), so
    // that a full disk is found before the work whose product it holds, not
    // after; commit() cuts the file to what was written. A FileError if the
    // space is not there.
    void reserve(size_t bytes);
    // Everything written reaches the disk and the temporary is closed (a
    // FileError if not); commit() then only renames. For several files that
    // must appear together: finish every one, then commit every one.
    void finish();
    void commit();

private:
    std::string path_, tmp_;
    FILE* file_;
    size_t written_ = 0;
    bool ok_ = true, committed_ = false, reserved_ = false;
};

// The parts, one after the other, through an AtomicFile.
struct FilePart {
    const void* data;
    size_t bytes;
};
void write_file_atomically(const std::string& path, std::initializer_list<FilePart> parts);

// Whether a file name is one of tpsp's temporaries: it ends in
// temporary_infix or probe_infix followed by a pid (digits only).
bool is_temporary_name(const std::string& name);
// Whether it is one whose writer has ended: a temporary of a live process
// (another run writing its trace into this directory) is that run's.
bool is_stale_temporary_name(const std::string& name);

// Creates the directory DIR (and its parents) and proves it writable by
// creating, writing and removing a probe file in it (.tpsp-probe.<pid>); a FileError names DIR
// and what failed.
void make_writable_directory(const std::string& dir, const std::string& what);

// PATH will be written as a whole file or a log: PATH, if it exists, must
// be a regular file, and its directory is made writable (above).
void check_writable_file(const std::string& path, const std::string& what);

// A file a command reads or writes, and the key or option that names it.
struct NamedFile {
    std::string path;
    std::string named_by;  // "logging.metrics", "data.train", ...
};

// PATH with every link followed, a dangling one too (a write through it
// creates its target), and made absolute and normal: where PATH really is.
std::string resolved_path(const std::string& path);

// Whether two paths name one file: the same device and inode where both
// exist (links resolved), else the same resolved_path (an output that does
// not exist yet, or a dangling link to one).
bool same_file(const std::string& a, const std::string& b);

// Every output compared with every input and with every other output, before
// anything is written: a collision is a ConfigError naming both keys and the
// file. Writing an output must never destroy what the command reads.
void check_outputs_apart(const std::vector<NamedFile>& inputs, const std::vector<NamedFile>& outputs);

}  // namespace tpsp
