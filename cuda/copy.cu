// copy.cu: asynchronous host transfers for parallel.offload: pinned host memory, one copy stream
// per direction beside the compute stream, events between them.  Copies may be issued from
// shard's offload worker thread as well as the main one: the runtime is thread-safe, but the
// current device is per thread (set on every call) and order_ev is shared (copy_mu).
#include "common.cuh"

void sl_cuda_copy_init(struct sl_cuda *c)
{
	// non-blocking, as the compute stream: only events order them
	CUDA_CHECK(cudaStreamCreateWithFlags(&c->up, cudaStreamNonBlocking));
	CUDA_CHECK(cudaStreamCreateWithFlags(&c->down, cudaStreamNonBlocking));
	CUDA_CHECK(cudaEventCreateWithFlags(&c->order_ev, cudaEventDisableTiming));
	pthread_mutex_init(&c->copy_mu, NULL);
}

void sl_cuda_copy_fini(struct sl_cuda *c)
{
	CUDA_CHECK(cudaStreamSynchronize(c->up));
	CUDA_CHECK(cudaStreamSynchronize(c->down));
	CUDA_CHECK(cudaEventDestroy(c->order_ev));
	CUDA_CHECK(cudaStreamDestroy(c->up));
	CUDA_CHECK(cudaStreamDestroy(c->down));
	pthread_mutex_destroy(&c->copy_mu);
}

extern "C" void *sl_cuda_host_alloc(struct sl_cuda *c, size_t bytes)
{
	void *p = NULL;
	cudaError_t e;

	CUDA_CHECK(cudaSetDevice(c->device));
	// portable: pinned for every context of the process (the GPU log sampler's included)
	e = cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocPortable);
	if (e != cudaSuccess) {
		cudaGetLastError();
		fprintf(stderr, "cuda: cannot pin %zu bytes of host memory (%s)\n", bytes,
			cudaGetErrorString(e));
		return NULL;
	}
	return p;
}

extern "C" void sl_cuda_host_free(struct sl_cuda *c, void *p)
{
	CUDA_CHECK(cudaFreeHost(p));
}

extern "C" void *sl_cuda_event_create(struct sl_cuda *c)
{
	cudaEvent_t ev;

	CUDA_CHECK(cudaSetDevice(c->device));
	CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
	return (void *)ev;
}

extern "C" void sl_cuda_event_destroy(struct sl_cuda *c, void *ev)
{
	CUDA_CHECK(cudaEventDestroy((cudaEvent_t)ev));
}

extern "C" void sl_cuda_copy_async(struct sl_cuda *c, void *dst, const void *src, size_t bytes,
				   int to_device, int after_compute, void *done)
{
	cudaStream_t s = to_device ? c->up : c->down;

	pthread_mutex_lock(&c->copy_mu);
	CUDA_CHECK(cudaSetDevice(c->device));
	if (after_compute) {
		CUDA_CHECK(cudaEventRecord(c->order_ev, c->stream));
		CUDA_CHECK(cudaStreamWaitEvent(s, c->order_ev, 0));
	}
	if (bytes)
		CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, to_device ? cudaMemcpyHostToDevice :
					   cudaMemcpyDeviceToHost, s));
	if (done)
		CUDA_CHECK(cudaEventRecord((cudaEvent_t)done, s));
	pthread_mutex_unlock(&c->copy_mu);
}

extern "C" void sl_cuda_wait_event(struct sl_cuda *c, void *ev)
{
	CUDA_CHECK(cudaStreamWaitEvent(c->stream, (cudaEvent_t)ev, 0));
}

extern "C" void sl_cuda_sync_event(struct sl_cuda *c, void *ev)
{
	CUDA_CHECK(cudaSetDevice(c->device));
	CUDA_CHECK(cudaEventSynchronize((cudaEvent_t)ev));
}
