#include "model/tensor_table.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

namespace tpsp {

size_t dtype_bytes(DType dtype) { return dtype == DType::f32 ? 4 : 1; }
const char* dtype_name(DType dtype) { return dtype == DType::f32 ? "fp32" : "u8"; }

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

std::string TensorSpec::formula_text() const {
    // a leading integer of a symbol ("3h", "4h/t") moves to the front, and a
    // symbol that repeats is squared ("s·s" -> "s²")
    long factor = 1;
    std::vector<std::string> symbols;
    for (const Dim& d : shape) {
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
    return dtype == DType::f32 ? text + "·e" : text;
}

TensorSpec f32_tensor(std::string name, std::vector<Dim> shape, float** slot) {
    return {std::move(name), std::move(shape), DType::f32, slot};
}

TensorSpec u8_tensor(std::string name, std::vector<Dim> shape, uint8_t** slot) {
    return {std::move(name), std::move(shape), DType::u8, slot};
}

size_t table_bytes(const std::vector<TensorSpec>& table) {
    size_t total = 0;
    for (const TensorSpec& t : table) total += t.bytes();
    return total;
}

Arena::Arena(const std::vector<TensorSpec>& table) : bytes_(table_bytes(table)) {
    memory_ = std::aligned_alloc(64, (bytes_ + 63) / 64 * 64);
    if (!memory_) throw std::bad_alloc();
    std::memset(memory_, 0, bytes_);
    char* cursor = static_cast<char*>(memory_);
    for (DType pass : {DType::f32, DType::u8}) {
        for (const TensorSpec& t : table) {
            if (t.dtype != pass) continue;
            if (auto f = std::get_if<float**>(&t.slot)) **f = reinterpret_cast<float*>(cursor);
            if (auto u = std::get_if<uint8_t**>(&t.slot)) **u = reinterpret_cast<uint8_t*>(cursor);
            cursor += t.bytes();
        }
    }
}

Arena::Arena(Arena&& other) noexcept
    : memory_(std::exchange(other.memory_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

Arena& Arena::operator=(Arena&& other) noexcept {
    std::swap(memory_, other.memory_);
    std::swap(bytes_, other.bytes_);
    return *this;
}

Arena::~Arena() { std::free(memory_); }

std::string format_table(const std::string& title, const std::vector<TensorSpec>& table) {
    std::string out = title + "\n";
    char line[256];
    std::snprintf(line, sizeof line, "  %-22s %-20s %-16s %-5s %14s  %s\n", "tensor", "shape", "symbols", "dtype",
                  "bytes", "formula");
    out += line;
    for (const TensorSpec& t : table) {
        std::snprintf(line, sizeof line, "  %-22s %-20s %-16s %-5s %14zu  %s\n", t.name.c_str(),
                      t.shape_text().c_str(), t.symbol_text().c_str(), dtype_name(t.dtype), t.bytes(),
                      t.formula_text().c_str());
        out += line;
    }
    std::snprintf(line, sizeof line, "  %-22s %-20s %-16s %-5s %14zu\n", "total", "", "", "", table_bytes(table));
    return out + line;
}

}  // namespace tpsp
