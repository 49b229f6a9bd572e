/*
 * model_moe_ep: expert parallelism and expert capacity for the Qwen3-MoE sparse MLP.
 *
 * With a dispatch set (sl_model_set_moe_dispatch), rank r of an expert group of P ranks runs
 * experts [r El, (r+1) El) of every MoE layer, El = E / P.  After routing and the permutation by
 * expert (model_moe.c), a rank's choices are sorted by expert, so the rows for each owner are
 * contiguous and owners come in rank order:
 *
 *  1. keep: every choice, or with capacity_factor > 0 the first ceil(cf N k / E) real-token
 *     choices of each expert (token order: the later tokens are dropped), never padding;
 *  2. counts per (owner, local expert) go to the owners (dispatch->counts), then the kept rows
 *     of the layer input (dispatch->rows, all-to-all), arriving source-major: reordered
 *     expert-major so each local expert's rows are contiguous for the grouped matmuls;
 *  3. the local experts' SwiGLU MLPs; outputs reordered source-major and sent back;
 *  4. back home, each sorted row takes its output, or 0 for a dropped choice; model_moe.c
 *     combines them with the routing weights as without a dispatch.
 *
 * The backward sends the outputs' gradients the same way, the owner differentiates its experts
 * (weight gradients into its experts' unit) and sends the inputs' gradients back.  A rank's
 * experts' unit holds only its El experts (shard.c shards it over the ranks holding the same
 * experts and reduces its gradients over them only), so weights, gradients and optimizer state
 * of the experts take 1 / P of the memory, and the experts' unit is indexed from 0 here.
 *
 * Buffers are sized for the worst case: all P ranks' T k choices at one owner.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model_moe_impl.h"

/* one activation slot's dispatch (beside struct moe_acts) */
struct ep_acts {
	int32_t *send_tok;	/* (n) device: token of each sent row, in send order */
	int32_t *send_sorted;	/* (n) device: sorted row of each sent row */
	int32_t *inv;		/* (n) device: sent position of each sorted row; n_sent: dropped */
	int32_t *perm;		/* (P n) device: received row of each expert-major local row */
	int32_t *iperm;		/* (P n) device: expert-major local row of each received row */
	int32_t *offs;		/* (El + 1) device: first local row of each local expert */
	int *h_offs;		/* (El + 1) host copy */
	int *scount, *rcount;	/* (P) host: rows sent to / received from each rank */
	int n_sent, n_local;
	void *xl;		/* (P n, H) local experts' input rows, expert-major */
	void *gul;		/* (P n, 2 Im) their gate | up */
	void *actl;		/* (P n, Im) silu(gate) * up */
};

struct moe_ep {
	struct sl_moe_dispatch d;
	int P, El;
	size_t n, pn;		/* rows: T k (one rank's choices), P T k (one owner's worst case) */
	struct ep_acts *ea;	/* (mo->n_la): one per MoE activation slot */
	void *s_a, *s_b;	/* (P n + 1, H) scratch */
	void *s_i;		/* (P n, Im) scratch */
	void *s_gu;		/* (P n, 2 Im) scratch */
	int32_t *iota;		/* (P n) device: 0, 1, ... (a local exchange when P = 1) */
	int32_t *h_rows;	/* (n) host: token of each sorted row */
	int32_t *h_a, *h_b, *h_c; /* (P n) host scratch */
	int *h_cnt, *h_rc;	/* (P El) host: rows per (rank, local expert) sent / received */
	long long dropped;	/* choices dropped in this micro-batch's forward */
	bool paused;		/* sl_model_moe_dispatch_pause: none dropped (and with P = 1
				 * every expert local) */
};

bool sl_moe_ep_on(const struct sl_moe *mo)
{
	/* the experts are split over P > 1 ranks: only the dispatch reaches them */
	return mo && mo->ep && (!mo->ep->paused || mo->ep->P > 1);
}

void sl_model_moe_dispatch_pause(struct sl_model *m, bool pause)
{
	if (m->moe && m->moe->ep)
		m->moe->ep->paused = pause;
}

void sl_moe_ep_begin(struct sl_moe *mo)
{
	if (mo && mo->ep)
		mo->ep->dropped = 0;
}

