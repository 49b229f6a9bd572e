/*
 * shard: fully sharded parameters, gather slots and sharded AdamW (see shard.h).
 *
 * The model asks for units one at a time (model.h); a unit's gathered weights live in one of a few
 * slots and stay valid until the slot is taken for another unit or the optimizer changes the
 * weights, so a unit released in the forward and asked for again in the backward is gathered again
 * only if its slot was reused (parallel.reshard_after_forward bounds the pool; otherwise every unit
 * keeps its slot through the step).  With one rank per shard group the rank's shard is the whole
 * unit and no collective runs.
 *
 * With parallel.offload the transfers, the host accumulation and the host AdamW are offload.c's:
 * asynchronous, overlapped with the compute stream.
 */
#include "shard.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "offload.h"
#include "optim.h"

static bool single(const struct sl_shard *s)
{
	return s->S == 1;
}

/* The model reads the rank's own compute shard of @u in place: one rank holds it whole, on the
 * device. */
static bool in_place(const struct sl_shard *s, const struct sl_shard_unit *u)
{
	return u->S == 1 && !s->host_params;
}

static void update_unit(struct sl_shard *s, int ui, const struct sl_optim_hparams *h,
			struct sl_adamw_args *a);

/* overlap_optimizer: issue pending unit @ui's update on the side stream (in the caller's
 * side_begin) */
static void opt_issue_one(struct sl_shard *s, int ui)
{
	struct sl_shard_unit *u = &s->u[ui];
	struct sl_adamw_args a = s->opt_a;

	update_unit(s, ui, &s->opt_h, &a);
	s->be->record_event(s->be, u->ev_opt);
	u->opt_pending = false;
	s->opt_npending--;
	u->opt_wait = true;
	s->opt_last = ui;
}

/*
 * overlap_optimizer: issue the pending updates of the units up to place @pos of the forward's
 * order (all of them and those not in it for pos < 0), in that order: a unit whose gradient
 * lives in a layer's activations (grad_room) comes before the unit the forward reads before
 * writing them, and the side stream runs its work in order
 */
static void opt_issue_upto(struct sl_shard *s, int pos)
{
	struct sl_backend *b = s->be;
	const int end = pos < 0 ? s->n_fwd + s->n_units : pos < s->n_fwd ? pos + 1 : s->n_fwd;
	bool begun = false;

	/* place i of the forward's order, then (pos < 0) unit i - n_fwd */
	for (int i = 0; s->opt_npending && i < end; i++) {
		const int ui = i < s->n_fwd ? s->fwd_order[i] : i - s->n_fwd;

		if (!s->u[ui].opt_pending)
			continue;
		if (!begun)
			b->side_begin(b);
		begun = true;
		opt_issue_one(s, ui);
	}
	if (begun)
		b->side_end(b);
}

/* overlap_optimizer: what follows on the compute stream reads unit @u after its update; the
 * updates opt_ahead places beyond it in the forward's order are issued now too */
static void opt_await(struct sl_shard *s, struct sl_shard_unit *u)
{
	if (!s->overlap_opt)
		return;
	if (u->fwd_pos < 0 && u->opt_pending)
		opt_issue_upto(s, -1);
	else if (u->fwd_pos >= 0)
		opt_issue_upto(s, s->opt_ahead < 0 ? -1 : u->fwd_pos + s->opt_ahead);
	if (!u->opt_wait)
		return;
	s->be->wait_event(s->be, u->ev_opt);
	u->opt_wait = false;
}

/* overlap_optimizer: the forward reads @unit; its first reading learns the forward's order */
static void fwd_note(struct sl_shard *s, int unit)
{
	struct sl_shard_unit *u = &s->u[unit];

	if (!s->overlap_opt || s->bwd || s->fwd_known || u->fwd_pos >= 0)
		return;
	u->fwd_pos = s->n_fwd;
	s->fwd_order[s->n_fwd++] = unit;
}

void sl_shard_settle(struct sl_shard *s)
{
	if (!s->overlap_opt)
		return;
	opt_issue_upto(s, -1);
	if (s->sq_pending) {	/* the step's sums of squares issued so far */
		s->be->wait_event(s->be, s->ev_sq);
		s->sq_pending = false;
	}
	if (s->opt_last < 0)
		return;
	/* the side stream runs the units in order: the last one's event covers them all */
	if (s->u[s->opt_last].opt_wait)
		s->be->wait_event(s->be, s->u[s->opt_last].ev_opt);
	for (int i = 0; i < s->n_units; i++)
		s->u[i].opt_wait = false;
	s->opt_last = -1;
}

/* early_step: unit @ui's update on the side stream now, with the step's hyperparameters
 * (sl_shard_early_update) and @gate (sl_adamw_args) */
static void early_issue(struct sl_shard *s, int ui, const double *gate)
{
	struct sl_backend *b = s->be;
	struct sl_adamw_args a = s->opt_a;

	a.gate = gate;
	b->side_begin(b);
	update_unit(s, ui, &s->opt_h, &a);
	b->record_event(b, s->u[ui].ev_opt);
	b->side_end(b);
	s->u[ui].opt_wait = true;
	s->opt_last = ui;
}

