/* delta.c - the runtime LoRA delta y += s * B @ (A @ x), f32 arithmetic on A and B held as f32, f16 or
 * bf16 (each value converted exactly): AVX-512 dots where the CPU has them (A @ x four rows of A at a
 * time, B @ u sixteen rows at a time, each row's sum as one dot gives it), eight-lane plain vectors
 * elsewhere (dot_v4). Also the float64 loops of the fold (B @ A) and the report (dots with the
 * probes), AVX-512 lanes that give the scalar loops' bits. */
#include "lora/delta.h"

#include "kern/cpu.h"

#include <stdatomic.h>
#include <stdbool.h>

#include <immintrin.h>

#define TGT __attribute__((target("avx512f,avx512bw,avx512vl,f16c")))
#define INL static inline __attribute__((always_inline, target("avx512f,avx512bw,avx512vl,f16c")))

/* a . x without AVX-512: eight lanes (j mod 8, two 16-byte GCC vectors:
 * 32-byte ones on a build without AVX kept their sums on the stack, and
 * runtime LoRA decode ran at a third of its speed) summed pairwise, then the
 * lanes in a fixed order: the same result wherever a and x are and however
 * the caller bands its rows. a is held as d; its values as f32 are exact, so
 * the sums are those of the f32 values. */
typedef float v4 __attribute__((vector_size(16)));
static inline v4 ld4(const float *p)
{
	v4 v;
	__builtin_memcpy(&v, p, 16);
	return v;
}

static inline v4 lda4(enum nx_lora_dtype d, const void *a, int64_t j)
{
	if (d == NX_LORA_F32)
		return ld4((const float *)a + j);
	return (v4){nx_lora_elt(d, a, (size_t)j), nx_lora_elt(d, a, (size_t)j + 1), nx_lora_elt(d, a, (size_t)j + 2),
		    nx_lora_elt(d, a, (size_t)j + 3)};
}

static float dot_v4(enum nx_lora_dtype d, const void *a, const float *x, int64_t n)
{
	/* lanes 0-3 and 4-7 of two eight-lane sums, for j mod 16 < 8 and >= 8 */
	v4 s0 = {0}, s1 = {0}, t0 = {0}, t1 = {0};
	int64_t j = 0;
	for (; j + 16 <= n; j += 16) {
		s0 += lda4(d, a, j) * ld4(x + j);
		s1 += lda4(d, a, j + 4) * ld4(x + j + 4);
		t0 += lda4(d, a, j + 8) * ld4(x + j + 8);
		t1 += lda4(d, a, j + 12) * ld4(x + j + 12);
	}
	for (; j + 8 <= n; j += 8) {
		s0 += lda4(d, a, j) * ld4(x + j);
		s1 += lda4(d, a, j + 4) * ld4(x + j + 4);
	}
	s0 += t0;
	s1 += t1;
	float r = ((s0[0] + s1[0]) + (s0[1] + s1[1])) + ((s0[2] + s1[2]) + (s0[3] + s1[3]));
	for (; j < n; j++)
		r += nx_lora_elt(d, a, (size_t)j) * x[j];
	return r;
}

