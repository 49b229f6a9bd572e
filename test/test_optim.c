/*
 * test_optim: the LR schedules, the clip multiplier and AdamW against numbers worked out by hand
 * (in the comments and as the arithmetic below), and the cpu backend's adamw_f32 and bce_fwd_bwd
 * ops against the same hand values.
 */
#include <stdint.h>

#include "backend.h"
#include "optim.h"
#include "shard.h"
#include "testutil.h"

static void test_schedules(void)
{
	/*
	 * cosine, lr 1e-3, min 1e-4, warmup 1, 3 steps:
	 *   s=1: warmup, 1e-3 * 1/1                                 = 1e-3
	 *   s=2: p = (2-1)/(3-1) = 0.5, cos(pi/2) = 0:
	 *        1e-4 + 9e-4 * 0.5 * (1 + 0)                        = 5.5e-4
	 *   s=3: p = 1, cos(pi) = -1: 1e-4 + 9e-4 * 0.5 * 0          = 1e-4
	 */
	CHECK_CLOSE(sl_lr_at(SL_SCHED_COSINE, 1e-3, 1e-4, 1, 1, 3), 1e-3, 1e-12, 0);
	CHECK_CLOSE(sl_lr_at(SL_SCHED_COSINE, 1e-3, 1e-4, 1, 2, 3), 5.5e-4, 1e-12, 0);
	CHECK_CLOSE(sl_lr_at(SL_SCHED_COSINE, 1e-3, 1e-4, 1, 3, 3), 1e-4, 1e-12, 0);

	/*
	 * cosine, lr 1, min 0, warmup 0, 4 steps: p = s/4
	 *   s=1: 0.5 (1 + cos(pi/4))  = 0.5 (1 + 0.70710678118654752) = 0.85355339059327376
	 *   s=2: 0.5 (1 + cos(pi/2))  = 0.5
	 *   s=3: 0.5 (1 + cos(3pi/4)) = 0.5 (1 - 0.70710678118654752) = 0.14644660940672624
	 *   s=4: 0
	 */
	CHECK_CLOSE(sl_lr_at(SL_SCHED_COSINE, 1, 0, 0, 1, 4), 0.85355339059327376, 1e-12, 0);
	CHECK_CLOSE(sl_lr_at(SL_SCHED_COSINE, 1, 0, 0, 2, 4), 0.5, 1e-12, 0);
	CHECK_CLOSE(sl_lr_at(SL_SCHED_COSINE, 1, 0, 0, 3, 4), 0.14644660940672624, 1e-12, 0);
	CHECK_CLOSE(sl_lr_at(SL_SCHED_COSINE, 1, 0, 0, 4, 4), 0, 0, 1e-15);

	/* warmup ramp lr*s/warmup: lr 2e-5, warmup 4: 5e-6, 1e-5, 1.5e-5, 2e-5 (whatever schedule) */
	CHECK_CLOSE(sl_lr_at(SL_SCHED_COSINE, 2e-5, 0, 4, 1, 100), 5e-6, 1e-12, 0);
	CHECK_CLOSE(sl_lr_at(SL_SCHED_LINEAR, 2e-5, 0, 4, 2, 100), 1e-5, 1e-12, 0);
	CHECK_CLOSE(sl_lr_at(SL_SCHED_CONSTANT, 2e-5, 0, 4, 3, 100), 1.5e-5, 1e-12, 0);
	CHECK_CLOSE(sl_lr_at(SL_SCHED_COSINE, 2e-5, 0, 4, 4, 100), 2e-5, 1e-12, 0);
	/* cosine just after warmup: p = 1/96, 0.5 (1 + cos(pi/96)) = 0.99973229..., times 2e-5 */
	CHECK_CLOSE(sl_lr_at(SL_SCHED_COSINE, 2e-5, 0, 4, 5, 100), 2e-5 * 0.99973229, 1e-7, 0);

	/*
	 * linear, lr 1e-3, min 1e-4, warmup 2, 6 steps: p = (s-2)/4, lr + (min - lr) p
	 *   s=1: 5e-4 (warmup)  s=3: 1e-3 - 9e-4/4 = 7.75e-4  s=4: 5.5e-4  s=5: 3.25e-4  s=6: 1e-4
	 */
	CHECK_CLOSE(sl_lr_at(SL_SCHED_LINEAR, 1e-3, 1e-4, 2, 1, 6), 5e-4, 1e-12, 0);
	CHECK_CLOSE(sl_lr_at(SL_SCHED_LINEAR, 1e-3, 1e-4, 2, 3, 6), 7.75e-4, 1e-12, 0);
	CHECK_CLOSE(sl_lr_at(SL_SCHED_LINEAR, 1e-3, 1e-4, 2, 4, 6), 5.5e-4, 1e-12, 0);
	CHECK_CLOSE(sl_lr_at(SL_SCHED_LINEAR, 1e-3, 1e-4, 2, 5, 6), 3.25e-4, 1e-12, 0);
	CHECK_CLOSE(sl_lr_at(SL_SCHED_LINEAR, 1e-3, 1e-4, 2, 6, 6), 1e-4, 1e-12, 0);

	/* constant: lr after warmup, whatever min_lr says */
	CHECK_CLOSE(sl_lr_at(SL_SCHED_CONSTANT, 3e-4, 1e-5, 0, 1, 10), 3e-4, 1e-12, 0);
	CHECK_CLOSE(sl_lr_at(SL_SCHED_CONSTANT, 3e-4, 1e-5, 2, 10, 10), 3e-4, 1e-12, 0);

	/* steps == warmup: the last step is the top of the ramp, p never leaves [0,1] */
	CHECK_CLOSE(sl_lr_at(SL_SCHED_COSINE, 1e-3, 1e-4, 5, 5, 5), 1e-3, 1e-12, 0);
	CHECK_CLOSE(sl_lr_at(SL_SCHED_COSINE, 1e-3, 1e-4, 5, 6, 5), 1e-4, 1e-12, 0);
	CHECK_CLOSE(sl_lr_at(SL_SCHED_LINEAR, 1e-3, 1e-4, 5, 6, 5), 1e-4, 1e-12, 0);
	/* past the last step (a resume with fewer steps): held at min_lr, never below */
	CHECK_CLOSE(sl_lr_at(SL_SCHED_COSINE, 1e-3, 1e-4, 1, 7, 3), 1e-4, 1e-12, 0);
	CHECK_CLOSE(sl_lr_at(SL_SCHED_LINEAR, 1e-3, 1e-4, 1, 7, 3), 1e-4, 1e-12, 0);
	/* a single step without warmup: p = 1/1 */
	CHECK_CLOSE(sl_lr_at(SL_SCHED_COSINE, 1e-3, 0, 0, 1, 1), 0, 0, 1e-18);
}

