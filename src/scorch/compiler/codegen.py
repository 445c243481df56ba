"""The C printer: loop IR -> C99 + OpenMP source.  It knows C, not formats."""

from __future__ import annotations

from .blocks import FIRST_ROW, WINDOW, WINDOW_LO
from .ir import (Addr, Assign, Bin, Block, BlockDots, Break, Call, Cast, Const, Decl, Eval, For, Forever, If, Kernel,
                 Load, Parallel, SampledDots, Scope, SegmentedRows, Var, Vec, VecZero)

BASE_PRELUDE = """\
#include <stdint.h>
#include <math.h>
#include <omp.h>

/* First index r in [0, n] with pos[r] >= target (pos non-decreasing). */
static inline int64_t scorch_lower_bound(const void *pos, int wide, int64_t n, int64_t target) {
  int64_t lo = 0, hi = n;
  while (lo < hi) {
    int64_t mid = lo + (hi - lo) / 2;
    int64_t v = wide ? ((const int64_t *)pos)[mid] : (int64_t)((const int32_t *)pos)[mid];
    if (v < target) lo = mid + 1; else hi = mid;
  }
  return lo;
}

#define SCORCH_MIN(a, b) ((a) < (b) ? (a) : (b))
#define SCORCH_MAX(a, b) ((a) > (b) ? (a) : (b))

/* Heap sort of a[0..n): the fallback of scorch_sort when its partitions go bad (n log n always). */
static inline void scorch_heapsort(int64_t *a, int64_t n) {
  for (int64_t start = n / 2 - 1; start >= 0; start--) {
    for (int64_t r = start;;) {
      int64_t c = 2 * r + 1;
      if (c >= n) break;
      if (c + 1 < n && a[c] < a[c + 1]) c++;
      if (a[r] >= a[c]) break;
      int64_t t = a[r]; a[r] = a[c]; a[c] = t; r = c;
    }
  }
  for (int64_t end = n - 1; end > 0; end--) {
    int64_t t = a[0]; a[0] = a[end]; a[end] = t;
    for (int64_t r = 0;;) {
      int64_t c = 2 * r + 1;
      if (c >= end) break;
      if (c + 1 < end && a[c] < a[c + 1]) c++;
      if (a[r] >= a[c]) break;
      t = a[r]; a[r] = a[c]; a[c] = t; r = c;
    }
  }
}

/* Sort a[0..n) ascending; returns n.  Introsort: quicksort (median of three) down to runs of
   16, insertion sort for those, heap sort for a range that recursed 2 log2(n) deep.  (Heap sort
   alone took more than half of SpGEMM's time on a graph's square, 57 entries per row.) */
static inline int64_t scorch_sort(int64_t *a, int64_t n) {
  int64_t lo_[64], hi_[64], depth_[64];
  int top = 0, limit = 0;
  for (int64_t m = n; m > 1; m >>= 1) limit += 2;
  lo_[0] = 0; hi_[0] = n; depth_[0] = limit;
  while (top >= 0) {
    int64_t lo = lo_[top], hi = hi_[top], depth = depth_[top];
    top--;
    while (hi - lo > 16) {
      if (depth-- == 0) { scorch_heapsort(a + lo, hi - lo); break; }
      int64_t mid = lo + (hi - lo) / 2, x = a[lo], y = a[mid], z = a[hi - 1];
      int64_t pivot = x < y ? (y < z ? y : (x < z ? z : x)) : (x < z ? x : (y < z ? z : y));
      int64_t i = lo, j = hi - 1;
      for (;;) {
        while (a[i] < pivot) i++;
        while (a[j] > pivot) j--;
        if (i >= j) break;
        int64_t t = a[i]; a[i] = a[j]; a[j] = t; i++; j--;
      }
      /* [lo, j] <= pivot <= [j+1, hi): push the larger part, go on with the smaller (stack <= log2 n) */
      if (j + 1 - lo > hi - (j + 1)) { top++; lo_[top] = lo; hi_[top] = j + 1; depth_[top] = depth; lo = j + 1; }
      else { top++; lo_[top] = j + 1; hi_[top] = hi; depth_[top] = depth; hi = j + 1; }
    }
  }
  for (int64_t i = 1; i < n; i++) {  /* every run is now short and in place: one insertion pass */
    int64_t x = a[i], j = i - 1;
    while (j >= 0 && a[j] > x) { a[j + 1] = a[j]; j--; }
    a[j + 1] = x;
  }
  return n;
}

/* The assembled row of a sparse result, ascending: len distinct columns (the count pass's),
   wsp[column] their values.  A row whose bitset has at most 16 words per entry is read off
   the bitset (set by the fill: a count-trailing-zeros per entry, no comparisons to
   mispredict), visiting only the words its summary marks (summ: a bit per word of bits,
   set by the fill beside the column's bit); a sparser one from lst[0..len), its columns as
   listed, sorted.  Writes crd[0..len) (of index type I) and val[0..len), and leaves the
   workspace as it found it: the bits and summary words it read cleared, the values zeroed. */
#define SCORCH_ROW_OUT(T, I)                                                                     \\
static inline void scorch_row_out_##T##_##I(int64_t *lst, int64_t len, uint64_t *bits, uint64_t *summ, \\
                                            int64_t words, T *wsp, I *crd, T *val) {                 \\
  if (words <= 16 * len) {                                                                        \\
    int64_t e = 0;                                                                                \\
    const int64_t sums = (words + 63) / 64;                                                       \\
    for (int64_t s = 0; s < sums; s++) {                                                          \\
      uint64_t m = summ[s];                                                                       \\
      summ[s] = 0;                                                                                \\
      for (; m; m &= m - 1) {                                                                     \\
        const int64_t w = s * 64 + __builtin_ctzll(m);                                            \\
        uint64_t b = bits[w];                                                                     \\
        bits[w] = 0;                                                                              \\
        while (b && e < len) {  /* e < len: never past the row, whatever the bits hold */        \\
          const int64_t k = w * 64 + __builtin_ctzll(b);                                          \\
          crd[e] = (I)k; val[e] = wsp[k]; wsp[k] = 0; e++; b &= b - 1;                            \\
        }                                                                                         \\
      }                                                                                           \\
    }                                                                                             \\
  } else {                                                                                        \\
    scorch_sort(lst, len);                                                                        \\
    for (int64_t e = 0; e < len; e++) {                                                           \\
      const int64_t k = lst[e]; crd[e] = (I)k; val[e] = wsp[k]; wsp[k] = 0;                      \\
    }                                                                                             \\
  }                                                                                               \\
}
SCORCH_ROW_OUT(float, int64_t)
SCORCH_ROW_OUT(double, int64_t)
SCORCH_ROW_OUT(float, int32_t)
SCORCH_ROW_OUT(double, int32_t)
"""


