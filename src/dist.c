/*
 * dist: MPI start-up, node discovery, process groups and the sl_comm collectives (see dist.h).
 *
 * Every collective has three implementations, chosen by the communicator's kind: MPI on host
 * buffers; MPI staged through a host buffer for device buffers (the backend's copies come in as
 * callbacks, so this file needs no CUDA for it); NCCL on device buffers (built with CUDA only).
 * MPI has no bf16 type, so bf16 sums over MPI use our own MPI_Op on 16-bit storage.
 *
 * MPI errors stay fatal (MPI_ERRORS_ARE_FATAL, and MPI_CHECK behind it): a rank that dies or fails
 * a collective must end the whole job rather than leave the others waiting in the next one.
 */
#include "dist.h"
#include "sl_build.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "log.h"

/*
 * SL_DIST_NCCL: the NCCL implementation is compiled in.  A CUDA build whose compile line lacks
 * $(CUDA_CFLAGS) cannot see nccl.h; it then builds without NCCL (and says so) instead of failing.
 */
#ifdef SL_HAVE_CUDA
#if defined(__has_include) && __has_include(<nccl.h>) && __has_include(<cuda_runtime.h>)
#define SL_DIST_NCCL 1
#include <cuda_runtime.h>
#include <nccl.h>
#else
#warning "nccl.h is not on the include path (add $(CUDA_CFLAGS) to AM_CPPFLAGS): SL_COMM_NCCL disabled"
#endif
#endif

/* who we are, for messages printed on the way down (sl_dist_abort has no struct sl_dist) */
static char self_host[256];
static int self_rank = -1;

/* bf16 sum for MPI, created on first use, freed by sl_dist_finalize */
static MPI_Op bf16_sum_op = MPI_OP_NULL;

#ifdef SL_DIST_NCCL
static void wd_nccl_add(void *comm);
static void wd_nccl_remove(void *comm);
#endif

void sl_dist_abort(const char *why)
{
	int inited = 0, finalized = 0;

	if (self_rank < 0 && gethostname(self_host, sizeof(self_host) - 1))
		strcpy(self_host, "?");
	fflush(stdout);
	fprintf(stderr, "%s rank %d: %s\n", self_host, self_rank, why);
	fflush(stderr);
	MPI_Initialized(&inited);
	MPI_Finalized(&finalized);
	if (inited && !finalized)
		MPI_Abort(MPI_COMM_WORLD, 1);
	exit(1);
}

void sl_dist_fatal(const char *lib, const char *stmt, const char *msg, const char *file, int line)
{
	char why[1024];

	snprintf(why, sizeof(why), "%s:%d: %s: %s: %s", file, line, lib, stmt, msg);
	sl_dist_abort(why);
}

#ifdef SL_DIST_NCCL
/* NCCL's last error names the peer or transport that failed, which the result code does not. */
#define NCCL_CHECK(call)							\
	do {									\
		ncclResult_t nccl_rc_ = (call);					\
		if (nccl_rc_ != ncclSuccess) {					\
			char nccl_msg_[768];					\
			snprintf(nccl_msg_, sizeof(nccl_msg_), "%s (%s)",	\
				 ncclGetErrorString(nccl_rc_),			\
				 ncclGetLastError(NULL));			\
			sl_dist_fatal("NCCL", #call, nccl_msg_, __FILE__, __LINE__); \
		}								\
	} while (0)
#define CUDA_RT_CHECK(call)							\
	do {									\
		cudaError_t cuda_rc_ = (call);					\
		if (cuda_rc_ != cudaSuccess)					\
			sl_dist_fatal("CUDA", #call, cudaGetErrorString(cuda_rc_),	\
				      __FILE__, __LINE__);				\
	} while (0)
#endif

/*
 * The ranks sharing memory with us form our node.  The node index counts the node leaders (local
 * rank 0, the lowest world rank of its node) below ours: it depends on world ranks only, so
 * mpirun and srun agree, whatever order they place ranks in.
 */
static void node_detect(struct sl_dist *d)
{
	int leader, below = 0;

	MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, d->rank,
				      MPI_INFO_NULL, &d->node_comm));
	MPI_CHECK(MPI_Comm_rank(d->node_comm, &d->local_rank));
	MPI_CHECK(MPI_Comm_size(d->node_comm, &d->local_size));
	d->hw_local_rank = d->local_rank;
	d->hw_local_size = d->local_size;

	leader = d->local_rank == 0;
	MPI_CHECK(MPI_Exscan(&leader, &below, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD));
	if (d->rank == 0)
		below = 0;	/* MPI_Exscan leaves rank 0's result undefined */
	d->node = below;
	MPI_CHECK(MPI_Bcast(&d->node, 1, MPI_INT, 0, d->node_comm));
	MPI_CHECK(MPI_Allreduce(&leader, &d->n_nodes, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD));
	d->node_size_overridden = false;
}

