/*
 * backend_cpu_async: the cpu backend's asynchronous copies (backend.h, issue 6).
 *
 * The compute "stream" of the cpu backend is the calling thread itself, so ordering after it is
 * free; the copy stream is a real worker thread that runs the copies in issue order.  That makes
 * the cpu backend a faithful model of the GPU's concurrency: a caller that reuses a buffer before
 * the event of the copy reading it has completed gets wrong numbers here too, so ordering bugs of
 * shard's offload show up in the cpu tests.  SHARDLM_CPU_COPY_DELAY_US (tests) delays every copy
 * to make such races likely.  The thread starts on the first copy.
 *
 * The side stream (backend.h side_begin) is the other extreme: what is issued on it (AdamW) is
 * queued and runs only when the compute stream or the host waits for an event recorded on it
 * after that work, i.e. as late as the GPU could ever run it.  A caller that reads what the side
 * stream writes, or overwrites what it reads, without waiting for it first, computes with the
 * values from before the side stream's work and gets other numbers than a run without the side
 * stream: the cpu tests catch it deterministically.  SHARDLM_CPU_SIDE=now (tests) runs it when
 * issued instead, the earliest: work issued before what it reads is final gets other numbers.
 */
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "backend_cpu_async.h"

struct cpu_event {
	unsigned long issued;		/* records issued */
	unsigned long done;		/* records completed */
	unsigned long side_gen;		/* the latest record on the side stream, or 0 */
};

/* an op on the side stream: an AdamW update, a sum of squares, or (ev) a record of ev */
enum side_kind { SIDE_ADAMW_F32, SIDE_ADAMW_C, SIDE_SUMSQ_F32, SIDE_SUMSQ_C, SIDE_RECORD };
struct side_cmd {
	enum side_kind kind;
	float *p, *m, *v;
	const void *grad;		/* the gradient (AdamW) or what is summed */
	void *w_out;
	double *out;			/* sums of squares */
	size_t n;
	struct sl_adamw_args a;
	struct cpu_event *ev;
	unsigned long gen;
	struct side_cmd *next;
};

struct copy_cmd {
	void *dst;
	const void *src;
	size_t bytes;
	struct cpu_event *ev;		/* NULL or recorded when the copy is done */
	unsigned long gen;		/* which record of ev */
	struct copy_cmd *next;
};

struct cpu_async {
	pthread_mutex_t mu;
	pthread_cond_t work;		/* a command was queued, or stop */
	pthread_cond_t done;		/* an event record completed */
	struct copy_cmd *head, *tail;
	pthread_t thr;
	bool started, stop;
	unsigned delay_us;
	/* the side stream: only the issuing (compute) thread touches these */
	bool side_on;			/* between side_begin and side_end */
	bool side_now;			/* SHARDLM_CPU_SIDE=now: run side work when issued */
	struct side_cmd *side_head, *side_tail;
};

static struct cpu_async *Q(struct sl_backend *be)
{
	return be->priv;
}

static void *copier(void *arg)
{
	struct cpu_async *q = arg;

	pthread_mutex_lock(&q->mu);
	for (;;) {
		struct copy_cmd *c;

		while (!q->head && !q->stop)
			pthread_cond_wait(&q->work, &q->mu);
		if (!q->head)
			break;
		c = q->head;
		pthread_mutex_unlock(&q->mu);
		if (q->delay_us)
			usleep(q->delay_us);
		memcpy(c->dst, c->src, c->bytes);
		pthread_mutex_lock(&q->mu);
		q->head = c->next;
		if (!q->head)
			q->tail = NULL;
		if (c->ev && c->ev->done < c->gen)
			c->ev->done = c->gen;
		pthread_cond_broadcast(&q->done);
		free(c);
	}
	pthread_mutex_unlock(&q->mu);
	return NULL;
}

