/*
 * test_moe_gradcheck: the mixture-of-experts backward against central finite differences, in
 * double (the cpu64 backend).
 *  - ops: the router (softmax, top-k, with and without renormalization) followed by the weighted
 *    combine, with an aux-loss-like term on real tokens only; the grouped matmul with an expert
 *    that gets no rows; the permutation against a hand-worked example;
 *  - a whole tiny Qwen3-MoE classifier (MoE, dense, MoE layers; router_aux_loss_coef 0.3, so the
 *    load-balancing loss pools two layers): every sampled parameter's gradient, activation
 *    checkpointing giving the same gradients, padding changing nothing, and the fp32 backend
 *    against the double one.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define VOCAB 23
#define MAXT 32
#define MAXB 4
#define NEXP 5
#define TOPK 2

#include "fdbatch.h"

static void fill_config(struct sl_model_config *mc, bool bias)
{
	qwen3_config(mc, "qwen3_moe", 3, bias);
	/* MoE, dense, MoE: the aux loss pools two layers */
	mc->mlp_kind[0] = mc->mlp_kind[2] = SL_MLP_MOE;
	mc->n_experts = NEXP;
	mc->top_k = TOPK;
	mc->moe_intermediate = 6;
	mc->norm_topk_prob = true;
	mc->router_aux_loss_coef = 0.3;
}

/* ---- ops ----------------------------------------------------------------------------------- */

static double *dalloc(struct sl_backend *be, size_t n)
{
	return be->alloc(be, n * sizeof(double));
}

/* permutation of a hand-worked example: T = 4 tokens, k = 2, E = 3 */
static void check_permute(struct sl_backend *be)
{
	static const int32_t topi[8] = { 2, 0, 0, 1, 2, 1, 0, 2 };
	/* expert 0: choices 1 (t0), 2 (t1), 6 (t3); expert 1: 3 (t1), 5 (t2); 2: 0, 4, 7 */
	static const int32_t want_rows[8] = { 0, 1, 3, 1, 2, 0, 2, 3 };
	static const int32_t want_slot[8] = { 5, 0, 1, 3, 6, 4, 2, 7 };
	static const int32_t want_offs[4] = { 0, 3, 5, 8 };
	int32_t rows[8], slot[8], offs[4];

	be->moe_permute(be, rows, slot, offs, topi, 4, 3, 2);
	CHECK(!memcmp(rows, want_rows, sizeof(rows)) && !memcmp(slot, want_slot, sizeof(slot)) &&
	      !memcmp(offs, want_offs, sizeof(offs)), "permutation of the hand example");
}

/* router on hand values: softmax, the top 2 in order, ties to the lower expert, renormalized */
static void check_route_hand(struct sl_backend *be)
{
	double z[2 * 4] = { 0, log(3), log(2), log(3), 1, 1, 1, 1 }, p[8], w[4];
	int32_t ti[4];

	be->moe_route_fwd(be, p, ti, w, z, 2, 4, 2, true);
	/* token 0: p = (1, 3, 2, 3) / 9, experts 1 and 3 tie: 1 first */
	CHECK(fabs(p[0] - 1.0 / 9) < 1e-15 && fabs(p[1] - 3.0 / 9) < 1e-15, "softmax");
	CHECK(ti[0] == 1 && ti[1] == 3 && fabs(w[0] - 0.5) < 1e-15 && fabs(w[1] - 0.5) < 1e-15,
	      "token 0: experts %d %d weights %g %g", ti[0], ti[1], w[0], w[1]);
	CHECK(ti[2] == 0 && ti[3] == 1, "token 1 (all equal): experts %d %d", ti[2], ti[3]);
	be->moe_route_fwd(be, p, ti, w, z, 1, 4, 2, false);
	CHECK(fabs(w[0] - 3.0 / 9) < 1e-15 && fabs(w[1] - 3.0 / 9) < 1e-15, "not renormalized");
}

struct route_case {
	int B, L, E, k, H;
	int32_t lens[4];
	bool norm;
	double *z, *y, *r, *aux;	/* logits (T,E), expert outputs (Tk,H), dout (T,H), aux_g (E) */
};