static void test_clip(void)
{
	/* torch: clip / (norm + 1e-6) when that is < 1 */
	CHECK_CLOSE(sl_clip_scale(4.0, 1.0), 1.0 / 4.000001, 1e-12, 0);	/* 0.24999993750 */
	CHECK_CLOSE(sl_clip_scale(4.0, 1.0), 0.2499999375, 1e-9, 0);
	CHECK(sl_clip_scale(0.5, 1.0) == 1.0, "norm below clip");
	CHECK(sl_clip_scale(0.0, 1.0) == 1.0, "zero norm");
	/* norm == clip: 1/(1+1e-6) = 0.999999000001, a hair below 1 as in torch */
	CHECK_CLOSE(sl_clip_scale(1.0, 1.0), 0.999999000001, 1e-12, 0);
	CHECK(sl_clip_scale(1e9, 0.0) == 1.0, "clip 0 is off");		/* clip off */
	CHECK(sl_clip_scale(1e9, -1.0) == 1.0, "negative clip is off");
	CHECK_CLOSE(sl_clip_scale(INFINITY, 1.0), 0, 0, 0);
}

/*
 * AdamW by hand: lr 0.1, betas (0.9, 0.999), eps 1e-8, weight decay 0.01, 3 elements,
 * p0 = [1, -2, 0.5], g1 = [0.5, -1, 0], g2 = [0.25, 1, 2].
 *
 * step 1: bc1 = 1 - 0.9 = 0.1, bc2 = 1 - 0.999 = 0.001
 *   decay:  p *= 1 - 0.1*0.01 = 0.999          -> [0.999, -1.998, 0.4995]
 *   m = 0.1 g1 = [0.05, -0.1, 0];   v = 0.001 g1^2 = [0.00025, 0.001, 0]
 *   m/bc1 = [0.5, -1, 0];  sqrt(v/bc2) = [0.5, 1, 0]
 *   p -= 0.1 * [0.5/(0.5+1e-8), -1/(1+1e-8), 0/(0+1e-8)]
 *      = [0.999 - 0.099999998, -1.998 + 0.099999999, 0.4995]
 *      = [0.899000002, -1.898000001, 0.4995]
 * step 2: bc1 = 1 - 0.81 = 0.19, bc2 = 1 - 0.998001 = 0.001999
 *   decay:  p *= 0.999 -> [0.898101001998, -1.896101999999, 0.4990005]
 *   m = 0.9 m + 0.1 g2 = [0.045 + 0.025, -0.09 + 0.1, 0 + 0.2] = [0.07, 0.01, 0.2]
 *   v = 0.999 v + 0.001 g2^2 = [0.00024975 + 0.0000625, 0.000999 + 0.001, 0 + 0.004]
 *     = [0.00031225, 0.001999, 0.004]
 *   m/bc1 = [0.36842105263, 0.05263157895, 1.05263157895]
 *   sqrt(v/bc2) = [sqrt(0.15620310155), sqrt(1), sqrt(2.00100050025)] = [0.39522538, 1, 1.41456725]
 *   p -= 0.1 * [0.93217976, 0.05263157895, 0.74413682]
 *      = [0.80488304, -1.90136516, 0.42458682]
 */
