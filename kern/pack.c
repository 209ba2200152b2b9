/* pack.c - packed layouts (kern/pack.h): packing, unpacking, activation side values, the reference kernels and the choice of kernel. */
#include "kern/pack.h"

#include "common/env.h"
#include "common/splitmix.h"
#include "kern/cpu.h"
#include "kern/pack_k.h"

#include <math.h>
#include <stdatomic.h>
#include <string.h>

/* The AVX-512 kernels (kern/pack_avx512.c). */
nx_pack_fn nx_pack_avx512_kernel(enum nx_type t);
nx_pack_epi_fn nx_pack_avx512_epilogue(void);

bool nx_pack_layout(enum nx_type t)
{
	if (nx_pack_k_type(t)) return true;
	return t == NX_Q4_0 || t == NX_Q4_1 || t == NX_Q5_0 || t == NX_Q5_1 || t == NX_Q8_0 || t == NX_IQ4_NL;
}

bool nx_pack_needs_c16(enum nx_type t)
{
	return t == NX_Q6_K || t == NX_Q2_K || t == NX_Q3_K;
}

/* Bytes of one block of a group (16 blocks of the plain type). */
static size_t group_block(enum nx_type t)
{
	return NX_PACK_ROWS * nx_type_ref(t)->type_size;
}

/* Offsets in a group block of the 4-bit types: scales d, mins m, fifth-bit masks h, nibble vectors qs. */
struct nib_layout {
	int d, m, h, qs;
};

static struct nib_layout nib_layout(enum nx_type t)
{
	switch (t) {
	case NX_Q4_0:
	case NX_IQ4_NL: return (struct nib_layout){0, -1, -1, 32};
	case NX_Q4_1: return (struct nib_layout){0, 32, -1, 64};
	case NX_Q5_0: return (struct nib_layout){0, -1, 32, 96};
	default: return (struct nib_layout){0, 32, 64, 128}; /* q5_1 */
	}
}

/* Plain block x (any of the 4-bit types) into lane r of group block o. */
static void pack_nib_block(enum nx_type t, const uint8_t *x, int r, uint8_t *o)
{
	const struct nib_layout L = nib_layout(t);
	const uint8_t *qs, *qh = NULL;
	switch (t) {
	case NX_Q4_0: qs = ((const struct nx_block_q4_0 *)x)->qs; break;
	case NX_IQ4_NL: qs = ((const struct nx_block_iq4_nl *)x)->qs; break;
	case NX_Q4_1: qs = ((const struct nx_block_q4_1 *)x)->qs; break;
	case NX_Q5_0: qs = ((const struct nx_block_q5_0 *)x)->qs, qh = ((const struct nx_block_q5_0 *)x)->qh; break;
	default: qs = ((const struct nx_block_q5_1 *)x)->qs, qh = ((const struct nx_block_q5_1 *)x)->qh; break;
	}
	memcpy(o + L.d + 2 * r, x, 2); /* d leads every block */
	if (L.m >= 0)
		memcpy(o + L.m + 2 * r, x + 2, 2); /* m follows it */
	for (int c = 0; c < 4; c++)
		memcpy(o + L.qs + 64 * c + 4 * r, qs + 4 * c, 4);
	for (int j = 0; qh && j < 8; j++) { /* nibble j of qh to bits 4r..4r+3 of mask j */
		uint8_t *h = o + L.h + 8 * j + r / 2;
		const int sh = 4 * (r % 2);
		*h = (uint8_t)((*h & ~(15 << sh)) | ((qh[j / 2] >> (4 * (j % 2)) & 15) << sh));
	}
}