static void enqueue(struct sl_backend *be, void *dst, const void *src, size_t bytes, void *ev)
{
	struct cpu_async *q = Q(be);
	struct copy_cmd *c = calloc(1, sizeof(*c));

	if (!c) {
		fprintf(stderr, "cpu backend: out of host memory (copy queue)\n");
		abort();
	}
	c->dst = dst;
	c->src = src;
	c->bytes = bytes;
	c->ev = ev;
	pthread_mutex_lock(&q->mu);
	if (!q->started) {
		if (pthread_create(&q->thr, NULL, copier, q)) {
			fprintf(stderr, "cpu backend: cannot start the copy thread\n");
			abort();
		}
		q->started = true;
	}
	if (c->ev)
		c->gen = ++c->ev->issued;
	if (q->tail)
		q->tail->next = c;
	else
		q->head = c;
	q->tail = c;
	pthread_cond_signal(&q->work);
	pthread_mutex_unlock(&q->mu);
}

static void *cpu_event_create(struct sl_backend *be)
{
	struct cpu_event *e = calloc(1, sizeof(*e));

	if (!e) {
		fprintf(stderr, "cpu backend: out of host memory (event)\n");
		abort();
	}
	return e;
}

static void cpu_event_destroy(struct sl_backend *be, void *ev)
{
	free(ev);
}

/* compute runs on the caller's thread: everything issued before is already done */
static void cpu_upload_async(struct sl_backend *be, void *dst, const void *src, size_t bytes,
			     bool after_compute, void *done)
{
	enqueue(be, dst, src, bytes, done);
}

static void cpu_download_async(struct sl_backend *be, void *dst, const void *src, size_t bytes,
			       bool after_compute, void *done)
{
	enqueue(be, dst, src, bytes, done);
}

static struct side_cmd *side_new(void)
{
	struct side_cmd *c = calloc(1, sizeof(struct side_cmd));

	if (!c) {
		fprintf(stderr, "cpu backend: out of host memory (side stream)\n");
		abort();
	}
	return c;
}

static void side_push(struct cpu_async *q, struct side_cmd *c)
{
	if (q->side_tail)
		q->side_tail->next = c;
	else
		q->side_head = c;
	q->side_tail = c;
}

/* run the side stream's queue until @e's latest side record (all of it when e is NULL) */
static void side_run(struct sl_backend *be, struct cpu_event *e)
{
	struct cpu_async *q = Q(be);

	while (q->side_head && (!e || e->done < e->side_gen)) {
		struct side_cmd *c = q->side_head;

		q->side_head = c->next;
		if (!q->side_head)
			q->side_tail = NULL;
		switch (c->kind) {
		case SIDE_RECORD:
			pthread_mutex_lock(&q->mu);
			if (c->ev->done < c->gen)
				c->ev->done = c->gen;
			pthread_mutex_unlock(&q->mu);
			break;
		case SIDE_ADAMW_C:
			be->adamw_c(be, c->p, c->m, c->v, c->grad, c->w_out, c->n, &c->a);
			break;
		case SIDE_ADAMW_F32:
			be->adamw_f32(be, c->p, c->m, c->v, c->grad, c->w_out, c->n, &c->a);
			break;
		case SIDE_SUMSQ_C:
			be->sumsq_c(be, c->out, c->grad, c->n);
			break;
		case SIDE_SUMSQ_F32:
			be->sumsq_f32(be, c->out, c->grad, c->n);
			break;
		}
		free(c);
	}
}

/* queue @cmd's copy, or false (outside the side span, or SHARDLM_CPU_SIDE=now: run it now) */
static bool side_queue(struct sl_backend *be, const struct side_cmd *cmd)
{
	struct cpu_async *q = Q(be);
	struct side_cmd *c;

	if (!q || !q->side_on || q->side_now)
		return false;
	c = side_new();
	*c = *cmd;
	side_push(q, c);
	return true;
}

