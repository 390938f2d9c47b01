// The float32 kernels of decoding on CPUs with AVX-512 (llmkit/cpu_kernels.py): few-row products
// y[M, N] = x[M, K] Wᵀ + bias, one new token's attention over the KV cache, and the small steps
// between them (RMSNorm, rotary embedding, SwiGLU's silu(gate) * up), each one pass over its rows.
//
// Products. A decoding step multiplies a few rows by every weight matrix, so the time is that of streaming
// the weights from memory while the FMAs on them run. W is laid out once in panels of 16 output
// columns ([panel][k][16], the last panel zero-padded): one pass reads 3 panels front to back,
// prefetching ahead into L2, and keeps the 8 rows x 48 columns it computes in 24 registers; more
// rows take more passes over the same panels, which are then in cache. Each output is one FMA
// chain over k in order (no reassociation), computed the same way whatever M and the thread count.
//
// Built without -mavx512f: the kernels carry the target attribute, and `llmkit_kernels_supported`
// tells the caller whether this CPU may run them. Threads are OpenMP's, as many as the caller
// passes (torch's count), over groups of panels.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <immintrin.h>
#include <vector>

#define AVX512 __attribute__((target("avx512f,fma")))

namespace {
constexpr int LANES = 16;            // float32 values per vector: the width of a panel
constexpr int PANELS = 3;            // panels one pass reads
constexpr int ROWS = 8;              // rows one pass computes: ROWS x PANELS accumulators
constexpr int64_t PREFETCH = 2048;   // floats (8 KB) ahead of the weights being read

AVX512 inline __mmask16 lanes_left(int64_t left) {
  return left >= LANES ? __mmask16(0xFFFF) : __mmask16((1u << left) - 1);
}

template <int M, int NP>
AVX512 void pass(const float* x, int64_t K, const float* w, const float* bias, float* y, int64_t N, int64_t n_left) {
  __m512 acc[M][NP];
  for (int p = 0; p < NP; ++p) {
    __m512 b = bias ? _mm512_maskz_loadu_ps(lanes_left(n_left - p * LANES), bias + p * LANES) : _mm512_setzero_ps();
    for (int m = 0; m < M; ++m) acc[m][p] = b;
  }
  for (int64_t k = 0; k < K; ++k) {
    __m512 wk[NP];
    for (int p = 0; p < NP; ++p) {
      const float* at = w + (p * K + k) * LANES;
      _mm_prefetch(reinterpret_cast<const char*>(at + PREFETCH), _MM_HINT_T1);
      wk[p] = _mm512_loadu_ps(at);
    }
    for (int m = 0; m < M; ++m) {
      __m512 a = _mm512_set1_ps(x[m * K + k]);
      for (int p = 0; p < NP; ++p) acc[m][p] = _mm512_fmadd_ps(a, wk[p], acc[m][p]);
    }
  }
  for (int p = 0; p < NP; ++p)
    for (int m = 0; m < M; ++m) _mm512_mask_storeu_ps(y + m * N + p * LANES, lanes_left(n_left - p * LANES), acc[m][p]);
}

// e^x for x <= 0 (softmax after subtracting the maximum): 2^n * p(r), r = x - n ln2 in [-ln2/2, ln2/2],
// p the degree-7 Taylor polynomial (truncation below 1e-8: float rounding dominates); 0 below -87 and at -inf
AVX512 inline __m512 exp_nonpositive(__m512 x) {
  const __m512 zero_below = _mm512_set1_ps(-87.0f);
  __mmask16 tiny = _mm512_cmp_ps_mask(x, zero_below, _CMP_LT_OQ);
  x = _mm512_max_ps(x, zero_below);
  __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145752f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.42860677e-6f), r);
  __m512 p = _mm512_set1_ps(1.0f / 5040);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_maskz_scalef_ps(~tiny, p, n);
}