int sl_dist_init(struct sl_dist *d, int *argc, char ***argv)
{
	int inited, provided;

	memset(d, 0, sizeof(*d));
	d->node_comm = MPI_COMM_NULL;
	MPI_CHECK(MPI_Initialized(&inited));
	if (inited)
		MPI_CHECK(MPI_Query_thread(&provided));
	else
		MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided));
	MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &d->rank));
	MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &d->world));
	if (gethostname(d->host, sizeof(d->host) - 1))
		strcpy(d->host, "?");
	snprintf(self_host, sizeof(self_host), "%s", d->host);
	self_rank = d->rank;
	sl_log_set_rank(d->rank, d->world, d->host);

	/* OpenMP threads compute; only the main thread calls MPI */
	if (provided < MPI_THREAD_FUNNELED) {
		sl_error("MPI gives thread level %d, shardlm needs MPI_THREAD_FUNNELED (%d); "
			 "use an MPI library built with thread support", provided,
			 MPI_THREAD_FUNNELED);
		return -ENOTSUP;
	}
	node_detect(d);
	return 0;
}

int sl_dist_set_node_size(struct sl_dist *d, int node_size)
{
	MPI_Comm comm;

	if (node_size < 0 || (node_size > 0 && d->world % node_size)) {
		sl_error("parallel.node_size %d does not divide the world size %d; set it to a "
			 "divisor of the number of ranks, or 0 for the detected nodes",
			 node_size, d->world);
		return -EINVAL;
	}
	if (!node_size) {
		MPI_CHECK(MPI_Comm_free(&d->node_comm));
		node_detect(d);
		return 0;
	}
	/* pretended nodes of node_size consecutive ranks, as mpirun's default mapping places them */
	MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, d->rank / node_size, d->rank, &comm));
	MPI_CHECK(MPI_Comm_free(&d->node_comm));
	d->node_comm = comm;
	d->local_rank = d->rank % node_size;
	d->local_size = node_size;
	d->node = d->rank / node_size;
	d->n_nodes = d->world / node_size;
	d->node_size_overridden = true;
	return 0;
}

int sl_dist_device(const struct sl_dist *d, int n_devices)
{
	return n_devices > 0 ? d->hw_local_rank % n_devices : -1;
}

void sl_dist_finalize(struct sl_dist *d)
{
	int finalized = 0;

	sl_watchdog_stop();
	MPI_Finalized(&finalized);
	if (finalized)
		return;
	if (d->node_comm != MPI_COMM_NULL)
		MPI_Comm_free(&d->node_comm);
	if (bf16_sum_op != MPI_OP_NULL)
		MPI_Op_free(&bf16_sum_op);
	MPI_Finalize();
}

/* ---- bf16 over MPI ------------------------------------------------------------------------- */

static inline float bf16_to_f32(uint16_t h)
{
	uint32_t u = (uint32_t)h << 16;
	float f;

	memcpy(&f, &u, sizeof(f));
	return f;
}

/*
 * Round to nearest, ties to even.  A float holds the sum of two bf16 values exactly or far below
 * half a bf16 ulp, so this rounding of the float sum is the correctly rounded bf16 sum.
 */