static const double P0[3] = { 1.0, -2.0, 0.5 };
static const double G1[3] = { 0.5, -1.0, 0.0 };
static const double G2[3] = { 0.25, 1.0, 2.0 };
static const double P1_HAND[3] = { 0.899000002, -1.898000001, 0.4995 };
static const double P2_HAND[3] = { 0.80488304, -1.90136516, 0.42458682 };
static const double M2_HAND[3] = { 0.07, 0.01, 0.2 };
static const double V2_HAND[3] = { 0.00031225, 0.001999, 0.004 };

/* the same arithmetic, written out per element so that nothing rounds to 8 digits */
static double hand_p2(int i)
{
	double p1 = P0[i] * 0.999 - 0.1 * (G1[i] == 0 ? 0 : G1[i] / (fabs(G1[i]) + 1e-8));
	double m = 0.9 * (0.1 * G1[i]) + 0.1 * G2[i];
	double v = 0.999 * (0.001 * G1[i] * G1[i]) + 0.001 * G2[i] * G2[i];

	return p1 * 0.999 - 0.1 * (m / 0.19) / (sqrt(v / 0.001999) + 1e-8);
}

static void test_adamw_ref(void)
{
	double p[3], m[3] = { 0 }, v[3] = { 0 };
	int i;

	memcpy(p, P0, sizeof(p));
	sl_adamw_ref(p, m, v, G1, 3, 0.1, 0.9, 0.999, 1e-8, 0.01, 1);
	for (i = 0; i < 3; i++)
		CHECK_CLOSE(p[i], P1_HAND[i], 1e-12, 1e-12);
	sl_adamw_ref(p, m, v, G2, 3, 0.1, 0.9, 0.999, 1e-8, 0.01, 2);
	for (i = 0; i < 3; i++) {
		CHECK_CLOSE(p[i], P2_HAND[i], 0, 1e-8);
		CHECK_CLOSE(p[i], hand_p2(i), 1e-12, 1e-14);
		CHECK_CLOSE(m[i], M2_HAND[i], 1e-12, 1e-15);
		CHECK_CLOSE(v[i], V2_HAND[i], 1e-12, 1e-15);
	}

	/* no decay, zero gradient: nothing moves */
	p[0] = 3.0;
	m[0] = v[0] = 0;
	sl_adamw_ref(p, m, v, (const double[]){ 0.0 }, 1, 0.1, 0.9, 0.999, 1e-8, 0.0, 1);
	CHECK(p[0] == 3.0, "p = %g", p[0]);
}

