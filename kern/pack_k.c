/* pack_k.c - the super-block types' packed layouts (kern/pack.h: q2_k, q3_k, q4_k, q5_k, q6_k, iq4_xs): packing, unpacking, the q6_k side values and the reference kernels.
 *
 * A group holds one super-block of 256 elements of its 16 rows after another,
 * each in the bytes of the 16 plain super-blocks. What the kernels would
 * otherwise decode per call is rearranged once here: q4_k/q5_k's 6-bit scales
 * and mins become one byte per (sub-block, row) - but 16 six-bit values do not
 * fit 16 bytes, so each scale byte carries the top 2 bits of its min and a
 * nibble array holds the mins' low 4 bits - and q6_k's int8 scales become one
 * 16-byte array per sub-block, ready for a widening load, and its 6-bit q,
 * split 4 + 2 bits over ql and qh in ggml, are stored whole: three of every
 * four in the low 6 bits of a byte, the fourth in the top 2 bits of those
 * three bytes. q2_k/q3_k's 2-bit levels, spread by ggml over the bytes of a
 * 128-element half (one bit pair per 32-block), come together per 32-block, as
 * do q3_k's third bits, so a block's 8 words are two or three vector loads and
 * shifts; q3_k's 6-bit scales, in ggml's 12-byte field, become per-block
 * nibble and bit-pair arrays (16 bytes of int8 per sub-block, as q6_k's, would
 * not fit the plain rows' bytes). */
#include "kern/pack_k.h"

#include <math.h>
#include <string.h>

bool nx_pack_k_type(enum nx_type t)
{
	return t == NX_Q4_K || t == NX_Q5_K || t == NX_Q6_K || t == NX_IQ4_XS || t == NX_Q2_K || t == NX_Q3_K;
}

/* ggml's 12-byte scale field of q4_k/q5_k (as kern/quant_ref.c: k4_scale_min):
 *   bytes 0..3:  scale j (low 6 bits) for j<4, top 2 bits of scale j+4
 *   bytes 4..7:  min j (low 6 bits) for j<4,   top 2 bits of min j+4
 *   bytes 8..11: low 4 bits of scale j+4 | low 4 bits of min j+4 << 4
 * Every bit is used, so decoding and encoding are inverse. */
static void k4_decode(const uint8_t q[K_SCALE_SIZE], uint8_t sc[8], uint8_t m[8])
{
	for (int j = 0; j < 4; j++) {
		sc[j] = q[j] & 63;
		m[j] = q[j + 4] & 63;
		sc[j + 4] = (uint8_t)((q[j + 8] & 15) | (q[j] >> 6) << 4);
		m[j + 4] = (uint8_t)((q[j + 8] >> 4) | (q[j + 4] >> 6) << 4);
	}
}

static void k4_encode(const uint8_t sc[8], const uint8_t m[8], uint8_t q[K_SCALE_SIZE])
{
	for (int j = 0; j < 4; j++) {
		q[j] = (uint8_t)(sc[j] | (sc[j + 4] >> 4) << 6);
		q[j + 4] = (uint8_t)(m[j] | (m[j + 4] >> 4) << 6);
		q[j + 8] = (uint8_t)((sc[j + 4] & 15) | (m[j + 4] & 15) << 4);
	}
}

/* Scale and min of sub-block j of row r from a q4_k/q5_k group header. */
static void k4_lane(const uint8_t *hdr, int j, int r, int *sc, int *m)
{
	const uint8_t s = hdr[PK_K4_SC + 16 * j + r], ml = hdr[PK_K4_MLO + 16 * (j / 2) + r];
	*sc = s & 63;
	*m = (j % 2 ? ml >> 4 : ml & 15) | (s >> 6) << 4;
}

/* ggml's q6_k element e (= 128h + 32k + l): low 4 bits in ql[64h + 32(k & 1) + l]
 * (low nibble for k < 2, high for k >= 2), high 2 bits at bit 2k of qh[32h + l]. */
