/*
 * test_cuda_model: the whole tiny model on the cuda backend against the cpu backend: the same
 * random weights (rounded to bf16, so both start from identical values) and micro-batch, one
 * forward + backward each.  The loss must agree to 1e-2 relative and the whole gradient (all
 * parameters as one vector) to 3e-2 in norm-relative error or, where bf16 activations alone cost
 * more, three times that cost.  Per tensor, the bound is 3e-2 or,
 * where storing activations in bf16 alone costs more, three times that cost: a third run, the cpu
 * backend with every op's output rounded to bf16 ("cpu-bf16"), measures it (twice was too tight
 * for an expert's weights, which see only their own tokens: 1.02 and 1.07 of that bound in 2 of
 * 5 runs on the H200, 2026-11-30); and a tensor whose gradient is far smaller than the whole
 * gradient's mean square gives a tensor of its size is held to 3% of that size.  (Small tensors whose gradient
 * is a sum of cancelling terms, such as q/k projections under a nearly flat softmax, lose several
 * percent to bf16 activations whatever the kernels do; the cpu-bf16 run shows how much.)  Several
 * shapes: the gradient check's model (head_dim 8), with attention biases, a wider one (head_dim
 * 16) with activation checkpointing, and head_dim 64 and 128 ones; padded batches with a one-token
 * record.  Fresh seed each run, printed; argv[1] repeats one.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"
#include "bf16.h"
#include "model.h"
#include "testrng.h"
#include "testutil.h"

/* ---- cpu-bf16: the cpu backend with each op's compute outputs rounded to bf16 ---------------- */

static struct sl_backend *CPU;

static void rb(void *p, size_t n)
{
	float *f = p;

	for (size_t i = 0; i < n; i++)
		f[i] = round_bf(f[i]);
}

static void e_emb_bwd(struct sl_backend *be, void *dt, const int32_t *ids, const void *g, int T,
		      int H)
{
	CPU->embedding_bwd(CPU, dt, ids, g, T, H);
}

static void e_rms_fwd(struct sl_backend *be, void *o, void *r, const void *x, const void *w, int T,
		      int H, float eps)
{
	CPU->rmsnorm_fwd(CPU, o, r, x, w, T, H, eps);
	rb(o, (size_t)T * H);
}

static void e_rms_bwd(struct sl_backend *be, void *dx, void *dw, const void *g, const void *x,
		      const void *w, const void *r, int T, int H, bool acc)
{
	CPU->rmsnorm_bwd(CPU, dx, dw, g, x, w, r, T, H, acc);
	rb(dx, (size_t)T * H);
	rb(dw, H);
}

static void e_mm_fwd(struct sl_backend *be, void *o, const void *x, const void *w, const void *b,
		     int T, int K, int N)
{
	CPU->matmul_fwd(CPU, o, x, w, b, T, K, N);
	rb(o, (size_t)T * N);
}

static void e_mm_fwd_res(struct sl_backend *be, void *o, const void *x, const void *w,
			 const void *r, int T, int K, int N)
{
	CPU->matmul_fwd_res(CPU, o, x, w, r, T, K, N);
	rb(o, (size_t)T * N);
}

static void e_mm_bwd(struct sl_backend *be, void *dx, void *dw, void *db, const void *g,
		     const void *x, const void *w, int T, int K, int N, bool acc)
{
	CPU->matmul_bwd(CPU, dx, dw, db, g, x, w, T, K, N, acc);
	if (dx)
		rb(dx, (size_t)T * K);
	rb(dw, (size_t)N * K);
	if (db)
		rb(db, N);
}

static void e_add(struct sl_backend *be, void *y, const void *x, size_t n)
{
	CPU->add(CPU, y, x, n);
	rb(y, n);
}

static void e_qk_fwd(struct sl_backend *be, void *o, void *r, const void *x, const void *qw,
		     const void *kw, int T, int L, const int32_t *pos, int nh, int nkv, int hd,
		     float eps, float th)
{
	CPU->qk_norm_rope_fwd(CPU, o, r, x, qw, kw, T, L, pos, nh, nkv, hd, eps, th);
	rb(o, (size_t)T * (nh + 2 * nkv) * hd);
}