/* The cpu backend's adamw_f32 against the hand values (fp32: ~1e-7 relative). */
static void test_adamw_cpu(struct sl_backend *be)
{
	float p[3], m[3] = { 0 }, v[3] = { 0 }, g[3];
	struct sl_adamw_args a = {
		.lr = 0.1f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.01f,
	};
	float *dp, *dm, *dv, *dg;
	int i;

	dp = be->alloc(be, sizeof(p));
	dm = be->alloc(be, sizeof(m));
	dv = be->alloc(be, sizeof(v));
	dg = be->alloc(be, sizeof(g));
	for (i = 0; i < 3; i++)
		p[i] = (float)P0[i];
	be->upload(be, dp, p, sizeof(p));
	be->upload(be, dm, m, sizeof(m));
	be->upload(be, dv, v, sizeof(v));

	/* step 1 with grad_scale 0.5 applied to a doubled gradient: the same g1 */
	for (i = 0; i < 3; i++)
		g[i] = (float)(2 * G1[i]);
	be->upload(be, dg, g, sizeof(g));
	a.bc1 = 1.0f - 0.9f;
	a.bc2 = 1.0f - 0.999f;
	a.grad_scale = 0.5f;
	be->adamw_f32(be, dp, dm, dv, dg, NULL, 3, &a);
	be->download(be, p, dp, sizeof(p));
	for (i = 0; i < 3; i++)
		CHECK_CLOSE(p[i], P1_HAND[i], 1e-6, 1e-7);

	for (i = 0; i < 3; i++)
		g[i] = (float)G2[i];
	be->upload(be, dg, g, sizeof(g));
	a.bc1 = 1.0f - 0.9f * 0.9f;
	a.bc2 = 1.0f - 0.999f * 0.999f;
	a.grad_scale = 1.0f;
	be->adamw_f32(be, dp, dm, dv, dg, NULL, 3, &a);
	be->download(be, p, dp, sizeof(p));
	be->download(be, m, dm, sizeof(m));
	be->download(be, v, dv, sizeof(v));
	/*
	 * fp32 betas: 1 - 0.999f = 0.000999987, 1.3e-5 relative off 0.001, so v is that far from
	 * the hand value; bc2 has the same error and cancels it in p, up to fp32 rounding
	 */
	for (i = 0; i < 3; i++) {
		CHECK_CLOSE(p[i], P2_HAND[i], 2e-5, 1e-6);
		CHECK_CLOSE(m[i], M2_HAND[i], 1e-6, 1e-8);
		CHECK_CLOSE(v[i], V2_HAND[i], 3e-5, 1e-10);
	}

	be->free(be, dp);
	be->free(be, dm);
	be->free(be, dv);
	be->free(be, dg);
}

/*
 * bce(x, y) = max(x,0) - x y + log(1 + e^-|x|), d/dx = sigmoid(x) - y:
 *   (0, 0.3):   log 2 = 0.69314718056, d = 0.5 - 0.3 = 0.2
 *   (50, 1):    50 - 50 + log(1 + e^-50) = 1.92874985e-22, d = sigmoid(50) - 1 = -1.9e-22
 *   (-50, 1):   0 + 50 + log(1 + e^-50) = 50,  d = 1.9e-22 - 1 = -1
 *   (2, 0.75):  2 - 1.5 + log(1 + e^-2) = 0.5 + 0.12692801 = 0.62692801,
 *               d = 0.88079708 - 0.75 = 0.13079708
 * with scale 0.5 the gradients halve.
 */
