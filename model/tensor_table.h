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
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

namespace tpsp {

// fp32, bf16 (any 2-byte element: __nv_bfloat16 on the GPU), token ids, one-byte masks.
enum class DType { f32, bf16, i32, u8 };
size_t dtype_bytes(DType dtype);
const char* dtype_name(DType dtype);

template <class T>
constexpr DType dtype_of() {
    if constexpr (std::is_same_v<T, float>) return DType::f32;
    else if constexpr (std::is_same_v<T, int>) return DType::i32;
    else if constexpr (std::is_same_v<T, uint8_t>) return DType::u8;
    else {
        static_assert(sizeof(T) == 2, "a tensor holds fp32, bf16 or bytes");
        return DType::bf16;
    }
}

// One dimension: its size and how the formula names it ("b", "s/t", "3h").
struct Dim {
    int64_t size;
    std::string symbol;
};

struct TensorSpec {
    std::string name;
    std::vector<Dim> shape;
    DType dtype;
    std::function<void(void*)> place;  // points the struct field at the tensor's memory

    int64_t elements() const;
    size_t bytes() const;
    std::string shape_text() const;   // "[4, 64, 768]"
    std::string symbol_text() const;  // "[b, s, h]"
    // "3·b·s·h·e" when the tensor has the activation dtype (e bytes each), a
    // mask "b·s·h" (one byte each), an fp32 statistic of bf16 activations "s·b·4"
    std::string formula_text(DType activation) const;
};

// A row of a table; the struct field `slot` will point at the tensor.
template <class T>
TensorSpec tensor(std::string name, std::vector<Dim> shape, T** slot) {
    return {std::move(name), std::move(shape), dtype_of<T>(), [slot](void* at) { *slot = static_cast<T*>(at); }};
}

// A row of a per-layer tensor [L, ...]: the struct field `slot` will point
// at the whole tensor, and the field `member` of each of the L views in
// `layers` (when given: a block's view of the tensor) at its layer's slice.
// The slices come from the row's shape, so no code computes a layer's offset.
template <class T, class View, class Field>
TensorSpec layered_tensor(std::string name, Dim L, std::vector<Dim> per_layer, T** slot, std::vector<View>* layers,
                          Field View::*member) {
    int64_t layer_elements = 1;
    for (const Dim& d : per_layer) layer_elements *= d.size;
    if (layers) layers->resize(size_t(L.size));
    std::vector<Dim> shape = {L};
    shape.insert(shape.end(), per_layer.begin(), per_layer.end());
    return {std::move(name), std::move(shape), dtype_of<T>(), [=](void* at) {
                *slot = static_cast<T*>(at);
                if (layers)
                    for (size_t l = 0; l < layers->size(); l++)
                        (*layers)[l].*member = Field{*slot + l * layer_elements};
            }};
}

size_t table_bytes(const std::vector<TensorSpec>& table);

// Where an arena lives: allocate returns zero-filled memory.
struct Memory {
    void* (*allocate)(size_t bytes);
    void (*release)(void* data);
};
extern const Memory host_memory;

// One allocation for a whole table, zero-filled: the 4-byte tensors first,
// then bf16, then the one-byte masks, so that no padding is ever needed and the
// arena is exactly table_bytes() long. Points every slot at its tensor.
class Arena {
public:
    Arena() = default;
    explicit Arena(const std::vector<TensorSpec>& table, const Memory& memory = host_memory);
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
    const Memory* where_ = &host_memory;
};

// Prints a table as rows of name, shape, dtype, bytes, formula.
std::string format_table(const std::string& title, const std::vector<TensorSpec>& table, DType activation);

}  // namespace tpsp
