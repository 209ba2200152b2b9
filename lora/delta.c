/* delta.c - the runtime LoRA delta y += s * B @ (A @ x), f32 throughout: AVX-512 dots where the CPU has
 * them (A @ x four rows of A at a time, B @ u sixteen rows at a time, each row's sum as one dot gives
 * it), eight-lane plain vectors elsewhere (dot_v4). */
#include "lora/delta.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include <immintrin.h>

#define TGT __attribute__((target("avx512f")))

/* a . x without AVX-512: eight lanes (j mod 8, two 16-byte GCC vectors:
 * 32-byte ones on a build without AVX kept their sums on the stack, and
 * runtime LoRA decode ran at a third of its speed) summed pairwise, then the
 * lanes in a fixed order: the same result wherever a and x are and however
 * the caller bands its rows. */
typedef float v4 __attribute__((vector_size(16)));
static inline v4 ld4(const float *p)
{
	v4 v;
	__builtin_memcpy(&v, p, 16);
	return v;
}

static float dot_v4(const float *a, const float *x, int64_t n)
{
	/* lanes 0-3 and 4-7 of two eight-lane sums, for j mod 16 < 8 and >= 8 */
	v4 s0 = {0}, s1 = {0}, t0 = {0}, t1 = {0};
	int64_t j = 0;
	for (; j + 16 <= n; j += 16) {
		s0 += ld4(a + j) * ld4(x + j);
		s1 += ld4(a + j + 4) * ld4(x + j + 4);
		t0 += ld4(a + j + 8) * ld4(x + j + 8);
		t1 += ld4(a + j + 12) * ld4(x + j + 12);
	}
	for (; j + 8 <= n; j += 8) {
		s0 += ld4(a + j) * ld4(x + j);
		s1 += ld4(a + j + 4) * ld4(x + j + 4);
	}
	s0 += t0;
	s1 += t1;
	float d = ((s0[0] + s1[0]) + (s0[1] + s1[1])) + ((s0[2] + s1[2]) + (s0[3] + s1[3]));
	for (; j < n; j++)
		d += a[j] * x[j];
	return d;
}

/* a . x over n: sixteen lanes of fused multiply-adds, the last n % 16 under a mask, then the lanes'
 * sum in _mm512_reduce_add_ps's order. */
static TGT float dot_avx512(const float *a, const float *x, int64_t n)
{
	__m512 acc = _mm512_setzero_ps();
	int64_t j = 0;
	for (; j + 16 <= n; j += 16)
		acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + j), _mm512_loadu_ps(x + j), acc);
	if (j < n) {
		const __mmask16 m = (__mmask16)((1u << (n - j)) - 1);
		acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + j), _mm512_maskz_loadu_ps(m, x + j), acc);
	}
	return _mm512_reduce_add_ps(acc);
}

/* out[q] = dot_avx512(a + q * lda, x, n) for q < 4, each x vector loaded once for the four rows. */
static TGT void dot4_avx512(const float *a, size_t lda, const float *x, int64_t n, float *out)
{
	__m512 c0 = _mm512_setzero_ps(), c1 = c0, c2 = c0, c3 = c0;
	const float *a1 = a + lda, *a2 = a1 + lda, *a3 = a2 + lda;
	int64_t j = 0;
	for (; j + 16 <= n; j += 16) {
		const __m512 v = _mm512_loadu_ps(x + j);
		c0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + j), v, c0);
		c1 = _mm512_fmadd_ps(_mm512_loadu_ps(a1 + j), v, c1);
		c2 = _mm512_fmadd_ps(_mm512_loadu_ps(a2 + j), v, c2);
		c3 = _mm512_fmadd_ps(_mm512_loadu_ps(a3 + j), v, c3);
	}
	if (j < n) {
		const __mmask16 m = (__mmask16)((1u << (n - j)) - 1);
		const __m512 v = _mm512_maskz_loadu_ps(m, x + j);
		c0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + j), v, c0);
		c1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a1 + j), v, c1);
		c2 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a2 + j), v, c2);
		c3 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a3 + j), v, c3);
	}
	out[0] = _mm512_reduce_add_ps(c0);
	out[1] = _mm512_reduce_add_ps(c1);
	out[2] = _mm512_reduce_add_ps(c2);
	out[3] = _mm512_reduce_add_ps(c3);
}

