/*
 * backend_cpu_async: the cpu backend's copy thread and events (backend.h's asynchronous
 * transfers); used by backend_cpu.c only.
 */
#ifndef SL_BACKEND_CPU_ASYNC_H
#define SL_BACKEND_CPU_ASYNC_H

#include "backend.h"

/* Install the asynchronous copy ops on @be (uses be->priv).  Aborts when out of memory. */
void sl_backend_cpu_async_init(struct sl_backend *be);
/* Finish the queued copies and stop the copy thread. */
void sl_backend_cpu_async_fini(struct sl_backend *be);

#endif
