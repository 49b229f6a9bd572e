/*
 * offload: host-resident optimizer state (and weights) with the transfers and the host AdamW
 * overlapped with the GPU (see shard.h, offload.h).
 *
 * Three agents run at once: the main thread issuing the model's ops on the compute stream, the
 * backend's copy streams, and a worker thread here doing the host arithmetic (OpenMP-parallel,
 * vectorized: host_adamw.c).  The schedule of one optimizer step:
 *
 *  backward, unit by unit: the unit's gradient is reduced to fp32 (and reduce-scattered) on the
 *    compute stream into a device staging buffer of a ring of two, then downloaded on the copy
 *    stream (the first micro-batch of a step straight into the host accumulator grad32, later
 *    ones into the host half of the ring pair) while the next unit's backward computes; the
 *    worker waits for the copy, adds it into grad32 and, on the step's last micro-batch, sums
 *    its squares.  A ring pair is reused once the worker is done with it.  With
 *    accum_on_device, earlier micro-batches instead add up in a device fp32 accumulator per
 *    unit and only the last one's sum goes down.
 *  step end: the global norm needs every unit's sum of squares (clipping and the non-finite
 *    check see the whole gradient before anything changes, exactly as without offload), so the
 *    update cannot start before the last unit's gradient is in.  Then the worker runs AdamW
 *    unit by unit in forward order, writing the fp32 master, the moments and the new compute
 *    copy w_host in one pass, and uploads w_host on the copy stream (offload: optimizer).
 *  next forward: weights(u) waits (host) until the worker is past unit u and makes the compute
 *    stream wait for u's upload event only: the GPU computes unit u - 1 while the host updates
 *    unit u.  With offload: params, units are uploaded from w_host into device slots `prefetch`
 *    units ahead of use in both directions.
 *
 * host_lean (an 8B-class model on a host that cannot also hold gradients and a bf16 copy): the
 *    gradients stay in the device accumulators, their sums of squares are taken there, and the
 *    update streams each unit's gradient down through a host ring of two (the download of unit
 *    u + 2 runs while AdamW works on unit u; a zero-byte download issued at the step's end
 *    orders them after the backward, not after the next forward) and writes the bf16 copy into
 *    a second ring of two, uploaded from there.  The host then holds master, m and v only.
 *
 * Who waits for what: a device buffer is overwritten only after the copy reading it completed
 * (ring pairs are freed by the worker after it synchronized on their event; slots are refilled
 * by uploads ordered after the compute stream's issued work); a host buffer is rewritten only
 * after the copy reading it completed (optim_step synchronizes every slot upload before AdamW
 * rewrites w_host; AdamW of unit u starts only after the previous step's forward and backward
 * no longer need its weights: they have been issued and their gradients have arrived).
 */
#include "offload.h"

#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "host_adamw.h"
#include "log.h"
#include "optim.h"

#define N_PAIRS 2

enum job_kind { JOB_GRAD, JOB_ADAM, JOB_STOP };

struct job {
	enum job_kind kind;
	int unit;
	void *ev;			/* the copy to wait for, or NULL */
	const float *add;		/* host buffer to add into grad32, or NULL (copied there) */
	int pair;			/* ring pair to free afterwards, or -1 */
	bool last;			/* the step's last micro-batch: sum the squares */
	unsigned long gen;		/* JOB_ADAM: the update's generation */
};

struct sl_offload_engine {
	struct sl_shard *s;
	pthread_t thr;
	pthread_mutex_t mu;
	pthread_cond_t work, done;
	struct job *q;			/* (cap) ring of posted jobs */
	int cap, head, n;
	bool started;
	/* the gradient staging ring */
	float *d_rs[N_PAIRS];		/* (max shard) f32, device */
	float *h_rs[N_PAIRS];		/* (max shard) f32, host; made on first need */
	void *ev_pair[N_PAIRS];
	bool busy[N_PAIRS];
	int next_pair;
	size_t max_shard;
	void *ev_stage;			/* d_wstage's upload (offload: params, S > 1) */
	/* host_lean: gradient and bf16 rings for the update, per-unit sums of squares */
	float *g_ring[N_PAIRS];		/* (max shard) f32, host */
	void *w_ring[N_PAIRS];		/* (max shard) compute, host */
	void *ev_gr[N_PAIRS];		/* g_ring[k]'s download */
	int wr_unit[N_PAIRS];		/* unit whose upload last read w_ring[k], or -1 */
	double *d_sq;			/* (n_units) double, device */
	double *h_sq;			/* (n_units) double, host */
	char fence[2];			/* the 0-byte download's destination and source */
	/* the update being applied (JOB_ADAM) */
	struct sl_optim_hparams h;
	struct sl_adamw_args a;
	/* seconds, for the log: worker busy in AdamW / in gradient sums, main thread waiting for
	 * an update in weights(); updates applied */
	double adam_s, grad_s, wait_s;
	int updates;
};