static inline uint16_t f32_to_bf16(float f)
{
	uint32_t u;

	memcpy(&u, &f, sizeof(u));
	if ((u & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((u >> 16) | 0x40);	/* NaN stays a (quiet) NaN */
	u += 0x7fffu + ((u >> 16) & 1);
	return (uint16_t)(u >> 16);
}

static void bf16_sum(void *in, void *inout, int *len, MPI_Datatype *type)
{
	const uint16_t *a = in;
	uint16_t *b = inout;

	for (int i = 0; i < *len; i++)
		b[i] = f32_to_bf16(bf16_to_f32(a[i]) + bf16_to_f32(b[i]));
}

/* ---- communicators ------------------------------------------------------------------------- */

size_t sl_comm_dtype_size(enum sl_comm_dtype t)
{
	switch (t) {
	case SL_COMM_F32: case SL_COMM_I32: return 4;
	case SL_COMM_BF16: return 2;
	case SL_COMM_F64: case SL_COMM_I64: return 8;
	}
	return 0;
}

static void mpi_type(enum sl_comm_dtype t, MPI_Datatype *type, MPI_Op *op)
{
	*op = MPI_SUM;
	switch (t) {
	case SL_COMM_F32: *type = MPI_FLOAT; break;
	case SL_COMM_F64: *type = MPI_DOUBLE; break;
	case SL_COMM_I32: *type = MPI_INT32_T; break;
	case SL_COMM_I64: *type = MPI_INT64_T; break;
	case SL_COMM_BF16:
		*type = MPI_UINT16_T;
		if (bf16_sum_op == MPI_OP_NULL)
			MPI_CHECK(MPI_Op_create(bf16_sum, 1, &bf16_sum_op));
		*op = bf16_sum_op;
		break;
	}
}

#ifdef SL_DIST_NCCL
static ncclDataType_t nccl_type(enum sl_comm_dtype t)
{
	switch (t) {
	case SL_COMM_F32: return ncclFloat32;
	case SL_COMM_BF16: return ncclBfloat16;
	case SL_COMM_F64: return ncclFloat64;
	case SL_COMM_I32: return ncclInt32;
	case SL_COMM_I64: return ncclInt64;
	}
	return ncclFloat32;
}

/* Group rank 0 makes the id, MPI carries it to the others; the caller has set the device. */
static void nccl_init(struct sl_comm *c)
{
	ncclUniqueId id;
	ncclComm_t comm;

	if (c->rank == 0)
		NCCL_CHECK(ncclGetUniqueId(&id));
	MPI_CHECK(MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, c->mpi));
	NCCL_CHECK(ncclCommInitRank(&comm, c->size, id, c->rank));
	c->nccl = comm;
	wd_nccl_add(comm);
}
#endif

int sl_comm_create(struct sl_comm *c, MPI_Comm parent, int color, int key,
		   enum sl_comm_kind kind, const struct sl_comm_copy *copy)
{
	memset(c, 0, sizeof(*c));
	c->mpi = MPI_COMM_NULL;
	c->kind = kind;
	switch (kind) {
	case SL_COMM_MPI:
		break;
	case SL_COMM_MPI_STAGED:
		if (!copy || !copy->to_host || !copy->to_device) {
			sl_error("sl_comm_create: the host-staged MPI communicator needs the "
				 "backend's device copies (to_host and to_device)");
			return -EINVAL;
		}
		c->copy = *copy;
		break;
	case SL_COMM_NCCL:
#ifndef SL_DIST_NCCL
		sl_error("sl_comm_create: NCCL communicators need shardlm built with CUDA and "
			 "NCCL (configure --with-cuda); use the host-staged MPI communicator for "
			 "device buffers, or the cpu backend");
		return -ENOTSUP;
#endif
		break;
	default:
		sl_error("sl_comm_create: unknown communicator kind %d", (int)kind);
		return -EINVAL;
	}
	if (color < 0) {
		sl_error("sl_comm_create: color %d; colors are >= 0 (every rank joins a group)",
			 color);
		return -EINVAL;
	}
	MPI_CHECK(MPI_Comm_split(parent, color, key, &c->mpi));
	MPI_CHECK(MPI_Comm_rank(c->mpi, &c->rank));
	MPI_CHECK(MPI_Comm_size(c->mpi, &c->size));
#ifdef SL_DIST_NCCL
	if (kind == SL_COMM_NCCL)
		nccl_init(c);
#endif
	return 0;
}

void sl_comm_destroy(struct sl_comm *c)
{
	if (c->pending && c->kind == SL_COMM_MPI)
		MPI_CHECK(MPI_Wait(&c->req, MPI_STATUS_IGNORE));
#ifdef SL_DIST_NCCL
	if (c->nccl) {
		wd_nccl_remove(c->nccl);
		NCCL_CHECK(ncclCommDestroy((ncclComm_t)c->nccl));
	}
	if (c->side) {
		CUDA_RT_CHECK(cudaEventDestroy((cudaEvent_t)c->ev_issued));
		CUDA_RT_CHECK(cudaEventDestroy((cudaEvent_t)c->ev_done));
		CUDA_RT_CHECK(cudaStreamDestroy((cudaStream_t)c->side));
	}
#endif
	c->nccl = c->side = c->ev_issued = c->ev_done = NULL;
	c->pending = false;
	if (c->mpi != MPI_COMM_NULL)
		MPI_CHECK(MPI_Comm_free(&c->mpi));
	free(c->stage);
	c->stage = NULL;
	c->stage_bytes = 0;
}

/* Arguments every collective shares; *n is the count as MPI takes it (an int). */
static int check_args(const struct sl_comm *c, const char *what, size_t count,
		      enum sl_comm_dtype t, int *n)
{
	if (!sl_comm_dtype_size(t)) {
		sl_error("%s: unknown dtype %d", what, (int)t);
		return -EINVAL;
	}
	if (c->kind != SL_COMM_NCCL && count > INT_MAX) {
		sl_error("%s: %zu elements per rank is more than an MPI count holds (%d); "
			 "split the buffer", what, count, INT_MAX);
		return -EOVERFLOW;
	}
	*n = (int)count;
	return 0;
}

static int stage_reserve(struct sl_comm *c, size_t bytes)
{
	if (bytes <= c->stage_bytes)
		return 0;
	free(c->stage);		/* nothing in it outlives a collective: no realloc copy */
	c->stage = malloc(bytes);
	c->stage_bytes = c->stage ? bytes : 0;
	if (!c->stage) {
		sl_error("staging a collective through host memory: cannot allocate %zu bytes",
			 bytes);
		return -ENOMEM;
	}
	return 0;
}

static void stage_sync(struct sl_comm *c)
{
	if (c->copy.sync)
		c->copy.sync(c->copy.ctx);
}

int sl_comm_all_gather(struct sl_comm *c, void *recv, const void *send, size_t count,
		       enum sl_comm_dtype t)
{
	size_t cb = count * sl_comm_dtype_size(t);
	MPI_Datatype type;
	MPI_Op op;
	char *mine;
	int n, rc;

	rc = check_args(c, "all-gather", count, t, &n);
	if (rc || !count)
		return rc;
	mpi_type(t, &type, &op);
	switch (c->kind) {
	case SL_COMM_MPI:
		/* send at our own slot of recv is the in-place form, which MPI spells MPI_IN_PLACE */
		if (send == (char *)recv + c->rank * cb)
			send = MPI_IN_PLACE;
		MPI_CHECK(MPI_Allgather(send, n, type, recv, n, type, c->mpi));
		break;
	case SL_COMM_MPI_STAGED:
		rc = stage_reserve(c, c->size * cb);
		if (rc)
			return rc;
		mine = (char *)c->stage + c->rank * cb;
		stage_sync(c);
		c->copy.to_host(c->copy.ctx, mine, send, cb);
		MPI_CHECK(MPI_Allgather(MPI_IN_PLACE, n, type, c->stage, n, type, c->mpi));
		c->copy.to_device(c->copy.ctx, recv, c->stage, c->size * cb);
		break;
	case SL_COMM_NCCL:
#ifdef SL_DIST_NCCL
		NCCL_CHECK(ncclAllGather(send, recv, count, nccl_type(t), (ncclComm_t)c->nccl,
					 (cudaStream_t)c->stream));
#endif
		break;
	}
	return 0;
}

int sl_comm_all_gather_start(struct sl_comm *c, void *recv, const void *send, size_t count,
			     enum sl_comm_dtype t)
{
	size_t cb = count * sl_comm_dtype_size(t);
	MPI_Datatype type;
	MPI_Op op;
	int n, rc;

	if (c->pending) {
		sl_error("all-gather start: the group's previous split all-gather was not waited for");
		return -EBUSY;
	}
	rc = check_args(c, "all-gather", count, t, &n);
	if (rc || !count || c->kind == SL_COMM_MPI_STAGED)
		return rc ? rc : sl_comm_all_gather(c, recv, send, count, t);
	switch (c->kind) {
	case SL_COMM_MPI:
		mpi_type(t, &type, &op);
		if (send == (char *)recv + c->rank * cb)
			send = MPI_IN_PLACE;
		MPI_CHECK(MPI_Iallgather(send, n, type, recv, n, type, c->mpi, &c->req));
		c->pending = true;
		break;
	case SL_COMM_NCCL:
#ifdef SL_DIST_NCCL
		/* the side stream starts after what c->stream has issued (send was written there) */
		if (!c->side) {
			cudaStream_t st;
			cudaEvent_t a, b;
			int least, greatest;

			/* the compute stream's priority (the cuda backend's: the greatest) */
			CUDA_RT_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
			CUDA_RT_CHECK(cudaStreamCreateWithPriority(&st, cudaStreamNonBlocking,
								   greatest));
			CUDA_RT_CHECK(cudaEventCreateWithFlags(&a, cudaEventDisableTiming));
			CUDA_RT_CHECK(cudaEventCreateWithFlags(&b, cudaEventDisableTiming));
			c->side = st, c->ev_issued = a, c->ev_done = b;
		}
		CUDA_RT_CHECK(cudaEventRecord((cudaEvent_t)c->ev_issued, (cudaStream_t)c->stream));
		CUDA_RT_CHECK(cudaStreamWaitEvent((cudaStream_t)c->side,
						  (cudaEvent_t)c->ev_issued, 0));
		NCCL_CHECK(ncclAllGather(send, recv, count, nccl_type(t), (ncclComm_t)c->nccl,
					 (cudaStream_t)c->side));
		CUDA_RT_CHECK(cudaEventRecord((cudaEvent_t)c->ev_done, (cudaStream_t)c->side));
		c->pending = true;
#endif
		break;
	default:
		break;
	}
	return 0;
}

int sl_comm_wait(struct sl_comm *c)
{
	if (c->pending && c->kind == SL_COMM_MPI)
		MPI_CHECK(MPI_Wait(&c->req, MPI_STATUS_IGNORE));
#ifdef SL_DIST_NCCL
	if (c->pending && c->kind == SL_COMM_NCCL)
		CUDA_RT_CHECK(cudaStreamWaitEvent((cudaStream_t)c->stream, (cudaEvent_t)c->ev_done,
						  0));
#endif
	c->pending = false;
	return 0;
}

int sl_comm_reduce_scatter(struct sl_comm *c, void *recv, const void *send, size_t count,
			   enum sl_comm_dtype t)
{
	size_t cb = count * sl_comm_dtype_size(t);
	MPI_Datatype type;
	MPI_Op op;
	int n, rc;

	rc = check_args(c, "reduce-scatter", count, t, &n);
	if (rc || !count)
		return rc;
	mpi_type(t, &type, &op);
	switch (c->kind) {
	case SL_COMM_MPI:
		if (recv == (const char *)send + c->rank * cb) {
			/* in place: MPI leaves our block at the front of the buffer */
			MPI_CHECK(MPI_Reduce_scatter_block(MPI_IN_PLACE, (void *)send, n, type, op,
							   c->mpi));
			memmove(recv, send, cb);
		} else {
			MPI_CHECK(MPI_Reduce_scatter_block(send, recv, n, type, op, c->mpi));
		}
		break;
	case SL_COMM_MPI_STAGED:
		rc = stage_reserve(c, c->size * cb);
		if (rc)
			return rc;
		stage_sync(c);
		c->copy.to_host(c->copy.ctx, c->stage, send, c->size * cb);
		MPI_CHECK(MPI_Reduce_scatter_block(MPI_IN_PLACE, c->stage, n, type, op, c->mpi));
		c->copy.to_device(c->copy.ctx, recv, c->stage, cb);
		break;
	case SL_COMM_NCCL:
#ifdef SL_DIST_NCCL
		NCCL_CHECK(ncclReduceScatter(send, recv, count, nccl_type(t), ncclSum,
					     (ncclComm_t)c->nccl, (cudaStream_t)c->stream));
#endif
		break;
	}
	return 0;
}

int sl_comm_all_reduce(struct sl_comm *c, void *buf, size_t count, enum sl_comm_dtype t)
{
	size_t cb = count * sl_comm_dtype_size(t);
	MPI_Datatype type;
	MPI_Op op;
	int n, rc;

	rc = check_args(c, "all-reduce", count, t, &n);
	if (rc || !count)
		return rc;
	mpi_type(t, &type, &op);
	switch (c->kind) {
	case SL_COMM_MPI:
		MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, buf, n, type, op, c->mpi));
		break;
	case SL_COMM_MPI_STAGED:
		rc = stage_reserve(c, cb);
		if (rc)
			return rc;
		stage_sync(c);
		c->copy.to_host(c->copy.ctx, c->stage, buf, cb);
		MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, c->stage, n, type, op, c->mpi));
		c->copy.to_device(c->copy.ctx, buf, c->stage, cb);
		break;
	case SL_COMM_NCCL:
