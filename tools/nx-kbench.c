/* nx-kbench.c - micro-benchmark of the dot kernels: weight GB/s of a matrix-vector
 * product (and of one weight row against 4 / 8 activation rows) per type, for the
 * scalar reference and each SIMD kernel set this CPU can run.
 *
 *   nx-kbench [-r rows] [-n cols] [-t seconds] [-T type,...]
 *
 * Default: a 576 x 1536 matrix (the default model's ffn_down: it stays in L2, so
 * this measures the kernels, not DRAM); -r 49152 -n 576 -T q8_0 is the tied
 * output matrix (30 MB, streamed from L3/DRAM). "dot" is weight bytes / time for
 * one token; "xB" is weight bytes * B tokens / time with dot_rows over B
 * activation rows, i.e. the bandwidth a per-token loop would need to match it.
 * Each figure is the fastest of many passes (robust to a busy machine).
 * Not a test: it prints numbers and checks nothing but that the sets agree. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kern/cpu.h"
#include "kern/quant.h"

void nx_kern_avx2_install(struct nx_type_traits *tab, size_t n);
void nx_kern_avx512_install(struct nx_type_traits *tab, size_t n);

#define N_IDS 64
#define MAX_B 8

struct kset {
	enum nx_kset set;
	void (*install)(struct nx_type_traits *tab, size_t n);
	struct nx_type_traits tab[N_IDS];
};

static struct kset ksets[] = {
	{ NX_KSET_REF, NULL, { { 0 } } },
	{ NX_KSET_AVX2, nx_kern_avx2_install, { { 0 } } },
	{ NX_KSET_AVX512, nx_kern_avx512_install, { { 0 } } },
};
#define N_SETS (sizeof(ksets) / sizeof(ksets[0]))

static const enum nx_type all_types[] = { NX_Q4_1, NX_Q8_0, NX_Q4_0, NX_Q4_K, NX_Q6_K, NX_Q5_K,
					  NX_Q5_0, NX_Q5_1, NX_F16, NX_BF16, NX_F32, NX_Q2_K,
					  NX_Q3_K, NX_IQ4_NL, NX_IQ4_XS };

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static uint64_t rng = 88172645463325252ULL;

static float gauss(void)
{
	double u, v;
	rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
	u = (double)(rng >> 11) / 9007199254740992.0;
	rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
	v = (double)(rng >> 11) / 9007199254740992.0;
	return (float)(sqrt(-2.0 * log(1.0 - u)) * cos(2.0 * M_PI * v));
}

static volatile float sink;

/* Seconds per pass of: every weight row against b activation rows (b = 0: dot).
 * The fastest of many passes: other processes on the machine only ever add time. */
static double time_pass(const struct nx_type_traits *tr, const uint8_t *w, size_t row_bytes, int rows,
			const uint8_t *act, size_t act_stride, int b, int64_t n, double budget)
{
	float out[MAX_B];
	long passes = 0;
	double best = 1e30, t0 = now(), t = t0;
	do {
		const double p0 = now();
		for (int r = 0; r < rows; r++) {
			const uint8_t *row = w + (size_t)r * row_bytes;
			if (b == 0)
				out[0] = tr->dot(row, act, n);
			else
				tr->dot_rows(row, act, act_stride, b, out, n);
			sink = out[0];
		}
		t = now();
		if (t - p0 < best)
			best = t - p0;
		passes++;
	} while (t - t0 < budget || passes < 3);
	return best;
}

static int parse_types(const char *s, enum nx_type *out)
{
	int k = 0;
	char buf[256];
	snprintf(buf, sizeof(buf), "%s", s);
	for (char *tok = strtok(buf, ","); tok && k < 16; tok = strtok(NULL, ",")) {
		int found = 0;
		for (uint32_t t = 0; t < N_IDS; t++)
			if (nx_type_supported(t) && !strcmp(nx_type_name(t), tok)) {
				out[k++] = (enum nx_type)t;
				found = 1;
			}
		if (!found) {
			fprintf(stderr, "nx-kbench: unknown type %s\n", tok);
			exit(2);
		}
	}
	return k;
}

