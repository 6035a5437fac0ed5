// CRC-32C (Castagnoli: reflected polynomial 0x82F63B78, initial value and
// final xor 0xFFFFFFFF; the checksum of iSCSI, ext4 and RocksDB) over every
// file tpsp writes, and where each file records it.
//
// llm.c's files (model, token shard, tokenizer) begin with a header of 256
// 32-bit words, of which llm.c reads at most the first eight. tpsp records
// the file's checksum in the last two, which llm.c never reads:
//
//   header[254] = llmc_checksum_tag   ("C32C" in the file: a CRC-32C follows)
//   header[255] = CRC-32C of the whole file, read with header[255] as 0:
//                 header[0..254], 0, then the payload
//
// so the file keeps llm.c's layout and size (1024 + payload) byte for byte
// in every other place. A header whose two words are 0, as llm.c and its
// scripts write them, records no checksum: the file is read as before,
// unverified. Any other pair without the tag is damage.
// tpsp's own state file records its checksum after its last byte
// (train/run_checkpoint.h).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace tpsp {

// The CRC-32C of bytes given in any number of pieces: update() with each
// piece in order, value() at any point (the CRC of everything so far).
// Slicing-by-8: eight tables of 256 entries take 8 bytes per step.
class Crc32c {
public:
    Crc32c& update(const void* data, size_t bytes);
    uint32_t value() const { return ~state_; }

private:
    uint32_t state_ = 0xFFFFFFFFu;
};

inline uint32_t crc32c(const void* data, size_t bytes) { return Crc32c().update(data, bytes).value(); }

// The CRC-32C of the first `bytes` bytes of the file PATH, read in pieces; a
// FileError naming PATH if they cannot be read.
uint32_t crc32c_of_file(const std::string& path, uint64_t bytes);

// Throws a FileError "PATH: damaged: its CRC-32C is COMPUTED, RECORDER records
// RECORDED" (hex) where the two differ.
void check_crc32c(const std::string& path, uint32_t computed, uint32_t recorded, const char* recorder);

constexpr uint32_t llmc_checksum_tag = 0x43323343;  // "C32C", little-endian
constexpr int llmc_tag_slot = 254, llmc_checksum_slot = 255;

// Records the checksum of header + payload in the header's last two words
// (header: the 256 words about to be written before the payload).
void seal_llmc_header(uint32_t* header, const void* payload, size_t bytes);
// Where the header is tagged, checks the checksum it records against
// header + payload (a FileError as check_crc32c's); a header whose two words
// are 0 passes; any other pair without the tag is a FileError "PATH:
// damaged: ...".
void verify_llmc_file(const std::string& path, const uint32_t* header, const void* payload, size_t bytes);

// What an llm.c file holds, in one line, for ranks to compare: its size and
// the CRC-32C its header records, or, where it records none (llm.c's own
// files), the CRC-32C of the whole file, read now. A FileError naming PATH
// if it cannot be read.
std::string llmc_file_identity(const std::string& path);

}  // namespace tpsp
