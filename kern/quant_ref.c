/* quant_ref.c - scalar reference kernels (dequantize, quantize, dot) for every tensor type we read.
 *
 * These are the ground truth the SIMD kernels are tested against, so they are
 * written for clarity and exactness, not speed. Block layouts and quantizers
 * follow ggml's reference code (ggml-quants.c: quantize_row_*_ref,
 * dequantize_row_*), so a file we write reads the same in llama.cpp, and our
 * Q4_0/Q4_1/Q5_0/Q5_1/Q8_0 blocks are bit-identical to ggml's and gguf-py's.
 * The k-quant and IQ4 quantizers are ggml's no-imatrix ones (make_qkx2_quants
 * for Q2_K/Q4_K/Q5_K, make_q3_quants for Q3_K, make_qx_quants for Q6_K, the
 * scale search of quantize_row_iq4_nl_impl for IQ4_NL/IQ4_XS), i.e. what
 * `llama-quantize` produces without an imatrix, byte for byte
 * (tests/py/test_quant.py checks both). To
 * stay that exact, every float operation keeps ggml's order, and min/max
 * searches use ggml's strict comparisons (they decide the sign of a zero min).
 * Only difference: an all-zero Q8_K block gets zero bsums (ggml leaves them).
 *
 * Activations (vec_dot_type):
 *   Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 -> Q8_0. ggml uses Q8_1 for Q4_1/Q5_1 to carry
 *     d*sum(q) in an f16; we instead sum the Q8_0 block's integers inside the
 *     dot. One activation type fewer, and the min term is exact (no f16
 *     rounding of the sum); a SIMD kernel gets the sum from the same pass.
 *   IQ4_NL -> Q8_0, as ggml.
 *   Q2_K Q3_K Q4_K Q5_K Q6_K IQ4_XS -> Q8_K (float d, bsums over groups of 16).
 *   F32 F16 BF16 -> F32 (float activations, no quantization).
 * Dots accumulate like ggml's generic code: an exact integer dot per block,
 * scaled by the block scales and summed in float; the float types sum float
 * products in double.
 *
 * Multi-byte fields are read as little-endian, as GGUF stores them (x86 only). */

/* No fused multiply-add in this file: the quantizers must round every product
 * and sum exactly as ggml's and numpy's code do, whatever -march says. */
#pragma GCC optimize("fp-contract=off")

#include "kern/quant.h"

#include <float.h>
#include <math.h>
#include <string.h>

#define MIN(a, b) ((a) < (b) ? (a) : (b))
#define MAX(a, b) ((a) > (b) ? (a) : (b))

/* A group whose largest magnitude is below this quantizes to all zeros (as ggml). */
#define GROUP_MAX_EPS 1e-15f

/* Round to nearest, ties to even (the default rounding mode), as ggml's nearest_int. */
static inline int nearest_int(float x)
{
	return (int)lrintf(x);
}

static inline float fp16(nx_f16 h)
{
	return nx_f16_to_f32(h);
}

/* ---------------------------------------------------------------- f32, f16, bf16 */

static void dequant_f32(const void *src, float *dst, int64_t n)
{
	memcpy(dst, src, (size_t)n * sizeof(float));
}

static void quant_f32(const float *src, void *dst, int64_t n)
{
	memcpy(dst, src, (size_t)n * sizeof(float));
}

static float dot_f32(const void *w, const void *a, int64_t n)
{
	const float *x = w, *y = a;
	double sum = 0;
	for (int64_t i = 0; i < n; i++)
		sum += (double)(x[i] * y[i]);
	return (float)sum;
}

static void dequant_f16(const void *src, float *dst, int64_t n)
{
	const nx_f16 *x = src;
	for (int64_t i = 0; i < n; i++)
		dst[i] = nx_f16_to_f32(x[i]);
}

static void quant_f16(const float *src, void *dst, int64_t n)
{
	nx_f16 *y = dst;
	for (int64_t i = 0; i < n; i++)
		y[i] = nx_f32_to_f16(src[i]);
}

static float dot_f16(const void *w, const void *a, int64_t n)
{
	const nx_f16 *x = w;
	const float *y = a;
	double sum = 0;
	for (int64_t i = 0; i < n; i++)
		sum += (double)(nx_f16_to_f32(x[i]) * y[i]);
	return (float)sum;
}

static void dequant_bf16(const void *src, float *dst, int64_t n)
{
	const nx_bf16 *x = src;
	for (int64_t i = 0; i < n; i++)
		dst[i] = nx_bf16_to_f32(x[i]);
}

static void quant_bf16(const float *src, void *dst, int64_t n)
{
	nx_bf16 *y = dst;
	for (int64_t i = 0; i < n; i++)
		y[i] = nx_f32_to_bf16(src[i]);
}

static float dot_bf16(const void *w, const void *a, int64_t n)
{
	const nx_bf16 *x = w;
	const float *y = a;
	double sum = 0;
	for (int64_t i = 0; i < n; i++)
		sum += (double)(nx_bf16_to_f32(x[i]) * y[i]);
	return (float)sum;
}

/* ---------------------------------------------------------------- q8_0 */

static void dequant_q8_0(const void *src, float *dst, int64_t n)
{
	const struct nx_block_q8_0 *b = src;
	for (int64_t i = 0; i < n / QK8_0; i++, dst += QK8_0) {
		const float d = fp16(b[i].d);
		for (int j = 0; j < QK8_0; j++)
			dst[j] = b[i].qs[j] * d;
	}
}

/* roundf(y) as a Q8_0 level: |q| <= 127 for finite input; a NaN hides from
 * amax (NaN > x is false) and inf * 0 is NaN, so clamp: converting an
 * out-of-range float is undefined. */
static inline int8_t q8_level(float y)
{
	const float q = roundf(y);
	return (int8_t)(q >= 127.0f ? 127 : q <= -128.0f ? -128 : q == q ? q : 0);
}

static inline float q8_0_amax(const float *x)
{
	float amax = 0;
	for (int j = 0; j < QK8_0; j++)
		amax = MAX(amax, fabsf(x[j]));
	return amax;
}

/* d = amax / 127, q = round(x / d) with ties away from zero (roundf, as ggml). */
static void quant_q8_0(const float *src, void *dst, int64_t n)
{
	struct nx_block_q8_0 *b = dst;
	for (int64_t i = 0; i < n / QK8_0; i++, src += QK8_0) {
		const float d = q8_0_amax(src) / 127;
		/* A subnormal d has no finite inverse; it rounds to 0 in f16, so the
		 * block dequantizes to 0 whatever qs holds: store zeros (as the SIMD
		 * quantizers do). */
		const float id = d && isfinite(1.0f / d) ? 1.0f / d : 0.0f;
		b[i].d = nx_f32_to_f16(d);
		for (int j = 0; j < QK8_0; j++)
			b[i].qs[j] = q8_level(src[j] * id);
	}
}

/* By its definition (kern/quant.h), block by block: hi is quant_q8_0's block
 * where d = amax / 127 >= 2^-7; below, its scale is d rounded up to a multiple
 * of 2^-17 (exact in f16, and so is that / 128), q = roundf(x / scale). lo's
 * scale is hi's / 128, exactly; lo = roundf((x - dequant(hi)) * 128 / scale). */
static void quant2_q8_0(const float *src, void *hi, void *lo, int64_t n)
{
	struct nx_block_q8_0 *h = hi, *l = lo;
	for (int64_t i = 0; i < n / QK8_0; i++, src += QK8_0) {
		const float d = q8_0_amax(src) / 127;
		if (d >= 0x1p-7f) {
			quant_q8_0(src, &h[i], QK8_0);
		} else {
			const float ds = ceilf(d * 0x1p17f) * 0x1p-17f;
			const float id = ds ? 1.0f / ds : 0.0f;
			h[i].d = nx_f32_to_f16(ds);
			for (int j = 0; j < QK8_0; j++)
				h[i].qs[j] = q8_level(src[j] * id);
		}
		if (!l)
			continue;
		const float dh = fp16(h[i].d);
		if (!isfinite(dh)) {
			memset(&l[i], 0, sizeof(l[i]));
			continue;
		}
		const float dl = dh / 128, idl = dl ? 1.0f / dl : 0.0f;
		l[i].d = nx_f32_to_f16(dl);
		for (int j = 0; j < QK8_0; j++) /* q * dh is exact (8-bit q, 11-bit dh) */
			l[i].qs[j] = q8_level((src[j] - h[i].qs[j] * dh) * idl);
	}
}

