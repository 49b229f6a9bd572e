/*
 * test_cuda_async (check-gpu): the cuda backend's asynchronous transfers, the ordering offload
 * relies on, with copies large enough (256 MB) to be in flight while the next call is issued:
 *  - a download with after_compute sees what the kernels issued before it wrote;
 *  - the compute stream, told to wait for an upload's event, reads the uploaded data;
 *  - copies issued and synchronized from a second thread (shard's offload worker) work;
 *  - host_alloc gives zeroed memory.
 * Expected values are the host's own arithmetic (bf16 round to nearest even of known floats).
 */
#include <pthread.h>
#include <stdint.h>

#include "backend.h"
#include "host_adamw.h"
#include "testutil.h"

#define N (64u << 20)		/* floats: 256 MB a buffer */

static struct sl_backend *be;

/* what to_compute then to_f32 make of x: bf16 rounding, exactly */
static float bf16_round(float x)
{
	uint16_t h;
	uint32_t u;
	float y;

	sl_host_to_compute(&h, &x, 2, 1);
	u = (uint32_t)h << 16;
	memcpy(&y, &u, sizeof(y));
	return y;
}

static float pattern(size_t i, int r)
{
	return (float)((i * 2654435761u + (unsigned)r * 97u) % 100003u) * 1.0009765625f - 5e4f;
}

static size_t mismatches(const float *got, int r, bool rounded)
{
	size_t bad = 0;

	for (size_t i = 0; i < N; i++) {
		float w = rounded ? bf16_round(pattern(i, r)) : pattern(i, r);

		bad += got[i] != w;
	}
	return bad;
}

struct side {
	float *host, *dev;
	void *ev;
	volatile int done;
};

static void *side_upload(void *arg)
{
	struct side *sd = arg;

	be->upload_async(be, sd->dev, sd->host, N * sizeof(float), false, sd->ev);
	be->sync_event(be, sd->ev);
	sd->done = 1;
	return NULL;
}

int main(void)
{
	float *h1, *h2, *d32, *dout;
	void *dbf, *ev;
	size_t zeros = 0;

	be = sl_backend_cuda_create(0);
	if (!be) {
		fprintf(stderr, "test_cuda_async: no GPU: skipped\n");
		return 77;
	}
	CHECK(be->host_alloc && be->upload_async && be->download_async && be->wait_event &&
	      be->sync_event && be->event_create);
	h1 = be->host_alloc(be, N * sizeof(float));
	h2 = be->host_alloc(be, N * sizeof(float));
	for (size_t i = 0; i < N; i += 4096)
		zeros += h1[i] != 0;
	CHECK(zeros == 0, "host_alloc memory is not zeroed");
	d32 = be->alloc(be, N * sizeof(float));
	dout = be->alloc(be, N * sizeof(float));
	dbf = be->alloc(be, N * 2);
	ev = be->event_create(be);

	/* 1. kernels then a download ordered after them */
	for (size_t i = 0; i < N; i++)
		h1[i] = pattern(i, 1);
	be->upload(be, d32, h1, N * sizeof(float));
	be->to_compute(be, dbf, d32, N);
	be->to_f32(be, dout, dbf, N);
	be->download_async(be, h2, dout, N * sizeof(float), true, ev);
	be->sync_event(be, ev);
	CHECK(mismatches(h2, 1, true) == 0, "the download did not wait for the kernels");

	/* 2. an upload, the compute stream waiting for its event, kernels reading it */
	for (size_t i = 0; i < N; i++)
		h1[i] = pattern(i, 2);
	be->upload_async(be, d32, h1, N * sizeof(float), true, ev);
	be->wait_event(be, ev);
	be->to_compute(be, dbf, d32, N);
	be->to_f32(be, dout, dbf, N);
	be->download(be, h2, dout, N * sizeof(float));
	CHECK(mismatches(h2, 2, true) == 0, "the compute stream did not wait for the upload");

	/* 3. an upload issued and synchronized by another thread */
	{
		struct side sd = { .host = h1, .dev = d32, .ev = be->event_create(be) };
		pthread_t t;

		for (size_t i = 0; i < N; i++)
			h1[i] = pattern(i, 3);
		CHECK(pthread_create(&t, NULL, side_upload, &sd) == 0);
		pthread_join(t, NULL);
		CHECK(sd.done);
		be->wait_event(be, sd.ev);
		be->download(be, h2, d32, N * sizeof(float));
		CHECK(mismatches(h2, 3, false) == 0, "the second thread's upload");
		be->event_destroy(be, sd.ev);
	}

	be->event_destroy(be, ev);
	be->free(be, d32);
	be->free(be, dout);
	be->free(be, dbf);
	be->host_free(be, h1);
	be->host_free(be, h2);
	be->destroy(be);
	return test_exit("test_cuda_async");
}