#ifdef SL_DIST_NCCL
		NCCL_CHECK(ncclAllReduce(buf, buf, count, nccl_type(t), ncclSum,
					 (ncclComm_t)c->nccl, (cudaStream_t)c->stream));
#endif
		break;
	}
	return 0;
}

int sl_comm_broadcast(struct sl_comm *c, void *buf, size_t count, enum sl_comm_dtype t,
		      int root)
{
	size_t cb = count * sl_comm_dtype_size(t);
	MPI_Datatype type;
	MPI_Op op;
	int n, rc;

	rc = check_args(c, "broadcast", count, t, &n);
	if (rc)
		return rc;
	if (root < 0 || root >= c->size) {
		sl_error("broadcast: root %d is not a rank of this group (size %d)", root,
			 c->size);
		return -EINVAL;
	}
	if (!count)
		return 0;
	mpi_type(t, &type, &op);
	switch (c->kind) {
	case SL_COMM_MPI:
		MPI_CHECK(MPI_Bcast(buf, n, type, root, c->mpi));
		break;
	case SL_COMM_MPI_STAGED:
		/* only the root's data travels up, only the others' comes back down */
		rc = stage_reserve(c, cb);
		if (rc)
			return rc;
		if (c->rank == root) {
			stage_sync(c);
			c->copy.to_host(c->copy.ctx, c->stage, buf, cb);
		}
		MPI_CHECK(MPI_Bcast(c->stage, n, type, root, c->mpi));
		if (c->rank != root)
			c->copy.to_device(c->copy.ctx, buf, c->stage, cb);
		break;
	case SL_COMM_NCCL:
#ifdef SL_DIST_NCCL
		NCCL_CHECK(ncclBroadcast(buf, buf, count, nccl_type(t), root,
					 (ncclComm_t)c->nccl, (cudaStream_t)c->stream));
#endif
		break;
	}
	return 0;
}

