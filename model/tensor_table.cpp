#include "model/tensor_table.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

namespace tpsp {

size_t dtype_bytes(DType dtype) {
    switch (dtype) {
    case DType::f32: return 4;
    case DType::bf16: return 2;
    case DType::i32: return 4;
    case DType::u8: return 1;
    }
    return 0;
}

const char* dtype_name(DType dtype) {
    switch (dtype) {
    case DType::f32: return "fp32";
    case DType::bf16: return "bf16";
    case DType::i32: return "i32";
    case DType::u8: return "u8";
    }
    return "";
}

int64_t TensorSpec::elements() const {
    int64_t n = 1;
    for (const Dim& d : shape) n *= d.size;
    return n;
}

size_t TensorSpec::bytes() const { return size_t(elements()) * dtype_bytes(dtype); }

std::string TensorSpec::shape_text() const {
    std::string text = "[";
    for (size_t i = 0; i < shape.size(); i++) text += (i ? ", " : "") + std::to_string(shape[i].size);
    return text + "]";
}

std::string TensorSpec::symbol_text() const {
    std::string text = "[";
    for (size_t i = 0; i < shape.size(); i++) text += (i ? ", " : "") + shape[i].symbol;
    return text + "]";
}

std::string TensorSpec::formula_text(DType activation) const {
    // a leading integer of a symbol ("3h", "4h/t") moves to the front, a sum
    // is bracketed, and a symbol that repeats is squared ("s·s" -> "s²")
    long factor = 1;
    std::vector<std::string> symbols;
    for (const Dim& d : shape) {
        if (d.symbol.find('+') != std::string::npos) {
            symbols.push_back("(" + d.symbol + ")");
            continue;
        }
        size_t digits = 0;
        while (digits < d.symbol.size() && d.symbol[digits] >= '0' && d.symbol[digits] <= '9') digits++;
        if (digits) factor *= std::stol(d.symbol.substr(0, digits));
        if (digits < d.symbol.size()) symbols.push_back(d.symbol.substr(digits));
    }
    std::string text = factor > 1 ? std::to_string(factor) : "";
    for (size_t i = 0; i < symbols.size(); i++) {
        if (i + 1 < symbols.size() && symbols[i] == symbols[i + 1]) {
            text += (text.empty() ? "" : "·") + symbols[i] + "²";
            i++;
        } else {
            text += (text.empty() ? "" : "·") + symbols[i];
        }
    }
    if (dtype == activation) return text + "·e";
    if (dtype == DType::u8) return text;
    return text + "·" + std::to_string(dtype_bytes(dtype));
}

size_t table_bytes(const std::vector<TensorSpec>& table) {
    size_t total = 0;
    for (const TensorSpec& t : table) total += t.bytes();
    return total;
}

static void* host_allocate(size_t bytes) {
    void* memory = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!memory) throw std::bad_alloc();
    std::memset(memory, 0, bytes);
    return memory;
}

const Memory host_memory = {host_allocate, std::free};

Arena::Arena(const std::vector<TensorSpec>& table, const Memory& memory) : bytes_(table_bytes(table)), where_(&memory) {
    memory_ = memory.allocate(bytes_);
    char* cursor = static_cast<char*>(memory_);
    for (DType pass : {DType::f32, DType::i32, DType::bf16, DType::u8}) {
        for (const TensorSpec& t : table) {
            if (t.dtype != pass) continue;
            t.place(cursor);
            cursor += t.bytes();
        }
    }
}

Arena::Arena(Arena&& other) noexcept
    : memory_(std::exchange(other.memory_, nullptr)), bytes_(std::exchange(other.bytes_, 0)), where_(other.where_) {}

Arena& Arena::operator=(Arena&& other) noexcept {
    std::swap(memory_, other.memory_);
    std::swap(bytes_, other.bytes_);
    std::swap(where_, other.where_);
    return *this;
}

Arena::~Arena() {
    if (memory_) where_->release(memory_);
}

std::string format_table(const std::string& title, const std::vector<TensorSpec>& table, DType activation) {
    std::string out = title + "\n";
    char line[256];
    std::snprintf(line, sizeof line, "  %-30s %-20s %-16s %-5s %14s  %s\n", "tensor", "shape", "symbols", "dtype",
                  "bytes", "formula");
    out += line;
    for (const TensorSpec& t : table) {
        std::snprintf(line, sizeof line, "  %-30s %-20s %-16s %-5s %14zu  %s\n", t.name.c_str(), t.shape_text().c_str(),
                      t.symbol_text().c_str(), dtype_name(t.dtype), t.bytes(), t.formula_text(activation).c_str());
        out += line;
    }
    std::snprintf(line, sizeof line, "  %-30s %-20s %-16s %-5s %14zu\n", "total", "", "", "", table_bytes(table));
    return out + line;
}

}  // namespace tpsp