/* loss = sum r . combine(route(z), y) + sum over real tokens of aux . p */
static double route_loss(struct sl_backend *be, const struct route_case *c)
{
	const int T = c->B * c->L, E = c->E, k = c->k, H = c->H;
	double *p = dalloc(be, T * E), *w = dalloc(be, T * k), *out = dalloc(be, T * H), loss = 0;
	int32_t *ti = be->alloc(be, T * k * 4), *rows = be->alloc(be, T * k * 4);
	int32_t *slot = be->alloc(be, T * k * 4), *offs = be->alloc(be, (E + 1) * 4);

	be->moe_route_fwd(be, p, ti, w, c->z, T, E, k, c->norm);
	be->moe_permute(be, rows, slot, offs, ti, T, E, k);
	be->moe_combine_fwd(be, out, c->y, w, slot, T, k, H);
	for (int i = 0; i < T * H; i++)
		loss += c->r[i] * out[i];
	for (int t = 0; t < T; t++)
		for (int e = 0; t % c->L < c->lens[t / c->L] && e < E; e++)
			loss += c->aux[e] * p[t * E + e];
	be->free(be, p);
	be->free(be, w);
	be->free(be, out);
	be->free(be, ti);
	be->free(be, rows);
	be->free(be, slot);
	be->free(be, offs);
	return loss;
}

static void check_route_fd(struct sl_backend *be, bool norm)
{
	struct route_case c = { .B = 2, .L = 5, .E = 6, .k = 3, .H = 4, .lens = { 5, 3 },
				.norm = norm };
	const int T = c.B * c.L, E = c.E, k = c.k, H = c.H;
	double *p = dalloc(be, T * E), *w = dalloc(be, T * k), *dy = dalloc(be, T * k * H);
	double *dw = dalloc(be, T * k), *dz = dalloc(be, T * E), worst = 0;
	int32_t *ti = be->alloc(be, T * k * 4), *rows = be->alloc(be, T * k * 4);
	int32_t *slot = be->alloc(be, T * k * 4), *offs = be->alloc(be, (E + 1) * 4);
	int32_t *lens = be->alloc(be, 2 * 4);
	const double h = 1e-6;

	c.z = dalloc(be, T * E);
	c.y = dalloc(be, T * k * H);
	c.r = dalloc(be, T * H);
	c.aux = dalloc(be, E);
	for (int i = 0; i < T * E; i++)
		c.z[i] = 2 * rng_normal();
	for (int i = 0; i < T * k * H; i++)
		c.y[i] = rng_normal();
	for (int i = 0; i < T * H; i++)
		c.r[i] = rng_normal();
	for (int e = 0; e < E; e++)
		c.aux[e] = rng_normal();
	memcpy(lens, c.lens, 2 * 4);
	be->moe_route_fwd(be, p, ti, w, c.z, T, E, k, norm);
	be->moe_permute(be, rows, slot, offs, ti, T, E, k);
	be->moe_combine_bwd(be, dy, dw, c.r, c.y, w, slot, T, k, H);
	be->moe_route_bwd(be, dz, dw, p, ti, w, c.aux, lens, c.B, c.L, E, k, norm);
	for (int i = 0; i < T * E; i++) {
		double z0 = c.z[i], lp, lm, fd;

		c.z[i] = z0 + h;
		lp = route_loss(be, &c);
		c.z[i] = z0 - h;
		lm = route_loss(be, &c);
		c.z[i] = z0;
		fd = (lp - lm) / (2 * h);
		worst = fmax(worst, fabs(dz[i] - fd));
		CHECK(fabs(dz[i] - fd) < 1e-7 * (1 + fabs(fd)), "route%s: dlogits[%d] %.10g, "
		      "finite diff %.10g", norm ? " (norm)" : "", i, dz[i], fd);
	}
	/* the combine is linear in y: its gradient lands on each choice's sorted row */
	for (int i = 0; i < T * k * H; i++) {
		double y0 = c.y[i], lp, lm, fd;

		c.y[i] = y0 + h;
		lp = route_loss(be, &c);
		c.y[i] = y0 - h;
		lm = route_loss(be, &c);
		c.y[i] = y0;
		fd = (lp - lm) / (2 * h);
		worst = fmax(worst, fabs(dy[i] - fd));
		CHECK(fabs(dy[i] - fd) < 1e-7 * (1 + fabs(fd)), "combine: dy[%d] %.10g, finite "
		      "diff %.10g", i, dy[i], fd);
	}
	printf("router + combine%s: worst |analytic - fd| %.2e\n", norm ? " (norm_topk_prob)" : "",
	       worst);
	be->free(be, p);
	be->free(be, w);
	be->free(be, dy);
	be->free(be, dw);
	be->free(be, dz);
	be->free(be, ti);
	be->free(be, rows);
	be->free(be, slot);
	be->free(be, offs);
	be->free(be, lens);
	be->free(be, c.z);
	be->free(be, c.y);
	be->free(be, c.r);
	be->free(be, c.aux);
}