static int q6_get(const struct nx_block_q6_k *b, int e)
{
	const int h = e / 128, k = e % 128 / 32, l = e % 32;
	return (b->ql[64 * h + 32 * (k & 1) + l] >> 4 * (k >> 1) & 15) | (b->qh[32 * h + l] >> 2 * k & 3) << 4;
}

/* Adds q to element e (ql, qh zeroed first). */
static void q6_set(struct nx_block_q6_k *b, int e, int q)
{
	const int h = e / 128, k = e % 128 / 32, l = e % 32;
	b->ql[64 * h + 32 * (k & 1) + l] |= (uint8_t)((q & 15) << 4 * (k >> 1));
	b->qh[32 * h + l] |= (uint8_t)((q >> 4) << 2 * k);
}

/* q (0..63) of element 4w + k of block blk, row r, in a packed q6_k super-block:
 * word w of the triple X, Y, Z (w % 4 = 0, 1, 2: their low 6 bits; 3: their top
 * 2 bits, X's the lowest). */
static int q6_lane(const uint8_t *o, int blk, int w, int r, int k)
{
	const uint8_t *v = o + PK_Q6_K_Q + 64 * (6 * blk + 3 * (w / 4)) + 4 * r + k;
	if (w % 4 < 3)
		return v[64 * (w % 4)] & 63;
	return v[0] >> 6 | (v[64] >> 6) << 2 | (v[128] >> 6) << 4;
}

/* ggml's q2_k/q3_k 2-bit level of element e (= 128h + 32j + l): bits 2j..2j+1 of qs[32h + l]. */
static int k2_get(const uint8_t *qs, int e)
{
	return qs[32 * (e / 128) + e % 32] >> 2 * (e % 128 / 32) & 3;
}

/* The byte of a packed q2_k/q3_k super-block o holding element e's level for
 * row r, and the level's shift in it: vector 2 * (e / 32) + half, lane r, byte
 * e % 4, bits 2s (word 4 * half + s of the block); q3: of a q3_k super-block. */
static size_t k2_byte(bool q3, int e, int r, int *shift)
{
	const int w = e % 32 / 4;
	*shift = 2 * (w % 4);
	return PK_K2_QS(q3) + 64 * (2 * (e / 32) + w / 4) + 4 * r + e % 4;
}

/* q3_k's third bit of element e: bit e / 32 of hmask[e % 32] in ggml; packed, bit
 * w (word of the block) of byte e % 4 of lane r of vector e / 32. */
static size_t k3_hbyte(int e, int r)
{
	return PK_Q3_K_HM + 64 * (e / 32) + 4 * r + e % 4;
}

/* ggml's 12-byte q3_k scale field (as kern/quant_ref.c: q3_k_scale): scale g's low
 * 4 bits in the low (g < 8) or high nibble of byte g % 8, its top 2 bits at bits
 * 2 (g / 4) of byte 8 + g % 4. Every bit is used: decoding and encoding are inverse. */
static void k3_decode(const uint8_t q[K_SCALE_SIZE], uint8_t sc[16])
{
	for (int g = 0; g < 16; g++)
		sc[g] = (uint8_t)((q[g % 8] >> 4 * (g / 8) & 15) | (q[8 + g % 4] >> 2 * (g / 4) & 3) << 4);
}

static void k3_encode(const uint8_t sc[16], uint8_t q[K_SCALE_SIZE])
{
	memset(q, 0, K_SCALE_SIZE);
	for (int g = 0; g < 16; g++) {
		q[g % 8] |= (uint8_t)((sc[g] & 15) << 4 * (g / 8));
		q[8 + g % 4] |= (uint8_t)((sc[g] >> 4) << 2 * (g / 4));
	}
}

/* Scale g (0..63; the scale is that - 32) of row r in a packed q3_k super-block:
 * low 4 bits in sl[g / 2] (nibble g % 2), top 2 in sh[g / 4] (bits 2 (g % 4)). */
