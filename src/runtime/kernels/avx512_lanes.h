#pragma once
// Lane helpers shared by the AVX-512 kernel bodies (included only by files built with -mavx512f).
#include <immintrin.h>

#include <cstdint>

namespace specula::kernels::avx512 {

// 16 F16 values (32 bytes at p) as floats.
inline __m512 load_f16x16(const void * p) { return _mm512_cvtph_ps(_mm256_loadu_si256(static_cast<const __m256i *>(p))); }

// The kernels' fixed halving tree over 16 lanes: lane[l] += lane[l + w] for w = 8, 4, 2, 1, then
// lane 0 (matmul.h's and attention_body.inc's order, so the bits are the portable bodies' bits).
inline float reduce16(__m512 v) {
    const __m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}

}  // namespace specula::kernels::avx512
