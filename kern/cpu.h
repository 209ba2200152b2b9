/* cpu.h - the CPU's features, detected once, and the one table of which kernel set each family of kernels runs. */
#ifndef NX_CPU_H
#define NX_CPU_H

#include <stdbool.h>
#include <stdint.h>

#include "common/err.h"

/* What the kernels may need, as CPUID reports it and only where the OS saves
 * the registers it uses (XCR0: ymm for AVX2, FMA and F16C; opmask and zmm for
 * AVX-512; the tile state for AMX), as __builtin_cpu_supports answers. */
enum nx_cpu_feature {
	NX_CPU_AVX2 = 1u << 0,
	NX_CPU_FMA = 1u << 1,
	NX_CPU_F16C = 1u << 2,
	NX_CPU_AVX512F = 1u << 3,
	NX_CPU_AVX512BW = 1u << 4,
	NX_CPU_AVX512VL = 1u << 5,
	NX_CPU_AVX512DQ = 1u << 6,
	NX_CPU_AVX512VNNI = 1u << 7,
	NX_CPU_AVX512BF16 = 1u << 8,
	NX_CPU_AVX512FP16 = 1u << 9,
	NX_CPU_AMX_TILE = 1u << 10,
	NX_CPU_AMX_INT8 = 1u << 11,
	NX_CPU_AMX_BF16 = 1u << 12,
	/* Linux gave this process the tile data state (nx_cpu_amx_request): a
	 * tile instruction without it is fatal. Not a CPUID bit. */
	NX_CPU_AMX_PERM = 1u << 13,
};
#define NX_CPU_ALL ((1u << 14) - 1)

/* This CPU's features (enum nx_cpu_feature bits): detected on the first call,
 * without locks or syscalls (a worker in its sandbox may be the first). */
uint32_t nx_cpu_features(void);

/* Asks Linux for the tile data state (arch_prctl(ARCH_REQ_XCOMP_PERM,
 * XFEATURE_XTILEDATA)) where the CPU has AMX and the OS saves its state, so
 * that NX_CPU_AMX_PERM is set; true when it is. Call it at start, before any
 * kernel is chosen and before the seccomp filter: the permission and the
 * choice then hold for the forked workers. Idempotent. */
bool nx_cpu_amx_request(void);

/* Kernel sets, weakest first. A set may only swap kernels for faster ones
 * computing the same thing: layouts and results are the reference's. */
enum nx_kset {
	NX_KSET_REF,    /* the scalar references, or plain vectors */
	NX_KSET_AVX2,
	NX_KSET_AVX512,
	NX_KSET_AMX,    /* AVX-512 with AMX-INT8 tiles for steps of many tokens (the pack family only) */
	NX_KSET_N,
};

/* "ref", "avx2", "avx512", "amx". */
const char *nx_kset_name(enum nx_kset k);
/* The set of that name, or -1. */
int nx_kset_parse(const char *name);

/* The families of kernels that choose a set at run time. */
enum nx_kfamily {
	NX_KFAM_DOT,      /* the type table's dequant / quant / dot kernels (kern/quant.h) */
	NX_KFAM_NORM,     /* rmsnorm (kern/norm.h) */
	NX_KFAM_PACK,     /* the packed tile kernels (kern/pack.h) */
	NX_KFAM_PACK_ACT, /* their activations' side values (kern/pack_act.h) */
	NX_KFAM_ATTN,     /* f16 attention (kern/attn.h) */
	NX_KFAM_LORA,     /* the runtime LoRA delta (lora/delta.h) */
	NX_KFAM_N,
};

const char *nx_kfamily_name(enum nx_kfamily f);

/* Whether family f has a kernel in set k that a CPU with features feat runs. */
bool nx_kern_runs(enum nx_kfamily f, enum nx_kset k, uint32_t feat);

/* The set family f runs on a CPU with features feat when NX_KERN caps the
 * sets at cap: the strongest at or below cap that it has and feat runs. */
enum nx_kset nx_kern_pick(enum nx_kfamily f, uint32_t feat, enum nx_kset cap);

/* NX_KERN's cap (common/env.h): the set it names; unset, empty or a name of
 * no set: the strongest (nx_kern_env_check reports the last). */
enum nx_kset nx_kern_cap(void);

/* The engine's choice for family f: nx_kern_pick(f, nx_cpu_features(), nx_kern_cap()). */
enum nx_kset nx_kern_set(enum nx_kfamily f);

/* -1, and a message for err, when NX_KERN is set to a name of no set. */
int nx_kern_env_check(struct nx_err *err);

#endif