static void upload_async(struct sl_backend *b, void *dst, const void *src, size_t bytes,
			 bool after, void *ev)
{
	if (b->upload_async)
		b->upload_async(b, dst, src, bytes, after, ev);
	else
		b->upload(b, dst, src, bytes);
}

static void download_async(struct sl_backend *b, void *dst, const void *src, size_t bytes,
			   bool after, void *ev)
{
	if (b->download_async)
		b->download_async(b, dst, src, bytes, after, ev);
	else
		b->download(b, dst, src, bytes);
}

static void wait_event(struct sl_backend *b, void *ev)
{
	if (ev && b->wait_event)
		b->wait_event(b, ev);
}

static void sync_event(struct sl_backend *b, void *ev)
{
	if (ev && b->sync_event)
		b->sync_event(b, ev);
}

static void *event_new(struct sl_backend *b)
{
	return b->event_create ? b->event_create(b) : NULL;
}

static void event_free(struct sl_backend *b, void *ev)
{
	if (ev && b->event_destroy)
		b->event_destroy(b, ev);
}

/* ---- the worker ---------------------------------------------------------------------------- */

/* host_lean: unit @ui's gradient down into its ring slot, after the fence (see optim_step) */
static void lean_fetch(struct sl_offload_engine *o, int ui)
{
	struct sl_shard *s = o->s;
	int k = ui % N_PAIRS;

	if (ui < s->n_units)
		download_async(s->be, o->g_ring[k], s->u[ui].d_acc, s->u[ui].shard * sizeof(float),
			       false, o->ev_gr[k]);
}

/* run_adam's update of one run of tensors (sl_shard_update_runs) */
struct host_run {
	struct sl_shard_unit *u;
	const float *grad;
	void *w;
	size_t elt;
};

static void host_update_run(void *arg, size_t k, size_t n, const struct sl_adamw_args *a)
{
	struct host_run *x = arg;
	struct sl_shard_unit *u = x->u;

	sl_host_adamw(u->master + k, u->m + k, u->v + k, x->grad + k, (char *)x->w + k * x->elt,
		      x->elt, n, a);
}

static void run_adam(struct sl_offload_engine *o, int ui)
{
	struct sl_shard *s = o->s;
	struct sl_backend *b = s->be;
	const struct sl_layout *lay = s->lay;
	struct sl_shard_unit *u = &s->u[ui];
	struct sl_adamw_args a = o->a;
	const float *grad = u->grad32;
	void *w = u->w_host;
	int r = ui % N_PAIRS;

	if (s->lean) {
		if (ui == 0)
			for (int i = 0; i < N_PAIRS; i++)
				lean_fetch(o, i);
		sync_event(b, o->ev_gr[r]);
		/* the ring slot's last upload has left the host */
		if (o->wr_unit[r] >= 0)
			sync_event(b, s->u[o->wr_unit[r]].ev_w);
		grad = o->g_ring[r];
		w = o->w_ring[r];
	}

	struct host_run x = { .u = u, .grad = grad, .w = w, .elt = b->elt };

	sl_shard_update_runs(lay, u, ui, &o->h, &a, host_update_run, &x);
	/* offload: params reads w_host itself; optimizer keeps a device copy to refresh */
	if (!s->host_params)
		upload_async(b, u->w_shard, w, u->shard * b->elt, false, u->ev_w);
	if (s->lean) {
		o->wr_unit[r] = ui;
		lean_fetch(o, ui + N_PAIRS);	/* into the slot AdamW just read */
	}
}

