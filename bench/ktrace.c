/*
 * ktrace.c: a CUDA injection library that writes every kernel, memcpy and memset a program runs
 * on the GPU, with its start and end as the GPU saw them (CUPTI activity records; concurrent
 * kernels are not serialized, the clocks are left as they are), for bench/ktrace.py to sum by
 * step.  Unlike bench/kernel_profile.sh (Nsight Compute: each kernel alone), it shows a step as
 * it runs: overlap between streams and the GPU's idle gaps.
 *
 *   KTRACE_OUT=trace.csv CUDA_INJECTION64_PATH=$PWD/test/libktrace.so shardlm train ...
 *   python3 bench/ktrace.py trace.csv
 *
 * One CSV line a record: kind (K kernel, C memcpy, S memset), start ns, end ns, stream, then the
 * kernel's (mangled) name, or the copy's kind and bytes.  KTRACE_OUT defaults to ktrace.csv; the
 * file is written as the CUPTI buffers fill and completed at exit.
 */
#include <cupti.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* large buffers: CUPTI hands a full one over while the program runs, the likely cause of a
 * 4.7 ms host stall seen once with 8 MB ones (bench/RESULTS.md, twenty-fifth session); 64 MB
 * holds tens of steps of the benchmark shapes */
#define BUF_BYTES (64u << 20)

static FILE *out;
static unsigned long long dropped;

static void CUPTIAPI buf_requested(uint8_t **buf, size_t *size, size_t *max_records)
{
	*buf = aligned_alloc(8, BUF_BYTES);
	*size = *buf ? BUF_BYTES : 0;
	*max_records = 0;
}

static void put_record(const CUpti_Activity *r)
{
	switch (r->kind) {
	case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
	case CUPTI_ACTIVITY_KIND_KERNEL: {
		const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)r;
		fprintf(out, "K,%llu,%llu,%u,%s\n", (unsigned long long)k->start,
			(unsigned long long)k->end, k->streamId, k->name ? k->name : "?");
		break;
	}
	case CUPTI_ACTIVITY_KIND_MEMCPY: {
		const CUpti_ActivityMemcpy6 *c = (const CUpti_ActivityMemcpy6 *)r;
		fprintf(out, "C,%llu,%llu,%u,copy%u %llu\n", (unsigned long long)c->start,
			(unsigned long long)c->end, c->streamId, (unsigned)c->copyKind,
			(unsigned long long)c->bytes);
		break;
	}
	case CUPTI_ACTIVITY_KIND_MEMSET: {
		const CUpti_ActivityMemset4 *s = (const CUpti_ActivityMemset4 *)r;
		fprintf(out, "S,%llu,%llu,%u,memset %llu\n", (unsigned long long)s->start,
			(unsigned long long)s->end, s->streamId, (unsigned long long)s->bytes);
		break;
	}
	default:
		break;
	}
}

static void CUPTIAPI buf_completed(CUcontext ctx, uint32_t stream, uint8_t *buf, size_t size,
				   size_t valid)
{
	CUpti_Activity *r = NULL;
	size_t n = 0;

	(void)size;
	while (cuptiActivityGetNextRecord(buf, valid, &r) == CUPTI_SUCCESS)
		put_record(r);
	if (cuptiActivityGetNumDroppedRecords(ctx, stream, &n) == CUPTI_SUCCESS)
		dropped += n;
	free(buf);
}

static void at_exit(void)
{
	cuptiActivityFlushAll(1);
	if (dropped)
		fprintf(stderr, "ktrace: %llu records dropped\n", dropped);
	if (out && fclose(out) != 0)
		perror("ktrace: writing the trace");
	out = NULL;
}

/* InitializeInjection's failure (0), said on stderr */
static int fail(const char *what, CUptiResult e)
{
	const char *s = NULL;

	cuptiGetResultString(e, &s);
	fprintf(stderr, "ktrace: %s: %s\n", what, s ? s : "unknown CUPTI error");
	return 0;
}

/* called by the CUDA driver at its initialization when CUDA_INJECTION64_PATH names this file */
int InitializeInjection(void);
int InitializeInjection(void)
{
	static const CUpti_ActivityKind kinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL,
						   CUPTI_ACTIVITY_KIND_MEMCPY,
						   CUPTI_ACTIVITY_KIND_MEMSET};
	const char *path = getenv("KTRACE_OUT");
	CUptiResult e;

	if (!path || !*path)
		path = "ktrace.csv";
	out = fopen(path, "w");
	if (!out) {
		fprintf(stderr, "ktrace: cannot write %s: ", path);
		perror(NULL);
		return 0;
	}
	e = cuptiActivityRegisterCallbacks(buf_requested, buf_completed);
	if (e != CUPTI_SUCCESS)
		return fail("registering the buffer callbacks", e);
	for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++) {
		e = cuptiActivityEnable(kinds[i]);
		if (e != CUPTI_SUCCESS)
			return fail("enabling an activity kind", e);
	}
	atexit(at_exit);
	return 1;
}
