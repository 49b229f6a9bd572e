/*
 * test_ckpt: the HDF5 checkpoint module against a hand-made layout.
 *
 * Three units with 1-D and 2-D tensors, alignment gaps inside units and tail padding, sized so
 * that shards of 2, 3 and 4 ranks split tensors mid-row.  Every stored value is a known function
 * of (set, tensor, element, step), so the expectations below never come from the code under test.
 * test_ckpt.sh drives the modes:
 *
 *   write ROOT STEP [opts]   collective: write step STEP under ROOT
 *   read ROOT [opts]         collective: read the newest complete checkpoint (or --dir DIR) and
 *                            check every element of every rank's shard
 *   latest ROOT              print the newest complete step ("none" if there is none)
 *   names                    print "/master/NAME Dataset {SHAPE}" per tensor (h5ls -r format)
 *   dumpcheck NAME SET STEP  parse `h5dump -m %.9g -d /SET/NAME index.h5` on stdin, check it
 *   flip FILE DATASET        alter one byte in the middle of DATASET's data in FILE
 *
 * options: --shard-size S (HSDP: ranks 0..S-1 write, rank % S is the shard index), --keep K,
 * --no-opt (weights only), --big-config (a config attribute over 64 KB), --expect-fail
 * (succeed when the call fails on this rank), --crash file:RANK (SIGKILL
 * RANK once its rank file is in place), --crash index (SIGKILL rank 0 once index.h5 is in place,
 * before COMPLETE), --step S (read: expected step), --dir DIR (read: this checkpoint).
 */
#include <errno.h>
#include <fcntl.h>
#include <hdf5.h>
#include <mpi.h>
#include <signal.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt.h"
#include "log.h"
#include "testutil.h"

/* ---- the layout ------------------------------------------------------------------------------ */

struct tdef {
	const char *name;
	int unit;
	size_t offset;
	int ndim;
	int64_t r, c;
};

/* gaps: unit 0 [35,38) and tail 51; unit 1 [12,16); unit 2 [9,11), 20, tail 98 */
static const struct tdef tdefs[] = {
	{ "model.embed_tokens.weight", 0, 0, 2, 5, 7 },
	{ "model.extra.scale", 0, 38, 1, 13, 0 },
	{ "model.layers.0.self_attn.q_proj.weight", 1, 0, 2, 3, 4 },
	{ "model.layers.0.input_layernorm.weight", 1, 16, 1, 4, 0 },
	{ "model.layers.0.mlp.up_proj.weight", 1, 20, 2, 6, 5 },
	{ "model.norm.weight", 2, 0, 1, 9, 0 },
	{ "score.weight", 2, 11, 2, 1, 9 },
	{ "model.layers.1.mlp.down_proj.weight", 2, 21, 2, 7, 11 },
};
#define NT ((int)(sizeof(tdefs) / sizeof(tdefs[0])))
static size_t unit_numel[3] = { 52, 50, 99 };
static struct sl_tensor_info tinfo[NT];
static struct sl_layout lay;

static void make_layout(void)
{
	for (int i = 0; i < NT; i++) {
		struct sl_tensor_info *t = &tinfo[i];

		snprintf(t->name, sizeof(t->name), "%s", tdefs[i].name);
		t->unit = tdefs[i].unit;
		t->offset = tdefs[i].offset;
		t->ndim = tdefs[i].ndim;
		t->shape[0] = tdefs[i].r;
		t->shape[1] = tdefs[i].ndim == 2 ? tdefs[i].c : 0;
		t->numel = tdefs[i].r * (tdefs[i].ndim == 2 ? tdefs[i].c : 1);
	}
	lay.n_tensors = NT;
	lay.t = tinfo;
	lay.n_units = 3;
	lay.unit_numel = unit_numel;
	lay.total_numel = 52 + 50 + 99;
}

/* exact in float: < 2^17 with a multiple of 1/8 */
static float val(int set, int t, size_t i, int step)
{
	return set * 20000.0f + (t + 1) * 1000.0f + (float)i + (step % 8) * 0.125f;
}

/* the tensor holding unit element @e, or -1 (padding) */
static int tensor_at(int u, size_t e, size_t *i)
{
	for (int t = 0; t < NT; t++) {
		if (tinfo[t].unit == u && e >= tinfo[t].offset && e < tinfo[t].offset + tinfo[t].numel) {
			*i = e - tinfo[t].offset;
			return t;
		}
	}
	return -1;
}

static char *make_config(int step, bool big)
{
	size_t n = 64 + (big ? 300000 : 0);
	char *s = malloc(n);
	size_t k = snprintf(s, n, "# test config\nstep: %d\n", step);

	while (big && k + 40 < n)
		k += snprintf(s + k, n - k, "# padding to pass 64 KB: %08zu\n", k);
	return s;
}

