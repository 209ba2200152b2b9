/* test_cpu.c - kern/cpu.c: the kernel set each family runs for given CPU features and NX_KERN,
 * detection against GCC's __builtin_cpu_supports, and NX_KERN in the environment end to end. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "kern/attn.h"
#include "kern/cpu.h"
#include "kern/pack.h"
#include "kern/quant.h"
#include "lora/delta.h"

void nx_kern_avx2_install(struct nx_type_traits *tab, size_t n);
void nx_kern_avx512_install(struct nx_type_traits *tab, size_t n);

#define REF NX_KSET_REF
#define AVX2 NX_KSET_AVX2
#define AVX512 NX_KSET_AVX512
#define AMX NX_KSET_AMX

#define F_AVX2 (NX_CPU_AVX2 | NX_CPU_FMA | NX_CPU_F16C)
#define F_SKX (F_AVX2 | NX_CPU_AVX512F | NX_CPU_AVX512BW | NX_CPU_AVX512VL | NX_CPU_AVX512DQ)
#define F_ICX (F_SKX | NX_CPU_AVX512VNNI)
#define F_SPR (F_ICX | NX_CPU_AVX512BF16 | NX_CPU_AVX512FP16 | NX_CPU_AMX_TILE | NX_CPU_AMX_INT8 | NX_CPU_AMX_BF16)

/* Per family (dot, norm, pack, pack_act, attn, lora): the set it runs. */
static const struct {
	const char *cpu;
	uint32_t feat;
	enum nx_kset cap;
	enum nx_kset want[NX_KFAM_N];
} cases[] = {
	{ "x86-64 baseline", 0, AVX512, { REF, REF, REF, REF, REF, REF } },
	{ "AVX2 without FMA", NX_CPU_AVX2 | NX_CPU_F16C, AVX512, { REF, REF, REF, REF, REF, REF } },
	{ "Haswell / Zen 2", F_AVX2, AVX512, { AVX2, AVX2, REF, AVX2, REF, REF } },
	/* AVX-512 without VNNI: the dots and tiles stay AVX2, attention and the delta take AVX-512 */
	{ "Skylake-X", F_SKX, AVX512, { AVX2, AVX2, REF, AVX2, AVX512, AVX512 } },
	{ "Ice Lake / Zen 4", F_ICX, AVX512, { AVX512, AVX512, AVX512, AVX2, AVX512, AVX512 } },
	{ "Sapphire Rapids", F_SPR, AVX512, { AVX512, AVX512, AVX512, AVX2, AVX512, AVX512 } },
	{ "every bit", ~0u, AVX512, { AVX512, AVX512, AVX512, AVX2, AVX512, AVX512 } },
	/* the tiles only with Linux's permission, and only for the pack family */
	{ "Sapphire Rapids, tiles permitted", F_SPR | NX_CPU_AMX_PERM, AMX, { AVX512, AVX512, AMX, AVX2, AVX512, AVX512 } },
	{ "Sapphire Rapids, no permission", F_SPR, AMX, { AVX512, AVX512, AVX512, AVX2, AVX512, AVX512 } },
	{ "tiles permitted, no AMX-INT8", (F_SPR & ~NX_CPU_AMX_INT8) | NX_CPU_AMX_PERM, AMX,
	  { AVX512, AVX512, AVX512, AVX2, AVX512, AVX512 } },
	{ "AMX without VNNI", (F_SKX | NX_CPU_AMX_TILE | NX_CPU_AMX_INT8 | NX_CPU_AMX_PERM), AMX,
	  { AVX2, AVX2, REF, AVX2, AVX512, AVX512 } },
	{ "every bit, uncapped", ~0u, AMX, { AVX512, AVX512, AMX, AVX2, AVX512, AVX512 } },
	/* what each family needs, taken one at a time */
	{ "Ice Lake, no DQ", F_ICX & ~NX_CPU_AVX512DQ, AVX512, { AVX2, AVX2, REF, AVX2, REF, AVX512 } },
	{ "Ice Lake, no F16C", F_ICX & ~NX_CPU_F16C, AVX512, { REF, REF, REF, REF, REF, REF } },
	{ "Ice Lake, no FMA", F_ICX & ~NX_CPU_FMA, AVX512, { REF, REF, REF, REF, REF, AVX512 } },
	{ "AVX-512 F/BW/VL + F16C only", NX_CPU_AVX512F | NX_CPU_AVX512BW | NX_CPU_AVX512VL | NX_CPU_F16C, AVX512,
	  { REF, REF, REF, REF, REF, AVX512 } },
	{ "AMX alone", NX_CPU_AMX_TILE | NX_CPU_AMX_INT8 | NX_CPU_AMX_BF16, AVX512, { REF, REF, REF, REF, REF, REF } },
	/* NX_KERN caps every family */
	{ "Sapphire Rapids, NX_KERN=avx512", F_SPR | NX_CPU_AMX_PERM, AVX512,
	  { AVX512, AVX512, AVX512, AVX2, AVX512, AVX512 } },
	{ "Sapphire Rapids, NX_KERN=avx2", F_SPR, AVX2, { AVX2, AVX2, REF, AVX2, REF, REF } },
	{ "Sapphire Rapids, NX_KERN=ref", F_SPR, REF, { REF, REF, REF, REF, REF, REF } },
	{ "Skylake-X, NX_KERN=avx2", F_SKX, AVX2, { AVX2, AVX2, REF, AVX2, REF, REF } },
	{ "Haswell, NX_KERN=avx512", F_AVX2, AVX512, { AVX2, AVX2, REF, AVX2, REF, REF } },
	{ "Haswell, NX_KERN=ref", F_AVX2, REF, { REF, REF, REF, REF, REF, REF } },
};