static int k3_lane(const uint8_t *o, int g, int r)
{
	return (o[PK_Q3_K_SL + 16 * (g / 2) + r] >> 4 * (g % 2) & 15) | (o[PK_Q3_K_SH + 16 * (g / 4) + r] >> 2 * (g % 4) & 3) << 4;
}

static size_t sb_bytes(enum nx_type t)
{
	switch (t) {
	case NX_Q2_K: return PK_Q2_K_SB;
	case NX_Q3_K: return PK_Q3_K_SB;
	case NX_Q4_K: return PK_Q4_K_SB;
	case NX_Q5_K: return PK_Q5_K_SB;
	case NX_Q6_K: return PK_Q6_K_SB;
	default: return PK_IQ4_XS_SB;
	}
}

/* q2_k, q3_k: one plain super-block x of row r into group super-block o. */
static void pack_sb_k2(enum nx_type t, const uint8_t *x, int r, uint8_t *o)
{
	const struct nx_block_q2_k *b2 = (const struct nx_block_q2_k *)x;
	const struct nx_block_q3_k *b3 = (const struct nx_block_q3_k *)x;
	const uint8_t *qs = t == NX_Q2_K ? b2->qs : b3->qs;
	for (int e = 0; e < QK_K; e++) {
		int sh;
		uint8_t *v = o + k2_byte(t == NX_Q3_K, e, r, &sh);
		*v = (uint8_t)((*v & ~(3 << sh)) | k2_get(qs, e) << sh);
		if (t == NX_Q3_K) {
			uint8_t *h = o + k3_hbyte(e, r);
			const int w = e % 32 / 4;
			*h = (uint8_t)((*h & ~(1 << w)) | (b3->hmask[e % 32] >> (e / 32) & 1) << w);
		}
	}
	if (t == NX_Q2_K) {
		for (int g = 0; g < 16; g++)
			o[PK_Q2_K_SC + 16 * g + r] = b2->scales[g];
		memcpy(o + PK_Q2_K_D + 2 * r, &b2->d, 2);
		memcpy(o + PK_Q2_K_DMIN + 2 * r, &b2->dmin, 2);
		return;
	}
	uint8_t sc[16];
	k3_decode(b3->scales, sc);
	for (int j = 0; j < 8; j++)
		o[PK_Q3_K_SL + 16 * j + r] = (uint8_t)((sc[2 * j] & 15) | (sc[2 * j + 1] & 15) << 4);
	for (int c = 0; c < 4; c++)
		o[PK_Q3_K_SH + 16 * c + r] = (uint8_t)(sc[4 * c] >> 4 | (sc[4 * c + 1] >> 4) << 2 | (sc[4 * c + 2] >> 4) << 4 |
						       (sc[4 * c + 3] >> 4) << 6);
	memcpy(o + PK_Q3_K_D + 2 * r, &b3->d, 2);
}

static void unpack_sb_k2(enum nx_type t, const uint8_t *o, int r, uint8_t *x)
{
	struct nx_block_q2_k *b2 = (struct nx_block_q2_k *)x;
	struct nx_block_q3_k *b3 = (struct nx_block_q3_k *)x;
	uint8_t *qs = t == NX_Q2_K ? b2->qs : b3->qs;
	memset(qs, 0, QK_K / 4);
	if (t == NX_Q3_K)
		memset(b3->hmask, 0, sizeof(b3->hmask));
	for (int e = 0; e < QK_K; e++) {
		int sh;
		const int q = o[k2_byte(t == NX_Q3_K, e, r, &sh)] >> sh & 3;
		qs[32 * (e / 128) + e % 32] |= (uint8_t)(q << 2 * (e % 128 / 32));
		if (t == NX_Q3_K)
			b3->hmask[e % 32] |= (uint8_t)((o[k3_hbyte(e, r)] >> (e % 32 / 4) & 1) << (e / 32));
	}
	if (t == NX_Q2_K) {
		for (int g = 0; g < 16; g++)
			b2->scales[g] = o[PK_Q2_K_SC + 16 * g + r];
		memcpy(&b2->d, o + PK_Q2_K_D + 2 * r, 2);
		memcpy(&b2->dmin, o + PK_Q2_K_DMIN + 2 * r, 2);
		return;
	}
	uint8_t sc[16];
	for (int g = 0; g < 16; g++)
		sc[g] = (uint8_t)k3_lane(o, g, r);
	k3_encode(sc, b3->scales);
	memcpy(&b3->d, o + PK_Q3_K_D + 2 * r, 2);
}

