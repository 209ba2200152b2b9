/* rng.h - the C tests' random numbers: xorshift64*, deterministic, so a failure
 * reproduces from the seed a test sets in rng_state. One copy per test binary. */
#ifndef NX_TEST_RNG_H
#define NX_TEST_RNG_H

#include <math.h>
#include <stdint.h>

static uint64_t rng_state;

static inline uint64_t rng_next(void)
{
	rng_state ^= rng_state >> 12;
	rng_state ^= rng_state << 25;
	rng_state ^= rng_state >> 27;
	return rng_state * 0x2545F4914F6CDD1DULL;
}

/* [0, 1) */
static inline double rng_uniform(void)
{
	return (double)(rng_next() >> 11) / 9007199254740992.0;
}

/* [-1, 1) */
static inline float rng_sym(void)
{
	return (float)rng_uniform() * 2.0f - 1.0f;
}

/* standard normal (Box-Muller) */
static inline float rng_gauss(void)
{
	double u = rng_uniform(), v = rng_uniform();
	return (float)(sqrt(-2.0 * log(1.0 - u)) * cos(2.0 * M_PI * v));
}

#endif
