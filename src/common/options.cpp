// The names of specula/options.h's enums, as the CLI and HTTP take them.
#include "specula/options.h"

#include <array>
#include <utility>

#include "specula/error.h"

namespace specula {
namespace {

template <class Enum, size_t N>
Enum parse(std::string_view name, const std::array<std::pair<const char *, Enum>, N> & names, const char * what) {
    std::string expected;
    for (size_t i = 0; i < N; ++i) {
        if (name == names[i].first) return names[i].second;
        expected += std::string(i == 0 ? "" : i + 1 == N ? " or "
                                                         : ", ") +
                    names[i].first;
    }
    throw Error("unknown " + std::string(what) + " '" + std::string(name) + "' (expected " + expected + ")");
}

template <class Enum, size_t N>
const char * name_of(Enum value, const std::array<std::pair<const char *, Enum>, N> & names) {
    for (const auto & [name, v] : names) {
        if (v == value) return name;
    }
    return "?";
}

constexpr std::array<std::pair<const char *, DraftPolicyKind>, 3> kPolicies{
    {{"cost", DraftPolicyKind::Cost}, {"heuristic", DraftPolicyKind::Heuristic}, {"fixed", DraftPolicyKind::Fixed}}};
constexpr std::array<std::pair<const char *, TreeShape>, 3> kShapes{
    {{"chain", TreeShape::Chain}, {"static", TreeShape::Static}, {"dynamic", TreeShape::Dynamic}}};
constexpr std::array<std::pair<const char *, Kernels>, 3> kKernels{
    {{"auto", Kernels::Auto}, {"specula", Kernels::Specula}, {"ggml", Kernels::Ggml}}};
constexpr std::array<std::pair<const char *, Attention>, 4> kAttention{
    {{"auto", Attention::Auto}, {"flash", Attention::Flash}, {"matmul", Attention::Matmul}, {"specula", Attention::Specula}}};
constexpr std::array<std::pair<const char *, DrafterKind>, 5> kDrafters{{{"none", DrafterKind::None},
                                                                         {"draft", DrafterKind::DraftModel},
                                                                         {"eagle", DrafterKind::Eagle},
                                                                         {"eagle3", DrafterKind::Eagle3},
                                                                         {"ngram", DrafterKind::Ngram}}};

}  // namespace

DraftPolicyKind parse_draft_policy(std::string_view name) { return parse(name, kPolicies, "draft policy"); }
TreeShape parse_tree_shape(std::string_view name) { return parse(name, kShapes, "tree shape"); }
Kernels parse_kernels(std::string_view name) { return parse(name, kKernels, "kernels"); }
Attention parse_attention(std::string_view name) { return parse(name, kAttention, "attention kernel"); }
const char * tree_shape_name(TreeShape shape) { return name_of(shape, kShapes); }
const char * kernels_name(Kernels kernels) { return name_of(kernels, kKernels); }
const char * attention_name(Attention attention) { return name_of(attention, kAttention); }
const char * drafter_kind_name(DrafterKind kind) { return name_of(kind, kDrafters); }

}  // namespace specula