/*
 * sq_overlap: unit @ui's gradient is reduced (for now: a later micro-batch or a second release
 * issues another, which the side stream runs later); its sum of squares on the side stream
 */
static void side_sumsq(struct sl_shard *s, int ui)
{
	struct sl_backend *b = s->be;
	struct sl_shard_unit *u = &s->u[ui];

	if (!s->sq_overlap)
		return;
	b->side_begin(b);
	if (s->grad_direct)
		b->sumsq_c(b, s->d_sumsq + ui, u->gradc, u->shard);
	else
		b->sumsq_f32(b, s->d_sumsq + ui, u->grad32, u->shard);
	b->record_event(b, s->ev_sq);
	b->side_end(b);
	u->sq_side = true;
	s->sq_pending = true;
}

/* host memory for offloaded state: the backend's pinned allocator, else aligned malloc; zeroed */
void *sl_shard_host_alloc(struct sl_backend *b, size_t bytes)
{
	void *p = NULL;

	if (b->host_alloc)
		return b->host_alloc(b, bytes);
	if (posix_memalign(&p, 64, bytes ? bytes : 64)) {
		sl_error("out of host memory for the offloaded state (%zu bytes); `shardlm plan` "
			 "shows what the job needs", bytes);
		sl_dist_abort("out of host memory");
	}
	memset(p, 0, bytes);
	return p;
}

void sl_shard_host_free(struct sl_backend *b, void *p)
{
	if (!p)
		return;
	if (b->host_free)
		b->host_free(b, p);
	else
		free(p);
}

/* Buffers of the optimizer state live where offload puts them. */
static void *state_alloc(struct sl_shard *s, size_t bytes)
{
	return s->host_state ? sl_shard_host_alloc(s->be, bytes) : s->be->alloc(s->be, bytes);
}

static void state_free(struct sl_shard *s, void *p)
{
	if (s->host_state)
		sl_shard_host_free(s->be, p);
	else
		s->be->free(s->be, p);
}

/* the reduce-scatter staging's elements for units of up to @max_padded elements (tests may
 * make it smaller: SHARDLM_TEST_RS_STAGE elements) */
static size_t g32_elems(size_t max_padded, int S)
{
	const char *t = getenv("SHARDLM_TEST_RS_STAGE");
	size_t cap = t && atol(t) > 0 ? (size_t)atol(t) : SL_SHARD_RS_STAGE / sizeof(float);

	if (cap < (size_t)S)
		cap = S;	/* a round takes at least one element of each rank's shard */
	return max_padded < cap ? max_padded : cap;
}

/* opts.grad_room's memory for unit @unit's accumulator of @need bytes, or NULL */
static void *lend_grads(const struct sl_shard *s, const struct sl_shard_opts *o, int unit,
			size_t need)
{
	size_t bytes = 0;
	void *p;

	if (!o->grad_room || s->host_state || s->accum != 1)
		return NULL;
	p = o->grad_room(o->grad_room_ctx, unit, s->grad_direct, &bytes);
	return p && bytes >= need ? p : NULL;
}

struct sl_shard_slot *sl_shard_pick_slot(struct sl_shard_slot *pool, int n, size_t need)
{
	struct sl_shard_slot *best = NULL;

	for (int i = 0; i < n; i++) {
		struct sl_shard_slot *c = &pool[i];

		if (c->in_use || c->cap < need)
			continue;
		if (!best || c->cap < best->cap ||
		    (c->cap == best->cap && best->unit >= 0 &&
		     (c->unit < 0 || c->last_use < best->last_use)))
			best = c;
	}
	return best;
}

/* Take a slot of @pool for unit @unit: one that already holds it, else sl_shard_pick_slot's.
 * *fresh says whether its content must be (re)made. */
static struct sl_shard_slot *take_slot(struct sl_shard *s, struct sl_shard_slot *pool, int n,
				       int unit, bool *fresh)
{
	struct sl_shard_slot *best = NULL;

	for (int i = 0; i < n; i++) {
		if (pool[i].unit == unit && unit >= 0) {
			*fresh = false;
			best = &pool[i];
			goto out;
		}
	}
	best = sl_shard_pick_slot(pool, n, s->u[unit].padded);
	if (!best) {
		char why[200];

		snprintf(why, sizeof(why), "internal error: no free %s slot holds unit %d (the model "
			 "holds more units at once than the shard pool was sized for)",
			 pool == s->wslots ? "gather" : "gradient", unit);
		sl_dist_abort(why);
	}
	*fresh = true;
	if (pool == s->wslots && best->unit >= 0)
		s->u[best->unit].wslot = -1;
	best->unit = unit;
out:
	best->in_use = true;
	best->last_use = ++s->tick;
	return best;
}

