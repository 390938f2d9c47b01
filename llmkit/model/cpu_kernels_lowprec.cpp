// Few-row products through low-precision weights (llmkit/model/cpu_kernels.py: Bf16PanelWeight,
// Int8PanelWeight), for CPUs with AVX-512 (bf16) and AVX-512 VNNI (int8): y[M, N] = x[M, K] Wᵀ + bias.
//
// A decoding step at batch 1 streams every weight once: bf16 weights are half the bytes of float32, int8
// blocks (with their scales) 0.27 of them, and the step's time follows. Both keep the float32 kernel's
// layout in panels of 16 output columns, read front to back with a prefetch ahead:
// - bf16: [panel][K / 2][16][2]: each vector holds one pair of inputs (k, k+1) of 16 columns, widened to
//   float32 in registers and multiplied by the float32 rows (FMA);
// - int8 (q8_0's scheme): [panel][K / 32]{8 vectors of [16][4] bytes, 16 fp16 scales}: per column and block
//   of 32 inputs, d = max|w| / 127 and q = round(w / d), stored as q + 128 (unsigned: the operand
//   _mm512_dpbusd_epi32 reads unsigned); the rows are quantised per block of 32 on the fly in two signed
//   8-bit parts (q and the remainder r, below), the integer sums corrected by -128 x (the row's block sum)
//   and scaled into float32 sums.
// The rows stay (near) float32 so that a product differs from float32's by the weights' rounding alone:
// SmolLM2's greedy replies kept float32's tokens on 16/20 (bf16) and 14/20 (int8) prompts with the rows
// rounded as the weights (bf16; q8_0, as llama.cpp), parting at near ties (bench/results/
// 2026-12-07-decode-lowprec.md). Those kernels stay (..._bf16_rows, ..._q8_rows) to measure against.
// Each output is the same sequence of operations whatever M and the thread count: a row's result does not
// depend on its batch.

#include <cmath>
#include <cstdint>
#include <cstring>
#include <immintrin.h>
#include <vector>

#define BF16 __attribute__((target("avx512f,avx512bw,avx512bf16")))
#define VNNI __attribute__((target("avx512f,avx512bw,avx512vnni,f16c")))
#define F32 __attribute__((target("avx512f,avx512bw")))
#define F16 __attribute__((target("avx512f,avx512bw,f16c")))

namespace {
constexpr int LANES = 16;
constexpr int QK = 32;                       // inputs per int8 block
constexpr int64_t BLOCK_BYTES = QK * LANES + LANES * 2;  // a panel's block: 512 weights, 16 fp16 scales
constexpr int64_t PREFETCH_BYTES = 8192;

inline __mmask16 lanes_left(int64_t left) {
  return left >= LANES ? __mmask16(0xFFFF) : left <= 0 ? __mmask16(0) : __mmask16((1u << left) - 1);
}

inline uint16_t bf16_nearest_even(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7FFFFFFF) > 0x7F800000) return uint16_t((u >> 16) | 0x40);  // a NaN stays a (quiet) NaN
  return uint16_t((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
}

VNNI inline uint16_t fp16_of(float f) { return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT); }
VNNI inline float float_of_fp16(uint16_t h) { return _cvtsh_ss(h); }

template <int M, int NP>
BF16 void bf16_pass(const uint32_t* x, int64_t K2, const uint16_t* w, const float* bias, float* y, int64_t N,
                    int64_t n_left) {
  __m512 acc[M][NP];
  for (int p = 0; p < NP; ++p) {
    __m512 b = bias ? _mm512_maskz_loadu_ps(lanes_left(n_left - p * LANES), bias + p * LANES) : _mm512_setzero_ps();
    for (int m = 0; m < M; ++m) acc[m][p] = b;
  }
  for (int64_t k = 0; k < K2; ++k) {
    __m512i wk[NP];
    for (int p = 0; p < NP; ++p) {
      const uint16_t* at = w + (p * K2 + k) * 2 * LANES;
      _mm_prefetch(reinterpret_cast<const char*>(at) + PREFETCH_BYTES, _MM_HINT_T1);
      wk[p] = _mm512_loadu_si512(at);
    }
    for (int m = 0; m < M; ++m) {
      __m512i a = _mm512_set1_epi32(int(x[m * K2 + k]));
      for (int p = 0; p < NP; ++p) acc[m][p] = _mm512_dpbf16_ps(acc[m][p], (__m512bh)a, (__m512bh)wk[p]);
    }
  }
  for (int p = 0; p < NP; ++p)
    for (int m = 0; m < M; ++m) _mm512_mask_storeu_ps(y + m * N + p * LANES, lanes_left(n_left - p * LANES), acc[m][p]);
}

