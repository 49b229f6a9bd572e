/*
 * testrng.h: the tests' deterministic random numbers (xorshift64), the same sequence in every
 * test from the same seed.  rng_state starts at Marsaglia's seed; a test that wants another
 * start (or a fresh seed each run) assigns rng_state itself.
 */
#ifndef SL_TESTRNG_H
#define SL_TESTRNG_H

#include <math.h>
#include <stdint.h>

static uint64_t rng_state = 88172645463325252ull;

static inline uint64_t rng_next(void)
{
	rng_state ^= rng_state << 13;
	rng_state ^= rng_state >> 7;
	rng_state ^= rng_state << 17;
	return rng_state;
}

/* uniform in (0, 1): 53 bits, never 0 (log() of it is finite) */
static inline double rng_unif(void)
{
	return ((rng_next() >> 11) + 0.5) / 9007199254740992.0;
}

/* standard normal (Box-Muller, one of the pair) */
static inline double rng_normal(void)
{
	return sqrt(-2 * log(rng_unif())) * cos(2 * M_PI * rng_unif());
}

#endif