/* ---- options --------------------------------------------------------------------------------- */

struct opts {
	int shard_size, keep, step, crash_rank;
	bool no_opt, big, expect_fail;
	const char *dir, *crash;
};

static void parse_opts(struct opts *o, int argc, char **argv, int first)
{
	*o = (struct opts){ .keep = 0, .step = -1, .crash_rank = -1 };
	for (int i = first; i < argc; i++) {
		if (!strcmp(argv[i], "--shard-size") && i + 1 < argc)
			o->shard_size = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--keep") && i + 1 < argc)
			o->keep = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--step") && i + 1 < argc)
			o->step = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--dir") && i + 1 < argc)
			o->dir = argv[++i];
		else if (!strcmp(argv[i], "--no-opt"))
			o->no_opt = true;
		else if (!strcmp(argv[i], "--big-config"))
			o->big = true;
		else if (!strcmp(argv[i], "--expect-fail"))
			o->expect_fail = true;
		else if (!strcmp(argv[i], "--crash") && i + 1 < argc) {
			o->crash = argv[++i];
			if (!strncmp(o->crash, "file:", 5))
				o->crash_rank = atoi(o->crash + 5);
			else
				o->crash_rank = 0;
		} else {
			fprintf(stderr, "test_ckpt: unknown option %s\n", argv[i]);
			exit(2);
		}
	}
}

/* ---- a crash in the middle of a write: the collectives are intercepted (PMPI) ---------------- */

static const struct opts *crash_opts;
static char crash_dir[4096];

static bool exists_in(const char *dir, const char *name)
{
	char p[4400];
	struct stat st;

	snprintf(p, sizeof(p), "%s/%s", dir, name);
	return stat(p, &st) == 0;
}

/* Die like a SIGKILLed job at the first collective after the chosen file is in place. */
static void maybe_crash(void)
{
	char name[64];
	int r;

	if (!crash_opts)
		return;
	PMPI_Comm_rank(MPI_COMM_WORLD, &r);
	if (r != crash_opts->crash_rank)
		return;
	snprintf(name, sizeof(name), "rank-%05d.h5", r);
	if (!strncmp(crash_opts->crash, "file:", 5) && exists_in(crash_dir, name))
		raise(SIGKILL);
	if (!strcmp(crash_opts->crash, "index") && exists_in(crash_dir, "index.h5") &&
	    !exists_in(crash_dir, "COMPLETE"))
		raise(SIGKILL);
}

int MPI_Allreduce(const void *sb, void *rb, int n, MPI_Datatype t, MPI_Op op, MPI_Comm c)
{
	maybe_crash();
	return PMPI_Allreduce(sb, rb, n, t, op, c);
}

int MPI_Barrier(MPI_Comm c)
{
	maybe_crash();
	return PMPI_Barrier(c);
}

/* ---- collective modes ------------------------------------------------------------------------ */

struct shards {
	struct sl_ckpt_geom g;
	size_t shard[3];
	float *buf[3][3];		/* [set][unit] */
};

static void make_geom(struct shards *sh, int shard_size)
{
	int rank, world;

	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &world);
	if (shard_size <= 0)
		shard_size = world;
	for (int u = 0; u < 3; u++)
		sh->shard[u] = (unit_numel[u] + shard_size - 1) / shard_size;
	sh->g = (struct sl_ckpt_geom){ .lay = &lay, .shard_size = shard_size,
				       .shard_rank = rank % shard_size, .writer = rank < shard_size,
				       .world = world, .rank = rank, .shard = sh->shard };
	for (int k = 0; k < 3; k++)
		for (int u = 0; u < 3; u++)
			sh->buf[k][u] = malloc(sizeof(float) * sh->shard[u]);
}

static void free_geom(struct shards *sh)
{
	for (int k = 0; k < 3; k++)
		for (int u = 0; u < 3; u++)
			free(sh->buf[k][u]);
}

