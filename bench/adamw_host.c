/*
 * adamw_host: the offloaded optimizer's host AdamW alone (src/host_adamw.c, the code shard's
 * offload worker runs), against the host's copy bandwidth measured in the same run.
 *
 *   adamw_host [--params N] [--units U] [--reps R] [--copy-gib G] [--step-params P]
 *
 * Updates N fp32 parameters split into U equal units, one sl_host_adamw call per unit as the
 * worker makes them (fp32 master, m, v and gradient in; master, m, v and the bf16 copy out: 30
 * bytes an element), R times, and copies a G GiB buffer R times, with every OpenMP thread
 * memcpy-ing its slice and with a plain parallel copy loop, taking the faster (2 bytes moved
 * per byte copied).  Prints the best of the R repetitions:
 * copy GB/s, AdamW GB/s, their ratio, and the AdamW time of one optimizer step of P parameters
 * (T_adam; default N) at the measured rate.  GB = 10^9 bytes.  OMP_NUM_THREADS sets the threads.
 */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host_adamw.h"

#define ADAM_BYTES 30.0		/* read p, m, v, g (16), write p, m, v (12) + bf16 (2) */

static void *big(size_t bytes)
{
	void *p = NULL;

	if (posix_memalign(&p, 4096, bytes)) {
		fprintf(stderr, "adamw_host: cannot allocate %zu bytes\n", bytes);
		exit(1);
	}
	return p;
}

/* first touch on the threads that will stream the buffer */
static void fill(float *x, size_t n, float v)
{
#pragma omp parallel for schedule(static)
	for (size_t i = 0; i < n; i++)
		x[i] = v * (float)((i % 1000) + 1) * 1e-3f;
}

/* a STREAM-style copy loop (the compiler may use non-temporal stores or not) */
static double copy_loop(float *dst, const float *src, size_t n)
{
	double t0 = omp_get_wtime();

#pragma omp parallel for simd schedule(static)
	for (size_t i = 0; i < n; i++)
		dst[i] = src[i];
	return omp_get_wtime() - t0;
}

static double copy_once(char *dst, const char *src, size_t bytes)
{
	double t0 = omp_get_wtime();

#pragma omp parallel
	{
		int nt = omp_get_num_threads(), id = omp_get_thread_num();
		size_t per = (bytes / nt + 4095) / 4096 * 4096;
		size_t lo = per * id, hi = lo + per < bytes ? lo + per : bytes;

		if (lo < hi)
			memcpy(dst + lo, src + lo, hi - lo);
	}
	return omp_get_wtime() - t0;
}

int main(int argc, char **argv)
{
	double params = 1e9, step_params = 0, copy_gib = 4;
	int units = 38, reps = 3;
	struct sl_adamw_args a = { .lr = 1e-5f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
				   .weight_decay = 0.1f, .grad_scale = 1.0f };
	double best_copy = 1e30, best_adam = 1e30;

	for (int i = 1; i + 1 < argc; i += 2) {
		if (!strcmp(argv[i], "--params"))
			params = atof(argv[i + 1]);
		else if (!strcmp(argv[i], "--units"))
			units = atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--reps"))
			reps = atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--copy-gib"))
			copy_gib = atof(argv[i + 1]);
		else if (!strcmp(argv[i], "--step-params"))
			step_params = atof(argv[i + 1]);
		else {
			fprintf(stderr, "usage: adamw_host [--params N] [--units U] [--reps R] "
				"[--copy-gib G] [--step-params P]\n");
			return 2;
		}
	}
	if (!(params >= units) || units < 1 || reps < 1 || !(copy_gib > 0)) {
		fprintf(stderr, "adamw_host: bad arguments\n");
		return 2;
	}
	if (!step_params)
		step_params = params;

	size_t per = (size_t)(params / units), n = per * (size_t)units;
	size_t cbytes = (size_t)(copy_gib * 1073741824.0);
	float *p = big(n * 4), *m = big(n * 4), *v = big(n * 4), *g = big(n * 4);
	unsigned short *w = big(n * 2);
	char *c0 = big(cbytes), *c1 = big(cbytes);

	fill(p, n, 0.5f);
	fill(m, n, 0.01f);
	fill(v, n, 1e-4f);
	fill(g, n, 0.02f);
	memset(w, 0, n * 2);
	fill((float *)c0, cbytes / 4, 1.0f);
	fill((float *)c1, cbytes / 4, 0.0f);

	/* the copy bandwidth: the faster of glibc's memcpy and a plain loop, per thread slice */
	for (int r = 0; r < reps; r++) {
		double t = copy_once(c1, c0, cbytes), t2 = copy_loop((float *)c1, (float *)c0,
								    cbytes / 4);

		if (t < best_copy)
			best_copy = t;
		if (t2 < best_copy)
			best_copy = t2;
	}
	for (int r = 0; r < reps; r++) {
		double t0 = omp_get_wtime();

		a.bc1 = 1.0f - 0.9f;
		a.bc2 = 1.0f - 0.95f;
		for (int u = 0; u < units; u++)
			sl_host_adamw(p + u * per, m + u * per, v + u * per, g + u * per,
				      w + u * per, 2, per, &a);
		t0 = omp_get_wtime() - t0;
		if (t0 < best_adam)
			best_adam = t0;
	}

	double copy_gbs = 2.0 * cbytes / best_copy / 1e9;
	double adam_gbs = ADAM_BYTES * n / best_adam / 1e9;

	printf("threads %d, %zu parameters in %d units, best of %d\n", omp_get_max_threads(), n,
	       units, reps);
	printf("copy_gbs %.1f   (%.1f GiB, the faster of memcpy and a copy loop: read + write bytes/s)\n", copy_gbs,
	       copy_gib);
	printf("adamw_gbs %.1f   (%.0f bytes per parameter: p, m, v, g in; p, m, v, bf16 out)\n",
	       adam_gbs, ADAM_BYTES);
	printf("adamw_over_copy %.1f%%\n", 100 * adam_gbs / copy_gbs);
	printf("adamw_s %.3f for %zu parameters; T_adam %.3f s for %.0f parameters\n", best_adam,
	       n, ADAM_BYTES * step_params / (adam_gbs * 1e9), step_params);
	/* keep the result alive */
	if (p[n / 2] != p[n / 2])
		printf("nan\n");
	free(p);
	free(m);
	free(v);
	free(g);
	free(w);
	free(c0);
	free(c1);
	return 0;
}