static void test_table(void **state)
{
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		for (int f = 0; f < NX_KFAM_N; f++) {
			const enum nx_kset got = nx_kern_pick((enum nx_kfamily)f, cases[i].feat, cases[i].cap);
			if (got != cases[i].want[f])
				fail_msg("%s: %s runs %s, want %s", cases[i].cpu, nx_kfamily_name((enum nx_kfamily)f),
					 nx_kset_name(got), nx_kset_name(cases[i].want[f]));
		}
}

/* Every feature combination: a family's stronger set runs only where its weaker
 * ones do (so picking the strongest is the weakest-first walk that stops at the
 * first set the CPU cannot run), and the pick is a set the family has and runs. */
static void test_monotone(void **state)
{
	for (uint32_t feat = 0; feat <= NX_CPU_ALL; feat++)
		for (int f = 0; f < NX_KFAM_N; f++) {
			const enum nx_kfamily fam = (enum nx_kfamily)f;
			assert_true(nx_kern_runs(fam, REF, feat));
			for (int lo = 0; lo < NX_KSET_N; lo++)
				for (int hi = lo + 1; hi < NX_KSET_N; hi++)
					if (nx_kern_runs(fam, (enum nx_kset)lo, NX_CPU_ALL) &&
					    nx_kern_runs(fam, (enum nx_kset)hi, feat))
						assert_true(nx_kern_runs(fam, (enum nx_kset)lo, feat));
			for (int cap = 0; cap < NX_KSET_N; cap++) {
				const enum nx_kset k = nx_kern_pick(fam, feat, (enum nx_kset)cap);
				assert_true((int)k <= cap && nx_kern_runs(fam, k, feat));
			}
		}
}

static void test_names(void **state)
{
	for (int k = 0; k < NX_KSET_N; k++)
		assert_int_equal(nx_kset_parse(nx_kset_name((enum nx_kset)k)), k);
	assert_string_equal(nx_kset_name(REF), "ref");
	assert_string_equal(nx_kset_name(AVX2), "avx2");
	assert_string_equal(nx_kset_name(AVX512), "avx512");
	assert_string_equal(nx_kset_name(AMX), "amx");
	assert_int_equal(nx_kset_parse("AVX2"), -1);
	assert_int_equal(nx_kset_parse("avx512f"), -1);
	assert_int_equal(nx_kset_parse(""), -1);
}