static void test_bce_cpu(struct sl_backend *be)
{
	float logits[4] = { 0.0f, 50.0f, -50.0f, 2.0f };
	float labels[4] = { 0.3f, 1.0f, 1.0f, 0.75f };
	double hand_loss[4] = { 0.69314718056, 1.92874985e-22, 50.0, 0.62692801 };
	double hand_d[4] = { 0.2, -1.92874985e-22, -1.0, 0.13079708 };
	float d[4];
	double sum, hand_sum = 0;
	void *dlog, *dl, *dlab;
	double *dsum;
	int i;

	dlog = be->alloc(be, sizeof(logits));
	dl = be->alloc(be, sizeof(d));
	dlab = be->alloc(be, sizeof(labels));
	dsum = be->alloc(be, sizeof(double));
	be->upload(be, dlog, logits, sizeof(logits));
	be->upload(be, dlab, labels, sizeof(labels));

	/* one at a time, so each loss is seen on its own (50 would swamp 1.9e-22 in a sum) */
	for (i = 0; i < 4; i++) {
		be->bce_fwd_bwd(be, dsum, (float *)dl + i, (float *)dlog + i, (float *)dlab + i, 1,
				0.5f);
		be->download(be, &sum, dsum, sizeof(sum));
		be->download(be, d, dl, sizeof(d));
		CHECK(isfinite(sum) && isfinite(d[i]), "record %d: loss %g, d %g", i, sum, d[i]);
		/*
		 * fp32 labels: 0.3f and 0.75f are off by <3e-8, logits exact.  bce(50, 1) must keep
		 * its tiny value (a stable formula, not log(sigmoid)), so no absolute slack there.
		 */
		if (i == 1)
			CHECK_CLOSE(sum, hand_loss[i], 1e-4, 0);
		else
			CHECK_CLOSE(sum, hand_loss[i], 1e-6, 1e-7);
		CHECK_CLOSE(d[i], 0.5 * hand_d[i], 1e-6, 1e-7);
		hand_sum += hand_loss[i];
	}

	/* all four: the sum */
	be->bce_fwd_bwd(be, dsum, dl, dlog, dlab, 4, 0.25f);
	be->download(be, &sum, dsum, sizeof(sum));
	be->download(be, d, dl, sizeof(d));
	CHECK_CLOSE(sum, hand_sum, 1e-6, 1e-7);
	for (i = 0; i < 4; i++)
		CHECK_CLOSE(d[i], 0.25 * hand_d[i], 1e-6, 1e-7);

	be->free(be, dlog);
	be->free(be, dl);
	be->free(be, dlab);
	be->free(be, dsum);
}

/* sl_shard_update_runs on a layout made by hand: which tensors of a unit make one update */
struct run_log {
	int n;
	size_t k[8], len[8];
	double lr[8], wd[8];
};

static void log_run(void *arg, size_t k, size_t n, const struct sl_adamw_args *a)
{
	struct run_log *r = arg;

	if (r->n < 8) {
		r->k[r->n] = k;
		r->len[r->n] = n;
		r->lr[r->n] = a->lr;
		r->wd[r->n] = a->weight_decay;
	}
	r->n++;
}