// Products of float32 rows through 16-bit weights widened to float32 in registers, with float32 FMA: at few rows
// they stream the bytes of AVX512-BF16's dot product and are as fast (SmolLM2's products at 1 row: 30.0 against
// 29.6 ms CPU; at 16 rows faster, no rounding of the rows to do). A load holds INPUTS inputs of a panel's 16
// columns; `widen` makes them float32 vectors.
//
// bf16: [panel][K / 2][16][2], a pair of inputs (k, k+1) a 64-byte load; a bf16 is a float32's upper half: the
// even input shifted up 16 bits, the odd one masked
struct Bf16Pairs {
  static constexpr int INPUTS = 2;
  F32 static void widen(const uint16_t* at, __m512 w[INPUTS]) {
    const __m512i v = _mm512_loadu_si512(at);
    w[0] = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
    w[1] = _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32(int(0xFFFF0000u))));
  }
};

// fp16: [panel][K][16], one input a 32-byte load widened by vcvtph2ps (AVX-512F's form): bf16's bytes with 3 more
// bits of each weight's mantissa (bf16's rounding parted SmolLM2's greedy tokens from float32's at near ties)
struct F16Singles {
  static constexpr int INPUTS = 1;
  F32 static void widen(const uint16_t* at, __m512 w[INPUTS]) {
    w[0] = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(at)));
  }
};

template <class Weights, int M, int NP>
F32 void widened_pass(const float* x, int64_t K, const uint16_t* w, const float* bias, float* y, int64_t N,
                      int64_t n_left) {
  constexpr int INPUTS = Weights::INPUTS;
  const int64_t loads = (K + INPUTS - 1) / INPUTS;
  __m512 acc[M][NP];
  for (int p = 0; p < NP; ++p) {
    __m512 b = bias ? _mm512_maskz_loadu_ps(lanes_left(n_left - p * LANES), bias + p * LANES) : _mm512_setzero_ps();
    for (int m = 0; m < M; ++m) acc[m][p] = b;
  }
  for (int64_t l = 0; l < loads; ++l) {
    __m512 wk[NP][INPUTS];
    for (int p = 0; p < NP; ++p) {
      const uint16_t* at = w + (p * loads + l) * INPUTS * LANES;
      _mm_prefetch(reinterpret_cast<const char*>(at) + PREFETCH_BYTES, _MM_HINT_T1);
      Weights::widen(at, wk[p]);
    }
    const int64_t k = l * INPUTS;
    const bool whole = k + INPUTS <= K;  // an odd K's last pair: its upper weight is 0, its input absent
    for (int m = 0; m < M; ++m) {
      __m512 a[INPUTS];
      for (int i = 0; i < INPUTS; ++i) a[i] = _mm512_set1_ps(i == 0 || whole ? x[m * K + k + i] : 0.0f);
      for (int p = 0; p < NP; ++p)
        for (int i = 0; i < INPUTS; ++i) acc[m][p] = _mm512_fmadd_ps(wk[p][i], a[i], acc[m][p]);
    }
  }
  for (int p = 0; p < NP; ++p)
    for (int m = 0; m < M; ++m) _mm512_mask_storeu_ps(y + m * N + p * LANES, lanes_left(n_left - p * LANES), acc[m][p]);
}

// a row's quantised blocks: q [nb * 32] signed, d [nb] its scales, sums [nb] the sum of each block's q; split
// rows also keep what q leaves, x / d - q in [-1/2, 1/2], as r = round(254 (x / d - q)) (signed 8 bits):
// x = d (q + r / 254) to d / 508, float32's 8 bits more than q alone (d / 2)
struct QuantRows {
  std::vector<int8_t> q, r;
  std::vector<float> d;
  std::vector<int32_t> sum, r_sum;
};
constexpr float SPLIT = 254.0f;

