/*
 * test_dist: src/dist under mpirun -np N (any N), on host buffers.
 *
 *   test_dist [--node-size N]   topology (detected, then pretended nodes of N ranks), the
 *                               groups of both layouts, every collective in every dtype over
 *                               SL_COMM_MPI and SL_COMM_MPI_STAGED, and the errors
 *   test_dist --abort           the last rank calls sl_dist_abort: the job must end (exit != 0)
 *   test_dist --fatal           the last rank reports a failed library call (sl_dist_fatal)
 *
 * The staged communicator works on fake "device" memory: bytes stored XOR 0x5a, reachable only
 * through the copy callbacks (which count their calls).  MPI handed such a buffer directly would
 * sum garbage, so right answers prove the staging.  Expected values: test_dist_common.h.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "sl_build.h"
#include "test_dist_common.h"

/* ---- memory: host, and the fake device ------------------------------------------------------ */

static void *host_alloc(size_t b)
{
	return malloc(b ? b : 1);
}

static void host_copy(void *dst, const void *src, size_t b)
{
	memcpy(dst, src, b);
}

static void no_sync(void)
{
}

static const struct tmem host_mem = {
	"host", host_alloc, free, host_copy, host_copy, no_sync
};

#define FAKE_KEY 0x5a

static void xor_copy(void *dst, const void *src, size_t b)
{
	unsigned char *o = dst;
	const unsigned char *s = src;

	for (size_t i = 0; i < b; i++)
		o[i] = s[i] ^ FAKE_KEY;
}

static const struct tmem fake_mem = {
	"fake device", host_alloc, free, xor_copy, xor_copy, no_sync
};

struct fake_counts {
	long to_host, to_device, sync;
	size_t host_bytes, device_bytes;
};

static void fake_to_host(void *ctx, void *host, const void *dev, size_t b)
{
	struct fake_counts *f = ctx;

	xor_copy(host, dev, b);
	f->to_host++;
	f->host_bytes += b;
}

static void fake_to_device(void *ctx, void *dev, const void *host, size_t b)
{
	struct fake_counts *f = ctx;

	xor_copy(dev, host, b);
	f->to_device++;
	f->device_bytes += b;
}

static void fake_sync(void *ctx)
{
	((struct fake_counts *)ctx)->sync++;
}

static struct fake_counts fake;
static const struct sl_comm_copy fake_copy = { &fake, fake_to_host, fake_to_device, fake_sync };

/* ---- stderr capture, for the error messages ------------------------------------------------- */

static FILE *cap_file;
static int cap_saved = -1;

static void capture_begin(void)
{
	fflush(stderr);
	cap_file = tmpfile();
	cap_saved = dup(2);
	dup2(fileno(cap_file), 2);
}

static void capture_end(char *buf, size_t n)
{
	size_t k;

	fflush(stderr);
	dup2(cap_saved, 2);
	close(cap_saved);
	rewind(cap_file);
	k = fread(buf, 1, n - 1, cap_file);
	buf[k] = 0;
	fclose(cap_file);
}

/* ---- the tests ------------------------------------------------------------------------------ */