static void e_qk_bwd(struct sl_backend *be, void *d, void *dq, void *dk, const void *g,
		     const void *x, const void *qw, const void *kw, const void *r, int T, int L,
		     const int32_t *pos, int nh, int nkv, int hd, float eps, float th)
{
	CPU->qk_norm_rope_bwd(CPU, d, dq, dk, g, x, qw, kw, r, T, L, pos, nh, nkv, hd, eps, th);
	rb(d, (size_t)T * (nh + 2 * nkv) * hd);
	rb(dq, hd);
	rb(dk, hd);
}

static void e_att_fwd(struct sl_backend *be, void *o, void *lse, const void *qkv,
		      const int32_t *lens, const int32_t *pos, int B, int L, int nh, int nkv, int hd)
{
	CPU->attention_fwd(CPU, o, lse, qkv, lens, pos, B, L, nh, nkv, hd);
	rb(o, (size_t)B * L * nh * hd);
}

static void e_att_bwd(struct sl_backend *be, void *d, const void *g, const void *o, const void *lse,
		      const void *qkv, const int32_t *lens, const int32_t *pos, int B, int L, int nh,
		      int nkv, int hd)
{
	CPU->attention_bwd(CPU, d, g, o, lse, qkv, lens, pos, B, L, nh, nkv, hd);
	rb(d, (size_t)B * L * (nh + 2 * nkv) * hd);
}

static void e_sw_fwd(struct sl_backend *be, void *h, const void *gu, int T, int I)
{
	CPU->swiglu_fwd(CPU, h, gu, T, I);
	rb(h, (size_t)T * I);
}

static void e_sw_bwd(struct sl_backend *be, void *d, const void *dh, const void *gu, int T, int I)
{
	CPU->swiglu_bwd(CPU, d, dh, gu, T, I);
	rb(d, (size_t)T * 2 * I);
}

static void e_destroy(struct sl_backend *be)
{
	CPU->destroy(CPU);
	CPU = NULL;
	free(be);
}

static struct sl_backend *cpu_bf16_create(void)
{
	struct sl_backend *be = sl_backend_cpu_create();

	CPU = sl_backend_cpu_create();
	if (!be || !CPU)
		return NULL;
	be->name = "cpu-bf16";
	be->embedding_bwd = e_emb_bwd;
	be->rmsnorm_fwd = e_rms_fwd;
	be->rmsnorm_bwd = e_rms_bwd;
	be->matmul_fwd = e_mm_fwd;
	be->matmul_fwd_res = e_mm_fwd_res;
	be->matmul_bwd = e_mm_bwd;
	be->add = e_add;
	be->qk_norm_rope_fwd = e_qk_fwd;
	be->qk_norm_rope_bwd = e_qk_bwd;
	be->attention_fwd = e_att_fwd;
	be->attention_bwd = e_att_bwd;
	be->swiglu_fwd = e_sw_fwd;
	be->swiglu_bwd = e_sw_bwd;
	be->destroy = e_destroy;
	return be;
}

/* one backend's model, weights and gradients */
struct side {
	struct sl_backend *be;
	struct sl_model *m;
	void **w, **g;
};

struct env {
	struct sl_layout lay;
	struct side s[3];	/* 0 cpu, 1 cuda, 2 cpu-bf16 */
};

static const void *src_weights(void *ctx, int u)
{
	return ((struct side *)ctx)->w[u];
}

static void *src_grads(void *ctx, int u)
{
	return ((struct side *)ctx)->g[u];
}

/* host floats -> a buffer of the backend's compute type */
static void up(struct sl_backend *be, void *dst, const float *h, size_t n)
{
	if (be->elt == 4) {
		be->upload(be, dst, h, n * 4);
	} else {
		uint16_t *t = malloc(n * 2 + 2);

		for (size_t i = 0; i < n; i++)
			t[i] = f2bf(h[i]);
		be->upload(be, dst, t, n * 2);
		free(t);
	}
}