/* Sixteen f16 or bf16 values (D) as f32, exactly. */
INL __m512 cvt16(__m256i h, const int D)
{
	return D == NX_LORA_F16 ? _mm512_cvtph_ps(h) : _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* Sixteen values of a (held as D, a compile-time constant in every caller) from element j as f32. */
INL __m512 lda16(const void *a, int64_t j, const int D)
{
	if (D == NX_LORA_F32)
		return _mm512_loadu_ps((const float *)a + j);
	return cvt16(_mm256_loadu_si256((const __m256i *)((const uint16_t *)a + j)), D);
}

/* The last m < 16 values of a from element j (zeros after them), as the masked load of f32 gives them. */
INL __m512 lda16_tail(const void *a, int64_t j, int m, const int D)
{
	const __mmask16 k = (__mmask16)((1u << m) - 1);
	if (D == NX_LORA_F32)
		return _mm512_maskz_loadu_ps(k, (const float *)a + j);
	return cvt16(_mm256_maskz_loadu_epi16(k, (const uint16_t *)a + j), D); /* 0 is +0 in either format */
}

/* a . x over n: sixteen lanes of fused multiply-adds, the last n % 16 under a mask, then the lanes'
 * sum in _mm512_reduce_add_ps's order. */
INL float dot_avx512(const void *a, const float *x, int64_t n, const int D)
{
	__m512 acc = _mm512_setzero_ps();
	int64_t j = 0;
	for (; j + 16 <= n; j += 16)
		acc = _mm512_fmadd_ps(lda16(a, j, D), _mm512_loadu_ps(x + j), acc);
	if (j < n) {
		const __mmask16 m = (__mmask16)((1u << (n - j)) - 1);
		acc = _mm512_fmadd_ps(lda16_tail(a, j, (int)(n - j), D), _mm512_maskz_loadu_ps(m, x + j), acc);
	}
	return _mm512_reduce_add_ps(acc);
}

/* out[q] = dot_avx512(row q of a, x, n) for q < 4 (rows n apart), each x vector loaded once for the
 * four rows. pf: NULL, or the next four rows (as many bytes), asked for from memory along the way. */
INL void dot4_avx512(const void *a, const float *x, int64_t n, float *out, const char *pf, const int D)
{
	__m512 c0 = _mm512_setzero_ps(), c1 = c0, c2 = c0, c3 = c0;
	const void *a1 = nx_lora_row(D, a, 1, n), *a2 = nx_lora_row(D, a, 2, n), *a3 = nx_lora_row(D, a, 3, n);
	const int64_t es = (int64_t)nx_lora_elt_size(D);
	int64_t j = 0;
	for (; j + 16 <= n; j += 16) {
		if (pf) /* this pass reads 4 x 16 values: as many bytes of the next rows */
			for (int64_t l = 0; l < 64 * es; l += 64)
				_mm_prefetch(pf + j * 4 * es + l, _MM_HINT_T0);
		const __m512 v = _mm512_loadu_ps(x + j);
		c0 = _mm512_fmadd_ps(lda16(a, j, D), v, c0);
		c1 = _mm512_fmadd_ps(lda16(a1, j, D), v, c1);
		c2 = _mm512_fmadd_ps(lda16(a2, j, D), v, c2);
		c3 = _mm512_fmadd_ps(lda16(a3, j, D), v, c3);
	}
	if (j < n) {
		const int m = (int)(n - j);
		const __m512 v = _mm512_maskz_loadu_ps((__mmask16)((1u << m) - 1), x + j);
		c0 = _mm512_fmadd_ps(lda16_tail(a, j, m, D), v, c0);
		c1 = _mm512_fmadd_ps(lda16_tail(a1, j, m, D), v, c1);
		c2 = _mm512_fmadd_ps(lda16_tail(a2, j, m, D), v, c2);
		c3 = _mm512_fmadd_ps(lda16_tail(a3, j, m, D), v, c3);
	}
	out[0] = _mm512_reduce_add_ps(c0);
	out[1] = _mm512_reduce_add_ps(c1);
	out[2] = _mm512_reduce_add_ps(c2);
	out[3] = _mm512_reduce_add_ps(c3);
}

/* Lane q = dot_avx512(row q of b, u, rank) for the nr <= 16 rows q < nr (B's rows, rank apart; lanes
 * past nr 0):
 * the same fused multiply-adds per row, and the sixteen rows' lanes summed together in a tree that
 * pairs them as _mm512_reduce_add_ps does (lane j with j + 8, then j + 4, j + 2, j + 1), so each
 * row's value is bit for bit the single dot's at a tenth of the shuffles. pf: NULL, or the next
 * sixteen rows, asked for from memory along the way. */
INL __m512 rows16_avx512(const void *b, int64_t rank, int nr, const float *u, const char *pf, const int D)
{
	/* Every loop over rows has a constant count, unrolled, so the sixteen sums stay in registers (a
	 * loop to nr kept them on the stack); rows past nr stay zero. */
	__m512 acc[16];
#pragma GCC unroll 16
	for (int q = 0; q < 16; q++)
		acc[q] = _mm512_setzero_ps();
	/* row after row, so B is read front to back as one stream */
	const int64_t kf = rank / 16 * 16, es = (int64_t)nx_lora_elt_size(D);
	const __mmask16 mt = (__mmask16)((1u << (rank - kf)) - 1);
#pragma GCC unroll 16
	for (int q = 0; q < 16; q++) {
		if (q >= nr)
			continue;
		const void *bq = nx_lora_row(D, b, q, rank);
		if (pf) /* row q of the next sixteen */
			for (int64_t l = 0; l < rank * es; l += 64)
				_mm_prefetch(pf + q * rank * es + l, _MM_HINT_T0);
		for (int64_t k = 0; k < kf; k += 16)
			acc[q] = _mm512_fmadd_ps(lda16(bq, k, D), _mm512_loadu_ps(u + k), acc[q]);
		if (kf < rank)
			acc[q] = _mm512_fmadd_ps(lda16_tail(bq, kf, (int)(rank - kf), D), _mm512_maskz_loadu_ps(mt, u + kf),
						 acc[q]);
	}
	/* lane j + lane j + 8: two rows per vector, [row 2i: 8 lanes | row 2i+1: 8 lanes] */
	__m512 h[8];
#pragma GCC unroll 8
	for (int i = 0; i < 8; i++)
		h[i] = _mm512_add_ps(_mm512_shuffle_f32x4(acc[2 * i], acc[2 * i + 1], 0x44),
				     _mm512_shuffle_f32x4(acc[2 * i], acc[2 * i + 1], 0xee));
	/* + lane j + 4: four rows per vector, 4 lanes each (rows 4i .. 4i+3 in 128-bit chunks) */
	__m512 g[4];
#pragma GCC unroll 4
	for (int i = 0; i < 4; i++)
		g[i] = _mm512_add_ps(_mm512_shuffle_f32x4(h[2 * i], h[2 * i + 1], 0x88),
				     _mm512_shuffle_f32x4(h[2 * i], h[2 * i + 1], 0xdd));
	/* + lane j + 2, then + lane j + 1, within each 128-bit chunk */
	const __m512 e0 = _mm512_add_ps(_mm512_shuffle_ps(g[0], g[1], 0x44), _mm512_shuffle_ps(g[0], g[1], 0xee));
	const __m512 e1 = _mm512_add_ps(_mm512_shuffle_ps(g[2], g[3], 0x44), _mm512_shuffle_ps(g[2], g[3], 0xee));
	const __m512 f = _mm512_add_ps(_mm512_shuffle_ps(e0, e1, 0x88), _mm512_shuffle_ps(e0, e1, 0xdd));
	/* chunk c of f holds rows c, 4 + c, 8 + c, 12 + c in lanes 0..3: row q from lane 4 (q % 4) + q / 4 */
	return _mm512_permutexvar_ps(_mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0), f);
}

