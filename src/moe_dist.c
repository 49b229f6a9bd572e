/*
 * moe_dist: the expert group's all-to-all (moe_dist.h).  Row counts travel as ints
 * (MPI_Alltoall), rows as one MPI contiguous type per row size, so counts stay in rows (an int of
 * bytes would overflow for long micro-batches).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "dist.h"
#include "config.h"
#include "log.h"
#include "moe_dist.h"

static void counts(void *ctx, const int *send, int *recv, int n)
{
	struct sl_moe_dist *md = ctx;

	MPI_CHECK(MPI_Alltoall(send, n, MPI_INT, recv, n, MPI_INT, md->comm));
}

/* the rows live in the backend's memory: the group's communicator moves them (dist.h) */
static void rows(void *ctx, const void *send, const int *scount, void *recv, const int *rcount,
		 size_t row_bytes)
{
	struct sl_moe_dist *md = ctx;

	if (sl_comm_all_to_all_rows(&md->rows_comm, send, scount, recv, rcount, row_bytes))
		sl_dist_abort("the expert all-to-all failed");
}

int sl_moe_dist_create(struct sl_moe_dist *md, int rank, int world, int C, int Ep,
		       double capacity_factor, enum sl_comm_kind kind,
		       const struct sl_comm_copy *copy)
{
	const int dp = rank / C, c = rank % C;
	int rc;

	memset(md, 0, sizeof(*md));
	md->comm = MPI_COMM_NULL;
	md->group = dp / Ep;
	md->d = (struct sl_moe_dispatch){
		.rank = dp % Ep, .size = Ep, .capacity_factor = capacity_factor, .ctx = md,
		.counts = counts, .rows = rows,
	};
	if (Ep == 1)
		return 0;
	/* color: (expert group, context index); key: place in the group */
	rc = sl_comm_create(&md->rows_comm, MPI_COMM_WORLD, md->group * C + c, dp % Ep, kind,
			    copy);
	if (rc)
		return rc;
	md->have_rows_comm = true;
	md->comm = md->rows_comm.mpi;
	(void)world;
	return 0;
}

void sl_moe_dist_destroy(struct sl_moe_dist *md)
{
	if (md->have_rows_comm)
		sl_comm_destroy(&md->rows_comm);
	md->have_rows_comm = false;
	md->comm = MPI_COMM_NULL;
}

/* parallel.expert and capacity_factor against the model and the world (every rank: same verdict) */
static int check(const struct sl_config *c, const struct sl_model_config *mc, int world)
{
	const int C = c->parallel.context, Ep = c->parallel.expert;
	int n_moe = 0;

	for (int l = 0; l < mc->n_layers; l++)
		n_moe += sl_layer_is_moe(mc, l);
	if (!n_moe) {
		sl_error("%s: parallel.%s applies to mixture-of-experts models, and %s has no "
			 "MoE layer", c->source, Ep > 1 ? "expert" : "capacity_factor",
			 c->model.path);
		return -EINVAL;
	}
	if (mc->n_experts % Ep) {
		sl_error("%s: parallel.expert %d must divide the model's %d experts per layer",
			 c->source, Ep, mc->n_experts);
		return -EINVAL;
	}
	if (world % C || (world / C) % Ep) {
		sl_error("%s: parallel.expert %d must divide the %d data-parallel ranks (world %d "
			 "/ parallel.context %d)", c->source, Ep, world / C, world, C);
		return -EINVAL;
	}
	return 0;
}

int sl_moe_dist_expert_comm(const struct sl_config *c, const struct sl_model_config *mc,
			    int rank, int world, int shard_color, int shard_size,
			    enum sl_comm_kind kind, const struct sl_comm_copy *copy,
			    struct sl_comm *xcomm, int *q)
{
	const int C = c->parallel.context, Ep = c->parallel.expert;
	int rc;

	*q = 0;
	if (Ep == 1)
		return 1;
	rc = check(c, mc, world);
	if (rc)
		return rc;
	/* the shard group's ranks are consecutive: it must hold whole expert groups */
	if (shard_size % (C * Ep)) {
		sl_error("%s: parallel.shard_group node: each node's %d rank(s) must hold whole "
			 "expert groups (parallel.context %d x parallel.expert %d ranks); set "
			 "parallel.shard_group: world or a parallel.expert dividing %d", c->source,
			 shard_size, C, Ep, shard_size / C);
		return -EINVAL;
	}
	*q = (rank / C) % Ep;
	/* color: (shard group, expert index); key: the world rank */
	return sl_comm_create(xcomm, MPI_COMM_WORLD, shard_color * Ep + *q, rank, kind, copy);
}

int sl_moe_dist_setup(struct sl_moe_dist *md, struct sl_model *m, const struct sl_config *c,
		      const struct sl_model_config *mc, int rank, int world,
		      enum sl_comm_kind kind, const struct sl_comm_copy *copy)
{
	const int C = c->parallel.context, Ep = c->parallel.expert;
	const double cf = c->parallel.capacity_factor;
	int rc;

	md->comm = MPI_COMM_NULL;
	if (Ep == 1 && cf == 0)
		return 1;
	rc = check(c, mc, world);
	if (rc)
		return rc;
	rc = sl_moe_dist_create(md, rank, world, C, Ep, cf, kind, copy);
	if (rc)
		return rc;
	sl_log("mesh: %d rank(s) = %d data-parallel x %d context; %d expert group(s) of %d "
	       "rank(s), %d expert(s) per rank and layer%s", world, world / C, C, world / C / Ep,
	       Ep, mc->n_experts / Ep, cf > 0 ? "" : "; no token dropped");
	if (cf > 0)
		sl_log("expert capacity: %g x real tokens x %d / %d experts per micro-batch and "
		       "rank; the later tokens over it are dropped", cf, mc->top_k, mc->n_experts);
	rc = sl_model_set_moe_dispatch(m, &md->d);
	if (rc)
		sl_moe_dist_destroy(md);
	return rc;
}
