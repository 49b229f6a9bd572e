/*
 * test_dist_common.h: the checks test_dist (host and fake-device buffers) and test_dist_gpu (CUDA
 * buffers) share: node topology and group membership against expectations worked out here from
 * the host names or the node size alone, and every collective in every dtype against closed forms.
 *
 * Values: rank r of a group of n contributes v(r, i) = r + 1 + b(i) at index i (b(i) = i, or
 * i % 16 for bf16 so that every sum is a small integer, exact in bf16), plus (r + 1) * 2^33 for
 * i64 (needs 64 bits) and 2^-30 for f64 (lost in a float).  The sum over the group is then
 * n (b(i) + 1) + n (n - 1) / 2, plus 2^33 n (n + 1) / 2 for i64 and n 2^-30 for f64.  Integers
 * are negated: small positive int64s read as doubles are denormals, which add like integers and
 * would hide a sum in the wrong MPI type; negative ones read as NaNs.
 */
#ifndef SL_TEST_DIST_COMMON_H
#define SL_TEST_DIST_COMMON_H

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dist.h"
#include "testutil.h"

/* How a test reaches the buffers a communicator works on ("device" memory). */
struct tmem {
	const char *name;
	void *(*alloc)(size_t bytes);
	void (*free)(void *p);
	void (*put)(void *dev, const void *host, size_t bytes);
	void (*get)(void *host, const void *dev, size_t bytes);
	void (*sync)(void);	/* a collective's results are visible after this */
};

static const enum sl_comm_dtype tdtypes[] = {
	SL_COMM_F32, SL_COMM_BF16, SL_COMM_F64, SL_COMM_I32, SL_COMM_I64
};
static const char *const tdtype_names[] = { "f32", "bf16", "f64", "i32", "i64" };

/* uneven counts, a prime, and one large enough for MPI's large-message algorithms */
static const size_t tcounts[] = { 1, 7, 1001, 100003 };

#define T2_33 8589934592.0
#define T2_M30 (1.0 / 1073741824.0)

static double tv_base(enum sl_comm_dtype t, size_t i)
{
	return t == SL_COMM_BF16 ? (double)(i % 16) : (double)i;
}

static double tv(enum sl_comm_dtype t, int r, size_t i)
{
	double v = r + 1 + tv_base(t, i);

	if (t == SL_COMM_I64)
		v += T2_33 * (r + 1);
	if (t == SL_COMM_F64)
		v += T2_M30;
	return t == SL_COMM_I32 || t == SL_COMM_I64 ? -v : v;
}

static double tv_sum(enum sl_comm_dtype t, int n, size_t i)
{
	double s = n * (tv_base(t, i) + 1) + n * (n - 1) / 2.0;

	if (t == SL_COMM_I64)
		s += T2_33 * n * (n + 1) / 2.0;
	if (t == SL_COMM_F64)
		s += n * T2_M30;
	return t == SL_COMM_I32 || t == SL_COMM_I64 ? -s : s;
}

/* The test's own bf16: every value it stores is exact in bf16, so the top 16 bits are it. */
static uint16_t tbf16(float f)
{
	uint32_t u;

	memcpy(&u, &f, sizeof(u));
	return (uint16_t)(u >> 16);
}

static float tbf16_to_f32(uint16_t h)
{
	uint32_t u = (uint32_t)h << 16;
	float f;

	memcpy(&f, &u, sizeof(f));
	return f;
}

static void tput(void *buf, enum sl_comm_dtype t, size_t i, double v)
{
	switch (t) {
	case SL_COMM_F32: ((float *)buf)[i] = (float)v; break;
	case SL_COMM_BF16: ((uint16_t *)buf)[i] = tbf16((float)v); break;
	case SL_COMM_F64: ((double *)buf)[i] = v; break;
	case SL_COMM_I32: ((int32_t *)buf)[i] = (int32_t)v; break;
	case SL_COMM_I64: ((int64_t *)buf)[i] = (int64_t)v; break;
	}
}

