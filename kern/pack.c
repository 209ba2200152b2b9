/* pack.c - packed layouts (kern/pack.h): packing, unpacking, activation side values, the reference kernels and the choice of kernel. */
#include "kern/pack.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* The AVX-512 kernels (kern/pack_avx512.c). */
bool nx_pack_avx512_usable(void);
nx_pack_fn nx_pack_avx512_kernel(enum nx_type t);

bool nx_pack_layout(enum nx_type t)
{
	return t == NX_Q4_1 || t == NX_Q8_0;
}

/* Bytes of one block of a group (16 blocks of the plain type). */
static size_t group_block(enum nx_type t)
{
	return t == NX_Q4_1 ? 16 * sizeof(struct nx_block_q4_1) : 16 * sizeof(struct nx_block_q8_0);
}

void nx_pack_group(enum nx_type t, const void *rows, size_t row_bytes, void *dst, int64_t n_in)
{
	const int64_t nb = n_in / 32;
	const size_t gb = group_block(t);
	for (int64_t b = 0; b < nb; b++) {
		uint8_t *o = (uint8_t *)dst + (size_t)b * gb;
		for (int r = 0; r < NX_PACK_ROWS; r++) {
			const uint8_t *row = (const uint8_t *)rows + (size_t)r * row_bytes;
			if (t == NX_Q4_1) {
				const struct nx_block_q4_1 *x = (const struct nx_block_q4_1 *)row + b;
				memcpy(o + 2 * r, &x->d, 2);
				memcpy(o + 32 + 2 * r, &x->m, 2);
				for (int c = 0; c < 4; c++)
					memcpy(o + 64 + 64 * c + 4 * r, x->qs + 4 * c, 4);
			} else {
				const struct nx_block_q8_0 *x = (const struct nx_block_q8_0 *)row + b;
				memcpy(o + 2 * r, &x->d, 2);
				for (int c = 0; c < 8; c++)
					for (int k = 0; k < 4; k++)
						o[32 + 64 * c + 4 * r + k] = (uint8_t)x->qs[4 * c + k] ^ 0x80;
			}
		}
	}
}

void nx_unpack_row(enum nx_type t, const void *group, int r, void *dst, int64_t n_in)
{
	const int64_t nb = n_in / 32;
	const size_t gb = group_block(t);
	for (int64_t b = 0; b < nb; b++) {
		const uint8_t *o = (const uint8_t *)group + (size_t)b * gb;
		if (t == NX_Q4_1) {
			struct nx_block_q4_1 *x = (struct nx_block_q4_1 *)dst + b;
			memcpy(&x->d, o + 2 * r, 2);
			memcpy(&x->m, o + 32 + 2 * r, 2);
			for (int c = 0; c < 4; c++)
				memcpy(x->qs + 4 * c, o + 64 + 64 * c + 4 * r, 4);
		} else {
			struct nx_block_q8_0 *x = (struct nx_block_q8_0 *)dst + b;
			memcpy(&x->d, o + 2 * r, 2);
			for (int c = 0; c < 8; c++)
				for (int k = 0; k < 4; k++)
					x->qs[4 * c + k] = (int8_t)(o[32 + 64 * c + 4 * r + k] ^ 0x80);
		}
	}
}

void nx_pack_act_prep(const void *q8_0_row, int64_t n_in, float *d, float *s, int32_t *c)
{
	const struct nx_block_q8_0 *y = q8_0_row;
	for (int64_t b = 0; b < n_in / 32; b++) {
		int32_t sum = 0;
		for (int k = 0; k < 32; k++)
			sum += y[b].qs[k];
		d[b] = nx_f16_to_f32(y[b].d);
		s[b] = d[b] * (float)sum;
		c[b] = 128 * sum;
	}
}

