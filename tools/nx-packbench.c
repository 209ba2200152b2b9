/* nx-packbench.c - micro-benchmark of the packed tile kernels (kern/pack.h) over one
 * decode step's layer matrices: how fast the kernels stream the weights from DRAM
 * when nothing else of the forward pass runs, as a yardstick for nx-perf --profile.
 *
 *   nx-packbench [-t threads] [-a tokens] [-b] [-c] [-1] [-L] [-T TYPE] [-s steps]
 *
 * Lays out 30 layers of SmolLM2-135M's matrices (q, k, v, o, gate, up, down:
 * 576/192/192/576/1536/1536/576 rows of 576 or 1536) packed, in the order the
 * forward pass reads them (61 MB in Q4_1: more than the L3); for the
 * super-block types (-T q2_k|q3_k|q4_k|q5_k|q6_k|iq4_xs: rows of a multiple
 * of 256, which 576 is not) 30 layers of docs/bench.md's dim-1024 llama
 * (1024/512/512/1024/2816/2816/1024 rows of 1024 or 2816); with -L, 16
 * layers of the Llama-3.2-1B shape instead, for every type (2048/512/512/2048/
 * 8192/8192/2048 rows of 2048 or 8192: docs/bench.md's llama1b case without
 * its output head: 320 MB in Q2_K to 1034 in Q8_0). It times steps in
 * which each of the threads dots its share of every matrix's row groups (thread b
 * takes groups [b * n / t, (b + 1) * n / t), as fixed bands would) with the
 * two-part activations of -a tokens; -b adds a spinning barrier after every
 * matrix, as the engine has one after every op; -c makes every matrix read the
 * same bytes (from layer 0's first on: 0.55 MB in Q4_1, 0.94 in Q8_0), so the
 * weights stay in L2 and the kernels' own speed shows; -1 gives one-part
 * activations (lo rows zeros and nx_pack_act.lo_zero: nxd --activations fast).
 * Prints the mean over the steps
 * after a warm-up: ms per step and weight GB/s, for all threads together; and,
 * with AVX-512 VNNI, the kernels' time per vpdpbusd against what the core
 * issues when it does nothing else.
 * Not a test: it checks nothing. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <immintrin.h>

#include "kern/cpu.h"
#include "kern/pack.h"
#include "kern/quant.h"

#define N_LAYER 30
#define N_OPS 7
#define MAX_THREADS 16

static const int rows_32[N_OPS] = {576, 192, 192, 576, 1536, 1536, 576};
static const int in_32[N_OPS] = {576, 576, 576, 576, 576, 576, 1536};
static const int rows_256[N_OPS] = {1024, 512, 512, 1024, 2816, 2816, 1024};
static const int in_256[N_OPS] = {1024, 1024, 1024, 1024, 1024, 1024, 2816};
static const int rows_1b[N_OPS] = {2048, 512, 512, 2048, 8192, 8192, 2048};
static const int in_1b[N_OPS] = {2048, 2048, 2048, 2048, 2048, 2048, 8192};
#define MAX_IN 8192
static const int *op_rows = rows_32, *op_in = in_32;
static int n_layer = N_LAYER;

static enum nx_type wtype = NX_Q4_1;
static int n_threads = 2, n_tok = 1, n_steps = 50;
static bool use_barrier, in_cache, one_part, use_amx, shape_1b;
static uint8_t *mats[N_LAYER][N_OPS]; /* packed, one block in read order */
static uint8_t *act;                  /* n_tok tokens' hi and lo rows of MAX_IN elements */
static _Atomic unsigned arrived, round_no;
static double thread_ms[MAX_THREADS];

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

static void barrier(void)
{
	const unsigned r = atomic_load(&round_no);
	if (atomic_fetch_add(&arrived, 1) + 1 == (unsigned)n_threads) {
		atomic_store(&arrived, 0);
		atomic_fetch_add(&round_no, 1);
	} else {
		while (atomic_load(&round_no) == r)
			__builtin_ia32_pause();
	}
}