static const void *unit_weights(void *ctx, int unit)
{
	struct sl_shard *s = ctx;
	struct sl_shard_unit *u = &s->u[unit];
	struct sl_shard_slot *slot;
	bool fresh;

	if (unit == 0)
		s->bwd = false;		/* only a forward asks for the embedding's weights */
	if (s->off && !s->host_params)
		sl_offload_await(s, unit);
	fwd_note(s, unit);
	opt_await(s, u);
	if (in_place(s, u))
		return u->w_shard;
	slot = take_slot(s, s->wslots, s->n_wslots, unit, &fresh);
	u->wslot = slot - s->wslots;
	if (s->host_params) {
		if (fresh)
			sl_offload_fill_slot(s, slot, unit);
		sl_offload_use(s, slot);
		if (!s->bwd)
			sl_offload_prefetch(s, unit, 1);
		return slot->buf;
	}
	if (fresh)
		sl_comm_all_gather(u->comm, slot->buf, u->w_shard, u->shard, s->compute_dtype);
	return slot->buf;
}

static void release_weights(void *ctx, int unit)
{
	struct sl_shard *s = ctx;
	struct sl_shard_unit *u = &s->u[unit];

	if (in_place(s, u) || u->wslot < 0)
		return;
	s->wslots[u->wslot].in_use = false;
}

/* unit @unit's gradient buffer for a backward, zeroed (@all), or only past its elements (the
 * caller writes them all: src.grads_set) */
static void *grads_buf(struct sl_shard *s, int unit, bool all)
{
	struct sl_backend *b = s->be;
	struct sl_shard_unit *u = &s->u[unit];
	struct sl_shard_slot *slot;
	void *buf;
	size_t n;
	bool fresh;

	/* the forward waited already; a unit whose weights it did not read must too */
	s->fwd_known = s->fwd_known || s->n_fwd > 0;
	opt_await(s, u);
	if (s->grad_direct) {
		buf = u->gradc;
		n = u->shard;
	} else {
		/* a fresh buffer per micro-batch: its sum goes to the f32 accumulator */
		slot = take_slot(s, s->gslots, s->n_gslots, unit, &fresh);
		buf = slot->buf;
		n = u->padded;
	}
	if (all)
		b->zero(b, buf, n * b->elt);
	else if (n > u->numel)
		b->zero(b, (char *)buf + u->numel * b->elt, (n - u->numel) * b->elt);
	s->bwd = true;
	if (s->off && !s->grad_direct)
		sl_offload_prefetch(s, unit, -1);
	return buf;
}

static void *unit_grads(void *ctx, int unit)
{
	return grads_buf(ctx, unit, true);
}

static void *unit_grads_set(void *ctx, int unit)
{
	return grads_buf(ctx, unit, false);
}

void sl_shard_reduce_to(struct sl_shard *s, int unit, const void *gbuf, float *dst)
{
	struct sl_backend *b = s->be;
	struct sl_shard_unit *u = &s->u[unit];

	if (u->S == 1) {
		b->to_f32(b, dst, gbuf, u->numel);
	} else if (u->padded <= s->g32_elems) {
		b->to_f32(b, s->g32_full, gbuf, u->padded);
		sl_comm_reduce_scatter(u->comm, dst, s->g32_full, u->shard, SL_COMM_F32);
	} else {
		/* in rounds: elements [k, k + n) of every rank's shard, rank r's at r n */
		const size_t cs = s->g32_elems / u->S;

		for (size_t k = 0; k < u->shard; k += cs) {
			const size_t n = u->shard - k < cs ? u->shard - k : cs;

			for (int r = 0; r < u->S; r++)
				b->to_f32(b, s->g32_full + r * n,
					  (const char *)gbuf + ((size_t)r * u->shard + k) * b->elt, n);
			sl_comm_reduce_scatter(u->comm, dst + k, s->g32_full, n, SL_COMM_F32);
		}
	}
}

/* The unit's backward is done: reduce its gradient into this rank's f32 shard accumulator. */
static void release_grads(void *ctx, int unit)
{
	struct sl_shard *s = ctx;
	struct sl_backend *b = s->be;
	struct sl_shard_unit *u = &s->u[unit];
	struct sl_shard_slot *slot = NULL;
	float *dst;

	if (s->grad_direct) {
		/* the gradient is where the optimizer reads it already */
		u->grads_seen = true;
		if (s->early_step && (s->early_poison == 1 || (s->early_poison == 2 && !unit)))
			sl_shard_poison(b, u->gradc);
		side_sumsq(s, unit);
		if (s->early_step)	/* skipped on the device if its sum is not finite */
			early_issue(s, unit, s->d_sumsq + unit);
		release_weights(ctx, unit);
		return;
	}
	for (int i = 0; i < s->n_gslots; i++)
		if (s->gslots[i].unit == unit && s->gslots[i].in_use)
			slot = &s->gslots[i];
	if (!slot)
		sl_dist_abort("internal error: gradients released for a unit never asked for");
	if (s->off) {
		/* offload: the reduced shard leaves for the host now, not at the step's end */
		sl_offload_release_grads(s, unit, slot->buf);
	} else {
		/* the first micro-batch of a step writes the accumulator, later ones add to it
		 * (a run of accum 1 has no rs_out: a unit reduced twice in a micro-batch would
		 * be an internal error, not a reason to fail) */
		if (u->grads_seen && !s->rs_out)
			s->rs_out = b->alloc(b, s->max_shard * sizeof(float));
		dst = u->grads_seen ? s->rs_out : u->grad32;
		sl_shard_reduce_to(s, unit, slot->buf, dst);
		if (u->grads_seen)
			b->add_f32(b, u->grad32, s->rs_out, u->shard);
		if (s->mb_last)
			side_sumsq(s, unit);
	}
	u->grads_seen = true;
	slot->in_use = false;
	slot->unit = -1;
	release_weights(ctx, unit);
}