// TWO_PARTS: the weights times q and times r (two VNNI dot products a vector: the step still waits on the
// weights at few rows), then d (254 q.w + r.w) / 254; else times q only, as llama.cpp's q8_0 x q8_0
template <int M, int NP, bool TWO_PARTS>
VNNI void int8_pass(const QuantRows& xq, int64_t m0, int64_t nb, const uint8_t* w, const float* bias, float* y,
                    int64_t N, int64_t n_left) {
  __m512 acc[M][NP];
  for (int p = 0; p < NP; ++p) {
    __m512 b = bias ? _mm512_maskz_loadu_ps(lanes_left(n_left - p * LANES), bias + p * LANES) : _mm512_setzero_ps();
    for (int m = 0; m < M; ++m) acc[m][p] = b;
  }
  const int8_t* q = xq.q.data() + m0 * nb * QK;
  const int8_t* r = TWO_PARTS ? xq.r.data() + m0 * nb * QK : nullptr;
  for (int64_t b = 0; b < nb; ++b) {
    __m512i dots[M][NP], rest[TWO_PARTS ? M : 1][NP];
    for (int m = 0; m < M; ++m)
      for (int p = 0; p < NP; ++p) {
        dots[m][p] = _mm512_set1_epi32(-128 * xq.sum[(m0 + m) * nb + b]);  // the weights' +128 taken back
        if (TWO_PARTS) rest[m][p] = _mm512_set1_epi32(-128 * xq.r_sum[(m0 + m) * nb + b]);
      }
    for (int g = 0; g < QK / 4; ++g) {
      __m512i wk[NP];
      for (int p = 0; p < NP; ++p) {
        const uint8_t* at = w + (p * nb + b) * BLOCK_BYTES + g * 4 * LANES;
        _mm_prefetch(reinterpret_cast<const char*>(at) + PREFETCH_BYTES, _MM_HINT_T1);
        wk[p] = _mm512_loadu_si512(at);
      }
      for (int m = 0; m < M; ++m) {
        int32_t four;
        std::memcpy(&four, q + (m * nb + b) * QK + g * 4, 4);
        __m512i a = _mm512_set1_epi32(four);
        for (int p = 0; p < NP; ++p) dots[m][p] = _mm512_dpbusd_epi32(dots[m][p], wk[p], a);
        if (TWO_PARTS) {
          std::memcpy(&four, r + (m * nb + b) * QK + g * 4, 4);
          a = _mm512_set1_epi32(four);
          for (int p = 0; p < NP; ++p) rest[m][p] = _mm512_dpbusd_epi32(rest[m][p], wk[p], a);
        }
      }
    }
    for (int p = 0; p < NP; ++p) {
      __m512 scale = _mm512_cvtph_ps(_mm256_loadu_si256(
          reinterpret_cast<const __m256i*>(w + (p * nb + b) * BLOCK_BYTES + QK * LANES)));
      for (int m = 0; m < M; ++m) {
        __m512 dot = _mm512_cvtepi32_ps(dots[m][p]);  // |sum| < 2^24: exact
        __m512 d = _mm512_set1_ps(xq.d[(m0 + m) * nb + b]);
        if (TWO_PARTS) {
          dot = _mm512_fmadd_ps(dot, _mm512_set1_ps(SPLIT), _mm512_cvtepi32_ps(rest[m][p]));
          d = _mm512_set1_ps(xq.d[(m0 + m) * nb + b] / SPLIT);
        }
        acc[m][p] = _mm512_fmadd_ps(dot, _mm512_mul_ps(scale, d), acc[m][p]);
      }
    }
  }
  for (int p = 0; p < NP; ++p)
    for (int m = 0; m < M; ++m) _mm512_mask_storeu_ps(y + m * N + p * LANES, lanes_left(n_left - p * LANES), acc[m][p]);
}

