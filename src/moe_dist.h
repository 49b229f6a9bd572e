/*
 * moe_dist: the expert group of a rank (MPI) and its all-to-all callbacks for the model's expert
 * dispatch (struct sl_moe_dispatch, model.h).
 *
 * Rank layout (shared with context parallelism): context innermost, world rank =
 * dp * C + c for data-parallel index dp (world / C of them) and context index c.  Expert group:
 * Ep consecutive data-parallel indices at the same c, i.e. group g = dp / Ep holds the world ranks
 * (g Ep + j) C + c, j = 0 .. Ep - 1, its rank j owning experts [j E / Ep, (j + 1) E / Ep).
 * MPI on host buffers only: the cpu backend's (a device all-to-all is not written yet).
 */
#ifndef SL_MOE_DIST_H
#define SL_MOE_DIST_H

#include <mpi.h>

#include "dist.h"
#include "model.h"

struct sl_moe_dist {
	MPI_Comm comm;			/* the expert group; MPI_COMM_NULL when Ep = 1 */
	struct sl_comm rows_comm;	/* the same group for the rows (the backend's buffers) */
	bool have_rows_comm;
	int group;			/* dp / Ep */
	struct sl_moe_dispatch d;	/* rank, size = Ep, the callbacks over comm */
};

/*
 * Collective over MPI_COMM_WORLD.  @C context ranks, @Ep expert ranks; the caller has checked
 * that C * Ep divides the world.  The rows travel over a communicator of @kind (MPI for host
 * buffers; staged through host memory with @copy, or NCCL, for device buffers).  Returns 0
 * (negative on a failure, printed).
 */
int sl_moe_dist_create(struct sl_moe_dist *md, int rank, int world, int C, int Ep,
		       double capacity_factor, enum sl_comm_kind kind,
		       const struct sl_comm_copy *copy);
void sl_moe_dist_destroy(struct sl_moe_dist *md);

struct sl_config;
/*
 * Before the shard module (collective): with parallel.expert P > 1, check the layout against the
 * world and the model (errors name the config file and key), and make @xcomm: the ranks of this
 * rank's shard group (@shard_color: its node with parallel.shard_group node, else 0;
 * @shard_size ranks) that hold the same experts, over which the experts' units are sharded.
 * *q = this rank's index in its expert group.  Returns 0, 1 when P = 1 (nothing made),
 * negative on an error (printed).
 */
int sl_moe_dist_expert_comm(const struct sl_config *c, const struct sl_model_config *mc,
			    int rank, int world, int shard_color, int shard_size,
			    enum sl_comm_kind kind, const struct sl_comm_copy *copy,
			    struct sl_comm *xcomm, int *q);
/*
 * The trainer's set-up (collective): with parallel.expert > 1 or parallel.capacity_factor > 0,
 * check the layout against the world and the model (clear errors naming the config file and
 * key), create the group, log the mesh and set the model's dispatch.  Returns 0, 1 when there is
 * nothing to set up, negative on an error (printed).
 */
int sl_moe_dist_setup(struct sl_moe_dist *md, struct sl_model *m, const struct sl_config *c,
		      const struct sl_model_config *mc, int rank, int world,
		      enum sl_comm_kind kind, const struct sl_comm_copy *copy);

#endif