static int desc_size(const void *a, const void *b)
{
	const size_t x = *(const size_t *)a, y = *(const size_t *)b;

	return x < y ? 1 : x > y ? -1 : 0;
}

void sl_shard_pool_caps(const size_t *padded, int n_units, int n, size_t *caps)
{
	memcpy(caps, padded, n_units * sizeof(size_t));
	qsort(caps, n_units, sizeof(size_t), desc_size);
	for (int i = n_units; i < n; i++)
		caps[i] = caps[n_units - 1];
}

/* the slots of @pool (n of them) at sl_shard_pool_caps's sizes */
static int pool_alloc(struct sl_shard *s, struct sl_shard_slot *pool, int n)
{
	const int m = n > s->n_units ? n : s->n_units;
	size_t *pad = malloc(s->n_units * sizeof(size_t)), *caps = malloc(m * sizeof(size_t));

	if (!pad || !caps) {
		free(pad);
		free(caps);
		return -1;
	}
	for (int i = 0; i < s->n_units; i++)
		pad[i] = s->u[i].padded;
	sl_shard_pool_caps(pad, s->n_units, n, caps);
	for (int i = 0; i < n; i++) {
		pool[i].cap = caps[i];
		pool[i].buf = s->be->alloc(s->be, pool[i].cap * s->be->elt);
		pool[i].unit = -1;
	}
	free(pad);
	free(caps);
	return 0;
}

