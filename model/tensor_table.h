// Tables of named tensors, and the single allocation laid out from one.
//
// The parameters, the saved activations and the backward workspace are each
// described by a table: one row per tensor (name, symbolic and numeric shape,
// dtype, and the struct field that will point at it). The arena is laid out
// from the table and the memory report prints the same table, so what is
// reported is what is allocated. Adding a tensor is adding one row.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <variant>
#include <vector>

namespace tpsp {

enum class DType { f32, u8 };
size_t dtype_bytes(DType dtype);
const char* dtype_name(DType dtype);

// One dimension: its size and how the formula names it ("b", "s/t", "3h").
struct Dim {
    int64_t size;
    std::string symbol;
};

struct TensorSpec {
    std::string name;
    std::vector<Dim> shape;
    DType dtype;
    std::variant<float**, uint8_t**> slot;  // the struct field that points into the arena

    int64_t elements() const;
    size_t bytes() const;
    std::string shape_text() const;    // "[4, 64, 768]"
    std::string symbol_text() const;   // "[b, s, h]"
    std::string formula_text() const;  // "3·b·s·h·e" (a mask: "b·s·h", one byte each)
};

TensorSpec f32_tensor(std::string name, std::vector<Dim> shape, float** slot);
TensorSpec u8_tensor(std::string name, std::vector<Dim> shape, uint8_t** slot);

size_t table_bytes(const std::vector<TensorSpec>& table);

// One allocation for a whole table, zero-filled: fp32 tensors first, then the
// one-byte masks, so that no padding is ever needed and the arena is exactly
// table_bytes() long. Points every slot at its tensor.
class Arena {
public:
    Arena() = default;
    explicit Arena(const std::vector<TensorSpec>& table);
    Arena(const Arena&) = delete;
    Arena& operator=(const Arena&) = delete;
    Arena(Arena&& other) noexcept;
    Arena& operator=(Arena&& other) noexcept;
    ~Arena();
    size_t bytes() const { return bytes_; }
    void* data() const { return memory_; }

private:
    void* memory_ = nullptr;
    size_t bytes_ = 0;
};

// Prints a table as rows of name, shape, dtype, bytes, formula.
std::string format_table(const std::string& title, const std::vector<TensorSpec>& table);

}  // namespace tpsp