// one (batch row, key/value head): its G query heads q [G, D] over L cached keys and values
// ([L, D], rows contiguous); scores [G, L] is scratch; out [G, D]. D = C vectors.
template <int C>
AVX512 void attend(const float* q, int G, const float* k, const float* v, const uint8_t* key_mask, int64_t L,
                   float scale, float* scores, float* out) {
  constexpr int64_t D = C * LANES;
  for (int g = 0; g < G; ++g) {
    __m512 qg[C];
    for (int c = 0; c < C; ++c) qg[c] = _mm512_mul_ps(_mm512_loadu_ps(q + g * D + c * LANES), _mm512_set1_ps(scale));
    for (int64_t l = 0; l < L; ++l) {
      __m512 dot = _mm512_mul_ps(qg[0], _mm512_loadu_ps(k + l * D));
      for (int c = 1; c < C; ++c) dot = _mm512_fmadd_ps(qg[c], _mm512_loadu_ps(k + l * D + c * LANES), dot);
      scores[g * L + l] = key_mask && !key_mask[l] ? -INFINITY : _mm512_reduce_add_ps(dot);
    }
  }
  for (int g = 0; g < G; ++g) {
    float* s = scores + g * L;
    __m512 top = _mm512_set1_ps(-INFINITY);
    for (int64_t l = 0; l < L; l += LANES) top = _mm512_max_ps(top, _mm512_mask_loadu_ps(top, lanes_left(L - l), s + l));
    top = _mm512_set1_ps(_mm512_reduce_max_ps(top));
    __m512 sum = _mm512_setzero_ps();
    for (int64_t l = 0; l < L; l += LANES) {
      __mmask16 in = lanes_left(L - l);
      __m512 e = _mm512_maskz_mov_ps(in, exp_nonpositive(_mm512_sub_ps(_mm512_maskz_loadu_ps(in, s + l), top)));
      _mm512_mask_storeu_ps(s + l, in, e);
      sum = _mm512_add_ps(sum, e);
    }
    float total = _mm512_reduce_add_ps(sum);
    __m512 acc[C];
    for (int c = 0; c < C; ++c) acc[c] = _mm512_setzero_ps();
    for (int64_t l = 0; l < L; ++l) {
      if (s[l] == 0.0f) continue;  // a masked key (or one too improbable to count)
      __m512 weight = _mm512_set1_ps(s[l]);
      for (int c = 0; c < C; ++c) acc[c] = _mm512_fmadd_ps(weight, _mm512_loadu_ps(v + l * D + c * LANES), acc[c]);
    }
    __m512 inverse = _mm512_set1_ps(total > 0 ? 1.0f / total : 0.0f);
    for (int c = 0; c < C; ++c) _mm512_storeu_ps(out + g * D + c * LANES, _mm512_mul_ps(acc[c], inverse));
  }
}

using attend_fn = void (*)(const float*, int, const float*, const float*, const uint8_t*, int64_t, float, float*, float*);

using pass_fn = void (*)(const float*, int64_t, const float*, const float*, float*, int64_t, int64_t);

template <int NP>
constexpr pass_fn PASSES[ROWS + 1] = {nullptr, pass<1, NP>, pass<2, NP>, pass<3, NP>, pass<4, NP>,
                                      pass<5, NP>, pass<6, NP>, pass<7, NP>, pass<8, NP>};
}  // namespace

extern "C" {

int llmkit_kernels_supported() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("fma");
}

int64_t llmkit_panel_floats(int64_t N, int64_t K) { return (N + LANES - 1) / LANES * LANES * K; }

// w [N, K] row-major -> out [ceil(N / LANES)][K][LANES]
void llmkit_panel_pack(const float* w, int64_t N, int64_t K, float* out, int threads) {
  int64_t panels = (N + LANES - 1) / LANES;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t p = 0; p < panels; ++p)
    for (int j = 0; j < LANES; ++j) {
      int64_t n = p * LANES + j;
      for (int64_t k = 0; k < K; ++k) out[(p * K + k) * LANES + j] = n < N ? w[n * K + k] : 0.0f;
    }
}

// x [M, K] and y [M, N] contiguous, w from llmkit_panel_pack, bias [N] or null
void llmkit_panel_product(const float* x, int64_t M, int64_t K, const float* w, const float* bias, int64_t N,
                          float* y, int threads) {
  int64_t panels = (N + LANES - 1) / LANES;
  int64_t groups = (panels + PANELS - 1) / PANELS;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t g = 0; g < groups; ++g) {
    int64_t p = g * PANELS;
    int np = panels - p < PANELS ? int(panels - p) : PANELS;
    for (int64_t m = 0; m < M; m += ROWS) {
      int rows = M - m < ROWS ? int(M - m) : ROWS;
      const float* xm = x + m * K;
      const float* wp = w + p * K * LANES;
      const float* bp = bias ? bias + p * LANES : nullptr;
      float* ym = y + m * N + p * LANES;
      pass_fn run = np == 3 ? PASSES<3>[rows] : np == 2 ? PASSES<2>[rows] : PASSES<1>[rows];
      run(xm, K, wp, bp, ym, N, N - p * LANES);
    }
  }
}
}