void sl_moe_ep_destroy(struct sl_moe *mo)
{
	struct moe_ep *ep = mo ? mo->ep : NULL;

	if (!ep)
		return;
	/* device buffers came from sl_model_ws_alloc: the model frees them */
	free(ep->h_rows);
	free(ep->h_a);
	free(ep->h_b);
	free(ep->h_c);
	free(ep->h_cnt);
	free(ep->h_rc);
	free(ep->ea);	/* the host arrays inside were allocated with it */
	free(ep);
	mo->ep = NULL;
}

static int ep_alloc(struct sl_model *m, struct sl_moe *mo, struct moe_ep *ep)
{
	struct sl_backend *be = m->be;
	const size_t n = ep->n, pn = ep->pn, H = (size_t)m->H, Im = (size_t)mo->Im, e = be->elt;
	const int P = ep->P, El = ep->El;
	int32_t *h;
	int *hi;

	ep->ea = calloc((size_t)mo->n_la,
			sizeof(*ep->ea) + (size_t)(El + 1 + 2 * P) * sizeof(int));
	ep->h_rows = malloc(n * sizeof(int32_t));
	ep->h_a = malloc(pn * sizeof(int32_t));
	ep->h_b = malloc(pn * sizeof(int32_t));
	ep->h_c = malloc(pn * sizeof(int32_t));
	ep->h_cnt = calloc((size_t)P * El, sizeof(int));
	ep->h_rc = calloc((size_t)P * El, sizeof(int));
	if (!ep->ea || !ep->h_rows || !ep->h_a || !ep->h_b || !ep->h_c || !ep->h_cnt || !ep->h_rc)
		return -ENOMEM;
	/* the host count arrays of every slot after the slots themselves */
	hi = (int *)(ep->ea + mo->n_la);
	for (int i = 0; i < mo->n_la; i++) {
		struct ep_acts *a = &ep->ea[i];

		a->h_offs = hi;
		a->scount = hi + El + 1;
		a->rcount = hi + El + 1 + P;
		hi += El + 1 + 2 * P;
		a->send_tok = sl_model_ws_alloc(m, n, sizeof(int32_t));
		a->send_sorted = sl_model_ws_alloc(m, n, sizeof(int32_t));
		a->inv = sl_model_ws_alloc(m, n, sizeof(int32_t));
		a->perm = sl_model_ws_alloc(m, pn, sizeof(int32_t));
		a->iperm = sl_model_ws_alloc(m, pn, sizeof(int32_t));
		a->offs = sl_model_ws_alloc(m, (size_t)El + 1, sizeof(int32_t));
		a->xl = sl_model_ws_alloc(m, pn * H, e);
		a->gul = sl_model_ws_alloc(m, pn * 2 * Im, e);
		a->actl = sl_model_ws_alloc(m, pn * Im, e);
		if (!a->actl)
			return -ENOMEM;
	}
	ep->s_a = sl_model_ws_alloc(m, (pn + 1) * H, e);
	ep->s_b = sl_model_ws_alloc(m, (pn + 1) * H, e);
	ep->s_i = sl_model_ws_alloc(m, pn * Im, e);
	ep->s_gu = sl_model_ws_alloc(m, pn * 2 * Im, e);
	ep->iota = sl_model_ws_alloc(m, pn, sizeof(int32_t));
	if (!ep->iota)
		return -ENOMEM;
	h = ep->h_a;
	for (size_t i = 0; i < pn; i++)
		h[i] = (int32_t)i;
	be->upload(be, ep->iota, h, pn * sizeof(int32_t));
	be->sync(be);
	return 0;
}

int sl_model_set_moe_dispatch(struct sl_model *m, const struct sl_moe_dispatch *d)
{
	struct sl_moe *mo = m->moe;
	struct moe_ep *ep;

	if (!d) {
		sl_moe_ep_destroy(mo);
		return 0;
	}
	if (!mo) {
		fprintf(stderr, "model: expert parallelism or an expert capacity needs a model "
			"with MoE layers\n");
		return -EINVAL;
	}
	if (d->size < 1 || d->rank < 0 || d->rank >= d->size || mo->E % d->size ||
	    (d->size > 1 && (!d->counts || !d->rows))) {
		fprintf(stderr, "model: the %d experts per layer do not split over %d "
			"expert-parallel ranks (parallel.expert must divide the number of "
			"experts)\n", mo->E, d->size);
		return -EINVAL;
	}
	sl_moe_ep_destroy(mo);
	ep = calloc(1, sizeof(*ep));
	if (!ep)
		return -ENOMEM;
	mo->ep = ep;
	ep->d = *d;
	ep->P = d->size;
	ep->El = mo->E / d->size;
	ep->n = (size_t)m->max_tokens * mo->k;
	ep->pn = ep->n * ep->P;
	if (ep_alloc(m, mo, ep)) {
		fprintf(stderr, "model: out of memory for the expert dispatch\n");
		return -ENOMEM;
	}
	return 0;
}

