/* test_pack_amx.c - the AMX tile kernels (kern/pack_amx.c) bit-identical to the packed reference
 * and to the AVX-512 kernels, for every count of tokens per call (1..16), both
 * activation forms and every type they cover. Run twice over: with each tile
 * instruction emulated (on any CPU with the AVX-512 kernels: the layouts,
 * strides and rows), and with the tiles themselves where the CPU has AMX-INT8
 * and Linux gives the tile state (skipped, saying so, elsewhere). And the
 * engine's start-up check of them (nx_pack_amx_check). */
#include <math.h>
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

#include "kern/cpu.h"
#include "kern/pack.h"
#include "tests/c/pack_acts.h"

static const enum nx_type types[] = {NX_Q4_0, NX_Q4_1, NX_Q5_0, NX_Q5_1, NX_Q8_0, NX_IQ4_NL, NX_Q4_K, NX_Q5_K, NX_Q6_K};
#define N_TYPES 9

/* The f16 scales of a block (d, and q4_1's / q5_1's m, q4_k's / q5_k's dmin), finite and small. */
static void set_scales(enum nx_type t, uint8_t *blk)
{
	const nx_f16 d = nx_f32_to_f16(0.001f + 0.01f * fabsf(rng_sym())), m = nx_f32_to_f16(0.01f * rng_sym());
	memcpy(t == NX_Q6_K ? blk + offsetof(struct nx_block_q6_k, d) : blk, &d, 2);
	if (t == NX_Q4_1 || t == NX_Q5_1 || t == NX_Q4_K || t == NX_Q5_K)
		memcpy(blk + 2, &m, 2);
}

/* n_out rows packed: random_bytes, every byte random but the scales; else quantized weight-like rows. */
static uint8_t *packed_rows(enum nx_type t, int n_out, int64_t n_in, bool random_bytes)
{
	const struct nx_type_traits *tr = nx_type_ref(t);
	const size_t rb = (size_t)nx_row_size(t, n_in);
	uint8_t *plain = malloc(rb * n_out), *packed = malloc(rb * n_out);
	float *x = malloc(sizeof(float) * n_in);
	for (int r = 0; r < n_out; r++) {
		uint8_t *row = plain + r * rb;
		if (random_bytes) {
			for (size_t k = 0; k < rb; k++)
				row[k] = (uint8_t)rng_next();
			for (size_t b = 0; b < rb / tr->type_size; b++)
				set_scales(t, row + b * tr->type_size);
		} else {
			for (int64_t i = 0; i < n_in; i++)
				x[i] = 0.02f * (1 + r % 5) * rng_sym() + (i % 97 == 0 ? 0.3f * rng_sym() : 0);
			tr->quant(x, row, n_in);
		}
	}
	for (int g = 0; g < n_out / NX_PACK_ROWS; g++)
		nx_pack_group(t, plain + (size_t)g * NX_PACK_ROWS * rb, rb, packed + (size_t)g * NX_PACK_ROWS * rb, n_in);
	free(x);
	free(plain);
	return packed;
}

/* The AMX kernels (emulated or not) against the reference (one token per call),
 * bit for bit, for na = 1..16 tokens from several first tokens. */
static void check(bool emulated)
{
	const char *what = emulated ? "emulated" : "tiles";
	static const int64_t lens[] = {256, 512, 1536};
	for (int ti = 0; ti < N_TYPES; ti++)
		for (int li = 0; li < 3; li++)
			for (int rnd = 0; rnd < 4; rnd++) {
				const enum nx_type t = types[ti];
				const int64_t n_in = lens[li];
				const size_t rb = (size_t)nx_row_size(t, n_in);
				const int n_tot = 21;
				uint8_t *packed = packed_rows(t, 32, n_in, rnd & 1);
				struct acts x;
				acts_make(&x, n_tot, n_in, rnd & 1);
				if (rnd >= 2)
					acts_zero_lo(&x, n_tot, n_in);
				const nx_pack_fn kern = nx_pack_amx_kernel(t, emulated);
				assert_non_null(kern);
				float want[21 * 16], got[NX_PACK_AMX_MAX * NX_PACK_ROWS];
				for (int g = 0; g < 2; g++) {
					const uint8_t *grp = packed + (size_t)g * 16 * rb;
					for (int i = 0; i < n_tot; i++) {
						struct nx_pack_act a = acts_from(&x, i);
						nx_pack_kernel_ref(t)(grp, &a, 1, want + i * 16, n_in);
					}
					for (int na = 1; na <= NX_PACK_AMX_MAX; na++)
						for (int i0 = 0; i0 + na <= n_tot; i0 += 5) {
							struct nx_pack_act a = acts_from(&x, i0);
							memset(got, 0xff, sizeof(got));
							kern(grp, &a, na, got, n_in);
							if (memcmp(got, want + i0 * 16, sizeof(float) * 16 * na)) {
								for (int k = 0; k < 16 * na; k++)
									if (memcmp(&got[k], &want[i0 * 16 + k], sizeof(float)))
										print_error("%s %s n_in %lld %s%s na %d i0 %d: row %d act %d amx %.9g ref %.9g\n",
											    what, nx_type_name(t), (long long)n_in,
											    rnd & 1 ? "random" : "quantized", rnd & 2 ? " one-part" : "",
											    na, i0, k % 16, i0 + k / 16, got[k], want[i0 * 16 + k]);
								fail();
							}
						}
				}
				acts_free(&x);
				free(packed);
			}
}

