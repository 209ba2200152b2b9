/* pack_amx.c - AMX-INT8 tile kernels for the packed layouts (kern/pack.h): 16 weight rows x up to 16 tokens per call.
 *
 * Per block, the group's weights are decoded to bytes once (as the AVX-512
 * kernels decode them) into the B tile's VNNI layout, which is the packed
 * layout itself: row j of B holds bytes 4j .. 4j+3 of each of the 16 rows.
 * One TDPBSUD per part then takes the exact integer dots of all the tokens'
 * Q8_0 blocks (the A tile, one token per row, read in place with the
 * activation stride) with the 16 rows; an integer dot is the same whichever
 * instruction sums it, so from there on every lane follows the AVX-512 kernel's
 * float steps in its order (128 * hi + lo, times the activation's scale, one
 * fused multiply-add per block), and the results are bit-identical to it and
 * to kern/pack.c's reference. K is 32 bytes (one block per TDPBSUD): the
 * blocks' scales differ, so their dots cannot share an accumulator.
 *
 * Tiles: 0 and 1 the hi and lo dots (NA rows x 16 int32), 2 and 3 the hi and
 * lo activation blocks (NA rows x 32 bytes), 4 the weights (8 rows x 64); for
 * q6_k's halves (a scale per 16 elements) 4 holds the first half's weights and
 * zeros, 7 zeros and the second half's, and 5 and 6 take the second half's dots.
 * The tile instructions are written as inline asm with a "memory" clobber:
 * GCC 12's intrinsics name no memory operand for tileloadd, so stores that
 * fill the weight buffer could be moved past it.
 *
 * The emulated kernels (nx_pack_amx_kernel(t, true)) run the same code with
 * each tile instruction done in scalar code as the ISA reference defines it,
 * so the data flow (layouts, strides, rows) is tested on CPUs without AMX.
 * Built without -m flags, used only where kern/cpu.c picks amx for the pack
 * family: the CPU has AMX-INT8 and Linux gave this process the tile state. */
#include "kern/pack.h"
#include "kern/pack_tile_avx512.h"

/* The tile configuration (palette 1), as LDTILECFG reads it. */
struct tilecfg {
	uint8_t palette, start_row, reserved[14];
	uint16_t colsb[16];
	uint8_t rows[16];
} __attribute__((aligned(64)));