static double tget(const void *buf, enum sl_comm_dtype t, size_t i)
{
	switch (t) {
	case SL_COMM_F32: return ((const float *)buf)[i];
	case SL_COMM_BF16: return tbf16_to_f32(((const uint16_t *)buf)[i]);
	case SL_COMM_F64: return ((const double *)buf)[i];
	case SL_COMM_I32: return ((const int32_t *)buf)[i];
	case SL_COMM_I64: return (double)((const int64_t *)buf)[i];
	}
	return 0;
}

/* One CHECK per case: the number of wrong elements and the first of them. */
struct tdiff {
	size_t bad, at;
	double got, want;
};

static void tcompare(struct tdiff *df, double got, double want, size_t at)
{
	if (got == want)
		return;
	if (!df->bad++) {
		df->at = at;
		df->got = got;
		df->want = want;
	}
}

#define TCHECK_CASE(rc, df, c, what, t, count)                                               \
	CHECK((rc) == 0 && (df).bad == 0,                                                     \
	      "%s %s count %zu (group rank %d of %d): rc %d, %zu wrong, first [%zu] = %.17g, " \
	      "expected %.17g", what, tdtype_names[t], count, (c)->rank, (c)->size, rc,       \
	      (df).bad, (df).at, (df).got, (df).want)

/* @split: sl_comm_all_gather_start, then sl_comm_wait (MPI_Iallgather; NCCL on a side stream) */
static void tcheck_all_gather(struct sl_comm *c, const struct tmem *m, enum sl_comm_dtype t,
			      size_t count, bool in_place, bool split)
{
	size_t es = sl_comm_dtype_size(t), n = c->size, cb = count * es;
	char *h = malloc(n * cb), *dr = m->alloc(n * cb), *ds;
	struct tdiff df = { 0 };
	int rc;

	for (size_t i = 0; i < count; i++)
		tput(h, t, i, tv(t, c->rank, i));
	ds = in_place ? dr + c->rank * cb : m->alloc(cb);
	m->put(ds, h, cb);
	if (split) {
		rc = sl_comm_all_gather_start(c, dr, ds, count, t);
		if (!rc)
			rc = sl_comm_wait(c);
	} else {
		rc = sl_comm_all_gather(c, dr, ds, count, t);
	}
	m->sync();
	m->get(h, dr, n * cb);
	for (size_t j = 0; j < n; j++)
		for (size_t i = 0; i < count; i++)
			tcompare(&df, tget(h, t, j * count + i), tv(t, (int)j, i), j * count + i);
	TCHECK_CASE(rc, df, c, split ? (in_place ? "split all-gather in place" : "split all-gather") :
		    in_place ? "all-gather in place" : "all-gather", t, count);
	if (!in_place)
		m->free(ds);
	m->free(dr);
	free(h);
}

static void tcheck_reduce_scatter(struct sl_comm *c, const struct tmem *m, enum sl_comm_dtype t,
				  size_t count, bool in_place)
{
	size_t es = sl_comm_dtype_size(t), n = c->size, cb = count * es;
	char *h = malloc(n * cb), *ds = m->alloc(n * cb), *dr;
	struct tdiff df = { 0 };
	int rc;

	for (size_t i = 0; i < n * count; i++)
		tput(h, t, i, tv(t, c->rank, i));
	m->put(ds, h, n * cb);
	dr = in_place ? ds + c->rank * cb : m->alloc(cb);
	rc = sl_comm_reduce_scatter(c, dr, ds, count, t);
	m->sync();
	m->get(h, dr, cb);
	for (size_t i = 0; i < count; i++)
		tcompare(&df, tget(h, t, i), tv_sum(t, (int)n, c->rank * count + i), i);
	TCHECK_CASE(rc, df, c, in_place ? "reduce-scatter in place" : "reduce-scatter", t, count);
	if (!in_place)
		m->free(dr);
	m->free(ds);
	free(h);
}