static void unpack_nib_block(enum nx_type t, const uint8_t *o, int r, uint8_t *x)
{
	const struct nib_layout L = nib_layout(t);
	uint8_t *qs, *qh = NULL;
	switch (t) {
	case NX_Q4_0: qs = ((struct nx_block_q4_0 *)x)->qs; break;
	case NX_IQ4_NL: qs = ((struct nx_block_iq4_nl *)x)->qs; break;
	case NX_Q4_1: qs = ((struct nx_block_q4_1 *)x)->qs; break;
	case NX_Q5_0: qs = ((struct nx_block_q5_0 *)x)->qs, qh = ((struct nx_block_q5_0 *)x)->qh; break;
	default: qs = ((struct nx_block_q5_1 *)x)->qs, qh = ((struct nx_block_q5_1 *)x)->qh; break;
	}
	memcpy(x, o + L.d + 2 * r, 2);
	if (L.m >= 0)
		memcpy(x + 2, o + L.m + 2 * r, 2);
	for (int c = 0; c < 4; c++)
		memcpy(qs + 4 * c, o + L.qs + 64 * c + 4 * r, 4);
	if (qh)
		memset(qh, 0, 4);
	for (int j = 0; qh && j < 8; j++)
		qh[j / 2] |= (uint8_t)((o[L.h + 8 * j + r / 2] >> (4 * (r % 2)) & 15) << (4 * (j % 2)));
}

