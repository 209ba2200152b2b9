/* prof.c - the clock and phase names of the forward pass's optional time split (struct nx_prof). */
#include "model/forward.h"

#include <pthread.h>
#include <time.h>
#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
#endif

static const char *const names[NX_PROF_N] = {
	[NX_PROF_MATMUL] = "matmul",   [NX_PROF_LOGITS] = "logits", [NX_PROF_ATTN] = "attention",
	[NX_PROF_QUANT] = "norm+quant", [NX_PROF_OTHER] = "rope+kv",  [NX_PROF_BARRIER] = "barrier",
};

const char *nx_prof_name(int phase)
{
	return phase >= 0 && phase < NX_PROF_N ? names[phase] : "?";
}

static uint64_t mono_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

uint64_t nx_prof_now(void)
{
#if defined(__x86_64__) || defined(__i386__)
	/* Invariant TSC on every CPU this runs on (constant_tsc); about 20 cycles, no syscall. */
	return __rdtsc();
#else
	return mono_ns();
#endif
}

static double tick_ns;
static pthread_once_t tick_once = PTHREAD_ONCE_INIT;

static void tick_measure(void)
{
	uint64_t n0 = mono_ns(), t0 = nx_prof_now(), n1;
	do
		n1 = mono_ns();
	while (n1 - n0 < 10000000u);
	uint64_t t1 = nx_prof_now();
	tick_ns = t1 > t0 ? (double)(n1 - n0) / (double)(t1 - t0) : 1.0;
}

double nx_prof_tick_ns(void)
{
	pthread_once(&tick_once, tick_measure);
	return tick_ns;
}
