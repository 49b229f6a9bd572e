/*
 * test_dist_gpu: the sl_comm collectives on GPU buffers (run by check-gpu.sh on a GPU machine).
 *
 *   mpirun -np 1 test_dist_gpu --kind nccl               NCCL bootstrapped through MPI
 *   mpirun -np 2 test_dist_gpu --kind staged [--node-size N]
 *                                                        ranks sharing one GPU: MPI staged
 *                                                        through host memory (cudaMemcpy)
 *
 * The same checks as test_dist (test_dist_common.h) on cudaMalloc'ed buffers: topology, the
 * groups of both layouts, every collective in every dtype against closed forms.  NCCL refuses
 * two ranks on one GPU, so --kind nccl needs a GPU per rank of the node.
 */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_dist_common.h"

#define CUDA_CHECK(call)                                                                      \
	do {                                                                                  \
		cudaError_t e_ = (call);                                                      \
		if (e_ != cudaSuccess)                                                        \
			sl_dist_fatal("CUDA", #call, cudaGetErrorString(e_), __FILE__,        \
				      __LINE__);                                              \
	} while (0)

static void *gpu_alloc(size_t b)
{
	void *p;

	CUDA_CHECK(cudaMalloc(&p, b ? b : 1));
	return p;
}

static void gpu_free(void *p)
{
	CUDA_CHECK(cudaFree(p));
}

/* a pageable copy to the device may return before its DMA ends; NCCL's stream must see it */
static void gpu_put(void *dev, const void *host, size_t b)
{
	CUDA_CHECK(cudaMemcpy(dev, host, b, cudaMemcpyHostToDevice));
	CUDA_CHECK(cudaDeviceSynchronize());
}

static void gpu_get(void *host, const void *dev, size_t b)
{
	CUDA_CHECK(cudaMemcpy(host, dev, b, cudaMemcpyDeviceToHost));
}

/* NCCL work runs on its own streams too: wait for all of it */
static void gpu_sync(void)
{
	CUDA_CHECK(cudaDeviceSynchronize());
}

static const struct tmem gpu_mem = { "gpu", gpu_alloc, gpu_free, gpu_put, gpu_get, gpu_sync };

/* the staged communicator's copies, counted to show it stages */
static long n_copies;

static void stage_to_host(void *ctx, void *host, const void *dev, size_t b)
{
	CUDA_CHECK(cudaMemcpy(host, dev, b, cudaMemcpyDeviceToHost));
	n_copies++;
}

static void stage_to_device(void *ctx, void *dev, const void *host, size_t b)
{
	CUDA_CHECK(cudaMemcpy(dev, host, b, cudaMemcpyHostToDevice));
	CUDA_CHECK(cudaDeviceSynchronize());
	n_copies++;
}

static void stage_sync(void *ctx)
{
	CUDA_CHECK(cudaDeviceSynchronize());
}

static const struct sl_comm_copy gpu_copy = { NULL, stage_to_host, stage_to_device, stage_sync };

int main(int argc, char **argv)
{
	enum sl_comm_kind kind = SL_COMM_MPI_STAGED;
	struct sl_dist d;
	cudaStream_t stream;
	int node_size = 0, n_dev = 0, dev, *node_of, ret;
	char setup[96];

	if (sl_dist_init(&d, &argc, &argv))
		sl_dist_abort("test_dist_gpu: sl_dist_init failed");
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--node-size") && i + 1 < argc)
			node_size = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--kind") && i + 1 < argc && !strcmp(argv[i + 1], "nccl"))
			kind = SL_COMM_NCCL, i++;
		else if (!strcmp(argv[i], "--kind") && i + 1 < argc &&
			 !strcmp(argv[i + 1], "staged"))
			kind = SL_COMM_MPI_STAGED, i++;
		else
			sl_dist_abort("usage: test_dist_gpu [--kind nccl|staged] [--node-size N]");
	}
	if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev < 1)
		sl_dist_abort("test_dist_gpu: no GPU visible; run it on a GPU machine");
	if (kind == SL_COMM_NCCL && d.hw_local_size > n_dev)
		sl_dist_abort("test_dist_gpu: NCCL needs one GPU per rank, and this node has more "
			      "ranks than GPUs; use --kind staged");
	dev = sl_dist_device(&d, n_dev);
	CUDA_CHECK(cudaSetDevice(dev));
	if (node_size && sl_dist_set_node_size(&d, node_size))
		sl_dist_abort("test_dist_gpu: bad --node-size");
	snprintf(setup, sizeof(setup), ", %s, %d GPU(s)%s", kind == SL_COMM_NCCL ? "nccl" : "staged",
		 n_dev, node_size ? ", node size set" : "");

	node_of = malloc(d.world * sizeof(int));
	texpected_nodes(d.world, node_size, node_of);
	tcheck_topology(&d, node_of);
	CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
	for (int by_node = 0; by_node < 2; by_node++) {
		struct sl_groups g;
		long copies = n_copies;

		ret = sl_groups_create(&g, &d, by_node, kind, &gpu_copy);
		CHECK(ret == 0, "groups (%s): rc %d", by_node ? "node" : "world", ret);
		if (ret)
			continue;
		tcheck_groups(&g, &d, by_node, node_of);
		/* the world group on a stream of its own, the others on the default stream */
		g.world.stream = stream;
		tcheck_collectives(by_node ? &g.shard : &g.world, &gpu_mem);
		tcheck_collectives(&g.replica, &gpu_mem);
		/* the expert dispatch's all-to-all (ncclSend / ncclRecv, or staged) */
		tcheck_all_to_all(by_node ? &g.shard : &g.world, &gpu_mem);
		if (kind == SL_COMM_MPI_STAGED)
			CHECK(n_copies > copies, "the staged communicator made no copies");
		else
			CHECK(n_copies == copies, "NCCL used the staging copies");
		sl_groups_destroy(&g);
	}
	CUDA_CHECK(cudaStreamDestroy(stream));

	free(node_of);
	ret = tverdict("test_dist_gpu", &d, setup);
	sl_dist_finalize(&d);
	return ret;
}
