/*
 * ckpt_geom: the shard geometry of a checkpoint: a tensor's element range as HDF5 rectangles,
 * this rank's range of each unit, and the checks of a geometry against the world and the layout.
 */
#include "ckpt_impl.h"

#include <string.h>

#include "log.h"

/* ---- geometry -------------------------------------------------------------------------------- */

int ckpt_split_range(const struct sl_tensor_info *t, size_t a, size_t b, struct piece *p)
{
	size_t cols, r0, c0, r1, c1;
	int k = 0;

	if (t->ndim == 1) {
		p[0] = (struct piece){ { a, 0 }, { b - a, 0 }, a, b - a };
		return 1;
	}
	cols = t->shape[1];
	r0 = a / cols, c0 = a % cols;
	r1 = b / cols, c1 = b % cols;
	if (r0 == r1) {
		p[0] = (struct piece){ { r0, c0 }, { 1, c1 - c0 }, a, b - a };
		return 1;
	}
	if (c0) {
		p[k++] = (struct piece){ { r0, c0 }, { 1, cols - c0 }, a, cols - c0 };
		r0++;
	}
	if (r1 > r0)
		p[k++] = (struct piece){ { r0, 0 }, { r1 - r0, cols }, r0 * cols, (r1 - r0) * cols };
	if (c1)
		p[k++] = (struct piece){ { r1, 0 }, { 1, c1 }, r1 * cols, c1 };
	return k;
}

/*
 * The part of tensor @t inside the unit range [lo, hi): tensor-flat [*a, *b).  false if none.
 */
bool ckpt_overlap(const struct sl_tensor_info *t, size_t lo, size_t hi, size_t *a, size_t *b)
{
	size_t s = t->offset > lo ? t->offset : lo;
	size_t e = t->offset + t->numel < hi ? t->offset + t->numel : hi;

	if (s >= e)
		return false;
	*a = s - t->offset;
	*b = e - t->offset;
	return true;
}

/* This rank's elements of unit u: [*a, *a + *n) of the layout's unit (ckpt.h) */
void ckpt_range_of(const struct sl_ckpt_geom *g, int u, size_t *a, size_t *n)
{
	size_t numel = g->lay->unit_numel[u];

	if (g->start && g->count) {
		*a = g->start[u];
		*n = g->count[u];
		return;
	}
	*a = (size_t)g->shard_rank * g->shard[u];
	*n = *a < numel ? numel - *a : 0;
	if (*n > g->shard[u])
		*n = g->shard[u];
}

int ckpt_check_geom(const struct sl_ckpt_geom *g, MPI_Comm comm)
{
	const struct sl_layout *lay = g->lay;
	int rank, size;

	MPI_Comm_rank(comm, &rank);
	MPI_Comm_size(comm, &size);
	if (g->rank != rank || g->world != size || g->shard_size < 1 || g->shard_size > size ||
	    g->shard_rank < 0 || g->shard_rank >= g->shard_size) {
		sl_error("ckpt: inconsistent shard geometry (rank %d/%d, world %d/%d, shard %d of %d)",
			 g->rank, rank, g->world, size, g->shard_rank, g->shard_size);
		return -1;
	}
	for (int u = 0; u < lay->n_units; u++) {
		size_t a, n;

		ckpt_range_of(g, u, &a, &n);
		if (g->shard[u] * (size_t)g->shard_size < lay->unit_numel[u] || n > g->shard[u] ||
		    a + n > lay->unit_numel[u]) {
			sl_error("ckpt: unit %d: %zu elements per rank x %d ranks < %zu elements, or "
				 "this rank's range [%zu, %zu) lies outside", u, g->shard[u],
				 g->shard_size, lay->unit_numel[u], a, a + n);
			return -1;
		}
	}
	for (int i = 0; i < lay->n_tensors; i++) {
		const struct sl_tensor_info *t = &lay->t[i];

		if (t->unit < 0 || t->unit >= lay->n_units ||
		    t->offset + t->numel > lay->unit_numel[t->unit] || strchr(t->name, '/')) {
			sl_error("ckpt: tensor %s lies outside its unit %d or has a '/' in its name",
				 t->name, t->unit);
			return -1;
		}
	}
	return 0;
}
