/* adapter.h - LoRA adapters (PEFT safetensors or GGUF) validated against a bound model and converted to f32
 * (or kept in their own 16-bit format).
 *
 * Loading is two-phase, like nx_state_size / nx_state_init, so the floats can
 * live wherever the caller wants (the daemon's shared arena):
 *
 *   struct nx_lora_src src;                        // parse + validate, no big allocation
 *   nx_lora_open(&src, path, model, &err);
 *   size_t n = nx_lora_size(&src);                 // bytes for every A and B, 64-aligned
 *   nx_lora_init(&lora, mem, n, &src, &err);       // converts (f32, or f16/bf16 as stored) into mem
 *   nx_lora_close(&src);                           // lora stays valid: it points into mem only
 *
 * struct nx_lora is plain data (fixed-size table, pointers into mem only), so
 * it can be copied into shared memory as well. The pointers assume mem is
 * mapped at the same address in every process that reads it (the arena is
 * mapped before the workers fork).
 *
 * Formats
 * - PEFT: a directory holding adapter_model.safetensors and adapter_config.json,
 *   or the path of the .safetensors with the config beside it. Config: `r`,
 *   `lora_alpha`, `target_modules` (list, or a regex string which is not
 *   checked), optional `use_rslora`; `rank_pattern` / `alpha_pattern` must be
 *   empty, `use_dora` and `fan_in_fan_out` false. Tensors:
 *   [base_model.model.][model.]layers.N.self_attn.{q,k,v,o}_proj.lora_{A,B}.weight
 *   and ...layers.N.mlp.{gate,up,down}_proj.lora_{A,B}.weight;
 *   A has shape (r, n_in), B (n_out, r).
 * - GGUF (llama.cpp's convert_lora_to_gguf.py): general.type = "adapter",
 *   adapter.type = "lora", adapter.lora.alpha (absent or 0: the scale is the
 *   user's scale alone, as llama.cpp does), general.architecture equal to the
 *   model's. Tensors blk.N.{attn_q,...,ffn_down}.weight.lora_a with
 *   ne = [n_in, r] and .lora_b with ne = [r, n_out] (the same row-major A and B).
 * A and B may be F32, F16 or BF16 (GGUF: any type we can dequantize).
 *
 * Row order of q and k on llama: llama.cpp's converter permutes the rows of
 * q_proj / k_proj of llama models (per head, from HF's rotate-half order to
 * the interleaved pairs GGUF's RoPE rotates), and convert_lora_to_gguf.py
 * permutes lora_B of those modules the same way. A PEFT adapter is in HF's
 * order, so nx_lora_init permutes its q/k B rows like the converter does
 * (qwen2 GGUFs are not permuted, nor are their adapters). A is never permuted.
 *
 * Everything is checked before use: A/B pairs complete, A's rank equal to B's
 * (and to the config's r for PEFT), shapes equal to the base tensor's
 * (n_in/n_out of the model's nx_wt), architecture and hidden size, layer in
 * range, known modules, no tensor twice, finite values. Errors name the tensor
 * and the mismatch. */
#ifndef NX_LORA_ADAPTER_H
#define NX_LORA_ADAPTER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "model/gguf.h"
#include "model/model.h"
#include "kern/quant.h"
#include "lora/safetensors.h"

/* The matrices of a layer an adapter may change. */
enum nx_lora_which {
	NX_LORA_Q,    /* attn_q / q_proj */
	NX_LORA_K,    /* attn_k / k_proj */
	NX_LORA_V,    /* attn_v / v_proj */
	NX_LORA_O,    /* attn_output / o_proj */
	NX_LORA_GATE, /* ffn_gate / gate_proj */
	NX_LORA_UP,   /* ffn_up / up_proj */
	NX_LORA_DOWN, /* ffn_down / down_proj */
	NX_LORA_N_WHICH,
};

#define NX_LORA_MAX_RANK 4096