static void *run(void *arg)
{
	const int b = (int)(intptr_t)arg;
	const nx_pack_fn kern = use_amx ? nx_pack_kernel_amx(wtype) : nx_pack_kernel(wtype);
	float d[NX_PACK_AMX_MAX * MAX_IN / 32], s[NX_PACK_AMX_MAX * MAX_IN / 32], out[NX_PACK_AMX_MAX * NX_PACK_ROWS];
	int32_t c[NX_PACK_AMX_MAX * MAX_IN / 32], c16[NX_PACK_AMX_MAX * MAX_IN / 16];
	double total = 0;
	for (int step = -3; step < n_steps; step++) {
		barrier();
		const double t0 = now();
		for (int l = 0; l < n_layer; l++)
			for (int o = 0; o < N_OPS; o++) {
				const size_t rs = (size_t)nx_row_size(NX_Q8_0, op_in[o]), gb = NX_PACK_ROWS * (size_t)nx_row_size(wtype, op_in[o]);
				const int64_t nb = op_in[o] / 32;
				for (int t = 0; t < n_tok; t++) { /* the side values, as prep_act makes them once per input */
					nx_pack_act_prep(act + 2 * t * rs, act + 2 * t * rs + rs, op_in[o], d + t * nb, s + t * nb,
							 c + t * nb);
					if (nx_pack_needs_c16(wtype))
						nx_pack_act_prep_c16(act + 2 * t * rs, act + 2 * t * rs + rs, op_in[o], c16 + 2 * t * nb);
				}
				const struct nx_pack_act a = {act, 2 * rs, rs, d, s, c, nb, c16, one_part};
				const int ng = op_rows[o] / NX_PACK_ROWS;
				for (int g = b * ng / n_threads; g < (b + 1) * ng / n_threads; g++)
					kern((in_cache ? mats[0][0] : mats[l][o]) + (size_t)g * gb, &a, n_tok, out, op_in[o]);
				if (use_barrier)
					barrier();
			}
		if (step >= 0)
			total += now() - t0;
	}
	thread_ms[b] = total / n_steps * 1e3;
	return NULL;
}

/* ns per vpdpbusd of 512 bits when this core issues nothing else (12 chains,
 * so latency does not count); only on CPUs with AVX-512 VNNI. The tile kernels issue
 * 16 per token, 32-element block and 16-row group (8 per activation part): the
 * ratio of the two says how far they are from the integer units' limit. */
__attribute__((target("avx512f,avx512vnni"))) static double vnni_peak_ns(void)
{
	__m512i a[12], w = _mm512_set1_epi8(3);
	const __m512i x = _mm512_set1_epi8(5);
	for (int i = 0; i < 12; i++)
		a[i] = _mm512_set1_epi32(i);
	const long n = 20000000;
	double t0 = now();
	for (long r = 0; r < n; r++) {
#pragma GCC unroll 12 /* else the chains live on the stack, one store-forward each */
		for (int i = 0; i < 12; i++)
			a[i] = _mm512_dpbusd_epi32(a[i], w, x);
		__asm__ volatile("" : "+v"(w)); /* one more round, not a folded constant */
	}
	double t = now() - t0;
	int sink = 0;
	for (int i = 0; i < 12; i++)
		sink += _mm512_reduce_add_epi32(a[i]);
	__asm__ volatile("" : : "r"(sink));
	return t / (12.0 * n) * 1e9;
}

static void usage(void)
{
	fprintf(stderr, "usage: nx-packbench [-t threads (1..%d)] [-a tokens (1..%d; -A: 1..%d)] [-b] [-c] [-1] [-A] [-L] "
			"[-T q4_1|q4_0|q5_0|q5_1|q8_0|iq4_nl|q2_k|q3_k|q4_k|q5_k|q6_k|iq4_xs] [-s steps]\n"
			"  -A: the AMX kernels (kern/pack_amx.c), where the CPU has AMX-INT8\n"
			"  -L: 16 layers of the Llama-3.2-1B shape, for every type\n",
		MAX_THREADS, NX_PACK_ACT_MAX, NX_PACK_AMX_MAX);
	exit(2);
}

/* A type with a packed layout; the super-block ones take the dim-1024 shapes. */
static bool parse_type(const char *name)
{
	static const enum nx_type ok[] = {NX_Q4_1, NX_Q4_0, NX_Q5_0, NX_Q5_1, NX_Q8_0, NX_IQ4_NL,
					  NX_Q2_K, NX_Q3_K, NX_Q4_K, NX_Q5_K, NX_Q6_K, NX_IQ4_XS};
	for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++)
		if (!strcmp(name, nx_type_name(ok[i]))) {
			wtype = ok[i];
			if (nx_type_ref(wtype)->blck == QK_K) {
				op_rows = rows_256;
				op_in = in_256;
			}
			return true;
		}
	return false;
}

