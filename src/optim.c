/*
 * optim: the learning-rate schedule of DESIGN.md §3, torch's clip_grad_norm_ multiplier, and a
 * double-precision AdamW step that tests hold the backends' adamw_f32 op against.
 *
 * The update the trainer runs is the backend's adamw_f32 (it runs where the shard lives); this file
 * only decides the numbers that op is given.
 */
#include "optim.h"

#include <math.h>

double sl_lr_at(enum sl_schedule sched, double lr, double min_lr, int warmup, int step, int total)
{
	double p;

	if (warmup > 0 && step <= warmup)
		return lr * step / warmup;
	if (sched == SL_SCHED_CONSTANT)
		return lr;

	/*
	 * Progress through the decay.  When total <= warmup there is no decay phase, and steps past
	 * the last (a resumed run with fewer steps) must not extrapolate below min_lr: clamp to 1.
	 */
	if (total <= warmup)
		p = 1.0;
	else
		p = (double)(step - warmup) / (total - warmup);
	if (p < 0)
		p = 0;
	if (p > 1)
		p = 1;

	if (sched == SL_SCHED_LINEAR)
		return lr + (min_lr - lr) * p;
	return min_lr + (lr - min_lr) * 0.5 * (1.0 + cos(M_PI * p));
}

double sl_clip_scale(double norm, double clip)
{
	double s;

	if (clip <= 0)
		return 1.0;
	/* the 1e-6 is torch's: it keeps a zero norm finite and makes the scale a hair below 1 */
	s = clip / (norm + 1e-6);
	return s < 1.0 ? s : 1.0;
}

void sl_adamw_ref(double *p, double *m, double *v, const double *g, size_t n, double lr,
		  double beta1, double beta2, double eps, double wd, int step)
{
	double bc1 = 1.0 - pow(beta1, step);
	double bc2 = 1.0 - pow(beta2, step);
	size_t i;

	for (i = 0; i < n; i++) {
		/* decoupled decay first, on the weights before the moment step (torch's order) */
		p[i] -= lr * wd * p[i];
		m[i] = beta1 * m[i] + (1.0 - beta1) * g[i];
		v[i] = beta2 * v[i] + (1.0 - beta2) * g[i] * g[i];
		p[i] -= lr / bc1 * m[i] / (sqrt(v[i] / bc2) + eps);
	}
}