static void tcheck_all_reduce(struct sl_comm *c, const struct tmem *m, enum sl_comm_dtype t,
			      size_t count)
{
	size_t cb = count * sl_comm_dtype_size(t);
	char *h = malloc(cb), *d = m->alloc(cb);
	struct tdiff df = { 0 };
	int rc;

	for (size_t i = 0; i < count; i++)
		tput(h, t, i, tv(t, c->rank, i));
	m->put(d, h, cb);
	rc = sl_comm_all_reduce(c, d, count, t);
	m->sync();
	m->get(h, d, cb);
	for (size_t i = 0; i < count; i++)
		tcompare(&df, tget(h, t, i), tv_sum(t, c->size, i), i);
	TCHECK_CASE(rc, df, c, "all-reduce", t, count);
	m->free(d);
	free(h);
}

static void tcheck_broadcast(struct sl_comm *c, const struct tmem *m, enum sl_comm_dtype t,
			     size_t count, int root)
{
	size_t cb = count * sl_comm_dtype_size(t);
	char *h = malloc(cb), *d = m->alloc(cb);
	struct tdiff df = { 0 };
	char what[64];
	int rc;

	for (size_t i = 0; i < count; i++)
		tput(h, t, i, c->rank == root ? tv(t, root, i) : -7);
	m->put(d, h, cb);
	rc = sl_comm_broadcast(c, d, count, t, root);
	m->sync();
	m->get(h, d, cb);
	for (size_t i = 0; i < count; i++)
		tcompare(&df, tget(h, t, i), tv(t, root, i), i);
	snprintf(what, sizeof(what), "broadcast from %d", root);
	TCHECK_CASE(rc, df, c, what, t, count);
	m->free(d);
	free(h);
}

/*
 * bf16 rounding, by hand (bf16 keeps 8 significant bits; ties go to the even last bit):
 *   256 + 1     = 257:   between 256 (last bit 0) and 258 (1), a tie -> 256
 *   256 + 3     = 259:   between 258 (1) and 260 (0), a tie          -> 260
 *   256 + 1.5   = 257.5: nearer 258                                  -> 258
 *   1 + 2^-8:            between 1 (0) and 1 + 2^-7 (1), a tie      -> 1
 *   1 + 2^-7 + 2^-8:     between 1 + 2^-7 (1) and 1 + 2^-6 (0), tie -> 1 + 2^-6
 * Two ranks only: with more, the order of the additions would matter.
 */
static void tcheck_bf16_rounding(struct sl_comm *c, const struct tmem *m)
{
	static const float a[5] = { 256, 256, 256, 1, 1 + 0x1p-7f };
	static const float b[5] = { 1, 3, 1.5f, 0x1p-8f, 0x1p-8f };
	static const float want[5] = { 256, 260, 258, 1, 1 + 0x1p-6f };
	uint16_t h[5], *d = m->alloc(sizeof(h));
	struct tdiff df = { 0 };
	int rc;

	for (int i = 0; i < 5; i++)
		h[i] = tbf16(c->rank == 0 ? a[i] : b[i]);
	m->put(d, h, sizeof(h));
	rc = sl_comm_all_reduce(c, d, 5, SL_COMM_BF16);
	m->sync();
	m->get(h, d, sizeof(h));
	for (int i = 0; i < 5; i++)
		tcompare(&df, tbf16_to_f32(h[i]), want[i], i);
	TCHECK_CASE(rc, df, c, "bf16 rounding all-reduce", SL_COMM_BF16, (size_t)5);
	m->free(d);
}

/*
 * sl_comm_all_to_all_rows over @c, buffers of @m: rank r sends (r + 2q) % 3 rows of 5 bytes to
 * rank q, row i's bytes naming (sender, receiver, i, byte); each rank must find every rank's
 * rows in rank order.
 */
