#pragma once
#include <cstdint>
#include <cstring>

namespace specula::kernels {

// Exact F16 -> F32 (every F16 is an F32), bit-identical to the hardware's vcvtph2ps.
inline float fp16_to_fp32(uint16_t h) {
    const uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ffu;
    uint32_t bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (mant << 13);
    } else if (exp != 0) {
        bits = sign | ((exp + 112) << 23) | (mant << 13);
    } else if (mant == 0) {
        bits = sign;
    } else {  // subnormal half: normalise
        int e = -1;
        uint32_t m = mant;
        do {
            m <<= 1;
            ++e;
        } while (!(m & 0x400u));
        bits = sign | static_cast<uint32_t>(112 - e) << 23 | ((m & 0x3ffu) << 13);
    }
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

}  // namespace specula::kernels
