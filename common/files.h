// Reading and writing whole files, for every room that touches the disk
// (checkpoints, token shards, tokenizers, run state).
#pragma once
#include <cstddef>
#include <cstdio>
#include <initializer_list>
#include <string>

#include "common/errors.h"

namespace tpsp {

// The whole file; if it cannot be opened, a FileError "PATH: cannot open WHAT".
std::string read_whole_file(const std::string& path, const std::string& what);

// A file written as PATH.tmp.<pid> and renamed to PATH by commit(): a crash
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
    void commit();

private:
    std::string path_, tmp_;
    FILE* file_;
    bool ok_ = true, committed_ = false;
};

// The parts, one after the other, through an AtomicFile.
struct FilePart {
    const void* data;
    size_t bytes;
};
void write_file_atomically(const std::string& path, std::initializer_list<FilePart> parts);

// Whether a file name is a temporary: AtomicFile's NAME.tmp.<pid> (or
// NAME.tmp, as earlier versions named them), or a writability probe.
bool is_temporary_name(const std::string& name);

// Creates the directory DIR (and its parents) and proves it writable by
// creating, writing and removing a probe file in it (.probe.tmp.<pid>); a FileError names DIR
// and what failed.
void make_writable_directory(const std::string& dir, const std::string& what);

// PATH will be written as a whole file or a log: PATH, if it exists, must
// be a regular file, and its directory is made writable (above).
void check_writable_file(const std::string& path, const std::string& what);

}  // namespace tpsp