int sl_comm_barrier(struct sl_comm *c)
{
	MPI_CHECK(MPI_Barrier(c->mpi));
	return 0;
}

int sl_comm_all_to_all_rows(struct sl_comm *c, const void *send, const int *scount, void *recv,
			    const int *rcount, size_t row_bytes)
{
	int *sd = malloc(2 * sizeof(int) * c->size), *rd = sd + c->size;
	size_t ns = 0, nr = 0;
	MPI_Datatype row;

	if (!sd)
		sl_dist_abort("out of host memory for an all-to-all");
	for (int q = 0; q < c->size; q++) {
		if (scount[q] < 0 || rcount[q] < 0 || ns + scount[q] > INT_MAX ||
		    nr + rcount[q] > INT_MAX) {
			free(sd);
			sl_error("all-to-all: bad row counts (%d to, %d from rank %d)", scount[q],
				 rcount[q], q);
			return -EINVAL;
		}
		sd[q] = (int)ns;
		rd[q] = (int)nr;
		ns += scount[q];
		nr += rcount[q];
	}
	switch (c->kind) {
	case SL_COMM_MPI:
	case SL_COMM_MPI_STAGED:
		/* rows as one contiguous type: counts stay in rows, far from an int of bytes */
		MPI_CHECK(MPI_Type_contiguous((int)row_bytes, MPI_BYTE, &row));
		MPI_CHECK(MPI_Type_commit(&row));
		if (c->kind == SL_COMM_MPI) {
			MPI_CHECK(MPI_Alltoallv(send, scount, sd, row, recv, rcount, rd, row,
						c->mpi));
		} else if (stage_reserve(c, (ns + nr) * row_bytes) == 0) {
			char *hs = c->stage, *hr = hs + ns * row_bytes;

			stage_sync(c);
			c->copy.to_host(c->copy.ctx, hs, send, ns * row_bytes);
			MPI_CHECK(MPI_Alltoallv(hs, scount, sd, row, hr, rcount, rd, row, c->mpi));
			c->copy.to_device(c->copy.ctx, recv, hr, nr * row_bytes);
		}
		MPI_CHECK(MPI_Type_free(&row));
		break;
	case SL_COMM_NCCL:
#ifdef SL_DIST_NCCL
		/* point to point in one group: NCCL's all-to-all */
		NCCL_CHECK(ncclGroupStart());
		for (int q = 0; q < c->size; q++) {
			if (scount[q])
				NCCL_CHECK(ncclSend((const char *)send + (size_t)sd[q] * row_bytes,
						    (size_t)scount[q] * row_bytes, ncclUint8, q,
						    (ncclComm_t)c->nccl, (cudaStream_t)c->stream));
			if (rcount[q])
				NCCL_CHECK(ncclRecv((char *)recv + (size_t)rd[q] * row_bytes,
						    (size_t)rcount[q] * row_bytes, ncclUint8, q,
						    (ncclComm_t)c->nccl, (cudaStream_t)c->stream));
		}
		NCCL_CHECK(ncclGroupEnd());
#endif
		break;
	}
	free(sd);
	return 0;
}

