/* cpu.c - CPU feature detection (CPUID, XGETBV), NX_KERN, and the table of what each family's kernel sets need. */
#include "kern/cpu.h"

#include "common/env.h"

#include <cpuid.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

/* ---------------------------------------------------------------- detection */

/* XCR0 bits: the register state the OS saves on a context switch. */
#define XS_SSE (1u << 1)
#define XS_YMM (1u << 2)
#define XS_OPMASK (1u << 5)
#define XS_ZMM_HI256 (1u << 6)
#define XS_HI16_ZMM (1u << 7)
#define XS_TILECFG (1u << 17)
#define XS_TILEDATA (1u << 18)

static uint32_t xcr0(void)
{
	uint32_t lo, hi;
	__asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
	return lo;
}

/* The bits and OS checks of libgcc's __builtin_cpu_supports, so that a set is
 * chosen exactly where it was chosen with it. */
static uint32_t detect(void)
{
	uint32_t a, b, c, d, f = 0;
	const uint32_t max = __get_cpuid_max(0, NULL);
	if (max < 1)
		return 0;
	__cpuid(1, a, b, c, d);
	const uint32_t x = c & bit_OSXSAVE ? xcr0() : 0;
	const bool avx_os = (x & (XS_SSE | XS_YMM)) == (XS_SSE | XS_YMM);
	const bool avx512_os = avx_os && (x & (XS_OPMASK | XS_ZMM_HI256 | XS_HI16_ZMM)) ==
						 (XS_OPMASK | XS_ZMM_HI256 | XS_HI16_ZMM);
	const bool amx_os = (x & (XS_TILECFG | XS_TILEDATA)) == (XS_TILECFG | XS_TILEDATA);
	if (avx_os) {
		f |= c & bit_FMA ? NX_CPU_FMA : 0;
		f |= c & bit_F16C ? NX_CPU_F16C : 0;
	}
	if (max < 7)
		return f;
	uint32_t sub;
	__cpuid_count(7, 0, sub, b, c, d);
	if (avx_os)
		f |= b & bit_AVX2 ? NX_CPU_AVX2 : 0;
	if (avx512_os) {
		f |= b & bit_AVX512F ? NX_CPU_AVX512F : 0;
		f |= b & bit_AVX512BW ? NX_CPU_AVX512BW : 0;
		f |= b & bit_AVX512VL ? NX_CPU_AVX512VL : 0;
		f |= b & bit_AVX512DQ ? NX_CPU_AVX512DQ : 0;
		f |= c & bit_AVX512VNNI ? NX_CPU_AVX512VNNI : 0;
		f |= d & (1u << 23) ? NX_CPU_AVX512FP16 : 0;
	}
	if (amx_os) {
		f |= d & (1u << 24) ? NX_CPU_AMX_TILE : 0;
		f |= d & (1u << 25) ? NX_CPU_AMX_INT8 : 0;
		f |= d & (1u << 22) ? NX_CPU_AMX_BF16 : 0;
	}
	if (sub >= 1) {
		__cpuid_count(7, 1, a, b, c, d);
		if (avx512_os)
			f |= a & (1u << 5) ? NX_CPU_AVX512BF16 : 0;
	}
	return f;
}

/* NX_CPU_AMX_PERM once Linux has given the tile state (nx_cpu_amx_request). */
static _Atomic uint32_t amx_perm;
/* Each family's set + 1 once chosen (nx_kern_set); lock-free for the reason features is. */
static _Atomic uint8_t chosen[NX_KFAM_N];

/* arch/x86/include/uapi/asm/prctl.h, and the tile data's XSTATE component */
#define ARCH_GET_XCOMP_PERM 0x1022
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

bool nx_cpu_amx_request(void)
{
	const uint32_t need = NX_CPU_AMX_TILE | NX_CPU_AMX_INT8;
	if ((nx_cpu_features() & need) != need)
		return false;
	uint64_t perm = 0;
	if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0 ||
	    syscall(SYS_arch_prctl, ARCH_GET_XCOMP_PERM, &perm) != 0 || !(perm & (1ull << XFEATURE_XTILEDATA)))
		return false;
	if (!atomic_exchange(&amx_perm, NX_CPU_AMX_PERM))
		for (int f = 0; f < NX_KFAM_N; f++) /* a choice made before the permission is made again */
			atomic_store(&chosen[f], 0);
	return true;
}

/* Features | KNOWN once detected. Without pthread_once: it would end with a
 * private futex wake, which the worker sandbox does not allow; every caller
 * computes the same value. */
#define KNOWN (1u << 31)
static _Atomic uint32_t features;