/* grouped matmul: loss = sum r . gemm(x, w); expert 1 of 3 gets no rows */
static void check_gemm_fd(struct sl_backend *be)
{
	const int E = 3, K = 5, N = 4, M = 7, offs[4] = { 0, 3, 3, 7 };
	double x[7 * 5], w[3 * 4 * 5], r[7 * 4], out[7 * 4], dx[7 * 5], dw[3 * 4 * 5] = { 0 };
	double worst = 0;
	const double h = 1e-6;

	for (int i = 0; i < M * K; i++)
		x[i] = rng_normal();
	for (int i = 0; i < E * N * K; i++)
		w[i] = rng_normal();
	for (int i = 0; i < M * N; i++)
		r[i] = rng_normal();
	be->moe_gemm_bwd(be, dx, dw, r, x, w, NULL, offs, E, K, N, (size_t)N * K, false);
	/* dw_set: the same dw over whatever dw held (expert 1, without rows, gets zeros) */
	{
		double dw2[3 * 4 * 5], dx2[7 * 5];
		int bad = 0;

		for (int i = 0; i < E * N * K; i++)
			dw2[i] = 7.0 + i;
		be->moe_gemm_bwd(be, dx2, dw2, r, x, w, NULL, offs, E, K, N, (size_t)N * K, true);
		for (int i = 0; i < E * N * K; i++)
			bad += dw2[i] != dw[i];
		CHECK(!bad, "grouped matmul dw_set: %d of %d differ from dw +=", bad, E * N * K);
	}
	for (int which = 0; which < 2; which++) {
		double *v = which ? w : x, *g = which ? dw : dx;
		int n = which ? E * N * K : M * K;

		for (int i = 0; i < n; i++) {
			double v0 = v[i], l[2] = { 0, 0 };

			for (int s = 0; s < 2; s++) {
				v[i] = v0 + (s ? -h : h);
				be->moe_gemm_fwd(be, out, x, w, NULL, offs, E, K, N, (size_t)N * K);
				for (int j = 0; j < M * N; j++)
					l[s] += r[j] * out[j];
			}
			v[i] = v0;
			worst = fmax(worst, fabs(g[i] - (l[0] - l[1]) / (2 * h)));
			CHECK(fabs(g[i] - (l[0] - l[1]) / (2 * h)) < 1e-7, "grouped matmul d%s[%d]",
			      which ? "w" : "x", i);
		}
	}
	/* the empty expert's weights get no gradient */
	for (int i = N * K; i < 2 * N * K; i++)
		CHECK(dw[i] == 0, "expert without rows: dw[%d] = %g", i, dw[i]);
	printf("grouped matmul: worst |analytic - fd| %.2e\n", worst);
}

/* ---- the whole model ----------------------------------------------------------------------- */

static void check_model(void)
{
	struct sl_model_config mc;
	struct sl_backend *be = sl_backend_cpu64_create(), *be32 = sl_backend_cpu_create();
	struct env e, ec, e32;
	struct hbatch hb[1], hbp;
	const int lens[2] = { 6, 4 }, lens1[1] = { 4 };
	const float labels[2] = { 0.3f, 0.8f };
	double *g, *gc, *g32, l1, l2;
	float s1[2], s2[2];
	int nl = 0, ne = 0;
	double aux = 0;
	const int64_t *cnt;

	fill_config(&mc, false);
	env_init(&e, &mc, be, false);
	make_batch(&hb[0], 2, lens, labels);
	g = calloc(e.lay.total_numel, sizeof(double));
	gc = calloc(e.lay.total_numel, sizeof(double));
	g32 = calloc(e.lay.total_numel, sizeof(double));

	zero_grads(&e);
	l1 = run_step(&e, &hb[0], 0.5f, s1);
	get_grads(&e, g);
	cnt = sl_model_expert_counts(e.m, &nl, &ne, &aux);
	CHECK(cnt && nl == 2 && ne == NEXP, "counts %d x %d", nl, ne);
	for (int i = 0; cnt && i < 2; i++) {
		int64_t sum = 0;

		for (int k = 0; k < NEXP; k++)
			sum += cnt[i * NEXP + k];
		CHECK(sum == (6 + 4) * TOPK, "layer %d: %lld choices over real tokens", i,
		      (long long)sum);
	}
	/* aux = E sum_e f_e P_e with sum f = k, sum P = 1: within (0, E k) */
	CHECK(aux > 0 && aux < NEXP * TOPK, "aux %g", aux);
	check_fd(&e, hb, 1, 0.5f, g, 19, "moe model");

	/* activation checkpointing: the same gradients */
	env_init(&ec, &mc, be, true);
	zero_grads(&ec);
	l2 = run_step(&ec, &hb[0], 0.5f, s2);
	get_grads(&ec, gc);
	CHECK(l1 == l2 && s1[0] == s2[0] && s1[1] == s2[1], "checkpointing changed the loss");
	for (size_t i = 0; i < e.lay.total_numel; i++)
		CHECK(fabs(g[i] - gc[i]) <= 1e-12 * (1 + fabs(g[i])),
		      "checkpointing: gradient %zu %.17g vs %.17g", i, gc[i], g[i]);

	/* padding: record 1 alone (no padding) scores as in the padded batch */
	make_batch(&hbp, 1, lens1, labels + 1);
	memcpy(hbp.ids, hb[0].ids + hb[0].L, 4 * sizeof(int32_t));
	CHECK(score_only(&e, &hbp, s2) == 0 && fabs(s2[0] - s1[1]) < 1e-12,
	      "padding changed record 1's score: %.17g vs %.17g", s2[0], s1[1]);

	/* the fp32 backend agrees with the double one */
	env_init(&e32, &mc, be32, false);
	zero_grads(&e32);
	l2 = run_step(&e32, &hb[0], 0.5f, s2);
	get_grads(&e32, g32);
	CHECK(fabs(l2 - l1) < 1e-5 * fabs(l1), "fp32 loss %.9g vs %.9g", l2, l1);
	check_rel_norm(g32, g, e.lay.total_numel, 1e-4, "fp32");
	env_free(&e);
	env_free(&ec);
	env_free(&e32);
	free(g);
	free(gc);
	free(g32);
	free_config(&mc);
	be->destroy(be);
	be32->destroy(be32);
}

