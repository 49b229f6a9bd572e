// context.cu: the per-device context (stream, cuBLASLt handle, workspace, scratch) and the raw
// memory calls the cuda backend's arena is built on.
#include <cstdio>
#include <cstring>
#include <nvtx3/nvToolsExt.h>

#include "common.cuh"

#define WORKSPACE_BYTES (32u << 20)	// cuBLASLt: large enough for its split-K / stream-K algorithms
#define SCRATCH_BYTES (64u << 20)	// column-reduction partials, attention row dots, sum of squares
#define STAGE_SLOTS 8			// as many small uploads in flight before one waits
#define STAGE_BYTES (1u << 20)		// larger uploads (weights, shards) stay synchronous

extern "C" struct sl_cuda *sl_cuda_create(int device)
{
	struct sl_cuda *c;
	int n = 0;

	if (cudaGetDeviceCount(&n) != cudaSuccess || device < 0 || device >= n) {
		fprintf(stderr, "cuda: no device %d (%d visible)\n", device, n);
		return NULL;
	}
	c = (struct sl_cuda *)calloc(1, sizeof(*c));
	if (!c)
		return NULL;
	c->device = device;
	CUDA_CHECK(cudaSetDevice(device));
	// non-blocking: the legacy default stream must not serialize us against a comm stream.
	// The greatest priority: work on the side stream fills only what the compute stream
	// leaves idle (every stream that runs kernels of a step has this one).
	CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&c->prio_side, &c->prio));
	CUDA_CHECK(cudaStreamCreateWithPriority(&c->stream, cudaStreamNonBlocking, c->prio));
	CUBLAS_CHECK(cublasLtCreate(&c->lt));
	c->ws_bytes = WORKSPACE_BYTES;
	c->scratch_bytes = SCRATCH_BYTES;
	CUDA_CHECK(cudaMalloc(&c->ws, c->ws_bytes));
	CUDA_CHECK(cudaMalloc(&c->scratch, c->scratch_bytes));
	// the side stream's own (sl_cuda_side_begin): the compute stream's may be in use meanwhile
	CUDA_CHECK(cudaMalloc(&c->side_scratch, SIDE_SCRATCH_BYTES));
	// without pinned memory every upload simply stays synchronous
	if (cudaHostAlloc((void **)&c->stage, (size_t)STAGE_SLOTS * STAGE_BYTES,
			  cudaHostAllocDefault) != cudaSuccess) {
		cudaGetLastError();
		c->stage = NULL;
	}
	for (int i = 0; c->stage && i < STAGE_SLOTS; i++)
		CUDA_CHECK(cudaEventCreateWithFlags(&c->stage_ev[i], cudaEventDisableTiming));
	sl_cuda_copy_init(c);
	return c;
}

extern "C" void sl_cuda_destroy(struct sl_cuda *c)
{
	if (!c)
		return;
	CUDA_CHECK(cudaStreamSynchronize(c->stream));
	if (c->side) {
		CUDA_CHECK(cudaStreamSynchronize(c->side));
		CUDA_CHECK(cudaStreamDestroy(c->side));
		CUDA_CHECK(cudaEventDestroy(c->side_fork));
	}
	sl_cuda_copy_fini(c);
	sl_cuda_gemm_cache_free(c);
	sl_cuda_moe_free(c);
	if (c->ev0) {
		cudaEventDestroy(c->ev0);
		cudaEventDestroy(c->ev1);
	}
	if (c->stage) {
		for (int i = 0; i < STAGE_SLOTS; i++)
			cudaEventDestroy(c->stage_ev[i]);
		cudaFreeHost(c->stage);
	}
	CUDA_CHECK(cudaFree(c->ws));
	CUDA_CHECK(cudaFree(c->scratch));
	CUDA_CHECK(cudaFree(c->side_scratch));
	CUBLAS_CHECK(cublasLtDestroy(c->lt));
	CUDA_CHECK(cudaStreamDestroy(c->stream));
	free(c);
}

extern "C" void *sl_cuda_stream(struct sl_cuda *c)
{
	return (void *)c->stream;
}

// The side stream: launches go to it (c->stream is it) until sl_cuda_side_end; it first waits
// for what the compute stream has been given so far.
extern "C" void sl_cuda_side_begin(struct sl_cuda *c)
{
	if (c->main) {
		fprintf(stderr, "cuda: internal error: side stream begun twice\n");
		abort();
	}
	if (!c->side) {
		CUDA_CHECK(cudaStreamCreateWithPriority(&c->side, cudaStreamNonBlocking,
							c->prio_side));
		CUDA_CHECK(cudaEventCreateWithFlags(&c->side_fork, cudaEventDisableTiming));
	}
	CUDA_CHECK(cudaEventRecord(c->side_fork, c->stream));
	CUDA_CHECK(cudaStreamWaitEvent(c->side, c->side_fork, 0));
	c->main = c->stream;
	c->stream = c->side;
}

extern "C" void sl_cuda_side_end(struct sl_cuda *c)
{
	if (!c->main) {
		fprintf(stderr, "cuda: internal error: side stream ended but not begun\n");
		abort();
	}
	c->stream = c->main;
	c->main = NULL;
}

// @ev (sl_cuda_event_create's) records where the stream launches go to has reached
extern "C" void sl_cuda_record_event(struct sl_cuda *c, void *ev)
{
	CUDA_CHECK(cudaEventRecord((cudaEvent_t)ev, c->stream));
}

extern "C" void sl_cuda_set_deterministic(struct sl_cuda *c, bool on)
{
	c->deterministic = on;
}