static void down(struct sl_backend *be, float *h, const void *src, size_t n)
{
	if (be->elt == 4) {
		be->download(be, h, src, n * 4);
	} else {
		uint16_t *t = malloc(n * 2 + 2);

		be->download(be, t, src, n * 2);
		for (size_t i = 0; i < n; i++)
			h[i] = bf2f(t[i]);
		free(t);
	}
}

static int moe_experts;	/* > 0: layer 0 is a mixture of this many experts */

static void fill_config(struct sl_model_config *mc, int V, int H, int nh, int nkv, int hd, int I,
			bool bias)
{
	memset(mc, 0, sizeof(*mc));
	strcpy(mc->model_type, "qwen3");
	mc->vocab = V;
	mc->hidden = H;
	mc->n_layers = 2;
	mc->n_heads = nh;
	mc->n_kv_heads = nkv;
	mc->head_dim = hd;
	mc->intermediate = I;
	mc->max_position = 4096;
	mc->rms_eps = 1e-6;
	mc->rope_theta = 1e6;
	mc->attention_bias = bias;
	mc->initializer_range = 0.02;
	mc->pad_token_id = mc->bos_token_id = mc->eos_token_id = -1;
	mc->num_labels = 1;
	mc->layer_kind = calloc(mc->n_layers, sizeof(*mc->layer_kind));
	mc->mlp_kind = calloc(mc->n_layers, sizeof(*mc->mlp_kind));
	if (moe_experts) {
		/*
		 * Layer 0 sparse.  Every token takes every expert (k = E): a top-k choice near a tie
		 * may differ between bf16 and fp32 and move a token to another expert, which no
		 * tolerance covers; test_cuda_ops checks k < E op by op on identical inputs.
		 */
		strcpy(mc->model_type, "qwen3_moe");
		mc->mlp_kind[0] = SL_MLP_MOE;
		mc->n_experts = mc->top_k = moe_experts;
		mc->moe_intermediate = I / 2;
		mc->norm_topk_prob = true;
		mc->router_aux_loss_coef = 0.05;
	}
}

