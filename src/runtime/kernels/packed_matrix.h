#pragma once
// Weight matrices repacked once at load for specula's small-batch CPU matmul (kernels/matmul.h).
//
// A matrix of N rows x K columns (ggml's [K, N]) is cut into groups of 16 rows. A group stores,
// for each 32-column block in increasing k, the block's 16 x 32 weights as unsigned bytes laid
// out so that one 64-byte load holds one 4-column slice ("k-group") of all 16 rows:
//   byte 4*r + i of slice j = weight (row r, column 32*b + 4*j + i)
// which is what one `vpdpbusd` multiplies against 4 broadcast activation bytes. Beside them the
// 16 rows' scales. Formats below 8 bits keep the low 4 bits two slices per byte (slice j in the
// low nibble, slice j + 4 in the high one), so a pass over the weights reads as many bytes as
// ggml's own layout does; their higher bits follow as planes in the same byte positions. The
// k-quants (256-column super-blocks) keep their integer sub-block scales as stored and put the
// super-block's F16 factors after its 8 blocks. F16 and BF16 keep ggml's row layout (only
// grouped and padded). Rows past N in the last group are zero.
#include <cstddef>
#include <cstdint>

#include "ggml.h"

namespace specula::kernels {

// Per 16-row x 32-column block (offsets in bytes), u = the stored unsigned integer of a weight:
enum class PackedFormat : uint8_t {
    Q8_0,  // w = d * (u - 128); u [0, 512), d F16 [512, 544)
    Q4_0,  // w = d * (u - 8);   nibbles [0, 256), d [256, 288)
    Q4_1,  // w = d * u + m;     nibbles [0, 256), d [256, 288), m F16 [288, 320)
    Q5_0,  // w = d * (u - 16);  nibbles [0, 256), 5th bits [256, 320) (bit j: slice j), d [320, 352)
    Q4_K,  // w = D * sc * u - Dmin * mn; nibbles [0, 256), sc u8 [256, 272), mn u8 [272, 288);
           //   after 8 blocks: D F16 x 16, Dmin F16 x 16
    Q6_K,  // w = D * sc * (u - 32), sc per 16 columns; nibbles [0, 256), bits 4-5 [256, 384)
           //   (columns 0-15 then 16-31, 2 bits per slice), sc s8 [384, 400) (cols 0-15), [400, 416);
           //   after 8 blocks: D F16 x 16
    F16,   // float formats: the group's 16 rows one after another, as stored in the file
    BF16,
};

constexpr int kGroupRows = 16;
constexpr int kBlock = 32;

// Formats whose weights carry a min term (w = d * u + m): their bodies read the activations' d * s.
constexpr bool has_min_term(PackedFormat f) { return f == PackedFormat::Q4_1 || f == PackedFormat::Q4_K; }
constexpr bool is_k_quant(PackedFormat f) { return f == PackedFormat::Q4_K || f == PackedFormat::Q6_K; }
constexpr int blocks_per_super(PackedFormat f) { return is_k_quant(f) ? 8 : 1; }

// Bytes of one 16-row x 32-column block of a format (see PackedFormat).
constexpr size_t packed_block_bytes(PackedFormat f) {
    switch (f) {
        case PackedFormat::Q8_0: return 16 * 32 + 16 * 2;
        case PackedFormat::Q4_0: return 16 * 16 + 16 * 2;
        case PackedFormat::Q4_1: return 16 * 16 + 16 * 2 * 2;
        case PackedFormat::Q5_0: return 16 * 16 + 64 + 16 * 2;
        case PackedFormat::Q4_K: return 16 * 16 + 16 * 2;
        case PackedFormat::Q6_K: return 16 * 16 + 128 + 16 * 2;
        case PackedFormat::F16:
        case PackedFormat::BF16: return 16 * 32 * 2;
    }
    return 0;
}

// Bytes after a super-block's blocks: the k-quants' F16 super-block factors for 16 rows.
constexpr size_t packed_super_tail_bytes(PackedFormat f) {
    return f == PackedFormat::Q4_K ? 2 * 16 * 2 : f == PackedFormat::Q6_K ? 16 * 2
                                                                          : 0;
}

constexpr size_t packed_super_bytes(PackedFormat f) {
    return blocks_per_super(f) * packed_block_bytes(f) + packed_super_tail_bytes(f);
}

// Where block b of a group starts, and where its super-block's factors are.
constexpr size_t packed_block_offset(PackedFormat f, int64_t b) {
    return static_cast<size_t>(b / blocks_per_super(f)) * packed_super_bytes(f) +
           static_cast<size_t>(b % blocks_per_super(f)) * packed_block_bytes(f);
}
constexpr size_t packed_super_tail_offset(PackedFormat f, int64_t b) {
    return static_cast<size_t>(b / blocks_per_super(f)) * packed_super_bytes(f) + blocks_per_super(f) * packed_block_bytes(f);
}

// What a repacked weight tensor holds; a packed tensor is GGML_TYPE_I8 [group_bytes, n_groups]
// whose `extra` points at its PackedMatrix (owned by the WeightStore that packed it).
struct PackedMatrix {
    static constexpr uint32_t kMagic = 0x53504b4d;  // "SPKM": extra really is one of ours
    uint32_t magic = kMagic;
    PackedFormat format = PackedFormat::Q8_0;
    ggml_type source_type = GGML_TYPE_Q8_0;
    int64_t k = 0;       // columns (input width)
    int64_t n_rows = 0;  // rows (output width)

    bool is_float() const { return format == PackedFormat::F16 || format == PackedFormat::BF16; }
    int64_t n_blocks() const { return k / kBlock; }
    int64_t n_groups() const { return (n_rows + kGroupRows - 1) / kGroupRows; }
    size_t group_bytes() const { return static_cast<size_t>(n_blocks() / blocks_per_super(format)) * packed_super_bytes(format); }
};

// The format a ggml weight type packs to, or false when specula has no kernel for it (ggml's
// mul_mat keeps it). K must be a whole number of 32-column blocks (256 for the k-quants).
bool packable(ggml_type type, int64_t k, PackedFormat * format);

// Repacks rows [0, n_rows) of a ggml-layout matrix (`src`, ggml row size per row) into `dst`
// (m.n_groups() * m.group_bytes() bytes).
void pack_matrix(const PackedMatrix & m, const void * src, void * dst);

// The PackedMatrix behind a weight tensor, or nullptr for an ordinary ggml weight.
const PackedMatrix * packed_matrix_of(const ggml_tensor * w);

}  // namespace specula::kernels