static void test_staged_copies(const struct sl_dist *d)
{
	struct sl_comm c;
	char *buf = malloc(4 * 13 * d->world);
	int rc, n = d->world;

	rc = sl_comm_create(&c, MPI_COMM_WORLD, 0, d->rank, SL_COMM_MPI_STAGED, &fake_copy);
	CHECK(rc == 0, "staged communicator: rc %d", rc);
	if (rc)
		goto out_free_buf;
	memset(buf, 0, 4 * 13 * n);

	memset(&fake, 0, sizeof(fake));
	sl_comm_all_reduce(&c, buf, 13, SL_COMM_F32);
	CHECK(fake.to_host == 1 && fake.to_device == 1 && fake.sync >= 1 &&
	      fake.host_bytes == 52 && fake.device_bytes == 52,
	      "staged all-reduce: %ld up (%zu B), %ld down (%zu B), %ld syncs; expected 1 (52 B), "
	      "1 (52 B), >= 1", fake.to_host, fake.host_bytes, fake.to_device, fake.device_bytes,
	      fake.sync);

	memset(&fake, 0, sizeof(fake));
	sl_comm_all_gather(&c, buf, buf, 13, SL_COMM_F32);
	CHECK(fake.to_host == 1 && fake.to_device == 1 && fake.host_bytes == 52 &&
	      fake.device_bytes == (size_t)52 * n,
	      "staged all-gather: %ld up (%zu B), %ld down (%zu B); expected 1 (52 B), 1 (%d B)",
	      fake.to_host, fake.host_bytes, fake.to_device, fake.device_bytes, 52 * n);

	memset(&fake, 0, sizeof(fake));
	sl_comm_reduce_scatter(&c, buf + 4 * 13 * d->rank, buf, 13, SL_COMM_F32);
	CHECK(fake.to_host == 1 && fake.to_device == 1 && fake.host_bytes == (size_t)52 * n &&
	      fake.device_bytes == 52,
	      "staged reduce-scatter: %ld up (%zu B), %ld down (%zu B); expected 1 (%d B), 1 (52 B)",
	      fake.to_host, fake.host_bytes, fake.to_device, fake.device_bytes, 52 * n);

	memset(&fake, 0, sizeof(fake));
	sl_comm_broadcast(&c, buf, 13, SL_COMM_F32, n - 1);
	if (d->rank == n - 1)
		CHECK(fake.to_host == 1 && fake.to_device == 0,
		      "staged broadcast, root: %ld up, %ld down; expected 1, 0", fake.to_host,
		      fake.to_device);
	else
		CHECK(fake.to_host == 0 && fake.to_device == 1,
		      "staged broadcast, not root: %ld up, %ld down; expected 0, 1", fake.to_host,
		      fake.to_device);

	/* nothing to move, nothing copied */
	memset(&fake, 0, sizeof(fake));
	rc = sl_comm_all_reduce(&c, buf, 0, SL_COMM_F32);
	CHECK(rc == 0 && fake.to_host == 0 && fake.to_device == 0,
	      "staged all-reduce of 0 elements: rc %d, %ld copies", rc,
	      fake.to_host + fake.to_device);
	sl_comm_destroy(&c);
out_free_buf:
	free(buf);
}

/*
 * sl_comm_all_to_all_rows on host memory (MPI) and the fake device (staged: one copy each way),
 * and a bad count's error
 */
static void test_all_to_all(const struct sl_dist *d)
{
	static const enum sl_comm_kind kinds[2] = { SL_COMM_MPI, SL_COMM_MPI_STAGED };

	for (int k = 0; k < 2; k++) {
		const struct tmem *m = kinds[k] == SL_COMM_MPI ? &host_mem : &fake_mem;
		struct sl_comm c;
		int rc = sl_comm_create(&c, MPI_COMM_WORLD, 0, d->rank, kinds[k], &fake_copy);

		CHECK(rc == 0, "all-to-all communicator (%s): rc %d", m->name, rc);
		if (rc)
			continue;
		memset(&fake, 0, sizeof(fake));
		tcheck_all_to_all(&c, m);
		if (kinds[k] == SL_COMM_MPI_STAGED)
			CHECK(fake.to_host == 1 && fake.to_device == 1,
			      "staged all-to-all: %ld copies up, %ld down; expected 1, 1",
			      fake.to_host, fake.to_device);
		if (d->world == 1) {
			int bad = -1;
			char msg[256];

			capture_begin();
			rc = sl_comm_all_to_all_rows(&c, NULL, &bad, NULL, &bad, 5);
			capture_end(msg, sizeof(msg));
			CHECK(rc < 0 && strstr(msg, "bad row counts"),
			      "all-to-all with a negative count: rc %d, message '%s'", rc, msg);
		}
		sl_comm_destroy(&c);
	}
}

