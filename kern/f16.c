/* f16.c - exact conversions between float and IEEE half / bfloat16 (round to nearest, ties to even). */
#include "kern/quant.h"

#include <string.h>

static inline uint32_t f32_bits(float f)
{
	uint32_t u;
	memcpy(&u, &f, sizeof(u));
	return u;
}

static inline float f32_from_bits(uint32_t u)
{
	float f;
	memcpy(&f, &u, sizeof(f));
	return f;
}

float nx_f16_to_f32(nx_f16 h)
{
	uint32_t sign = (uint32_t)(h & 0x8000) << 16;
	uint32_t exp = (h >> 10) & 0x1f;
	uint32_t mant = h & 0x3ff;

	if (exp == 0x1f) /* inf, or nan with its payload kept in the top mantissa bits */
		return f32_from_bits(sign | 0x7f800000 | (mant << 13));
	if (exp != 0)
		return f32_from_bits(sign | ((exp + 112) << 23) | (mant << 13));
	if (mant == 0)
		return f32_from_bits(sign);
	/* Subnormal half: mant * 2^-24, exact in float after normalizing. */
	exp = 113;
	while (!(mant & 0x400)) {
		mant <<= 1;
		exp--;
	}
	return f32_from_bits(sign | (exp << 23) | ((mant & 0x3ff) << 13));
}

nx_f16 nx_f32_to_f16(float f)
{
	uint32_t x = f32_bits(f);
	uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
	uint32_t a = x & 0x7fffffff;

	if (a > 0x7f800000) /* nan: quiet it, keep sign and the top payload bits (as F16C does) */
		return sign | 0x7e00 | (uint16_t)((a >> 13) & 0x3ff);
	/* 65520 is halfway between 65504 (max half, odd mantissa) and 65536: ties to even go to inf. */
	if (a >= 0x477ff000)
		return sign | 0x7c00;

	uint32_t e = a >> 23; /* biased float exponent */
	uint32_t h, rem, half;
	if (e >= 113) {
		/* Normal half: rebias the exponent, drop 13 mantissa bits. A carry out of
		 * the mantissa correctly bumps the exponent (and cannot reach inf here). */
		h = (a - (112u << 23)) >> 13;
		rem = a & 0x1fff;
		half = 0x1000;
	} else {
		/* Subnormal half (or zero): the result is round(value / 2^-24). Values
		 * at most 2^-25 (e <= 102) round to zero; at exactly 2^-25 the tie goes to even 0. */
		if (e < 102)
			return sign;
		uint32_t m = (a & 0x7fffff) | 0x800000; /* value = m * 2^(e-150) */
		uint32_t shift = 126 - e;               /* 14..24 */
		h = m >> shift;
		rem = m & ((1u << shift) - 1);
		half = 1u << (shift - 1);
	}
	if (rem > half || (rem == half && (h & 1)))
		h++;
	return sign | (uint16_t)h;
}

float nx_bf16_to_f32(nx_bf16 h)
{
	return f32_from_bits((uint32_t)h << 16);
}

nx_bf16 nx_f32_to_bf16(float f)
{
	uint32_t x = f32_bits(f);
	if ((x & 0x7fffffff) > 0x7f800000) /* nan: quiet it rather than let rounding turn it into inf */
		return (nx_bf16)((x >> 16) | 0x40);
	/* Rounding may carry into the exponent; a float above the largest bf16 becomes inf, as RNE says. */
	return (nx_bf16)((x + 0x7fff + ((x >> 16) & 1)) >> 16);
}