/* one config, one padded micro-batch: loss and every gradient, cuda vs cpu */
static void run(const char *name, int V, int H, int nh, int nkv, int hd, int I, bool bias,
		bool ckpt, int B, int L)
{
	struct sl_model_config mc;
	struct env e;
	struct sl_backend *bes[3] = { sl_backend_cpu_create(), sl_backend_cuda_create(0),
				      cpu_bf16_create() };
	int T = B * L, rc;
	int32_t *ids = malloc(T * 4), lens[16], last[16];
	float labels[16], scores[3][16];
	double loss[3];
	float *params;
	size_t *ubase;

	fill_config(&mc, V, H, nh, nkv, hd, I, bias);
	rc = sl_model_layout(&mc, 0, &e.lay);
	CHECK(rc == 0, "layout %d", rc);
	ubase = calloc(e.lay.n_units, sizeof(*ubase));
	for (int u = 1; u < e.lay.n_units; u++)
		ubase[u] = ubase[u - 1] + e.lay.unit_numel[u - 1];
	params = calloc(e.lay.total_numel, sizeof(float));
	for (int i = 0; i < e.lay.n_tensors; i++) {
		const struct sl_tensor_info *t = &e.lay.t[i];
		double sd = t->ndim == 2 ? (t->unit == 0 ? 1 : 1 / sqrt((double)t->shape[1])) : 0.2;

		for (size_t k = 0; k < t->numel; k++) {
			double v = (t->init == SL_INIT_ONES ? 1 : 0) + sd * rng_normal();

			params[ubase[t->unit] + t->offset + k] = round_bf((float)v);
		}
	}
	for (int b = 0; b < B; b++) {
		lens[b] = b == 0 ? L : b == B - 1 ? 1 : 1 + (int)(rng_next() % L);
		last[b] = b * L + lens[b] - 1;
		labels[b] = (float)rng_unif();
	}
	for (int t = 0; t < T; t++)
		ids[t] = (int32_t)(rng_next() % V);

	for (int s = 0; s < 3; s++) {
		struct side *sd = &e.s[s];
		struct sl_backend *be = bes[s];
		int32_t *dids, *dlens, *dlast;
		float *dlab;

		CHECK(be != NULL, "backend %d", s);
		if (!be)
			return;
		sd->be = be;
		sd->w = calloc(e.lay.n_units, sizeof(void *));
		sd->g = calloc(e.lay.n_units, sizeof(void *));
		for (int u = 0; u < e.lay.n_units; u++) {
			sd->w[u] = be->alloc(be, e.lay.unit_numel[u] * be->elt);
			sd->g[u] = be->alloc(be, e.lay.unit_numel[u] * be->elt);
			up(be, sd->w[u], params + ubase[u], e.lay.unit_numel[u]);
		}
		sd->m = sl_model_create(&mc, &e.lay, be, T, B, ckpt);
		CHECK(sd->m != NULL, "model create");
		dids = be->alloc(be, T * 4);
		dlens = be->alloc(be, B * 4);
		dlast = be->alloc(be, B * 4);
		dlab = be->alloc(be, B * 4);
		be->upload(be, dids, ids, T * 4);
		be->upload(be, dlens, lens, B * 4);
		be->upload(be, dlast, last, B * 4);
		be->upload(be, dlab, labels, B * 4);
		struct sl_batch_dev bd = { .B = B, .L = L, .ids = dids, .lens = dlens,
					   .last = dlast, .labels = dlab, .h_lens = lens };
		struct sl_unit_source src = { .ctx = sd, .weights = src_weights,
					      .grads = src_grads };

		rc = sl_model_train_step(sd->m, &src, &bd, 1.0f / B, &loss[s], scores[s]);
		CHECK(rc == 0, "train step %d", rc);
		be->free(be, dids);
		be->free(be, dlens);
		be->free(be, dlast);
		be->free(be, dlab);
	}

	/* loss and logits */
	double lrel = fabs(loss[1] - loss[0]) / fabs(loss[0]);
	CHECK(lrel <= 1e-2, "%s: loss cuda %.6g cpu %.6g", name, loss[1], loss[0]);
	printf("%-34s %-26s %10.3e %10.3e  %s\n", name, "loss", loss[0], lrel,
	       lrel <= 1e-2 ? "ok" : "FAIL");
	for (int b = 0; b < B; b++)
		CHECK_CLOSE(scores[1][b], scores[0][b], 2e-2, 2e-2);

	/* gradients: the whole vector, then tensor by tensor against the bf16 noise floor */
	double worst = 0, gnum = 0, gden = 0, genm = 0;
	const char *worst_name = "";
	float *gr[3];

	for (int s = 0; s < 3; s++) {
		gr[s] = malloc(e.lay.total_numel * 4);
		for (int u = 0; u < e.lay.n_units; u++)
			down(e.s[s].be, gr[s] + ubase[u], e.s[s].g[u], e.lay.unit_numel[u]);
	}
	/* the whole gradient's mean square per element: a tensor of n elements typically carries
	 * n times it */
	double ms = 0;

	for (size_t k = 0; k < e.lay.total_numel; k++)
		ms += (double)gr[0][k] * gr[0][k];
	ms /= (double)e.lay.total_numel;
	for (int i = 0; i < e.lay.n_tensors; i++) {
		const struct sl_tensor_info *t = &e.lay.t[i];
		size_t o = ubase[t->unit] + t->offset;
		double num = 0, den = 0, enm = 0, rel, erel, tol, share;
		bool fin = true;

		for (size_t k = 0; k < t->numel; k++) {
			double c = gr[0][o + k], d = (double)gr[1][o + k] - c;
			double de = (double)gr[2][o + k] - c;

			fin = fin && isfinite(gr[1][o + k]);
			num += d * d;
			den += c * c;
			enm += de * de;
		}
		gnum += num;
		gden += den;
		genm += enm;
		rel = den > 0 ? sqrt(num / den) : sqrt(num);
		erel = den > 0 ? sqrt(enm / den) : sqrt(enm);
		/* a tensor whose gradient is far below its share (a sum of cancelling terms: the
		 * k_proj bias under q/k norms) is held to 3% of that share instead of its own size
		 * (its relative error reached 3.3x the cpu-bf16 one in 1 of 3 runs on the H200) */
		share = sqrt(ms * (double)t->numel / fmax(den, 1e-300));
		tol = fmax(3e-2 * fmax(1.0, share), 3 * erel);
		CHECK(fin && rel <= tol, "%s: gradient of %s: rel %.3g, bound %.3g (cpu-bf16 %.3g)",
		      name, t->name, rel, tol, erel);
		if (!fin || rel / tol > worst) {
			worst = fin ? rel / tol : INFINITY;
			worst_name = t->name;
		}
	}
	/* the whole gradient, like each tensor: 3e-2, or three times what bf16 activations alone
	 * cost (the head_dim-8 model reached 4.7e-2 against 3e-2 in one H200 run, 2026-11-30, with
	 * every tensor inside its own bound) */
	double grel = sqrt(gnum / gden), gerel = sqrt(genm / gden);
	double gtol = fmax(3e-2, 3 * gerel);

	CHECK(grel <= gtol, "%s: whole gradient: rel %.3g, bound %.3g (cpu-bf16 %.3g)", name, grel,
	      gtol, gerel);
	printf("%-34s %-26s %10.3e %10.3e  %s\n", name, "whole gradient (cpu-bf16)", gerel, grel,
	       grel <= gtol ? "ok" : "FAIL");
	printf("%-34s %-26s %10s %10.3f  %s\n", name, "worst tensor err/bound", "", worst,
	       worst <= 1 ? "ok" : "FAIL");
	printf("%-34s   (%s)\n", "", worst_name);
	for (int s = 0; s < 3; s++)
		free(gr[s]);

	for (int s = 0; s < 3; s++) {
		struct side *sd = &e.s[s];

		sl_model_destroy(sd->m);
		for (int u = 0; u < e.lay.n_units; u++) {
			sd->be->free(sd->be, sd->w[u]);
			sd->be->free(sd->be, sd->g[u]);
		}
		free(sd->w);
		free(sd->g);
		if (s == 1)
			printf("%-34s %-26s %10.1f MB\n", "", "cuda peak", 
			       sl_backend_cuda_peak_bytes(sd->be) / 1e6);
		sd->be->destroy(sd->be);
	}
	free(params);
	free(ubase);
	free(ids);
	sl_layout_free(&e.lay);
	free(mc.layer_kind);
	free(mc.mlp_kind);
}