/* One plain super-block x of row r into group super-block o. */
static void pack_sb(enum nx_type t, const uint8_t *x, int r, uint8_t *o)
{
	if (t == NX_Q2_K || t == NX_Q3_K) {
		pack_sb_k2(t, x, r, o);
		return;
	}
	if (t == NX_IQ4_XS) {
		const struct nx_block_iq4_xs *b = (const struct nx_block_iq4_xs *)x;
		for (int j = 0; j < 8; j++)
			for (int c = 0; c < 4; c++)
				memcpy(o + PK_XS_QS + 64 * (4 * j + c) + 4 * r, b->qs + 16 * j + 4 * c, 4);
		for (int c = 0; c < 4; c++)
			o[PK_XS_SL + 16 * c + r] = b->scales_l[c];
		memcpy(o + PK_XS_SH + 2 * r, &b->scales_h, 2);
		memcpy(o + PK_XS_D + 2 * r, &b->d, 2);
		return;
	}
	if (t == NX_Q6_K) {
		const struct nx_block_q6_k *b = (const struct nx_block_q6_k *)x;
		for (int e = 0; e < QK_K; e++) {
			const int q = q6_get(b, e), w = e % 32 / 4, m = w % 4, k = e % 4;
			uint8_t *v = o + PK_Q6_K_Q + 64 * (6 * (e / 32) + 3 * (w / 4)) + 4 * r + k; /* byte k of X */
			if (m < 3)
				v[64 * m] = (uint8_t)((v[64 * m] & 0xc0) | q);
			else
				for (int i = 0; i < 3; i++)
					v[64 * i] = (uint8_t)((v[64 * i] & 0x3f) | (q >> 2 * i & 3) << 6);
		}
		for (int g = 0; g < 16; g++)
			o[PK_Q6_K_SC + 16 * g + r] = (uint8_t)b->scales[g];
		memcpy(o + PK_Q6_K_D + 2 * r, &b->d, 2);
		return;
	}
	const bool q5 = t == NX_Q5_K;
	const struct nx_block_q4_k *b4 = (const struct nx_block_q4_k *)x;
	const struct nx_block_q5_k *b5 = (const struct nx_block_q5_k *)x;
	const uint8_t *qs = q5 ? b5->qs : b4->qs;
	for (int c = 0; c < 4; c++)
		for (int w = 0; w < 8; w++)
			memcpy(o + PK_K4_QS(q5) + 64 * (8 * c + w) + 4 * r, qs + 32 * c + 4 * w, 4);
	for (int w = 0; q5 && w < 8; w++)
		memcpy(o + PK_K5_QH + 64 * w + 4 * r, b5->qh + 4 * w, 4);
	uint8_t *hdr = o + PK_K4_HDR, sc[8], m[8];
	k4_decode(b4->scales, sc, m); /* d, dmin, scales: the same offsets in both */
	for (int j = 0; j < 8; j++)
		hdr[PK_K4_SC + 16 * j + r] = (uint8_t)(sc[j] | (m[j] >> 4) << 6);
	for (int c = 0; c < 4; c++)
		hdr[PK_K4_MLO + 16 * c + r] = (uint8_t)((m[2 * c] & 15) | (m[2 * c + 1] & 15) << 4);
	memcpy(hdr + PK_K4_D + 2 * r, &b4->d, 2);
	memcpy(hdr + PK_K4_DMIN + 2 * r, &b4->dmin, 2);
}