def prelude(vbytes: int) -> str:
    """The helpers every kernel may use, vector types ``vbytes`` wide (the target's widest
    registers, :func:`build.vector_bytes`: a wider GCC vector is split into pieces kept on the stack)."""
    return "\n".join([BASE_PRELUDE, f"#define SCORCH_VB {vbytes}", VECTOR_TYPES, _hsum("float", vbytes),
                      _hsum("double", vbytes), EXP_PRELUDE,
                      "#if defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 12)",
                      "#define SCORCH_SHUF __builtin_shufflevector", _hsum4("float", vbytes // 4),
                      _hsum4("double", vbytes // 8), "#else", HSUM4_FALLBACK + "#endif", ""])


VECTOR_TYPES = """\
/* SCORCH_VB-byte vectors (GCC/Clang vector extensions), unaligned access allowed. */
typedef float scorch_vec_float __attribute__((vector_size(SCORCH_VB), aligned(4)));
typedef double scorch_vec_double __attribute__((vector_size(SCORCH_VB), aligned(8)));"""

EXP_PRELUDE = """\
/* exp of a vector of floats at once, in vector registers (libm's expf is a call per element without
   -ffast-math, and a scalar bit cast stops gcc's vectoriser): 2^n * p(r), x = n ln2 + r,
   |r| <= ln2/2, p a degree-6 polynomial (Cephes expf), ~1 ulp.  exp(-inf) = 0, NaN stays
   NaN, arguments past +-87 saturate.  scorch_exp_float is the same formula for one float. */
typedef int32_t scorch_vec_int __attribute__((vector_size(SCORCH_VB), aligned(4)));
#define SCORCH_SEL(mask, a, b) \
  ((scorch_vec_float)(((mask) & (scorch_vec_int)(a)) | (~(mask) & (scorch_vec_int)(b))))
static inline scorch_vec_float scorch_exp_vec_float(scorch_vec_float x) {
  const scorch_vec_float zero = {0};
  scorch_vec_float c = SCORCH_SEL(x < -88.0f, zero - 88.0f, x);
  c = SCORCH_SEL(c > 88.0f, zero + 88.0f, c);
  scorch_vec_float t = c * 1.44269504088896341f + 0.5f;
  scorch_vec_int ti = __builtin_convertvector(t, scorch_vec_int);
  ti = ti + (__builtin_convertvector(ti, scorch_vec_float) > t);   /* floor (a true compare is -1) */
  scorch_vec_float n = __builtin_convertvector(ti, scorch_vec_float);
  scorch_vec_float r = c - n * 0.693359375f + n * 2.12194440e-4f;
  scorch_vec_float p = r * 1.9875691500e-4f + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  scorch_vec_float y = SCORCH_SEL(x < -87.0f, zero, p * (scorch_vec_float)((ti + 127) << 23));
  return SCORCH_SEL(x != x, x, y);
}
static inline float scorch_exp_float(float x) {
  scorch_vec_float v = {x};
  return scorch_exp_vec_float(v)[0];
}
static inline double scorch_exp_double(double x) { return exp(x); }"""

# Four horizontal sums through scorch_hsum where gcc < 12 lacks __builtin_shufflevector.
HSUM4_FALLBACK = """\
static inline void scorch_hsum4_float(scorch_vec_float p0, scorch_vec_float p1, scorch_vec_float p2,
                                      scorch_vec_float p3, float *s) {
  s[0] = scorch_hsum_float(p0); s[1] = scorch_hsum_float(p1); s[2] = scorch_hsum_float(p2);
  s[3] = scorch_hsum_float(p3);
}
static inline void scorch_hsum4_double(scorch_vec_double p0, scorch_vec_double p1, scorch_vec_double p2,
                                       scorch_vec_double p3, double *s) {
  s[0] = scorch_hsum_double(p0); s[1] = scorch_hsum_double(p1); s[2] = scorch_hsum_double(p2);
  s[3] = scorch_hsum_double(p3);
}
"""


def _hsum(vt: str, vbytes: int) -> str:
    """``scorch_hsum_<vt>``: the sum of a vector's lanes by halving down to 16 bytes (a lane-by-lane
    loop costs a dependent add per lane)."""
    lines = [f"static inline {vt} scorch_hsum_{vt}(scorch_vec_{vt} v) {{"]
    cur, width = "v", vbytes
    while width > 16:
        h = width // 2
        lines += [f"  typedef {vt} h{h}_ __attribute__((vector_size({h})));",
                  f"  h{h}_ a{h}, b{h}; __builtin_memcpy(&a{h}, &{cur}, {h}); "
                  f"__builtin_memcpy(&b{h}, (char *)&{cur} + {h}, {h}); a{h} += b{h};"]
        cur, width = f"a{h}", h
    tail = f"({cur}[0] + {cur}[2]) + ({cur}[1] + {cur}[3])" if vt == "float" else f"{cur}[0] + {cur}[1]"
    return "\n".join(lines + [f"  return {tail};", "}"])


def _hsum4(vt: str, lanes: int) -> str:
    """``scorch_hsum4_<vt>``: four horizontal sums at once, s[u] = the sum of the lanes of p<u>.
    Halving the four vectors together (shuffles pair them up) costs about one scorch_hsum."""
    def shuf(x, y, idx):
        return f"SCORCH_SHUF({x}, {y}, {', '.join(map(str, idx))})"

    def merge(x, y, m, w):  # m segments of width w in each of x, y -> 2m segments of width w/2
        lo = [s * w + t for s in range(m) for t in range(w // 2)]
        hi = [s * w + w // 2 + t for s in range(m) for t in range(w // 2)]
        return f"{shuf(x, y, lo + [lanes + i for i in lo])} + {shuf(x, y, hi + [lanes + i for i in hi])}"

    v = f"scorch_vec_{vt}"
    lines = [f"static inline void scorch_hsum4_{vt}({v} p0, {v} p1, {v} p2, {v} p3, {vt} *s) {{",
             f"  {v} a = {merge('p0', 'p1', 1, lanes)};", f"  {v} b = {merge('p2', 'p3', 1, lanes)};"]
    if lanes == 2:
        return "\n".join(lines + ["  s[0] = a[0]; s[1] = a[1]; s[2] = b[0]; s[3] = b[1];", "}"])
    lines.append(f"  {v} c = {merge('a', 'b', 2, lanes // 2)};")
    cur, w, n = "c", lanes // 4, 0
    while w > 1:   # fold each of the four segments in half, the halves packed at the front
        lo = [s * w + t for s in range(4) for t in range(w // 2)]
        hi = [s * w + w // 2 + t for s in range(4) for t in range(w // 2)]
        reps = lanes // len(lo)
        lines.append(f"  {v} f{n} = {shuf(cur, cur, lo * reps)} + {shuf(cur, cur, hi * reps)};")
        cur, w, n = f"f{n}", w // 2, n + 1
    return "\n".join(lines + [f"  s[0] = {cur}[0]; s[1] = {cur}[1]; s[2] = {cur}[2]; s[3] = {cur}[3];", "}"])


# Included only by kernels with a SegmentedRows or SampledDots statement (immintrin.h is slow to parse).
AVX512_PRELUDE = """\
#if defined(__AVX512F__)
#include <immintrin.h>
/* Row sums of a CSR level over blocks of 512 stored entries, whatever the row lengths (the
   SegmentedRows statement).  A block is 16 chunks of 32 entries; the chunks' products are
   transposed (16 x 16 in registers, twice) so that vector j holds entry j of every chunk,
   and a segmented scan runs down the 32 vectors, one masked add per vector (heads: the
   pattern's bit per entry that starts a row, convert.entry_heads).  Rows never mix: no
   cancellation between rows, an inf stays in its row.  A scan across the 16 chunks gives
   the sum each chunk inherits from the row open at its start; every row that ends in the
   block (rows par[b] .. par[b+512]-1: the pattern's entry rows, so blocks do not wait on
   each other) reads its sum at its last entry and adds the inherited sum when it began in
   an earlier chunk.  Only that sum (the carry) runs from block to block.  No branch depends
   on the row lengths. */
static inline __mmask16 scorch_live16(int64_t left) {  /* lanes 0 .. left-1 of 16 */
  left = left < 0 ? 0 : left > 16 ? 16 : left;
  return (__mmask16)((1u << left) - 1u);
}
/* x[c[0]], ..., x[c[15]]: index pairs read 8 bytes at a time, each element loaded into its
   lane by vpinsrd (a 16-lane vgatherdps cost more here: ~20 cycles on AMD Zen 5).  The
   caller guarantees c[0..15] are stored entries (every crd is checked against its size). */
static inline __m128i scorch_gather4(const float *x, const int32_t *c) {
  uint64_t u, v;
  __builtin_memcpy(&u, c, 8); __builtin_memcpy(&v, c + 2, 8);
  int32_t e0, e1, e2, e3;
  __builtin_memcpy(&e0, x + (uint32_t)u, 4); __builtin_memcpy(&e1, x + (u >> 32), 4);
  __builtin_memcpy(&e2, x + (uint32_t)v, 4); __builtin_memcpy(&e3, x + (v >> 32), 4);
  __m128i a = _mm_cvtsi32_si128(e0);
  a = _mm_insert_epi32(a, e1, 1); a = _mm_insert_epi32(a, e2, 2);
  return _mm_insert_epi32(a, e3, 3);
}
static inline __m512 scorch_gather16(const float *x, const int32_t *c) {
  const __m256i lo = _mm256_set_m128i(scorch_gather4(x, c + 4), scorch_gather4(x, c));
  const __m256i hi = _mm256_set_m128i(scorch_gather4(x, c + 12), scorch_gather4(x, c + 8));
  return _mm512_castsi512_ps(_mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1));
}
/* lane k <- lane k-d, zeros below (a macro: the shift is an immediate at every -O level) */
#define scorch_seg_up(p, d) _mm512_castsi512_ps(_mm512_alignr_epi32(_mm512_castps_si512(p), _mm512_setzero_si512(), 16 - (d)))
static inline __m512 scorch_seg_scan(__m512 p, __mmask16 f) {  /* f: segment heads */
  p = _mm512_mask_add_ps(p, (__mmask16)~f, p, scorch_seg_up(p, 1)); f |= (__mmask16)(f << 1);
  p = _mm512_mask_add_ps(p, (__mmask16)~f, p, scorch_seg_up(p, 2)); f |= (__mmask16)(f << 2);
  p = _mm512_mask_add_ps(p, (__mmask16)~f, p, scorch_seg_up(p, 4)); f |= (__mmask16)(f << 4);
  return _mm512_mask_add_ps(p, (__mmask16)~f, p, scorch_seg_up(p, 8));
}
/* In-register transpose of 16 vectors of 16 floats: r[i] lane j <-> r[j] lane i. */
static inline void scorch_transpose16(__m512 *r) {
  __m512 t[16];
  for (int i = 0; i < 8; i++) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; i++) {
    const __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 1]);
    const __m512d c = _mm512_castps_pd(t[4 * i + 2]), d = _mm512_castps_pd(t[4 * i + 3]);
    r[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
    r[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
    r[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
    r[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
  }
  for (int i = 0; i < 2; i++)
    for (int k = 0; k < 4; k++) {
      t[8 * i + k] = _mm512_shuffle_f32x4(r[8 * i + k], r[8 * i + 4 + k], 0x88);
      t[8 * i + 4 + k] = _mm512_shuffle_f32x4(r[8 * i + k], r[8 * i + 4 + k], 0xdd);
    }
  for (int k = 0; k < 8; k++) {
    r[k] = _mm512_shuffle_f32x4(t[k], t[8 + k], 0x88);
    r[8 + k] = _mm512_shuffle_f32x4(t[k], t[8 + k], 0xdd);
  }
}
/* The block of entries b .. b+nb-1 (nb <= 512; qend the thread's end, hi its row end): pa[l],
   pb[l] the values of chunk l's entries 0-15 and 16-31 (anything past qend: those lanes come
   after every row end the block reads, so they reach only the carry, unused after the last
   block), carry (every lane) the sum of row par[b]'s entries before b, buf 512 floats of
   scratch.  Stores out[r] for every row r that ends in the block; returns the new carry. */
static inline __m512 scorch_seg_block(__m512 *pa, __m512 *pb, float *buf, const int32_t *par, const uint8_t *heads,
                                      const int32_t *pos, int64_t b, int64_t nb, int64_t qend, int64_t hi,
                                      float *out, __m512 carry) {
  scorch_transpose16(pa);
  scorch_transpose16(pb);
  /* lane l: the 32 head bits of chunk l (entries b+32l ..); b+32l = b (mod 8) for every l */
  const __m512i sh = _mm512_set1_epi32((int32_t)(b & 7));
  const uint8_t *hb = heads + (b >> 3);
  const __m512i w = _mm512_or_si512(_mm512_srlv_epi32(_mm512_loadu_si512(hb), sh),
                                    _mm512_sllv_epi32(_mm512_loadu_si512(hb + 4), _mm512_sub_epi32(_mm512_set1_epi32(32), sh)));
  __m512 prev = _mm512_setzero_ps();
  _Pragma("GCC unroll 32") for (int j = 0; j < 32; j++) {  /* the segmented scan down the chunks' entries */
    __m512 *v = j < 16 ? &pa[j] : &pb[j - 16];
    const __mmask16 h = _mm512_test_epi32_mask(w, _mm512_set1_epi32((int32_t)(1u << j)));
    *v = _mm512_mask_add_ps(*v, (__mmask16)~h, *v, prev);
    _mm512_store_ps(buf + 16 * j, *v);
    prev = *v;
  }
  /* inherited sums: chunk l inherits chunk l-1's last segment, plus what that inherited when
     it has no head (a segmented scan across the chunks; chunk 0 inherits the carry) */
  const __mmask16 f = _mm512_test_epi32_mask(w, w);
  const __m512 inherit = scorch_seg_scan(_mm512_castsi512_ps(_mm512_alignr_epi32(_mm512_castps_si512(prev),
                                                             _mm512_castps_si512(carry), 15)),
                                         (__mmask16)((f << 1) | 1u));
  const __m512 tail = _mm512_mask_add_ps(prev, (__mmask16)~f, prev, inherit);
  const int64_t first = par[b], next = b + nb < qend ? par[b + nb] : hi;
  for (int64_t r = first; r < next; r += 16) {  /* every row that ends in the block, 16 at a time */
    const __mmask16 mr = scorch_live16(next - r);
    const __m512i s = _mm512_maskz_loadu_epi32(mr, pos + r), e1 = _mm512_maskz_loadu_epi32(mr, pos + r + 1);
    const __mmask16 stored = _mm512_mask_cmpneq_epi32_mask(mr, s, e1);  /* empty rows: 0 */
    const __m512i e = _mm512_sub_epi32(e1, _mm512_set1_epi32((int32_t)(b + 1)));  /* last entry, in the block */
    const __m512i chunk = _mm512_srli_epi32(e, 5);
    int32_t at[16] __attribute__((aligned(64)));
    _mm512_store_si512(at, _mm512_maskz_mov_epi32(stored, _mm512_add_epi32(
        _mm512_slli_epi32(_mm512_and_si512(e, _mm512_set1_epi32(31)), 4), chunk)));
    __m512 y = _mm512_maskz_mov_ps(stored, scorch_gather16(buf, at));
    const __mmask16 began = _mm512_mask_cmplt_epi32_mask(stored, _mm512_sub_epi32(s, _mm512_set1_epi32((int32_t)b)),
                                                         _mm512_slli_epi32(chunk, 5));
    y = _mm512_mask_add_ps(y, began, y, _mm512_permutexvar_ps(chunk, inherit));
    _mm512_mask_storeu_ps(out + r, mr, y);
  }
  return _mm512_permutexvar_ps(_mm512_set1_epi32(15), tail);
}
/* The float64 forms: 8 lanes a vector, blocks of 256 entries (8 chunks of 32); they read 8 lanes
   of 32-bit indices and masks from ymm registers, hence AVX-512VL (codegen guards their use). */
#if defined(__AVX512VL__)
static inline __mmask8 scorch_live8(int64_t left) {  /* lanes 0 .. left-1 of 8 */
  left = left < 0 ? 0 : left > 8 ? 8 : left;
  return (__mmask8)((1u << left) - 1u);
}
static inline __m128d scorch_gather2d(const double *x, const int32_t *c) {
  uint64_t u;
  __builtin_memcpy(&u, c, 8);
  return _mm_loadh_pd(_mm_load_sd(x + (uint32_t)u), x + (u >> 32));
}
static inline __m512d scorch_gather8d(const double *x, const int32_t *c) {
  const __m256d lo = _mm256_set_m128d(scorch_gather2d(x, c + 2), scorch_gather2d(x, c));
  const __m256d hi = _mm256_set_m128d(scorch_gather2d(x, c + 6), scorch_gather2d(x, c + 4));
  return _mm512_insertf64x4(_mm512_castpd256_pd512(lo), hi, 1);
}
#define scorch_seg_up_d(p, d) _mm512_castsi512_pd(_mm512_alignr_epi64(_mm512_castpd_si512(p), _mm512_setzero_si512(), 8 - (d)))
static inline __m512d scorch_seg_scan_d(__m512d p, __mmask8 f) {  /* f: segment heads */
  p = _mm512_mask_add_pd(p, (__mmask8)~f, p, scorch_seg_up_d(p, 1)); f |= (__mmask8)(f << 1);
  p = _mm512_mask_add_pd(p, (__mmask8)~f, p, scorch_seg_up_d(p, 2)); f |= (__mmask8)(f << 2);
  return _mm512_mask_add_pd(p, (__mmask8)~f, p, scorch_seg_up_d(p, 4));
}
/* In-register transpose of 8 vectors of 8 doubles: r[i] lane j <-> r[j] lane i. */
static inline void scorch_transpose8d(__m512d *r) {
  __m512d t[8];
  for (int i = 0; i < 4; i++) {
    t[2 * i] = _mm512_unpacklo_pd(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_pd(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 2; i++)
    for (int k = 0; k < 2; k++) {
      r[4 * i + k] = _mm512_shuffle_f64x2(t[4 * i + k], t[4 * i + 2 + k], 0x88);
      r[4 * i + 2 + k] = _mm512_shuffle_f64x2(t[4 * i + k], t[4 * i + 2 + k], 0xdd);
    }
  for (int k = 0; k < 4; k++) {
    t[k] = _mm512_shuffle_f64x2(r[k], r[4 + k], 0x88);
    t[4 + k] = _mm512_shuffle_f64x2(r[k], r[4 + k], 0xdd);
  }
  for (int k = 0; k < 8; k++) r[k] = t[k];
}
/* The float64 block of entries b .. b+nb-1 (nb <= 256): p[4 * l + g] the values of chunk l's
   entries 8g .. 8g+7, as scorch_seg_block for float32 otherwise (buf: 256 doubles). */
static inline __m512d scorch_seg_block_d(__m512d *p, double *buf, const int32_t *par, const uint8_t *heads,
                                         const int32_t *pos, int64_t b, int64_t nb, int64_t qend, int64_t hi,
                                         double *out, __m512d carry) {
  __m512d v[32];  /* v[j] lane l: entry j of chunk l */
  for (int g = 0; g < 4; g++) {
    __m512d r[8];
    for (int l = 0; l < 8; l++) r[l] = p[4 * l + g];
    scorch_transpose8d(r);
    for (int k = 0; k < 8; k++) v[8 * g + k] = r[k];
  }
  const __m256i sh = _mm256_set1_epi32((int32_t)(b & 7));
  const uint8_t *hb = heads + (b >> 3);
  const __m256i w = _mm256_or_si256(_mm256_srlv_epi32(_mm256_loadu_si256((const __m256i *)hb), sh),
                                    _mm256_sllv_epi32(_mm256_loadu_si256((const __m256i *)(hb + 4)),
                                                      _mm256_sub_epi32(_mm256_set1_epi32(32), sh)));
  __m512d prev = _mm512_setzero_pd();
  _Pragma("GCC unroll 32") for (int j = 0; j < 32; j++) {
    const __mmask8 h = _mm256_test_epi32_mask(w, _mm256_set1_epi32((int32_t)(1u << j)));
    v[j] = _mm512_mask_add_pd(v[j], (__mmask8)~h, v[j], prev);
    _mm512_store_pd(buf + 8 * j, v[j]);
    prev = v[j];
  }
  const __mmask8 f = _mm256_test_epi32_mask(w, w);
  const __m512d inherit = scorch_seg_scan_d(_mm512_castsi512_pd(_mm512_alignr_epi64(_mm512_castpd_si512(prev),
                                                                _mm512_castpd_si512(carry), 7)),
                                            (__mmask8)((f << 1) | 1u));
  const __m512d tail = _mm512_mask_add_pd(prev, (__mmask8)~f, prev, inherit);
  const int64_t first = par[b], next = b + nb < qend ? par[b + nb] : hi;
  for (int64_t r = first; r < next; r += 8) {
    const __mmask8 mr = scorch_live8(next - r);
    const __m256i s = _mm256_maskz_loadu_epi32(mr, pos + r), e1 = _mm256_maskz_loadu_epi32(mr, pos + r + 1);
    const __mmask8 stored = _mm256_mask_cmpneq_epi32_mask(mr, s, e1);
    const __m256i e = _mm256_sub_epi32(e1, _mm256_set1_epi32((int32_t)(b + 1)));
    const __m256i chunk = _mm256_srli_epi32(e, 5);
    int32_t at[8] __attribute__((aligned(32)));
    _mm256_store_si256((__m256i *)at, _mm256_maskz_mov_epi32(stored, _mm256_add_epi32(
        _mm256_slli_epi32(_mm256_and_si256(e, _mm256_set1_epi32(31)), 3), chunk)));
    __m512d y = _mm512_maskz_mov_pd(stored, scorch_gather8d(buf, at));
    const __mmask8 began = _mm256_mask_cmplt_epi32_mask(stored, _mm256_sub_epi32(s, _mm256_set1_epi32((int32_t)b)),
                                                        _mm256_slli_epi32(chunk, 5));
    y = _mm512_mask_add_pd(y, began, y, _mm512_permutexvar_pd(_mm512_cvtepu32_epi64(chunk), inherit));
    _mm512_mask_storeu_pd(out + r, mr, y);
  }
  return _mm512_permutexvar_pd(_mm512_set1_epi64(7), tail);
}
#endif
static inline __m512 scorch_pairsum(__m512 a, __m512 b, __m512i lo, __m512i hi) {
  return _mm512_add_ps(_mm512_permutex2var_ps(a, lo, b), _mm512_permutex2var_ps(a, hi, b));
}
/* Lane u of the result: the sum of the lanes of p[u] (a 16-to-1 shuffle tree, 30 shuffles). */
static inline __m512 scorch_hsum16(const __m512 *p) {
  const __m512i a0 = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23);
  const __m512i b0 = _mm512_setr_epi32(0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27);
  const __m512i c0 = _mm512_setr_epi32(0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29);
  const __m512i d0 = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i a1 = _mm512_add_epi32(a0, _mm512_set1_epi32(8)), b1 = _mm512_add_epi32(b0, _mm512_set1_epi32(4));
  const __m512i c1 = _mm512_add_epi32(c0, _mm512_set1_epi32(2)), d1 = _mm512_add_epi32(d0, _mm512_set1_epi32(1));
  __m512 w[8], x[4], y[2];
  _Pragma("GCC unroll 8") for (int a = 0; a < 8; a++) w[a] = scorch_pairsum(p[2 * a], p[2 * a + 1], a0, a1);
  _Pragma("GCC unroll 4") for (int a = 0; a < 4; a++) x[a] = scorch_pairsum(w[2 * a], w[2 * a + 1], b0, b1);
  _Pragma("GCC unroll 2") for (int a = 0; a < 2; a++) y[a] = scorch_pairsum(x[2 * a], x[2 * a + 1], c0, c1);
  return scorch_pairsum(y[0], y[1], d0, d1);
}
#endif
"""


def expr(e) -> str:
    if isinstance(e, Var):
        return e.name
    if isinstance(e, Const):
        v = e.value
        return repr(v) if isinstance(v, int) else f"{float(v)!r}"
    if isinstance(e, Bin):
        return f"({expr(e.a)} {e.op} {expr(e.b)})"
    if isinstance(e, Load):
        return f"{expr(e.array)}[{expr(e.index)}]"
    if isinstance(e, Call):
        return f"{e.fn}({', '.join(expr(a) for a in e.args)})"
    if isinstance(e, Cast):
        return f"(({e.ctype}){expr(e.value)})"
    if isinstance(e, Addr):
        return f"(&{expr(e.array)}[{expr(e.index)}])"
    if isinstance(e, Vec):
        return f"(*(scorch_vec_{e.ctype} *){expr(e.addr)})"
    if isinstance(e, VecZero):
        return "{0}"
    raise TypeError(f"codegen: unknown expression {e!r}")


def stmt(s, ind: str) -> list[str]:
    if isinstance(s, Block):
        return [line for t in s.body for line in stmt(t, ind)]
    if isinstance(s, Decl):
        return [f"{ind}{s.ctype} {s.name}" + (f" = {expr(s.value)};" if s.value is not None else ";")]
    if isinstance(s, Assign):
        return [f"{ind}{expr(s.target)} {s.op} {expr(s.value)};"]
    if isinstance(s, For):
        out = []
        if s.simd:
            red = s.reduction if s.reduction is None or ":" in s.reduction else f"+:{s.reduction}"
            out.append(f"{ind}#pragma omp simd" + (f" reduction({red})" if red else ""))
        out.append(f"{ind}for (int64_t {s.var} = {expr(s.lo)}; {s.var} < {expr(s.hi)}; {s.var}++) {{")
        return out + stmt(s.body, ind + "  ") + [f"{ind}}}"]
    if isinstance(s, Scope):
        return [f"{ind}{{"] + stmt(s.body, ind + "  ") + [f"{ind}}}"]
    if isinstance(s, Forever):
        return [f"{ind}for (;;) {{"] + stmt(s.body, ind + "  ") + [f"{ind}}}"]
    if isinstance(s, If):
        out = [f"{ind}if ({expr(s.cond)}) {{"] + stmt(s.then, ind + "  ")
        if s.orelse is not None:
            out += [f"{ind}}} else {{"] + stmt(s.orelse, ind + "  ")
        return out + [f"{ind}}}"]
    if isinstance(s, Break):
        return [f"{ind}break;"]
    if isinstance(s, Eval):
        return [f"{ind}{expr(s.value)};"]
    if isinstance(s, SegmentedRows):
        return segmented_rows(s, ind)
    if isinstance(s, SampledDots):
        return sampled_dots(s, ind)
    if isinstance(s, BlockDots):
        return block_dots(s, ind)
    if isinstance(s, Parallel):
        return ([f"{ind}#pragma omp parallel num_threads({expr(s.nthreads)})", f"{ind}{{",
                 f"{ind}  int64_t tid = omp_get_thread_num();", f"{ind}  int64_t nthr = omp_get_num_threads();"]
                + stmt(s.body, ind + "  ") + [f"{ind}}}"])
    raise TypeError(f"codegen: unknown statement {s!r}")


def segmented_rows(s: SegmentedRows, ind: str) -> list[str]:
    """The AVX-512 block loop (``scorch_seg_block`` in AVX512_PRELUDE) over nnz-balanced parts
    of the rows that the team's threads take as they come free, the row-wise loop over the
    thread's rows elsewhere.  A chunk wholly inside the coordinate array gathers with
    ``scorch_gather16`` (it reads all its indices), the array's last partial chunk with a
    masked vgatherdps."""
    if s.vtype == "double":
        return _segmented_rows_double(s, ind)
    p, b, c = ind + "    ", ind + "      ", ind + "        "  # the part loop's, block loop's, chunk loop's
    chunk = [f"{c}const int64_t q0_ = b_ + 32 * l_;",
             f"{c}if (q0_ >= qend_) {{ pa_[l_] = pb_[l_] = _mm512_setzero_ps(); continue; }}",
             f"{c}const int full_ = q0_ + 32 <= {s.ncrd};",
             f"{c}const __mmask16 m0_ = scorch_live16({s.ncrd} - q0_), m1_ = scorch_live16({s.ncrd} - q0_ - 16);"]
    for h, dst in ((0, "pa_"), (1, "pb_")):
        half = [f"const int64_t q_ = q0_ + {16 * h};"]
        for name, kind, array in s.loads:
            load = (f"_mm512_maskz_loadu_ps(m{h}_, {array} + q_)" if kind == "vals" else
                    f"full_ ? scorch_gather16({array}, {s.crd} + q_) : _mm512_mask_i32gather_ps("
                    f"_mm512_setzero_ps(), m{h}_, _mm512_maskz_loadu_epi32(m{h}_, {s.crd} + q_), {array}, 4)")
            half.append(f"const __m512 {name} = {load};")
        half.append(f"{dst}[l_] = {expr(s.value)};")
        chunk += [f"{c}{{"] + [c + "  " + line for line in half] + [f"{c}}}"]
    return _segmented_parts(s, ind, [
        f"{p}__m512 carry_ = _mm512_setzero_ps();",
        f"{p}float buf_[512] __attribute__((aligned(64)));",
        f"{p}for (int64_t b_ = base_; b_ < qend_; b_ += 512) {{",
        f"{b}__m512 pa_[16], pb_[16];",
        f"{b}#pragma GCC unroll 16",
        f"{b}for (int l_ = 0; l_ < 16; l_++) {{"] + chunk + [f"{b}}}",
        f"{b}carry_ = scorch_seg_block(pa_, pb_, buf_, {s.parents}, {s.heads}, {s.pos}, b_, "
        f"SCORCH_MIN(qend_ - b_, 512), qend_, hi_, {s.out}, carry_);",
        f"{p}}}"])


def _segmented_rows_double(s: SegmentedRows, ind: str) -> list[str]:
    """:func:`segmented_rows` in float64: 8 chunks of 32 entries, four 8-lane vectors each
    (``scorch_seg_block_d``, ``scorch_gather8d``)."""
    p, b, c, g = ind + "    ", ind + "      ", ind + "        ", ind + "          "
    group = ["const int64_t q_ = q0_ + 8 * g_;", f"const __mmask8 m_ = scorch_live8({s.ncrd} - q_);"]
    for name, kind, array in s.loads:
        load = (f"_mm512_maskz_loadu_pd(m_, {array} + q_)" if kind == "vals" else
                f"full_ ? scorch_gather8d({array}, {s.crd} + q_) : _mm512_mask_i32gather_pd("
                f"_mm512_setzero_pd(), m_, _mm256_maskz_loadu_epi32(m_, {s.crd} + q_), {array}, 8)")
        group.append(f"const __m512d {name} = {load};")
    group.append(f"p_[4 * l_ + g_] = {expr(s.value)};")
    return _segmented_parts(s, ind, [
        f"{p}__m512d carry_ = _mm512_setzero_pd();",
        f"{p}double buf_[256] __attribute__((aligned(64)));",
        f"{p}for (int64_t b_ = base_; b_ < qend_; b_ += 256) {{",
        f"{b}__m512d p_[32];",
        f"{b}#pragma GCC unroll 8",
        f"{b}for (int l_ = 0; l_ < 8; l_++) {{",
        f"{c}const int64_t q0_ = b_ + 32 * l_;",
        f"{c}if (q0_ >= qend_) {{ p_[4 * l_] = p_[4 * l_ + 1] = p_[4 * l_ + 2] = p_[4 * l_ + 3] = _mm512_setzero_pd(); "
        "continue; }",
        f"{c}const int full_ = q0_ + 32 <= {s.ncrd};",
        f"{c}#pragma GCC unroll 4",
        f"{c}for (int g_ = 0; g_ < 4; g_++) {{"] + [g + line for line in group] + [f"{c}}}", f"{b}}}",
        f"{b}carry_ = scorch_seg_block_d(p_, buf_, {s.parents}, {s.heads}, {s.pos}, b_, "
        f"SCORCH_MIN(qend_ - b_, 256), qend_, hi_, {s.out}, carry_);",
        f"{p}}}"])


def _segmented_parts(s: SegmentedRows, ind: str, blocks: list[str]) -> list[str]:
    """The part loop around a SegmentedRows block loop (``blocks``), either value type."""
    p = ind + "    "
    rows = expr(s.rows)
    lb = f"scorch_lower_bound({s.pos}, 0, {rows}, "
    target = "defined(__AVX512F__)" + (" && defined(__AVX512VL__)" if s.vtype == "double" else "")
    return ([f"#if {target}", f"{ind}{{",
             f"{ind}  const int64_t nnz_ = {s.pos}[{rows}], parts_ = 4 * nthr;",
             f"{ind}  #pragma omp for schedule(dynamic, 1) nowait",
             f"{ind}  for (int64_t part_ = 0; part_ < parts_; part_++) {{",
             f"{p}const int64_t lo_ = {lb}nnz_ * part_ / parts_);",
             f"{p}const int64_t hi_ = part_ == parts_ - 1 ? {rows} : {lb}nnz_ * (part_ + 1) / parts_);",
             f"{p}const int64_t base_ = {s.pos}[lo_], qend_ = {s.pos}[hi_];",
             f"{p}const int64_t first_ = base_ < qend_ ? {s.parents}[base_] : hi_;",
             f"{p}for (int64_t r_ = lo_; r_ < first_; r_++) {s.out}[r_] = 0;  /* empty rows before the first entry */"]
            + blocks + [f"{ind}  }}", f"{ind}}}", "#else"] + stmt(s.fallback, ind) + ["#endif"])


def sampled_dots(s: SampledDots, ind: str) -> list[str]:
    """The AVX-512 sixteen-entry step loop (``scorch_hsum16``; each lane's row read from the
    pattern's entry rows ``s.parents``), then one masked step for the last ``nnz % 16``
    entries; the row-wise loop elsewhere."""
    i2 = ind + "      "
    cols = [(a, st) for a, by, st in s.factors if by == "col"]

    def lanes(row: str, col: str, ahead: bool) -> list[str]:
        out = [f"{ind}    __m512 p_[16];", f"{ind}    #pragma GCC unroll 16",
               f"{ind}    for (int u_ = 0; u_ < 16; u_++) {{"]
        if ahead and cols:
            out += [f"{i2}if (q0_ + 32 + u_ < {s.ncrd}) {{",
                    f"{i2}  const int64_t ja_ = (int64_t){s.crd}[q0_ + 32 + u_];"]
            out += [f"{i2}  for (int m_ = 0; m_ < {s.nvec}; m_++) __builtin_prefetch({a} + ja_ * {st} + 16 * m_);"
                    for a, st in cols]
            out.append(f"{i2}}}")
        for n, (a, by, st) in enumerate(s.factors):
            at = {"row": row, "col": col}.get(by)
            out.append(f"{i2}const float *f{n}_ = {a}" + (f" + (int64_t){at} * {st};" if at else ";"))
        first, last = _term(len(s.factors), "0")
        out.append(f"{i2}__m512 acc_ = " + (f"_mm512_mul_ps({first}, {last});" if last else f"{first};"))
        if s.nvec > 1:
            prod, last = _term(len(s.factors), "16 * m_")
            step = f"_mm512_fmadd_ps({prod}, {last}, acc_)" if last else f"_mm512_add_ps(acc_, {prod})"
            out.append(f"{i2}for (int m_ = 1; m_ < {s.nvec}; m_++) acc_ = {step};")
        return out + [f"{i2}p_[u_] = acc_;", f"{ind}    }}", f"{ind}    const __m512 d_ = scorch_hsum16(p_);"]

    def scaled(load: str) -> str:
        value = "d_"
        for v in s.scales:
            value = f"_mm512_mul_ps({value}, {load.format(v)})"
        return value
    full = lanes(f"{s.parents}[q0_ + u_]", f"{s.crd}[q0_ + u_]", True)
    full.append(f"{ind}    _mm512_storeu_ps({s.out} + q0_, {scaled('_mm512_loadu_ps({} + q0_)')});")
    tail = [f"{ind}    const __mmask16 live_ = (__mmask16)((1u << (qe_ - q0_)) - 1u);",
            f"{ind}    int32_t rowv_[16], colv_[16];  /* lanes past the end: row 0, column 0 (never stored) */",
            f"{ind}    _mm512_storeu_si512(rowv_, _mm512_maskz_loadu_epi32(live_, {s.parents} + q0_));",
            f"{ind}    _mm512_storeu_si512(colv_, _mm512_maskz_loadu_epi32(live_, {s.crd} + q0_));"]
    tail += lanes("rowv_[u_]", "colv_[u_]", False)
    masked = scaled("_mm512_maskz_loadu_ps(live_, {} + q0_)")
    tail.append(f"{ind}    _mm512_mask_storeu_ps({s.out} + q0_, live_, {masked});")
    return (["#if defined(__AVX512F__)", f"{ind}{{",
             f"{ind}  int64_t q0_ = {s.pos}[{expr(s.lo)}];",
             f"{ind}  const int64_t qe_ = {s.pos}[{expr(s.hi)}];",
             f"{ind}  for (; q0_ + 16 <= qe_; q0_ += 16) {{"] + full + [f"{ind}  }}",
             f"{ind}  if (q0_ < qe_) {{"] + tail + [f"{ind}  }}", f"{ind}}}", "#else"]
            + stmt(s.fallback, ind) + ["#endif"])


def block_dots(s: BlockDots, ind: str) -> list[str]:
    """The dense part of an SDDMM row block (:class:`BlockDots`; generic vectors, any width):
    the window's dot products, four per ``scorch_hsum4``, into the workspace; then the block's
    stored entries read off from it."""
    i0, w, lo = FIRST_ROW, WINDOW, WINDOW_LO
    vt, R, i, j = s.vtype, s.factor, s.row_var, s.col_var
    vec = f"scorch_vec_{vt}"
    P = expr(s.parent)
    dots = [f"for (int64_t bd_c_ = 0; bd_c_ < {w}; bd_c_ += 4) {{",
            f"  {vec} bd_p_[{R}][4];",
            "  #pragma GCC unroll 4", "  for (int bd_u_ = 0; bd_u_ < 4; bd_u_++) {",
            "    /* past the window's end: its last column again (written past the row's window, never read) */",
            f"    const int64_t {j} = {lo} + SCORCH_MIN(bd_c_ + bd_u_, {w} - 1);",
            f"    const {vt} *bd_k_ = {s.col[0]} + {expr(s.col[1])};",
            f"    #pragma GCC unroll {R}", f"    for (int bd_r_ = 0; bd_r_ < {R}; bd_r_++) {{",
            f"      const int64_t {i} = {i0} + bd_r_;",
            f"      const {vt} *bd_v_ = {s.row[0]} + {expr(s.row[1])};",
            f"      {vec} bd_t_ = (*({vec} *)bd_v_) * (*({vec} *)bd_k_);",
            f"      #pragma GCC unroll {s.nvec}",
            f"      for (int bd_m_ = 1; bd_m_ < {s.nvec}; bd_m_++) "
            f"bd_t_ += (*({vec} *)(bd_v_ + bd_m_ * {s.lanes})) * (*({vec} *)(bd_k_ + bd_m_ * {s.lanes}));",
            "      bd_p_[bd_r_][bd_u_] = bd_t_;", "    }", "  }",
            f"  #pragma GCC unroll {R}", f"  for (int bd_r_ = 0; bd_r_ < {R}; bd_r_++)",
            f"    scorch_hsum4_{vt}(bd_p_[bd_r_][0], bd_p_[bd_r_][1], bd_p_[bd_r_][2], bd_p_[bd_r_][3], "
            f"{s.dots} + bd_r_ * ({w} + 4) + bd_c_);", "}",
            f"for (int64_t {i} = {i0}; {i} < {i0} + {R}; {i}++) {{"]
    dots += [f"  {line}" for d in s.head for line in stmt(d, "")]
    dots += [f"  const {vt} *bd_row_ = {s.dots} + ({i} - {i0}) * ({w} + 4) - {lo};",
             f"  for (int64_t bd_q_ = (int64_t){s.pos}[{P}]; bd_q_ < (int64_t){s.pos}[{P} + 1]; bd_q_++)",
             f"    {s.out}[bd_q_] = {s.scale}[bd_q_] * bd_row_[(int64_t){s.crd}[bd_q_]];", "}"]
    return [f"{ind}{d}" for d in dots]


def _term(nfactors: int, m: str):
    """The product of the factors' vectors at offset ``m``: (all but the last, the last) so
    that the caller can fuse the last multiply into an FMA; (product, None) for one factor."""
    loads = [f"_mm512_loadu_ps(f{n}_ + {m})" for n in range(nfactors)]
    prod = loads[0]
    for x in loads[1:-1]:
        prod = f"_mm512_mul_ps({prod}, {x})"
    return prod, loads[-1] if len(loads) > 1 else None


_LOADED: dict = {}  # (tag, key) -> ctypes function: the hand-built loop nests' in-process cache


def load(tag: str, key, make):
    """The ctypes function of the kernel ``make()`` builds (a loop nest built in the IR outside the
    einsum pipeline: row softmax, entry rows, transposes, recompression), rendered, compiled and
    loaded once per ``(tag, key)`` in process; ``build`` keeps the disk cache."""
    fn = _LOADED.get((tag, key))
    if fn is None:
        from . import build
        k = make()
        fn = getattr(build.compile_library(render(k), tag=tag), k.name)
        build.set_signature(fn, k.params)
        _LOADED[tag, key] = fn
    return fn


def function(kernel: Kernel) -> str:
    params = ", ".join(f"{p.ctype}restrict {p.name}" if p.ctype.endswith("*") else f"{p.ctype} {p.name}"
                       for p in kernel.params)
    return "\n".join([f"void {kernel.name}({params}) {{"] + stmt(kernel.body, "  ") + ["}", ""])


# Included by kernels that move tiles of a matrix to their transposed place (compiler.permute),
# after AVX512_PRELUDE (its in-register transposes).
TILE_PRELUDE = """\
/* The N x N values of type T at x, rows ldx apart, transposed into y, rows ldy apart: in
   registers (N loads, the transpose's shuffles, N stores) where AVX-512 is, else element by
   element.  16 x 16 floats, 8 x 8 doubles. */
#define SCORCH_TILE_T_VEC(T, V, N, LOAD, STORE, TRANSPOSE)                                       \\
static inline void scorch_tile_t_##T(const T *x, int64_t ldx, T *y, int64_t ldy) {              \\
  V r[N];                                                                                       \\
  _Pragma("GCC unroll 16") for (int i = 0; i < N; i++) r[i] = LOAD(x + i * ldx);                \\
  TRANSPOSE(r);                                                                                 \\
  _Pragma("GCC unroll 16") for (int i = 0; i < N; i++) STORE(y + i * ldy, r[i]);                \\
}
#define SCORCH_TILE_T_SCALAR(T, N)                                                              \\
static inline void scorch_tile_t_##T(const T *x, int64_t ldx, T *y, int64_t ldy) {              \\
  for (int i = 0; i < N; i++) for (int j = 0; j < N; j++) y[j * ldy + i] = x[i * ldx + j];     \\
}
#if defined(__AVX512F__)
SCORCH_TILE_T_VEC(float, __m512, 16, _mm512_loadu_ps, _mm512_storeu_ps, scorch_transpose16)
#else
SCORCH_TILE_T_SCALAR(float, 16)
#endif
#if defined(__AVX512F__) && defined(__AVX512VL__)
SCORCH_TILE_T_VEC(double, __m512d, 8, _mm512_loadu_pd, _mm512_storeu_pd, scorch_transpose8d)
#else
SCORCH_TILE_T_SCALAR(double, 8)
#endif
"""


def render(*kernels: Kernel) -> str:
    """Complete C source for one or more kernels of one plan (lowered for one vector width)."""
    widths = {k.vector_bytes for k in kernels}
    if len(widths) != 1:
        raise ValueError(f"render: kernels lowered for different vector widths {sorted(widths)}")
    funcs = [function(k) for k in kernels]
    tiles = any("scorch_tile_t_" in f for f in funcs)
    extra = [AVX512_PRELUDE] if tiles or any("scorch_seg_block" in f or "scorch_hsum16" in f for f in funcs) else []
    return "\n".join([prelude(widths.pop())] + extra + ([TILE_PRELUDE] if tiles else []) + funcs)
