// probe_check.h: the one-file GPU probes' error checks (bench/*.cu): a failed CUDA runtime or
// cuBLAS call prints where and what, and exits 1.
#ifndef SL_BENCH_PROBE_CHECK_H
#define SL_BENCH_PROBE_CHECK_H

#include <cstdio>
#include <cstdlib>

#define CK(x)                                                                               \
	do {                                                                                \
		cudaError_t e_ = (x);                                                       \
		if (e_ != cudaSuccess) {                                                    \
			fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__,                  \
				cudaGetErrorString(e_));                                    \
			exit(1);                                                            \
		}                                                                           \
	} while (0)
#define CB(x)                                                                               \
	do {                                                                                \
		cublasStatus_t s_ = (x);                                                    \
		if (s_ != CUBLAS_STATUS_SUCCESS) {                                          \
			fprintf(stderr, "%s:%d: cuBLAS status %d\n", __FILE__, __LINE__,    \
				(int)s_);                                                   \
			exit(1);                                                            \
		}                                                                           \
	} while (0)

#endif