static void unpack_sb(enum nx_type t, const uint8_t *o, int r, uint8_t *x)
{
	if (t == NX_Q2_K || t == NX_Q3_K) {
		unpack_sb_k2(t, o, r, x);
		return;
	}
	if (t == NX_IQ4_XS) {
		struct nx_block_iq4_xs *b = (struct nx_block_iq4_xs *)x;
		for (int j = 0; j < 8; j++)
			for (int c = 0; c < 4; c++)
				memcpy(b->qs + 16 * j + 4 * c, o + PK_XS_QS + 64 * (4 * j + c) + 4 * r, 4);
		for (int c = 0; c < 4; c++)
			b->scales_l[c] = o[PK_XS_SL + 16 * c + r];
		memcpy(&b->scales_h, o + PK_XS_SH + 2 * r, 2);
		memcpy(&b->d, o + PK_XS_D + 2 * r, 2);
		return;
	}
	if (t == NX_Q6_K) {
		struct nx_block_q6_k *b = (struct nx_block_q6_k *)x;
		memset(b->ql, 0, sizeof(b->ql));
		memset(b->qh, 0, sizeof(b->qh));
		for (int e = 0; e < QK_K; e++)
			q6_set(b, e, q6_lane(o, e / 32, e % 32 / 4, r, e % 4));
		for (int g = 0; g < 16; g++)
			b->scales[g] = (int8_t)o[PK_Q6_K_SC + 16 * g + r];
		memcpy(&b->d, o + PK_Q6_K_D + 2 * r, 2);
		return;
	}
	const bool q5 = t == NX_Q5_K;
	struct nx_block_q4_k *b4 = (struct nx_block_q4_k *)x;
	struct nx_block_q5_k *b5 = (struct nx_block_q5_k *)x;
	uint8_t *qs = q5 ? b5->qs : b4->qs;
	for (int c = 0; c < 4; c++)
		for (int w = 0; w < 8; w++)
			memcpy(qs + 32 * c + 4 * w, o + PK_K4_QS(q5) + 64 * (8 * c + w) + 4 * r, 4);
	for (int w = 0; q5 && w < 8; w++)
		memcpy(b5->qh + 4 * w, o + PK_K5_QH + 64 * w + 4 * r, 4);
	const uint8_t *hdr = o + PK_K4_HDR;
	uint8_t sc[8], m[8];
	for (int j = 0; j < 8; j++) {
		int s, mm;
		k4_lane(hdr, j, r, &s, &mm);
		sc[j] = (uint8_t)s;
		m[j] = (uint8_t)mm;
	}
	k4_encode(sc, m, b4->scales);
	memcpy(&b4->d, hdr + PK_K4_D + 2 * r, 2);
	memcpy(&b4->dmin, hdr + PK_K4_DMIN + 2 * r, 2);
}

void nx_pack_k_group(enum nx_type t, const void *rows, size_t row_bytes, void *dst, int64_t n_in)
{
	const size_t sbb = sb_bytes(t), plain = sbb / NX_PACK_ROWS;
	for (int64_t sb = 0; sb < n_in / QK_K; sb++)
		for (int r = 0; r < NX_PACK_ROWS; r++)
			pack_sb(t, (const uint8_t *)rows + (size_t)r * row_bytes + (size_t)sb * plain, r,
				(uint8_t *)dst + (size_t)sb * sbb);
}

void nx_unpack_k_row(enum nx_type t, const void *group, int r, void *dst, int64_t n_in)
{
	const size_t sbb = sb_bytes(t), plain = sbb / NX_PACK_ROWS;
	for (int64_t sb = 0; sb < n_in / QK_K; sb++)
		unpack_sb(t, (const uint8_t *)group + (size_t)sb * sbb, r, (uint8_t *)dst + (size_t)sb * plain);
}

void nx_pack_act_prep_c16(const void *hi, const void *lo, int64_t n_in, int32_t *c16)
{
	const struct nx_block_q8_0 *yh = hi, *yl = lo;
	for (int64_t b = 0; b < n_in / 32; b++)
		for (int h = 0; h < 2; h++) {
			int32_t sh = 0, sl = 0;
			for (int k = 0; k < 16; k++) {
				sh += yh[b].qs[16 * h + k];
				sl += yl[b].qs[16 * h + k];
			}
			c16[2 * b + h] = -32 * (128 * sh + sl);
		}
}