long long sl_model_moe_dropped(const struct sl_model *m)
{
	return m->moe && m->moe->ep ? m->moe->ep->dropped : 0;
}

/* rows to and from the group; with P = 1 a copy */
static void exchange(struct sl_model *m, struct moe_ep *ep, const void *send, const int *scount,
		     void *recv, const int *rcount)
{
	if (ep->P == 1) {
		if (scount[0])
			m->be->gather_rows(m->be, recv, send, ep->iota, scount[0], m->H);
		return;
	}
	m->be->sync(m->be);
	ep->d.rows(ep->d.ctx, send, scount, recv, rcount, (size_t)m->H * m->be->elt);
}

/* 1 and 2: which rows go where, counts exchanged, index arrays on the device */
static void plan(struct sl_model *m, struct sl_moe *mo, struct moe_ep *ep, struct ep_acts *ea,
		 const struct moe_acts *ma, const struct sl_batch_dev *b, bool full)
{
	struct sl_backend *be = m->be;
	const int E = mo->E, k = mo->k, P = ep->P, El = ep->El, T = b->B * b->L, n = T * k;
	int32_t *tok = ep->h_a, *srt = ep->h_b, *inv = ep->h_c;
	long long cap = 0, dropped = 0, n_real = 0;
	const double cf = ep->paused ? 0 : ep->d.capacity_factor;
	int ns = 0;

	be->download(be, ep->h_rows, ma->rows, (size_t)n * sizeof(int32_t));
	be->sync(be);
	if (cf > 0) {
		for (int r = 0; r < b->B; r++)
			n_real += mo->h_lens[r];
		cap = (long long)ceil(cf * (double)n_real * k / E);
	}
	for (int e = 0; e < E; e++) {
		long long kept = 0;

		for (int r = ma->h_offs[e]; r < ma->h_offs[e + 1]; r++) {
			int t = ep->h_rows[r];
			bool real = t % b->L < mo->h_lens[t / b->L];

			if (cf > 0 && (!real || kept >= cap)) {
				dropped += real;
				inv[r] = -1;
				continue;
			}
			kept++;
			tok[ns] = t;
			srt[ns] = r;
			inv[r] = ns++;
		}
		ep->h_cnt[e] = (int)kept;	/* e = owner * El + local expert */
	}
	for (int r = 0; r < n; r++)
		if (inv[r] < 0)
			inv[r] = ns;	/* the zero row after the sent ones */
	ea->n_sent = ns;
	if (full)
		ep->dropped += dropped;
	for (int q = 0; q < P; q++) {
		ea->scount[q] = 0;
		for (int j = 0; j < El; j++)
			ea->scount[q] += ep->h_cnt[q * El + j];
	}
	if (P > 1)
		ep->d.counts(ep->d.ctx, ep->h_cnt, ep->h_rc, El);
	else
		memcpy(ep->h_rc, ep->h_cnt, (size_t)El * sizeof(int));
	be->upload(be, ea->send_tok, tok, (size_t)ns * sizeof(int32_t));
	be->upload(be, ea->send_sorted, srt, (size_t)ns * sizeof(int32_t));
	be->upload(be, ea->inv, inv, (size_t)n * sizeof(int32_t));
	be->sync(be);	/* the host arrays are reused below */

	/* received: source-major, each source's rows by local expert; the matmuls want
	 * expert-major */
	{
		int *base = ep->h_cnt;	/* reused: first received row of (source, local expert) */
		int32_t *perm = ep->h_a, *iperm = ep->h_b;
		int row = 0, j = 0;

		for (int q = 0; q < P; q++) {
			ea->rcount[q] = 0;
			for (int e = 0; e < El; e++) {
				base[q * El + e] = row;
				row += ep->h_rc[q * El + e];
				ea->rcount[q] += ep->h_rc[q * El + e];
			}
		}
		ea->n_local = row;
		for (int e = 0; e < El; e++) {
			ea->h_offs[e] = j;
			for (int q = 0; q < P; q++)
				for (int i = 0; i < ep->h_rc[q * El + e]; i++, j++) {
					perm[j] = base[q * El + e] + i;
					iperm[perm[j]] = j;
				}
		}
		ea->h_offs[El] = j;
		be->upload(be, ea->perm, perm, (size_t)j * sizeof(int32_t));
		be->upload(be, ea->iperm, iperm, (size_t)j * sizeof(int32_t));
		be->upload(be, ea->offs, ea->h_offs, (size_t)(El + 1) * sizeof(int32_t));
		be->sync(be);
	}
}

