/* x86_dot_table.h - the part of a kernel-set file (x86_avx2.c, x86_avx512.c) that is the same in each:
 * dot / dot_rows for every weight type out of its `<type>_k` body, and the
 * installer of the set's entries into the type table.
 *
 * Include once, after the including file has defined TGT, INL, kf_k with
 * K_F32 / K_F16 / K_BF16, `<type>_k(w, a, a_stride, nr, nb, out)` for every
 * quantized weight type, and quant_f16 / quant_q8_0 / quant_q8_k /
 * quant2_q8_0 / quant2_q8_k. Defines `static void install_set(tab, n)`. */
#ifndef NX_X86_DOT_TABLE_H
#define NX_X86_DOT_TABLE_H

INL void f32_k(const void *w, const uint8_t *a, size_t as, int nr, int64_t n, float *out)
{
	kf_k(K_F32, w, a, as, nr, n, out);
}
INL void f16_k(const void *w, const uint8_t *a, size_t as, int nr, int64_t n, float *out)
{
	kf_k(K_F16, w, a, as, nr, n, out);
}
INL void bf16_k(const void *w, const uint8_t *a, size_t as, int nr, int64_t n, float *out)
{
	kf_k(K_BF16, w, a, as, nr, n, out);
}

/* dot is the one-row case of dot_rows' body, so the two give the same bits. */
#define DOT_FNS(name)                                                                                   \
	static TGT float dot_##name(const void *w, const void *a, int64_t n)                          \
	{                                                                                               \
		float o;                                                                                \
		name##_k(w, a, 0, 1, n, &o);                                                            \
		return o;                                                                               \
	}                                                                                               \
	static TGT void dot_rows_##name(const void *w, const void *a, size_t as, int na, float *out,  \
					int64_t n)                                                      \
	{                                                                                               \
		const uint8_t *ap = a;                                                                  \
		for (; na >= 4; na -= 4, ap += 4 * as, out += 4)                                        \
			name##_k(w, ap, as, 4, n, out);                                                 \
		if (na == 3)                                                                            \
			name##_k(w, ap, as, 3, n, out);                                                 \
		else if (na == 2)                                                                       \
			name##_k(w, ap, as, 2, n, out);                                                 \
		else if (na == 1)                                                                       \
			name##_k(w, ap, as, 1, n, out);                                                 \
	}

DOT_FNS(q4_0)
DOT_FNS(q4_1)
DOT_FNS(q5_0)
DOT_FNS(q5_1)
DOT_FNS(q8_0)
DOT_FNS(q4_k)
DOT_FNS(q5_k)
DOT_FNS(q6_k)
DOT_FNS(q2_k)
DOT_FNS(q3_k)
DOT_FNS(iq4_nl)
DOT_FNS(iq4_xs)
DOT_FNS(f32)
DOT_FNS(f16)
DOT_FNS(bf16)

static void set_dot(struct nx_type_traits *tab, size_t n, enum nx_type t, nx_dot_fn dot, nx_dot_rows_fn rows)
{
	if ((size_t)t < n) {
		tab[t].dot = dot;
		tab[t].dot_rows = rows;
	}
}

static void install_set(struct nx_type_traits *tab, size_t n)
{
	set_dot(tab, n, NX_Q4_0, dot_q4_0, dot_rows_q4_0);
	set_dot(tab, n, NX_Q4_1, dot_q4_1, dot_rows_q4_1);
	set_dot(tab, n, NX_Q5_0, dot_q5_0, dot_rows_q5_0);
	set_dot(tab, n, NX_Q5_1, dot_q5_1, dot_rows_q5_1);
	set_dot(tab, n, NX_Q8_0, dot_q8_0, dot_rows_q8_0);
	set_dot(tab, n, NX_Q4_K, dot_q4_k, dot_rows_q4_k);
	set_dot(tab, n, NX_Q5_K, dot_q5_k, dot_rows_q5_k);
	set_dot(tab, n, NX_Q6_K, dot_q6_k, dot_rows_q6_k);
	set_dot(tab, n, NX_Q2_K, dot_q2_k, dot_rows_q2_k);
	set_dot(tab, n, NX_Q3_K, dot_q3_k, dot_rows_q3_k);
	set_dot(tab, n, NX_IQ4_NL, dot_iq4_nl, dot_rows_iq4_nl);
	set_dot(tab, n, NX_IQ4_XS, dot_iq4_xs, dot_rows_iq4_xs);
	set_dot(tab, n, NX_F32, dot_f32, dot_rows_f32);
	set_dot(tab, n, NX_F16, dot_f16, dot_rows_f16);
	set_dot(tab, n, NX_BF16, dot_bf16, dot_rows_bf16);
	if ((size_t)NX_Q8_K < n) {
		tab[NX_F16].quant = quant_f16; /* the K/V cache rows */
		tab[NX_Q8_0].quant = quant_q8_0;
		tab[NX_Q8_K].quant = quant_q8_k;
		tab[NX_Q8_0].quant2 = quant2_q8_0;
		tab[NX_Q8_K].quant2 = quant2_q8_k;
	}
}

#endif