constexpr int PANELS = 3;
constexpr int BF16_ROWS = 8;  // 8 x 3 float32 sums in registers
constexpr int INT8_ROWS = 4;  // 4 x 3 integer and 4 x 3 float32 sums
constexpr int INT8_SPLIT_ROWS = 2;  // 2 x 3 x 2 integer and 2 x 3 float32 sums (3 or 4 rows spill registers)

using bf16_fn = void (*)(const uint32_t*, int64_t, const uint16_t*, const float*, float*, int64_t, int64_t);
using widened_fn = void (*)(const float*, int64_t, const uint16_t*, const float*, float*, int64_t, int64_t);
using int8_fn = void (*)(const QuantRows&, int64_t, int64_t, const uint8_t*, const float*, float*, int64_t, int64_t);

template <int NP>
constexpr bf16_fn BF16_PASSES[BF16_ROWS + 1] = {nullptr, bf16_pass<1, NP>, bf16_pass<2, NP>, bf16_pass<3, NP>,
                                                bf16_pass<4, NP>, bf16_pass<5, NP>, bf16_pass<6, NP>,
                                                bf16_pass<7, NP>, bf16_pass<8, NP>};
template <class Weights, int NP>
constexpr widened_fn WIDENED_PASSES[BF16_ROWS + 1] = {
    nullptr, widened_pass<Weights, 1, NP>, widened_pass<Weights, 2, NP>, widened_pass<Weights, 3, NP>,
    widened_pass<Weights, 4, NP>, widened_pass<Weights, 5, NP>, widened_pass<Weights, 6, NP>,
    widened_pass<Weights, 7, NP>, widened_pass<Weights, 8, NP>};
template <int NP, bool S>
constexpr int8_fn INT8_PASSES[INT8_ROWS + 1] = {nullptr, int8_pass<1, NP, S>, int8_pass<2, NP, S>,
                                                int8_pass<3, NP, S>, int8_pass<4, NP, S>};

// x [M, K] float32 -> q8 blocks of 32 per row (the last zero-padded), as ggml's quantize_row_q8_0; split: and
// the remainders r
VNNI void quantize_rows(const float* x, int64_t M, int64_t K, int64_t nb, QuantRows& out, bool split) {
  out.q.assign(M * nb * QK, 0);
  out.r.assign(split ? M * nb * QK : 0, 0);
  out.d.assign(M * nb, 0.0f);
  out.sum.assign(M * nb, 0);
  out.r_sum.assign(split ? M * nb : 0, 0);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t b = 0; b < nb; ++b) {
      const float* xb = x + m * K + b * QK;
      int64_t n = K - b * QK < QK ? K - b * QK : QK;
      __m512 lo = _mm512_maskz_loadu_ps(lanes_left(n), xb);
      __m512 hi = _mm512_maskz_loadu_ps(lanes_left(n - LANES), xb + LANES);
      float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(lo), _mm512_abs_ps(hi)));
      float d = amax / 127.0f;
      __m512 inverse = _mm512_set1_ps(d > 0 ? 1.0f / d : 0.0f);
      __m512 slo = _mm512_mul_ps(lo, inverse), shi = _mm512_mul_ps(hi, inverse);
      __m512i qlo = _mm512_cvtps_epi32(slo);  // nearest, ties to even
      __m512i qhi = _mm512_cvtps_epi32(shi);
      int8_t* q = out.q.data() + (m * nb + b) * QK;
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q), _mm512_cvtsepi32_epi8(qlo));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q + LANES), _mm512_cvtsepi32_epi8(qhi));
      out.d[m * nb + b] = d;
      out.sum[m * nb + b] = _mm512_reduce_add_epi32(_mm512_add_epi32(qlo, qhi));
      if (!split) continue;
      const __m512 scale = _mm512_set1_ps(SPLIT);
      __m512i rlo = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_sub_ps(slo, _mm512_cvtepi32_ps(qlo)), scale));
      __m512i rhi = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_sub_ps(shi, _mm512_cvtepi32_ps(qhi)), scale));
      int8_t* r = out.r.data() + (m * nb + b) * QK;
      _mm_storeu_si128(reinterpret_cast<__m128i*>(r), _mm512_cvtsepi32_epi8(rlo));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(r + LANES), _mm512_cvtsepi32_epi8(rhi));
      out.r_sum[m * nb + b] = _mm512_reduce_add_epi32(_mm512_add_epi32(rlo, rhi));
    }
}
template <bool S>
VNNI void int8_product(const float* x, int64_t M, int64_t K, const uint8_t* w, const float* bias, int64_t N, float* y,
                       int threads) {
  const int64_t nb = (K + QK - 1) / QK, panels = (N + LANES - 1) / LANES, groups = (panels + PANELS - 1) / PANELS;
  constexpr int at_once = S ? INT8_SPLIT_ROWS : INT8_ROWS;
  QuantRows xq;
  quantize_rows(x, M, K, nb, xq, S);
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t g = 0; g < groups; ++g) {
    int64_t p = g * PANELS;
    int np = panels - p < PANELS ? int(panels - p) : PANELS;
    for (int64_t m = 0; m < M; m += at_once) {
      int rows = M - m < at_once ? int(M - m) : at_once;
      int8_fn run = np == 3 ? INT8_PASSES<3, S>[rows] : np == 2 ? INT8_PASSES<2, S>[rows] : INT8_PASSES<1, S>[rows];
      run(xq, m, nb, w + p * nb * BLOCK_BYTES, bias ? bias + p * LANES : nullptr, y + m * N + p * LANES, N,
          N - p * LANES);
    }
  }
}

