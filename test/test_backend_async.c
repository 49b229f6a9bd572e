/*
 * test_backend_async: the cpu backend's asynchronous transfers (backend.h), which shard's
 * offload relies on for its ordering: copies really run later, on their own thread; copies of a
 * direction run in issue order; an event stands for its latest record; copies and waits work
 * from two threads at once; the side stream's work runs as late as it may.  Also the host's bf16 rounding (host_adamw.c) against hand-worked
 * halfway cases (round to nearest even, as the cuda backend's __float2bfloat16_rn).
 */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <unistd.h>

#include "backend.h"
#include "host_adamw.h"
#include "testutil.h"

#define N 4096

static struct sl_backend *be;

static bool all_eq(const float *x, float v, int n)
{
	for (int i = 0; i < n; i++)
		if (x[i] != v)
			return false;
	return true;
}

struct side {
	float *dev, *host;
	void *ev;
	bool ok;
};

/* a second thread: 50 rounds of upload, download back, check */
static void *side_thread(void *arg)
{
	struct side *sd = arg;
	float *back = calloc(N, sizeof(float));

	sd->ok = true;
	for (int r = 0; r < 50; r++) {
		for (int i = 0; i < N; i++)
			sd->host[i] = (float)(r + i);
		be->upload_async(be, sd->dev, sd->host, N * sizeof(float), false, sd->ev);
		be->sync_event(be, sd->ev);
		be->download_async(be, back, sd->dev, N * sizeof(float), false, sd->ev);
		be->sync_event(be, sd->ev);
		for (int i = 0; i < N; i++)
			if (back[i] != (float)(r + i))
				sd->ok = false;
	}
	free(back);
	return NULL;
}