extern "C" {
// the head sizes llmkit_decode_attention takes: 16, 32, 64, 128 or 256
int llmkit_attention_takes(int64_t D) { return D == 16 || D == 32 || D == 64 || D == 128 || D == 256; }

// q [B, H, D] contiguous; k, v [B, Hkv, L, D] with rows of D contiguous and the given batch and head
// strides (a KV cache's filled part); key_mask [B, L] (1 = may attend) or null; out [B, H, D]
void llmkit_decode_attention(const float* q, const float* k, const float* v, int64_t batch_stride, int64_t head_stride,
                             const uint8_t* key_mask, int64_t B, int64_t H, int64_t Hkv, int64_t L, int64_t D,
                             float scale, float* out, int threads) {
  const int G = int(H / Hkv);
  attend_fn run = D == 16 ? attend<1> : D == 32 ? attend<2> : D == 64 ? attend<4> : D == 128 ? attend<8> : attend<16>;
#pragma omp parallel num_threads(threads)
  {
    std::vector<float> scores(G * L);
#pragma omp for schedule(static)
    for (int64_t task = 0; task < B * Hkv; ++task) {
      int64_t b = task / Hkv, h = task % Hkv;
      int64_t at = b * batch_stride + h * head_stride;
      run(q + (b * H + h * G) * D, G, k + at, v + at, key_mask ? key_mask + b * L : nullptr, L, scale, scores.data(),
          out + (b * H + h * G) * D);
    }
  }
}
}

// The small steps: a decoding step's tensors are a few rows, so one call each instead of torch's
// several elementwise ops (each a pass over memory the products have just pushed out of cache);
// threads only for a prompt's many rows.
constexpr int64_t PARALLEL_AT = 1 << 16;  // values

extern "C" {

// out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * weight, as transformers' LlamaRMSNorm in float32
AVX512 void llmkit_rms_norm(const float* x, const float* weight, int64_t rows, int64_t dim, float eps, float* out,
                            int threads) {
#pragma omp parallel for num_threads(threads) if (rows * dim >= PARALLEL_AT)
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    __m512 squares = _mm512_setzero_ps();
    for (int64_t i = 0; i < dim; i += LANES) {
      __m512 xi = _mm512_maskz_loadu_ps(lanes_left(dim - i), xr + i);
      squares = _mm512_fmadd_ps(xi, xi, squares);
    }
    __m512 scale = _mm512_set1_ps(1.0f / std::sqrt(_mm512_reduce_add_ps(squares) / float(dim) + eps));
    for (int64_t i = 0; i < dim; i += LANES) {
      __mmask16 in = lanes_left(dim - i);
      __m512 normed = _mm512_mul_ps(_mm512_maskz_loadu_ps(in, xr + i), scale);
      _mm512_mask_storeu_ps(out + r * dim + i, in, _mm512_mul_ps(normed, _mm512_maskz_loadu_ps(in, weight + i)));
    }
  }
}

}  // extern "C"

// silu(g) = g / (1 + e^-g) = g e^g / (1 + e^g): the exponential of -|g| never overflows
AVX512 inline __m512 silu(__m512 g) {
  __m512 e = exp_nonpositive(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_abs_ps(g)));
  __mmask16 negative = _mm512_cmp_ps_mask(g, _mm512_setzero_ps(), _CMP_LT_OQ);
  return _mm512_div_ps(_mm512_mask_mul_ps(g, negative, g, e), _mm512_add_ps(_mm512_set1_ps(1.0f), e));
}

extern "C" {

// out[r] = silu(gate[r]) * up[r] over `width` values; gate and up rows `stride` apart
AVX512 void llmkit_silu_times(const float* gate, const float* up, int64_t rows, int64_t width, int64_t stride,
                              float* out, int threads) {
#pragma omp parallel for num_threads(threads) if (rows * width >= PARALLEL_AT)
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < width; i += LANES) {
      __mmask16 in = lanes_left(width - i);
      __m512 g = _mm512_maskz_loadu_ps(in, gate + r * stride + i);
      _mm512_mask_storeu_ps(out + r * width + i, in, _mm512_mul_ps(silu(g), _mm512_maskz_loadu_ps(in, up + r * stride + i)));
    }
}

