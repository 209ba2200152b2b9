/* bw.c - memory read bandwidth probe: threads sum disjoint parts of a large buffer, best and median of several reps.
 *
 *   bw [--mib N] [--threads T] [--reps R]      (defaults: 1024 MiB, 2 threads, 9 reps)
 *
 * Prints one line: "bw: best X GB/s median Y GB/s threads T mib N reps R" (GB = 1e9 bytes).
 * Decode of a small model is bound by this number: every weight byte is read once per token. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <sys/mman.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct part {
	const uint64_t *p;
	size_t n; /* uint64 words */
	int cpu;
	pthread_barrier_t *start;
	uint64_t sum; /* kept so the compiler cannot drop the reads */
};

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Eight independent accumulators so the adds never wait on each other; -O3 vectorizes them. */
static uint64_t sum_words(const uint64_t *p, size_t n)
{
	uint64_t a[8] = { 0 };
	size_t i;
	for (i = 0; i + 8 <= n; i += 8)
		for (int k = 0; k < 8; k++)
			a[k] += p[i + k];
	for (; i < n; i++)
		a[0] += p[i];
	return a[0] + a[1] + a[2] + a[3] + a[4] + a[5] + a[6] + a[7];
}

static void *reader(void *arg)
{
	struct part *pt = arg;
	cpu_set_t set;
	CPU_ZERO(&set);
	CPU_SET(pt->cpu, &set);
	sched_setaffinity(0, sizeof(set), &set); /* best effort: fewer CPUs than threads is fine */
	pthread_barrier_wait(pt->start);
	pt->sum = sum_words(pt->p, pt->n);
	return NULL;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

static long arg_long(const char *flag, const char *v, long lo, long hi)
{
	char *end;
	errno = 0;
	long x = v ? strtol(v, &end, 10) : 0;
	if (!v || errno || *end || x < lo || x > hi) {
		fprintf(stderr, "bw: %s needs an integer in %ld..%ld, got %s\n", flag, lo, hi, v ? v : "nothing");
		exit(2);
	}
	return x;
}

int main(int argc, char **argv)
{
	long mib = 1024, threads = 2, reps = 9;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--mib"))
			mib = arg_long("--mib", i + 1 < argc ? argv[++i] : NULL, 1, 65536);
		else if (!strcmp(argv[i], "--threads"))
			threads = arg_long("--threads", i + 1 < argc ? argv[++i] : NULL, 1, 256);
		else if (!strcmp(argv[i], "--reps"))
			reps = arg_long("--reps", i + 1 < argc ? argv[++i] : NULL, 1, 1000);
		else {
			fprintf(stderr, "usage: bw [--mib N] [--threads T] [--reps R]\n");
			return 2;
		}
	}
	size_t bytes = (size_t)mib << 20, words = bytes / sizeof(uint64_t);
	/* On 2 MiB pages where the kernel gives them (nxd's weights are, see
	 * shm/hugemem.c): 4 KiB pages read 20-40% slower here, and the probe is
	 * meant to be the machine's best read rate, not a handicapped one. */
	uint64_t *buf = aligned_alloc(1 << 21, bytes);
	if (buf)
		madvise(buf, bytes, MADV_HUGEPAGE);
	if (!buf) {
		fprintf(stderr, "bw: cannot allocate %ld MiB\n", mib);
		return 1;
	}
	/* Touch every page (and make the data non-zero) so the reads hit real memory, not the zero page. */
	for (size_t i = 0; i < words; i++)
		buf[i] = i * 0x9e3779b97f4a7c15ull;

	struct part *parts = calloc((size_t)threads, sizeof(*parts));
	pthread_t *tids = calloc((size_t)threads, sizeof(*tids));
	double *gbs = calloc((size_t)reps, sizeof(*gbs));
	if (!parts || !tids || !gbs)
		return 1;
	long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	uint64_t check = 0;
	for (long r = 0; r < reps; r++) {
		pthread_barrier_t start;
		pthread_barrier_init(&start, NULL, (unsigned)threads + 1);
		size_t per = words / (size_t)threads;
		for (long t = 0; t < threads; t++) {
			parts[t] = (struct part){ .p = buf + (size_t)t * per,
						  .n = t == threads - 1 ? words - (size_t)t * per : per,
						  .cpu = (int)(t % (ncpu > 0 ? ncpu : 1)),
						  .start = &start };
			if (pthread_create(&tids[t], NULL, reader, &parts[t])) {
				fprintf(stderr, "bw: pthread_create failed\n");
				return 1;
			}
		}
		pthread_barrier_wait(&start);
		double t0 = now_s();
		for (long t = 0; t < threads; t++) {
			pthread_join(tids[t], NULL);
			check += parts[t].sum;
		}
		double dt = now_s() - t0;
		pthread_barrier_destroy(&start);
		gbs[r] = (double)bytes / dt / 1e9;
	}
	qsort(gbs, (size_t)reps, sizeof(*gbs), cmp_double);
	printf("bw: best %.2f GB/s median %.2f GB/s threads %ld mib %ld reps %ld (check %llx)\n", gbs[reps - 1],
	       gbs[reps / 2], threads, mib, reps, (unsigned long long)(check & 0xffff));
	free(gbs);
	free(tids);
	free(parts);
	free(buf);
	return 0;
}
