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

// A file written as PATH.tmp and renamed to PATH by commit(): a crash (or an
// error, or never committing) leaves no half-written PATH.
class AtomicFile {
public:
    explicit AtomicFile(const std::string& path);
    ~AtomicFile();  // removes PATH.tmp unless committed
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

}  // namespace tpsp