void sl_moe_ep_fwd(struct sl_model *m, int l, const void *w, struct moe_acts *ma, const void *xn2,
		   const struct sl_batch_dev *b, bool full)
{
	struct sl_backend *be = m->be;
	struct sl_moe *mo = m->moe;
	struct moe_ep *ep = mo->ep;
	struct ep_acts *ea = &ep->ea[ma - mo->la];
	const struct layer_off *lo = &m->lo[l];
	const int H = m->H, Im = mo->Im, n = b->B * b->L * mo->k;

	plan(m, mo, ep, ea, ma, b, full);
	be->gather_rows(be, ep->s_a, xn2, ea->send_tok, ea->n_sent, H);
	exchange(m, ep, ep->s_a, ea->scount, ep->s_b, ea->rcount);
	be->gather_rows(be, ea->xl, ep->s_b, ea->perm, ea->n_local, H);

	be->moe_gemm_fwd(be, ea->gul, ea->xl, at(m, w, lo->wegu), ea->offs, ea->h_offs, ep->El, H,
			 2 * Im, lo->wes);
	be->swiglu_fwd(be, ea->actl, ea->gul, ea->n_local, Im);
	be->moe_gemm_fwd(be, ep->s_a, ea->actl, at(m, w, lo->wed), ea->offs, ea->h_offs, ep->El,
			 Im, H, lo->wes);

	be->gather_rows(be, ep->s_b, ep->s_a, ea->iperm, ea->n_local, H);
	exchange(m, ep, ep->s_b, ea->rcount, ep->s_a, ea->scount);
	be->zero(be, at(m, ep->s_a, (size_t)ea->n_sent * H), (size_t)H * be->elt);
	be->gather_rows(be, ma->y, ep->s_a, ea->inv, n, H);
}

void sl_moe_ep_bwd(struct sl_model *m, int l, const void *w, void *g, struct moe_acts *ma,
		   const void *dy, void *dx, int n)
{
	struct sl_backend *be = m->be;
	struct sl_moe *mo = m->moe;
	struct moe_ep *ep = mo->ep;
	struct ep_acts *ea = &ep->ea[ma - mo->la];
	const struct layer_off *lo = &m->lo[l];
	const int H = m->H, Im = mo->Im;

	be->gather_rows(be, ep->s_a, dy, ea->send_sorted, ea->n_sent, H);
	exchange(m, ep, ep->s_a, ea->scount, ep->s_b, ea->rcount);
	be->gather_rows(be, ep->s_a, ep->s_b, ea->perm, ea->n_local, H);

	be->moe_gemm_bwd(be, ep->s_i, at(m, g, lo->wed), ep->s_a, ea->actl, at(m, w, lo->wed),
			 ea->offs, ea->h_offs, ep->El, Im, H, lo->wes, false);
	be->swiglu_bwd(be, ep->s_gu, ep->s_i, ea->gul, ea->n_local, Im);
	be->moe_gemm_bwd(be, ep->s_b, at(m, g, lo->wegu), ep->s_gu, ea->xl, at(m, w, lo->wegu),
			 ea->offs, ea->h_offs, ep->El, H, 2 * Im, lo->wes, false);

	be->gather_rows(be, ep->s_a, ep->s_b, ea->iperm, ea->n_local, H);
	exchange(m, ep, ep->s_a, ea->rcount, ep->s_b, ea->scount);
	be->zero(be, at(m, ep->s_b, (size_t)ea->n_sent * H), (size_t)H * be->elt);
	be->gather_rows(be, dx, ep->s_b, ea->inv, n, H);
}
