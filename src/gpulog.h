/*
 * gpulog: the job's GPU log, one file per node.
 *
 * A sampler thread on each node's local rank 0 appends, every gpu_log.every_s seconds, one line per
 * GPU of this job on this node in the columns of `nvidia-smi --query-gpu=timestamp,index,
 * memory.used,utilization.gpu --format=csv` plus `host` last:
 *
 *   timestamp, index, memory.used [MiB], utilization.gpu [%], host
 *   2026/11/29 16:05:01.123, 0, 1234 MiB, 87 %, node07
 *
 * NVML is loaded at run time (dlopen "libnvidia-ml.so.1", or $SHARDLM_NVML_LIB), so there is no
 * build dependency and a machine without it only gets one log line saying so.
 */
#ifndef SL_GPULOG_H
#define SL_GPULOG_H

#include <stddef.h>

struct sl_gpulog;

/*
 * Start sampling into @pattern (gpu_log.file: "%j" -> $SLURM_JOB_ID or "local", "%h" -> the short
 * host name, "%%" -> "%"; missing folders are made; the file is appended to, the header written
 * when it is new) every @every_s seconds, the first sample at once.
 * @gpus: this node's GPUs of the job, @n of them, each a PCI bus id as cudaDeviceGetPCIBusId
 * writes it ("0000:1B:00.0"; NVML's "00000000:1b:00.0" works too) or an NVML device index ("3");
 * @n == 0: every GPU of the node.  The index column is NVML's (= nvidia-smi's) index.
 * Returns NULL when nothing is sampled (@every_s <= 0, no NVML, no GPU matched, the file cannot be
 * opened: each but the first says so in one line); training goes on either way.
 */
struct sl_gpulog *sl_gpulog_start(const char *pattern, double every_s, const char *const *gpus,
				  int n);

/* Stop the thread, close the file, unload NVML.  NULL is fine. */
void sl_gpulog_stop(struct sl_gpulog *g);

/* The file written (the pattern expanded). */
const char *sl_gpulog_path(const struct sl_gpulog *g);

/* Expand %j, %h and %% of @pattern into @out (@n bytes).  0, or -1 when it does not fit. */
int sl_gpulog_expand(const char *pattern, char *out, size_t n);

#endif