/* How an adapted matrix's A and B are held: in the file's own 16-bit format
 * when both are stored in it and the runtime delta converts in registers
 * (lora/delta.h: nx_lora_fast16) - each value exact as f32, and half the
 * bytes for the delta to read every token - else as f32. */
enum nx_lora_dtype {
	NX_LORA_F32,
	NX_LORA_F16,
	NX_LORA_BF16,
};

/* One adapted matrix: W (n_out, n_in) becomes W + s * B @ A, where
 * s = user_scale * scale. */
struct nx_lora_t {
	int layer;                  /* -1: this slot is not adapted */
	enum nx_lora_which which;
	int rank;
	int64_t n_in, n_out;        /* of the base W */
	float scale;                /* alpha / rank, or alpha / sqrt(rank) with rslora */
	enum nx_lora_dtype dtype;   /* of a and b */
	void *a;                    /* (rank, n_in) row-major */
	void *b;                    /* (n_out, rank) row-major */
	/* NULL, or B once more in tiles of sixteen rows for the runtime delta
	 * (nx_lora_b_tiled): tile g holds rows [16g, 16g + 16) as (rank, 16), the
	 * sixteen rows' element k side by side; rows past n_out are zeros. */
	void *bt;
};

static inline size_t nx_lora_elt_size(enum nx_lora_dtype d)
{
	return d == NX_LORA_F32 ? sizeof(float) : sizeof(uint16_t);
}

/* Element i of an A or B held as d, as f32 (exact for every dtype). */
static inline float nx_lora_elt(enum nx_lora_dtype d, const void *p, size_t i)
{
	if (d == NX_LORA_F32)
		return ((const float *)p)[i];
	const uint16_t h = ((const uint16_t *)p)[i];
	return d == NX_LORA_F16 ? nx_f16_to_f32(h) : nx_bf16_to_f32(h);
}

/* Whether B of this rank held as d gets a tiled copy (nx_lora_t.bt): when
 * its rows are shorter than a cache line (rank < 32 in f16 / bf16, < 16 in
 * f32), where the delta's B @ u would otherwise spend more on summing each
 * row's lanes than on its multiply-adds, and only with the AVX-512 delta that
 * reads the tiles (nx_lora_fast16, lora/delta.h). */
bool nx_lora_b_tiled(int rank, enum nx_lora_dtype d);

/* Bytes of the tiled copy of an (n_out, rank) B held as d. */
static inline size_t nx_lora_b_tiles_size(int64_t n_out, int rank, enum nx_lora_dtype d)
{
	return (size_t)((n_out + 15) / 16) * 16 * (size_t)rank * nx_lora_elt_size(d);
}

/* bt = B (n_out, rank, held as d) in tiles of sixteen rows (nx_lora_t.bt). */
void nx_lora_b_tile(void *bt, const void *b, int64_t n_out, int rank, enum nx_lora_dtype d);

/* Row r of A or B (row length n) held as d. */
static inline const void *nx_lora_row(enum nx_lora_dtype d, const void *p, int64_t r, int64_t n)
{
	return (const uint8_t *)p + (size_t)r * (size_t)n * nx_lora_elt_size(d);
}

/* t's rows [r0, r1) of B as a matrix of their own (A unchanged); its tiles
 * only when r0 starts one. */
static inline struct nx_lora_t nx_lora_b_rows(const struct nx_lora_t *t, int64_t r0, int64_t r1)
{
	struct nx_lora_t c = *t;
	c.b = (void *)nx_lora_row(t->dtype, t->b, r0, t->rank);
	c.bt = t->bt && r0 % 16 == 0 ? (uint8_t *)t->bt + (size_t)(r0 / 16) * nx_lora_b_tiles_size(16, t->rank, t->dtype)
				     : NULL;
	c.n_out = r1 - r0;
	return c;
}

struct nx_lora {
	char name[64];              /* file name without directory, for listings */
	int rank;                   /* the adapter's rank (the largest, if a GGUF mixes ranks) */
	float alpha;
	bool rslora;
	int n;                      /* adapted matrices */
	size_t a_bytes;             /* A as held, over every adapted matrix */
	struct nx_lora_t t[NX_MAX_LAYERS][NX_LORA_N_WHICH]; /* by layer and matrix; layer -1 when not adapted */
};