/* The detection is GCC's, bit for bit, on this machine. */
static void test_detect(void **state)
{
	__builtin_cpu_init();
	const uint32_t f = nx_cpu_features();
	const struct {
		uint32_t bit;
		int gcc;
	} bits[] = {
		{ NX_CPU_AVX2, __builtin_cpu_supports("avx2") },
		{ NX_CPU_FMA, __builtin_cpu_supports("fma") },
		{ NX_CPU_F16C, __builtin_cpu_supports("f16c") },
		{ NX_CPU_AVX512F, __builtin_cpu_supports("avx512f") },
		{ NX_CPU_AVX512BW, __builtin_cpu_supports("avx512bw") },
		{ NX_CPU_AVX512VL, __builtin_cpu_supports("avx512vl") },
		{ NX_CPU_AVX512DQ, __builtin_cpu_supports("avx512dq") },
		{ NX_CPU_AVX512VNNI, __builtin_cpu_supports("avx512vnni") },
		{ NX_CPU_AVX512BF16, __builtin_cpu_supports("avx512bf16") },
		{ NX_CPU_AVX512FP16, __builtin_cpu_supports("avx512fp16") },
		{ NX_CPU_AMX_TILE, __builtin_cpu_supports("amx-tile") },
		{ NX_CPU_AMX_INT8, __builtin_cpu_supports("amx-int8") },
		{ NX_CPU_AMX_BF16, __builtin_cpu_supports("amx-bf16") },
		{ NX_CPU_AMX_PERM, 0 }, /* not a CPUID bit: only once asked for (test_amx_request) */
	};
	uint32_t all = 0;
	for (size_t i = 0; i < sizeof(bits) / sizeof(bits[0]); i++) {
		if (!(f & bits[i].bit) != !bits[i].gcc)
			fail_msg("feature bit 0x%x: nx_cpu_features %d, __builtin_cpu_supports %d", bits[i].bit,
				 !!(f & bits[i].bit), !!bits[i].gcc);
		all |= bits[i].bit;
	}
	assert_int_equal(all, NX_CPU_ALL);
	assert_int_equal(f & ~NX_CPU_ALL, 0);
	print_message("this CPU: dot %s, norm %s, pack %s, pack_act %s, attn %s, lora %s\n",
		      nx_kset_name(nx_kern_pick(NX_KFAM_DOT, f, AVX512)), nx_kset_name(nx_kern_pick(NX_KFAM_NORM, f, AVX512)),
		      nx_kset_name(nx_kern_pick(NX_KFAM_PACK, f, AVX512)),
		      nx_kset_name(nx_kern_pick(NX_KFAM_PACK_ACT, f, AVX512)),
		      nx_kset_name(nx_kern_pick(NX_KFAM_ATTN, f, AVX512)), nx_kset_name(nx_kern_pick(NX_KFAM_LORA, f, AVX512)));
}

/* ---------------------------------------------------------------- NX_KERN end to end */

/* In a child started with NX_KERN set: the cap is `cap`, every family runs its
 * pick, and the engine's kernels are that set's. Returns a message or NULL. */
static const char *child_check(enum nx_kset cap, bool bad_name)
{
	static char msg[256];
	struct nx_err err = { { 0 } };
	if (nx_kern_cap() != cap)
		return "nx_kern_cap is not NX_KERN's set";
	if ((nx_kern_env_check(&err) < 0) != bad_name)
		return bad_name ? "a name of no set passed nx_kern_env_check" : "nx_kern_env_check failed";
	if (bad_name && !strstr(err.msg, "NX_KERN="))
		return "nx_kern_env_check's message does not name NX_KERN";
	const uint32_t feat = nx_cpu_features();
	enum nx_kset pick[NX_KFAM_N];
	for (int f = 0; f < NX_KFAM_N; f++) {
		pick[f] = nx_kern_pick((enum nx_kfamily)f, feat, cap);
		if (nx_kern_set((enum nx_kfamily)f) != pick[f]) {
			snprintf(msg, sizeof(msg), "%s: the engine runs %s, the table says %s",
				 nx_kfamily_name((enum nx_kfamily)f), nx_kset_name(nx_kern_set((enum nx_kfamily)f)),
				 nx_kset_name(pick[f]));
			return msg;
		}
	}
	/* the type table: the reference with each set up to the pick laid over it */
	struct nx_type_traits want[64] = { { 0 } };
	for (int t = 0; t < 64; t++)
		if (nx_type_ref((enum nx_type)t))
			want[t] = *nx_type_ref((enum nx_type)t);
	if (pick[NX_KFAM_DOT] >= AVX2)
		nx_kern_avx2_install(want, 64);
	if (pick[NX_KFAM_DOT] >= AVX512)
		nx_kern_avx512_install(want, 64);
	for (int t = 0; t < 64; t++)
		if (nx_type_ref((enum nx_type)t) && nx_type_get((enum nx_type)t)->dot != want[t].dot)
			return "the type table's dot kernels are not the picked set's";
	if (nx_pack_fast(NX_Q4_0) != (pick[NX_KFAM_PACK] == AVX512))
		return "nx_pack_fast disagrees with the pack family's set";
	if (nx_attn_fast(64) != (pick[NX_KFAM_ATTN] == AVX512))
		return "nx_attn_fast disagrees with the attn family's set";
	if (nx_lora_fast16() != (pick[NX_KFAM_LORA] == AVX512))
		return "nx_lora_fast16 disagrees with the lora family's set";
	return NULL;
}

