/*
 * dist: the ranks of a job and the collectives between them.
 *
 * MPI start-up (mpirun or srun --mpi=pmix), rank / world / local rank / node discovery
 * (MPI_Comm_split_type, or parallel.node_size to pretend nodes of that many ranks), the GPU of a
 * rank (local rank), process groups (the shard group: world for FSDP, node for HSDP; the replica
 * group: the ranks holding the same shard in different shard groups), and struct sl_comm: sum
 * all-gather / reduce-scatter / all-reduce / broadcast over a group, implemented by MPI on host
 * buffers, by NCCL on device buffers (NCCL bootstrapped through MPI: rank 0's ncclGetUniqueId,
 * MPI_Bcast, ncclCommInitRank), or by MPI staged through host memory for device buffers (several
 * ranks sharing one GPU in tests).  Knows no model, data or backend: device copies for the staged
 * implementation come in as function pointers.
 */
#ifndef SL_DIST_H
#define SL_DIST_H

#include <mpi.h>
#include <stdbool.h>
#include <stddef.h>

struct sl_dist {
	int rank, world;		/* in MPI_COMM_WORLD */
	int local_rank, local_size;	/* within this (possibly pretended) node */
	int node, n_nodes;
	char host[256];
	MPI_Comm node_comm;		/* the ranks of this node */
	bool node_size_overridden;
	/* as detected (shared-memory domain), never overridden: which GPU a rank takes */
	int hw_local_rank, hw_local_size;
};

/* MPI_Init_thread and discovery.  node_size > 0 overrides the detected ranks per node (it must
 * divide the world size).  On error prints and returns negative (the caller then aborts). */
int sl_dist_init(struct sl_dist *d, int *argc, char ***argv);
/* Re-derive local rank / node from @node_size (0 = detected); call after the config is read. */
int sl_dist_set_node_size(struct sl_dist *d, int node_size);
void sl_dist_finalize(struct sl_dist *d);
/* Print on every rank (host, rank) and MPI_Abort the whole job. */
void sl_dist_abort(const char *why) __attribute__((noreturn));
/*
 * The GPU of this rank among @n_devices visible ones: the detected local rank modulo @n_devices
 * (several ranks share a GPU when there are more ranks than GPUs; node_size does not change it).
 */
int sl_dist_device(const struct sl_dist *d, int n_devices);

/*
 * The watchdog (a thread): between sl_watchdog_arm and sl_watchdog_disarm the main thread must
 * get through within @seconds, else this rank prints "no progress in N s during WHAT" with its
 * host and rank and aborts the job (a peer died or hangs).  With NCCL it also polls the
 * communicators' asynchronous errors and aborts them on one.  sl_dist_finalize stops it.
 */
int sl_watchdog_start(void);
void sl_watchdog_arm(double seconds, const char *what_fmt, ...)
	__attribute__((format(printf, 2, 3)));
void sl_watchdog_disarm(void);
void sl_watchdog_stop(void);

/* A failed library call: "host rank R: file:line: lib: stmt: msg", then abort every rank. */
void sl_dist_fatal(const char *lib, const char *stmt, const char *msg, const char *file, int line)
	__attribute__((noreturn));