int sl_shard_create(struct sl_shard *s, struct sl_backend *be, const struct sl_layout *lay,
		    const struct sl_shard_opts *o)
{
	struct sl_backend *b = be;
	size_t max_padded = 0, max_shard = 0;
	const int P = o->expert_groups > 1 ? o->expert_groups : 1;
	bool any_gather = false, experts = false;

	memset(s, 0, sizeof(*s));
	s->be = be;
	s->lay = lay;
	s->n_units = lay->n_units;
	s->shard_comm = o->shard_comm;
	s->replica_comm = o->replica_comm;
	s->S = o->shard_comm ? o->shard_comm->size : 1;
	s->shard_rank = o->shard_comm ? o->shard_comm->rank : 0;
	s->reshard_after_forward = o->reshard_after_forward;
	s->offload = o->offload;
	s->host_state = o->offload != SL_OFFLOAD_NONE;
	s->host_params = o->offload == SL_OFFLOAD_PARAMS;
	s->lean = o->host_lean && s->host_state && !s->host_params;
	s->accum_dev = s->host_state && (o->accum_on_device || s->lean);
	s->prefetch = o->prefetch;
	s->accum = o->accum;
	s->mb_last = true;
	s->compute_dtype = be->elt == 2 ? SL_COMM_BF16 : be->elt == 8 ? SL_COMM_F64 : SL_COMM_F32;
	s->grad_direct = s->S == 1 && P == 1 && !s->host_state && s->accum == 1 &&
		(!s->replica_comm || s->replica_comm->size <= 1) && be->sumsq_c && be->adamw_c &&
		!o->no_grad_direct;
	s->grad_elt = s->grad_direct ? be->elt : sizeof(float);
	s->u = calloc(lay->n_units, sizeof(*s->u));
	s->shard_sizes = calloc(lay->n_units, sizeof(size_t));
	s->shard_starts = calloc(lay->n_units, sizeof(size_t));
	s->shard_counts = calloc(lay->n_units, sizeof(size_t));
	s->h_sumsq = calloc(lay->n_units, sizeof(double));
	if (!s->u || !s->shard_sizes || !s->shard_starts || !s->shard_counts || !s->h_sumsq)
		return -1;
	for (int i = 0; i < lay->n_units; i++) {
		struct sl_shard_unit *u = &s->u[i];

		int E = lay->unit_experts ? lay->unit_experts[i] : 0;

		experts |= E > 0;
		u->numel = lay->unit_numel[i];
		u->comm = s->shard_comm;
		u->S = s->S;
		u->rank = s->shard_rank;
		if (E && P > 1) {
			/* an experts' unit: this rank's E / P experts, over its expert peers */
			if (E % P || lay->unit_numel[i] % E || o->expert_index < 0 ||
			    o->expert_index >= P) {
				sl_error("shard: unit %d's %d experts do not split over %d expert "
					 "groups", i, E, P);
				return -1;
			}
			u->numel = lay->unit_numel[i] / P;
			u->base = (size_t)o->expert_index * u->numel;
			u->comm = o->expert_comm;
			u->S = o->expert_comm ? o->expert_comm->size : 1;
			u->rank = o->expert_comm ? o->expert_comm->rank : 0;
		}
		u->padded = (u->numel + u->S - 1) / u->S * u->S;
		u->shard = u->padded / u->S;
		u->off = u->base + (size_t)u->rank * u->shard;
		u->count = (size_t)u->rank * u->shard < u->numel ?
			u->numel - (size_t)u->rank * u->shard : 0;
		if (u->count > u->shard)
			u->count = u->shard;
		any_gather |= u->S > 1;
		u->wslot = -1;
		u->master = state_alloc(s, u->shard * sizeof(float));
		u->m = state_alloc(s, u->shard * sizeof(float));
		u->v = state_alloc(s, u->shard * sizeof(float));
		if (s->grad_direct) {
			u->gradc = lend_grads(s, o, i, u->shard * b->elt);
			u->grad_lent = u->gradc != NULL;
			if (!u->gradc)
				u->gradc = b->alloc(b, u->shard * b->elt);
		} else {
			u->grad32 = s->lean ? NULL : lend_grads(s, o, i, u->shard * sizeof(float));
			u->grad_lent = u->grad32 != NULL;
			if (!s->lean && !u->grad32)
				u->grad32 = state_alloc(s, u->shard * sizeof(float));
		}
		u->w_shard = s->host_params ? sl_shard_host_alloc(s->be, u->shard * b->elt) :
			b->alloc(b, u->shard * b->elt);
		s->shard_sizes[i] = u->shard;
		s->shard_starts[i] = u->off;
		s->shard_counts[i] = u->count;
		if (u->padded > max_padded)
			max_padded = u->padded;
		if (u->shard > max_shard)
			max_shard = u->shard;
	}
	/*
	 * The model holds one unit at a time; prefetch adds units in flight.  Offloaded params
	 * always use the small pool: keeping every unit on the device would defeat the offload.
	 */
	s->n_wslots = !any_gather && !s->host_params ? 0 :
		o->reshard_after_forward || s->host_params ?
		(o->prefetch + 2 < s->n_units ? o->prefetch + 2 : s->n_units) : s->n_units;
	/* a layer's gradients, its experts', and tied embeddings' held through the backward */
	s->n_gslots = s->grad_direct ? 0 : experts ? 3 : 2;
	s->wslots = calloc(s->n_wslots ? s->n_wslots : 1, sizeof(*s->wslots));
	s->gslots = calloc(s->n_gslots ? s->n_gslots : 1, sizeof(*s->gslots));
	if (pool_alloc(s, s->wslots, s->n_wslots) || pool_alloc(s, s->gslots, s->n_gslots))
		return -1;
	if (any_gather)
		s->g32_full = b->alloc(b, (s->g32_elems = g32_elems(max_padded, s->S)) * sizeof(float));
	/* the second micro-batch's reduced shard on its way into the accumulator */
	if (s->host_state || s->accum != 1)
		s->rs_out = b->alloc(b, max_shard * sizeof(float));
	s->max_shard = max_shard;
	s->d_sumsq = b->alloc(b, s->n_units * sizeof(double));
	if (s->host_params && !single(s))
		s->d_wstage = b->alloc(b, max_shard * b->elt);
	s->opt_last = -1;
	s->overlap_opt = o->overlap_optimizer && !s->host_state && be->side_begin &&
		be->side_end && be->record_event && be->event_create && be->wait_event;
	for (int i = 0; s->overlap_opt && i < s->n_units; i++)
		s->u[i].ev_opt = be->event_create(be);
	for (int i = 0; i < s->n_units; i++)
		s->u[i].fwd_pos = -1;
	s->opt_ahead = o->optimizer_ahead > 0 ? o->optimizer_ahead : -1;
	s->opt_chunk = o->optimizer_chunk;
	if (s->overlap_opt && !(s->fwd_order = calloc(s->n_units, sizeof(int))))
		return -1;
	/* with replicas the accumulators are all-reduced in the optimizer step first */
	s->sq_overlap = s->overlap_opt && (!s->replica_comm || s->replica_comm->size <= 1);
	if (s->sq_overlap)
		s->ev_sq = be->event_create(be);
	{
		const char *e = getenv("SHARDLM_OPT_BWD");

		s->early_on = s->sq_overlap && s->grad_direct && !(e && !strcmp(e, "0"));
	}
	s->src = (struct sl_unit_source){ .ctx = s, .weights = unit_weights, .grads = unit_grads,
					  .grads_set = unit_grads_set,
					  .release_fwd = release_weights,
					  .release_bwd = release_grads };
	if (s->host_state)
		return sl_offload_create(s, max_shard);
	return 0;
}