static float dot_q8_0(const void *w, const void *a, int64_t n)
{
	const struct nx_block_q8_0 *x = w, *y = a;
	float sum = 0;
	for (int64_t i = 0; i < n / QK8_0; i++) {
		int isum = 0;
		for (int j = 0; j < QK8_0; j++)
			isum += x[i].qs[j] * y[i].qs[j];
		sum += isum * (fp16(x[i].d) * fp16(y[i].d));
	}
	return sum;
}

/* Sum of a Q8_0 activation block's integers: the min term of Q4_1/Q5_1 dots. */
static inline int q8_0_sum(const struct nx_block_q8_0 *y)
{
	int s = 0;
	for (int j = 0; j < QK8_0; j++)
		s += y->qs[j];
	return s;
}

/* ---------------------------------------------------------------- q4_0 */

static void dequant_q4_0(const void *src, float *dst, int64_t n)
{
	const struct nx_block_q4_0 *b = src;
	for (int64_t i = 0; i < n / QK4_0; i++, dst += QK4_0) {
		const float d = fp16(b[i].d);
		for (int j = 0; j < QK4_0 / 2; j++) {
			dst[j] = ((b[i].qs[j] & 0x0f) - 8) * d;
			dst[j + QK4_0 / 2] = ((b[i].qs[j] >> 4) - 8) * d;
		}
	}
}

/* d = -max/8 where max is the signed value of largest magnitude, so that value
 * maps exactly to q = 0 and the other side gets the 8th level: q = x/d + 8. */
static void quant_q4_0(const float *src, void *dst, int64_t n)
{
	struct nx_block_q4_0 *b = dst;
	for (int64_t i = 0; i < n / QK4_0; i++, src += QK4_0) {
		float amax = 0, max = 0;
		for (int j = 0; j < QK4_0; j++) {
			if (amax < fabsf(src[j])) {
				amax = fabsf(src[j]);
				max = src[j];
			}
		}
		const float d = max / -8;
		const float id = d ? 1.0f / d : 0.0f;
		b[i].d = nx_f32_to_f16(d);
		for (int j = 0; j < QK4_0 / 2; j++) {
			/* +8.5 then truncation: round half up into 0..16, clamp to 15. */
			const int q0 = MIN(15, (int8_t)(src[j] * id + 8.5f));
			const int q1 = MIN(15, (int8_t)(src[j + QK4_0 / 2] * id + 8.5f));
			b[i].qs[j] = (uint8_t)(q0 | (q1 << 4));
		}
	}
}

static float dot_q4_0(const void *w, const void *a, int64_t n)
{
	const struct nx_block_q4_0 *x = w;
	const struct nx_block_q8_0 *y = a;
	float sum = 0;
	for (int64_t i = 0; i < n / QK4_0; i++) {
		int isum = 0;
		for (int j = 0; j < QK4_0 / 2; j++) {
			isum += ((x[i].qs[j] & 0x0f) - 8) * y[i].qs[j];
			isum += ((x[i].qs[j] >> 4) - 8) * y[i].qs[j + QK4_0 / 2];
		}
		sum += isum * (fp16(x[i].d) * fp16(y[i].d));
	}
	return sum;
}

/* ---------------------------------------------------------------- q4_1 */

static void dequant_q4_1(const void *src, float *dst, int64_t n)
{
	const struct nx_block_q4_1 *b = src;
	for (int64_t i = 0; i < n / QK4_1; i++, dst += QK4_1) {
		const float d = fp16(b[i].d), m = fp16(b[i].m);
		for (int j = 0; j < QK4_1 / 2; j++) {
			dst[j] = (b[i].qs[j] & 0x0f) * d + m;
			dst[j + QK4_1 / 2] = (b[i].qs[j] >> 4) * d + m;
		}
	}
}

/* m = min, d = (max - min)/15, q = round((x - min)/d). */
static void quant_q4_1(const float *src, void *dst, int64_t n)
{
	struct nx_block_q4_1 *b = dst;
	for (int64_t i = 0; i < n / QK4_1; i++, src += QK4_1) {
		float min = FLT_MAX, max = -FLT_MAX;
		for (int j = 0; j < QK4_1; j++) {
			if (src[j] < min)
				min = src[j];
			if (src[j] > max)
				max = src[j];
		}
		const float d = (max - min) / 15;
		const float id = d ? 1.0f / d : 0.0f;
		b[i].d = nx_f32_to_f16(d);
		b[i].m = nx_f32_to_f16(min);
		for (int j = 0; j < QK4_1 / 2; j++) {
			const int q0 = MIN(15, (int8_t)((src[j] - min) * id + 0.5f));
			const int q1 = MIN(15, (int8_t)((src[j + QK4_1 / 2] - min) * id + 0.5f));
			b[i].qs[j] = (uint8_t)(q0 | (q1 << 4));
		}
	}
}

static float dot_q4_1(const void *w, const void *a, int64_t n)
{
	const struct nx_block_q4_1 *x = w;
	const struct nx_block_q8_0 *y = a;
	float sum = 0;
	for (int64_t i = 0; i < n / QK4_1; i++) {
		int isum = 0;
		for (int j = 0; j < QK4_1 / 2; j++) {
			isum += (x[i].qs[j] & 0x0f) * y[i].qs[j];
			isum += (x[i].qs[j] >> 4) * y[i].qs[j + QK4_1 / 2];
		}
		const float dy = fp16(y[i].d);
		sum += (fp16(x[i].d) * dy) * isum + (fp16(x[i].m) * dy) * q8_0_sum(&y[i]);
	}
	return sum;
}

/* ---------------------------------------------------------------- q5_0, q5_1 */

/* Bit j of qh is bit 4 of element j. */
static inline uint32_t q5_high_bits(const uint8_t qh[4])
{
	uint32_t h;
	memcpy(&h, qh, sizeof(h));
	return h;
}