static int do_write(const char *root, int step, const struct opts *o)
{
	struct shards sh;
	struct sl_ckpt_state s = { .step = step, .seed = 1000 + step, .data_cursor = 16 * step };
	char *cfg = make_config(step, o->big);
	double bytes = 0, secs = 0;
	int rc;

	make_geom(&sh, o->shard_size);
	s.config_yaml = cfg;
	for (int k = 0; k < 3; k++) {
		for (int u = 0; u < 3; u++) {
			for (size_t j = 0; j < sh.shard[u]; j++) {
				size_t e = sh.g.shard_rank * sh.shard[u] + j, i;
				int t = tensor_at(u, e, &i);

				/* padding holds junk: a reader must not pass it on */
				sh.buf[k][u][j] = t < 0 ? 12345.0f : val(k, t, i, step);
			}
		}
	}
	if (o->crash) {
		snprintf(crash_dir, sizeof(crash_dir), "%s/step-%06d", root, step);
		crash_opts = o;
	}
	rc = sl_ckpt_write(root, &sh.g, &s, sh.buf[0], o->no_opt ? NULL : sh.buf[1],
			   o->no_opt ? NULL : sh.buf[2], !o->no_opt, o->keep, MPI_COMM_WORLD,
			   &bytes, &secs);
	crash_opts = NULL;
	if (o->expect_fail) {
		CHECK(rc < 0, "rank %d: the write succeeded", sh.g.rank);
	} else {
		CHECK(rc == 0, "rank %d: sl_ckpt_write = %d", sh.g.rank, rc);
		if (sh.g.rank == 0) {
			CHECK(bytes > 0 && secs > 0, "bytes %g seconds %g", bytes, secs);
			printf("wrote step %d: %.0f bytes in %.3f s\n", step, bytes, secs);
		}
	}
	free_geom(&sh);
	free(cfg);
	return 0;
}

static int do_read(const char *root, const struct opts *o)
{
	struct shards sh;
	struct sl_ckpt_state s = { 0 };
	char dir[4096];
	int step = -1, rc, bad = 0;

	make_geom(&sh, o->shard_size);
	if (o->dir) {
		snprintf(dir, sizeof(dir), "%s", o->dir);
	} else {
		rc = sl_ckpt_find_latest(root, dir, sizeof(dir), &step);
		CHECK(rc == 1, "find_latest(%s) = %d", root, rc);
		if (rc != 1)
			goto out_free;
	}
	for (int k = 0; k < 3; k++)
		for (int u = 0; u < 3; u++)
			for (size_t j = 0; j < sh.shard[u]; j++)
				sh.buf[k][u][j] = 777.0f;
	rc = sl_ckpt_read(dir, &sh.g, &s, sh.buf[0], o->no_opt ? NULL : sh.buf[1],
			  o->no_opt ? NULL : sh.buf[2], MPI_COMM_WORLD);
	if (o->expect_fail) {
		CHECK(rc < 0, "rank %d: the read of %s succeeded", sh.g.rank, dir);
		goto out_free;
	}
	CHECK(rc == 0, "rank %d: sl_ckpt_read(%s) = %d", sh.g.rank, dir, rc);
	if (rc)
		goto out_free;
	if (o->step >= 0)
		CHECK(s.step == o->step, "step %d, expected %d", s.step, o->step);
	if (step >= 0)
		CHECK(s.step == step, "index step %d, directory step %d", s.step, step);
	CHECK(s.seed == 1000u + s.step, "seed %llu", (unsigned long long)s.seed);
	CHECK(s.data_cursor == 16 * s.step, "data cursor %lld", (long long)s.data_cursor);
	{
		char *cfg = make_config(s.step, o->big);

		CHECK(s.config_yaml && !strcmp(s.config_yaml, cfg), "config differs (%zu vs %zu "
		      "bytes)", s.config_yaml ? strlen(s.config_yaml) : 0, strlen(cfg));
		free(cfg);
	}
	for (int k = 0; k < (o->no_opt ? 1 : 3); k++) {
		for (int u = 0; u < 3; u++) {
			for (size_t j = 0; j < sh.shard[u]; j++) {
				size_t e = sh.g.shard_rank * sh.shard[u] + j, i;
				int t = tensor_at(u, e, &i);
				float want = t < 0 ? 0.0f : val(k, t, i, s.step);

				if (sh.buf[k][u][j] != want && bad++ < 10)
					CHECK(0, "rank %d set %d unit %d element %zu: %g, expected %g",
					      sh.g.rank, k, u, e, sh.buf[k][u][j], want);
				test_checks++;
			}
		}
	}
	free((char *)s.config_yaml);
out_free:
	free_geom(&sh);
	return 0;
}

/* ---- helper modes (no MPI) ------------------------------------------------------------------- */

static int do_latest(const char *root)
{
	char dir[4096];
	int step = -1, rc = sl_ckpt_find_latest(root, dir, sizeof(dir), &step);

	if (rc < 0)
		return 1;
	if (rc == 0)
		printf("none\n");
	else
		printf("%d %s\n", step, dir);
	return 0;
}

static int do_names(void)
{
	for (int t = 0; t < NT; t++) {
		if (tinfo[t].ndim == 2)
			printf("/master/%s Dataset {%lld, %lld}\n", tinfo[t].name,
			       (long long)tinfo[t].shape[0], (long long)tinfo[t].shape[1]);
		else
			printf("/master/%s Dataset {%lld}\n", tinfo[t].name,
			       (long long)tinfo[t].shape[0]);
	}
	return 0;
}