/* ---------------------------------------------------------------- reference kernels
 * Per (row, token), super-block by super-block, activation block b by block
 * (block b is sub-block b % 8 of super-block b / 8), acc from 0, with the exact
 * integer dots of the token's hi and lo blocks combined as 128 * hi + lo:
 *   q4_k, q5_k: isum = that of sub-block b's q (0..15, 0..31) with block b;
 *       acc = fma(d * sc, (float)isum * d_a, acc); acc = fma(-dmin * m, s_a, acc)
 *   q6_k: i0, i1 = those of (q - 32) with halves 0 and 1 of block b (scales
 *       sc0, sc1);
 *       f = fma(d * sc1, (float)i1, (d * sc0) * (float)i0); acc = fma(f, d_a, acc)
 *   iq4_xs: isum = that of sub-block b's codes grid[q] + 128 with block b, less
 *       c_a; acc = fma(d * (ls - 32), (float)isum * d_a, acc)
 *   q2_k: i0, i1 = those of the levels q (0..3) with halves 0 and 1 of block b
 *       (scales sc0, sc1, mins m0, m1; c0, c1 the halves' c16 = -32 x their sums);
 *       f = fma(d * sc1, (float)i1, (d * sc0) * (float)i0);
 *       f = fma(dmin / 32 * m0, (float)c0, f); f = fma(dmin / 32 * m1, (float)c1, f);
 *       acc = fma(f, d_a, acc)
 *   q3_k: i0, i1 = those of the codes q + 4 * third bit (0..7) with the halves,
 *       plus c0 / 8, c1 / 8 (the -4 offset); then as q6_k with sc - 32
 * and the result is acc. dmin / 32 * m is exact as well, and so is (float)c16
 * (|c16| < 2^24). d * sc and dmin * m are exact in float (11 x 8 bits at
 * most), so it does not matter how a kernel forms them. The SIMD kernels do
 * exactly these steps per lane; a combined integer dot stays below 2^25 in
 * magnitude. */

static void ref_k4(bool q5, const void *group, const struct nx_pack_act *a, int n_act, float *out, int64_t n_in)
{
	const int64_t nb = n_in / 32;
	const size_t sbb = q5 ? PK_Q5_K_SB : PK_Q4_K_SB;
	for (int i = 0; i < n_act; i++)
		for (int r = 0; r < NX_PACK_ROWS; r++) {
			float acc = 0;
			for (int64_t b = 0; b < nb; b++) {
				const uint8_t *o = (const uint8_t *)group + (size_t)(b / 8) * sbb, *hdr = o + PK_K4_HDR;
				const int j = (int)(b % 8);
				nx_f16 dh, mh;
				memcpy(&dh, hdr + PK_K4_D + 2 * r, 2);
				memcpy(&mh, hdr + PK_K4_DMIN + 2 * r, 2);
				int sc, m;
				k4_lane(hdr, j, r, &sc, &m);
				int32_t ip[2] = {0, 0};
				for (int part = 0; part < 2; part++) {
					const int8_t *y = nx_pack_act_qs(a, i, part, b);
					for (int w = 0; w < 8; w++)
						for (int k = 0; k < 4; k++) {
							int q = o[PK_K4_QS(q5) + 64 * (8 * (j / 2) + w) + 4 * r + k] >> (4 * (j % 2)) & 15;
							if (q5)
								q |= (o[PK_K5_QH + 64 * w + 4 * r + k] >> j & 1) << 4;
							ip[part] += q * y[4 * w + k];
						}
				}
				const int32_t isum = 128 * ip[0] + ip[1];
				const float d = nx_f16_to_f32(dh), dmin = nx_f16_to_f32(mh);
				acc = fmaf(d * (float)sc, (float)isum * a->d[i * nb + b], acc);
				acc = fmaf(-dmin * (float)m, a->s[i * nb + b], acc);
			}
			out[i * NX_PACK_ROWS + r] = acc;
		}
}