int main(int argc, char **argv)
{
	uint64_t seed = argc > 1 ? strtoull(argv[1], NULL, 0) :
				   (uint64_t)time(NULL) ^ ((uint64_t)clock() << 32);

	rng_state = seed ? seed : 1;
	printf("test_cuda_model: seed %llu\n", (unsigned long long)seed);
	printf("%-34s %-26s %10s %10s\n", "model", "what", "cpu", "rel.err");
	/*   name                                  V   H    nh nkv hd  I    bias  ckpt   B  L */
	run("gradcheck shape hd 8",               23, 12,   4, 2, 8,   20,  false, false, 4, 8);
	run("gradcheck shape + bias",             23, 12,   4, 2, 8,   20,  true,  false, 3, 9);
	run("demo shape hd 16 + ckpt",            512, 64,  4, 2, 16,  128, false, true,  3, 21);
	run("hd 64, gqa 4:1",                     300, 256, 8, 2, 64,  512, false, false, 3, 40);
	run("hd 128 + bias",                      300, 256, 4, 2, 128, 384, true,  false, 2, 70);
	moe_experts = 4;
	run("moe 4 experts, k = E, aux",          23, 12,   4, 2, 8,   20,  false, false, 4, 8);
	run("moe 4 experts + ckpt",               300, 256, 8, 2, 64,  512, false, true,  3, 40);
	moe_experts = 0;
	return test_exit("test_cuda_model");
}