/* h5dump's text: "DATASPACE  SIMPLE { ( 5, 7 ) / ( 5, 7 ) }" then "DATA { (0,0): 1, 2, ..." */
static int do_dumpcheck(const char *name, int set, int step)
{
	static char text[1 << 20];
	size_t n = fread(text, 1, sizeof(text) - 1, stdin), count = 0;
	const char *p, *q;
	char *end;
	int t;

	text[n] = '\0';
	for (t = 0; t < NT && strcmp(tinfo[t].name, name); t++)
		;
	CHECK(t < NT, "no tensor %s in the test layout", name);
	if (t == NT)
		return 1;
	p = strstr(text, "DATASPACE");
	CHECK(p != NULL, "no DATASPACE in the dump");
	if (!p)
		return 1;
	p = strchr(p, '(');
	for (int d = 0; p && d < tinfo[t].ndim; d++) {
		long v = strtol(p + 1, &end, 10);

		CHECK(v == tinfo[t].shape[d], "%s: dimension %d is %ld, expected %lld", name, d, v,
		      (long long)tinfo[t].shape[d]);
		p = end;
	}
	q = p ? strstr(p, "DATA {") : NULL;
	CHECK(q != NULL, "no DATA in the dump");
	if (!q)
		return 1;
	for (q += 6; *q && *q != '}';) {
		if (strchr(" \t\r\n,", *q)) {
			q++;
		} else if (*q == '(') {		/* "(r,c):" position labels */
			q = strchr(q, ':');
			if (!q)
				break;
			q++;
		} else {
			double v = strtod(q, &end);

			if (end == q) {
				CHECK(0, "%s: cannot parse the dump near \"%.20s\"", name, q);
				break;
			}
			if (count < tinfo[t].numel)
				CHECK(v == val(set, t, count, step), "%s[%zu] = %.9g, expected %.9g",
				      name, count, v, (double)val(set, t, count, step));
			count++;
			q = end;
		}
	}
	CHECK(count == tinfo[t].numel, "%s: %zu values in the dump, expected %zu", name, count,
	      tinfo[t].numel);
	return 0;
}

static int do_flip(const char *file, const char *dset)
{
	hid_t f = H5Fopen(file, H5F_ACC_RDONLY, H5P_DEFAULT), d;
	haddr_t off;
	hsize_t size;
	unsigned char b;
	int fd;

	if (f < 0)
		return 1;
	d = H5Dopen2(f, dset, H5P_DEFAULT);
	if (d < 0)
		return 1;
	off = H5Dget_offset(d);
	size = H5Dget_storage_size(d);
	H5Dclose(d);
	H5Fclose(f);
	if (off == HADDR_UNDEF || size == 0)
		return 1;
	off += size / 2;
	fd = open(file, O_RDWR);
	if (fd < 0 || pread(fd, &b, 1, off) != 1)
		return 1;
	b ^= 0x40;
	if (pwrite(fd, &b, 1, off) != 1)
		return 1;
	close(fd);
	printf("flipped byte %llu of %s\n", (unsigned long long)off, file);
	return 0;
}

int main(int argc, char **argv)
{
	struct opts o;
	int rank, failed;

	make_layout();
	if (argc < 2) {
		fprintf(stderr, "usage: test_ckpt write|read|latest|names|dumpcheck|flip ...\n");
		return 2;
	}
	if (!strcmp(argv[1], "latest") && argc == 3)
		return do_latest(argv[2]);
	if (!strcmp(argv[1], "names"))
		return do_names();
	if (!strcmp(argv[1], "dumpcheck") && argc == 5) {
		do_dumpcheck(argv[2], atoi(argv[3]), atoi(argv[4]));
		return test_exit("test_ckpt dumpcheck");
	}
	if (!strcmp(argv[1], "flip") && argc == 4)
		return do_flip(argv[2], argv[3]);
	if (!((!strcmp(argv[1], "write") && argc >= 4) || (!strcmp(argv[1], "read") && argc >= 3))) {
		fprintf(stderr, "test_ckpt: bad arguments\n");
		return 2;
	}

	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	sl_log_init();
	{
		int world;

		MPI_Comm_size(MPI_COMM_WORLD, &world);
		sl_log_set_rank(rank, world, "testhost");
	}
	if (!strcmp(argv[1], "write")) {
		parse_opts(&o, argc, argv, 4);
		do_write(argv[2], atoi(argv[3]), &o);
	} else {
		parse_opts(&o, argc, argv, 3);
		do_read(argv[2], &o);
	}
	PMPI_Allreduce(&test_failures, &failed, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
	if (rank == 0 || test_failures)
		test_exit("test_ckpt");
	MPI_Finalize();
	return failed ? 1 : 0;
}