/* Bad arguments are errors that say what is wrong, never hangs or crashes. */
static void test_arg_errors(const struct sl_dist *d)
{
	struct sl_comm c;
	char msg[4096];
	float x = 0;
	int rc;

	capture_begin();
	rc = sl_comm_create(&c, MPI_COMM_WORLD, 0, d->rank, SL_COMM_MPI_STAGED, NULL);
	capture_end(msg, sizeof(msg));
	CHECK(rc < 0 && strstr(msg, "to_host"), "staged without copies: rc %d, message '%s'", rc,
	      msg);

	capture_begin();
	rc = sl_comm_create(&c, MPI_COMM_WORLD, -1, d->rank, SL_COMM_MPI, NULL);
	capture_end(msg, sizeof(msg));
	CHECK(rc < 0 && strstr(msg, "color -1"), "negative color: rc %d, message '%s'", rc, msg);

#ifndef SL_HAVE_CUDA
	capture_begin();
	rc = sl_comm_create(&c, MPI_COMM_WORLD, 0, d->rank, SL_COMM_NCCL, NULL);
	capture_end(msg, sizeof(msg));
	CHECK(rc == -ENOTSUP && strstr(msg, "--with-cuda"), "NCCL without CUDA: rc %d, '%s'", rc,
	      msg);
#endif

	rc = sl_comm_create(&c, MPI_COMM_WORLD, 0, d->rank, SL_COMM_MPI, NULL);
	CHECK(rc == 0, "world communicator: rc %d", rc);
	if (rc)
		return;
	capture_begin();
	rc = sl_comm_broadcast(&c, &x, 1, SL_COMM_F32, d->world);
	capture_end(msg, sizeof(msg));
	CHECK(rc == -EINVAL && strstr(msg, "root"), "broadcast root = size: rc %d, '%s'", rc, msg);

	capture_begin();
	rc = sl_comm_all_reduce(&c, &x, 1, (enum sl_comm_dtype)99);
	capture_end(msg, sizeof(msg));
	CHECK(rc == -EINVAL && strstr(msg, "dtype 99"), "unknown dtype: rc %d, '%s'", rc, msg);

	capture_begin();
	rc = sl_comm_all_reduce(&c, &x, (size_t)1 << 31, SL_COMM_F32);
	capture_end(msg, sizeof(msg));
	CHECK(rc < 0 && strstr(msg, "2147483648 elements"), "count over INT_MAX: rc %d, '%s'", rc,
	      msg);

	/* the communicator still works after the refusals */
	x = 1;
	rc = sl_comm_all_reduce(&c, &x, 1, SL_COMM_F32);
	CHECK(rc == 0 && x == d->world, "all-reduce after errors: rc %d, %g, expected %d", rc, x,
	      d->world);
	sl_comm_destroy(&c);
}

/* A node size that does not divide the world: an error naming both, and nothing changed. */
static void test_node_size_errors(struct sl_dist *d)
{
	struct sl_dist before = *d;
	char msg[4096], want[128];
	int rc;

	capture_begin();
	rc = sl_dist_set_node_size(d, d->world + 1);
	capture_end(msg, sizeof(msg));
	snprintf(want, sizeof(want), "parallel.node_size %d does not divide the world size %d",
		 d->world + 1, d->world);
	CHECK(rc == -EINVAL && strstr(msg, want), "node size %d: rc %d, message '%s'",
	      d->world + 1, rc, msg);
	CHECK(!memcmp(&before, d, sizeof(before)), "a refused node size changed struct sl_dist");

	capture_begin();
	rc = sl_dist_set_node_size(d, -2);
	capture_end(msg, sizeof(msg));
	CHECK(rc == -EINVAL && strstr(msg, "parallel.node_size -2"), "node size -2: rc %d, '%s'",
	      rc, msg);
}