/* rows16_avx512 of the sixteen rows in a tile of B (nx_lora_t.bt: (rank, 16), rank * sizeof < 64), bit
 * for bit: lane q of vector j here is lane j of row q's accumulator there, built by the same fused
 * multiply-adds (element k in vector k % 16, then one add of +0 where row q's masked tail added 0 * 0),
 * and the vectors summed in the same tree (j with j + 8, then j + 4, j + 2, j + 1): sixteen rows'
 * sums come out in row order without a shuffle, and for rank < 16 with a multiply-add per element.
 * B @ u of every SmolLM2 matrix, one thread, rank 8 in f16: 350 -> 150 us per token, 1430 -> 470 for
 * four tokens; rank 16: 315 -> 218 (throwaway loop over nx_lora_delta_b, three runs each). */
INL __m512 tiles16_avx512(const void *tile, int rank, const float *u, const int D)
{
	/* vector by vector (a constant index each, so all sixteen stay in registers) */
	__m512 acc[16];
#pragma GCC unroll 16
	for (int j = 0; j < 16; j++) {
		acc[j] = _mm512_setzero_ps();
		for (int k = j; k < rank; k += 16)
			acc[j] = _mm512_fmadd_ps(lda16(tile, 16 * (int64_t)k, D), _mm512_set1_ps(u[k]), acc[j]);
		if (rank > 16 && rank < 32 && j >= rank - 16) /* the masked tail's 0 * 0 (-0 becomes +0 there) */
			acc[j] = _mm512_add_ps(acc[j], _mm512_setzero_ps());
	}
#pragma GCC unroll 8
	for (int j = 0; j < 8; j++)
		acc[j] = _mm512_add_ps(acc[j], acc[j + 8]);
#pragma GCC unroll 4
	for (int j = 0; j < 4; j++)
		acc[j] = _mm512_add_ps(acc[j], acc[j + 4]);
	acc[0] = _mm512_add_ps(acc[0], acc[2]);
	acc[1] = _mm512_add_ps(acc[1], acc[3]);
	return _mm512_add_ps(acc[0], acc[1]);
}