static void dequant_q5_0(const void *src, float *dst, int64_t n)
{
	const struct nx_block_q5_0 *b = src;
	for (int64_t i = 0; i < n / QK5_0; i++, dst += QK5_0) {
		const float d = fp16(b[i].d);
		const uint32_t qh = q5_high_bits(b[i].qh);
		for (int j = 0; j < QK5_0 / 2; j++) {
			const int q0 = (b[i].qs[j] & 0x0f) | (((qh >> j) & 1) << 4);
			const int q1 = (b[i].qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
			dst[j] = (q0 - 16) * d;
			dst[j + QK5_0 / 2] = (q1 - 16) * d;
		}
	}
}

/* As q4_0 with 32 levels: d = -max/16, q = x/d + 16. */
static void quant_q5_0(const float *src, void *dst, int64_t n)
{
	struct nx_block_q5_0 *b = dst;
	for (int64_t i = 0; i < n / QK5_0; i++, src += QK5_0) {
		float amax = 0, max = 0;
		for (int j = 0; j < QK5_0; j++) {
			if (amax < fabsf(src[j])) {
				amax = fabsf(src[j]);
				max = src[j];
			}
		}
		const float d = max / -16;
		const float id = d ? 1.0f / d : 0.0f;
		b[i].d = nx_f32_to_f16(d);
		uint32_t qh = 0;
		for (int j = 0; j < QK5_0 / 2; j++) {
			const int q0 = MIN(31, (int8_t)(src[j] * id + 16.5f));
			const int q1 = MIN(31, (int8_t)(src[j + QK5_0 / 2] * id + 16.5f));
			b[i].qs[j] = (uint8_t)((q0 & 0x0f) | ((q1 & 0x0f) << 4));
			qh |= (uint32_t)(q0 >> 4) << j;
			qh |= (uint32_t)(q1 >> 4) << (j + 16);
		}
		memcpy(b[i].qh, &qh, sizeof(qh));
	}
}

static float dot_q5_0(const void *w, const void *a, int64_t n)
{
	const struct nx_block_q5_0 *x = w;
	const struct nx_block_q8_0 *y = a;
	float sum = 0;
	for (int64_t i = 0; i < n / QK5_0; i++) {
		const uint32_t qh = q5_high_bits(x[i].qh);
		int isum = 0;
		for (int j = 0; j < QK5_0 / 2; j++) {
			const int q0 = (x[i].qs[j] & 0x0f) | (((qh >> j) & 1) << 4);
			const int q1 = (x[i].qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
			isum += (q0 - 16) * y[i].qs[j];
			isum += (q1 - 16) * y[i].qs[j + QK5_0 / 2];
		}
		sum += isum * (fp16(x[i].d) * fp16(y[i].d));
	}
	return sum;
}

static void dequant_q5_1(const void *src, float *dst, int64_t n)
{
	const struct nx_block_q5_1 *b = src;
	for (int64_t i = 0; i < n / QK5_1; i++, dst += QK5_1) {
		const float d = fp16(b[i].d), m = fp16(b[i].m);
		const uint32_t qh = q5_high_bits(b[i].qh);
		for (int j = 0; j < QK5_1 / 2; j++) {
			const int q0 = (b[i].qs[j] & 0x0f) | (((qh >> j) & 1) << 4);
			const int q1 = (b[i].qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
			dst[j] = q0 * d + m;
			dst[j + QK5_1 / 2] = q1 * d + m;
		}
	}
}

/* As q4_1 with 32 levels: d = (max - min)/31. */
static void quant_q5_1(const float *src, void *dst, int64_t n)
{
	struct nx_block_q5_1 *b = dst;
	for (int64_t i = 0; i < n / QK5_1; i++, src += QK5_1) {
		float min = FLT_MAX, max = -FLT_MAX;
		for (int j = 0; j < QK5_1; j++) {
			if (src[j] < min)
				min = src[j];
			if (src[j] > max)
				max = src[j];
		}
		const float d = (max - min) / 31;
		const float id = d ? 1.0f / d : 0.0f;
		b[i].d = nx_f32_to_f16(d);
		b[i].m = nx_f32_to_f16(min);
		uint32_t qh = 0;
		for (int j = 0; j < QK5_1 / 2; j++) {
			const int q0 = MIN(31, (uint8_t)((src[j] - min) * id + 0.5f));
			const int q1 = MIN(31, (uint8_t)((src[j + QK5_1 / 2] - min) * id + 0.5f));
			b[i].qs[j] = (uint8_t)((q0 & 0x0f) | ((q1 & 0x0f) << 4));
			qh |= (uint32_t)(q0 >> 4) << j;
			qh |= (uint32_t)(q1 >> 4) << (j + 16);
		}
		memcpy(b[i].qh, &qh, sizeof(qh));
	}
}

static float dot_q5_1(const void *w, const void *a, int64_t n)
{
	const struct nx_block_q5_1 *x = w;
	const struct nx_block_q8_0 *y = a;
	float sum = 0;
	for (int64_t i = 0; i < n / QK5_1; i++) {
		const uint32_t qh = q5_high_bits(x[i].qh);
		int isum = 0;
		for (int j = 0; j < QK5_1 / 2; j++) {
			const int q0 = (x[i].qs[j] & 0x0f) | (((qh >> j) & 1) << 4);
			const int q1 = (x[i].qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
			isum += q0 * y[i].qs[j];
			isum += q1 * y[i].qs[j + QK5_1 / 2];
		}
		const float dy = fp16(y[i].d);
		sum += (fp16(x[i].d) * dy) * isum + (fp16(x[i].m) * dy) * q8_0_sum(&y[i]);
	}
	return sum;
}

/* ---------------------------------------------------------------- q8_k (activations) */

static void dequant_q8_k(const void *src, float *dst, int64_t n)
{
	const struct nx_block_q8_k *b = src;
	for (int64_t i = 0; i < n / QK_K; i++, dst += QK_K)
		for (int j = 0; j < QK_K; j++)
			dst[j] = b[i].d * b[i].qs[j];
}

/* d = -max/127 (float, not f16), q = round(x/d) into -127..127; bsums for the min terms. */
static void quant_q8_k(const float *src, void *dst, int64_t n)
{
	struct nx_block_q8_k *b = dst;
	for (int64_t i = 0; i < n / QK_K; i++, src += QK_K) {
		float amax = 0, max = 0;
		for (int j = 0; j < QK_K; j++) {
			if (fabsf(src[j]) > amax) {
				amax = fabsf(src[j]);
				max = src[j];
			}
		}
		if (!amax) {
			memset(&b[i], 0, sizeof(b[i]));
			continue;
		}
		const float iscale = -127.f / max;
		for (int j = 0; j < QK_K; j++)
			b[i].qs[j] = (int8_t)MIN(127, nearest_int(iscale * src[j]));
		for (int g = 0; g < QK_K / 16; g++) {
			int s = 0;
			for (int j = 0; j < 16; j++)
				s += b[i].qs[16 * g + j];
			b[i].bsums[g] = (int16_t)s;
		}
		b[i].d = 1 / iscale;
	}
}

/* By its definition (kern/quant.h): quant, dequant, subtract, quant, block by
 * block; the float scale never overflows. */
static void quant2_q8_k(const float *src, void *hi, void *lo, int64_t n)
{
	struct nx_block_q8_k *h = hi, *l = lo;
	float r[QK_K];
	for (int64_t i = 0; i < n / QK_K; i++, src += QK_K) {
		quant_q8_k(src, &h[i], QK_K);
		if (!l)
			continue;
		dequant_q8_k(&h[i], r, QK_K);
		for (int j = 0; j < QK_K; j++)
			r[j] = src[j] - r[j];
		quant_q8_k(r, &l[i], QK_K);
	}
}

/* ---------------------------------------------------------------- k-quant helpers */

/* Fits x[0..n) ~ scale * L - min with L in 0..nmax, minimizing the weighted
 * squared error (absolute error with use_mad, as Q2_K asks): starts from the
 * min/max grid, then tries nstep+1 grids with
 * nmax + rmin + rdelta*is levels across the range and solves the least-squares
 * scale and min for each assignment (ggml's make_qkx2_quants). Returns scale,
 * stores min (as a positive offset) in *the_min and the levels in L. */
static float make_qkx2_quants(int n, int nmax, const float *x, const float *weights, uint8_t *L,
			      float *the_min, uint8_t *Laux, float rmin, float rdelta, int nstep, bool use_mad)
{
	float min = x[0], max = x[0];
	float sum_w = weights[0];
	float sum_x = sum_w * x[0];
	for (int i = 1; i < n; i++) {
		if (x[i] < min)
			min = x[i];
		if (x[i] > max)
			max = x[i];
		sum_w += weights[i];
		sum_x += weights[i] * x[i];
	}
	if (min > 0)
		min = 0; /* the offset only ever lowers the grid */
	if (max == min) {
		memset(L, 0, (size_t)n);
		*the_min = -min;
		return 0.f;
	}
	float iscale = nmax / (max - min);
	float scale = 1 / iscale;
	float best_error = 0;
	for (int i = 0; i < n; i++) {
		const int l = nearest_int(iscale * (x[i] - min));
		L[i] = (uint8_t)MAX(0, MIN(nmax, l));
		const float diff = scale * L[i] + min - x[i];
		best_error += weights[i] * (use_mad ? fabsf(diff) : diff * diff);
	}
	for (int is = 0; is <= nstep; is++) {
		iscale = (rmin + rdelta * is + nmax) / (max - min);
		float sum_l = 0, sum_l2 = 0, sum_xl = 0;
		for (int i = 0; i < n; i++) {
			const int l = MAX(0, MIN(nmax, nearest_int(iscale * (x[i] - min))));
			Laux[i] = (uint8_t)l;
			const float w = weights[i];
			sum_l += w * l;
			sum_l2 += w * l * l;
			sum_xl += w * l * x[i];
		}
		const float D = sum_w * sum_l2 - sum_l * sum_l;
		if (D > 0) {
			float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
			float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
			if (this_min > 0) {
				this_min = 0;
				this_scale = sum_xl / sum_l2;
			}
			float err = 0;
			for (int i = 0; i < n; i++) {
				const float diff = this_scale * Laux[i] + this_min - x[i];
				err += weights[i] * (use_mad ? fabsf(diff) : diff * diff);
			}
			if (err < best_error) {
				memcpy(L, Laux, (size_t)n);
				best_error = err;
				scale = this_scale;
				min = this_min;
			}
		}
	}
	*the_min = -min;
	return scale;
}

/* Fits x[0..n) ~ scale * (L - nmax) with L in 0..2*nmax-1 (symmetric, no min),
 * weighting errors by x^2: starts from the grid through the largest-magnitude
 * value, then tries 18 nearby grids, keeping the least-squares best
 * (ggml's make_qx_quants with rmse_type 1 and no importance weights). */
static float make_qx_quants(int n, int nmax, const float *x, int8_t *L)
{
	float max = 0, amax = 0;
	for (int i = 0; i < n; i++) {
		if (fabsf(x[i]) > amax) {
			amax = fabsf(x[i]);
			max = x[i];
		}
	}
	if (amax < GROUP_MAX_EPS) {
		memset(L, 0, (size_t)n);
		return 0.f;
	}
	float iscale = -nmax / max;
	float sumlx = 0, suml2 = 0;
	for (int i = 0; i < n; i++) {
		const int l = MAX(-nmax, MIN(nmax - 1, nearest_int(iscale * x[i])));
		L[i] = (int8_t)(l + nmax);
		const float w = x[i] * x[i];
		sumlx += w * x[i] * l;
		suml2 += w * l * l;
	}
	float scale = suml2 ? sumlx / suml2 : 0.0f;
	float best = scale * sumlx;
	for (int is = -9; is <= 9; is++) {
		if (is == 0)
			continue;
		iscale = -(nmax + 0.1f * is) / max;
		sumlx = suml2 = 0;
		for (int i = 0; i < n; i++) {
			const int l = MAX(-nmax, MIN(nmax - 1, nearest_int(iscale * x[i])));
			const float w = x[i] * x[i];
			sumlx += w * x[i] * l;
			suml2 += w * l * l;
		}
		/* sumlx^2/suml2 is the error reduction of the best scale for these levels. */
		if (suml2 > 0 && sumlx * sumlx > best * suml2) {
			for (int i = 0; i < n; i++)
				L[i] = (int8_t)(nmax + MAX(-nmax, MIN(nmax - 1, nearest_int(iscale * x[i]))));
			scale = sumlx / suml2;
			best = scale * sumlx;
		}
	}
	return scale;
}

/* Q4_K/Q5_K pack 8 six-bit scales and 8 six-bit mins into 12 bytes:
 *   bytes 0..3:  scale j (low 6 bits) for j<4, top 2 bits of scale j+4
 *   bytes 4..7:  min j (low 6 bits) for j<4,   top 2 bits of min j+4
 *   bytes 8..11: low 4 bits of scale j+4 | low 4 bits of min j+4 << 4 */
static inline void k4_scale_min(int j, const uint8_t *q, uint8_t *sc, uint8_t *m)
{
	if (j < 4) {
		*sc = q[j] & 63;
		*m = q[j + 4] & 63;
	} else {
		*sc = (uint8_t)((q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4));
		*m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
	}
}

static void k4_pack_scales(uint8_t q[K_SCALE_SIZE], const uint8_t ls[8], const uint8_t lm[8])
{
	memset(q, 0, K_SCALE_SIZE);
	for (int j = 0; j < 8; j++) {
		if (j < 4) {
			q[j] = ls[j];
			q[j + 4] = lm[j];
		} else {
			q[j + 4] = (uint8_t)((ls[j] & 0x0f) | ((lm[j] & 0x0f) << 4));
			q[j - 4] |= (uint8_t)((ls[j] >> 4) << 6);
			q[j] |= (uint8_t)((lm[j] >> 4) << 6);
		}
	}
}

/* Shared by Q4_K (nmax 15) and Q5_K (nmax 31): fit each 32-group with
 * make_qkx2_quants, quantize the 8 scales and mins to 6 bits against the
 * super-block's d and dmin (f16), then requantize every value against the
 * rounded scales so the levels match what dequantization will use. */
static void quant_k_super(const float *x, nx_f16 *d_out, nx_f16 *dmin_out, uint8_t scales_out[K_SCALE_SIZE],
			  uint8_t L[QK_K], int nmax, float rmin, float rdelta, int nstep)
{
	uint8_t Laux[32];
	float weights[32], mins[QK_K / 32], scales[QK_K / 32];
	float max_scale = 0, max_min = 0; /* both are non-negative: the min is subtracted */

	for (int j = 0; j < QK_K / 32; j++) {
		float sum_x2 = 0;
		for (int l = 0; l < 32; l++)
			sum_x2 += x[32 * j + l] * x[32 * j + l];
		const float av_x = sqrtf(sum_x2 / 32);
		for (int l = 0; l < 32; l++)
			weights[l] = av_x + fabsf(x[32 * j + l]);
		scales[j] = make_qkx2_quants(32, nmax, x + 32 * j, weights, L + 32 * j, &mins[j], Laux,
					     rmin, rdelta, nstep, false);
		/* strict >, so a -0 min (all-zero group) leaves max_min at +0 */
		if (scales[j] > max_scale)
			max_scale = scales[j];
		if (mins[j] > max_min)
			max_min = mins[j];
	}

	const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
	const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
	uint8_t ls[8], lm[8];
	for (int j = 0; j < QK_K / 32; j++) {
		ls[j] = (uint8_t)MIN(63, (uint8_t)nearest_int(inv_scale * scales[j]));
		lm[j] = (uint8_t)MIN(63, (uint8_t)nearest_int(inv_min * mins[j]));
	}
	k4_pack_scales(scales_out, ls, lm);
	*d_out = nx_f32_to_f16(max_scale / 63.f);
	*dmin_out = nx_f32_to_f16(max_min / 63.f);

	for (int j = 0; j < QK_K / 32; j++) {
		uint8_t sc, m;
		k4_scale_min(j, scales_out, &sc, &m);
		const float d = fp16(*d_out) * sc;
		if (!d)
			continue; /* keep the fit's levels; they dequantize to -dm either way */
		const float dm = fp16(*dmin_out) * m;
		for (int l = 0; l < 32; l++) {
			const int q = nearest_int((x[32 * j + l] + dm) / d);
			L[32 * j + l] = (uint8_t)MAX(0, MIN(nmax, q));
		}
	}
}

/* ---------------------------------------------------------------- q4_k */

/* Element layout: each 64 elements share 32 bytes of qs; elements 0..31 of the
 * chunk are the low nibbles (sub-block 2c), 32..63 the high nibbles (2c+1). */
static void dequant_q4_k(const void *src, float *dst, int64_t n)
{
	const struct nx_block_q4_k *b = src;
	for (int64_t i = 0; i < n / QK_K; i++) {
		const float d = fp16(b[i].d), dmin = fp16(b[i].dmin);
		const uint8_t *q = b[i].qs;
		for (int c = 0; c < QK_K / 64; c++, q += 32) {
			uint8_t sc, m;
			k4_scale_min(2 * c, b[i].scales, &sc, &m);
			const float d1 = d * sc, m1 = dmin * m;
			k4_scale_min(2 * c + 1, b[i].scales, &sc, &m);
			const float d2 = d * sc, m2 = dmin * m;
			for (int l = 0; l < 32; l++)
				*dst++ = d1 * (q[l] & 0x0f) - m1;
			for (int l = 0; l < 32; l++)
				*dst++ = d2 * (q[l] >> 4) - m2;
		}
	}
}

static void quant_q4_k(const float *src, void *dst, int64_t n)
{
	struct nx_block_q4_k *b = dst;
	uint8_t L[QK_K];
	for (int64_t i = 0; i < n / QK_K; i++, src += QK_K) {
		quant_k_super(src, &b[i].d, &b[i].dmin, b[i].scales, L, 15, -1.f, 0.1f, 20);
		uint8_t *q = b[i].qs;
		for (int c = 0; c < QK_K; c += 64, q += 32)
			for (int l = 0; l < 32; l++)
				q[l] = (uint8_t)(L[c + l] | (L[c + l + 32] << 4));
	}
}

/* sum_j d*sc_j * (q . a)_j - dmin*m_j * (sum of a over sub-block j), with the
 * activation sums of the 32-groups taken from Q8_K's 16-group bsums. */
static float dot_q4_k(const void *w, const void *a, int64_t n)
{
	const struct nx_block_q4_k *x = w;
	const struct nx_block_q8_k *y = a;
	float sum = 0;
	for (int64_t i = 0; i < n / QK_K; i++) {
		const uint8_t *q = x[i].qs;
		const int8_t *a8 = y[i].qs;
		int isum = 0, msum = 0;
		for (int c = 0; c < QK_K / 64; c++, q += 32, a8 += 64) {
			uint8_t sc1, m1, sc2, m2;
			k4_scale_min(2 * c, x[i].scales, &sc1, &m1);
			k4_scale_min(2 * c + 1, x[i].scales, &sc2, &m2);
			int s1 = 0, s2 = 0;
			for (int l = 0; l < 32; l++) {
				s1 += (q[l] & 0x0f) * a8[l];
				s2 += (q[l] >> 4) * a8[l + 32];
			}
			isum += sc1 * s1 + sc2 * s2;
			msum += m1 * (y[i].bsums[4 * c] + y[i].bsums[4 * c + 1]) +
				m2 * (y[i].bsums[4 * c + 2] + y[i].bsums[4 * c + 3]);
		}
		sum += (fp16(x[i].d) * y[i].d) * isum - (fp16(x[i].dmin) * y[i].d) * msum;
	}
	return sum;
}

/* ---------------------------------------------------------------- q5_k */

/* As q4_k; bit 4 of element l of 32-group g is bit g of qh[l]. */
static void dequant_q5_k(const void *src, float *dst, int64_t n)
{
	const struct nx_block_q5_k *b = src;
	for (int64_t i = 0; i < n / QK_K; i++) {
		const float d = fp16(b[i].d), dmin = fp16(b[i].dmin);
		const uint8_t *q = b[i].qs, *qh = b[i].qh;
		for (int c = 0; c < QK_K / 64; c++, q += 32) {
			uint8_t sc, m;
			k4_scale_min(2 * c, b[i].scales, &sc, &m);
			const float d1 = d * sc, m1 = dmin * m;
			k4_scale_min(2 * c + 1, b[i].scales, &sc, &m);
			const float d2 = d * sc, m2 = dmin * m;
			for (int l = 0; l < 32; l++)
				*dst++ = d1 * ((q[l] & 0x0f) | (((qh[l] >> (2 * c)) & 1) << 4)) - m1;
			for (int l = 0; l < 32; l++)
				*dst++ = d2 * ((q[l] >> 4) | (((qh[l] >> (2 * c + 1)) & 1) << 4)) - m2;
		}
	}
}

static void quant_q5_k(const float *src, void *dst, int64_t n)
{
	struct nx_block_q5_k *b = dst;
	uint8_t L[QK_K];
	for (int64_t i = 0; i < n / QK_K; i++, src += QK_K) {
		quant_k_super(src, &b[i].d, &b[i].dmin, b[i].scales, L, 31, -0.5f, 0.1f, 15);
		uint8_t *q = b[i].qs;
		memset(b[i].qh, 0, sizeof(b[i].qh));
		for (int c = 0; c < QK_K / 64; c++, q += 32) {
			for (int l = 0; l < 32; l++) {
				const int l1 = L[64 * c + l], l2 = L[64 * c + l + 32];
				q[l] = (uint8_t)((l1 & 0x0f) | ((l2 & 0x0f) << 4));
				b[i].qh[l] |= (uint8_t)(((l1 >> 4) << (2 * c)) | ((l2 >> 4) << (2 * c + 1)));
			}
		}
	}
}

static float dot_q5_k(const void *w, const void *a, int64_t n)
{
	const struct nx_block_q5_k *x = w;
	const struct nx_block_q8_k *y = a;
	float sum = 0;
	for (int64_t i = 0; i < n / QK_K; i++) {
		const uint8_t *q = x[i].qs, *qh = x[i].qh;
		const int8_t *a8 = y[i].qs;
		int isum = 0, msum = 0;
		for (int c = 0; c < QK_K / 64; c++, q += 32, a8 += 64) {
			uint8_t sc1, m1, sc2, m2;
			k4_scale_min(2 * c, x[i].scales, &sc1, &m1);
			k4_scale_min(2 * c + 1, x[i].scales, &sc2, &m2);
			int s1 = 0, s2 = 0;
			for (int l = 0; l < 32; l++) {
				s1 += ((q[l] & 0x0f) | (((qh[l] >> (2 * c)) & 1) << 4)) * a8[l];
				s2 += ((q[l] >> 4) | (((qh[l] >> (2 * c + 1)) & 1) << 4)) * a8[l + 32];
			}
			isum += sc1 * s1 + sc2 * s2;
			msum += m1 * (y[i].bsums[4 * c] + y[i].bsums[4 * c + 1]) +
				m2 * (y[i].bsums[4 * c + 2] + y[i].bsums[4 * c + 3]);
		}
		sum += (fp16(x[i].d) * y[i].d) * isum - (fp16(x[i].dmin) * y[i].d) * msum;
	}
	return sum;
}

/* ---------------------------------------------------------------- q6_k */

/* Element e of a 128-half h (e = 32*k + l, k 0..3) has its low 4 bits in
 * ql[64h + l + 32*(k&1)] (low nibble for k<2, high for k>=2) and its high 2
 * bits at bits 2k..2k+1 of qh[32h + l]. Scale index: e / 16 over the block. */
static inline int q6_k_level(const struct nx_block_q6_k *b, int e)
{
	const int h = e / 128, k = (e % 128) / 32, l = e % 32;
	const uint8_t lo = b->ql[64 * h + l + 32 * (k & 1)];
	const int low = k < 2 ? (lo & 0x0f) : (lo >> 4);
	const int high = (b->qh[32 * h + l] >> (2 * k)) & 3;
	return (low | (high << 4)) - 32;
}

static void dequant_q6_k(const void *src, float *dst, int64_t n)
{
	const struct nx_block_q6_k *b = src;
	for (int64_t i = 0; i < n / QK_K; i++, dst += QK_K) {
		const float d = fp16(b[i].d);
		for (int e = 0; e < QK_K; e++)
			dst[e] = d * b[i].scales[e / 16] * q6_k_level(&b[i], e);
	}
}

static void quant_q6_k(const float *src, void *dst, int64_t n)
{
	struct nx_block_q6_k *b = dst;
	int8_t L[QK_K];
	float scales[QK_K / 16];
	for (int64_t i = 0; i < n / QK_K; i++, src += QK_K) {
		float max_scale = 0, max_abs_scale = 0;
		for (int g = 0; g < QK_K / 16; g++) {
			scales[g] = make_qx_quants(16, 32, src + 16 * g, L + 16 * g);
			if (fabsf(scales[g]) > max_abs_scale) {
				max_abs_scale = fabsf(scales[g]);
				max_scale = scales[g];
			}
		}
		memset(&b[i], 0, sizeof(b[i]));
		if (max_abs_scale < GROUP_MAX_EPS)
			continue; /* all zero: d = 0 */

		/* Scales are signed 8-bit; the largest-magnitude one maps to -128. */
		const float iscale = -128.f / max_scale;
		b[i].d = nx_f32_to_f16(1 / iscale);
		for (int g = 0; g < QK_K / 16; g++)
			b[i].scales[g] = (int8_t)MIN(127, nearest_int(iscale * scales[g]));

		for (int g = 0; g < QK_K / 16; g++) {
			const float d = fp16(b[i].d) * b[i].scales[g];
			if (!d)
				continue;
			for (int l = 0; l < 16; l++) {
				const int q = nearest_int(src[16 * g + l] / d);
				L[16 * g + l] = (int8_t)(MAX(-32, MIN(31, q)) + 32);
			}
		}

		for (int e = 0; e < QK_K; e++) {
			const int h = e / 128, k = (e % 128) / 32, l = e % 32;
			const int q = L[e];
			b[i].ql[64 * h + l + 32 * (k & 1)] |= (uint8_t)((q & 0x0f) << (k < 2 ? 0 : 4));
			b[i].qh[32 * h + l] |= (uint8_t)((q >> 4) << (2 * k));
		}
	}
}

static float dot_q6_k(const void *w, const void *a, int64_t n)
{
	const struct nx_block_q6_k *x = w;
	const struct nx_block_q8_k *y = a;
	float sum = 0;
	for (int64_t i = 0; i < n / QK_K; i++) {
		int isum = 0;
		for (int g = 0; g < QK_K / 16; g++) {
			int s = 0;
			for (int l = 0; l < 16; l++)
				s += q6_k_level(&x[i], 16 * g + l) * y[i].qs[16 * g + l];
			isum += x[i].scales[g] * s;
		}
		sum += (fp16(x[i].d) * y[i].d) * isum;
	}
	return sum;
}

/* ---------------------------------------------------------------- q2_k */

/* Element e (e = 128h + 32j + l) has its level at bits 2j..2j+1 of qs[32h + l];
 * its 16-group is e / 16. */
static inline int q2_k_level(const uint8_t *qs, int e)
{
	const int h = e / 128, j = (e % 128) / 32, l = e % 32;
	return (qs[32 * h + l] >> (2 * j)) & 3;
}

static void dequant_q2_k(const void *src, float *dst, int64_t n)
{
	const struct nx_block_q2_k *b = src;
	for (int64_t i = 0; i < n / QK_K; i++, dst += QK_K) {
		const float d = fp16(b[i].d), dmin = fp16(b[i].dmin);
		for (int g = 0; g < QK_K / 16; g++) {
			const float dl = d * (b[i].scales[g] & 0x0f), ml = dmin * (b[i].scales[g] >> 4);
			for (int l = 0; l < 16; l++)
				dst[16 * g + l] = dl * q2_k_level(b[i].qs, 16 * g + l) - ml;
		}
	}
}

/* Each 16-group fitted with make_qkx2_quants (levels 0..3, weights |x|, mean
 * absolute error); scales and mins quantized to 4 bits against the
 * super-block's d and dmin; then every value requantized against the rounded
 * scales (ggml's quantize_row_q2_K_ref, what llama-quantize writes without an
 * imatrix). */
static void quant_q2_k(const float *src, void *dst, int64_t n)
{
	struct nx_block_q2_k *b = dst;
	uint8_t L[QK_K], Laux[16];
	float weights[16], mins[QK_K / 16], scales[QK_K / 16];
	for (int64_t i = 0; i < n / QK_K; i++, src += QK_K) {
		float max_scale = 0, max_min = 0;
		for (int g = 0; g < QK_K / 16; g++) {
			for (int l = 0; l < 16; l++)
				weights[l] = fabsf(src[16 * g + l]);
			scales[g] = make_qkx2_quants(16, 3, src + 16 * g, weights, L + 16 * g, &mins[g], Laux, -0.5f,
						     0.1f, 15, true);
			if (scales[g] > max_scale)
				max_scale = scales[g];
			if (mins[g] > max_min)
				max_min = mins[g];
		}
		if (max_scale > 0) {
			const float iscale = 15.f / max_scale;
			for (int g = 0; g < QK_K / 16; g++)
				b[i].scales[g] = (uint8_t)nearest_int(iscale * scales[g]);
			b[i].d = nx_f32_to_f16(max_scale / 15.f);
		} else {
			memset(b[i].scales, 0, sizeof(b[i].scales));
			b[i].d = nx_f32_to_f16(0.f);
		}
		if (max_min > 0) {
			const float iscale = 15.f / max_min;
			for (int g = 0; g < QK_K / 16; g++)
				b[i].scales[g] |= (uint8_t)(nearest_int(iscale * mins[g]) << 4);
			b[i].dmin = nx_f32_to_f16(max_min / 15.f);
		} else {
			b[i].dmin = nx_f32_to_f16(0.f);
		}
		for (int g = 0; g < QK_K / 16; g++) {
			const float d = fp16(b[i].d) * (b[i].scales[g] & 0x0f);
			if (!d)
				continue; /* keep the fit's levels */
			const float dm = fp16(b[i].dmin) * (b[i].scales[g] >> 4);
			for (int l = 0; l < 16; l++) {
				const int q = nearest_int((src[16 * g + l] + dm) / d);
				L[16 * g + l] = (uint8_t)MAX(0, MIN(3, q));
			}
		}
		memset(b[i].qs, 0, sizeof(b[i].qs));
		for (int e = 0; e < QK_K; e++)
			b[i].qs[32 * (e / 128) + e % 32] |= (uint8_t)(L[e] << (2 * ((e % 128) / 32)));
	}
}

/* sum_g d*sc_g * (q . a)_g - dmin*m_g * (sum of a over group g), the sums from Q8_K's bsums. */
static float dot_q2_k(const void *w, const void *a, int64_t n)
{
	const struct nx_block_q2_k *x = w;
	const struct nx_block_q8_k *y = a;
	float sum = 0;
	for (int64_t i = 0; i < n / QK_K; i++) {
		int isum = 0, msum = 0;
		for (int g = 0; g < QK_K / 16; g++) {
			int s = 0;
			for (int l = 0; l < 16; l++)
				s += q2_k_level(x[i].qs, 16 * g + l) * y[i].qs[16 * g + l];
			isum += (x[i].scales[g] & 0x0f) * s;
			msum += (x[i].scales[g] >> 4) * y[i].bsums[g];
		}
		sum += (fp16(x[i].d) * y[i].d) * isum - (fp16(x[i].dmin) * y[i].d) * msum;
	}
	return sum;
}

/* ---------------------------------------------------------------- q3_k */

/* The 6-bit scale of 16-group g (0..63; the scale is that - 32): low 4 bits in
 * the nibbles of bytes 0..7 (g < 8 low, else high nibble of byte g - 8), high 2
 * bits at bits 2(g/4)..2(g/4)+1 of byte 8 + g%4. */
static inline int q3_k_scale(const uint8_t *sc, int g)
{
	const int lo = g < 8 ? sc[g] & 0x0f : sc[g - 8] >> 4;
	return lo | (((sc[8 + g % 4] >> (2 * (g / 4))) & 3) << 4);
}

/* Level -4..3 of element e: the q2_k bits, minus 4 where bit e/32 of hmask[e%32] is clear. */
static inline int q3_k_level(const struct nx_block_q3_k *b, int e)
{
	return q2_k_level(b->qs, e) - ((b->hmask[e % 32] >> (e / 32)) & 1 ? 0 : 4);
}

static void dequant_q3_k(const void *src, float *dst, int64_t n)
{
	const struct nx_block_q3_k *b = src;
	for (int64_t i = 0; i < n / QK_K; i++, dst += QK_K) {
		const float d = fp16(b[i].d);
		for (int g = 0; g < QK_K / 16; g++) {
			const float dl = d * (q3_k_scale(b[i].scales, g) - 32);
			for (int l = 0; l < 16; l++)
				dst[16 * g + l] = dl * q3_k_level(&b[i], 16 * g + l);
		}
	}
}

/* Fits x[0..n) ~ scale * L with L in -nmax..nmax-1 from the grid through the
 * largest-magnitude value, then up to 5 rounds of moving single levels where
 * that improves the x^2-weighted least-squares fit; returns the scale, stores
 * L + nmax (ggml's make_q3_quants with do_rmse). */
static float make_q3_quants(int n, int nmax, const float *x, int8_t *L)
{
	float max = 0, amax = 0;
	for (int i = 0; i < n; i++) {
		if (fabsf(x[i]) > amax) {
			amax = fabsf(x[i]);
			max = x[i];
		}
	}
	if (amax < GROUP_MAX_EPS) {
		memset(L, 0, (size_t)n);
		return 0.f;
	}
	const float iscale = -nmax / max;
	float sumlx = 0, suml2 = 0;
	for (int i = 0; i < n; i++) {
		const int l = MAX(-nmax, MIN(nmax - 1, nearest_int(iscale * x[i])));
		L[i] = (int8_t)l;
		const float w = x[i] * x[i];
		sumlx += w * x[i] * l;
		suml2 += w * l * l;
	}
	for (int itry = 0; itry < 5; itry++) {
		int n_changed = 0;
		for (int i = 0; i < n; i++) {
			const float w = x[i] * x[i];
			float slx = sumlx - w * x[i] * L[i];
			if (slx > 0) {
				float sl2 = suml2 - w * L[i] * L[i];
				const int new_l = MAX(-nmax, MIN(nmax - 1, nearest_int(x[i] * sl2 / slx)));
				if (new_l != L[i]) {
					slx += w * x[i] * new_l;
					sl2 += w * new_l * new_l;
					if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
						L[i] = (int8_t)new_l;
						sumlx = slx;
						suml2 = sl2;
						n_changed++;
					}
				}
			}
		}
		if (!n_changed)
			break;
	}
	for (int i = 0; i < n; i++)
		L[i] = (int8_t)(L[i] + nmax);
	return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

/* Each 16-group fitted with make_q3_quants; the signed scales quantized to 6
 * bits so that the largest-magnitude one is -32; every value requantized
 * against the rounded scales (ggml's quantize_row_q3_K_ref, what
 * llama-quantize writes without an imatrix). */
static void quant_q3_k(const float *src, void *dst, int64_t n)
{
	struct nx_block_q3_k *b = dst;
	int8_t L[QK_K];
	float scales[QK_K / 16];
	for (int64_t i = 0; i < n / QK_K; i++, src += QK_K) {
		float max_scale = 0, amax = 0;
		for (int g = 0; g < QK_K / 16; g++) {
			scales[g] = make_q3_quants(16, 4, src + 16 * g, L + 16 * g);
			if (fabsf(scales[g]) > amax) {
				amax = fabsf(scales[g]);
				max_scale = scales[g];
			}
		}
		memset(b[i].scales, 0, sizeof(b[i].scales));
		if (max_scale) {
			const float iscale = -32.f / max_scale;
			for (int g = 0; g < QK_K / 16; g++) {
				const int l = MAX(-32, MIN(31, (int8_t)nearest_int(iscale * scales[g]))) + 32;
				if (g < 8)
					b[i].scales[g] = (uint8_t)(l & 0x0f);
				else
					b[i].scales[g - 8] |= (uint8_t)((l & 0x0f) << 4);
				b[i].scales[8 + g % 4] |= (uint8_t)((l >> 4) << (2 * (g / 4)));
			}
			b[i].d = nx_f32_to_f16(1 / iscale);
		} else {
			b[i].d = nx_f32_to_f16(0.f);
		}
		for (int g = 0; g < QK_K / 16; g++) {
			const float d = fp16(b[i].d) * (q3_k_scale(b[i].scales, g) - 32);
			if (!d)
				continue;
			for (int l = 0; l < 16; l++) {
				const int q = nearest_int(src[16 * g + l] / d);
				L[16 * g + l] = (int8_t)(MAX(-4, MIN(3, q)) + 4);
			}
		}
		memset(b[i].hmask, 0, sizeof(b[i].hmask));
		memset(b[i].qs, 0, sizeof(b[i].qs));
		for (int e = 0; e < QK_K; e++) {
			const int q = L[e];
			if (q > 3)
				b[i].hmask[e % 32] |= (uint8_t)(1 << (e / 32));
			b[i].qs[32 * (e / 128) + e % 32] |= (uint8_t)((q & 3) << (2 * ((e % 128) / 32)));
		}
	}
}

static float dot_q3_k(const void *w, const void *a, int64_t n)
{
	const struct nx_block_q3_k *x = w;
	const struct nx_block_q8_k *y = a;
	float sum = 0;
	for (int64_t i = 0; i < n / QK_K; i++) {
		int isum = 0;
		for (int g = 0; g < QK_K / 16; g++) {
			int s = 0;
			for (int l = 0; l < 16; l++)
				s += q3_k_level(&x[i], 16 * g + l) * y[i].qs[16 * g + l];
			isum += (q3_k_scale(x[i].scales, g) - 32) * s;
		}
		sum += (fp16(x[i].d) * y[i].d) * isum;
	}
	return sum;
}

/* ---------------------------------------------------------------- iq4_nl, iq4_xs */

const int8_t nx_kvalues_iq4nl[16] = { -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113 };

/* Index of the grid level nearest x; a tie goes to the upper one (ggml's best_index_int8). */
static int iq4_nearest(float x)
{
	const int8_t *v = nx_kvalues_iq4nl;
	if (x <= v[0])
		return 0;
	if (x >= v[15])
		return 15;
	int ml = 0, mu = 15;
	while (mu - ml > 1) {
		const int mid = (ml + mu) / 2;
		if (x < v[mid])
			mu = mid;
		else
			ml = mid;
	}
	return x - v[mu - 1] < v[mu] - x ? mu - 1 : mu;
}

/* Scale of one 32-group x ~ d * grid[L], weighting errors by x^2: starts from
 * the grid's -127 at the largest-magnitude value, then tries the 15 grids
 * through it at -120..-134, keeping the least-squares best. L gets the levels of
 * the first grid; the caller requantizes against the scale it stores. 0 for an
 * all-zero group, L left alone. (ggml's quantize_row_iq4_nl_impl, ntry 7, no
 * importance weights.) */
static float iq4_group_scale(const float *x, uint8_t *L)
{
	const int8_t *v = nx_kvalues_iq4nl;
	float weight[32], amax = 0, max = 0;
	for (int j = 0; j < 32; j++) {
		weight[j] = x[j] * x[j];
		if (fabsf(x[j]) > amax) {
			amax = fabsf(x[j]);
			max = x[j];
		}
	}
	if (amax < GROUP_MAX_EPS)
		return 0;
	float d = -max / v[0], id = 1 / d;
	float sumqx = 0, sumq2 = 0;
	for (int j = 0; j < 32; j++) {
		const int l = iq4_nearest(id * x[j]);
		L[j] = (uint8_t)l;
		const float q = v[l], w = weight[j];
		sumqx += w * q * x[j];
		sumq2 += w * q * q;
	}
	d = sumq2 > 0 ? sumqx / sumq2 : 0.f;
	float best = d * sumqx;
	for (int itry = -7; itry <= 7; itry++) {
		id = (itry + v[0]) / max;
		sumqx = sumq2 = 0;
		for (int j = 0; j < 32; j++) {
			const float q = v[iq4_nearest(id * x[j])], w = weight[j];
			sumqx += w * q * x[j];
			sumq2 += w * q * q;
		}
		if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
			d = sumqx / sumq2;
			best = d * sumqx;
		}
	}
	return d;
}

/* Low nibbles elements 0..15 of each 32, high nibbles 16..31. */
static void iq4_pack(const uint8_t L[32], uint8_t qs[16])
{
	for (int j = 0; j < 16; j++)
		qs[j] = (uint8_t)(L[j] | (L[16 + j] << 4));
}

static void dequant_iq4_nl(const void *src, float *dst, int64_t n)
{
	const struct nx_block_iq4_nl *b = src;
	for (int64_t i = 0; i < n / QK4_NL; i++, dst += QK4_NL) {
		const float d = fp16(b[i].d);
		for (int j = 0; j < QK4_NL / 2; j++) {
			dst[j] = d * nx_kvalues_iq4nl[b[i].qs[j] & 0x0f];
			dst[j + QK4_NL / 2] = d * nx_kvalues_iq4nl[b[i].qs[j] >> 4];
		}
	}
}

/* As ggml's quantize_iq4_nl without an imatrix (what llama-quantize writes):
 * the searched scale, then every value requantized against it. ggml's
 * quantize_row_iq4_nl_ref skips the search (ntry -1); its blocks differ. */
static void quant_iq4_nl(const float *src, void *dst, int64_t n)
{
	struct nx_block_iq4_nl *b = dst;
	uint8_t L[QK4_NL];
	for (int64_t i = 0; i < n / QK4_NL; i++, src += QK4_NL) {
		const float d = iq4_group_scale(src, L);
		b[i].d = nx_f32_to_f16(d);
		const float id = d ? 1 / d : 0;
		for (int j = 0; j < QK4_NL; j++)
			L[j] = (uint8_t)iq4_nearest(id * src[j]);
		iq4_pack(L, b[i].qs);
	}
}

static float dot_iq4_nl(const void *w, const void *a, int64_t n)
{
	const struct nx_block_iq4_nl *x = w;
	const struct nx_block_q8_0 *y = a;
	float sum = 0;
	for (int64_t i = 0; i < n / QK4_NL; i++) {
		int isum = 0;
		for (int j = 0; j < QK4_NL / 2; j++) {
			isum += nx_kvalues_iq4nl[x[i].qs[j] & 0x0f] * y[i].qs[j];
			isum += nx_kvalues_iq4nl[x[i].qs[j] >> 4] * y[i].qs[j + QK4_NL / 2];
		}
		sum += isum * (fp16(x[i].d) * fp16(y[i].d));
	}
	return sum;
}

/* The 6-bit scale of sub-block ib (0..63; the scale is that - 32). */
static inline int iq4_xs_scale(const struct nx_block_iq4_xs *b, int ib)
{
	return ((b->scales_l[ib / 2] >> (4 * (ib % 2))) & 0x0f) | (((b->scales_h >> (2 * ib)) & 3) << 4);
}

static void dequant_iq4_xs(const void *src, float *dst, int64_t n)
{
	const struct nx_block_iq4_xs *b = src;
	for (int64_t i = 0; i < n / QK_K; i++) {
		const float d = fp16(b[i].d);
		for (int ib = 0; ib < QK_K / 32; ib++, dst += 32) {
			const float dl = d * (iq4_xs_scale(&b[i], ib) - 32);
			const uint8_t *qs = b[i].qs + 16 * ib;
			for (int j = 0; j < 16; j++) {
				dst[j] = dl * nx_kvalues_iq4nl[qs[j] & 0x0f];
				dst[j + 16] = dl * nx_kvalues_iq4nl[qs[j] >> 4];
			}
		}
	}
}

/* Each 32-group's scale searched as iq4_nl's, then quantized to 6 bits against
 * d = -(largest-magnitude scale) / 32 (which the f16 d rounds), and every value
 * requantized against d * (ls - 32) in float (ggml's quantize_row_iq4_xs_ref). */
static void quant_iq4_xs(const float *src, void *dst, int64_t n)
{
	struct nx_block_iq4_xs *b = dst;
	uint8_t L[32];
	float scales[QK_K / 32];
	for (int64_t i = 0; i < n / QK_K; i++, src += QK_K) {
		float max_scale = 0, amax_scale = 0;
		for (int ib = 0; ib < QK_K / 32; ib++) {
			scales[ib] = iq4_group_scale(src + 32 * ib, L);
			if (fabsf(scales[ib]) > amax_scale) {
				amax_scale = fabsf(scales[ib]);
				max_scale = scales[ib];
			}
		}
		const float d = -max_scale / 32;
		b[i].d = nx_f32_to_f16(d);
		b[i].scales_h = 0;
		const float id = d ? 1 / d : 0.f;
		for (int ib = 0; ib < QK_K / 32; ib++) {
			const int l = MAX(-32, MIN(31, nearest_int(id * scales[ib])));
			const float dl = d * l, idl = dl ? 1 / dl : 0.f;
			for (int j = 0; j < 32; j++)
				L[j] = (uint8_t)iq4_nearest(idl * src[32 * ib + j]);
			iq4_pack(L, b[i].qs + 16 * ib);
			const int ls = l + 32;
			if (ib % 2 == 0)
				b[i].scales_l[ib / 2] = (uint8_t)(ls & 0x0f);
			else
				b[i].scales_l[ib / 2] |= (uint8_t)((ls & 0x0f) << 4);
			b[i].scales_h |= (uint16_t)((ls >> 4) << (2 * ib));
		}
	}
}

static float dot_iq4_xs(const void *w, const void *a, int64_t n)
{
	const struct nx_block_iq4_xs *x = w;
	const struct nx_block_q8_k *y = a;
	float sum = 0;
	for (int64_t i = 0; i < n / QK_K; i++) {
		int isum = 0;
		for (int ib = 0; ib < QK_K / 32; ib++) {
			const uint8_t *qs = x[i].qs + 16 * ib;
			const int8_t *a8 = y[i].qs + 32 * ib;
			int s = 0;
			for (int j = 0; j < 16; j++) {
				s += nx_kvalues_iq4nl[qs[j] & 0x0f] * a8[j];
				s += nx_kvalues_iq4nl[qs[j] >> 4] * a8[j + 16];
			}
			isum += (iq4_xs_scale(&x[i], ib) - 32) * s;
		}
		sum += (fp16(x[i].d) * y[i].d) * isum;
	}
	return sum;
}

/* ---------------------------------------------------------------- dot_rows */

/* The reference for nx_dot_rows_fn: a loop over the type's dot (bit-identical to it by construction). */
#define REF_DOT_ROWS(name)                                                                                 \
	static void dot_rows_##name(const void *w, const void *a, size_t a_stride, int n_act, float *out, \
				    int64_t n)                                                             \
	{                                                                                                  \
		for (int r = 0; r < n_act; r++)                                                            \
			out[r] = dot_##name(w, (const uint8_t *)a + (size_t)r * a_stride, n);              \
	}
REF_DOT_ROWS(f32)
REF_DOT_ROWS(f16)
REF_DOT_ROWS(bf16)
REF_DOT_ROWS(q4_0)
REF_DOT_ROWS(q4_1)
REF_DOT_ROWS(q5_0)
REF_DOT_ROWS(q5_1)
REF_DOT_ROWS(q8_0)
REF_DOT_ROWS(q4_k)
REF_DOT_ROWS(q5_k)
REF_DOT_ROWS(q6_k)
REF_DOT_ROWS(q2_k)
REF_DOT_ROWS(q3_k)
REF_DOT_ROWS(iq4_nl)
REF_DOT_ROWS(iq4_xs)

/* ---------------------------------------------------------------- the table */

/* Every id GGUF defines, so names and row sizes work for types we cannot
 * compute with (their kernels are NULL). Ids with no entry are unknown. */
static const struct nx_type_traits ref_traits[] = {
	[NX_F32] = { "f32", 1, 4, dequant_f32, quant_f32, NX_F32, dot_f32, dot_rows_f32 },
	[NX_F16] = { "f16", 1, 2, dequant_f16, quant_f16, NX_F32, dot_f16, dot_rows_f16 },
	[NX_Q4_0] = { "q4_0", QK4_0, sizeof(struct nx_block_q4_0), dequant_q4_0, quant_q4_0, NX_Q8_0, dot_q4_0, dot_rows_q4_0 },
	[NX_Q4_1] = { "q4_1", QK4_1, sizeof(struct nx_block_q4_1), dequant_q4_1, quant_q4_1, NX_Q8_0, dot_q4_1, dot_rows_q4_1 },
	[NX_Q5_0] = { "q5_0", QK5_0, sizeof(struct nx_block_q5_0), dequant_q5_0, quant_q5_0, NX_Q8_0, dot_q5_0, dot_rows_q5_0 },
	[NX_Q5_1] = { "q5_1", QK5_1, sizeof(struct nx_block_q5_1), dequant_q5_1, quant_q5_1, NX_Q8_0, dot_q5_1, dot_rows_q5_1 },
	[NX_Q8_0] = { "q8_0", QK8_0, sizeof(struct nx_block_q8_0), dequant_q8_0, quant_q8_0, NX_Q8_0, dot_q8_0, dot_rows_q8_0, quant2_q8_0 },
	[NX_Q8_1] = { "q8_1", 32, 36, NULL, NULL, NX_Q8_1, NULL },
	[NX_Q2_K] = { "q2_k", QK_K, sizeof(struct nx_block_q2_k), dequant_q2_k, quant_q2_k, NX_Q8_K, dot_q2_k, dot_rows_q2_k },
	[NX_Q3_K] = { "q3_k", QK_K, sizeof(struct nx_block_q3_k), dequant_q3_k, quant_q3_k, NX_Q8_K, dot_q3_k, dot_rows_q3_k },
	[NX_Q4_K] = { "q4_k", QK_K, sizeof(struct nx_block_q4_k), dequant_q4_k, quant_q4_k, NX_Q8_K, dot_q4_k, dot_rows_q4_k },
	[NX_Q5_K] = { "q5_k", QK_K, sizeof(struct nx_block_q5_k), dequant_q5_k, quant_q5_k, NX_Q8_K, dot_q5_k, dot_rows_q5_k },
	[NX_Q6_K] = { "q6_k", QK_K, sizeof(struct nx_block_q6_k), dequant_q6_k, quant_q6_k, NX_Q8_K, dot_q6_k, dot_rows_q6_k },
	/* Activation type only: no dot of its own, so not a supported weight type. */
	[NX_Q8_K] = { "q8_k", QK_K, sizeof(struct nx_block_q8_k), dequant_q8_k, quant_q8_k, NX_Q8_K, NULL, NULL, quant2_q8_k },
	[16] = { "iq2_xxs", QK_K, 66, NULL, NULL, NX_Q8_K, NULL },
	[17] = { "iq2_xs", QK_K, 74, NULL, NULL, NX_Q8_K, NULL },
	[18] = { "iq3_xxs", QK_K, 98, NULL, NULL, NX_Q8_K, NULL },
	[19] = { "iq1_s", QK_K, 50, NULL, NULL, NX_Q8_K, NULL },
	[NX_IQ4_NL] = { "iq4_nl", QK4_NL, sizeof(struct nx_block_iq4_nl), dequant_iq4_nl, quant_iq4_nl, NX_Q8_0, dot_iq4_nl, dot_rows_iq4_nl },
	[21] = { "iq3_s", QK_K, 110, NULL, NULL, NX_Q8_K, NULL },
	[22] = { "iq2_s", QK_K, 82, NULL, NULL, NX_Q8_K, NULL },
	[NX_IQ4_XS] = { "iq4_xs", QK_K, sizeof(struct nx_block_iq4_xs), dequant_iq4_xs, quant_iq4_xs, NX_Q8_K, dot_iq4_xs, dot_rows_iq4_xs },
	[24] = { "i8", 1, 1, NULL, NULL, NX_F32, NULL },
	[25] = { "i16", 1, 2, NULL, NULL, NX_F32, NULL },
	[26] = { "i32", 1, 4, NULL, NULL, NX_F32, NULL },
	[27] = { "i64", 1, 8, NULL, NULL, NX_F32, NULL },
	[28] = { "f64", 1, 8, NULL, NULL, NX_F32, NULL },
	[29] = { "iq1_m", QK_K, 56, NULL, NULL, NX_Q8_K, NULL },
	[NX_BF16] = { "bf16", 1, 2, dequant_bf16, quant_bf16, NX_F32, dot_bf16, dot_rows_bf16 },
	[34] = { "tq1_0", QK_K, 54, NULL, NULL, NX_Q8_K, NULL },
	[35] = { "tq2_0", QK_K, 66, NULL, NULL, NX_Q8_K, NULL },
	[39] = { "mxfp4", 32, 17, NULL, NULL, NX_Q8_0, NULL },
	[40] = { "nvfp4", 64, 36, NULL, NULL, NX_Q8_0, NULL },
	[41] = { "q1_0", 128, 18, NULL, NULL, NX_Q8_0, NULL },
};

#define N_TRAITS (sizeof(ref_traits) / sizeof(ref_traits[0]))

const struct nx_type_traits *nx_type_ref(enum nx_type t)
{
	if ((uint32_t)t >= N_TRAITS || !ref_traits[t].name)
		return NULL;
	return &ref_traits[t];
}

const char *nx_type_name(uint32_t t)
{
	if (t >= N_TRAITS || !ref_traits[t].name)
		return "?";
	return ref_traits[t].name;
}

bool nx_type_supported(uint32_t t)
{
	const struct nx_type_traits *tr = nx_type_ref((enum nx_type)t);
	return tr && tr->dequant && tr->dot;
}

int64_t nx_row_size(enum nx_type t, int64_t n)
{
	const struct nx_type_traits *tr = nx_type_ref(t);
	if (!tr || n < 0 || n % tr->blck)
		return -1;
	int64_t bytes;
	if (__builtin_mul_overflow(n / tr->blck, (int64_t)tr->type_size, &bytes))
		return -1;
	return bytes;
}