static void *worker(void *arg)
{
	struct sl_offload_engine *o = arg;
	struct sl_shard *s = o->s;
	int nt = omp_get_max_threads();

	/* this thread's teams leave a core to the thread issuing the GPU's work */
	if (nt > 2)
		omp_set_num_threads(nt - 1);

	pthread_mutex_lock(&o->mu);
	for (;;) {
		struct job j;

		while (!o->n)
			pthread_cond_wait(&o->work, &o->mu);
		j = o->q[o->head];
		pthread_mutex_unlock(&o->mu);
		if (j.kind == JOB_STOP) {
			pthread_mutex_lock(&o->mu);
			break;
		}
		double t0;

		if (j.kind == JOB_GRAD) {
			struct sl_shard_unit *u = &s->u[j.unit];

			sync_event(s->be, j.ev);
			t0 = sl_now();
			if (j.add)
				sl_host_add(u->grad32, j.add, u->shard);
			if (j.last)
				u->sumsq = sl_host_sumsq(u->grad32, u->shard);
			t0 = sl_now() - t0;
		} else {
			t0 = sl_now();
			run_adam(o, j.unit);
			t0 = sl_now() - t0;
		}
		pthread_mutex_lock(&o->mu);
		if (j.kind == JOB_GRAD)
			o->grad_s += t0;
		else
			o->adam_s += t0;
		if (j.kind == JOB_GRAD && j.pair >= 0)
			o->busy[j.pair] = false;
		if (j.kind == JOB_ADAM) {
			s->u[j.unit].w_gen = j.gen;
			s->u[j.unit].w_wait = !s->host_params;
		}
		/* the job leaves the queue only when done: an empty queue means idle */
		o->head = (o->head + 1) % o->cap;
		o->n--;
		pthread_cond_broadcast(&o->done);
	}
	pthread_mutex_unlock(&o->mu);
	return NULL;
}

static void post(struct sl_offload_engine *o, const struct job *j)
{
	pthread_mutex_lock(&o->mu);
	while (o->n == o->cap)
		pthread_cond_wait(&o->done, &o->mu);
	o->q[(o->head + o->n) % o->cap] = *j;
	o->n++;
	pthread_cond_signal(&o->work);
	pthread_mutex_unlock(&o->mu);
}

void sl_offload_drain(struct sl_shard *s)
{
	struct sl_offload_engine *o = s->off;

	if (!o)
		return;
	pthread_mutex_lock(&o->mu);
	while (o->n)
		pthread_cond_wait(&o->done, &o->mu);
	pthread_mutex_unlock(&o->mu);
}

/* ---- create / destroy ---------------------------------------------------------------------- */

int sl_offload_create(struct sl_shard *s, size_t max_shard)
{
	struct sl_backend *b = s->be;
	struct sl_offload_engine *o = calloc(1, sizeof(*o));

	if (!o)
		return -1;
	o->s = s;
	o->max_shard = max_shard;
	o->cap = 3 * s->n_units + 8;
	o->q = calloc(o->cap, sizeof(*o->q));
	if (!o->q) {
		free(o);
		return -1;
	}
	pthread_mutex_init(&o->mu, NULL);
	pthread_cond_init(&o->work, NULL);
	pthread_cond_init(&o->done, NULL);
	for (int i = 0; i < N_PAIRS; i++) {
		o->wr_unit[i] = -1;
		if (s->lean) {
			o->g_ring[i] = sl_shard_host_alloc(b, max_shard * sizeof(float));
			o->w_ring[i] = sl_shard_host_alloc(b, max_shard * b->elt);
			o->ev_gr[i] = event_new(b);
			continue;
		}
		o->d_rs[i] = b->alloc(b, max_shard * sizeof(float));
		o->ev_pair[i] = event_new(b);
		/* later micro-batches land here (made later on first need when accum is unknown) */
		if (!s->accum_dev && s->accum > 1)
			o->h_rs[i] = sl_shard_host_alloc(b, max_shard * sizeof(float));
	}
	if (s->lean) {
		o->d_sq = b->alloc(b, s->n_units * sizeof(double));
		o->h_sq = calloc(s->n_units, sizeof(double));
		if (!o->h_sq)
			return -1;
	}
	o->ev_stage = event_new(b);
	for (int i = 0; i < s->n_units; i++) {
		struct sl_shard_unit *u = &s->u[i];

		u->w_host = s->host_params ? u->w_shard : s->lean ? NULL :
			sl_shard_host_alloc(b, u->shard * b->elt);
		u->d_acc = s->accum_dev ? b->alloc(b, u->shard * sizeof(float)) : NULL;
		u->ev_g = event_new(b);
		u->ev_w = event_new(b);
	}
	for (int i = 0; i < s->n_wslots; i++)
		s->wslots[i].ev = event_new(b);
	s->off = o;
	if (pthread_create(&o->thr, NULL, worker, o)) {
		sl_error("cannot start the offload worker thread");
		return -1;
	}
	o->started = true;
	return 0;
}

