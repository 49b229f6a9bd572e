/*
 * train_backend: the job's backend (cpu, or cuda and the collectives that go with it), the GPU
 * log of each node, and the cuda backend's extras (peak and reserved memory, its stream, the
 * GPU's memory), which a build without CUDA does not have.
 */
#define _GNU_SOURCE
#include "sl_build.h"
#include "train_impl.h"

#include <mpi.h>
#include <stdlib.h>

#include "log.h"
#ifdef SL_HAVE_CUDA
#include "sl_cuda.h"
#endif

/* The cuda backend's extras; a build without CUDA has none of them. */
void train_gpu_reset_peak(struct job *j)
{
#ifdef SL_HAVE_CUDA
	if (j->cuda)
		sl_backend_cuda_reset_peak(j->be);
#endif
}

double train_gpu_peak(struct job *j)
{
#ifdef SL_HAVE_CUDA
	if (j->cuda)
		return (double)sl_backend_cuda_peak_bytes(j->be);
#endif
	return 0;
}

/* the arena's reserved bytes and the device's used bytes (what the driver reports) */
void train_gpu_reserved(struct job *j, double *reserved, double *used)
{
	*reserved = *used = 0;
#ifdef SL_HAVE_CUDA
	if (j->cuda) {
		*reserved = (double)sl_backend_cuda_reserved_bytes(j->be);
		*used = (double)sl_cuda_device_used();
	}
#endif
}

void *train_gpu_stream(struct job *j)
{
#ifdef SL_HAVE_CUDA
	if (j->cuda)
		return sl_backend_cuda_stream(j->be);
#endif
	return NULL;
}

double train_gpu_memory(struct job *j)
{
#ifdef SL_HAVE_CUDA
	if (j->cuda)
		return (double)sl_cuda_device_memory(j->device);
#endif
	return 0;
}

#ifdef SL_HAVE_CUDA
static void staged_to_host(void *ctx, void *host, const void *dev, size_t bytes)
{
	struct sl_backend *be = ctx;

	be->download(be, host, dev, bytes);
}

static void staged_to_device(void *ctx, void *dev, const void *host, size_t bytes)
{
	struct sl_backend *be = ctx;

	be->upload(be, dev, host, bytes);
}

static void staged_sync(void *ctx)
{
	struct sl_backend *be = ctx;

	be->sync(be);
}
#endif

/*
 * The backend, and the collectives that go with it: MPI on host buffers for the cpu backend;
 * for cuda, NCCL when every rank of the node has a GPU of its own, else (several ranks sharing
 * a GPU, as in tests) MPI staged through host memory, since NCCL refuses two ranks on one device.
 */
int train_create_backend(struct job *j)
{
	j->comm_kind = SL_COMM_MPI;
	if (j->c->backend == SL_BACKEND_CPU) {
		j->be = sl_backend_cpu_create();
		return j->be ? 0 : -1;
	}
#ifdef SL_HAVE_CUDA
	int n = sl_cuda_device_count();

	if (n == 0) {
		sl_error("backend: cuda, but no GPU is visible to this rank (CUDA_VISIBLE_DEVICES, "
			 "the Slurm --gpus request?)");
		return -1;
	}
	j->device = sl_dist_device(&j->d, n);
	j->be = sl_backend_cuda_create(j->device);
	if (!j->be)
		return -1;
	sl_backend_cuda_set_deterministic(j->be, j->c->train.deterministic);
	j->cuda = true;
	j->copy = (struct sl_comm_copy){ .ctx = j->be, .to_host = staged_to_host,
					 .to_device = staged_to_device, .sync = staged_sync };
	j->comm_kind = j->d.hw_local_size > n ? SL_COMM_MPI_STAGED : SL_COMM_NCCL;
	sl_log("backend cuda: %d rank(s) on this node, %d GPU(s); collectives through %s",
	       j->d.hw_local_size, n, j->comm_kind == SL_COMM_NCCL ? "NCCL" :
	       "MPI staged through host memory (ranks share GPUs)");
	return 0;
#else
	return -1;
#endif
}

/* The GPU log on each node's first rank: the GPUs this node's ranks use, by PCI bus id. */
void train_start_gpu_log(struct job *j)
{
	char mine[64] = "", *all = NULL;
	const char **ids = NULL;
	int n = 0;

	if (j->cuda) {
		MPI_Comm hw;

#ifdef SL_HAVE_CUDA
		sl_cuda_pci_bus_id(j->device, mine, sizeof(mine));
#endif
		/* the real node's ranks, whatever parallel.node_size pretends */
		MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, j->d.rank, MPI_INFO_NULL,
				    &hw);
		if (j->d.hw_local_rank == 0)
			all = calloc(j->d.hw_local_size, sizeof(mine));
		MPI_Gather(mine, sizeof(mine), MPI_CHAR, all, sizeof(mine), MPI_CHAR, 0, hw);
		MPI_Comm_free(&hw);
		n = j->d.hw_local_size;
		ids = calloc(n, sizeof(*ids));
		for (int i = 0; all && i < n; i++)
			ids[i] = all + i * sizeof(mine);
	}
	/* the cpu backend uses no GPU: then the node's GPUs, if any, are sampled for reference */
	if (j->d.hw_local_rank == 0)
		j->gpulog = sl_gpulog_start(j->c->gpu_log.file, j->c->gpu_log.every_s,
					    j->cuda ? ids : NULL, j->cuda ? n : 0);
	free(ids);
	free(all);
}