#define T_LOAD(t, base, stride) \
	__asm__ volatile("tileloadd (%0,%1,1), %%tmm" #t ::"r"(base), "r"((long)(stride)) : "memory")
#define T_STORE(t, base, stride) \
	__asm__ volatile("tilestored %%tmm" #t ", (%0,%1,1)" ::"r"(base), "r"((long)(stride)) : "memory")
#define T_ZERO(t) __asm__ volatile("tilezero %%tmm" #t ::: "memory")
/* tmm dst += tmm a (signed bytes) . tmm b (unsigned bytes) */
#define T_DPBSUD(dst, a, b) __asm__ volatile("tdpbsud %%tmm" #b ", %%tmm" #a ", %%tmm" #dst ::: "memory")
/* out (NA x 16 int32) = tmm a . tmm b, through tmm c */
#define T_DOT(c, a, b, out)                 \
	do {                                \
		T_ZERO(c);                  \
		T_DPBSUD(c, a, b);          \
		T_STORE(c, out, 64);        \
	} while (0)

/* pf_ahead's NA: the multi-token tiles' prefetch (further ahead, into L2) */
#define PF_MT 2

/* Where one call's integer dots go: per token i and row r, the hi and lo parts' dots of the block in hand. */
struct dots {
	int32_t hi[NX_PACK_AMX_MAX][NX_PACK_ROWS] __attribute__((aligned(64)));
	int32_t lo[NX_PACK_AMX_MAX][NX_PACK_ROWS] __attribute__((aligned(64)));
};

INL void tiles_begin(const int NA, const bool EMU)
{
	if (EMU)
		return;
	struct tilecfg cfg;
	memset(&cfg, 0, sizeof(cfg));
	cfg.palette = 1;
	for (int t = 0; t < 8; t++) /* the dots: 0, 1, 5, 6 */
		cfg.rows[t] = (uint8_t)NA, cfg.colsb[t] = 64;
	cfg.colsb[2] = cfg.colsb[3] = 32; /* the activation blocks */
	cfg.rows[4] = cfg.rows[7] = 8;    /* the weights */
	__asm__ volatile("ldtilecfg %0" ::"m"(cfg));
}

INL void tiles_end(const bool EMU)
{
	if (!EMU)
		__asm__ volatile("tilerelease" ::: "memory");
}

/* TDPBSUD of K = 32 as the ISA reference defines it: out[i][n] = sum over k
 * of (int8) a[i * stride + k] * (uint8) w[(k / 4) * 64 + 4 n + k % 4]. */
static void emu_dpbsud(int NA, const int8_t *a, size_t stride, const uint8_t *w, int32_t out[][NX_PACK_ROWS])
{
	for (int i = 0; i < NA; i++)
		for (int n = 0; n < NX_PACK_ROWS; n++) {
			int32_t s = 0;
			for (int k = 0; k < 32; k++)
				s += (int32_t)a[(size_t)i * stride + k] * (int32_t)w[(k / 4) * 64 + 4 * n + k % 4];
			out[i][n] = s;
		}
}

/* The dots of NA tokens' block b (both parts, only hi when !LO) with the 16
 * rows' weight bytes w0 (8 x 64, VNNI order) into d0, and where w1 is not
 * NULL with w1 too, into d1 (tiles 7, 5, 6). */
INL void block_dots(const struct nx_pack_act *a, const int NA, int64_t b, const uint8_t *w0, struct dots *d0,
		    const uint8_t *w1, struct dots *d1, const bool LO, const bool EMU)
{
	const int8_t *ah = nx_pack_act_qs(a, 0, 0, b), *al = nx_pack_act_qs(a, 0, 1, b);
	if (EMU) {
		for (int k = 0; k < 2; k++) {
			const uint8_t *w = k ? w1 : w0;
			struct dots *d = k ? d1 : d0;
			if (!w)
				continue;
			emu_dpbsud(NA, ah, a->stride, w, d->hi);
			if (LO)
				emu_dpbsud(NA, al, a->stride, w, d->lo);
		}
		return;
	}
	T_LOAD(4, w0, 64);
	if (w1)
		T_LOAD(7, w1, 64);
	T_LOAD(2, ah, a->stride);
	T_DOT(0, 2, 4, d0->hi);
	if (w1)
		T_DOT(5, 2, 7, d1->hi);
	if (LO) {
		T_LOAD(3, al, a->stride);
		T_DOT(1, 3, 4, d0->lo);
		if (w1)
			T_DOT(6, 3, 7, d1->lo);
	}
}

/* Token i's 128 * hi + lo - off, one int32 lane per row, as the AVX-512 kernels form it. */
INL __m512i combined(const struct dots *dt, int i, int32_t off, const bool LO)
{
	const __m512i lo = LO ? _mm512_load_si512((const void *)dt->lo[i]) : _mm512_setzero_si512();
	return comb(_mm512_load_si512((const void *)dt->hi[i]), _mm512_sub_epi32(lo, _mm512_set1_epi32(off)));
}

/* The 4-bit types and q8_0 (Q8: 8 weight vectors stored unsigned, offset
 * -c), block layout as nib_tile's in kern/pack_avx512.c. */
INL void nib_amx(const void *group, const struct nx_pack_act *a, int NA, float *out, int64_t n_in, const int GB,
		 const int M, const int H, const int QS, const int SHIFT, const bool GRID, const bool Q8, const bool LO,
		 const bool EMU)
{
	const int64_t nb = n_in / 32;
	const __m512i grid = nib_grid(GRID);
	uint8_t w[8 * 64] __attribute__((aligned(64)));
	struct dots dt;
	__m512 acc_d[NX_PACK_AMX_MAX], acc_m[NX_PACK_AMX_MAX];
	for (int i = 0; i < NA; i++)
		acc_d[i] = acc_m[i] = _mm512_setzero_ps();
	tiles_begin(NA, EMU);
	const uint8_t *o = group;
	for (int64_t b = 0; b < nb; b++, o += GB) {
		pf_ahead(o, GB, PF_MT);
		const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)o));
		const __m512 mw = M >= 0 ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(o + M))) : dw;
		if (Q8) {
			block_dots(a, NA, b, o + QS, &dt, NULL, NULL, LO, EMU); /* the stored vectors are B as they are */
		} else {
			__m512i lo[4], hi[4];
			nib_decode(o, H, QS, GRID, grid, lo, hi);
			for (int c = 0; c < 4; c++) {
				_mm512_store_si512((void *)(w + 64 * c), lo[c]);
				_mm512_store_si512((void *)(w + 64 * (4 + c)), hi[c]);
			}
			block_dots(a, NA, b, w, &dt, NULL, NULL, LO, EMU);
		}
		for (int i = 0; i < NA; i++) {
			const int32_t off = Q8 ? a->c[i * nb + b] : SHIFT >= 0 ? a->c[i * nb + b] / (1 << SHIFT) : 0;
			const __m512i s = combined(&dt, i, off, LO);
			const __m512 t = _mm512_mul_ps(_mm512_cvtepi32_ps(s), _mm512_set1_ps(a->d[i * nb + b]));
			acc_d[i] = _mm512_fmadd_ps(dw, t, acc_d[i]);
			if (M >= 0)
				acc_m[i] = _mm512_fmadd_ps(mw, _mm512_set1_ps(a->s[i * nb + b]), acc_m[i]);
		}
	}
	tiles_end(EMU);
	for (int i = 0; i < NA; i++)
		_mm512_storeu_ps(out + i * NX_PACK_ROWS, M >= 0 ? _mm512_add_ps(acc_d[i], acc_m[i]) : acc_d[i]);
}