static void tcheck_all_to_all(struct sl_comm *c, const struct tmem *m)
{
	const int n = c->size, r = c->rank, R = 5;
	int *sc = malloc(2 * sizeof(int) * n), *rc_ = sc + n, ns = 0, nr = 0, off = 0, rc;
	unsigned char *h, *want, *p, *send, *recv;

	for (int q = 0; q < n; q++) {
		sc[q] = (r + 2 * q) % 3;
		rc_[q] = (q + 2 * r) % 3;	/* what q sends r */
		ns += sc[q];
		nr += rc_[q];
	}
	h = malloc((ns > nr ? ns : nr) * R + 1);
	p = want = malloc(nr * R + 1);
	send = m->alloc(ns * R + 1);
	recv = m->alloc(nr * R + 1);
	for (int q = 0; q < n; q++)
		for (int i = 0; i < sc[q]; i++, off++)
			for (int b = 0; b < R; b++)
				h[off * R + b] = (unsigned char)(r * 37 + q * 11 + i * 3 + b);
	for (int q = 0; q < n; q++)
		for (int i = 0; i < rc_[q]; i++)
			for (int b = 0; b < R; b++)
				*p++ = (unsigned char)(q * 37 + r * 11 + i * 3 + b);
	m->put(send, h, ns * R);
	rc = sl_comm_all_to_all_rows(c, send, sc, recv, rc_, R);
	m->sync();
	m->get(h, recv, nr * R);
	CHECK(rc == 0 && memcmp(h, want, nr * R) == 0,
	      "all-to-all (%s, %d ranks): rank %d received other rows (rc %d)", m->name, n, r, rc);
	m->free(send);
	m->free(recv);
	free(h);
	free(want);
	free(sc);
}

/* Every collective, dtype and count over @c. */
static void tcheck_collectives(struct sl_comm *c, const struct tmem *m)
{
	for (size_t k = 0; k < sizeof(tdtypes) / sizeof(tdtypes[0]); k++) {
		enum sl_comm_dtype t = tdtypes[k];

		for (size_t j = 0; j < sizeof(tcounts) / sizeof(tcounts[0]); j++) {
			size_t count = tcounts[j];
			int roots[3] = { 0, c->size / 2, c->size - 1 };

			tcheck_all_gather(c, m, t, count, false, false);
			tcheck_all_gather(c, m, t, count, true, false);
			tcheck_all_gather(c, m, t, count, false, true);
			tcheck_all_gather(c, m, t, count, true, true);
			tcheck_reduce_scatter(c, m, t, count, false);
			tcheck_reduce_scatter(c, m, t, count, true);
			tcheck_all_reduce(c, m, t, count);
			for (int r = 0; r < 3; r++)
				if (r == 0 || roots[r] != roots[r - 1])
					tcheck_broadcast(c, m, t, count, roots[r]);
		}
	}
	if (c->size == 2)
		tcheck_bf16_rounding(c, m);
}

/*
 * The node of every world rank, worked out without dist: with @node_size, consecutive blocks of
 * that many ranks; else the ranks with the same host name, nodes numbered in the order of their
 * lowest rank.  @node_of has world entries.
 */
static void texpected_nodes(int world, int node_size, int *node_of)
{
	char host[256] = "", *all;
	int n_nodes = 0;

	if (node_size > 0) {
		for (int q = 0; q < world; q++)
			node_of[q] = q / node_size;
		return;
	}
	gethostname(host, sizeof(host) - 1);
	all = calloc(world, sizeof(host));
	MPI_Allgather(host, sizeof(host), MPI_CHAR, all, sizeof(host), MPI_CHAR, MPI_COMM_WORLD);
	for (int q = 0; q < world; q++) {
		node_of[q] = -1;
		for (int p = 0; p < q; p++)
			if (!strcmp(all + p * sizeof(host), all + q * sizeof(host))) {
				node_of[q] = node_of[p];
				break;
			}
		if (node_of[q] < 0)
			node_of[q] = n_nodes++;
	}
	free(all);
}

/* the place of @q among the ranks of its node */
static int tlocal_rank(const int *node_of, int q)
{
	int l = 0;

	for (int p = 0; p < q; p++)
		l += node_of[p] == node_of[q];
	return l;
}

