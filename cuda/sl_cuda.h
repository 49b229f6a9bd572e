/*
 * sl_cuda.h: the only header through which C code reaches cuda/ (extern "C" launchers).
 */
#ifndef SL_CUDA_H
#define SL_CUDA_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Versions of the CUDA runtime, driver, cuBLAS(Lt) and NCCL, as "cuda 13.0 (driver 13.0) ...". */
void sl_cuda_versions(char *buf, size_t n);
/* Number of visible GPUs (0 when there is no driver or device). */
int sl_cuda_device_count(void);

#ifdef __cplusplus
}
#endif

#endif