/* ---------------------------------------------------------------- reference kernels
 * Per (row, activation row) and block b, with isum the exact integer block dot:
 *   q4_1: acc_d = fma(d_w, (float)isum * d_a, acc_d); acc_m = fma(m_w, s_a, acc_m)
 *   q8_0: acc_d = fma(d_w, (float)(isum_u - c_a) * d_a, acc_d), isum_u against q + 128
 * and the result is acc_d + acc_m (q8_0: acc_d). The SIMD kernels do exactly this per lane. */

static void ref_q4_1(const void *group, const struct nx_pack_act *a, int n_act, float *out, int64_t n_in)
{
	const int64_t nb = n_in / 32;
	for (int i = 0; i < n_act; i++) {
		const struct nx_block_q8_0 *y = (const struct nx_block_q8_0 *)(a->q + (size_t)i * a->stride);
		for (int r = 0; r < NX_PACK_ROWS; r++) {
			float acc_d = 0, acc_m = 0;
			for (int64_t b = 0; b < nb; b++) {
				const uint8_t *o = (const uint8_t *)group + (size_t)b * 320;
				nx_f16 dh, mh;
				memcpy(&dh, o + 2 * r, 2);
				memcpy(&mh, o + 32 + 2 * r, 2);
				int32_t isum = 0;
				for (int c = 0; c < 4; c++)
					for (int k = 0; k < 4; k++) {
						const uint8_t v = o[64 + 64 * c + 4 * r + k];
						isum += (v & 15) * y[b].qs[4 * c + k] + (v >> 4) * y[b].qs[16 + 4 * c + k];
					}
				acc_d = fmaf(nx_f16_to_f32(dh), (float)isum * a->d[i * nb + b], acc_d);
				acc_m = fmaf(nx_f16_to_f32(mh), a->s[i * nb + b], acc_m);
			}
			out[i * NX_PACK_ROWS + r] = acc_d + acc_m;
		}
	}
}

static void ref_q8_0(const void *group, const struct nx_pack_act *a, int n_act, float *out, int64_t n_in)
{
	const int64_t nb = n_in / 32;
	for (int i = 0; i < n_act; i++) {
		const struct nx_block_q8_0 *y = (const struct nx_block_q8_0 *)(a->q + (size_t)i * a->stride);
		for (int r = 0; r < NX_PACK_ROWS; r++) {
			float acc = 0;
			for (int64_t b = 0; b < nb; b++) {
				const uint8_t *o = (const uint8_t *)group + (size_t)b * 544;
				nx_f16 dh;
				memcpy(&dh, o + 2 * r, 2);
				int32_t isum = 0;
				for (int c = 0; c < 8; c++)
					for (int k = 0; k < 4; k++)
						isum += o[32 + 64 * c + 4 * r + k] * y[b].qs[4 * c + k];
				acc = fmaf(nx_f16_to_f32(dh), (float)(isum - a->c[i * nb + b]) * a->d[i * nb + b], acc);
			}
			out[i * NX_PACK_ROWS + r] = acc;
		}
	}
}

nx_pack_fn nx_pack_kernel_ref(enum nx_type t)
{
	return t == NX_Q4_1 ? ref_q4_1 : t == NX_Q8_0 ? ref_q8_0 : NULL;
}

/* ---------------------------------------------------------------- the choice */

/* 0: not yet known, 1: no, 2: yes; computed on first use without locks (the
 * answer is the same for every caller): pthread_once would end with a private
 * futex wake, which the worker sandbox does not allow. */
static _Atomic int use_simd;

bool nx_pack_fast(enum nx_type t)
{
	if (!use_simd) {
		const char *k = getenv("NX_KERN");
		/* NX_KERN names the strongest kernel set to use (kern/quant_dispatch.c). */
		use_simd = nx_pack_avx512_usable() && !(k && (!strcmp(k, "ref") || !strcmp(k, "avx2"))) ? 2 : 1;
	}
	return use_simd == 2 && nx_pack_layout(t) && nx_pack_avx512_kernel(t);
}

nx_pack_fn nx_pack_kernel(enum nx_type t)
{
	if (nx_pack_fast(t))
		return nx_pack_avx512_kernel(t);
	return nx_pack_kernel_ref(t);
}