void sl_shard_destroy(struct sl_shard *s)
{
	struct sl_backend *b = s->be;

	if (!s->u)
		return;
	sl_offload_destroy(s);
	if (s->overlap_opt) {
		sl_shard_settle(s);
		b->sync(b);
		if (s->ev_sq)
			b->event_destroy(b, s->ev_sq);
	}
	for (int i = 0; i < s->n_units; i++) {
		struct sl_shard_unit *u = &s->u[i];

		if (u->ev_opt)
			b->event_destroy(b, u->ev_opt);
		state_free(s, u->master);
		state_free(s, u->m);
		state_free(s, u->v);
		if (!u->grad_lent && u->gradc)
			b->free(b, u->gradc);
		else if (!u->grad_lent)
			state_free(s, u->grad32);
		if (s->host_params)
			sl_shard_host_free(s->be, u->w_shard);
		else
			b->free(b, u->w_shard);
	}
	for (int i = 0; i < s->n_wslots; i++)
		b->free(b, s->wslots[i].buf);
	for (int i = 0; i < s->n_gslots; i++)
		b->free(b, s->gslots[i].buf);
	if (s->g32_full)
		b->free(b, s->g32_full);
	if (s->rs_out)
		b->free(b, s->rs_out);
	b->free(b, s->d_sumsq);
	if (s->d_wstage)
		b->free(b, s->d_wstage);
	free(s->wslots);
	free(s->gslots);
	free(s->u);
	free(s->shard_sizes);
	free(s->shard_starts);
	free(s->shard_counts);
	free(s->h_sumsq);
	free(s->fwd_order);
	s->u = NULL;
}

/* Weights changed: every gathered copy is stale. */
static void invalidate_slots(struct sl_shard *s)
{
	for (int i = 0; i < s->n_wslots; i++)
		s->wslots[i].unit = -1;
	for (int i = 0; i < s->n_units; i++)
		s->u[i].wslot = -1;
}

void sl_shard_load_unit(struct sl_shard *s, int ui, const float *full)
{
	struct sl_shard_unit *u = &s->u[ui];
	float *slice = calloc(u->shard, sizeof(float));

	memcpy(slice, full + u->off, u->count * sizeof(float));
	sl_shard_set_state(s, ui, slice, NULL, NULL);
	free(slice);
}

void sl_shard_get_state(struct sl_shard *s, int ui, float *master, float *m, float *v)
{
	struct sl_backend *b = s->be;
	struct sl_shard_unit *u = &s->u[ui];
	size_t n = u->shard * sizeof(float);

	if (s->host_state) {
		sl_offload_drain(s);
		memcpy(master, u->master, n);
		if (m)
			memcpy(m, u->m, n);
		if (v)
			memcpy(v, u->v, n);
		return;
	}
	sl_shard_settle(s);
	b->download(b, master, u->master, n);
	if (m)
		b->download(b, m, u->m, n);
	if (v)
		b->download(b, v, u->v, n);
}

void sl_shard_set_state(struct sl_shard *s, int ui, const float *master, const float *m,
			const float *v)
{
	struct sl_backend *b = s->be;
	struct sl_shard_unit *u = &s->u[ui];
	size_t n = u->shard * sizeof(float);

	if (s->host_state) {
		sl_offload_drain(s);
		memcpy(u->master, master, n);
		if (m)
			memcpy(u->m, m, n);
		else
			memset(u->m, 0, n);
		if (v)
			memcpy(u->v, v, n);
		else
			memset(u->v, 0, n);
		sl_offload_refresh(s, ui);
		invalidate_slots(s);
		return;
	}
	sl_shard_settle(s);
	b->upload(b, u->master, master, u->shard * sizeof(float));
	if (m)
		b->upload(b, u->m, m, u->shard * sizeof(float));
	else
		b->zero(b, u->m, u->shard * sizeof(float));
	if (v)
		b->upload(b, u->v, v, u->shard * sizeof(float));
	else
		b->zero(b, u->v, u->shard * sizeof(float));
	b->to_compute(b, u->w_shard, u->master, u->shard);
	invalidate_slots(s);
}

int sl_shard_gather_unit(struct sl_shard *s, int ui, float *full, int root)
{
	struct sl_shard_unit *u = &s->u[ui];
	float *mine = malloc(u->shard * sizeof(float));
	unsigned long long me[2] = { u->off, u->count }, *at = NULL;
	int *cnt = NULL, *disp = NULL, ret = -1;
	float *all = NULL;

	sl_shard_get_state(s, ui, mine, NULL, NULL);
	if (single(s)) {
		memcpy(full, mine, u->numel * sizeof(float));
		ret = 0;
		goto out;
	}
	/* every rank's range of the layout's unit (the experts' part of an experts' unit) */
	if (s->shard_rank == root) {
		at = malloc(2 * sizeof(*at) * s->S);
		cnt = malloc(2 * sizeof(int) * s->S);
		all = malloc(u->shard * sizeof(float) * s->S);
		if (!at || !cnt || !all)
			sl_dist_abort("out of host memory gathering a unit");
		disp = cnt + s->S;
	}
	if (MPI_Gather(me, 2, MPI_UNSIGNED_LONG_LONG, at, 2, MPI_UNSIGNED_LONG_LONG, root,
		       s->shard_comm->mpi) != MPI_SUCCESS)
		goto out;
	for (int r = 0; cnt && r < s->S; r++) {
		cnt[r] = (int)at[2 * r + 1];
		disp[r] = (int)(r * u->shard);
	}
	if (MPI_Gatherv(mine, (int)u->count, MPI_FLOAT, all, cnt, disp, MPI_FLOAT, root,
			s->shard_comm->mpi) != MPI_SUCCESS)
		goto out;
	for (int r = 0; all && r < s->S; r++)
		memcpy(full + at[2 * r], all + (size_t)r * u->shard, sizeof(float) * cnt[r]);
	ret = 0;
out:
	free(at);
	free(cnt);
	free(all);
	free(mine);
	return ret;
}

