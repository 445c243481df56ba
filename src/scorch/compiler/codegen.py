"""The C printer: loop IR -> C99 + OpenMP source.  It knows C, not formats."""

from __future__ import annotations

from .ir import (Addr, Assign, Bin, Block, Break, Call, Cast, Const, Decl, Eval, For, Forever, If, Kernel, Load,
                 Parallel, Scope, Var, Vec, VecZero)

PRELUDE = """\
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


/* 64-byte vectors (GCC/Clang vector extensions), unaligned access allowed. */
typedef float scorch_vec_float __attribute__((vector_size(64), aligned(4)));
typedef double scorch_vec_double __attribute__((vector_size(64), aligned(8)));
/* Horizontal sums by halving (a lane-by-lane loop costs ~16 dependent adds per call). */
static inline float scorch_hsum_float(scorch_vec_float v) {
  typedef float v8 __attribute__((vector_size(32)));
  typedef float v4 __attribute__((vector_size(16)));
  v8 a, b; __builtin_memcpy(&a, &v, 32); __builtin_memcpy(&b, (char *)&v + 32, 32); a += b;
  v4 c, d; __builtin_memcpy(&c, &a, 16); __builtin_memcpy(&d, (char *)&a + 16, 16); c += d;
  return (c[0] + c[2]) + (c[1] + c[3]);
}
static inline double scorch_hsum_double(scorch_vec_double v) {
  typedef double v4 __attribute__((vector_size(32)));
  typedef double v2 __attribute__((vector_size(16)));
  v4 a, b; __builtin_memcpy(&a, &v, 32); __builtin_memcpy(&b, (char *)&v + 32, 32); a += b;
  v2 c, d; __builtin_memcpy(&c, &a, 16); __builtin_memcpy(&d, (char *)&a + 16, 16); c += d;
  return c[0] + c[1];
}

/* exp of 16 floats at once, in vector registers (libm's expf is a call per element without
   -ffast-math, and a scalar bit cast stops gcc's vectoriser): 2^n * p(r), x = n ln2 + r,
   |r| <= ln2/2, p a degree-6 polynomial (Cephes expf), ~1 ulp.  exp(-inf) = 0, NaN stays
   NaN, arguments past +-87 saturate.  scorch_exp_float is the same formula for one float. */
typedef int32_t scorch_vec_int __attribute__((vector_size(64), aligned(4)));
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
static inline double scorch_exp_double(double x) { return exp(x); }

/* Four horizontal sums at once: s[u] = sum of the lanes of p<u>.  Halving the four vectors
   together (shuffles pair them up) costs about as much as one scorch_hsum. */
#if defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 12)
#define SCORCH_SHUF __builtin_shufflevector
static inline void scorch_hsum4_float(scorch_vec_float p0, scorch_vec_float p1, scorch_vec_float p2,
                                      scorch_vec_float p3, float *s) {
  scorch_vec_float a = SCORCH_SHUF(p0, p1, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23)
                     + SCORCH_SHUF(p0, p1, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
  scorch_vec_float b = SCORCH_SHUF(p2, p3, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23)
                     + SCORCH_SHUF(p2, p3, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
  scorch_vec_float c = SCORCH_SHUF(a, b, 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27)
                     + SCORCH_SHUF(a, b, 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
  scorch_vec_float d = SCORCH_SHUF(c, c, 0, 1, 4, 5, 8, 9, 12, 13, 0, 1, 4, 5, 8, 9, 12, 13)
                     + SCORCH_SHUF(c, c, 2, 3, 6, 7, 10, 11, 14, 15, 2, 3, 6, 7, 10, 11, 14, 15);
  scorch_vec_float e = SCORCH_SHUF(d, d, 0, 2, 4, 6, 0, 2, 4, 6, 0, 2, 4, 6, 0, 2, 4, 6)
                     + SCORCH_SHUF(d, d, 1, 3, 5, 7, 1, 3, 5, 7, 1, 3, 5, 7, 1, 3, 5, 7);
  s[0] = e[0]; s[1] = e[1]; s[2] = e[2]; s[3] = e[3];
}
static inline void scorch_hsum4_double(scorch_vec_double p0, scorch_vec_double p1, scorch_vec_double p2,
                                       scorch_vec_double p3, double *s) {
  scorch_vec_double a = SCORCH_SHUF(p0, p1, 0, 1, 2, 3, 8, 9, 10, 11) + SCORCH_SHUF(p0, p1, 4, 5, 6, 7, 12, 13, 14, 15);
  scorch_vec_double b = SCORCH_SHUF(p2, p3, 0, 1, 2, 3, 8, 9, 10, 11) + SCORCH_SHUF(p2, p3, 4, 5, 6, 7, 12, 13, 14, 15);
  scorch_vec_double c = SCORCH_SHUF(a, b, 0, 1, 4, 5, 8, 9, 12, 13) + SCORCH_SHUF(a, b, 2, 3, 6, 7, 10, 11, 14, 15);
  scorch_vec_double d = SCORCH_SHUF(c, c, 0, 2, 4, 6, 0, 2, 4, 6) + SCORCH_SHUF(c, c, 1, 3, 5, 7, 1, 3, 5, 7);
  s[0] = d[0]; s[1] = d[1]; s[2] = d[2]; s[3] = d[3];
}
#else
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
#endif

/* Sort a[0..n) ascending (insertion sort for short rows, heap sort otherwise); returns n. */
static inline int64_t scorch_sort(int64_t *a, int64_t n) {
  if (n <= 32) {
    for (int64_t i = 1; i < n; i++) {
      int64_t x = a[i], j = i - 1;
      while (j >= 0 && a[j] > x) { a[j + 1] = a[j]; j--; }
      a[j + 1] = x;
    }
    return n;
  }
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
  return n;
}
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
    if isinstance(s, Parallel):
        return ([f"{ind}#pragma omp parallel num_threads({expr(s.nthreads)})", f"{ind}{{",
                 f"{ind}  int64_t tid = omp_get_thread_num();", f"{ind}  int64_t nthr = omp_get_num_threads();"]
                + stmt(s.body, ind + "  ") + [f"{ind}}}"])
    raise TypeError(f"codegen: unknown statement {s!r}")


def function(kernel: Kernel) -> str:
    params = ", ".join(f"{p.ctype}restrict {p.name}" if p.ctype.endswith("*") else f"{p.ctype} {p.name}"
                       for p in kernel.params)
    return "\n".join([f"void {kernel.name}({params}) {{"] + stmt(kernel.body, "  ") + ["}", ""])


def render(*kernels: Kernel) -> str:
    """Complete C source for one or more kernels of one plan."""
    return "\n".join([PRELUDE] + [function(k) for k in kernels])
