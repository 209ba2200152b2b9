/* quant.h - tensor types with GGUF's numbering and block layouts, and the
 * traits table that gives each type its dequantize / quantize / dot kernels. */
#ifndef NX_QUANT_H
#define NX_QUANT_H

#include <assert.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Values are GGUF's ggml_type ids; they are what a file stores. */
enum nx_type {
	NX_F32 = 0,
	NX_F16 = 1,
	NX_Q4_0 = 2,
	NX_Q4_1 = 3,
	NX_Q5_0 = 6,
	NX_Q5_1 = 7,
	NX_Q8_0 = 8,
	NX_Q8_1 = 9,
	NX_Q2_K = 10,
	NX_Q3_K = 11,
	NX_Q4_K = 12,
	NX_Q5_K = 13,
	NX_Q6_K = 14,
	NX_Q8_K = 15,
	NX_IQ4_NL = 20,
	NX_IQ4_XS = 23,
	NX_BF16 = 30,
	NX_TYPE_COUNT = 40, /* ids below this may appear in a file; only some are supported */
};

typedef uint16_t nx_f16;  /* IEEE half, raw bits */
typedef uint16_t nx_bf16; /* bfloat16, raw bits */

#define QK4_0 32
#define QK4_1 32
#define QK5_0 32
#define QK5_1 32
#define QK8_0 32
#define QK4_NL 32
#define QK_K 256
#define K_SCALE_SIZE 12

/* x = d * (q - 8), 4.5 bits per weight */
struct nx_block_q4_0 {
	nx_f16 d;
	uint8_t qs[QK4_0 / 2]; /* low nibbles: elements 0..15, high nibbles: 16..31 */
};
static_assert(sizeof(struct nx_block_q4_0) == 18, "q4_0 block size");

/* x = d * q + m, 5 bits per weight */
struct nx_block_q4_1 {
	nx_f16 d;
	nx_f16 m;
	uint8_t qs[QK4_1 / 2];
};
static_assert(sizeof(struct nx_block_q4_1) == 20, "q4_1 block size");

/* x = d * (q - 16), 5.5 bits per weight; qh holds bit 4 of each of the 32 q */
struct nx_block_q5_0 {
	nx_f16 d;
	uint8_t qh[4];
	uint8_t qs[QK5_0 / 2];
};
static_assert(sizeof(struct nx_block_q5_0) == 22, "q5_0 block size");

/* x = d * q + m, 6 bits per weight */
struct nx_block_q5_1 {
	nx_f16 d;
	nx_f16 m;
	uint8_t qh[4];
	uint8_t qs[QK5_1 / 2];
};
static_assert(sizeof(struct nx_block_q5_1) == 24, "q5_1 block size");

/* x = d * q, 8.5 bits per weight */
struct nx_block_q8_0 {
	nx_f16 d;
	int8_t qs[QK8_0];
};
static_assert(sizeof(struct nx_block_q8_0) == 34, "q8_0 block size");

/* Super-block of 8 sub-blocks of 32: x = d * sc * q - dmin * m, 4.5 bits per weight.
 * scales packs 8 six-bit scales and 8 six-bit mins. */
struct nx_block_q4_k {
	nx_f16 d;
	nx_f16 dmin;
	uint8_t scales[K_SCALE_SIZE];
	uint8_t qs[QK_K / 2];
};
static_assert(sizeof(struct nx_block_q4_k) == 144, "q4_k block size");

/* As q4_k with a fifth bit per weight in qh: 5.5 bits per weight. */
struct nx_block_q5_k {
	nx_f16 d;
	nx_f16 dmin;
	uint8_t scales[K_SCALE_SIZE];
	uint8_t qh[QK_K / 8];
	uint8_t qs[QK_K / 2];
};
static_assert(sizeof(struct nx_block_q5_k) == 176, "q5_k block size");

/* 16 sub-blocks of 16: x = d * sc * (q - 32), q 6 bits (ql low 4, qh high 2), 6.5625 bits per weight. */
struct nx_block_q6_k {
	uint8_t ql[QK_K / 2];
	uint8_t qh[QK_K / 4];
	int8_t scales[QK_K / 16];
	nx_f16 d;
};
static_assert(sizeof(struct nx_block_q6_k) == 210, "q6_k block size");

/* 16 sub-blocks of 16: x = d * (sc & 15) * q - dmin * (sc >> 4), q 2 bits, 2.625 bits per weight.
 * qs: element e of a 128-half h (e = 32*j + l) at bits 2j..2j+1 of qs[32h + l]. */
struct nx_block_q2_k {
	uint8_t scales[QK_K / 16]; /* low nibble: scale, high nibble: min */
	uint8_t qs[QK_K / 4];
	nx_f16 d;
	nx_f16 dmin;
};
static_assert(sizeof(struct nx_block_q2_k) == 84, "q2_k block size");

/* 16 sub-blocks of 16: x = d * (sc - 32) * (q - 4), q 3 bits (2 in qs as q2_k, the
 * third in hmask: bit e/32 of hmask[e%32]), sc 6 bits packed in 12 bytes, 3.4375 bits per weight. */
struct nx_block_q3_k {
	uint8_t hmask[QK_K / 8];
	uint8_t qs[QK_K / 4];
	uint8_t scales[K_SCALE_SIZE];
	nx_f16 d;
};
static_assert(sizeof(struct nx_block_q3_k) == 110, "q3_k block size");

