/*
 * optim: learning-rate schedules, gradient clipping by global norm, and the AdamW step over a
 * model's units (the update itself is the backend's adamw_f32 op, so it runs where the shard lives).
 */
#ifndef SL_OPTIM_H
#define SL_OPTIM_H

#include "config.h"

/*
 * Learning rate at optimizer step @step (1-based) of @total, as DESIGN.md §3 says:
 * lr*s/warmup while s <= warmup; then constant lr; linear from lr to min_lr at the last step;
 * cosine min_lr + (lr - min_lr)/2 (1 + cos(pi p)), p = (s - warmup)/(total - warmup).
 */
double sl_lr_at(enum sl_schedule sched, double lr, double min_lr, int warmup, int step, int total);

/* Multiplier torch.nn.utils.clip_grad_norm_ applies: min(1, clip / (norm + 1e-6)); 1 if clip <= 0. */
double sl_clip_scale(double norm, double clip);

/* One AdamW update of n elements on the host, in double (a reference for tests). */
void sl_adamw_ref(double *p, double *m, double *v, const double *g, size_t n, double lr,
		  double beta1, double beta2, double eps, double wd, int step);

#endif
