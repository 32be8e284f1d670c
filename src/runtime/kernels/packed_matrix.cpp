#include "runtime/kernels/packed_matrix.h"

#include <cstring>

namespace specula::kernels {

namespace {

// ggml's block layouts (ggml-common.h), restated: specula reads the file's bytes as stored.
struct BlockQ8_0 {
    uint16_t d;
    int8_t qs[32];
};
struct BlockQ4_0 {
    uint16_t d;
    uint8_t qs[16];
};  // qs[i]: low nibble col i, high nibble col i + 16
struct BlockQ4_1 {
    uint16_t d;
    uint16_t m;
    uint8_t qs[16];
};
struct BlockQ5_0 {
    uint16_t d;
    uint8_t qh[4];
    uint8_t qs[16];
};  // bit c of qh: 5th bit of col c
struct BlockQ4_K {
    uint16_t d;
    uint16_t dmin;
    uint8_t scales[12];
    uint8_t qs[128];
};
struct BlockQ6_K {
    uint8_t ql[128];
    uint8_t qh[64];
    int8_t scales[16];
    uint16_t d;
};
static_assert(sizeof(BlockQ8_0) == 34 && sizeof(BlockQ4_0) == 18 && sizeof(BlockQ4_1) == 20 && sizeof(BlockQ5_0) == 22);
static_assert(sizeof(BlockQ4_K) == 144 && sizeof(BlockQ6_K) == 210);

// Byte of row r's columns 4j..4j+3 in a block's slice j (packed_matrix.h).
constexpr size_t slot(int j, int r, int i) { return static_cast<size_t>(j) * 64 + 4 * r + i; }

// The low 4 bits of a block's 32 unsigned weights of row r, two slices per byte.
void put_nibbles(uint8_t * blk, int r, const uint8_t (&u)[32]) {
    for (int c = 0; c < 16; ++c) blk[slot(c / 4, r, c % 4)] = static_cast<uint8_t>((u[c] & 0x0f) | (u[c + 16] & 0x0f) << 4);
}

// Q4_K's 6-bit sub-block scale and min j of a super-block (ggml's get_scale_min_k4).
void q4_k_scale_min(const uint8_t * q, int j, uint8_t * sc, uint8_t * mn) {
    if (j < 4) {
        *sc = q[j] & 63;
        *mn = q[j + 4] & 63;
    } else {
        *sc = static_cast<uint8_t>((q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4));
        *mn = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

// Q6_K's 6-bit unsigned weight at column col (0..255) of a super-block (ggml's dequantize_row_q6_K).
uint8_t q6_k_weight(const BlockQ6_K & s, int col) {
    const int half = col / 128, k = (col % 128) / 32, l = col % 32;
    const uint8_t lo = s.ql[64 * half + l + 32 * (k & 1)];
    const uint8_t nibble = k < 2 ? (lo & 0x0f) : (lo >> 4);
    return static_cast<uint8_t>(nibble | ((s.qh[32 * half + l] >> (2 * k)) & 3) << 4);
}

void pack_block(const PackedMatrix & m, const void * src, int64_t row, int64_t b, uint8_t * blk, uint8_t * tail, int r) {
    const int64_t nb = m.n_blocks();
    uint8_t u[32];
    switch (m.format) {
        case PackedFormat::Q8_0: {
            const auto & s = static_cast<const BlockQ8_0 *>(src)[row * nb + b];
            for (int c = 0; c < 32; ++c) blk[slot(c / 4, r, c % 4)] = static_cast<uint8_t>(s.qs[c] + 128);
            std::memcpy(blk + 512 + 2 * r, &s.d, 2);
            return;
        }
        case PackedFormat::Q4_0: {
            const auto & s = static_cast<const BlockQ4_0 *>(src)[row * nb + b];
            for (int c = 0; c < 16; ++c) u[c] = s.qs[c] & 0x0f, u[c + 16] = s.qs[c] >> 4;
            put_nibbles(blk, r, u);
            std::memcpy(blk + 256 + 2 * r, &s.d, 2);
            return;
        }
        case PackedFormat::Q4_1: {
            const auto & s = static_cast<const BlockQ4_1 *>(src)[row * nb + b];
            for (int c = 0; c < 16; ++c) u[c] = s.qs[c] & 0x0f, u[c + 16] = s.qs[c] >> 4;
            put_nibbles(blk, r, u);
            std::memcpy(blk + 256 + 2 * r, &s.d, 2);
            std::memcpy(blk + 288 + 2 * r, &s.m, 2);
            return;
        }
        case PackedFormat::Q5_0: {
            const auto & s = static_cast<const BlockQ5_0 *>(src)[row * nb + b];
            uint32_t qh;
            std::memcpy(&qh, s.qh, 4);
            for (int c = 0; c < 16; ++c) u[c] = s.qs[c] & 0x0f, u[c + 16] = s.qs[c] >> 4;
            put_nibbles(blk, r, u);
            // Byte 4r+i of the plane: bit j = 5th bit of column 4j+i, bit 4+j = of column 16+4j+i.
            for (int c = 0; c < 32; ++c) {
                if ((qh >> c) & 1) blk[256 + 4 * r + c % 4] |= static_cast<uint8_t>(1u << (c / 4));
            }
            std::memcpy(blk + 320 + 2 * r, &s.d, 2);
            return;
        }
        case PackedFormat::Q4_K: {
            const auto & s = static_cast<const BlockQ4_K *>(src)[row * (nb / 8) + b / 8];
            const int j = static_cast<int>(b % 8);
            const uint8_t * q = s.qs + 32 * (j / 2);  // sub-blocks 2i and 2i+1 share 32 bytes: low, high nibbles
            for (int c = 0; c < 32; ++c) u[c] = j % 2 == 0 ? (q[c] & 0x0f) : (q[c] >> 4);
            put_nibbles(blk, r, u);
            q4_k_scale_min(s.scales, j, blk + 256 + r, blk + 272 + r);
            std::memcpy(tail + 2 * r, &s.d, 2);
            std::memcpy(tail + 32 + 2 * r, &s.dmin, 2);
            return;
        }
        case PackedFormat::Q6_K: {
            const auto & s = static_cast<const BlockQ6_K *>(src)[row * (nb / 8) + b / 8];
            const int col0 = static_cast<int>(b % 8) * 32;
            for (int c = 0; c < 32; ++c) u[c] = q6_k_weight(s, col0 + c);
            put_nibbles(blk, r, u);
            // Two planes (columns 0-15, 16-31); byte 4r+i, bits 2j..2j+1 = bits 4-5 of column 16h+4j+i.
            for (int c = 0; c < 32; ++c) {
                blk[256 + 64 * (c / 16) + 4 * r + c % 4] |= static_cast<uint8_t>((u[c] >> 4) << (2 * ((c % 16) / 4)));
            }
            blk[384 + r] = static_cast<uint8_t>(s.scales[col0 / 16]);
            blk[400 + r] = static_cast<uint8_t>(s.scales[col0 / 16 + 1]);
            std::memcpy(tail + 2 * r, &s.d, 2);
            return;
        }
        case PackedFormat::F16:
        case PackedFormat::BF16: return;  // pack_matrix copies rows
    }
}

}  // namespace

bool packable(ggml_type type, int64_t k, PackedFormat * format) {
    if (k <= 0 || k % kBlock != 0) return false;
    switch (type) {
        case GGML_TYPE_Q8_0: *format = PackedFormat::Q8_0; return true;
        case GGML_TYPE_Q4_0: *format = PackedFormat::Q4_0; return true;
        case GGML_TYPE_Q4_1: *format = PackedFormat::Q4_1; return true;
        case GGML_TYPE_Q5_0: *format = PackedFormat::Q5_0; return true;
        case GGML_TYPE_Q4_K: *format = PackedFormat::Q4_K; return k % 256 == 0;
        case GGML_TYPE_Q6_K: *format = PackedFormat::Q6_K; return k % 256 == 0;
        case GGML_TYPE_F16: *format = PackedFormat::F16; return true;
        case GGML_TYPE_BF16: *format = PackedFormat::BF16; return true;
        default: return false;
    }
}

void pack_matrix(const PackedMatrix & m, const void * src, void * dst) {
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
        uint8_t * group = out + (row / kGroupRows) * m.group_bytes();
        for (int64_t b = 0; b < m.n_blocks(); ++b) {
            pack_block(m, src, row, b, group + packed_block_offset(m.format, b), group + packed_super_tail_offset(m.format, b),
                       static_cast<int>(row % kGroupRows));
        }
    }
}

const PackedMatrix * packed_matrix_of(const ggml_tensor * w) {
    if (!w || w->type != GGML_TYPE_I8 || !w->extra) return nullptr;
    const auto * m = static_cast<const PackedMatrix *>(w->extra);
    return m->magic == PackedMatrix::kMagic ? m : nullptr;
}

}  // namespace specula::kernels
