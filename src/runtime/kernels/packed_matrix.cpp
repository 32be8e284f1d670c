#include "runtime/kernels/packed_matrix.h"

#include <cstring>

namespace specula::kernels {

namespace {

// ggml's block layouts (ggml-common.h), restated: specula reads the file's bytes as stored.
struct BlockQ8_0 { uint16_t d; int8_t qs[32]; };
struct BlockQ4_0 { uint16_t d; uint8_t qs[16]; };            // qs[i]: low nibble col i, high nibble col i + 16
struct BlockQ4_1 { uint16_t d; uint16_t m; uint8_t qs[16]; };
static_assert(sizeof(BlockQ8_0) == 34 && sizeof(BlockQ4_0) == 18 && sizeof(BlockQ4_1) == 20);

}  // namespace

bool packable(ggml_type type, int64_t k, PackedFormat * format) {
    if (k <= 0 || k % kBlock != 0) return false;
    switch (type) {
        case GGML_TYPE_Q8_0: *format = PackedFormat::Q8_0; return true;
        case GGML_TYPE_Q4_0: *format = PackedFormat::Q4_0; return true;
        case GGML_TYPE_Q4_1: *format = PackedFormat::Q4_1; return true;
        case GGML_TYPE_F16: *format = PackedFormat::F16; return true;
        case GGML_TYPE_BF16: *format = PackedFormat::BF16; return true;
        default: return false;
    }
}

void pack_matrix(const PackedMatrix & m, const void * src, void * dst) {
    const int64_t nb = m.n_blocks();
    const size_t block_bytes = packed_block_bytes(m.format);
    auto * out = static_cast<uint8_t *>(dst);
    std::memset(out, 0, static_cast<size_t>(m.n_groups()) * m.group_bytes());
    if (m.is_float()) {
        const size_t row_bytes = static_cast<size_t>(m.k) * 2;
        for (int64_t row = 0; row < m.n_rows; ++row) {
            std::memcpy(out + (row / kGroupRows) * m.group_bytes() + (row % kGroupRows) * row_bytes,
                        static_cast<const uint8_t *>(src) + row * row_bytes, row_bytes);
        }
        return;
    }
    for (int64_t row = 0; row < m.n_rows; ++row) {
        const int64_t g = row / kGroupRows;
        const int r = static_cast<int>(row % kGroupRows);
        for (int64_t b = 0; b < nb; ++b) {
            uint8_t * blk = out + g * m.group_bytes() + b * block_bytes;
            switch (m.format) {
                case PackedFormat::Q8_0: {
                    const auto & s = static_cast<const BlockQ8_0 *>(src)[row * nb + b];
                    for (int c = 0; c < 32; ++c) blk[(c / 4) * 64 + 4 * r + c % 4] = static_cast<uint8_t>(s.qs[c] + 128);
                    std::memcpy(blk + 512 + 2 * r, &s.d, 2);
                    break;
                }
                case PackedFormat::Q4_0: {
                    // The ggml byte for col c (< 16) already holds col c + 16 in its high nibble:
                    // exactly the packed pairing of slice j with slice j + 4.
                    const auto & s = static_cast<const BlockQ4_0 *>(src)[row * nb + b];
                    for (int c = 0; c < 16; ++c) blk[(c / 4) * 64 + 4 * r + c % 4] = s.qs[c];
                    std::memcpy(blk + 256 + 2 * r, &s.d, 2);
                    break;
                }
                case PackedFormat::Q4_1: {
                    const auto & s = static_cast<const BlockQ4_1 *>(src)[row * nb + b];
                    for (int c = 0; c < 16; ++c) blk[(c / 4) * 64 + 4 * r + c % 4] = s.qs[c];
                    std::memcpy(blk + 256 + 2 * r, &s.d, 2);
                    std::memcpy(blk + 288 + 2 * r, &s.m, 2);
                    break;
                }
                case PackedFormat::F16:
                case PackedFormat::BF16: break;  // handled above
            }
        }
    }
}

const PackedMatrix * packed_matrix_of(const ggml_tensor * w) {
    if (!w || w->type != GGML_TYPE_I8 || !w->extra) return nullptr;
    const auto * m = static_cast<const PackedMatrix *>(w->extra);
    return m->magic == PackedMatrix::kMagic ? m : nullptr;
}

}  // namespace specula::kernels
