/*
 * backend_cpu_async: the cpu backend's copy thread and events (backend.h's asynchronous
 * transfers); used by backend_cpu.c only.
 */
#ifndef SL_BACKEND_CPU_ASYNC_H
#define SL_BACKEND_CPU_ASYNC_H

#include <stdbool.h>

#include "backend.h"

/* Install the asynchronous copy ops on @be (uses be->priv).  Aborts when out of memory. */
void sl_backend_cpu_async_init(struct sl_backend *be);
/*
 * adamw_f32 (!c) or adamw_c (c) issued on the side stream: queued (true) to run when an event
 * recorded after it is waited for; false outside side_begin .. side_end (run it now).
 */
bool sl_backend_cpu_side_defer(struct sl_backend *be, bool c, float *p, float *m, float *v,
			       const void *grad, void *w_out, size_t n,
			       const struct sl_adamw_args *a);
/* sumsq_f32 (!c) or sumsq_c (c) on the side stream: the same */
bool sl_backend_cpu_side_defer_sumsq(struct sl_backend *be, bool c, double *out, const void *g,
				     size_t n);
/* Finish the queued copies and stop the copy thread. */
void sl_backend_cpu_async_fini(struct sl_backend *be);

#endif