int main(void)
{
	float *a, *b, *h, *x, *y;
	void *e1, *e2;

	setenv("SHARDLM_CPU_COPY_DELAY_US", "100000", 1);	/* 0.1 s before every copy */
	be = sl_backend_cpu_create();
	CHECK(be && be->upload_async && be->download_async && be->sync_event && be->wait_event);
	a = calloc(N, sizeof(float));
	b = calloc(N, sizeof(float));
	h = calloc(N, sizeof(float));
	x = be->alloc(be, N * sizeof(float));
	y = be->alloc(be, N * sizeof(float));
	e1 = be->event_create(be);
	e2 = be->event_create(be);
	for (int i = 0; i < N; i++) {
		a[i] = 1;
		b[i] = 2;
	}

	/* an event never recorded is complete */
	be->sync_event(be, e1);
	be->wait_event(be, e2);

	/* the copy is asynchronous: right after the call (0.1 s before it runs) nothing moved */
	be->download_async(be, h, a, N * sizeof(float), true, e1);
	CHECK(all_eq(h, 0, N), "a download finished inside its call");
	be->sync_event(be, e1);
	CHECK(all_eq(h, 1, N), "sync_event returned before the copy was done");

	/* one direction runs in issue order: the second upload wins */
	be->upload_async(be, x, a, N * sizeof(float), false, NULL);
	be->upload_async(be, x, b, N * sizeof(float), true, e2);
	be->wait_event(be, e2);		/* cpu: the "compute stream" is this thread */
	CHECK(all_eq(x, 2, N), "uploads ran out of order");

	/* an event stands for its latest record: both copies done when it completes */
	be->upload_async(be, y, a, N * sizeof(float), false, e1);
	be->upload_async(be, x, a, N * sizeof(float), false, e1);
	be->sync_event(be, e1);
	CHECK(all_eq(y, 1, N) && all_eq(x, 1, N), "the event's earlier record was waited for");

	/* two threads issuing copies and waiting at once */
	setenv("SHARDLM_CPU_COPY_DELAY_US", "0", 1);
	{
		struct sl_backend *fast = sl_backend_cpu_create(), *slow = be;
		struct side sd = { .dev = fast->alloc(fast, N * sizeof(float)),
				   .host = calloc(N, sizeof(float)) };
		pthread_t t;
		float *back = calloc(N, sizeof(float));
		bool ok = true;

		be = fast;
		sd.ev = be->event_create(be);
		void *ev = be->event_create(be);
		float *dev = be->alloc(be, N * sizeof(float));

		CHECK(pthread_create(&t, NULL, side_thread, &sd) == 0);
		for (int r = 0; r < 50; r++) {
			for (int i = 0; i < N; i++)
				a[i] = (float)(r - i);
			be->upload_async(be, dev, a, N * sizeof(float), true, ev);
			be->wait_event(be, ev);
			be->download_async(be, back, dev, N * sizeof(float), true, ev);
			be->sync_event(be, ev);
			for (int i = 0; i < N; i++)
				if (back[i] != (float)(r - i))
					ok = false;
		}
		pthread_join(t, NULL);
		CHECK(ok, "main thread's round trips");
		CHECK(sd.ok, "second thread's round trips");
		be->event_destroy(be, ev);
		be->event_destroy(be, sd.ev);
		be->free(be, dev);
		be->free(be, sd.dev);
		free(sd.host);
		free(back);
		fast->destroy(fast);
		be = slow;
	}

	/*
	 * The side stream (backend.h side_begin): its work runs only once an event recorded after
	 * it is waited for, the latest a GPU could run it (neither sync() nor the end of the span
	 * runs it), and up to that event only.  AdamW from p = 1, m = v = 0, gradient 2, lr 0.1,
	 * step 1 (bc1 = 0.1, bc2 = 0.001), by hand: m/bc1 = 2, sqrt(v/bc2) = 2, p = 1 - 0.1 = 0.9.
	 */
	{
		float *p = be->alloc(be, N * sizeof(float)), *m = be->alloc(be, N * sizeof(float));
		float *v = be->alloc(be, N * sizeof(float)), *g = be->alloc(be, N * sizeof(float));
		const struct sl_adamw_args ar = { .lr = 0.1f, .beta1 = 0.9f, .beta2 = 0.999f,
						  .eps = 1e-8f, .bc1 = 0.1f, .bc2 = 0.001f,
						  .grad_scale = 1 };
		bool near = true;

		CHECK(be->side_begin && be->side_end && be->record_event);
		for (int i = 0; i < N; i++) {
			p[i] = 1;
			g[i] = 2;
		}
		double *sq = be->alloc(be, sizeof(double));

		be->side_begin(be);
		be->adamw_f32(be, p, m, v, g, NULL, N / 2, &ar);
		be->record_event(be, e1);
		be->adamw_f32(be, p + N / 2, m + N / 2, v + N / 2, g + N / 2, NULL, N / 2, &ar);
		be->sumsq_f32(be, sq, g, N);		/* 4 N */
		be->record_event(be, e2);
		be->side_end(be);
		be->sync(be);
		CHECK(all_eq(p, 1, N) && *sq == 0,
		      "side stream work ran before its event was waited for");
		be->wait_event(be, e1);
		for (int i = 0; i < N / 2; i++)
			near &= fabsf(p[i] - 0.9f) < 1e-6f;
		CHECK(near, "waiting for the first event did not run the first update");
		CHECK(all_eq(p + N / 2, 1, N / 2), "waiting for the first event ran the second update");
		be->sync_event(be, e2);
		for (int i = N / 2; i < N; i++)
			near &= fabsf(p[i] - 0.9f) < 1e-6f;
		CHECK(near && *sq == 4.0 * N, "sync_event did not run the second update and sum");
		be->free(be, sq);
		/* recorded on the compute stream (this thread): complete at once */
		be->record_event(be, e1);
		be->sync_event(be, e1);
		be->free(be, p);
		be->free(be, m);
		be->free(be, v);
		be->free(be, g);
	}

	/* bf16 round to nearest even: halfway cases go to the even neighbour */
	{
		const float in[] = { 1.00390625f,		/* 1 + 2^-8: halfway 0x3f80 / 0x3f81 */
				     1.01171875f,		/* 1 + 3*2^-8: halfway 0x3f81 / 0x3f82 */
				     1.00390625f + 0x1p-20f,	/* just above halfway */
				     -2.0f, 0.0f };
		const uint16_t want[] = { 0x3f80, 0x3f82, 0x3f81, 0xc000, 0x0000 };
		uint16_t out[5];

		sl_host_to_compute(out, in, 2, 5);
		for (int i = 0; i < 5; i++)
			CHECK(out[i] == want[i], "bf16(%.9g) = 0x%04x, want 0x%04x", in[i], out[i],
			      want[i]);
	}

	be->event_destroy(be, e1);
	be->event_destroy(be, e2);
	be->free(be, x);
	be->free(be, y);
	free(a);
	free(b);
	free(h);
	be->destroy(be);
	return test_exit("test_backend_async");
}