/* q4_k (q5 false) and q5_k, in k4_tile's order (kern/pack_k_avx512.c). */
INL void k4_amx(const void *group, const struct nx_pack_act *a, int NA, float *out, int64_t n_in, const bool q5,
		const bool LO, const bool EMU)
{
	const int64_t nb = n_in / 32;
	const size_t sbb = q5 ? PK_Q5_K_SB : PK_Q4_K_SB;
	uint8_t w[2][8 * 64] __attribute__((aligned(64)));
	struct dots dt[2];
	__m512 acc[NX_PACK_AMX_MAX];
	for (int i = 0; i < NA; i++)
		acc[i] = _mm512_setzero_ps();
	tiles_begin(NA, EMU);
	const uint8_t *o = group;
	for (int64_t b0 = 0; b0 < nb; b0 += 8, o += sbb) {
		const uint8_t *hdr = o + PK_K4_HDR;
		__m512 d, ndmin;
		k4_super(hdr, &d, &ndmin);
		for (int c = 0; c < 4; c++) { /* sub-blocks 2c (low nibbles) and 2c + 1 (high) */
			pf_ahead(o + c * (sbb / 4), (int)(sbb / 4), PF_MT);
			__m512 dsc0, dsc1, nm0, nm1;
			k4_scales(hdr, c, d, d, ndmin, &dsc0, &dsc1, &nm0, &nm1);
			__m512i lo[8], hi[8];
			k4_decode(o, c, q5, false, lo, hi);
			for (int v = 0; v < 8; v++) {
				_mm512_store_si512((void *)(w[0] + 64 * v), lo[v]);
				_mm512_store_si512((void *)(w[1] + 64 * v), hi[v]);
			}
			const int64_t b = b0 + 2 * c;
			block_dots(a, NA, b, w[0], &dt[0], NULL, NULL, LO, EMU);
			block_dots(a, NA, b + 1, w[1], &dt[1], NULL, NULL, LO, EMU);
			for (int i = 0; i < NA; i++) {
				const int64_t k = i * nb + b;
				const __m512i s0 = combined(&dt[0], i, 0, LO), s1 = combined(&dt[1], i, 0, LO);
				acc[i] = _mm512_fmadd_ps(dsc0, _mm512_mul_ps(_mm512_cvtepi32_ps(s0), _mm512_set1_ps(a->d[k])), acc[i]);
				acc[i] = _mm512_fmadd_ps(nm0, _mm512_set1_ps(a->s[k]), acc[i]);
				acc[i] = _mm512_fmadd_ps(dsc1, _mm512_mul_ps(_mm512_cvtepi32_ps(s1), _mm512_set1_ps(a->d[k + 1])), acc[i]);
				acc[i] = _mm512_fmadd_ps(nm1, _mm512_set1_ps(a->s[k + 1]), acc[i]);
			}
		}
	}
	tiles_end(EMU);
	for (int i = 0; i < NA; i++)
		_mm512_storeu_ps(out + i * NX_PACK_ROWS, acc[i]);
}

/* q6_k, in q6_k_tile's order (kern/pack_k_avx512.c): the halves' offsets -32 (c16) start the lo sums. */
INL void q6_k_amx(const void *group, const struct nx_pack_act *a, int NA, float *out, int64_t n_in, const bool LO,
		  const bool EMU)
{
	const int64_t nb = n_in / 32;
	uint8_t w[2][8 * 64] __attribute__((aligned(64)));
	memset(w, 0, sizeof(w)); /* the other half's rows of each stay zeros */
	struct dots dt[2];
	__m512 acc[NX_PACK_AMX_MAX];
	for (int i = 0; i < NA; i++)
		acc[i] = _mm512_setzero_ps();
	tiles_begin(NA, EMU);
	const uint8_t *o = group;
	for (int64_t b0 = 0; b0 < nb; b0 += 8, o += PK_Q6_K_SB) {
		const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(o + PK_Q6_K_D)));
		for (int blk = 0; blk < 8; blk++) {
			pf_ahead(o + blk * (PK_Q6_K_SB / 8), PK_Q6_K_SB / 8, PF_MT);
			__m512i q[8];
			q6_decode(o, blk, q);
			__m512 dsc0, dsc1;
			q6_scales(o, blk, d, &dsc0, &dsc1);
			for (int v = 0; v < 4; v++) {
				_mm512_store_si512((void *)(w[0] + 64 * v), q[v]);
				_mm512_store_si512((void *)(w[1] + 64 * (4 + v)), q[4 + v]);
			}
			const int64_t b = b0 + blk;
			block_dots(a, NA, b, w[0], &dt[0], w[1], &dt[1], LO, EMU);
			for (int i = 0; i < NA; i++) {
				const int32_t *c16 = a->c16 + 2 * (i * nb + b);
				const __m512i s0 = combined(&dt[0], i, -c16[0], LO), s1 = combined(&dt[1], i, -c16[1], LO);
				const __m512 f = _mm512_fmadd_ps(dsc1, _mm512_cvtepi32_ps(s1), _mm512_mul_ps(dsc0, _mm512_cvtepi32_ps(s0)));
				acc[i] = _mm512_fmadd_ps(f, _mm512_set1_ps(a->d[i * nb + b]), acc[i]);
			}
		}
	}
	tiles_end(EMU);
	for (int i = 0; i < NA; i++)
		_mm512_storeu_ps(out + i * NX_PACK_ROWS, acc[i]);
}