// x [M, K] and y [M, N] contiguous float32, w packed for Weights, bias [N] or null
template <class Weights>
F32 void widened_product(const float* x, int64_t M, int64_t K, const uint16_t* w, const float* bias, int64_t N,
                         float* y, int threads) {
  const int64_t panel_values = (K + Weights::INPUTS - 1) / Weights::INPUTS * Weights::INPUTS * LANES;
  const int64_t panels = (N + LANES - 1) / LANES, groups = (panels + PANELS - 1) / PANELS;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t g = 0; g < groups; ++g) {
    int64_t p = g * PANELS;
    int np = panels - p < PANELS ? int(panels - p) : PANELS;
    for (int64_t m = 0; m < M; m += BF16_ROWS) {
      int rows = M - m < BF16_ROWS ? int(M - m) : BF16_ROWS;
      widened_fn run = np == 3   ? WIDENED_PASSES<Weights, 3>[rows]
                       : np == 2 ? WIDENED_PASSES<Weights, 2>[rows]
                                 : WIDENED_PASSES<Weights, 1>[rows];
      run(x + m * K, K, w + p * panel_values, bias ? bias + p * LANES : nullptr, y + m * N + p * LANES, N,
          N - p * LANES);
    }
  }
}
}  // namespace

extern "C" {

// bf16 weights times float32 rows need AVX-512 only; times bf16 rows (llmkit_bf16_panel_product_bf16_rows), AVX512-BF16
int llmkit_bf16_supported() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
}

int llmkit_bf16_rows_supported() {
  __builtin_cpu_init();
  return llmkit_bf16_supported() && __builtin_cpu_supports("avx512bf16");
}

int llmkit_int8_supported() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vnni");
}

// bf16 values (uint16) of the packed weight [N, K]
int64_t llmkit_bf16_panel_values(int64_t N, int64_t K) { return (N + LANES - 1) / LANES * LANES * ((K + 1) / 2 * 2); }

// w [N, K] float32 row-major -> [ceil(N / 16)][ceil(K / 2)][16][2] bf16, rounded to nearest even
void llmkit_bf16_panel_pack(const float* w, int64_t N, int64_t K, uint16_t* out, int threads) {
  const int64_t panels = (N + LANES - 1) / LANES, K2 = (K + 1) / 2;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t p = 0; p < panels; ++p)
    for (int64_t k2 = 0; k2 < K2; ++k2)
      for (int j = 0; j < LANES; ++j)
        for (int i = 0; i < 2; ++i) {
          int64_t n = p * LANES + j, k = 2 * k2 + i;
          out[((p * K2 + k2) * LANES + j) * 2 + i] = n < N && k < K ? bf16_nearest_even(w[n * K + k]) : 0;
        }
}