static void ref_q4_k(const void *g, const struct nx_pack_act *a, int n_act, float *out, int64_t n)
{
	ref_k4(false, g, a, n_act, out, n);
}

static void ref_q5_k(const void *g, const struct nx_pack_act *a, int n_act, float *out, int64_t n)
{
	ref_k4(true, g, a, n_act, out, n);
}

static void ref_q6_k(const void *group, const struct nx_pack_act *a, int n_act, float *out, int64_t n_in)
{
	const int64_t nb = n_in / 32;
	for (int i = 0; i < n_act; i++)
		for (int r = 0; r < NX_PACK_ROWS; r++) {
			float acc = 0;
			for (int64_t b = 0; b < nb; b++) {
				const uint8_t *o = (const uint8_t *)group + (size_t)(b / 8) * PK_Q6_K_SB;
				nx_f16 dh;
				memcpy(&dh, o + PK_Q6_K_D + 2 * r, 2);
				int32_t is[2][2] = {{0, 0}, {0, 0}}; /* [part][half] */
				for (int part = 0; part < 2; part++) {
					const int8_t *y = nx_pack_act_qs(a, i, part, b);
					for (int w = 0; w < 8; w++)
						for (int k = 0; k < 4; k++)
							is[part][w / 4] += (q6_lane(o, (int)(b % 8), w, r, k) - 32) * y[4 * w + k];
				}
				const int32_t i0 = 128 * is[0][0] + is[1][0], i1 = 128 * is[0][1] + is[1][1];
				const float d = nx_f16_to_f32(dh);
				const int sc0 = (int8_t)o[PK_Q6_K_SC + 16 * (2 * (b % 8)) + r];
				const int sc1 = (int8_t)o[PK_Q6_K_SC + 16 * (2 * (b % 8) + 1) + r];
				const float f = fmaf(d * (float)sc1, (float)i1, (d * (float)sc0) * (float)i0);
				acc = fmaf(f, a->d[i * nb + b], acc);
			}
			out[i * NX_PACK_ROWS + r] = acc;
		}
}

/* Sub-block j's 6-bit scale (0..63; the scale is that - 32) of row r in a packed iq4_xs super-block. */
static int xs_lane(const uint8_t *o, int j, int r)
{
	uint16_t h;
	memcpy(&h, o + PK_XS_SH + 2 * r, 2);
	return (o[PK_XS_SL + 16 * (j / 2) + r] >> 4 * (j % 2) & 15) | (h >> 2 * j & 3) << 4;
}

static void ref_iq4_xs(const void *group, const struct nx_pack_act *a, int n_act, float *out, int64_t n_in)
{
	const int64_t nb = n_in / 32;
	for (int i = 0; i < n_act; i++)
		for (int r = 0; r < NX_PACK_ROWS; r++) {
			float acc = 0;
			for (int64_t b = 0; b < nb; b++) {
				const uint8_t *o = (const uint8_t *)group + (size_t)(b / 8) * PK_IQ4_XS_SB;
				const int j = (int)(b % 8);
				nx_f16 dh;
				memcpy(&dh, o + PK_XS_D + 2 * r, 2);
				int32_t ip[2] = {0, 0};
				for (int part = 0; part < 2; part++) {
					const int8_t *y = nx_pack_act_qs(a, i, part, b);
					for (int c = 0; c < 4; c++)
						for (int k = 0; k < 4; k++) {
							const uint8_t v = o[PK_XS_QS + 64 * (4 * j + c) + 4 * r + k];
							ip[part] += (nx_kvalues_iq4nl[v & 15] + 128) * y[4 * c + k] +
								    (nx_kvalues_iq4nl[v >> 4] + 128) * y[16 + 4 * c + k];
						}
				}
				const int32_t isum = 128 * ip[0] + ip[1] - a->c[i * nb + b];
				const float d = nx_f16_to_f32(dh);
				acc = fmaf(d * (float)(xs_lane(o, j, r) - 32), (float)isum * a->d[i * nb + b], acc);
			}
			out[i * NX_PACK_ROWS + r] = acc;
		}
}