/* MPI_Sendrecv of host buffers in pieces below an int of bytes */
static int mpi_sendrecv(MPI_Comm comm, const char *send, int to, char *recv, int from,
			size_t bytes)
{
	const size_t piece = (size_t)1 << 30;

	for (size_t off = 0; off < bytes; off += piece) {
		int n = (int)(bytes - off < piece ? bytes - off : piece);

		if (MPI_Sendrecv(to < 0 ? NULL : send + off, to < 0 ? 0 : n, MPI_BYTE,
				 to < 0 ? MPI_PROC_NULL : to, 71, from < 0 ? NULL : recv + off,
				 from < 0 ? 0 : n, MPI_BYTE, from < 0 ? MPI_PROC_NULL : from, 71,
				 comm, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
			sl_error("sendrecv of %zu bytes (to rank %d, from rank %d) failed", bytes,
				 to, from);
			return -EIO;
		}
	}
	return 0;
}

int sl_comm_sendrecv(struct sl_comm *c, const void *send, int to, void *recv, int from,
		     size_t bytes)
{
	int rc = 0;

	if (!bytes || (to < 0 && from < 0))
		return 0;
	switch (c->kind) {
	case SL_COMM_MPI:
		rc = mpi_sendrecv(c->mpi, send, to, recv, from, bytes);
		break;
	case SL_COMM_MPI_STAGED:
		rc = stage_reserve(c, 2 * bytes);
		if (rc)
			break;
		stage_sync(c);
		if (to >= 0)
			c->copy.to_host(c->copy.ctx, c->stage, send, bytes);
		rc = mpi_sendrecv(c->mpi, c->stage, to, (char *)c->stage + bytes, from, bytes);
		if (!rc && from >= 0)
			c->copy.to_device(c->copy.ctx, recv, (char *)c->stage + bytes, bytes);
		break;
	case SL_COMM_NCCL:
#ifdef SL_DIST_NCCL
		NCCL_CHECK(ncclGroupStart());
		if (to >= 0)
			NCCL_CHECK(ncclSend(send, bytes, ncclUint8, to, (ncclComm_t)c->nccl,
					    (cudaStream_t)c->stream));
		if (from >= 0)
			NCCL_CHECK(ncclRecv(recv, bytes, ncclUint8, from, (ncclComm_t)c->nccl,
					    (cudaStream_t)c->stream));
		NCCL_CHECK(ncclGroupEnd());
#endif
		break;
	}
	return rc;
}

/* ---- process groups ------------------------------------------------------------------------ */

int sl_groups_create(struct sl_groups *g, const struct sl_dist *d, bool shard_by_node,
		     enum sl_comm_kind kind, const struct sl_comm_copy *copy)
{
	int lo, hi, rc;

	memset(g, 0, sizeof(*g));
	g->world.mpi = g->shard.mpi = g->replica.mpi = MPI_COMM_NULL;
	if (shard_by_node) {
		/* replica groups pair shard i of every node: every node needs the same shards */
		MPI_CHECK(MPI_Allreduce(&d->local_size, &lo, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
		MPI_CHECK(MPI_Allreduce(&d->local_size, &hi, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD));
		if (lo != hi) {
			sl_error("parallel.shard_group node needs the same number of ranks on "
				 "every node, but nodes have %d to %d; start as many ranks per "
				 "node, or set parallel.node_size", lo, hi);
			return -EINVAL;
		}
	}
	rc = sl_comm_create(&g->world, MPI_COMM_WORLD, 0, d->rank, kind, copy);
	if (rc)
		return rc;
	/*
	 * Ordered by world rank, so a rank's place in its shard group is its local rank (nodes
	 * are ordered that way too), and the replica group of local rank l holds shard l of
	 * every node, in node order.
	 */
	if (shard_by_node)
		rc = sl_comm_create(&g->shard, MPI_COMM_WORLD, d->node, d->rank, kind, copy);
	else
		rc = sl_comm_create(&g->shard, MPI_COMM_WORLD, 0, d->rank, kind, copy);
	if (rc)
		goto out_destroy_world;
	if (shard_by_node)
		rc = sl_comm_create(&g->replica, MPI_COMM_WORLD, d->local_rank, d->node, kind,
				    copy);
	else
		rc = sl_comm_create(&g->replica, MPI_COMM_WORLD, d->rank, 0, kind, copy);
	if (rc)
		goto out_destroy_shard;
	return 0;

out_destroy_shard:
	sl_comm_destroy(&g->shard);
out_destroy_world:
	sl_comm_destroy(&g->world);
	return rc;
}

void sl_groups_destroy(struct sl_groups *g)
{
	sl_comm_destroy(&g->replica);
	sl_comm_destroy(&g->shard);
	sl_comm_destroy(&g->world);
}

/*
 * The watchdog.  A rank that dies leaves the others blocked in their next collective: MPI notices
 * only when the launcher tells it, and NCCL never does by itself.  So the main thread arms a
 * deadline before each step (and each checkpoint write) and disarms it after; a thread checks it
 * every second and, once it passes, names this rank and host and aborts the whole job.  With
 * NCCL it also polls each communicator's asynchronous error and aborts the communicators on one,
 * since a NCCL kernel waiting for a dead peer never returns.
 */
#define WD_MAX_NCCL 16

static struct {
	pthread_mutex_t lock;
	pthread_cond_t wake;
	pthread_t thread;
	bool running, stop;
	double deadline;		/* sl_now() seconds; 0 = disarmed */
	double armed_for;		/* seconds */
	char what[160];
	void *nccl[WD_MAX_NCCL];	/* ncclComm_t */
} wd = { .lock = PTHREAD_MUTEX_INITIALIZER, .wake = PTHREAD_COND_INITIALIZER };

#ifdef SL_DIST_NCCL
static void wd_nccl_add(void *comm)
{
	pthread_mutex_lock(&wd.lock);
	for (int i = 0; i < WD_MAX_NCCL; i++)
		if (!wd.nccl[i]) {
			wd.nccl[i] = comm;
			break;
		}
	pthread_mutex_unlock(&wd.lock);
}

static void wd_nccl_remove(void *comm)
{
	pthread_mutex_lock(&wd.lock);
	for (int i = 0; i < WD_MAX_NCCL; i++)
		if (wd.nccl[i] == comm)
			wd.nccl[i] = NULL;
	pthread_mutex_unlock(&wd.lock);
}
#endif

/* called with wd.lock held: never returns */
static void wd_abort(const char *why)
{
	fflush(stdout);
	fprintf(stderr, "%s rank %d: error: %s; aborting the job\n", self_host, self_rank, why);
	fflush(stderr);
#ifdef SL_DIST_NCCL
	for (int i = 0; i < WD_MAX_NCCL; i++)
		if (wd.nccl[i])
			ncclCommAbort((ncclComm_t)wd.nccl[i]);
#endif
	MPI_Abort(MPI_COMM_WORLD, 1);
	_exit(1);
}

static void *wd_main(void *arg)
{
	char why[512];

	pthread_mutex_lock(&wd.lock);
	while (!wd.stop) {
		struct timespec ts;

		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_sec += 1;
		pthread_cond_timedwait(&wd.wake, &wd.lock, &ts);
		if (wd.stop)
			break;
		if (wd.deadline > 0 && sl_now() > wd.deadline) {
			snprintf(why, sizeof(why), "no progress in %.0f s during %s (a rank died or "
				 "hangs; the launcher's messages name it); raise parallel.timeout_s "
				 "if this was only slow", wd.armed_for, wd.what);
			wd_abort(why);
		}
#ifdef SL_DIST_NCCL
		for (int i = 0; i < WD_MAX_NCCL; i++) {
			ncclResult_t err = ncclSuccess;

			if (!wd.nccl[i] || ncclCommGetAsyncError((ncclComm_t)wd.nccl[i], &err) !=
			    ncclSuccess || err == ncclSuccess || err == ncclInProgress)
				continue;
			snprintf(why, sizeof(why), "NCCL asynchronous error during %s: %s (%s)",
				 wd.what[0] ? wd.what : "start-up", ncclGetErrorString(err),
				 ncclGetLastError(NULL));
			wd_abort(why);
		}
#endif
	}
	pthread_mutex_unlock(&wd.lock);
	return NULL;
}

int sl_watchdog_start(void)
{
	int rc;

	if (wd.running)
		return 0;
	wd.stop = false;
	wd.deadline = 0;
	rc = pthread_create(&wd.thread, NULL, wd_main, NULL);
	if (rc) {
		sl_error("cannot start the watchdog thread: %s", strerror(rc));
		return -rc;
	}
	wd.running = true;
	return 0;
}

void sl_watchdog_arm(double seconds, const char *fmt, ...)
{
	va_list ap;

	pthread_mutex_lock(&wd.lock);
	va_start(ap, fmt);
	vsnprintf(wd.what, sizeof(wd.what), fmt, ap);
	va_end(ap);
	wd.armed_for = seconds;
	wd.deadline = sl_now() + seconds;
	pthread_mutex_unlock(&wd.lock);
}

void sl_watchdog_disarm(void)
{
	pthread_mutex_lock(&wd.lock);
	wd.deadline = 0;
	pthread_mutex_unlock(&wd.lock);
}

void sl_watchdog_stop(void)
{
	if (!wd.running)
		return;
	pthread_mutex_lock(&wd.lock);
	wd.stop = true;
	pthread_cond_signal(&wd.wake);
	pthread_mutex_unlock(&wd.lock);
	pthread_join(wd.thread, NULL);
	wd.running = false;
}