static void test_layouts(struct sl_dist *d, const int *node_of)
{
	static const enum sl_comm_kind kinds[2] = { SL_COMM_MPI, SL_COMM_MPI_STAGED };

	for (int by_node = 0; by_node < 2; by_node++) {
		for (int k = 0; k < 2; k++) {
			const struct tmem *m = kinds[k] == SL_COMM_MPI ? &host_mem : &fake_mem;
			struct sl_groups g;
			int rc;

			rc = sl_groups_create(&g, d, by_node, kinds[k], &fake_copy);
			CHECK(rc == 0, "groups (%s): rc %d", by_node ? "node" : "world", rc);
			if (rc)
				continue;
			tcheck_groups(&g, d, by_node, node_of);
			/* FSDP's shard group has the world's members: its collectives once */
			tcheck_collectives(by_node ? &g.shard : &g.world, m);
			tcheck_collectives(&g.replica, m);
			sl_groups_destroy(&g);
		}
	}
}

int main(int argc, char **argv)
{
	struct sl_dist d;
	int node_size = 0, *node_of, ret;
	char setup[64] = "";

	if (sl_dist_init(&d, &argc, &argv))
		sl_dist_abort("test_dist: sl_dist_init failed");
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--node-size") && i + 1 < argc) {
			node_size = atoi(argv[++i]);
		} else if (!strcmp(argv[i], "--abort") || !strcmp(argv[i], "--fatal")) {
			/* the others wait forever unless the abort takes the whole job down */
			if (d.rank == d.world - 1 && !strcmp(argv[i], "--abort"))
				sl_dist_abort("test_dist: deliberate abort");
			if (d.rank == d.world - 1)
				sl_dist_fatal("NCCL", "ncclAllReduce(x)", "unhandled system error",
					      "test_dist.c", 42);
			MPI_Barrier(MPI_COMM_WORLD);
			return 0;
		} else {
			if (d.rank == 0)
				fprintf(stderr, "usage: test_dist [--node-size N | --abort | --fatal]\n");
			sl_dist_abort("test_dist: bad arguments");
		}
	}
	node_of = malloc(d.world * sizeof(int));

	/* detected: this machine's ranks share a host name */
	CHECK(d.host[0] != 0, "rank %d: no host name", d.rank);
	CHECK(!d.node_size_overridden, "node size overridden before any override");
	texpected_nodes(d.world, 0, node_of);
	tcheck_topology(&d, node_of);
	CHECK(d.hw_local_rank == d.local_rank && d.hw_local_size == d.local_size,
	      "rank %d: detected local rank %d/%d differs from local rank %d/%d", d.rank,
	      d.hw_local_rank, d.hw_local_size, d.local_rank, d.local_size);
	CHECK(sl_dist_device(&d, 1) == 0 && sl_dist_device(&d, 2) == d.hw_local_rank % 2,
	      "rank %d: device of 1 GPU %d, of 2 GPUs %d", d.rank, sl_dist_device(&d, 1),
	      sl_dist_device(&d, 2));
	test_node_size_errors(&d);

	if (node_size) {
		int hw = d.hw_local_rank;

		ret = sl_dist_set_node_size(&d, node_size);
		CHECK(ret == 0, "node size %d of %d ranks: rc %d", node_size, d.world, ret);
		CHECK(d.node_size_overridden && d.hw_local_rank == hw,
		      "after the override: overridden %d, detected local rank %d (was %d)",
		      d.node_size_overridden, d.hw_local_rank, hw);
		snprintf(setup, sizeof(setup), ", node size %d", node_size);
	}
	texpected_nodes(d.world, node_size, node_of);
	tcheck_topology(&d, node_of);
	test_layouts(&d, node_of);
	test_staged_copies(&d);
	test_all_to_all(&d);
	test_arg_errors(&d);

	/* 0 goes back to the detected nodes */
	ret = sl_dist_set_node_size(&d, 0);
	texpected_nodes(d.world, 0, node_of);
	CHECK(ret == 0 && !d.node_size_overridden, "node size 0: rc %d", ret);
	tcheck_topology(&d, node_of);

	free(node_of);
	ret = tverdict("test_dist", &d, setup);
	sl_dist_finalize(&d);
	return ret;
}