int main(int argc, char **argv)
{
	int opt;
	while ((opt = getopt(argc, argv, "t:a:bc1ALT:s:")) != -1) {
		switch (opt) {
		case 't': n_threads = atoi(optarg); break;
		case 'a': n_tok = atoi(optarg); break;
		case 'b': use_barrier = true; break;
		case 'c': in_cache = true; break;
		case 'A': use_amx = true; break;
		case '1': one_part = true; break;
		case 'L': shape_1b = true; break;
		case 's': n_steps = atoi(optarg); break;
		case 'T':
			if (!parse_type(optarg))
				usage();
			break;
		default: usage();
		}
	}
	if (optind < argc || n_threads < 1 || n_threads > MAX_THREADS || n_tok < 1 || n_tok > (use_amx ? NX_PACK_AMX_MAX : NX_PACK_ACT_MAX) ||
	    n_steps < 1)
		usage();
	if (shape_1b) {
		op_rows = rows_1b;
		op_in = in_1b;
		n_layer = 16;
	}
	nx_cpu_amx_request();
	if (use_amx && !nx_pack_kernel_amx(wtype)) {
		fprintf(stderr, "nx-packbench: AMX: not available for %s (%s)\n", nx_type_name(wtype),
			nx_kern_set(NX_KFAM_PACK) == NX_KSET_AMX ? "no AMX kernel for the type" : "the pack family does not run amx here");
		return 1;
	}
	if (!nx_pack_fast(wtype))
		fprintf(stderr, "nx-packbench: no SIMD tile kernel for %s on this CPU: timing the reference\n",
			nx_type_name(wtype));

	/* weights from Gaussian-ish values through the type's quantizer, packed */
	const struct nx_type_traits *tr = nx_type_get(wtype);
	size_t total = 0;
	for (int o = 0; o < N_OPS; o++)
		total += (size_t)op_rows[o] * (size_t)nx_row_size(wtype, op_in[o]);
	total *= (size_t)n_layer;
	uint8_t *mem = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (mem == MAP_FAILED) {
		perror("nx-packbench: mmap");
		return 1;
	}
	madvise(mem, total, MADV_HUGEPAGE); /* as the daemon's weights */
	float *x = malloc(sizeof(float) * MAX_IN * NX_PACK_ROWS);
	uint8_t *rows = malloc(NX_PACK_ROWS * (size_t)nx_row_size(wtype, MAX_IN));
	size_t qr = (size_t)nx_row_size(NX_Q8_0, MAX_IN);
	act = malloc(2 * qr * NX_PACK_AMX_MAX);
	if (!x || !rows || !act) {
		fprintf(stderr, "nx-packbench: out of memory\n");
		return 1;
	}
	unsigned seed = 1;
	for (int i = 0; i < MAX_IN * NX_PACK_ROWS; i++)
		x[i] = (float)((int)(rand_r(&seed) % 2001) - 1000) / 1000.0f;
	/* every group of a shape holds the same values: quantized and packed
	 * once (the super-block quantizers take a minute over 200 MB), copied */
	uint8_t *p = mem;
	for (int l = 0; l < n_layer; l++)
		for (int o = 0; o < N_OPS; o++) {
			const size_t rb = (size_t)nx_row_size(wtype, op_in[o]), gb = NX_PACK_ROWS * rb;
			mats[l][o] = p;
			for (int g = 0; g < op_rows[o] / NX_PACK_ROWS; g++, p += gb) {
				if (l > 0 || g > 0) {
					memcpy(p, mats[0][o], gb);
					continue;
				}
				tr->quant(x, rows, (int64_t)op_in[o] * NX_PACK_ROWS);
				nx_pack_group(wtype, rows, rb, p, op_in[o]);
			}
		}
	for (int t = 0; t < NX_PACK_AMX_MAX; t++) { /* two-part activations, whatever op reads them */
		nx_type_get(NX_Q8_0)->quant2(x + t * MAX_IN, act + 2 * t * qr, act + 2 * t * qr + qr, MAX_IN);
		if (one_part)
			memset(act + 2 * t * qr + qr, 0, qr);
	}

	pthread_t th[MAX_THREADS];
	for (int b = 1; b < n_threads; b++)
		if (pthread_create(&th[b], NULL, run, (void *)(intptr_t)b)) {
			fprintf(stderr, "nx-packbench: pthread_create failed\n");
			return 1;
		}
	run((void *)0);
	double ms = 0;
	for (int b = 1; b < n_threads; b++)
		pthread_join(th[b], NULL);
	for (int b = 0; b < n_threads; b++)
		ms = thread_ms[b] > ms ? thread_ms[b] : ms;
	printf("%s, %d layers (%.1f MB%s), %d thread%s, %d token%s%s: %.3f ms per step, %.1f GB/s of weights\n",
	       nx_type_name(wtype), n_layer, total / 1e6, in_cache ? ", every matrix reading the same bytes" : "",
	       n_threads, n_threads > 1 ? "s" : "", n_tok, n_tok > 1 ? "s" : "",
	       use_barrier ? ", a barrier after each matrix" : "", ms, total / (ms * 1e-3) / 1e9);
	if (nx_pack_fast(wtype) && (nx_cpu_features() & NX_CPU_AVX512VNNI)) {
		double groups_blocks = 0;
		for (int o = 0; o < N_OPS; o++)
			groups_blocks += (double)(op_rows[o] / NX_PACK_ROWS) * (op_in[o] / 32);
		const double per_thread = 16.0 * n_tok * groups_blocks * n_layer / n_threads, peak = vnni_peak_ns();
		printf("vpdpbusd: %.2fM per step per thread, %.3f ns each; this core alone issues one per %.3f ns "
		       "(%.0f%% of that)\n", per_thread / 1e6, ms * 1e6 / per_thread, peak, 100 * peak * per_thread / (ms * 1e6));
	}
	return 0;
}