void nx_pack_group(enum nx_type t, const void *rows, size_t row_bytes, void *dst, int64_t n_in)
{
	if (nx_pack_k_type(t)) { nx_pack_k_group(t, rows, row_bytes, dst, n_in); return; }
	const int64_t nb = n_in / 32;
	const size_t gb = group_block(t);
	for (int64_t b = 0; b < nb; b++) {
		uint8_t *o = (uint8_t *)dst + (size_t)b * gb;
		for (int r = 0; r < NX_PACK_ROWS; r++) {
			const uint8_t *row = (const uint8_t *)rows + (size_t)r * row_bytes;
			if (t != NX_Q8_0) {
				pack_nib_block(t, row + (size_t)b * (gb / NX_PACK_ROWS), r, o);
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
	if (nx_pack_k_type(t)) { nx_unpack_k_row(t, group, r, dst, n_in); return; }
	const int64_t nb = n_in / 32;
	const size_t gb = group_block(t);
	for (int64_t b = 0; b < nb; b++) {
		const uint8_t *o = (const uint8_t *)group + (size_t)b * gb;
		if (t != NX_Q8_0) {
			unpack_nib_block(t, o, r, (uint8_t *)dst + (size_t)b * (gb / NX_PACK_ROWS));
		} else {
			struct nx_block_q8_0 *x = (struct nx_block_q8_0 *)dst + b;
			memcpy(&x->d, o + 2 * r, 2);
			for (int c = 0; c < 8; c++)
				for (int k = 0; k < 4; k++)
					x->qs[4 * c + k] = (int8_t)(o[32 + 64 * c + 4 * r + k] ^ 0x80);
		}
	}
}

void nx_pack_act_prep(const void *hi, const void *lo, int64_t n_in, float *d, float *s, int32_t *c)
{
	const struct nx_block_q8_0 *yh = hi, *yl = lo;
	for (int64_t b = 0; b < n_in / 32; b++) {
		int32_t sh = 0, sl = 0;
		for (int k = 0; k < 32; k++) {
			sh += yh[b].qs[k];
			sl += yl[b].qs[k];
		}
		/* hi's scale / 128: lo's exactly, or inf where hi's overflowed (the
		 * result is then not finite, as hi's dot would make it) */
		d[b] = nx_f16_to_f32(yh[b].d) / 128;
		s[b] = d[b] * (float)(128 * sh + sl);
		c[b] = 128 * (128 * sh + sl);
	}
}

/* ---------------------------------------------------------------- reference kernels
 * Per (row, token) and block b, with ih, il the exact integer block dots of the
 * weight codes with the token's hi and lo blocks and isum = 128 * ih + il:
 *   q4_1: acc_d = fma(d_w, (float)isum * d_a, acc_d); acc_m = fma(m_w, s_a, acc_m)
 *   q8_0: acc_d = fma(d_w, (float)(isum - c_a) * d_a, acc_d), codes q + 128
 *   q5_1: as q4_1, codes 0..31
 *   q4_0: acc_d = fma(d_w, (float)(isum - c_a / 16) * d_a, acc_d), codes 0..15
 *   q5_0: acc_d = fma(d_w, (float)(isum - c_a / 8) * d_a, acc_d), codes 0..31
 *   iq4_nl: as q8_0, codes grid[nibble] + 128 (1..241)
 * (c_a / 16 and c_a / 8 are 8 and 16 times the parts' 128 * Sh + Sl: the
 * offsets, exactly) and the result is acc_d + acc_m (others: acc_d). The SIMD
 * kernels do exactly this per lane. */

/* Code of nibble v: the level itself, or iq4_nl's grid value + 128. */
static inline int nib_code(enum nx_type t, int v)
{
	return t == NX_IQ4_NL ? nx_kvalues_iq4nl[v] + 128 : v;
}

/* The 4-bit types: q4_0, q4_1, q5_0, q5_1, iq4_nl. */
static void ref_nib(enum nx_type t, const void *group, const struct nx_pack_act *a, int n_act, float *out, int64_t n_in)
{
	const int64_t nb = n_in / 32;
	const size_t gb = group_block(t);
	const struct nib_layout L = nib_layout(t);
	/* offset = c_a / 2^shift, -1: none */
	const int off_shift = t == NX_Q4_0 ? 4 : t == NX_Q5_0 ? 3 : t == NX_IQ4_NL ? 0 : -1;
	for (int i = 0; i < n_act; i++)
		for (int r = 0; r < NX_PACK_ROWS; r++) {
			float acc_d = 0, acc_m = 0;
			for (int64_t b = 0; b < nb; b++) {
				const uint8_t *o = (const uint8_t *)group + (size_t)b * gb;
				nx_f16 dh, mh;
				memcpy(&dh, o + L.d + 2 * r, 2);
				int32_t ip[2] = {0, 0};
				for (int part = 0; part < 2; part++) {
					const int8_t *y = nx_pack_act_qs(a, i, part, b);
					for (int c = 0; c < 4; c++)
						for (int k = 0; k < 4; k++) {
							const uint8_t v = o[L.qs + 64 * c + 4 * r + k];
							const int bit = 4 * r + k; /* of masks c (low nibbles) and 4 + c (high) */
							const int h_lo = L.h < 0 ? 0 : o[L.h + 8 * c + bit / 8] >> (bit % 8) & 1;
							const int h_hi = L.h < 0 ? 0 : o[L.h + 8 * (4 + c) + bit / 8] >> (bit % 8) & 1;
							ip[part] += nib_code(t, (v & 15) | h_lo << 4) * y[4 * c + k] +
								    nib_code(t, (v >> 4) | h_hi << 4) * y[16 + 4 * c + k];
						}
				}
				int32_t isum = 128 * ip[0] + ip[1];
				if (off_shift >= 0)
					isum -= a->c[i * nb + b] / (1 << off_shift);
				acc_d = fmaf(nx_f16_to_f32(dh), (float)isum * a->d[i * nb + b], acc_d);
				if (L.m >= 0) {
					memcpy(&mh, o + L.m + 2 * r, 2);
					acc_m = fmaf(nx_f16_to_f32(mh), a->s[i * nb + b], acc_m);
				}
			}
			out[i * NX_PACK_ROWS + r] = L.m >= 0 ? acc_d + acc_m : acc_d;
		}
}

#define REF_NIB(name, T)                                                                                  \
	static void ref_##name(const void *g, const struct nx_pack_act *a, int n_act, float *out, int64_t n) \
	{                                                                                                 \
		ref_nib(T, g, a, n_act, out, n);                                                          \
	}
REF_NIB(q4_0, NX_Q4_0)
REF_NIB(q4_1, NX_Q4_1)
REF_NIB(q5_0, NX_Q5_0)
REF_NIB(q5_1, NX_Q5_1)
REF_NIB(iq4_nl, NX_IQ4_NL)

static void ref_q8_0(const void *group, const struct nx_pack_act *a, int n_act, float *out, int64_t n_in)
{
	const int64_t nb = n_in / 32;
	for (int i = 0; i < n_act; i++)
		for (int r = 0; r < NX_PACK_ROWS; r++) {
			float acc = 0;
			for (int64_t b = 0; b < nb; b++) {
				const uint8_t *o = (const uint8_t *)group + (size_t)b * 544;
				nx_f16 dh;
				memcpy(&dh, o + 2 * r, 2);
				int32_t ip[2] = {0, 0};
				for (int part = 0; part < 2; part++) {
					const int8_t *y = nx_pack_act_qs(a, i, part, b);
					for (int c = 0; c < 8; c++)
						for (int k = 0; k < 4; k++)
							ip[part] += o[32 + 64 * c + 4 * r + k] * y[4 * c + k];
				}
				const int32_t isum = 128 * ip[0] + ip[1] - a->c[i * nb + b];
				acc = fmaf(nx_f16_to_f32(dh), (float)isum * a->d[i * nb + b], acc);
			}
			out[i * NX_PACK_ROWS + r] = acc;
		}
}

nx_pack_fn nx_pack_kernel_ref(enum nx_type t)
{
	if (nx_pack_k_type(t)) return nx_pack_k_kernel_ref(t);
	switch (t) {
	case NX_Q4_0: return ref_q4_0;
	case NX_Q4_1: return ref_q4_1;
	case NX_Q5_0: return ref_q5_0;
	case NX_Q5_1: return ref_q5_1;
	case NX_Q8_0: return ref_q8_0;
	case NX_IQ4_NL: return ref_iq4_nl;
	default: return NULL;
	}
}

static void epi_ref(enum nx_pack_op op, float *const *y, const float *out, const float *bias, int n_act)
{
	for (int i = 0; i < n_act; i++) {
		float *restrict yi = y[i];
		const float *restrict d = out + i * NX_PACK_ROWS;
		for (int k = 0; k < NX_PACK_ROWS; k++)
			switch (op) {
			case NX_PACK_STORE: yi[k] = bias ? d[k] + bias[k] : d[k]; break;
			case NX_PACK_ADD: yi[k] += d[k]; break;
			case NX_PACK_SWIGLU: yi[k] = yi[k] / (1.0f + expf(-yi[k])) * d[k]; break;
			}
	}
}

nx_pack_epi_fn nx_pack_epilogue_ref(void)
{
	return epi_ref;
}

/* ---------------------------------------------------------------- the choice */

/* 0: not yet known, 1: no, 2: yes; computed on first use without locks (the
 * answer is the same for every caller): pthread_once would end with a private
 * futex wake, which the worker sandbox does not allow. */
static _Atomic int use_simd;

bool nx_pack_fast(enum nx_type t)
{
	if (!use_simd)
		use_simd = nx_kern_set(NX_KFAM_PACK) >= NX_KSET_AVX512 ? 2 : 1; /* amx: the AVX-512 kernels too */
	return use_simd == 2 && nx_pack_layout(t) && (nx_pack_k_type(t) ? nx_pack_k_avx512_kernel(t) : nx_pack_avx512_kernel(t));
}

nx_pack_epi_fn nx_pack_epilogue(void)
{
	return nx_pack_fast(NX_Q8_0) ? nx_pack_avx512_epilogue() : epi_ref;
}

/* Set by a failed nx_pack_amx_check: no AMX kernel is offered. */
static _Atomic bool amx_off;

nx_pack_fn nx_pack_kernel_amx(enum nx_type t)
{
	if (atomic_load_explicit(&amx_off, memory_order_relaxed))
		return NULL;
	const enum nx_kset k = nx_kern_set(NX_KFAM_PACK);
	if (k == NX_KSET_AMX)
		return nx_pack_amx_kernel(t, false);
	return k == NX_KSET_AVX512 && nx_env()->test_amx_emulate ? nx_pack_amx_kernel(t, true) : NULL;
}

nx_pack_fn nx_pack_kernel(enum nx_type t)
{
	if (nx_pack_fast(t))
		return nx_pack_k_type(t) ? nx_pack_k_avx512_kernel(t) : nx_pack_avx512_kernel(t);
	return nx_pack_kernel_ref(t);
}

const char *nx_pack_kernels_name(void)
{
	const enum nx_kset k = nx_kern_set(NX_KFAM_PACK);
	if (nx_pack_kernel_amx(NX_Q8_0))
		return k == NX_KSET_AMX ? "amx" : "amx-emulated";
	return nx_kset_name(k == NX_KSET_AMX ? NX_KSET_AVX512 : k);
}

/* One group of 16 rows of 256 elements against 16 tokens, through the engine's
 * AMX kernel in one call and its AVX-512 kernel in calls of NX_PACK_ACT_MAX. Its
 * buffers are static: it runs once, at start, before any other thread. */
#define CHECK_IN 256
#define CHECK_ROW 512 /* bytes: more than a row of CHECK_IN of any type (q8_0's 272 the most) */
static bool amx_agrees(enum nx_type t, nx_pack_fn amx, uint64_t *seed)
{
	const struct nx_type_traits *tr = nx_type_ref(t), *q8 = nx_type_ref(NX_Q8_0);
	const size_t rb = (size_t)nx_row_size(t, CHECK_IN), rs = (size_t)nx_row_size(NX_Q8_0, CHECK_IN);
	const int64_t nb = CHECK_IN / 32;
	enum { N = NX_PACK_AMX_MAX };
	static uint8_t plain[NX_PACK_ROWS * CHECK_ROW], group[NX_PACK_ROWS * CHECK_ROW], act[N * 2 * CHECK_ROW];
	static float x[CHECK_IN], d[N * CHECK_IN / 32], s[N * CHECK_IN / 32], got[N * NX_PACK_ROWS],
		want[N * NX_PACK_ROWS];
	static int32_t c[N * CHECK_IN / 32], c16[N * CHECK_IN / 16];
	for (int r = 0; r < NX_PACK_ROWS; r++) {
		for (int k = 0; k < CHECK_IN; k++)
			x[k] = (float)((int64_t)(nx_splitmix64(seed) >> 40) - (1 << 23)) / (1 << 28);
		tr->quant(x, plain + r * rb, CHECK_IN);
	}
	nx_pack_group(t, plain, rb, group, CHECK_IN);
	for (int i = 0; i < N; i++) {
		uint8_t *hi = act + (size_t)i * 2 * rs;
		for (int k = 0; k < CHECK_IN; k++)
			x[k] = (float)((int64_t)(nx_splitmix64(seed) >> 40) - (1 << 23)) / (1 << 23);
		q8->quant2(x, hi, hi + rs, CHECK_IN);
		nx_pack_act_prep(hi, hi + rs, CHECK_IN, d + i * nb, s + i * nb, c + i * nb);
		nx_pack_act_prep_c16(hi, hi + rs, CHECK_IN, c16 + 2 * i * nb);
	}
	const struct nx_pack_act a = {act, 2 * rs, rs, d, s, c, nb, c16, false};
	amx(group, &a, N, got, CHECK_IN);
	for (int i0 = 0; i0 < N; i0 += NX_PACK_ACT_MAX) {
		const struct nx_pack_act ai = {act + (size_t)i0 * 2 * rs, 2 * rs, rs, d + i0 * nb, s + i0 * nb,
					       c + i0 * nb, nb, c16 + 2 * i0 * nb, false};
		nx_pack_kernel(t)(group, &ai, NX_PACK_ACT_MAX, want + i0 * NX_PACK_ROWS, CHECK_IN);
	}
	return !memcmp(got, want, sizeof(got));
}

int nx_pack_amx_check(struct nx_err *err)
{
	static const enum nx_type types[] = {NX_Q4_0, NX_Q4_1, NX_Q5_0, NX_Q5_1, NX_Q8_0,
					     NX_IQ4_NL, NX_Q4_K, NX_Q5_K, NX_Q6_K};
	uint64_t seed = 0x6a09e667f3bcc909ull;
	for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
		const nx_pack_fn amx = nx_pack_kernel_amx(types[i]);
		if (amx && nx_pack_fast(types[i]) && !amx_agrees(types[i], amx, &seed)) {
			atomic_store(&amx_off, true);
			return nx_errf(err, "the AMX kernel for %s disagrees with the AVX-512 one: the AMX kernels are off",
				       nx_type_name(types[i]));
		}
	}
	return 0;
}