/* The members of @comm (their world ranks, in group order) against @want (@n of them). */
static void tcheck_members(MPI_Comm comm, const char *what, const int *want, int n)
{
	int size, rank, wrank, *got;
	int bad = 0;

	MPI_Comm_size(comm, &size);
	MPI_Comm_rank(comm, &rank);
	MPI_Comm_rank(MPI_COMM_WORLD, &wrank);
	CHECK(size == n, "%s: world rank %d sees %d members, expected %d", what, wrank, size, n);
	if (size != n)
		return;
	got = malloc(n * sizeof(int));
	MPI_Allgather(&wrank, 1, MPI_INT, got, 1, MPI_INT, comm);
	for (int i = 0; i < n; i++)
		bad += got[i] != want[i];
	CHECK(!bad, "%s: world rank %d: members differ (first expected %d, got %d)", what, wrank,
	      want[0], got[0]);
	free(got);
}

/* struct sl_dist's topology against @node_of. */
static void tcheck_topology(const struct sl_dist *d, const int *node_of)
{
	int r = d->rank, size = 0, n_nodes = 0, *members = malloc(d->world * sizeof(int));

	for (int q = 0; q < d->world; q++) {
		if (node_of[q] == node_of[r])
			members[size++] = q;
		if (node_of[q] + 1 > n_nodes)
			n_nodes = node_of[q] + 1;
	}
	CHECK(d->node == node_of[r], "rank %d: node %d, expected %d", r, d->node, node_of[r]);
	CHECK(d->n_nodes == n_nodes, "rank %d: %d nodes, expected %d", r, d->n_nodes, n_nodes);
	CHECK(d->local_rank == tlocal_rank(node_of, r), "rank %d: local rank %d, expected %d", r,
	      d->local_rank, tlocal_rank(node_of, r));
	CHECK(d->local_size == size, "rank %d: local size %d, expected %d", r, d->local_size, size);
	tcheck_members(d->node_comm, "node_comm", members, size);
	free(members);
}

/*
 * The groups against @node_of: shard = all ranks (FSDP) or the rank's node (HSDP); replica = the
 * rank alone (FSDP) or the ranks with its local rank, one per node, in node order (HSDP).
 */
static void tcheck_groups(const struct sl_groups *g, const struct sl_dist *d, bool by_node,
			  const int *node_of)
{
	int w = d->world, r = d->rank, n = 0, *want = malloc(w * sizeof(int));
	int lr = tlocal_rank(node_of, r);
	const struct sl_comm *cs[3] = { &g->world, &g->shard, &g->replica };
	const char *names[3] = { "world group", "shard group", "replica group" };

	for (int k = 0; k < 3; k++) {
		int me = -1;

		n = 0;
		for (int q = 0; q < w; q++) {
			bool in = k == 0 || (k == 1 && (!by_node || node_of[q] == node_of[r]));
			if (in)
				want[n++] = q;
		}
		if (k == 2 && !by_node) {
			want[0] = r;
			n = 1;
		} else if (k == 2) {
			/* one member per node, node order */
			for (int node = 0; node < w; node++)
				for (int q = 0; q < w; q++)
					if (node_of[q] == node && tlocal_rank(node_of, q) == lr)
						want[n++] = q;
		}
		for (int i = 0; i < n; i++)
			if (want[i] == r)
				me = i;
		CHECK(cs[k]->size == n && cs[k]->rank == me,
		      "%s (%s): rank %d is %d of %d, expected %d of %d", names[k],
		      by_node ? "node" : "world", r, cs[k]->rank, cs[k]->size, me, n);
		tcheck_members(cs[k]->mpi, names[k], want, n);
	}
	free(want);
}

/* Every rank's failures summed: the verdict is the same on all ranks. */
static int tverdict(const char *name, const struct sl_dist *d, const char *setup)
{
	int f = test_failures, c = test_checks, fall = 0, call = 0;

	MPI_Allreduce(&f, &fall, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
	MPI_Allreduce(&c, &call, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
	if (d->rank == 0)
		printf("%s: %d ranks%s: %d checks, %d failed\n", name, d->world, setup, call, fall);
	fflush(stdout);
	return fall ? 1 : 0;
}

#endif