/* A parsed, validated adapter waiting to be converted (heap and mappings). */
struct nx_lora_src_t {
	int layer;
	enum nx_lora_which which;
	int rank;
	int64_t n_in, n_out;
	/* A and B as stored: either safetensors (st_dtype) or GGUF (gguf_type) elements. */
	const uint8_t *a, *b;
	bool is_gguf;
	enum nx_st_dtype st_a, st_b;
	enum nx_type gg_a, gg_b;
	char name_a[160], name_b[160];
};

struct nx_lora_src {
	char name[64];
	int rank;
	float alpha;
	bool rslora;
	/* PEFT on llama: B of q/k gets GGUF's row order (see nx_lora_init); heads per matrix. */
	bool permute_qk;
	int n_head, n_head_kv;
	int n;
	struct nx_lora_src_t *t;    /* n entries, heap */
	/* What keeps the bytes alive. */
	struct nx_st_mapped st;
	struct gguf_mapped gg;
	struct nx_st_file st_mem;   /* nx_lora_parse_* over caller memory */
	struct gguf_file gg_mem;
};

/* Opens an adapter file or directory (format by content: GGUF magic, else PEFT)
 * and validates it against m. Only regular files are opened. */
int nx_lora_open(struct nx_lora_src *src, const char *path, const struct nx_model *m, struct nx_err *err);
/* An adapter's files already open (a daemon opens them as its client may,
 * daemon/access.c): data_fd is the GGUF or the PEFT safetensors, config_fd
 * the PEFT adapter_config.json or -1 for a GGUF. The fds stay the caller's;
 * name is for messages. */
struct nx_lora_files {
	const char *name;
	int data_fd;
	int config_fd;
};
int nx_lora_open_files(struct nx_lora_src *src, const struct nx_lora_files *f, const struct nx_model *m,
		       struct nx_err *err);
/* Whether fd is a regular file that starts with the GGUF magic. */
bool nx_lora_fd_is_gguf(int fd);
/* The same over bytes in memory (tests, or a daemon that read the files itself).
 * The bytes must outlive src. config is the adapter_config.json text. */
int nx_lora_parse_peft(struct nx_lora_src *src, const void *st, size_t st_size, const char *config,
		       size_t config_len, const struct nx_model *m, struct nx_err *err);
int nx_lora_parse_gguf(struct nx_lora_src *src, const void *gg, size_t gg_size, const struct nx_model *m,
		       struct nx_err *err);
void nx_lora_close(struct nx_lora_src *src);

/* Bytes nx_lora_init needs for every A and B as held (each 64-byte aligned); 0 on overflow. */
size_t nx_lora_size(const struct nx_lora_src *src);
/* Converts into mem (size >= nx_lora_size, 64-byte aligned) and fills l.
 * Fails (naming the tensor) on a non-finite value. */
int nx_lora_init(struct nx_lora *l, void *mem, size_t size, const struct nx_lora_src *src, struct nx_err *err);

/* Open + size + init into one heap block (*mem, free() it) for tools and tests.
 * l is heap-allocated too (free() it). */
int nx_lora_load(struct nx_lora **l, void **mem, const char *path, const struct nx_model *m, struct nx_err *err);

/* The slot of (layer, which), or NULL when that matrix is not adapted. */
const struct nx_lora_t *nx_lora_get(const struct nx_lora *l, int layer, enum nx_lora_which which);
/* The base weight an adapted matrix changes. */
const struct nx_wt *nx_lora_base(const struct nx_model *m, int layer, enum nx_lora_which which);
/* "attn_q", ... (GGUF names) and "q_proj", ... (PEFT names). */
const char *nx_lora_which_gguf(enum nx_lora_which w);
const char *nx_lora_which_peft(enum nx_lora_which w);

#endif
