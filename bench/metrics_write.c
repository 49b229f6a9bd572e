/*
 * metrics_write: what rewriting RUN/training_metrics.json costs as a run grows (src/metrics.c):
 * N steps, each with the expert counts of L MoE layers of E experts (0 0: a dense model), the
 * file written after every step as the trainer does; prints, at each quarter of the run, the
 * milliseconds a synchronous rewrite takes and what the trainer's step waits for (handing the
 * document to the writer thread), and the file's size.
 *   metrics_write L E N [DIR]        e.g. 48 128 1000 (Qwen3-30B-A3B's MoE), 0 0 4000 (dense)
 * Built against a configured tree (after make), e.g. with CUDA:
 *   mpicc -O2 -I. -Isrc -I/usr/include/hdf5/serial bench/metrics_write.c src/libshardlm.a \
 *     cuda/libshardlm_cuda.a -L/usr/lib/x86_64-linux-gnu/hdf5/serial -lhdf5 -lyaml -ljansson \
 *     -L/usr/local/cuda/lib64 -lcudart -lcublasLt -lcublas -lnccl -lstdc++ -lpthread -lm
 * (without CUDA, drop cuda/libshardlm_cuda.a and the CUDA libraries).
 */
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>

#include "metrics.h"

static double now(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
	const int L = argc > 3 ? atoi(argv[1]) : 0, E = argc > 3 ? atoi(argv[2]) : 0;
	const int N = argc > 3 ? atoi(argv[3]) : 0;
	char path[4096];
	struct sl_metrics *m;
	long long *et;
	double wait = 0;

	if (argc < 4 || L < 0 || E < 0 || N < 4) {
		fprintf(stderr, "usage: metrics_write L E N [DIR]   (N >= 4)\n");
		return 2;
	}
	snprintf(path, sizeof(path), "%s/training_metrics.json", argc > 4 ? argv[4] : ".");
	m = sl_metrics_create(path);
	et = malloc(sizeof(*et) * (L * E ? L * E : 1));
	if (!m || !et)
		return 1;
	srand(1);
	for (int i = 0; i < L * E; i++)
		et[i] = rand() % 5000;
	printf("| step | synchronous rewrite ms | the step's wait ms (mean) | file MB |\n|---|---|---|---|\n");
	for (int s = 1; s <= N; s++) {
		struct sl_step_metrics sm = {
			.step = s, .time_s = 0.2 + 1e-3 * (s % 7), .end_unix = 1.7e9 + s,
			.loss = 1.0 / s, .lr = 1e-5, .grad_norm = 0.5, .records = 16, .tokens = 32768,
			.moe_layers = L, .n_experts = E, .expert_tokens = et,
		};
		double t = now();

		sl_metrics_add_step(m, &sm);
		if (sl_metrics_write_async(m))
			return 1;
		wait += now() - t;
		if (s % (N / 4) == 0) {
			struct stat st;
			double sync;

			if (sl_metrics_flush(m))
				return 1;
			t = now();
			if (sl_metrics_write(m))
				return 1;
			sync = now() - t;
			stat(path, &st);
			printf("| %d | %.1f | %.3f | %.1f |\n", s, 1e3 * sync, 1e3 * wait / s,
			       st.st_size / 1e6);
		}
	}
	sl_metrics_destroy(m);
	free(et);
	return 0;
}