// x [B, T, heads, D] in place (strides sb, st, sh; each head's D values contiguous) rotated by the
// rotary embedding in transformers' layout: (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin) over the
// two halves; cos and sin [B, T, D] with strides cb (0: one table for every row) and ct
AVX512 void llmkit_rotate(float* x, int64_t B, int64_t T, int64_t heads, int64_t D, int64_t sb, int64_t st, int64_t sh,
                          const float* cos, const float* sin, int64_t cb, int64_t ct, int threads) {
  const int64_t half = D / 2;
#pragma omp parallel for collapse(2) num_threads(threads) if (B * T * heads * D >= PARALLEL_AT)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      const float* c = cos + b * cb + t * ct;
      const float* s = sin + b * cb + t * ct;
      for (int64_t h = 0; h < heads; ++h) {
        float* p = x + b * sb + t * st + h * sh;
        for (int64_t i = 0; i < half; i += LANES) {
          __mmask16 in = lanes_left(half - i);
          __m512 x1 = _mm512_maskz_loadu_ps(in, p + i), x2 = _mm512_maskz_loadu_ps(in, p + half + i);
          __m512 first = _mm512_sub_ps(_mm512_mul_ps(x1, _mm512_maskz_loadu_ps(in, c + i)),
                                       _mm512_mul_ps(x2, _mm512_maskz_loadu_ps(in, s + i)));
          __m512 second = _mm512_add_ps(_mm512_mul_ps(x2, _mm512_maskz_loadu_ps(in, c + half + i)),
                                        _mm512_mul_ps(x1, _mm512_maskz_loadu_ps(in, s + half + i)));
          _mm512_mask_storeu_ps(p + i, in, first);
          _mm512_mask_storeu_ps(p + half + i, in, second);
        }
      }
    }
}
}