void sl_shard_begin_step(struct sl_shard *s)
{
	/* a skipped step's gradients may still be on their way into the accumulators */
	if (s->grads_pending)
		sl_offload_drain(s);
	s->grads_pending = false;
	for (int i = 0; i < s->n_units; i++)
		s->u[i].grads_seen = s->u[i].sq_side = false;
}

void sl_shard_begin_micro(struct sl_shard *s, bool last)
{
	s->mb_last = last;
}

/* a step's AdamW arguments common to its units (learning rate and decay: run_args) */
static struct sl_adamw_args step_args(const struct sl_optim_hparams *h, double grad_scale)
{
	return (struct sl_adamw_args){
		.beta1 = h->beta1, .beta2 = h->beta2, .eps = h->eps,
		.bc1 = 1.0 - pow(h->beta1, h->step), .bc2 = 1.0 - pow(h->beta2, h->step),
		.grad_scale = grad_scale,
	};
}

void sl_shard_poison(struct sl_backend *be, void *dst)
{
	const uint16_t nan16 = 0x7fc0;	/* bf16 quiet NaN */
	const float nan32 = NAN;
	const double nan64 = NAN;

	be->upload(be, dst, be->elt == 2 ? (const void *)&nan16 : be->elt == 4 ?
		   (const void *)&nan32 : (const void *)&nan64, be->elt);
}

void sl_shard_early_update(struct sl_shard *s, const struct sl_optim_hparams *h, int poison)
{
	s->early_step = s->early_on && h->clip <= 0 && s->opt_npending == 0;
	s->early_poison = poison;
	if (!s->early_step)
		return;
	s->opt_h = *h;
	s->opt_a = step_args(h, 1.0);
}

void sl_shard_drain(struct sl_shard *s)
{
	sl_offload_drain(s);
}

/* The part of tensor @ti in unit @u's shard: [*lo, *hi) in the layout's unit; false when
 * empty. */
bool sl_shard_part(const struct sl_tensor_info *ti, const struct sl_shard_unit *u, size_t *lo,
		   size_t *hi)
{
	*lo = ti->offset > u->off ? ti->offset : u->off;
	*hi = ti->offset + ti->numel < u->off + u->count ? ti->offset + ti->numel :
		u->off + u->count;
	return *lo < *hi;
}

/* the learning rate and decay of tensor @ti's update */
static void run_args(struct sl_adamw_args *a, const struct sl_optim_hparams *h,
		     const struct sl_tensor_info *ti)
{
	a->lr = h->lr * (ti->head ? h->head_lr_mult : 1.0);
	a->weight_decay = ti->decay ? h->weight_decay : 0.0;
}

void sl_shard_update_runs(const struct sl_layout *lay, const struct sl_shard_unit *u, int ui,
			  const struct sl_optim_hparams *h, struct sl_adamw_args *a,
			  void (*fn)(void *ctx, size_t k, size_t n, const struct sl_adamw_args *a),
			  void *ctx)
{
	const struct sl_tensor_info *first = NULL;
	size_t k = 0, n = 0;

	for (int t = 0; t < lay->n_tensors; t++) {
		const struct sl_tensor_info *ti = &lay->t[t];
		size_t lo, hi;

		if (ti->unit > ui)	/* the layout is ordered by unit */
			break;
		if (ti->unit < ui || !sl_shard_part(ti, u, &lo, &hi))
			continue;
		if (first && first->head == ti->head && first->decay == ti->decay &&
		    k + n == lo - u->off) {
			n += hi - lo;
			continue;
		}
		if (first) {
			run_args(a, h, first);
			fn(ctx, k, n, a);
		}
		first = ti;
		k = lo - u->off;
		n = hi - lo;
	}
	if (first) {
		run_args(a, h, first);
		fn(ctx, k, n, a);
	}
}

/* sl_shard_optim_step's update of one run (sl_shard_update_runs) */
struct update_ctx {
	struct sl_shard *s;
	struct sl_shard_unit *u;
};

static void update_run(void *arg, size_t k0, size_t n0, const struct sl_adamw_args *a)
{
	struct update_ctx *x = arg;
	struct sl_backend *b = x->s->be;
	struct sl_shard_unit *u = x->u;
	/* overlap_optimizer's launches of at most opt_chunk elements (a multiple of 1024: each
	 * piece starts as aligned as the run) */
	const size_t step = x->s->overlap_opt && x->s->opt_chunk ?
			    (x->s->opt_chunk + 1023) / 1024 * 1024 : n0;

	for (size_t k = k0; k < k0 + n0; k += step) {
		const size_t n = k0 + n0 - k < step ? k0 + n0 - k : step;

		if (x->s->grad_direct)
			b->adamw_c(b, u->master + k, u->m + k, u->v + k,
				   (char *)u->gradc + k * b->elt, (char *)u->w_shard + k * b->elt,
				   n, a);
		else
			b->adamw_f32(b, u->master + k, u->m + k, u->v + k, u->grad32 + k,
				     (char *)u->w_shard + k * b->elt, n, a);
	}
}