// w [N, K] of the packed weight back as float32 (what the product multiplies by)
void llmkit_bf16_panel_unpack(const uint16_t* packed, int64_t N, int64_t K, float* w) {
  const int64_t K2 = (K + 1) / 2;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) {
      uint32_t u = uint32_t(packed[(((n / LANES) * K2 + k / 2) * LANES + n % LANES) * 2 + k % 2]) << 16;
      std::memcpy(w + n * K + k, &u, 4);
    }
}

// x [M, K] and y [M, N] contiguous float32, w from llmkit_bf16_panel_pack, bias [N] or null: float32 rows
F32 void llmkit_bf16_panel_product(const float* x, int64_t M, int64_t K, const uint16_t* w, const float* bias,
                                   int64_t N, float* y, int threads) {
  widened_product<Bf16Pairs>(x, M, K, w, bias, N, y, threads);
}

// as llmkit_bf16_panel_product with the rows rounded to bf16 too (AVX512-BF16's dot product: kept to measure)
BF16 void llmkit_bf16_panel_product_bf16_rows(const float* x, int64_t M, int64_t K, const uint16_t* w,
                                              const float* bias, int64_t N, float* y, int threads) {
  const int64_t K2 = (K + 1) / 2, panels = (N + LANES - 1) / LANES, groups = (panels + PANELS - 1) / PANELS;
  std::vector<uint32_t> xb(M * K2);  // the rows in bf16, pairs of inputs as one 32-bit value
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k2 = 0; k2 < K2; ++k2) {
      uint32_t lo = bf16_nearest_even(x[m * K + 2 * k2]);
      uint32_t hi = 2 * k2 + 1 < K ? bf16_nearest_even(x[m * K + 2 * k2 + 1]) : 0;
      xb[m * K2 + k2] = lo | hi << 16;
    }
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t g = 0; g < groups; ++g) {
    int64_t p = g * PANELS;
    int np = panels - p < PANELS ? int(panels - p) : PANELS;
    for (int64_t m = 0; m < M; m += BF16_ROWS) {
      int rows = M - m < BF16_ROWS ? int(M - m) : BF16_ROWS;
      bf16_fn run = np == 3 ? BF16_PASSES<3>[rows] : np == 2 ? BF16_PASSES<2>[rows] : BF16_PASSES<1>[rows];
      run(xb.data() + m * K2, K2, w + p * K2 * 2 * LANES, bias ? bias + p * LANES : nullptr, y + m * N + p * LANES,
          N, N - p * LANES);
    }
  }
}

int llmkit_f16_supported() {
  __builtin_cpu_init();
  return llmkit_bf16_supported() && __builtin_cpu_supports("f16c");
}

// fp16 values (uint16) of the packed weight [N, K]
int64_t llmkit_f16_panel_values(int64_t N, int64_t K) { return (N + LANES - 1) / LANES * LANES * K; }

// w [N, K] float32 row-major -> [ceil(N / 16)][K][16] fp16, nearest even (beyond fp16's range: its largest)
F16 void llmkit_f16_panel_pack(const float* w, int64_t N, int64_t K, uint16_t* out, int threads) {
  const int64_t panels = (N + LANES - 1) / LANES;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t p = 0; p < panels; ++p)
    for (int64_t k = 0; k < K; ++k)
      for (int j = 0; j < LANES; ++j) {
        const int64_t n = p * LANES + j;
        const float v = n < N ? std::fmin(std::fmax(w[n * K + k], -65504.0f), 65504.0f) : 0.0f;
        out[(p * K + k) * LANES + j] = _cvtss_sh(v, _MM_FROUND_TO_NEAREST_INT);
      }
}

// w [N, K] of the packed weight back as float32
F16 void llmkit_f16_panel_unpack(const uint16_t* packed, int64_t N, int64_t K, float* w) {
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) w[n * K + k] = _cvtsh_ss(packed[((n / LANES) * K + k) * LANES + n % LANES]);
}

