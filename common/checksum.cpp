#include "common/checksum.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <vector>

#include "common/errors.h"
#include "common/files.h"

namespace tpsp {

namespace {

static_assert(std::endian::native == std::endian::little, "the 8-byte steps read words little-endian");

// tables[0][b]: the CRC register after shifting byte b through it alone;
// tables[k][b]: the same byte followed by k zero bytes, so that one step
// folds 8 bytes with 8 lookups.
using Tables = std::array<std::array<uint32_t, 256>, 8>;

constexpr Tables make_tables() {
    Tables t{};
    for (uint32_t b = 0; b < 256; b++) {
        uint32_t crc = b;
        for (int bit = 0; bit < 8; bit++) crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1u)));
        t[0][b] = crc;
    }
    for (int k = 1; k < 8; k++)
        for (uint32_t b = 0; b < 256; b++) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xFF];
    return t;
}

constexpr Tables tables = make_tables();

std::string hex(uint32_t x) {
    char text[9];
    std::snprintf(text, sizeof text, "%08x", x);
    return text;
}

// header[0..254], a zero in place of header[255], then the payload
uint32_t llmc_file_crc(const uint32_t* header, const void* payload, size_t bytes) {
    const uint32_t zero = 0;
    return Crc32c().update(header, llmc_checksum_slot * 4).update(&zero, 4).update(payload, bytes).value();
}

}  // namespace

Crc32c& Crc32c::update(const void* data, size_t bytes) {
    const unsigned char* p = static_cast<const unsigned char*>(data);
    uint32_t crc = state_;
    for (; bytes >= 8; p += 8, bytes -= 8) {
        uint32_t lo, hi;
        std::memcpy(&lo, p, 4);
        std::memcpy(&hi, p + 4, 4);
        lo ^= crc;
        crc = tables[7][lo & 0xFF] ^ tables[6][(lo >> 8) & 0xFF] ^ tables[5][(lo >> 16) & 0xFF] ^ tables[4][lo >> 24] ^
              tables[3][hi & 0xFF] ^ tables[2][(hi >> 8) & 0xFF] ^ tables[1][(hi >> 16) & 0xFF] ^ tables[0][hi >> 24];
    }
    for (; bytes > 0; p++, bytes--) crc = (crc >> 8) ^ tables[0][(crc ^ *p) & 0xFF];
    state_ = crc;
    return *this;
}

uint32_t crc32c_of_file(const std::string& path, uint64_t bytes) {
    FILE* f = std::fopen(path.c_str(), "rb");
    if (!f) throw FileError(path + ": cannot open to check its CRC-32C");
    std::vector<char> piece(size_t(1) << 20);
    Crc32c crc;
    while (bytes > 0) {
        const size_t want = size_t(std::min<uint64_t>(bytes, piece.size()));
        if (std::fread(piece.data(), 1, want, f) != want) {
            std::fclose(f);
            throw FileError(path + ": truncated while checking its CRC-32C");
        }
        crc.update(piece.data(), want);
        bytes -= want;
    }
    std::fclose(f);
    return crc.value();
}

void check_crc32c(const std::string& path, uint32_t computed, uint32_t recorded, const char* recorder) {
    if (computed != recorded)
        throw FileError(path + ": damaged: its CRC-32C is " + hex(computed) + ", " + recorder + " records " +
                        hex(recorded));
}

void seal_llmc_header(uint32_t* header, const void* payload, size_t bytes) {
    header[llmc_tag_slot] = llmc_checksum_tag;
    header[llmc_checksum_slot] = llmc_file_crc(header, payload, bytes);
}

void verify_llmc_file(const std::string& path, const uint32_t* header, const void* payload, size_t bytes) {
    if (header[llmc_tag_slot] == 0 && header[llmc_checksum_slot] == 0) return;  // llm.c's own file: none recorded
    if (header[llmc_tag_slot] != llmc_checksum_tag)
        throw FileError(path + ": damaged: header[254..255] hold " + hex(header[llmc_tag_slot]) + " " +
                        hex(header[llmc_checksum_slot]) + ", neither the CRC-32C tag " + hex(llmc_checksum_tag) +
                        " and a CRC nor llm.c's zeros");
    check_crc32c(path, llmc_file_crc(header, payload, bytes), header[llmc_checksum_slot], "the header");
}

std::string llmc_file_identity(const std::string& path) {
    check_regular_input(path, "file");  // a FIFO would block the open
    std::error_code error;
    const uintmax_t bytes = std::filesystem::file_size(path, error);
    uint32_t header[256];
    FILE* f = error ? nullptr : std::fopen(path.c_str(), "rb");
    const bool read = f && std::fread(header, 4, 256, f) == 256;
    if (f) std::fclose(f);
    if (!read) throw FileError(path + ": cannot read its header");
    const bool sealed = header[llmc_tag_slot] == llmc_checksum_tag;
    const uint32_t crc = sealed ? header[llmc_checksum_slot] : crc32c_of_file(path, bytes);
    return std::to_string(bytes) + " bytes, CRC-32C " + hex(crc) + (sealed ? "" : " (of the file: none recorded)");
}

}  // namespace tpsp