uint32_t nx_cpu_features(void)
{
	uint32_t f = atomic_load_explicit(&features, memory_order_relaxed);
	if (!f) {
		f = detect() | KNOWN;
		atomic_store_explicit(&features, f, memory_order_relaxed);
	}
	return (f & ~KNOWN) | atomic_load_explicit(&amx_perm, memory_order_relaxed);
}

/* ---------------------------------------------------------------- the table */

static const char *const kset_names[NX_KSET_N] = { "ref", "avx2", "avx512", "amx" };

const char *nx_kset_name(enum nx_kset k)
{
	return (unsigned)k < NX_KSET_N ? kset_names[k] : "?";
}

int nx_kset_parse(const char *name)
{
	for (int k = 0; k < NX_KSET_N; k++)
		if (!strcmp(name, kset_names[k]))
			return k;
	return -1;
}

/* What each set's kernels are compiled for (their target attributes). */
#define AVX2_SET (NX_CPU_AVX2 | NX_CPU_FMA | NX_CPU_F16C)
#define AVX512_CORE (NX_CPU_AVX512F | NX_CPU_AVX512BW | NX_CPU_AVX512VL)
#define AVX512_SET (AVX2_SET | AVX512_CORE | NX_CPU_AVX512DQ | NX_CPU_AVX512VNNI)
#define AMX_SET (AVX512_SET | NX_CPU_AMX_TILE | NX_CPU_AMX_INT8 | NX_CPU_AMX_PERM)
#define NONE (1u << 31) /* the family has no kernel in that set */

/* What family f's kernel in set k needs. The reference needs nothing. A
 * family's stronger set needs all its weaker one does (tests/c/test_cpu.c),
 * so a CPU runs the sets of a family up to some point and none after it. */
static const struct {
	const char *name;
	uint32_t need[NX_KSET_N];
} families[NX_KFAM_N] = {
	[NX_KFAM_DOT] = { "dot", { 0, AVX2_SET, AVX512_SET, NONE } },
	/* rmsnorm and the side values need less, but go with the dot kernels' sets */
	[NX_KFAM_NORM] = { "norm", { 0, AVX2_SET, AVX512_SET, NONE } },
	/* amx: the AVX-512 kernels, and the AMX ones for steps of many tokens (kern/pack.h) */
	[NX_KFAM_PACK] = { "pack", { 0, NONE, AVX512_SET, AMX_SET } },
	[NX_KFAM_PACK_ACT] = { "pack_act", { 0, AVX2_SET, NONE, NONE } },
	[NX_KFAM_ATTN] = { "attn", { 0, NONE, AVX2_SET | AVX512_CORE | NX_CPU_AVX512DQ, NONE } },
	/* the reference is plain vectors of eight floats (lora/delta.c) */
	[NX_KFAM_LORA] = { "lora", { 0, NONE, AVX512_CORE | NX_CPU_F16C, NONE } },
};

const char *nx_kfamily_name(enum nx_kfamily f)
{
	return (unsigned)f < NX_KFAM_N ? families[f].name : "?";
}

bool nx_kern_runs(enum nx_kfamily f, enum nx_kset k, uint32_t feat)
{
	if ((unsigned)f >= NX_KFAM_N || (unsigned)k >= NX_KSET_N)
		return false;
	const uint32_t need = families[f].need[k];
	return (need & (feat & NX_CPU_ALL)) == need;
}

enum nx_kset nx_kern_pick(enum nx_kfamily f, uint32_t feat, enum nx_kset cap)
{
	int k = (unsigned)cap < NX_KSET_N ? (int)cap : NX_KSET_N - 1;
	while (k > NX_KSET_REF && !nx_kern_runs(f, (enum nx_kset)k, feat))
		k--;
	return (enum nx_kset)k;
}

/* ---------------------------------------------------------------- the engine's */

enum nx_kset nx_kern_cap(void)
{
	const char *want = nx_env()->kern;
	const int k = want ? nx_kset_parse(want) : -1;
	return k < 0 ? (enum nx_kset)(NX_KSET_N - 1) : (enum nx_kset)k;
}

int nx_kern_env_check(struct nx_err *err)
{
	const char *want = nx_env()->kern;
	if (want && nx_kset_parse(want) < 0)
		return nx_errf(err, "NX_KERN=%s is not a kernel set (ref, avx2, avx512, amx): ignored", want);
	return 0;
}

enum nx_kset nx_kern_set(enum nx_kfamily f)
{
	if ((unsigned)f >= NX_KFAM_N)
		return NX_KSET_REF;
	int c = atomic_load_explicit(&chosen[f], memory_order_relaxed);
	if (!c) {
		c = 1 + (int)nx_kern_pick(f, nx_cpu_features(), nx_kern_cap());
		atomic_store_explicit(&chosen[f], (uint8_t)c, memory_order_relaxed);
	}
	return (enum nx_kset)(c - 1);
}
