/*
 * backend_cpu_async: the cpu backend's asynchronous copies (backend.h, issue 6).
 *
 * The compute "stream" of the cpu backend is the calling thread itself, so ordering after it is
 * free; the copy stream is a real worker thread that runs the copies in issue order.  That makes
 * the cpu backend a faithful model of the GPU's concurrency: a caller that reuses a buffer before
 * the event of the copy reading it has completed gets wrong numbers here too, so ordering bugs of
 * shard's offload show up in the cpu tests.  SHARDLM_CPU_COPY_DELAY_US (tests) delays every copy
 * to make such races likely.  The thread starts on the first copy.
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

static void cpu_sync_event(struct sl_backend *be, void *ev)
{
	struct cpu_async *q = Q(be);
	struct cpu_event *e = ev;

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
	be->priv = q;
	be->event_create = cpu_event_create;
	be->event_destroy = cpu_event_destroy;
	be->upload_async = cpu_upload_async;
	be->download_async = cpu_download_async;
	/* the compute stream is this thread: it waits as the host does */
	be->wait_event = cpu_sync_event;
	be->sync_event = cpu_sync_event;
}

void sl_backend_cpu_async_fini(struct sl_backend *be)
{
	struct cpu_async *q = Q(be);

	if (!q)
		return;
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