/* The AMX kernels exist for their types only; the engine offers them only where the pack family runs amx. */
static void test_coverage(void **state)
{
	(void)state;
	for (int ti = 0; ti < N_TYPES; ti++) {
		assert_non_null(nx_pack_amx_kernel(types[ti], true));
		assert_non_null(nx_pack_amx_kernel(types[ti], false));
	}
	assert_null(nx_pack_amx_kernel(NX_Q2_K, true));
	assert_null(nx_pack_amx_kernel(NX_IQ4_XS, false));
	assert_null(nx_pack_amx_kernel(NX_F16, false));
	if (nx_kern_set(NX_KFAM_PACK) != NX_KSET_AMX)
		assert_null(nx_pack_kernel_amx(NX_Q4_0));
	else
		assert_ptr_equal(nx_pack_kernel_amx(NX_Q4_0), nx_pack_amx_kernel(NX_Q4_0, false));
}

static void test_emulated_exact(void **state)
{
	(void)state;
	if (nx_kern_set(NX_KFAM_PACK) < NX_KSET_AVX512) {
		print_message("no AVX-512 tile kernels on this CPU: the AMX kernels' float steps need them; skipped\n");
		skip();
	}
	check(true);
}

/* The AVX-512 kernels in calls of up to NX_PACK_ACT_MAX tokens, against the reference as above: what the AMX kernels stand in for. */
static void test_avx512_beside(void **state)
{
	(void)state;
	if (!nx_pack_fast(NX_Q4_0)) {
		print_message("no AVX-512 tile kernels on this CPU; skipped\n");
		skip();
	}
	static const int64_t n_in = 512;
	for (int ti = 0; ti < N_TYPES; ti++) {
		const enum nx_type t = types[ti];
		uint8_t *packed = packed_rows(t, 16, n_in, false);
		struct acts x;
		acts_make(&x, 16, n_in, false);
		float simd[16 * 16], amx[16 * 16];
		for (int i0 = 0; i0 < 16; i0 += NX_PACK_ACT_MAX) {
			struct nx_pack_act a = acts_from(&x, i0);
			nx_pack_kernel(t)(packed, &a, NX_PACK_ACT_MAX, simd + i0 * 16, n_in);
		}
		nx_pack_amx_kernel(t, true)(packed, &x.a, 16, amx, n_in);
		assert_memory_equal(simd, amx, sizeof(simd));
		acts_free(&x);
		free(packed);
	}
}

static void test_tiles_exact(void **state)
{
	(void)state;
	if (nx_kern_set(NX_KFAM_PACK) != NX_KSET_AMX) {
		const uint32_t need = NX_CPU_AMX_TILE | NX_CPU_AMX_INT8;
		print_message("AMX: not available (%s): the tile instructions are not run here\n",
			      (nx_cpu_features() & need) != need ? "the CPU has no AMX-INT8"
			      : !(nx_cpu_features() & NX_CPU_AMX_PERM) ? "Linux refused the tile state"
								       : "NX_KERN below amx");
		skip();
	}
	check(false);
}

/* The start-up check (nx_pack_amx_check) in a child whose engine offers the
 * emulated kernels (NXD_TEST_AMX_EMULATE, read before main): they agree, and
 * stay offered. Where the CPU runs the tiles, the child checks those. */
static const char *self;

static int child_check(void)
{
	nx_cpu_amx_request();
	struct nx_err err = {{0}};
	if (!nx_pack_kernel_amx(NX_Q4_K) || !nx_pack_kernel_amx(NX_Q6_K))
		return fprintf(stderr, "no AMX kernel offered with NXD_TEST_AMX_EMULATE\n"), 1;
	if (nx_pack_amx_check(&err) < 0)
		return fprintf(stderr, "%s\n", err.msg), 1;
	return nx_pack_kernel_amx(NX_Q4_0) ? 0 : 1;
}

static void test_startup_check(void **state)
{
	(void)state;
	if (nx_kern_set(NX_KFAM_PACK) < NX_KSET_AVX512) {
		print_message("no AVX-512 tile kernels on this CPU; skipped\n");
		skip();
	}
	const pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		setenv("NXD_TEST_AMX_EMULATE", "1", 1);
		execl(self, self, "--check", (char *)NULL);
		_exit(127);
	}
	int st;
	assert_int_equal(waitpid(pid, &st, 0), pid);
	assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

int main(int argc, char **argv)
{
	if (argc == 2 && !strcmp(argv[1], "--check"))
		return child_check();
	self = "/proc/self/exe";
	rng_state = 0x9e3779b97f4a7c15ull;
	nx_cpu_amx_request();
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_coverage),
		cmocka_unit_test(test_emulated_exact),
		cmocka_unit_test(test_avx512_beside),
		cmocka_unit_test(test_tiles_exact),
		cmocka_unit_test(test_startup_check),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