/* ---- config.json --------------------------------------------------------------------------- */

/* parse a qwen3_moe config.json made of the base keys and @extra; returns the loader's status */
static int load_cfg(struct sl_model_config *mc, const char *extra)
{
	char path[] = "/tmp/sl-moe-cfg-XXXXXX";
	int fd = mkstemp(path), rc;
	FILE *f = fdopen(fd, "w");

	fprintf(f, "{\"model_type\": \"qwen3_moe\", \"vocab_size\": 50, \"hidden_size\": 32, "
		"\"num_hidden_layers\": 4, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, "
		"\"intermediate_size\": 64%s}", extra);
	fclose(f);
	rc = sl_model_config_load(mc, path);
	unlink(path);
	return rc;
}

static void check_config(void)
{
	struct sl_model_config mc;
	static const char *const bad[] = {
		", \"num_experts\": 8, \"num_local_experts\": 4",
		", \"num_experts\": 4, \"num_experts_per_tok\": 5",
		", \"mlp_only_layers\": [4]",
		", \"mlp_only_layers\": 1",
		", \"router_aux_loss_coef\": -1",
		", \"decoder_sparse_step\": 0",
	};

	/* Qwen3MoeConfig's defaults; head_dim = hidden / heads when absent */
	CHECK(load_cfg(&mc, "") == 0);
	CHECK(mc.n_experts == 128 && mc.top_k == 8 && mc.moe_intermediate == 768 &&
	      !mc.norm_topk_prob && mc.router_aux_loss_coef == 0.001 && mc.head_dim == 8 &&
	      mc.mlp_kind[0] == SL_MLP_MOE && mc.mlp_kind[3] == SL_MLP_MOE, "defaults");
	sl_model_config_free(&mc);
	/* transformers 5 spelling; sparse step 2 and mlp_only_layers */
	CHECK(load_cfg(&mc, ", \"num_local_experts\": 6, \"num_experts_per_tok\": 2, "
		       "\"decoder_sparse_step\": 2, \"mlp_only_layers\": [3], "
		       "\"norm_topk_prob\": true, \"moe_intermediate_size\": 12") == 0);
	CHECK(mc.n_experts == 6 && mc.top_k == 2 && mc.norm_topk_prob && mc.moe_intermediate == 12);
	CHECK(mc.mlp_kind[0] == SL_MLP_DENSE && mc.mlp_kind[1] == SL_MLP_MOE &&
	      mc.mlp_kind[2] == SL_MLP_DENSE && mc.mlp_kind[3] == SL_MLP_DENSE, "layer kinds");
	sl_model_config_free(&mc);
	/* no experts: every layer dense */
	CHECK(load_cfg(&mc, ", \"num_experts\": 0") == 0 && mc.mlp_kind[0] == SL_MLP_DENSE);
	sl_model_config_free(&mc);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		CHECK(load_cfg(&mc, bad[i]) < 0, "accepted %s", bad[i]);
		sl_model_config_free(&mc);
	}
}

int main(void)
{
	struct sl_backend *be = sl_backend_cpu64_create();

	check_config();
	check_permute(be);
	check_route_hand(be);
	check_route_fd(be, false);
	check_route_fd(be, true);
	check_gemm_fd(be);
	be->destroy(be);
	check_model();
	return test_exit("test_moe_gradcheck");
}