extern "C" size_t sl_cuda_fixed_bytes(struct sl_cuda *c)
{
	return c->ws_bytes + c->scratch_bytes + SIDE_SCRATCH_BYTES;
}

// grows the scratch to at least bytes (the stream drained first; the new one allocated before the
// old is freed): 0, or -1 with the old one kept when the device has no room
int sl_cuda_scratch_grow(struct sl_cuda *c, size_t bytes)
{
	void *p;

	if (bytes <= c->scratch_bytes)
		return 0;
	CUDA_CHECK(cudaStreamSynchronize(c->stream));
	if (cudaMalloc(&p, bytes) != cudaSuccess) {
		cudaGetLastError();
		return -1;
	}
	CUDA_CHECK(cudaFree(c->scratch));
	c->scratch = p;
	c->scratch_bytes = bytes;
	return 0;
}

float *sl_cuda_scratch(struct sl_cuda *c, size_t bytes, const char *who)
{
	if (c->main) {		// on the side stream (sl_cuda_side_begin)
		if (bytes > SIDE_SCRATCH_BYTES) {
			fprintf(stderr, "cuda: %s needs %zu bytes of the side stream's scratch, %u "
				"reserved\n", who, bytes, SIDE_SCRATCH_BYTES);
			abort();
		}
		return (float *)c->side_scratch;
	}
	if (bytes > c->scratch_bytes) {
		fprintf(stderr, "cuda: %s needs %zu bytes of scratch, %zu reserved\n", who, bytes,
			c->scratch_bytes);
		abort();
	}
	return (float *)c->scratch;
}

extern "C" void *sl_cuda_malloc(struct sl_cuda *c, size_t bytes)
{
	void *p = NULL;
	cudaError_t e = cudaMalloc(&p, bytes);

	if (e != cudaSuccess) {
		size_t fr = 0, tot = 0;

		cudaGetLastError();	// clear the sticky-free allocation error
		cudaMemGetInfo(&fr, &tot);
		fprintf(stderr, "cuda: cannot allocate %zu bytes on device %d (%s; %zu of %zu free)\n",
			bytes, c->device, cudaGetErrorString(e), fr, tot);
		return NULL;
	}
	return p;
}

extern "C" void sl_cuda_free(struct sl_cuda *c, void *p)
{
	CUDA_CHECK(cudaFree(p));
}

extern "C" void sl_cuda_memset0(struct sl_cuda *c, void *p, size_t bytes)
{
	if (bytes)
		CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, c->stream));
}

// Copies are memcpy-like for the caller: the host buffer may be reused or read as soon as the call
// returns.  A small upload is copied into a pinned staging slot first, so the transfer can run
// in stream order without the host waiting for the GPU to drain (every consumer, NCCL included,
// runs on this stream, and the host-staged communicator downloads, which synchronizes); a slot
// is reused only after its previous copy has completed.
extern "C" void sl_cuda_upload(struct sl_cuda *c, void *dst, const void *src, size_t bytes)
{
	if (!bytes)
		return;
	if (c->stage && bytes <= STAGE_BYTES) {
		unsigned i = c->stage_next++ % STAGE_SLOTS;
		char *slot = c->stage + (size_t)i * STAGE_BYTES;

		CUDA_CHECK(cudaEventSynchronize(c->stage_ev[i]));
		memcpy(slot, src, bytes);
		CUDA_CHECK(cudaMemcpyAsync(dst, slot, bytes, cudaMemcpyHostToDevice, c->stream));
		CUDA_CHECK(cudaEventRecord(c->stage_ev[i], c->stream));
		return;
	}
	CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->stream));
	CUDA_CHECK(cudaStreamSynchronize(c->stream));
}

extern "C" void sl_cuda_download(struct sl_cuda *c, void *dst, const void *src, size_t bytes)
{
	if (!bytes)
		return;
	CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, c->stream));
	CUDA_CHECK(cudaStreamSynchronize(c->stream));
}

extern "C" void sl_cuda_sync(struct sl_cuda *c)
{
	CUDA_CHECK(cudaStreamSynchronize(c->stream));
}

// NVTX (header-only; a no-op unless a profiler is attached)
extern "C" void sl_cuda_step_range(struct sl_cuda *c, int step)
{
	char name[32];

	if (c->range_open)
		nvtxRangePop();
	c->range_open = step > 0;
	if (step > 0) {
		snprintf(name, sizeof(name), "step %d", step);
		nvtxRangePushA(name);
	}
}

// Stream-ordered timing for benchmarks and tests: start records an event; stop records another,
// waits for it and returns the milliseconds between the two.
extern "C" void sl_cuda_timer_start(struct sl_cuda *c)
{
	if (!c->ev0) {
		CUDA_CHECK(cudaEventCreate(&c->ev0));
		CUDA_CHECK(cudaEventCreate(&c->ev1));
	}
	CUDA_CHECK(cudaEventRecord(c->ev0, c->stream));
}

extern "C" double sl_cuda_timer_stop(struct sl_cuda *c)
{
	float ms = 0;

	CUDA_CHECK(cudaEventRecord(c->ev1, c->stream));
	CUDA_CHECK(cudaEventSynchronize(c->ev1));
	CUDA_CHECK(cudaEventElapsedTime(&ms, c->ev0, c->ev1));
	return ms;
}

bool sl_cuda_sm90(void)
{
	static int ok = -1;

	if (ok < 0) {
		int dev = 0, major = 0, minor = 0;

		CUDA_CHECK(cudaGetDevice(&dev));
		CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
		CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
		ok = major == 9 && minor == 0;
	}
	return ok;
}