/* Fatal MPI errors (house style §5.4); MPI's own handler usually aborts first. */
#define MPI_CHECK(call)								\
	do {									\
		int mpi_rc_ = (call);						\
		if (mpi_rc_ != MPI_SUCCESS) {					\
			char mpi_msg_[MPI_MAX_ERROR_STRING];			\
			int mpi_len_ = 0;					\
			MPI_Error_string(mpi_rc_, mpi_msg_, &mpi_len_);		\
			sl_dist_fatal("MPI", #call, mpi_msg_, __FILE__, __LINE__); \
		}								\
	} while (0)

enum sl_comm_kind {
	SL_COMM_MPI,			/* host buffers */
	SL_COMM_MPI_STAGED,		/* device buffers, copied through host memory */
	SL_COMM_NCCL,			/* device buffers (built with CUDA only) */
};

enum sl_comm_dtype { SL_COMM_F32, SL_COMM_BF16, SL_COMM_F64, SL_COMM_I32, SL_COMM_I64 };

/* bytes per element; 0 for an unknown dtype */
size_t sl_comm_dtype_size(enum sl_comm_dtype t);

/*
 * For SL_COMM_MPI_STAGED: copies between device and host memory (the backend's).  Both copies
 * must be finished with the host memory when they return (cudaMemcpy is), and to_device's data
 * must be there for the device work queued after it (copy on the compute stream, or synchronize:
 * a pageable cudaMemcpy to the device can return before its DMA ends); sync (may be NULL) is
 * called before a staged collective reads device memory, so that work still queued on other
 * streams has written it.  A collective makes one to_host and one to_device call (a broadcast:
 * to_host on the root only, to_device on the others only).
 */
struct sl_comm_copy {
	void *ctx;
	void (*to_host)(void *ctx, void *host, const void *dev, size_t bytes);
	void (*to_device)(void *ctx, void *dev, const void *host, size_t bytes);
	void (*sync)(void *ctx);	/* device work done before a staged copy */
};

struct sl_comm {
	int rank, size;			/* in this group */
	enum sl_comm_kind kind;
	MPI_Comm mpi;
	void *nccl;			/* ncclComm_t when kind == SL_COMM_NCCL */
	void *stream;			/* cudaStream_t the NCCL calls run on (NULL = default) */
	struct sl_comm_copy copy;	/* SL_COMM_MPI_STAGED */
	void *stage;			/* host staging buffer */
	size_t stage_bytes;
	/* the split all-gather (sl_comm_all_gather_start) */
	bool pending;			/* one is under way, not yet waited for */
	MPI_Request req;		/* SL_COMM_MPI: its request */
	void *side;			/* SL_COMM_NCCL: cudaStream_t it runs on (made at first use) */
	void *ev_issued, *ev_done;	/* cudaEvent_t: stream's work before it, its end */
};

/*
 * A group of the ranks of @parent with the same @color (>= 0), ordered by @key (MPI_Comm_split);
 * NCCL communicators are bootstrapped over it (set the CUDA device first; set c->stream after).
 * @copy is needed for SL_COMM_MPI_STAGED only.  SL_COMM_NCCL in a build without CUDA is an
 * error (-ENOTSUP).  Collective over @parent.  Destroy before sl_dist_finalize.
 */
int sl_comm_create(struct sl_comm *c, MPI_Comm parent, int color, int key,
		   enum sl_comm_kind kind, const struct sl_comm_copy *copy);
void sl_comm_destroy(struct sl_comm *c);

/*
 * Collectives over the group: sums, every rank passing the same count and dtype.  Host buffers
 * for SL_COMM_MPI, device buffers for the others.  MPI and staged: done on return; NCCL: queued
 * on c->stream, done when it is.  They return 0, or negative for bad arguments (printed); a
 * failing library call aborts the job.  Results do not depend on timing (fixed algorithms for
 * fixed sizes); bf16 sums over MPI add pairs in float and round to nearest even.
 *
 * In place: all-gather with send == recv + rank * count, reduce-scatter with
 * recv == send + rank * count (the send buffer is then clobbered).
 */

/* recv (size * count) = the ranks' send (count each), in rank order */
int sl_comm_all_gather(struct sl_comm *c, void *recv, const void *send, size_t count,
		       enum sl_comm_dtype t);
/* recv (count) = sum over ranks of send[rank * count, (rank + 1) * count) */
/*
 * A split all-gather, finished by sl_comm_wait (one at a time per group; recv and send untouched
 * until then).  MPI: MPI_Iallgather.  NCCL: on a stream of the group's own, after the work
 * issued on c->stream so far; sl_comm_wait makes c->stream's later work wait for it (the host
 * does not wait), so c->stream's work issued in between overlaps it.  Staged: done at once.
 * Returns 0, or negative (printed).
 */
int sl_comm_all_gather_start(struct sl_comm *c, void *recv, const void *send, size_t count,
			     enum sl_comm_dtype t);
int sl_comm_wait(struct sl_comm *c);
int sl_comm_reduce_scatter(struct sl_comm *c, void *recv, const void *send, size_t count,
			   enum sl_comm_dtype t);
/* buf (count) = sum over ranks, in place */
int sl_comm_all_reduce(struct sl_comm *c, void *buf, size_t count, enum sl_comm_dtype t);
int sl_comm_broadcast(struct sl_comm *c, void *buf, size_t count, enum sl_comm_dtype t,
		      int root);
int sl_comm_barrier(struct sl_comm *c);
/*
 * All-to-all of rows of @row_bytes: scount[q] consecutive rows of send (in rank order) go to rank
 * q, rcount[q] rows from rank q land in recv (in rank order); every rank's counts must pair up
 * (exchange them first).  MPI: host buffers; staged and NCCL (grouped ncclSend / ncclRecv on
 * c->stream): device buffers.  Returns 0, or negative for bad counts (printed).
 */
int sl_comm_all_to_all_rows(struct sl_comm *c, const void *send, const int *scount, void *recv,
			    const int *rcount, size_t row_bytes);

/*
 * Point to point in one step: @bytes of send go to rank @to while @bytes from rank @from land in
 * recv (either rank -1: that half is skipped).  MPI: host buffers; staged and NCCL (ncclSend /
 * ncclRecv grouped on c->stream): device buffers.  Returns 0, or negative on failure (printed).
 */
int sl_comm_sendrecv(struct sl_comm *c, const void *send, int to, void *recv, int from,
		     size_t bytes);

/*
 * The groups of a layout.  shard: the ranks a parameter unit is split over (all ranks for
 * shard_group world; the ranks of one node for node); replica: the ranks holding the same shard
 * index in each shard group (size 1 for world).
 */
struct sl_groups {
	struct sl_comm world, shard, replica;
};
int sl_groups_create(struct sl_groups *g, const struct sl_dist *d, bool shard_by_node,
		     enum sl_comm_kind kind, const struct sl_comm_copy *copy);
void sl_groups_destroy(struct sl_groups *g);

#endif