/* q2_k (q3 false) and q3_k. */
static void ref_k2(bool q3, const void *group, const struct nx_pack_act *a, int n_act, float *out, int64_t n_in)
{
	const int64_t nb = n_in / 32;
	const size_t sbb = q3 ? PK_Q3_K_SB : PK_Q2_K_SB;
	for (int i = 0; i < n_act; i++)
		for (int r = 0; r < NX_PACK_ROWS; r++) {
			float acc = 0;
			for (int64_t b = 0; b < nb; b++) {
				const uint8_t *o = (const uint8_t *)group + (size_t)(b / 8) * sbb;
				const int j = (int)(b % 8);
				const int32_t *c16 = a->c16 + 2 * (i * nb + b);
				int32_t is[2][2] = {{0, 0}, {0, 0}}; /* [part][half] */
				for (int part = 0; part < 2; part++) {
					const int8_t *y = nx_pack_act_qs(a, i, part, b);
					for (int k = 0; k < 32; k++) {
						const int e = 32 * j + k;
						int sh;
						int q = o[k2_byte(q3, e, r, &sh)] >> sh & 3;
						if (q3)
							q |= (o[k3_hbyte(e, r)] >> (k / 4) & 1) << 2;
						is[part][k / 16] += q * y[k];
					}
				}
				int32_t i0 = 128 * is[0][0] + is[1][0], i1 = 128 * is[0][1] + is[1][1];
				nx_f16 dh;
				float f;
				if (q3) {
					i0 += c16[0] / 8;
					i1 += c16[1] / 8;
					memcpy(&dh, o + PK_Q3_K_D + 2 * r, 2);
					const float d = nx_f16_to_f32(dh);
					const int sc0 = k3_lane(o, 2 * j, r) - 32, sc1 = k3_lane(o, 2 * j + 1, r) - 32;
					f = fmaf(d * (float)sc1, (float)i1, (d * (float)sc0) * (float)i0);
				} else {
					nx_f16 mh;
					memcpy(&dh, o + PK_Q2_K_D + 2 * r, 2);
					memcpy(&mh, o + PK_Q2_K_DMIN + 2 * r, 2);
					const float d = nx_f16_to_f32(dh), dmin32 = nx_f16_to_f32(mh) / 32;
					const int s0 = o[PK_Q2_K_SC + 16 * (2 * j) + r], s1 = o[PK_Q2_K_SC + 16 * (2 * j + 1) + r];
					f = fmaf(d * (float)(s1 & 15), (float)i1, (d * (float)(s0 & 15)) * (float)i0);
					f = fmaf(dmin32 * (float)(s0 >> 4), (float)c16[0], f);
					f = fmaf(dmin32 * (float)(s1 >> 4), (float)c16[1], f);
				}
				acc = fmaf(f, a->d[i * nb + b], acc);
			}
			out[i * NX_PACK_ROWS + r] = acc;
		}
}

static void ref_q2_k(const void *g, const struct nx_pack_act *a, int n_act, float *out, int64_t n)
{
	ref_k2(false, g, a, n_act, out, n);
}

static void ref_q3_k(const void *g, const struct nx_pack_act *a, int n_act, float *out, int64_t n)
{
	ref_k2(true, g, a, n_act, out, n);
}

nx_pack_fn nx_pack_k_kernel_ref(enum nx_type t)
{
	switch (t) {
	case NX_Q2_K: return ref_q2_k;
	case NX_Q3_K: return ref_q3_k;
	case NX_Q4_K: return ref_q4_k;
	case NX_Q5_K: return ref_q5_k;
	case NX_Q6_K: return ref_q6_k;
	case NX_IQ4_XS: return ref_iq4_xs;
	default: return NULL;
	}
}
