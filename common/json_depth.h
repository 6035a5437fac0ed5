// How deeply a JSON text nests its arrays and objects, found without
// parsing it: nlohmann's parser builds (and its dump and copy recurse into)
// whatever depth it is given, so outside JSON (a safetensors header,
// config.json, a HellaSwag line) is measured first and refused past a bound.
#pragma once
#include <string_view>

namespace tpsp {

inline int json_nesting_depth(std::string_view text) {
    int depth = 0, deepest = 0;
    bool in_string = false, escaped = false;
    for (char ch : text) {
        if (in_string) {
            if (escaped) escaped = false;
            else if (ch == '\\') escaped = true;
            else if (ch == '"') in_string = false;
        } else if (ch == '"') {
            in_string = true;
        } else if (ch == '[' || ch == '{') {
            if (++depth > deepest) deepest = depth;
        } else if (ch == ']' || ch == '}') {
            depth--;
        }
    }
    return deepest;
}

}  // namespace tpsp