/* 0: not yet known, 1: dot_v4, 2: AVX-512. Decided on first use without locks (every caller decides
 * the same): pthread_once would end with a futex wake the worker sandbox does not allow. */
static _Atomic int impl;

static bool use_avx512(void)
{
	int v = atomic_load_explicit(&impl, memory_order_relaxed);
	if (!v) {
		v = nx_kern_set(NX_KFAM_LORA) == NX_KSET_AVX512 ? 2 : 1;
		atomic_store_explicit(&impl, v, memory_order_relaxed);
	}
	return v == 2;
}

static TGT float dot_avx512_any(enum nx_lora_dtype d, const void *a, const float *x, int64_t n)
{
	return d == NX_LORA_F16 ? dot_avx512(a, x, n, NX_LORA_F16)
	       : d == NX_LORA_BF16 ? dot_avx512(a, x, n, NX_LORA_BF16)
				   : dot_avx512(a, x, n, NX_LORA_F32);
}

/* a . x for a held as d: the AVX-512 dot where it runs, else dot_v4. */
static float dot_any(enum nx_lora_dtype d, const void *a, const float *x, int64_t n)
{
	return use_avx512() ? dot_avx512_any(d, a, x, n) : dot_v4(d, a, x, n);
}

bool nx_lora_fast16(void)
{
	return use_avx512();
}

float nx_lora_dot_fast(const float *a, const float *x, int64_t n)
{
	return dot_any(NX_LORA_F32, a, x, n);
}

float nx_lora_delta_row(const struct nx_lora_t *t, int64_t r, const float *u)
{
	return dot_any(t->dtype, nx_lora_row(t->dtype, t->b, r, t->rank), u, t->rank);
}

/* Rows [k0, k1) of u from A, four at a time (k0 + 4i), for one dtype. */
INL int delta_a4(const struct nx_lora_t *t, const float *x, size_t ldx, int n, int k0, int k1, float *u, size_t ldu,
		 const int D)
{
	const int64_t n_in = t->n_in;
	int k = k0;
	for (; k + 4 <= k1; k += 4) {
		const void *a = nx_lora_row(D, t->a, k, n_in);
		/* Four rows of A are four short streams (n_in values each) that end before the hardware
		 * prefetchers catch on; the first token's pass asks for the next four rows. For rank 64
		 * (nxctl generate --lora, 256 tokens, alternating daemons) this and B's below took a
		 * SmolLM2 token from 7.36 to 6.72 ms (6 of 6 pairs); rank 8 did not change. */
		const char *next = k + 8 <= k1 ? (const char *)nx_lora_row(D, t->a, k + 4, n_in) : NULL;
		for (int i = 0; i < n; i++) {
			float d[4];
			dot4_avx512(a, x + (size_t)i * ldx, n_in, d, i ? NULL : next, D);
			for (int q = 0; q < 4; q++)
				u[(size_t)i * ldu + k + q] = d[q];
		}
	}
	return k;
}

static TGT int delta_a4_any(const struct nx_lora_t *t, const float *x, size_t ldx, int n, int k0, int k1, float *u,
			    size_t ldu)
{
	return t->dtype == NX_LORA_F16	  ? delta_a4(t, x, ldx, n, k0, k1, u, ldu, NX_LORA_F16)
	       : t->dtype == NX_LORA_BF16 ? delta_a4(t, x, ldx, n, k0, k1, u, ldu, NX_LORA_BF16)
					  : delta_a4(t, x, ldx, n, k0, k1, u, ldu, NX_LORA_F32);
}

void nx_lora_delta_a(const struct nx_lora_t *t, const float *x, size_t ldx, int n, int k0, int k1, float *u,
		     size_t ldu)
{
	int k = use_avx512() ? delta_a4_any(t, x, ldx, n, k0, k1, u, ldu) : k0;
	for (; k < k1; k++) {
		const void *a = nx_lora_row(t->dtype, t->a, k, t->n_in);
		for (int i = 0; i < n; i++)
			u[(size_t)i * ldu + k] = dot_any(t->dtype, a, x + (size_t)i * ldx, t->n_in);
	}
}