// One decoding step of a Gated DeltaNet layer (llmkit/gated_deltanet.py) for B rows, its states updated in
// place. qkv [B, C] (rows qkv_stride apart: q Hk x Dk, k Hk x Dk, v Hv x Dv) passes the causal depthwise
// conv (weight [K, C], state [B, K - 1, C]: the last inputs, oldest first) and silu into mixed [B, C]; q and k
// are L2-normalised (q then scaled by 1/sqrt(Dk)). Each value head h (sharing key head h / (Hv / Hk)) decays
// its state S [Dk, Dv] by e^g, g = -e^A_log softplus(a + dt_bias), writes beta (v - e^g Sᵀk) with beta =
// sigmoid(b), and reads o = Sᵀq: S streams from memory once, its two passes (what S gives for k; the write
// and o) run while it is in L2. out [B, Hv, Dv] = norm_w * rms_norm(o) * silu(z), z rows z_stride apart.
// Dv a multiple of 16, at most 256 (llmkit_delta_step_takes).
extern "C" {
int llmkit_delta_step_takes(int64_t Dv) { return Dv % LANES == 0 && Dv <= 16 * LANES; }

AVX512 void llmkit_delta_step(const float* qkv, int64_t qkv_stride, const float* z, int64_t z_stride, const float* a,
                              int64_t a_stride, const float* b, int64_t b_stride, const float* conv_w, int64_t K,
                              float* conv_state, float* S, const float* A_log, const float* dt_bias,
                              const float* norm_w, float eps, int64_t B, int64_t Hk, int64_t Hv, int64_t Dk,
                              int64_t Dv, float* mixed, float* out, int threads) {
  const int64_t C = 2 * Hk * Dk + Hv * Dv, keep = K - 1, V = Dv / LANES;
  const float q_scale = 1.0f / std::sqrt(float(Dk));
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t r = 0; r < B; ++r) {
    const float* x = qkv + r * qkv_stride;
    float* st = conv_state + r * keep * C;
    float* m = mixed + r * C;
    for (int64_t c = 0; c < C; c += LANES) {
      __mmask16 in = lanes_left(C - c);
      __m512 xc = _mm512_maskz_loadu_ps(in, x + c), acc = _mm512_setzero_ps();
      for (int64_t i = 0; i < keep; ++i) {
        __m512 past = _mm512_maskz_loadu_ps(in, st + i * C + c);
        acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(in, conv_w + i * C + c), past, acc);
        // the state rolls by one input: each slot takes the next one's, the last the new input
        _mm512_mask_storeu_ps(st + (i ? i - 1 : 0) * C + c, i ? in : 0, past);
      }
      acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(in, conv_w + keep * C + c), xc, acc);
      if (keep) _mm512_mask_storeu_ps(st + (keep - 1) * C + c, in, xc);
      _mm512_mask_storeu_ps(m + c, in, silu(acc));
    }
    for (int64_t h = 0; h < 2 * Hk; ++h) {  // the q heads, then the k heads
      float* v = m + h * Dk;
      float squares = 0;
      for (int64_t i = 0; i < Dk; ++i) squares += v[i] * v[i];
      float inverse = 1.0f / std::sqrt(squares + 1e-6f);
      for (int64_t i = 0; i < Dk; ++i) v[i] = h < Hk ? v[i] * inverse * q_scale : v[i] * inverse;
    }
  }
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t task = 0; task < B * Hv; ++task) {
    const int64_t r = task / Hv, h = task % Hv, hk = h / (Hv / Hk);
    const float* q = mixed + r * C + hk * Dk;
    const float* k = mixed + r * C + (Hk + hk) * Dk;
    const float* v = mixed + r * C + 2 * Hk * Dk + h * Dv;
    float* s = S + task * Dk * Dv;
    float shifted = a[r * a_stride + h] + dt_bias[h];
    float softplus = shifted > 20.0f ? shifted : std::log1p(std::exp(shifted));  // torch's threshold
    __m512 decay = _mm512_set1_ps(std::exp(-std::exp(A_log[h]) * softplus));
    __m512 beta = _mm512_set1_ps(1.0f / (1.0f + std::exp(-b[r * b_stride + h])));
    __m512 acc[16], delta[16];
    for (int64_t j = 0; j < V; ++j) acc[j] = _mm512_setzero_ps();
    for (int64_t i = 0; i < Dk; ++i) {
      __m512 ki = _mm512_set1_ps(k[i]);
      for (int64_t j = 0; j < V; ++j) acc[j] = _mm512_fmadd_ps(ki, _mm512_loadu_ps(s + i * Dv + j * LANES), acc[j]);
    }
    for (int64_t j = 0; j < V; ++j) {
      __m512 remembered = _mm512_mul_ps(acc[j], decay);
      delta[j] = _mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(v + j * LANES), remembered), beta);
      acc[j] = _mm512_setzero_ps();
    }
    for (int64_t i = 0; i < Dk; ++i) {
      __m512 ki = _mm512_set1_ps(k[i]), qi = _mm512_set1_ps(q[i]);
      for (int64_t j = 0; j < V; ++j) {
        float* at = s + i * Dv + j * LANES;
        __m512 row = _mm512_fmadd_ps(ki, delta[j], _mm512_mul_ps(_mm512_loadu_ps(at), decay));
        _mm512_storeu_ps(at, row);
        acc[j] = _mm512_fmadd_ps(qi, row, acc[j]);
      }
    }
    __m512 squares = _mm512_setzero_ps();
    for (int64_t j = 0; j < V; ++j) squares = _mm512_fmadd_ps(acc[j], acc[j], squares);
    __m512 inverse = _mm512_set1_ps(1.0f / std::sqrt(_mm512_reduce_add_ps(squares) / float(Dv) + eps));
    const float* zr = z + r * z_stride + h * Dv;
    for (int64_t j = 0; j < V; ++j) {
      __m512 normed = _mm512_mul_ps(_mm512_loadu_ps(norm_w + j * LANES), _mm512_mul_ps(acc[j], inverse));
      _mm512_storeu_ps(out + task * Dv + j * LANES, _mm512_mul_ps(normed, silu(_mm512_loadu_ps(zr + j * LANES))));
    }
  }
}
}

// One decoding step (one new token a row) through every layer of a plain decoder (llmkit/model/decode_step.py:
// attention with full RoPE and a SwiGLU MLP, RMSNorm before each), the kernels above called in the order and on
// the values the Python step gives them, so the hidden states are its own bit for bit: one call for the step
// instead of ~15 Python calls a layer (each a ctypes call or a tensor made), ~2 ms of SmolLM2's step at batch 1.
// A product is whichever panel kernel the layer's weight takes (float32, bf16, f16, int8): they share one
// signature but for the type of the weights, which the call passes as an address.
using product_fn = void (*)(const float* x, int64_t M, int64_t K, const void* w, const float* bias, int64_t N,
                            float* y, int threads);

