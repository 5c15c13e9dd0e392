#include "server/embeddings.h"

#include <bit>
#include <cmath>
#include <cstring>

namespace td::server {

using nlohmann::json;

namespace {

Result<std::vector<int32_t>> one_input(const json &item, const Tokenizer &tok, const char *field) {
    std::vector<int32_t> ids;
    if (item.is_string()) {
        ids = tok.encode(item.get<std::string>(), /*add_special=*/true, /*parse_special=*/true);
    } else if (item.is_array()) {
        for (const json &t : item) {
            if (!t.is_number_integer())
                return invalid_input("'{}': a list of token ids holds only integers", field);
            const int64_t id = t.get<int64_t>();
            if (id < 0 || id >= tok.vocab().n_tokens())
                return invalid_input("'{}': token id {} is out of range (the vocabulary has {} tokens)",
                                     field, id, tok.vocab().n_tokens());
            ids.push_back(static_cast<int32_t>(id));
        }
    } else {
        return invalid_input("'{}' must be a string, a list of token ids, or a list of them", field);
    }
    if (ids.empty()) return invalid_input("'{}': an input cannot be empty", field);
    return ids;
}

}  // namespace

Result<std::vector<std::vector<int32_t>>> embedding_inputs(const json &input, const Tokenizer &tok,
                                                           const char *field) {
    std::vector<std::vector<int32_t>> out;
    // A list of integers is one prompt of token ids; any other list is a list of inputs.
    const bool one = !input.is_array() ||
                     (!input.empty() &&
                      std::all_of(input.begin(), input.end(), [](const json &x) { return x.is_number(); }));
    if (one) {
        TD_ASSIGN_OR_RETURN(auto ids, one_input(input, tok, field));
        out.push_back(std::move(ids));
        return out;
    }
    if (input.empty()) return invalid_input("'{}' is an empty list", field);
    for (const json &item : input) {
        TD_ASSIGN_OR_RETURN(auto ids, one_input(item, tok, field));
        out.push_back(std::move(ids));
    }
    return out;
}

void normalize_embedding(std::vector<float> &v, int norm) {
    double sum = 0.0;
    if (norm < 0) return;
    if (norm == 0) {
        for (float x : v) sum = std::max(sum, static_cast<double>(std::fabs(x)));
        sum /= 32760.0;
    } else if (norm == 2) {
        for (float x : v) sum += static_cast<double>(x) * x;
        sum = std::sqrt(sum);
    } else {
        for (float x : v) sum += std::pow(std::fabs(static_cast<double>(x)), norm);
        sum = std::pow(sum, 1.0 / norm);
    }
    const double scale = sum > 0.0 ? 1.0 / sum : 0.0;
    for (float &x : v) x = static_cast<float>(x * scale);
}

std::string base64_floats(const std::vector<float> &v) {
    static constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    std::vector<uint8_t> bytes(v.size() * 4);
    for (size_t i = 0; i < v.size(); ++i) {
        const uint32_t u = std::bit_cast<uint32_t>(v[i]);
        for (int b = 0; b < 4; ++b) bytes[i * 4 + b] = static_cast<uint8_t>(u >> (8 * b));
    }
    std::string out;
    out.reserve((bytes.size() + 2) / 3 * 4);
    for (size_t i = 0; i < bytes.size(); i += 3) {
        const size_t n = std::min<size_t>(3, bytes.size() - i);
        uint32_t w = uint32_t{bytes[i]} << 16;
        if (n > 1) w |= uint32_t{bytes[i + 1]} << 8;
        if (n > 2) w |= bytes[i + 2];
        out += kAlphabet[(w >> 18) & 63];
        out += kAlphabet[(w >> 12) & 63];
        out += n > 1 ? kAlphabet[(w >> 6) & 63] : '=';
        out += n > 2 ? kAlphabet[w & 63] : '=';
    }
    return out;
}

}  // namespace td::server