/* y rows [r0, r1) += s * B @ u, sixteen rows at a time, for one dtype. */
INL void delta_b16(const struct nx_lora_t *t, const float *u, size_t ldu, int n, float s, float *y, size_t ldy,
		   int64_t r0, int64_t r1, const int D)
{
	const __m512 sv = _mm512_set1_ps(s);
	const bool tiled = t->bt && r0 % 16 == 0; /* short rows: from the tiles */
	const size_t tile = nx_lora_b_tiles_size(16, t->rank, D);
	for (int64_t r = r0; r < r1; r += 16) {
		const int nr = r1 - r < 16 ? (int)(r1 - r) : 16;
		const __mmask16 m = (__mmask16)((1u << nr) - 1);
		/* Rows of a cache line or more (rank 32 and up in f16): the next sixteen, as A's above; shorter
		 * rows are too few lines for the prefetches to pay (rank 8 was 4% slower with them). */
		const char *next = r + 32 <= r1 && t->rank * (int64_t)nx_lora_elt_size(D) >= 64
					   ? (const char *)nx_lora_row(D, t->b, r + 16, t->rank)
					   : NULL;
		for (int i = 0; i < n; i++) {
			const float *ui = u + (size_t)i * ldu;
			const __m512 d = tiled ? tiles16_avx512((const uint8_t *)t->bt + (size_t)(r / 16) * tile, t->rank, ui, D)
					       : rows16_avx512(nx_lora_row(D, t->b, r, t->rank), t->rank, nr, ui, i ? NULL : next, D);
			float *yi = y + (size_t)i * ldy + r; /* y += s * d in one rounding (fma) */
			_mm512_mask_storeu_ps(yi, m, _mm512_fmadd_ps(sv, d, _mm512_maskz_loadu_ps(m, yi)));
		}
	}
}

static TGT void delta_b16_any(const struct nx_lora_t *t, const float *u, size_t ldu, int n, float s, float *y,
			      size_t ldy, int64_t r0, int64_t r1)
{
	if (t->dtype == NX_LORA_F16)
		delta_b16(t, u, ldu, n, s, y, ldy, r0, r1, NX_LORA_F16);
	else if (t->dtype == NX_LORA_BF16)
		delta_b16(t, u, ldu, n, s, y, ldy, r0, r1, NX_LORA_BF16);
	else
		delta_b16(t, u, ldu, n, s, y, ldy, r0, r1, NX_LORA_F32);
}

void nx_lora_delta_b(const struct nx_lora_t *t, const float *u, size_t ldu, int n, float s, float *y, size_t ldy,
		     int64_t r0, int64_t r1)
{
	if (use_avx512()) {
		delta_b16_any(t, u, ldu, n, s, y, ldy, r0, r1);
		return;
	}
	for (int64_t r = r0; r < r1; r++)
		for (int i = 0; i < n; i++)
			y[(size_t)i * ldy + r] += s * nx_lora_delta_row(t, r, u + (size_t)i * ldu);
}

void nx_lora_delta(const struct nx_lora_t *t, float s, const float *x, size_t ldx, int n, float *y, size_t ldy,
		   int64_t r0, int64_t r1, float *u)
{
	nx_lora_delta_a(t, x, ldx, n, 0, t->rank, u, (size_t)t->rank);
	nx_lora_delta_b(t, u, (size_t)t->rank, n, s, y, ldy, r0, r1);
}

/* ---- float64 helpers of the fold (lora/fold.c) and the report (lora/report.c) */

/* Sixteen f32 values as two vectors of eight doubles, exactly. */
INL void to_f64(__m512 v, __m512d *lo, __m512d *hi)
{
	*lo = _mm512_cvtps_pd(_mm512_castps512_ps256(v));
	*hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
}

/* acc[j] += b[k] * A[k, j] for k = 0, 1, ... rank - 1 in turn and the n columns j of A (rows n apart,
 * held as D), in float64: each product rounded and then each sum, as the scalar loop in nx_lora_ba_f64
 * does it (the asm keeps GCC from fusing them into a multiply-add, which rounds once). The sums stay in
 * registers over k, 32 columns at a time (four chains of adds); returns the columns done. */
