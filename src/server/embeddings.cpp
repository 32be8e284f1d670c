#include "server/embeddings.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "server/openai_fields.h"
#include "server/openai_generation.h"
#include "specula/error.h"

namespace specula::embeddings {

using nlohmann::json;

Pooling pooling_from_name(const std::string & name) {
    if (name == "mean") return Pooling::Mean;
    if (name == "last") return Pooling::Last;
    if (name == "cls") return Pooling::Cls;
    throw Error("pooling \"" + name + "\": mean, last or cls");
}

const char * pooling_name(Pooling pooling) {
    switch (pooling) {
        case Pooling::Mean: return "mean";
        case Pooling::Last: return "last";
        case Pooling::Cls: return "cls";
    }
    return "mean";
}

std::vector<float> pool(std::span<const float> rows, int width, Pooling pooling) {
    const size_t E = static_cast<size_t>(width), n = rows.size() / E;
    if (n == 0 || rows.size() != n * E) throw Error("pool: " + std::to_string(rows.size()) + " values are no rows of width " + std::to_string(width));
    std::vector<double> sum(E, 0.0);
    const size_t begin = pooling == Pooling::Last ? n - 1 : 0, end = pooling == Pooling::Cls ? 1 : n;
    for (size_t r = begin; r < end; ++r) {
        for (size_t j = 0; j < E; ++j) sum[j] += rows[r * E + j];
    }
    double norm = 0.0;
    for (double & x : sum) {
        x /= static_cast<double>(end - begin);
        norm += x * x;
    }
    norm = std::sqrt(norm);
    std::vector<float> out(E);
    for (size_t j = 0; j < E; ++j) out[j] = static_cast<float>(norm > 0.0 ? sum[j] / norm : 0.0);
    return out;
}

namespace {

std::string base64(const std::vector<float> & v) {
    static const char * const digits = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    std::string bytes(v.size() * sizeof(float), '\0');
    std::memcpy(bytes.data(), v.data(), bytes.size());  // little-endian hosts: the float32 layout numpy reads
    std::string out;
    for (size_t i = 0; i < bytes.size(); i += 3) {
        const uint32_t a = static_cast<unsigned char>(bytes[i]);
        const uint32_t b = i + 1 < bytes.size() ? static_cast<unsigned char>(bytes[i + 1]) : 0;
        const uint32_t c = i + 2 < bytes.size() ? static_cast<unsigned char>(bytes[i + 2]) : 0;
        const uint32_t w = (a << 16) | (b << 8) | c;
        out += digits[(w >> 18) & 63];
        out += digits[(w >> 12) & 63];
        out += i + 1 < bytes.size() ? digits[(w >> 6) & 63] : '=';
        out += i + 2 < bytes.size() ? digits[w & 63] : '=';
    }
    return out;
}

}  // namespace

Request parse(const std::string & text, const openai::Accepted & accepted, const Tokenizer & tokenizer, SpecialTokens specials, int n_ctx) {
    const json body = openai::body_object(text);
    Request r;
    for (const auto & [key, value] : body.items()) {
        if (key == "input" || key == "model" || key == "encoding_format" || key == "user" || value.is_null()) continue;
        r.ignored_fields.push_back(key.size() > 40 ? key.substr(0, 40) + "..." : key);
    }
    if (accepted.strict_fields && !r.ignored_fields.empty()) openai::bad(r.ignored_fields.front(), "'" + r.ignored_fields.front() + "' is not supported by /v1/embeddings");
    r.model = openai::checked_model(body, accepted);
    if (openai::has(body, "encoding_format")) {
        const json & f = body.at("encoding_format");
        if (f != "float" && f != "base64") openai::must_be("encoding_format", "\"float\" or \"base64\"", f);
        r.base64 = f == "base64";
    }
    if (!openai::has(body, "input")) openai::bad("input", "'input' is required");
    // llama-server's shapes: a text, ids, texts and ids mixed, {"prompt_string"}, or a batch of them.
    const std::vector<openai::Prompt> items = openai::parse_prompts(body.at("input"), "input", kMaxInputs);
    for (size_t i = 0; i < items.size(); ++i) {
        const json & input = body.at("input");
        const bool batch = input.is_array() && std::none_of(input.begin(), input.end(), [](const json & x) { return x.is_number(); });
        const std::string name = batch ? "input[" + std::to_string(i) + "]" : "input";
        std::vector<int32_t> ids = items[i].tokens;
        for (const auto & [piece, id] : items[i].mixed) {
            if (id >= 0) ids.push_back(id);
        }
        for (int32_t id : ids) {
            if (id >= tokenizer.n_vocab()) {
                openai::bad("input", "'" + name + "' holds " + std::to_string(id) + ", not a token of the vocabulary (0.." + std::to_string(tokenizer.n_vocab() - 1) + ")");
            }
        }
        std::vector<int32_t> tokens;
        try {
            tokens = openai::prompt_tokens(items[i], tokenizer, specials);
        } catch (const Error & e) {
            openai::bad("input", "cannot tokenize '" + name + "': " + e.what());
        }
        if (tokens.empty()) openai::bad("input", "'" + name + "' is empty");
        if (static_cast<int64_t>(tokens.size()) > n_ctx) {
            // "too large": llama-server's words, which its clients and test suite look for.
            throw openai::ApiError{400, "'" + name + "' is " + std::to_string(tokens.size()) + " tokens, too large for this model's context of " + std::to_string(n_ctx) + " tokens",
                                   "invalid_request_error", "input", "context_length_exceeded"};
        }
        r.inputs.push_back(std::move(tokens));
    }
    return r;
}

json response(const Request & r, const std::vector<std::vector<float>> & vectors) {
    json data = json::array();
    size_t tokens = 0;
    for (size_t i = 0; i < vectors.size(); ++i) {
        data.push_back({{"object", "embedding"}, {"index", i}, {"embedding", r.base64 ? json(base64(vectors[i])) : json(vectors[i])}});
        tokens += r.inputs.at(i).size();
    }
    return json{{"object", "list"}, {"data", std::move(data)}, {"model", r.model}, {"usage", {{"prompt_tokens", tokens}, {"total_tokens", tokens}}}};
}

}  // namespace specula::embeddings