void sl_offload_destroy(struct sl_shard *s)
{
	struct sl_offload_engine *o = s->off;
	struct sl_backend *b = s->be;

	if (!o)
		return;
	if (o->started) {
		struct job stop = { .kind = JOB_STOP };

		sl_offload_drain(s);
		post(o, &stop);
		pthread_join(o->thr, NULL);
	}
	/* copies still in flight read or write the buffers freed below */
	if (b->sync)
		b->sync(b);
	for (int i = 0; i < N_PAIRS; i++) {
		sync_event(b, o->ev_pair[i]);
		sync_event(b, o->ev_gr[i]);
		if (o->d_rs[i])
			b->free(b, o->d_rs[i]);
		sl_shard_host_free(b, o->h_rs[i]);
		sl_shard_host_free(b, o->g_ring[i]);
		event_free(b, o->ev_pair[i]);
		event_free(b, o->ev_gr[i]);
	}
	if (o->d_sq)
		b->free(b, o->d_sq);
	free(o->h_sq);
	sync_event(b, o->ev_stage);
	event_free(b, o->ev_stage);
	for (int i = 0; i < s->n_wslots; i++) {
		sync_event(b, s->wslots[i].ev);
		event_free(b, s->wslots[i].ev);
	}
	for (int i = 0; i < s->n_units; i++) {
		struct sl_shard_unit *u = &s->u[i];

		sync_event(b, u->ev_g);
		sync_event(b, u->ev_w);
		event_free(b, u->ev_g);
		event_free(b, u->ev_w);
		if (!s->host_params)
			sl_shard_host_free(b, u->w_host);
		if (u->d_acc)
			b->free(b, u->d_acc);
	}
	for (int i = 0; i < N_PAIRS; i++)
		sl_shard_host_free(b, o->w_ring[i]);
	pthread_mutex_destroy(&o->mu);
	pthread_cond_destroy(&o->work);
	pthread_cond_destroy(&o->done);
	free(o->q);
	free(o);
	s->off = NULL;
}

/* ---- weights ------------------------------------------------------------------------------- */

/* whether unit @ui's newest update is in w_host (and, uploaded or not, on its way) */
static bool updated(struct sl_offload_engine *o, int ui)
{
	bool yes;

	pthread_mutex_lock(&o->mu);
	yes = o->s->u[ui].w_gen == o->s->w_gen;
	pthread_mutex_unlock(&o->mu);
	return yes;
}

void sl_offload_await(struct sl_shard *s, int ui)
{
	struct sl_offload_engine *o = s->off;
	struct sl_shard_unit *u = &s->u[ui];
	bool wait;

	pthread_mutex_lock(&o->mu);
	if (u->w_gen != s->w_gen) {
		double t0 = sl_now();

		while (u->w_gen != s->w_gen)
			pthread_cond_wait(&o->done, &o->mu);
		o->wait_s += sl_now() - t0;
	}
	wait = u->w_wait;
	u->w_wait = false;
	pthread_mutex_unlock(&o->mu);
	if (wait)
		wait_event(s->be, u->ev_w);
}

void sl_offload_fill_slot(struct sl_shard *s, struct sl_shard_slot *slot, int ui)
{
	struct sl_backend *b = s->be;
	struct sl_shard_unit *u = &s->u[ui];

	sl_offload_await(s, ui);
	if (s->S == 1) {
		/* after the compute stream's issued work: it may still read the slot's last unit */
		upload_async(b, slot->buf, u->w_host, u->shard * b->elt, true, slot->ev);
		slot->pending = true;
		return;
	}
	upload_async(b, s->d_wstage, u->w_host, u->shard * b->elt, true, s->off->ev_stage);
	wait_event(b, s->off->ev_stage);
	sl_comm_all_gather(s->shard_comm, slot->buf, s->d_wstage, u->shard, s->compute_dtype);
	slot->pending = false;
}