static void test_update_runs(void)
{
	/*
	 * unit 0: A [0, 10) decay, B [10, 15) decay, C [15, 18) head decay, D [18, 22) head,
	 * E [22, 28) head, F [30, 34) head (after a gap); unit 1: G [0, 8) decay.
	 * The shard [12, 32) of unit 0 (off 12, count 20) holds B's last 3, C, D, E, F's first 2:
	 *   B: [12, 15) -> k 0, n 3;  C: a new run (only the head flag differs) k 3, n 3;
	 *   D: a new run (only the decay flag differs) k 6, n 4;  E: back to back with D, same
	 *   flags: k 6, n 10;  F: [30, 32) -> k 18: not at 16, so a run of its own, n 2.
	 *   G is another unit's.
	 * With lr 2, head_lr_mult 3, weight_decay 0.5: B 2 / 0.5, C 6 / 0.5, D+E and F 6 / 0.
	 */
	struct sl_tensor_info t[7] = {
		{ .unit = 0, .offset = 0, .numel = 10, .decay = true },
		{ .unit = 0, .offset = 10, .numel = 5, .decay = true },
		{ .unit = 0, .offset = 15, .numel = 3, .decay = true, .head = true },
		{ .unit = 0, .offset = 18, .numel = 4, .head = true },
		{ .unit = 0, .offset = 22, .numel = 6, .head = true },
		{ .unit = 0, .offset = 30, .numel = 4, .head = true },
		{ .unit = 1, .offset = 0, .numel = 8, .decay = true },
	};
	struct sl_layout lay = { .n_tensors = 7, .t = t, .n_units = 2 };
	struct sl_shard_unit u = { .off = 12, .count = 20 };
	const struct sl_optim_hparams h = { .lr = 2, .head_lr_mult = 3, .weight_decay = 0.5 };
	struct sl_adamw_args a = { 0 };
	struct run_log r = { 0 };
	const size_t ek[4] = { 0, 3, 6, 18 }, en[4] = { 3, 3, 10, 2 };
	const double elr[4] = { 2, 6, 6, 6 }, ewd[4] = { 0.5, 0.5, 0, 0 };

	sl_shard_update_runs(&lay, &u, 0, &h, &a, log_run, &r);
	CHECK(r.n == 4, "update runs: %d, expected 4", r.n);
	for (int i = 0; i < 4 && i < r.n; i++)
		CHECK(r.k[i] == ek[i] && r.len[i] == en[i] && r.lr[i] == elr[i] &&
		      r.wd[i] == ewd[i],
		      "update run %d: k %zu n %zu lr %g wd %g, expected k %zu n %zu lr %g wd %g", i,
		      r.k[i], r.len[i], r.lr[i], r.wd[i], ek[i], en[i], elr[i], ewd[i]);

	/* unit 1 whole (off 0, count 8): G alone; a shard past every tensor: no run */
	r.n = 0;
	u = (struct sl_shard_unit){ .off = 0, .count = 8 };
	sl_shard_update_runs(&lay, &u, 1, &h, &a, log_run, &r);
	CHECK(r.n == 1 && r.k[0] == 0 && r.len[0] == 8 && r.lr[0] == 2 && r.wd[0] == 0.5,
	      "update runs of unit 1: %d", r.n);
	r.n = 0;
	u = (struct sl_shard_unit){ .off = 34, .count = 4 };
	sl_shard_update_runs(&lay, &u, 0, &h, &a, log_run, &r);
	CHECK(r.n == 0, "update runs past the tensors: %d, expected 0", r.n);
}

int main(void)
{
	struct sl_backend *be;

	test_update_runs();

	test_schedules();
	test_clip();
	test_adamw_ref();

	/* the cpu backend is written concurrently; its checks fail until it is complete */
	be = sl_backend_cpu_create();
	CHECK(be != NULL, "sl_backend_cpu_create failed");
	if (be) {
		CHECK(be->adamw_f32 != NULL, "cpu backend has no adamw_f32");
		CHECK(be->bce_fwd_bwd != NULL, "cpu backend has no bce_fwd_bwd");
		if (be->adamw_f32)
			test_adamw_cpu(be);
		if (be->bce_fwd_bwd)
			test_bce_cpu(be);
		be->destroy(be);
	}
	return test_exit("test_optim");
}