bool sl_backend_cpu_side_defer(struct sl_backend *be, bool c, float *p, float *m, float *v,
			       const void *grad, void *w_out, size_t n,
			       const struct sl_adamw_args *a)
{
	return side_queue(be, &(struct side_cmd){ .kind = c ? SIDE_ADAMW_C : SIDE_ADAMW_F32,
						 .p = p, .m = m, .v = v, .grad = grad,
						 .w_out = w_out, .n = n, .a = *a });
}

bool sl_backend_cpu_side_defer_sumsq(struct sl_backend *be, bool c, double *out, const void *g,
				     size_t n)
{
	return side_queue(be, &(struct side_cmd){ .kind = c ? SIDE_SUMSQ_C : SIDE_SUMSQ_F32,
						 .out = out, .grad = g, .n = n });
}

static void cpu_side_begin(struct sl_backend *be)
{
	if (Q(be)->side_on) {
		fprintf(stderr, "cpu backend: internal error: side stream begun twice\n");
		abort();
	}
	Q(be)->side_on = true;	/* the compute stream's work is done: nothing to wait for */
}

static void cpu_side_end(struct sl_backend *be)
{
	if (!Q(be)->side_on) {
		fprintf(stderr, "cpu backend: internal error: side stream ended but not begun\n");
		abort();
	}
	Q(be)->side_on = false;
}

static void cpu_record_event(struct sl_backend *be, void *ev)
{
	struct cpu_async *q = Q(be);
	struct cpu_event *e = ev;

	pthread_mutex_lock(&q->mu);
	if (q->side_on && !q->side_now) {
		struct side_cmd *c = side_new();

		c->kind = SIDE_RECORD;
		c->ev = e;
		c->gen = e->side_gen = ++e->issued;
		side_push(q, c);
	} else {
		e->done = ++e->issued;	/* the compute stream is this thread: done */
	}
	pthread_mutex_unlock(&q->mu);
}

static void cpu_sync_event(struct sl_backend *be, void *ev)
{
	struct cpu_async *q = Q(be);
	struct cpu_event *e = ev;

	side_run(be, e);
	pthread_mutex_lock(&q->mu);
	{
		unsigned long want = e->issued;

		while (e->done < want)
			pthread_cond_wait(&q->done, &q->mu);
	}
	pthread_mutex_unlock(&q->mu);
}

void sl_backend_cpu_async_init(struct sl_backend *be)
{
	struct cpu_async *q = calloc(1, sizeof(*q));
	const char *d = getenv("SHARDLM_CPU_COPY_DELAY_US");

	if (!q) {
		fprintf(stderr, "cpu backend: out of host memory\n");
		abort();
	}
	pthread_mutex_init(&q->mu, NULL);
	pthread_cond_init(&q->work, NULL);
	pthread_cond_init(&q->done, NULL);
	q->delay_us = d ? (unsigned)strtoul(d, NULL, 10) : 0;
	q->side_now = getenv("SHARDLM_CPU_SIDE") && !strcmp(getenv("SHARDLM_CPU_SIDE"), "now");
	be->priv = q;
	be->event_create = cpu_event_create;
	be->event_destroy = cpu_event_destroy;
	be->upload_async = cpu_upload_async;
	be->download_async = cpu_download_async;
	/* the compute stream is this thread: it waits as the host does */
	be->wait_event = cpu_sync_event;
	be->sync_event = cpu_sync_event;
	be->side_begin = cpu_side_begin;
	be->side_end = cpu_side_end;
	be->record_event = cpu_record_event;
}

void sl_backend_cpu_async_fini(struct sl_backend *be)
{
	struct cpu_async *q = Q(be);

	if (!q)
		return;
	side_run(be, NULL);	/* a stream's work completes */
	pthread_mutex_lock(&q->mu);
	q->stop = true;
	pthread_cond_signal(&q->work);
	pthread_mutex_unlock(&q->mu);
	if (q->started)
		pthread_join(q->thr, NULL);
	pthread_mutex_destroy(&q->mu);
	pthread_cond_destroy(&q->work);
	pthread_cond_destroy(&q->done);
	free(q);
	be->priv = NULL;
}