INL int64_t ba_f64(const void *a, int64_t n, int rank, const double *b, double *acc, const int D)
{
	int64_t j = 0;
	for (; j + 32 <= n; j += 32) {
		__m512d s[4];
		#pragma GCC unroll 4
		for (int q = 0; q < 4; q++)
			s[q] = _mm512_loadu_pd(acc + j + 8 * q);
		const void *ak = a;
		for (int k = 0; k < rank; k++, ak = nx_lora_row(D, ak, 1, n)) {
			const __m512d bk = _mm512_set1_pd(b[k]);
			__m512d v[4];
			to_f64(lda16(ak, j, D), &v[0], &v[1]);
			to_f64(lda16(ak, j + 16, D), &v[2], &v[3]);
			#pragma GCC unroll 4
			for (int q = 0; q < 4; q++) {
				v[q] = _mm512_mul_pd(bk, v[q]);
				__asm__("" : "+v"(v[q]));
				s[q] = _mm512_add_pd(s[q], v[q]);
			}
		}
		#pragma GCC unroll 4
		for (int q = 0; q < 4; q++)
			_mm512_storeu_pd(acc + j + 8 * q, s[q]);
	}
	return j;
}

static TGT int64_t ba_f64_any(enum nx_lora_dtype d, const void *a, int64_t n, int rank, const double *b, double *acc)
{
	return d == NX_LORA_F16	   ? ba_f64(a, n, rank, b, acc, NX_LORA_F16)
	       : d == NX_LORA_BF16 ? ba_f64(a, n, rank, b, acc, NX_LORA_BF16)
				   : ba_f64(a, n, rank, b, acc, NX_LORA_F32);
}

void nx_lora_ba_f64(enum nx_lora_dtype d, const void *a, int64_t n, int rank, const double *b, double *acc)
{
	const int64_t j0 = use_avx512() ? ba_f64_any(d, a, n, rank, b, acc) : 0;
	for (int k = 0; k < rank; k++) {
		const void *ak = nx_lora_row(d, a, k, n);
		for (int64_t j = j0; j < n; j++)
			acc[j] += b[k] * (double)nx_lora_elt(d, ak, (size_t)j);
	}
}

/* out[p] = sum over j of d[j] * xt[j * n_x + p] for p < n_x, in float64 from 0 in order of j, each
 * product rounded and then each sum, 32 values of p at a time in registers (masked past n_x). */
static TGT void dots_f64_avx512(const double *d, const double *xt, int64_t n, int n_x, double *out)
{
	for (int p0 = 0; p0 < n_x; p0 += 32) {
		__mmask8 k[4];
		__m512d s[4];
		#pragma GCC unroll 4
		for (int q = 0; q < 4; q++) {
			const int m = n_x - p0 - 8 * q;
			k[q] = (__mmask8)(m >= 8 ? 0xff : m > 0 ? (1u << m) - 1 : 0);
			s[q] = _mm512_setzero_pd();
		}
		for (int64_t j = 0; j < n; j++) {
			const __m512d dj = _mm512_set1_pd(d[j]);
			const double *x = xt + j * n_x + p0;
			#pragma GCC unroll 4
			for (int q = 0; q < 4; q++) {
				__m512d v = _mm512_mul_pd(dj, _mm512_maskz_loadu_pd(k[q], x + 8 * q));
				__asm__("" : "+v"(v));
				s[q] = _mm512_add_pd(s[q], v);
			}
		}
		#pragma GCC unroll 4
		for (int q = 0; q < 4; q++)
			_mm512_mask_storeu_pd(out + p0 + 8 * q, k[q], s[q]);
	}
}

void nx_lora_dots_f64(const double *d, const double *xt, int64_t n, int n_x, double *out)
{
	if (use_avx512()) {
		dots_f64_avx512(d, xt, n, n_x, out);
		return;
	}
	for (int p = 0; p < n_x; p++)
		out[p] = 0;
	for (int64_t j = 0; j < n; j++)
		for (int p = 0; p < n_x; p++)
			out[p] += d[j] * xt[j * n_x + p];
}

int64_t nx_lora_delta_flops(const struct nx_lora_t *t)
{
	return 2 * (int64_t)t->rank * (t->n_in + t->n_out);
}