/* unit @ui's AdamW update, run by run (where launches go) */
static void update_unit(struct sl_shard *s, int ui, const struct sl_optim_hparams *h,
			struct sl_adamw_args *a)
{
	struct update_ctx x = { .s = s, .u = &s->u[ui] };

	sl_shard_update_runs(s->lay, &s->u[ui], ui, h, a, update_run, &x);
}

int sl_shard_optim_step(struct sl_shard *s, const struct sl_optim_hparams *h, double *grad_norm)
{
	struct sl_backend *b = s->be;
	double sumsq = 0;

	if (s->off) {
		int r = sl_offload_optim_step(s, h, grad_norm);

		if (!r)
			invalidate_slots(s);
		return r;
	}
	if (s->early_step) {
		/*
		 * The updates ran in the backward, each skipped where its unit's sum of squares
		 * was not finite: if none was, the norm (for the log) and the units the backward
		 * gave no gradient (zeros, as below) are left; if every update was skipped, so is
		 * the step; if some ran and some did not, the step can be neither taken back nor
		 * finished (2).
		 */
		int ran = 0, bad = 0;

		s->early_step = false;
		if (s->sq_pending) {
			b->wait_event(b, s->ev_sq);
			s->sq_pending = false;
		}
		b->download(b, s->h_sumsq, s->d_sumsq, s->n_units * sizeof(double));
		for (int i = 0; i < s->n_units; i++) {
			if (!s->u[i].grads_seen)
				s->h_sumsq[i] = 0;
			else if (!isfinite(s->h_sumsq[i]))
				bad++;
			else
				ran++;
			sumsq += s->h_sumsq[i];
		}
		*grad_norm = sqrt(sumsq);
		invalidate_slots(s);
		if (bad)
			return ran ? 2 : 1;
		for (int i = 0; i < s->n_units; i++) {
			if (s->u[i].grads_seen)
				continue;
			b->zero(b, s->u[i].gradc, s->u[i].shard * s->grad_elt);
			early_issue(s, i, NULL);
		}
		return 0;
	}
	/* a unit the step did not read may still be in the last update; the backward issued its
	 * sums of squares (sq_overlap) already: the download below waits for them */
	sl_shard_settle(s);
	for (int i = 0; i < s->n_units; i++) {
		struct sl_shard_unit *u = &s->u[i];

		if (u->sq_side)
			continue;	/* on the side stream already (sq_overlap) */
		/* a unit with no gradient this step (cannot happen for this model) counts as 0 */
		if (!u->grads_seen)
			b->zero(b, s->grad_direct ? u->gradc : (void *)u->grad32,
				u->shard * s->grad_elt);
		if (s->grad_direct) {
			b->sumsq_c(b, s->d_sumsq + i, u->gradc, u->shard);
			continue;
		}
		if (s->replica_comm && s->replica_comm->size > 1)
			sl_comm_all_reduce(s->replica_comm, u->grad32, u->shard, SL_COMM_F32);
		b->sumsq_f32(b, s->d_sumsq + i, u->grad32, u->shard);
	}
	/* one download for all units; summed in unit order (the same sum on every run) */
	b->download(b, s->h_sumsq, s->d_sumsq, s->n_units * sizeof(double));
	for (int i = 0; i < s->n_units; i++)
		sumsq += s->h_sumsq[i];
	if (!single(s))
		/* a host scalar: MPI whatever carries the tensors (NCCL wants device memory) */
		MPI_Allreduce(MPI_IN_PLACE, &sumsq, 1, MPI_DOUBLE, MPI_SUM, s->shard_comm->mpi);
	*grad_norm = sqrt(sumsq);
	if (!isfinite(*grad_norm))
		return 1;

	struct sl_adamw_args a = step_args(h, sl_clip_scale(*grad_norm, h->clip));
	/*
	 * One update per run of tensors in this rank's shard (sl_shard_update_runs): learning rate
	 * and decay differ between the tensors of a unit, and a shard boundary may cut a tensor
	 * anywhere.  overlap_optimizer: on the side stream, in unit (forward) order, each unit's
	 * end recorded for the next forward (unit_weights) to wait for.
	 */
	if (s->overlap_opt) {
		s->opt_h = *h;
		s->opt_a = a;
		for (int ui = 0; ui < s->n_units; ui++)
			s->u[ui].opt_pending = true;
		s->opt_npending = s->n_units;
		/* the forward's first units now (under the step's end), the rest as it reads them */
		opt_issue_upto(s, s->opt_ahead < 0 ? -1 : s->opt_ahead);
	} else {
		for (int ui = 0; ui < s->n_units; ui++)
			update_unit(s, ui, h, &a);
	}
	invalidate_slots(s);
	return 0;
}