/* out[q] = dot_avx512(b + q * rank, u, rank) for the nr <= 16 rows q < nr (B's rows, rank apart):
 * the same fused multiply-adds per row, and the sixteen rows' lanes summed together in a tree that
 * pairs them as _mm512_reduce_add_ps does (lane j with j + 8, then j + 4, j + 2, j + 1), so each
 * row's value is bit for bit the single dot's at a tenth of the shuffles. */
static TGT void rows16_avx512(const float *b, int64_t rank, int nr, const float *u, float *out)
{
	/* Every loop over rows has a constant count, unrolled, so the sixteen sums stay in registers (a
	 * loop to nr kept them on the stack); rows past nr stay zero. */
	__m512 acc[16];
#pragma GCC unroll 16
	for (int q = 0; q < 16; q++)
		acc[q] = _mm512_setzero_ps();
	/* row after row, so B is read front to back as one stream */
	const int64_t kf = rank / 16 * 16;
	const __mmask16 mt = (__mmask16)((1u << (rank - kf)) - 1);
#pragma GCC unroll 16
	for (int q = 0; q < 16; q++) {
		if (q >= nr)
			continue;
		const float *bq = b + q * rank;
		for (int64_t k = 0; k < kf; k += 16)
			acc[q] = _mm512_fmadd_ps(_mm512_loadu_ps(bq + k), _mm512_loadu_ps(u + k), acc[q]);
		if (kf < rank)
			acc[q] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mt, bq + kf), _mm512_maskz_loadu_ps(mt, u + kf), acc[q]);
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
	/* chunk c of f holds rows c, 4 + c, 8 + c, 12 + c in lanes 0..3 */
	float t[16];
	_mm512_storeu_ps(t, f);
	for (int q = 0; q < nr; q++)
		out[q] = t[4 * (q % 4) + q / 4];
}

/* 0: not yet known, 1: dot_v4, 2: AVX-512. Decided on first use without locks (every caller decides
 * the same): pthread_once would end with a futex wake the worker sandbox does not allow. */
static _Atomic int impl;

static bool use_avx512(void)
{
	int v = atomic_load_explicit(&impl, memory_order_relaxed);
	if (!v) {
		__builtin_cpu_init();
		const char *k = getenv("NX_KERN");
		v = __builtin_cpu_supports("avx512f") && !(k && (!strcmp(k, "ref") || !strcmp(k, "avx2"))) ? 2 : 1;
		atomic_store_explicit(&impl, v, memory_order_relaxed);
	}
	return v == 2;
}

float nx_lora_dot_fast(const float *a, const float *x, int64_t n)
{
	return use_avx512() ? dot_avx512(a, x, n) : dot_v4(a, x, n);
}

float nx_lora_delta_row(const struct nx_lora_t *t, int64_t r, const float *u)
{
	return nx_lora_dot_fast(t->b + (size_t)r * t->rank, u, t->rank);
}

void nx_lora_delta_a(const struct nx_lora_t *t, const float *x, size_t ldx, int n, int k0, int k1, float *u,
		     size_t ldu)
{
	const int64_t n_in = t->n_in;
	int k = k0;
	if (use_avx512())
		for (; k + 4 <= k1; k += 4) {
			const float *a = t->a + (size_t)k * n_in;
			for (int i = 0; i < n; i++) {
				float d[4];
				dot4_avx512(a, (size_t)n_in, x + (size_t)i * ldx, n_in, d);
				for (int q = 0; q < 4; q++)
					u[(size_t)i * ldu + k + q] = d[q];
			}
		}
	for (; k < k1; k++) {
		const float *a = t->a + (size_t)k * n_in;
		for (int i = 0; i < n; i++)
			u[(size_t)i * ldu + k] = nx_lora_dot_fast(a, x + (size_t)i * ldx, n_in);
	}
}

void nx_lora_delta_b(const struct nx_lora_t *t, const float *u, size_t ldu, int n, float s, float *y, size_t ldy,
		     int64_t r0, int64_t r1)
{
	if (use_avx512()) {
		float d[16];
		for (int64_t r = r0; r < r1; r += 16) {
			const int nr = r1 - r < 16 ? (int)(r1 - r) : 16;
			for (int i = 0; i < n; i++) {
				rows16_avx512(t->b + (size_t)r * t->rank, t->rank, nr, u + (size_t)i * ldu, d);
				float *yi = y + (size_t)i * ldy + r;
				for (int q = 0; q < nr; q++)
					yi[q] += s * d[q];
			}
		}
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

int64_t nx_lora_delta_flops(const struct nx_lora_t *t)
{
	return 2 * (int64_t)t->rank * (t->n_in + t->n_out);
}