// x [M, K] and y [M, N] contiguous float32, w from llmkit_f16_panel_pack, bias [N] or null
F32 void llmkit_f16_panel_product(const float* x, int64_t M, int64_t K, const uint16_t* w, const float* bias,
                                  int64_t N, float* y, int threads) {
  widened_product<F16Singles>(x, M, K, w, bias, N, y, threads);
}

// bytes of the packed int8 weight [N, K]
int64_t llmkit_int8_panel_bytes(int64_t N, int64_t K) { return (N + LANES - 1) / LANES * ((K + QK - 1) / QK) * BLOCK_BYTES; }

// w [N, K] float32 row-major -> [ceil(N / 16)][ceil(K / 32)]{[8][16][4] q + 128, [16] fp16 d}, as ggml's
// quantize_row_q8_0 per column: d = max|w| / 127, q = round(w / d)
VNNI void llmkit_int8_panel_pack(const float* w, int64_t N, int64_t K, uint8_t* out, int threads) {
  const int64_t panels = (N + LANES - 1) / LANES, nb = (K + QK - 1) / QK;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t p = 0; p < panels; ++p)
    for (int64_t b = 0; b < nb; ++b) {
      uint8_t* block = out + (p * nb + b) * BLOCK_BYTES;
      uint16_t scales[LANES];
      for (int j = 0; j < LANES; ++j) {
        const int64_t n = p * LANES + j;
        float amax = 0;
        for (int i = 0; i < QK && n < N && b * QK + i < K; ++i) amax = std::fmax(amax, std::fabs(w[n * K + b * QK + i]));
        const float d = amax / 127.0f, inverse = d > 0 ? 1.0f / d : 0.0f;
        scales[j] = fp16_of(d);
        for (int i = 0; i < QK; ++i) {
          const int64_t k = b * QK + i;
          const float q = n < N && k < K ? std::nearbyint(w[n * K + k] * inverse) : 0.0f;
          block[(i / 4) * 4 * LANES + j * 4 + i % 4] = uint8_t(int(q) + 128);
        }
      }
      std::memcpy(block + QK * LANES, scales, sizeof scales);
    }
}

// w [N, K] of the packed weight back as float32: d x q (what the product multiplies by)
VNNI void llmkit_int8_panel_unpack(const uint8_t* packed, int64_t N, int64_t K, float* w) {
  const int64_t nb = (K + QK - 1) / QK;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) {
      const uint8_t* block = packed + ((n / LANES) * nb + k / QK) * BLOCK_BYTES;
      uint16_t d;
      std::memcpy(&d, block + QK * LANES + (n % LANES) * 2, 2);
      const int i = int(k % QK);
      w[n * K + k] = float_of_fp16(d) * float(int(block[(i / 4) * 4 * LANES + (n % LANES) * 4 + i % 4]) - 128);
    }
}

// x [M, K] float32 as the product multiplies it (split: d (q + r / 254), else d q) [M, K]
VNNI void llmkit_int8_quantize_rows(const float* x, int64_t M, int64_t K, float* out, int split) {
  const int64_t nb = (K + QK - 1) / QK;
  QuantRows xq;
  quantize_rows(x, M, K, nb, xq, split);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k) {
      const int64_t at = m * nb * QK + k;
      const float d = xq.d[m * nb + k / QK];
      out[m * K + k] = split ? d / SPLIT * (float(xq.q[at]) * SPLIT + float(xq.r[at])) : d * float(xq.q[at]);
    }
}


// x [M, K] and y [M, N] contiguous float32, w from llmkit_int8_panel_pack, bias [N] or null; the rows split
// into q and r (16 bits a value to the block's max)
VNNI void llmkit_int8_panel_product(const float* x, int64_t M, int64_t K, const uint8_t* w, const float* bias,
                                    int64_t N, float* y, int threads) {
  int8_product<true>(x, M, K, w, bias, N, y, threads);
}

// as llmkit_int8_panel_product with the rows as q8_0 (q only: llama.cpp's product; kept to measure)
VNNI void llmkit_int8_panel_product_q8_rows(const float* x, int64_t M, int64_t K, const uint8_t* w,
                                            const float* bias, int64_t N, float* y, int threads) {
  int8_product<false>(x, M, K, w, bias, N, y, threads);
}
}