/* Block bytes and offsets: kern/pack.h, as pack_avx512.c's. */
#define NIB_AMX(name, GB, M, H, QS, SHIFT, GRID, Q8)                                                           \
	INL void name##_amx(const void *g, const struct nx_pack_act *a, int n_act, float *out, int64_t n,      \
			    const bool LO, const bool EMU)                                                     \
	{                                                                                                      \
		nib_amx(g, a, n_act, out, n, GB, M, H, QS, SHIFT, GRID, Q8, LO, EMU);                          \
	}
NIB_AMX(q4_0, 288, -1, -1, 32, 4, false, false)
NIB_AMX(iq4_nl, 288, -1, -1, 32, 0, true, false)
NIB_AMX(q4_1, 320, 32, -1, 64, -1, false, false)
NIB_AMX(q5_0, 352, -1, 32, 96, 3, false, false)
NIB_AMX(q5_1, 384, 32, 64, 128, -1, false, false)
NIB_AMX(q8_0, 544, -1, -1, 32, -1, false, true)

INL void q4_k_amx(const void *g, const struct nx_pack_act *a, int n_act, float *out, int64_t n, const bool LO,
		  const bool EMU)
{
	k4_amx(g, a, n_act, out, n, false, LO, EMU);
}

INL void q5_k_amx(const void *g, const struct nx_pack_act *a, int n_act, float *out, int64_t n, const bool LO,
		  const bool EMU)
{
	k4_amx(g, a, n_act, out, n, true, LO, EMU);
}

/* pa_NAME (the tile instructions) and pe_NAME (emulated), LO a compile-time constant in each. */
#define AMX_FN(name)                                                                                           \
	static TGT void pa_##name(const void *g, const struct nx_pack_act *a, int n_act, float *out, int64_t n) \
	{                                                                                                      \
		if (a->lo_zero)                                                                                \
			name##_amx(g, a, n_act, out, n, false, false);                                         \
		else                                                                                           \
			name##_amx(g, a, n_act, out, n, true, false);                                          \
	}                                                                                                      \
	static TGT void pe_##name(const void *g, const struct nx_pack_act *a, int n_act, float *out, int64_t n) \
	{                                                                                                      \
		if (a->lo_zero)                                                                                \
			name##_amx(g, a, n_act, out, n, false, true);                                          \
		else                                                                                           \
			name##_amx(g, a, n_act, out, n, true, true);                                           \
	}
AMX_FN(q4_0)
AMX_FN(q4_1)
AMX_FN(q5_0)
AMX_FN(q5_1)
AMX_FN(q8_0)
AMX_FN(iq4_nl)
AMX_FN(q4_k)
AMX_FN(q5_k)
AMX_FN(q6_k)

nx_pack_fn nx_pack_amx_kernel(enum nx_type t, bool emulated)
{
	switch (t) {
	case NX_Q4_0: return emulated ? pe_q4_0 : pa_q4_0;
	case NX_Q4_1: return emulated ? pe_q4_1 : pa_q4_1;
	case NX_Q5_0: return emulated ? pe_q5_0 : pa_q5_0;
	case NX_Q5_1: return emulated ? pe_q5_1 : pa_q5_1;
	case NX_Q8_0: return emulated ? pe_q8_0 : pa_q8_0;
	case NX_IQ4_NL: return emulated ? pe_iq4_nl : pa_iq4_nl;
	case NX_Q4_K: return emulated ? pe_q4_k : pa_q4_k;
	case NX_Q5_K: return emulated ? pe_q5_k : pa_q5_k;
	case NX_Q6_K: return emulated ? pe_q6_k : pa_q6_k;
	default: return NULL;
	}
}