void sl_offload_use(struct sl_shard *s, struct sl_shard_slot *slot)
{
	if (slot->pending)
		wait_event(s->be, slot->ev);
	slot->pending = false;
}

void sl_offload_prefetch(struct sl_shard *s, int ui, int dir)
{
	if (!s->host_params || s->S != 1)
		return;
	for (int i = 1; i <= s->prefetch; i++) {
		int v = ui + dir * i;
		struct sl_shard_slot *best = NULL;

		if (v < 0 || v >= s->n_units)
			break;
		if (s->u[v].wslot >= 0)
			continue;
		/* never wait for the worker here: a unit not yet updated is fetched on demand */
		if (!updated(s->off, v))
			break;
		best = sl_shard_pick_slot(s->wslots, s->n_wslots, s->u[v].padded);
		if (!best)
			break;
		if (best->unit >= 0)
			s->u[best->unit].wslot = -1;
		best->unit = v;
		best->last_use = ++s->tick;
		s->u[v].wslot = best - s->wslots;
		sl_offload_fill_slot(s, best, v);
	}
}

void sl_offload_refresh(struct sl_shard *s, int ui)
{
	struct sl_backend *b = s->be;
	struct sl_shard_unit *u = &s->u[ui];

	void *w = s->lean ? s->off->w_ring[0] : u->w_host;

	/* (lean: the ring is idle here, the callers drained the worker) */
	sl_host_to_compute(w, u->master, b->elt, u->shard);
	if (!s->host_params)
		b->upload(b, u->w_shard, w, u->shard * b->elt);
	u->w_gen = s->w_gen;
	u->w_wait = false;
}

/* ---- gradients ----------------------------------------------------------------------------- */

/* a free ring pair: the worker has consumed what its last download brought */
static int take_pair(struct sl_offload_engine *o)
{
	int k = o->next_pair;

	o->next_pair = (k + 1) % N_PAIRS;
	pthread_mutex_lock(&o->mu);
	while (o->busy[k])
		pthread_cond_wait(&o->done, &o->mu);
	o->busy[k] = true;
	pthread_mutex_unlock(&o->mu);
	return k;
}

void sl_offload_release_grads(struct sl_shard *s, int ui, const void *gbuf)
{
	struct sl_offload_engine *o = s->off;
	struct sl_backend *b = s->be;
	struct sl_shard_unit *u = &s->u[ui];
	bool first = !u->grads_seen, last = s->mb_last;
	size_t bytes = u->shard * sizeof(float);
	struct job j = { .kind = JOB_GRAD, .unit = ui, .pair = -1, .last = last };
	int k;

	s->grads_pending = true;
	if (first)
		u->acc_dev = s->lean || (s->accum_dev && !last);
	if (u->acc_dev) {
		/* earlier micro-batches stay on the device; the last sum goes down */
		if (first) {
			sl_shard_reduce_to(s, ui, gbuf, u->d_acc);
		} else {
			sl_shard_reduce_to(s, ui, gbuf, s->rs_out);
			b->add_f32(b, u->d_acc, s->rs_out, u->shard);
		}
		if (!last)
			return;
		if (s->lean) {
			/* the sum of squares on the device; the gradient goes down in the update */
			b->sumsq_f32(b, o->d_sq + ui, u->d_acc, u->shard);
			return;
		}
		download_async(b, u->grad32, u->d_acc, bytes, true, u->ev_g);
		j.ev = u->ev_g;
		post(o, &j);
		return;
	}
	k = take_pair(o);
	sl_shard_reduce_to(s, ui, gbuf, o->d_rs[k]);
	if (!first && !o->h_rs[k])
		o->h_rs[k] = sl_shard_host_alloc(b, o->max_shard * sizeof(float));
	download_async(b, first ? u->grad32 : o->h_rs[k], o->d_rs[k], bytes, true,
		       o->ev_pair[k]);
	j.ev = o->ev_pair[k];
	j.add = first ? NULL : o->h_rs[k];
	j.pair = k;
	post(o, &j);
}

/* ---- the update ---------------------------------------------------------------------------- */

