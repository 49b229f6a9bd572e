/*
 * gpupair.h: the CUDA op tests' paired buffers (test_cuda_ops, test_cuda_qwen35): the same
 * values on the cpu backend (the reference, fp32) and the cuda backend under test (bf16 where
 * the op takes it), outputs poisoned with NaN on both sides, and the comparison that prints a
 * table row and counts a failed check.  The including file sets cpu and gpu (gpu: the backend
 * under test, which may change between cases) before making a buffer.
 */
#ifndef SL_TEST_GPUPAIR_H
#define SL_TEST_GPUPAIR_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "backend.h"
#include "bf16.h"
#include "testrng.h"
#include "testutil.h"

static struct sl_backend *cpu, *gpu;

/* ---- paired buffers: the same values on both backends -------------------------------------- */

enum kind { BF, F32, I32, STAT };

struct buf {
	enum kind k;
	size_t n;
	float *h;	/* host values (bf16-exact for BF) */
	int32_t *hi;	/* ints */
	void *c, *g;	/* cpu and gpu buffers */
};

static inline size_t gelt(enum kind k)
{
	return k == BF ? 2 : 4;
}

static inline struct buf *mk(enum kind k, size_t n)
{
	struct buf *b = calloc(1, sizeof(*b));

	b->k = k;
	b->n = n;
	b->h = calloc(n ? n : 1, sizeof(float));
	b->hi = calloc(n ? n : 1, sizeof(int32_t));
	b->c = cpu->alloc(cpu, n * 4);
	b->g = gpu->alloc(gpu, n * gelt(k));
	return b;
}

static inline void put(struct buf *b)
{
	if (b->k == I32) {
		cpu->upload(cpu, b->c, b->hi, b->n * 4);
		gpu->upload(gpu, b->g, b->hi, b->n * 4);
		return;
	}
	cpu->upload(cpu, b->c, b->h, b->n * 4);
	if (b->k == BF) {
		uint16_t *t = malloc(b->n * 2 + 2);

		for (size_t i = 0; i < b->n; i++)
			t[i] = f2bf(b->h[i]);
		gpu->upload(gpu, b->g, t, b->n * 2);
		free(t);
	} else {
		gpu->upload(gpu, b->g, b->h, b->n * 4);
	}
}

/* random N(0, s^2) values (bf16-exact) on both sides */
static inline struct buf *rnd(enum kind k, size_t n, double s)
{
	struct buf *b = mk(k, n);

	for (size_t i = 0; i < n; i++)
		b->h[i] = k == BF ? round_bf((float)(s * rng_normal())) : (float)(s * rng_normal());
	put(b);
	return b;
}

/* an output: NaN on both sides, so nothing unwritten passes */
static inline struct buf *out(enum kind k, size_t n)
{
	struct buf *b = mk(k, n);

	for (size_t i = 0; i < n; i++)
		b->h[i] = NAN;
	put(b);
	return b;
}

static inline struct buf *ints(size_t n, int lo, int hi)
{
	struct buf *b = mk(I32, n);

	for (size_t i = 0; i < n; i++)
		b->hi[i] = lo + (int)(rng_next() % (uint64_t)(hi - lo + 1));
	put(b);
	return b;
}

/* min(n, R) distinct rows of [0, R) in a random order */
static inline struct buf *distinct_ints(int n, int R)
{
	struct buf *b;
	int *p = malloc((size_t)R * sizeof(*p));

	if (n > R)
		n = R;
	b = mk(I32, (size_t)n);
	for (int i = 0; i < R; i++)
		p[i] = i;
	for (int i = 0; i < n; i++) {
		int j = i + (int)(rng_next() % (uint64_t)(R - i)), t = p[i];

		p[i] = p[j], p[j] = t;
		b->hi[i] = p[i];
	}
	free(p);
	put(b);
	return b;
}

static inline void drop(struct buf *b)
{
	cpu->free(cpu, b->c);
	gpu->free(gpu, b->g);
	free(b->h);
	free(b->hi);
	free(b);
}

/* the gpu's values as floats */
static inline float *gget(struct buf *b)
{
	float *f = malloc(b->n * 4 + 4);

	if (b->k == BF) {
		uint16_t *t = malloc(b->n * 2 + 2);

		gpu->download(gpu, t, b->g, b->n * 2);
		for (size_t i = 0; i < b->n; i++)
			f[i] = bf2f(t[i]);
		free(t);
	} else {
		gpu->download(gpu, f, b->g, b->n * 4);
	}
	return f;
}

static inline float *cget(struct buf *b)
{
	float *f = malloc(b->n * 4 + 4);

	cpu->download(cpu, f, b->c, b->n * 4);
	return f;
}

/* ---- comparison and the table -------------------------------------------------------------- */

static double t_ms;	/* gpu time of the op under test */

static inline double now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* wall time of one call, the launch included (the stream drained before and after) */
#define TIMED(stmt)                                                     \
	do {                                                            \
		gpu->sync(gpu);                                         \
		t_ms = now_ms();                                        \
		stmt;                                                   \
		gpu->sync(gpu);                                         \
		t_ms = now_ms() - t_ms;                                 \
	} while (0)

/*
 * gpu vs cpu values of one output: norm-relative error <= tol, every element within
 * 4 tol (|want| + 0.05 max|want|), everything finite.
 */
static inline void cmp(const char *op, const char *shape, const char *what, struct buf *b,
		       double tol)
{
	float *g = gget(b), *c = cget(b);
	double num = 0, den = 0, mx = 0, worst = 0;
	size_t bad = 0, nonfin = 0;

	for (size_t i = 0; i < b->n; i++)
		if (fabs(c[i]) > mx)
			mx = fabs(c[i]);
	for (size_t i = 0; i < b->n; i++) {
		double d = (double)g[i] - c[i];

		if (!isfinite(g[i]) || !isfinite(c[i])) {
			nonfin++;
			continue;
		}
		num += d * d;
		den += (double)c[i] * c[i];
		if (fabs(d) > 4 * tol * (fabs(c[i]) + 0.05 * mx))
			bad++;
		if (mx > 0 && fabs(d) / mx > worst)
			worst = fabs(d) / mx;
	}
	double rel = den > 0 ? sqrt(num / den) : sqrt(num);
	bool ok = !nonfin && !bad && rel <= tol;

	CHECK(ok, "%s %s %s: rel %.3g (tol %.3g), %zu elements off, %zu not finite", op, shape,
	      what, rel, tol, bad, nonfin);
	printf("%-18s %-28s %-8s %10.2e %10.2e %8.3f  %s\n", op, shape, what, rel, worst, t_ms,
	       ok ? "ok" : "FAIL");
	free(g);
	free(c);
}


#define TOL 1e-2

#endif