/* x = d * kvalues_iq4nl[q], a fixed non-linear grid of 16 levels; q as q4_0's nibbles, 4.5 bits per weight. */
struct nx_block_iq4_nl {
	nx_f16 d;
	uint8_t qs[QK4_NL / 2];
};
static_assert(sizeof(struct nx_block_iq4_nl) == 18, "iq4_nl block size");

/* 8 sub-blocks of 32: x = d * (ls - 32) * kvalues_iq4nl[q], ls 6 bits (low 4 in scales_l's
 * nibbles, high 2 in scales_h), each sub-block's nibbles as iq4_nl's, 4.25 bits per weight. */
struct nx_block_iq4_xs {
	nx_f16 d;
	uint16_t scales_h;
	uint8_t scales_l[QK_K / 64];
	uint8_t qs[QK_K / 2];
};
static_assert(sizeof(struct nx_block_iq4_xs) == 136, "iq4_xs block size");

/* The 16 levels of iq4_nl and iq4_xs (ggml's kvalues_iq4nl), in increasing order. */
extern const int8_t nx_kvalues_iq4nl[16];

/* Activation type for the k-quants: x = d * q with float d, plus sums of 16-groups. */
struct nx_block_q8_k {
	float d;
	int8_t qs[QK_K];
	int16_t bsums[QK_K / 16];
};
static_assert(sizeof(struct nx_block_q8_k) == 292, "q8_k block size");

/* Dequantize n elements (n a multiple of the block size). */
typedef void (*nx_dequant_fn)(const void *src, float *dst, int64_t n);
/* Quantize n elements (n a multiple of the block size). */
typedef void (*nx_quant_fn)(const float *src, void *dst, int64_t n);
/* Dot of n elements of a weight row with an activation row already in vec_dot_type. */
typedef float (*nx_dot_fn)(const void *w, const void *a, int64_t n);
/* Dots of ONE weight row with n_act activation rows (in vec_dot_type), row r at
 * a + r * a_stride: out[r] = dot(w, a + r * a_stride, n) for r < n_act (any n_act >= 0).
 * The weight row is read and unpacked once for all of them (batched decode, prefill).
 * Each out[r] is bit-identical to the same table's dot on that row, so a token's
 * result does not depend on what it was batched with. */
typedef void (*nx_dot_rows_fn)(const void *w, const void *a, size_t a_stride, int n_act, float *out, int64_t n);
/* Two-part quantization of n elements (n a multiple of the block size): hi + lo
 * carries about 14-15 bits per value (model/forward.c: prep_act_q says why).
 * Q8_K: hi = quant(x), lo = quant(x - dequant(hi)).
 * Q8_0: lo's scale is exactly hi's / 128, so that a kernel may sum
 * 128 * dot(w, hi) + dot(w, lo) in integers and scale once (kern/pack.h). hi is
 * quant(x) where d = amax / 127 >= 2^-7; below that its scale is d rounded up
 * to a multiple of 2^-17, so that it and its / 128 are exact in f16; lo is
 * x - dequant(hi) in levels of that / 128 (roundf of the difference times the
 * float inverse of lo's scale, as quant does with its own).
 * SIMD versions are bit-identical to the reference's (kern/quant_ref.c),
 * including where hi's scale overflows (a Q8_0 block with |x| > 127 * 65504,
 * where the f16 scale is inf and x - dequant(hi) is inf or NaN): there lo is a
 * zero block. lo NULL: hi alone, the same bytes (one-part activations). */
typedef void (*nx_quant2_fn)(const float *src, void *hi, void *lo, int64_t n);

struct nx_type_traits {
	const char *name;       /* GGUF's name, e.g. "q4_1" */
	int64_t blck;           /* elements per block */
	size_t type_size;       /* bytes per block */
	nx_dequant_fn dequant;  /* NULL: type not supported */
	nx_quant_fn quant;      /* NULL: we cannot produce this type */
	enum nx_type vec_dot_type; /* what activations are quantized to before dot */
	nx_dot_fn dot;          /* weight (this type) . activation (vec_dot_type) */
	nx_dot_rows_fn dot_rows; /* one weight row . several activation rows; NULL iff dot is */
	nx_quant2_fn quant2;    /* NULL: no fused two-part quantizer (activation types have one) */
};

/* Scalar reference traits: always available, the ground truth for SIMD kernels. */
const struct nx_type_traits *nx_type_ref(enum nx_type t);
/* Traits used by the engine: SIMD where the CPU has it, else the reference. */
const struct nx_type_traits *nx_type_get(enum nx_type t);

/* Name for any id (also unsupported ones), "?" when out of range. */
const char *nx_type_name(uint32_t t);
/* True when t is one of the weight types this engine reads. */
bool nx_type_supported(uint32_t t);
/* Bytes for n elements of type t; -1 if n is not a multiple of the block or overflows. */
int64_t nx_row_size(enum nx_type t, int64_t n);

float nx_f16_to_f32(nx_f16 h);
nx_f16 nx_f32_to_f16(float f);
float nx_bf16_to_f32(nx_bf16 h);
nx_bf16 nx_f32_to_bf16(float f);

#endif