/* HSDP on host accumulators: MPI reduces host memory; device communicators go through rs_out */
static void replica_reduce(struct sl_shard *s, struct sl_shard_unit *u)
{
	struct sl_backend *b = s->be;
	size_t n = u->shard * sizeof(float);

	if (s->replica_comm->kind == SL_COMM_MPI) {
		sl_comm_all_reduce(s->replica_comm, u->grad32, u->shard, SL_COMM_F32);
		return;
	}
	b->upload(b, s->rs_out, u->grad32, n);
	sl_comm_all_reduce(s->replica_comm, s->rs_out, u->shard, SL_COMM_F32);
	b->download(b, u->grad32, s->rs_out, n);
}

int sl_offload_optim_step(struct sl_shard *s, const struct sl_optim_hparams *h,
			  double *grad_norm)
{
	struct sl_offload_engine *o = s->off;
	struct sl_backend *b = s->be;
	bool replicas = s->replica_comm && s->replica_comm->size > 1;
	double sumsq = 0;

	sl_offload_drain(s);
	s->grads_pending = false;
	if (s->lean) {
		for (int i = 0; i < s->n_units; i++) {
			struct sl_shard_unit *u = &s->u[i];

			if (!u->grads_seen)
				b->zero(b, u->d_acc, u->shard * sizeof(float));
			if (replicas)
				sl_comm_all_reduce(s->replica_comm, u->d_acc, u->shard,
						   SL_COMM_F32);
			if (!u->grads_seen || replicas)
				b->sumsq_f32(b, o->d_sq + i, u->d_acc, u->shard);
		}
		b->download(b, o->h_sq, o->d_sq, s->n_units * sizeof(double));
	}
	for (int i = 0; i < s->n_units && !s->lean; i++) {
		struct sl_shard_unit *u = &s->u[i];

		/* a unit with no gradient this step (cannot happen for this model) counts as 0 */
		if (!u->grads_seen) {
			memset(u->grad32, 0, u->shard * sizeof(float));
			u->sumsq = 0;
		}
		if (replicas) {
			replica_reduce(s, u);
			u->sumsq = sl_host_sumsq(u->grad32, u->shard);
		}
		sumsq += u->sumsq;
	}
	for (int i = 0; i < s->n_units && s->lean; i++)
		sumsq += o->h_sq[i];
	if (s->S > 1)
		MPI_Allreduce(MPI_IN_PLACE, &sumsq, 1, MPI_DOUBLE, MPI_SUM, s->shard_comm->mpi);
	*grad_norm = sqrt(sumsq);
	if (!isfinite(*grad_norm))
		return 1;

	/* uploads still reading w_host (prefetched slots) finish before AdamW rewrites it */
	for (int i = 0; i < s->n_wslots; i++) {
		sync_event(b, s->wslots[i].ev);
		s->wslots[i].pending = false;
	}
	o->h = *h;
	o->a = (struct sl_adamw_args){
		.beta1 = h->beta1, .beta2 = h->beta2, .eps = h->eps,
		.bc1 = 1.0 - pow(h->beta1, h->step), .bc2 = 1.0 - pow(h->beta2, h->step),
		.grad_scale = sl_clip_scale(*grad_norm, h->clip),
	};
	/* lean: the worker's gradient downloads come after this one, so after the backward */
	if (s->lean)
		download_async(b, &o->fence[0], &o->fence[1], 0, true, NULL);
	pthread_mutex_lock(&o->mu);
	s->w_gen++;
	o->updates++;
	pthread_mutex_unlock(&o->mu);
	/* forward order: the next forward needs unit 0 first */
	for (int i = 0; i < s->n_units; i++) {
		struct job j = { .kind = JOB_ADAM, .unit = i, .pair = -1, .gen = s->w_gen };

		post(o, &j);
	}
	return 0;
}

void sl_offload_stats(struct sl_shard *s, struct sl_offload_stats *st)
{
	struct sl_offload_engine *o = s->off;

	memset(st, 0, sizeof(*st));
	if (!o)
		return;
	pthread_mutex_lock(&o->mu);
	st->adam_s = o->adam_s;
	st->grad_s = o->grad_s;
	st->wait_s = o->wait_s;
	st->updates = o->updates;
	pthread_mutex_unlock(&o->mu);
}