static const char *self;

/* Runs this binary as a child with NX_KERN=value (NULL: unset); it must see cap. */
static void run_child(const char *value, enum nx_kset cap, bool bad_name)
{
	char cap_arg[8], bad_arg[8];
	snprintf(cap_arg, sizeof(cap_arg), "%d", (int)cap);
	snprintf(bad_arg, sizeof(bad_arg), "%d", (int)bad_name);
	const pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		if (value)
			setenv("NX_KERN", value, 1);
		else
			unsetenv("NX_KERN");
		execl(self, self, "--child", cap_arg, bad_arg, (char *)NULL);
		_exit(127);
	}
	int st;
	assert_int_equal(waitpid(pid, &st, 0), pid);
	if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
		fail_msg("NX_KERN=%s: the child failed (status 0x%x)", value ? value : "(unset)", st);
}

static void test_nx_kern(void **state)
{
	run_child(NULL, AMX, false); /* no cap: the strongest the CPU runs */
	run_child("", AMX, false);
	run_child("amx", AMX, false);
	run_child("avx512", AVX512, false);
	run_child("avx2", AVX2, false);
	run_child("ref", REF, false);
	run_child("avx-512", AMX, true); /* ignored, and reported */
	run_child("REF", AMX, true);
}

/* Linux's permission for the tile state: asked for only where the CPU has
 * AMX-INT8, and once given, the pack family's choice is made again with it. */
static void test_amx_request(void **state)
{
	const uint32_t need = NX_CPU_AMX_TILE | NX_CPU_AMX_INT8;
	const bool has = (nx_cpu_features() & need) == need;
	(void)nx_kern_set(NX_KFAM_PACK); /* a choice made before the request */
	const bool got = nx_cpu_amx_request();
	assert_int_equal(!!(nx_cpu_features() & NX_CPU_AMX_PERM), got);
	assert_int_equal(nx_kern_set(NX_KFAM_PACK), nx_kern_pick(NX_KFAM_PACK, nx_cpu_features(), nx_kern_cap()));
	if (!has) {
		assert_false(got);
		print_message("AMX: not available on this CPU (the tile state is not asked for; the pack family runs %s)\n",
			      nx_kset_name(nx_kern_set(NX_KFAM_PACK)));
		return;
	}
	assert_true(got); /* Linux 5.16 and later give it */
	assert_true(nx_cpu_amx_request());
	print_message("AMX: the tile state given; the pack family runs %s\n", nx_kset_name(nx_kern_set(NX_KFAM_PACK)));
}

int main(int argc, char **argv)
{
	if (argc == 4 && !strcmp(argv[1], "--child")) {
		const char *m = child_check((enum nx_kset)atoi(argv[2]), atoi(argv[3]));
		if (m)
			fprintf(stderr, "NX_KERN=%s: %s\n", getenv("NX_KERN") ? getenv("NX_KERN") : "(unset)", m);
		return m ? 1 : 0;
	}
	self = "/proc/self/exe";
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_table),
		cmocka_unit_test(test_monotone),
		cmocka_unit_test(test_names),
		cmocka_unit_test(test_detect),
		cmocka_unit_test(test_nx_kern),
		cmocka_unit_test(test_amx_request),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