struct Product {  // a layer's product: its kernel, the weight that kernel takes, the bias (null: none)
  product_fn kernel;
  const void* weight;
  const float* bias;

  void operator()(const float* x, int64_t M, int64_t K, int64_t N, float* y, int threads) const {
    kernel(x, M, K, weight, bias, N, y, threads);
  }
};

struct DecodeLayer {  // one layer's addresses, in this order (decode_step.py fills them as int64 slots)
  const float* norm1;
  const float* norm2;
  Product qkv, o, gate_up, down;
  float* k_cache;  // [B, Hkv, max_len, D]
  float* v_cache;
};
static_assert(sizeof(DecodeLayer) == 16 * sizeof(int64_t), "decode_step.py's 16 slots a layer");

namespace {
void add_rows(float* x, const float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = x[i] + y[i];
}
}  // namespace

extern "C" {

// the floats of scratch llmkit_decode_layers needs for B rows
int64_t llmkit_decode_scratch(int64_t B, int64_t hidden, int64_t H, int64_t Hkv, int64_t D, int64_t ffn) {
  return B * (2 * hidden + (H + 2 * Hkv) * D + 2 * H * D + 3 * ffn);
}

// x [B, hidden] (the embeddings of the new tokens) -> the last layer's output, in place. eps [n_layers][2]; the
// new token's keys and values are written at slot `past` of each cache; cos, sin [B or 1, D] (row stride
// cos_stride, 0 for one table), key_mask [B, past + 1] (1 = may attend) or null; scale the attention's.
AVX512 void llmkit_decode_layers(const DecodeLayer* layers, const float* eps, int64_t n_layers, float* x, int64_t B,
                                 int64_t hidden, int64_t H, int64_t Hkv, int64_t D, int64_t ffn, int64_t past,
                                 int64_t max_len, const float* cos, const float* sin, int64_t cos_stride,
                                 const uint8_t* key_mask, float scale, float* scratch, int threads) {
  const int64_t width = (H + 2 * Hkv) * D;  // a row of the q/k/v product: q, then k, then v
  float *h = scratch, *qkv = h + B * hidden, *q = qkv + B * width, *attended = q + B * H * D;
  float *added = attended + B * H * D, *gate_up = added + B * hidden, *act = gate_up + B * 2 * ffn;
  for (int64_t i = 0; i < n_layers; ++i) {
    const DecodeLayer& l = layers[i];
    llmkit_rms_norm(x, l.norm1, B, hidden, eps[2 * i], h, threads);
    l.qkv(h, B, hidden, width, qkv, threads);
    llmkit_rotate(qkv, B, 1, H, D, width, width, D, cos, sin, cos_stride, 0, threads);
    llmkit_rotate(qkv + H * D, B, 1, Hkv, D, width, width, D, cos, sin, cos_stride, 0, threads);
    for (int64_t b = 0; b < B; ++b) {
      const float* row = qkv + b * width;
      std::copy(row, row + H * D, q + b * H * D);
      for (int64_t g = 0; g < Hkv; ++g) {
        int64_t slot = ((b * Hkv + g) * max_len + past) * D;
        std::copy(row + (H + g) * D, row + (H + g + 1) * D, l.k_cache + slot);
        std::copy(row + (H + Hkv + g) * D, row + (H + Hkv + g + 1) * D, l.v_cache + slot);
      }
    }
    llmkit_decode_attention(q, l.k_cache, l.v_cache, Hkv * max_len * D, max_len * D, key_mask, B, H, Hkv, past + 1,
                            D, scale, attended, threads);
    l.o(attended, B, H * D, hidden, added, threads);
    add_rows(x, added, B * hidden);
    llmkit_rms_norm(x, l.norm2, B, hidden, eps[2 * i + 1], h, threads);
    l.gate_up(h, B, hidden, 2 * ffn, gate_up, threads);
    llmkit_silu_times(gate_up, gate_up + ffn, B, ffn, 2 * ffn, act, threads);
    l.down(act, B, ffn, hidden, added, threads);
    add_rows(x, added, B * hidden);
  }
}
}