int main(int argc, char **argv)
{
	int rows = 576;
	int64_t n = 1536;
	double budget = 0.15;
	enum nx_type types[16];
	int ntypes = (int)(sizeof(all_types) / sizeof(all_types[0]));
	memcpy(types, all_types, sizeof(all_types));
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "-r") && i + 1 < argc)
			rows = atoi(argv[++i]);
		else if (!strcmp(argv[i], "-n") && i + 1 < argc)
			n = atoll(argv[++i]);
		else if (!strcmp(argv[i], "-t") && i + 1 < argc)
			budget = atof(argv[++i]);
		else if (!strcmp(argv[i], "-T") && i + 1 < argc)
			ntypes = parse_types(argv[++i], types);
		else {
			fprintf(stderr, "usage: nx-kbench [-r rows] [-n cols] [-t seconds] [-T type,...]\n");
			return 2;
		}
	}
	if (rows < 1 || n < 32 || n % 32) {
		fprintf(stderr, "nx-kbench: need rows >= 1 and cols a multiple of 32 (256 for the k-quants)\n");
		return 2;
	}

	int nsets = 0;
	for (size_t s = 0; s < N_SETS; s++) {
		struct kset *ks = &ksets[s];
		if (!nx_kern_runs(NX_KFAM_DOT, ks->set, nx_cpu_features()))
			continue;
		for (uint32_t t = 0; t < N_IDS; t++) {
			const struct nx_type_traits *ref = nx_type_ref((enum nx_type)t);
			if (ref)
				ks->tab[t] = *ref;
		}
		if (ks->install)
			ks->install(ks->tab, N_IDS);
		ksets[nsets++] = *ks;
	}

	float *x = malloc((size_t)rows * n * sizeof(float)), *y = malloc((size_t)MAX_B * n * sizeof(float));
	if (!x || !y)
		return 1;
	for (size_t i = 0; i < (size_t)rows * n; i++)
		x[i] = gauss();
	for (size_t i = 0; i < (size_t)MAX_B * n; i++)
		y[i] = gauss();

	printf("nx-kbench: %d x %lld matrix, GB/s of weight bytes (dot: one token; xB: B tokens per weight row, "
	       "bytes x B / time)\n",
	       rows, (long long)n);
	printf("%-6s %7s", "type", "MB");
	for (int s = 0; s < nsets; s++)
		printf(" %9s", nx_kset_name(ksets[s].set));
	for (int s = 1; s < nsets; s++)
		printf(" %9s", "x4");
	for (int s = 1; s < nsets; s++)
		printf(" %9s", "x8");
	printf("   (x4/x8 columns: %s", nsets > 1 ? nx_kset_name(ksets[1].set) : "");
	for (int s = 2; s < nsets; s++)
		printf(", %s", nx_kset_name(ksets[s].set));
	printf(")\n");

	for (int ti = 0; ti < ntypes; ti++) {
		const enum nx_type t = types[ti];
		const struct nx_type_traits *ref = nx_type_ref(t);
		const enum nx_type vt = ref->vec_dot_type;
		if (n % ref->blck) {
			printf("%-6s (cols not a multiple of %lld)\n", ref->name, (long long)ref->blck);
			continue;
		}
		const size_t row_bytes = (size_t)nx_row_size(t, n), act_bytes = (size_t)nx_row_size(vt, n);
		uint8_t *w = malloc(row_bytes * rows), *act = malloc(act_bytes * MAX_B);
		if (!w || !act)
			return 1;
		for (int r = 0; r < rows; r++)
			ref->quant(x + (size_t)r * n, w + (size_t)r * row_bytes, n);
		for (int b = 0; b < MAX_B; b++)
			nx_type_ref(vt)->quant(y + (size_t)b * n, act + (size_t)b * act_bytes, n);

		/* the sets must agree before their speed means anything */
		const float r0 = ref->dot(w, act, n);
		for (int s = 1; s < nsets; s++) {
			const float g = ksets[s].tab[t].dot(w, act, n);
			if (fabsf(g - r0) > 1e-3f * (fabsf(r0) + 1.0f))
				fprintf(stderr, "nx-kbench: %s %s dot %g differs from reference %g\n", nx_kset_name(ksets[s].set),
					ref->name, g, r0);
		}

		const double mb = (double)row_bytes * rows / 1e6;
		printf("%-6s %7.2f", ref->name, mb);
		for (int s = 0; s < nsets; s++) {
			double sec = time_pass(&ksets[s].tab[t], w, row_bytes, rows, act, act_bytes, 0, n,
					       s == 0 ? budget / 3 : budget);
			printf(" %9.2f", mb / 1e3 / sec);
		}
		for (int b = 4; b <= MAX_B; b += 4)
			for (int s = 1; s < nsets; s++) {
				double sec = time_pass(&ksets[s].tab[t], w, row_bytes, rows, act, act_bytes, b, n, budget);
				printf(" %9.2f", mb / 1e3 * b / sec);
			}
		printf("\n");
		fflush(stdout);
		free(w);
		free(act);
	}

	/* activation quantizers: input floats per second */
	printf("\nactivation quantizers, GB/s of f32 input (%lld floats per row):\n%-6s", (long long)n, "");
	for (int s = 0; s < nsets; s++)
		printf(" %9s", nx_kset_name(ksets[s].set));
	printf("\n");
	static const enum nx_type qts[] = { NX_Q8_0, NX_Q8_K };
	uint8_t *q = malloc((size_t)n * 2); /* both take under 2 bytes per element */
	if (!q)
		return 1;
	for (int k = 0; k < 2; k++) {
		printf("%-6s", nx_type_name(qts[k]));
		if (n % nx_type_ref(qts[k])->blck) {
			printf(" (cols not a multiple of %lld)\n", (long long)nx_type_ref(qts[k])->blck);
			continue;
		}
		for (int s = 0; s < nsets; s++) {
			double best = 1e30, t0 = now(), t = t0;
			do {
				const double p0 = now();
				for (int j = 0; j < 16; j++)
					ksets[s].tab[qts[k]].quant(y + (size_t)(j % MAX_B) * n, q, n);
				t = now();
				if (t - p0 < best)
					best = t - p0;
			} while (t - t0 < budget / 2);
			printf(" %9.2f", 16.0 * n * 4 / 1e9 / best);
		}
		printf("\n");
	}
	free(q);
	free(x);
	free(y);
	return 0;
}
