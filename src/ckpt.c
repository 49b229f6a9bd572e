/*
 * ckpt: HDF5 checkpoints (see ckpt.h and DESIGN.md §3 "HDF5 checkpoint").
 *
 * Owns the step directory and its commit protocol: rank 0 creates step-NNNNNN/, each writer rank
 * writes rank-RRRRR.h5 under a temporary name, fsyncs it and renames it; rank 0 then writes
 * index.h5 (a virtual dataset per tensor over the rank files), fsyncs it and the directory, and
 * only after every rank agreed that all of that succeeded writes COMPLETE.  Every phase ends with
 * an MPI_Allreduce of a status flag, so a failure on one rank is a failure on all (nobody hangs
 * in a later collective) and the step directory is removed again; older checkpoints are never
 * touched by a failed write.
 *
 * Loading is in ckpt_read.c; the HDF5 helpers, the directories and the shard geometry
 * in ckpt_h5.c, ckpt_dirs.c and ckpt_geom.c (ckpt_impl.h).
 */
#define _GNU_SOURCE			/* fallocate(2) */
#include "ckpt.h"

#include <errno.h>
#include <fcntl.h>
#include <hdf5.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt_impl.h"
#include "log.h"

#define CKPT_FORMAT 1

/* ---- geometry -------------------------------------------------------------------------------- */

/*
 * Who writes shard index s: every rank's (writer, shard_rank, shard_size) gathered, so every rank
 * reaches the same verdict.  @writer_of gets shard_size world ranks.
 */
static int writer_map(const struct sl_ckpt_geom *g, MPI_Comm comm, int *writer_of)
{
	int mine[3] = { g->writer, g->shard_rank, g->shard_size };
	int *all = malloc(sizeof(int) * 3 * g->world);
	int rc = 0;

	if (!all) {
		sl_error("ckpt: out of memory");
		MPI_Abort(comm, 1);
	}
	MPI_Allgather(mine, 3, MPI_INT, all, 3, MPI_INT, comm);
	for (int s = 0; s < g->shard_size; s++)
		writer_of[s] = -1;
	for (int r = 0; r < g->world; r++) {
		if (all[3 * r + 2] != g->shard_size) {
			sl_error("ckpt: ranks disagree on the shard group size (%d vs %d)",
				 all[3 * r + 2], g->shard_size);
			rc = -1;
			break;
		}
		if (!all[3 * r])
			continue;
		if (writer_of[all[3 * r + 1]] >= 0) {
			sl_error("ckpt: ranks %d and %d both write shard %d", writer_of[all[3 * r + 1]],
				 r, all[3 * r + 1]);
			rc = -1;
			break;
		}
		writer_of[all[3 * r + 1]] = r;
	}
	for (int s = 0; rc == 0 && s < g->shard_size; s++) {
		if (writer_of[s] < 0) {
			sl_error("ckpt: no rank writes shard %d", s);
			rc = -1;
		}
	}
	free(all);
	return rc;
}

/*
 * At rank 0, *fr = (shard_size, n_units, 2): each shard's [start, count) of every unit, from the
 * rank writing it; checked to cover every unit exactly (the index must map every element).
 * Collective; other ranks get NULL.
 */
static int gather_ranges(const struct sl_ckpt_geom *g, MPI_Comm comm, const int *writer_of,
			 uint64_t **fr)
{
	const int nu = g->lay->n_units;
	uint64_t *mine = malloc(sizeof(uint64_t) * 2 * nu), *all = NULL;
	int rc = 0;

	*fr = NULL;
	if (g->rank == 0) {
		all = malloc(sizeof(uint64_t) * 2 * nu * g->world);
		*fr = malloc(sizeof(uint64_t) * 2 * nu * g->shard_size);
	}
	if (!mine || (g->rank == 0 && (!all || !*fr))) {
		sl_error("ckpt: out of memory");
		MPI_Abort(comm, 1);
	}
	for (int u = 0; u < nu; u++) {
		size_t a, n;

		ckpt_range_of(g, u, &a, &n);
		mine[2 * u] = a;
		mine[2 * u + 1] = n;
	}
	MPI_Gather(mine, 2 * nu, MPI_UINT64_T, all, 2 * nu, MPI_UINT64_T, 0, comm);
	for (int s = 0; all && s < g->shard_size; s++)
		memcpy(*fr + (size_t)2 * nu * s, all + (size_t)2 * nu * writer_of[s],
		       sizeof(uint64_t) * 2 * nu);
	for (int u = 0; all && u < nu && rc == 0; u++) {
		uint64_t sum = 0;

		for (int s = 0; s < g->shard_size; s++)
			sum += (*fr)[((size_t)s * nu + u) * 2 + 1];
		if (sum != g->lay->unit_numel[u]) {
			sl_error("ckpt: the shards of unit %d hold %llu elements, the unit %zu", u,
				 (unsigned long long)sum, g->lay->unit_numel[u]);
			rc = -1;
		}
	}
	free(all);
	free(mine);
	return rc;
}

/* ---- writing --------------------------------------------------------------------------------- */

static hid_t create_file(const char *path)
{
	hid_t fapl = H5_CHECK(H5Pcreate(H5P_FILE_ACCESS));
	hid_t f;

	/* format >= 1.8: dense attribute storage, so the config attribute may exceed 64 KB */
	H5_CHECK(H5Pset_libver_bounds(fapl, H5F_LIBVER_V18, H5F_LIBVER_LATEST));
	f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
	if (f < 0)
		ckpt_h5_err(path, "H5Fcreate", "");
	H5Pclose(fapl);
	return f;
}

/*
 * Reserve a new file's blocks before HDF5 writes into it (FALLOC_FL_KEEP_SIZE: the size HDF5 sees
 * is unchanged), so that a full disk fails here, cleanly, and not inside HDF5: HDF5 1.10 does
 * not survive a failed H5Fclose (the file's ID is left pointing at freed memory and the library
 * crashes in its exit handler; HDFGroup/hdf5#2257).  @bytes is a generous estimate; where the file
 * system cannot preallocate, this is skipped.
 */
static int reserve_space(const char *path, size_t bytes)
{
	int fd = open(path, O_WRONLY), rc = 0;

	if (fd < 0) {
		sl_error("%s: cannot open: %s", path, strerror(errno));
		return -1;
	}
	if (fallocate(fd, FALLOC_FL_KEEP_SIZE, 0, (off_t)bytes) != 0 && errno != EOPNOTSUPP &&
	    errno != ENOSYS) {
		sl_error("%s: cannot reserve %zu bytes for the checkpoint: %s", path, bytes,
			 strerror(errno));
		rc = -1;
	}
	close(fd);
	return rc;
}

/* Give back what reserve_space() held beyond the file's end. */
static void trim_space(const char *path)
{
	struct stat st;

	if (stat(path, &st) == 0)
		(void)truncate(path, st.st_size);
}

static int write_unit(hid_t grp, const char *path, const char *set, int u, const float *buf,
		      size_t n)
{
	char name[NAME_LEN], what[64];
	hsize_t dim = n;
	hid_t sp = H5_CHECK(H5Screate_simple(1, &dim, NULL));
	uint64_t sum = fnv1a(FNV_OFFSET, buf, n * sizeof(float)), numel = n;
	hid_t d;
	int rc = -1;

	snprintf(name, sizeof(name), "unit-%04d", u);
	snprintf(what, sizeof(what), "/%s/%s", set, name);
	d = H5Dcreate2(grp, name, H5T_IEEE_F32LE, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
	if (d < 0) {
		ckpt_h5_err(path, "H5Dcreate", what);
		goto out_close_space;
	}
	if (n && H5Dwrite(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf) < 0) {
		ckpt_h5_err(path, "H5Dwrite", what);
		goto out_close_dset;
	}
	if (ckpt_attr_put(d, "checksum", H5T_NATIVE_UINT64, 0, &sum) < 0 ||
	    ckpt_attr_put(d, "numel", H5T_NATIVE_UINT64, 0, &numel) < 0) {
		ckpt_h5_err(path, "H5Awrite", what);
		goto out_close_dset;
	}
	rc = 0;
out_close_dset:
	H5Dclose(d);
out_close_space:
	H5Sclose(sp);
	return rc;
}

/*
 * Close @f (written as @tmp) and commit it as @path: give back the unused reservation, fsync,
 * rename.  @rc is the writer's status so far; on any failure @tmp is removed.  *bytes: its size.
 */
static int commit_h5(hid_t f, const char *tmp, const char *path, int rc, double *bytes)
{
	struct stat st;

	/* close flushes metadata: on a full disk this is where the failure shows */
	if (H5Fclose(f) < 0) {
		ckpt_h5_err(tmp, "H5Fclose", "");
		rc = -1;
	}
	trim_space(tmp);
	if (rc == 0)
		rc = ckpt_fsync_path(tmp, false);
	if (rc == 0 && stat(tmp, &st) == 0)
		*bytes = st.st_size;
	if (rc == 0 && rename(tmp, path) != 0) {
		sl_error("%s: cannot rename to %s: %s", tmp, path, strerror(errno));
		rc = -1;
	}
	if (rc < 0)
		unlink(tmp);
	return rc;
}


/* This rank's rank-RRRRR.h5: written as .tmp, closed, fsync'ed, renamed.  *bytes: its size. */
static int write_rank_file(const char *dir, const struct sl_ckpt_geom *g,
			   const struct sl_ckpt_state *s, float *const *const bufs[3], int nsets,
			   double *bytes)
{
	const struct sl_layout *lay = g->lay;
	char name[NAME_LEN], tmp[4096], path[4096];
	int32_t n_units = lay->n_units, opt = nsets == 3;
	size_t need = 65536;		/* superblock, root group and attributes, with room */
	size_t *start, n;		/* where each unit's shard starts in the unit */
	hid_t f, grp;
	int rc = -1;

	snprintf(name, sizeof(name), "rank-%05d.h5", g->rank);
	if (ckpt_join(path, sizeof(path), dir, name) < 0 ||
	    snprintf(tmp, sizeof(tmp), "%s.tmp", path) >= (int)sizeof(tmp))
		return -1;
	start = malloc(sizeof(*start) * lay->n_units);
	if (!start) {
		sl_error("ckpt: out of memory");
		return -1;
	}
	for (int u = 0; u < lay->n_units; u++)
		ckpt_range_of(g, u, &start[u], &n);
	f = create_file(tmp);
	if (f < 0) {
		free(start);
		return -1;
	}
	for (int u = 0; u < lay->n_units; u++)
		need += nsets * (g->shard[u] * sizeof(float) + 4096);
	if (reserve_space(tmp, need) < 0)
		goto out_close_file;
	if (ckpt_attr_put(f, "format", H5T_NATIVE_INT32, 0, &(int32_t){ CKPT_FORMAT }) < 0 ||
	    ckpt_attr_put(f, "step", H5T_NATIVE_INT32, 0, &(int32_t){ s->step }) < 0 ||
	    ckpt_attr_put(f, "world", H5T_NATIVE_INT32, 0, &(int32_t){ g->world }) < 0 ||
	    ckpt_attr_put(f, "shard_size", H5T_NATIVE_INT32, 0, &(int32_t){ g->shard_size }) < 0 ||
	    ckpt_attr_put(f, "shard_rank", H5T_NATIVE_INT32, 0, &(int32_t){ g->shard_rank }) < 0 ||
	    ckpt_attr_put(f, "rank", H5T_NATIVE_INT32, 0, &(int32_t){ g->rank }) < 0 ||
	    ckpt_attr_put(f, "seed", H5T_NATIVE_UINT64, 0, &s->seed) < 0 ||
	    ckpt_attr_put(f, "data_cursor", H5T_NATIVE_INT64, 0, &s->data_cursor) < 0 ||
	    ckpt_attr_put(f, "n_units", H5T_NATIVE_INT32, 0, &n_units) < 0 ||
	    ckpt_attr_put(f, "optimizer", H5T_NATIVE_INT32, 0, &opt) < 0 ||
	    ckpt_attr_put(f, "shard", H5T_NATIVE_UINT64, n_units, g->shard) < 0 ||
	    ckpt_attr_put(f, "unit_start", H5T_NATIVE_UINT64, n_units, start) < 0) {
		ckpt_h5_err(tmp, "H5Awrite", "/");
		goto out_close_file;
	}
	for (int k = 0; k < nsets; k++) {
		grp = H5Gcreate2(f, set_name[k], H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
		if (grp < 0) {
			ckpt_h5_err(tmp, "H5Gcreate", set_name[k]);
			goto out_close_file;
		}
		for (int u = 0; u < lay->n_units; u++) {
			if (write_unit(grp, tmp, set_name[k], u, bufs[k][u], g->shard[u]) < 0) {
				H5Gclose(grp);
				goto out_close_file;
			}
		}
		H5Gclose(grp);
	}
	rc = 0;
out_close_file:
	free(start);
	return commit_h5(f, tmp, path, rc, bytes);
}

/*
 * /<set>/<HF name>: a virtual dataset of the tensor's shape over the rank files, each shard's
 * overlap with the tensor mapped as up to three rectangles onto a 1-D source range.
 */
static int index_tensor(hid_t grp, const char *path, const char *set, const struct sl_tensor_info *t,
			const struct sl_ckpt_geom *g, const char (*files)[NAME_LEN],
			const uint64_t *fr)
{
	hsize_t dims[2] = { t->shape[0], t->ndim == 2 ? t->shape[1] : 0 };
	size_t S = g->shard[t->unit];
	hsize_t sdim = S;
	const int nu = g->lay->n_units;
	hid_t vsp = H5_CHECK(H5Screate_simple(t->ndim, dims, NULL));
	hid_t dcpl = H5_CHECK(H5Pcreate(H5P_DATASET_CREATE));
	float nan = NAN;
	char src[NAME_LEN + 16], what[256];
	hid_t d;
	int rc = -1;

	/* a region no source covers (a missing file) reads as NaN, never as plausible zeros */
	H5_CHECK(H5Pset_fill_value(dcpl, H5T_NATIVE_FLOAT, &nan));
	snprintf(src, sizeof(src), "/%s/unit-%04d", set, t->unit);
	for (int s = 0; s < g->shard_size; s++) {
		const uint64_t *r = fr + ((size_t)s * nu + t->unit) * 2;
		struct piece p[3];
		size_t a, b;
		int np;

		if (!ckpt_overlap(t, r[0], r[0] + r[1], &a, &b))
			continue;
		np = ckpt_split_range(t, a, b, p);
		for (int k = 0; k < np; k++) {
			hsize_t sstart = t->offset + p[k].flat - r[0], scount = p[k].n;
			hid_t ssp = H5_CHECK(H5Screate_simple(1, &sdim, NULL));

			H5_CHECK(H5Sselect_hyperslab(vsp, H5S_SELECT_SET, p[k].start, NULL,
						     p[k].count, NULL));
			H5_CHECK(H5Sselect_hyperslab(ssp, H5S_SELECT_SET, &sstart, NULL, &scount,
						     NULL));
			H5_CHECK(H5Pset_virtual(dcpl, vsp, files[s], src, ssp));
			H5Sclose(ssp);
		}
	}
	H5_CHECK(H5Sselect_all(vsp));
	snprintf(what, sizeof(what), "/%s/%s", set, t->name);
	d = H5Dcreate2(grp, t->name, H5T_IEEE_F32LE, vsp, H5P_DEFAULT, dcpl, H5P_DEFAULT);
	if (d < 0) {
		ckpt_h5_err(path, "H5Dcreate", what);
		goto out_close;
	}
	H5Dclose(d);
	rc = 0;
out_close:
	H5Pclose(dcpl);
	H5Sclose(vsp);
	return rc;
}

/* index.h5 (rank 0): .tmp, fsync'ed, renamed.  *bytes: its size. */
static int write_index(const char *dir, const struct sl_ckpt_geom *g, const struct sl_ckpt_state *s,
		       const int *writer_of, const uint64_t *fr, int nsets, double *bytes)
{
	const struct sl_layout *lay = g->lay;
	char tmp[4096], path[4096];
	char (*files)[NAME_LEN];
	int32_t n_units = lay->n_units, n_tensors = lay->n_tensors, opt = nsets == 3;
	uint64_t *numel;
	hid_t f, grp;
	int rc = -1;

	if (ckpt_join(path, sizeof(path), dir, "index.h5") < 0 ||
	    snprintf(tmp, sizeof(tmp), "%s.tmp", path) >= (int)sizeof(tmp))
		return -1;
	files = calloc(g->shard_size, NAME_LEN);
	numel = calloc(lay->n_units, sizeof(*numel));
	if (!files || !numel) {
		sl_error("ckpt: out of memory");
		goto out_free;
	}
	for (int i = 0; i < g->shard_size; i++)
		snprintf(files[i], NAME_LEN, "rank-%05d.h5", writer_of[i]);
	for (int u = 0; u < lay->n_units; u++)
		numel[u] = lay->unit_numel[u];

	f = create_file(tmp);
	if (f < 0)
		goto out_free;
	/* the config twice over, and each virtual dataset with up to 3 mappings per shard */
	if (reserve_space(tmp, 65536 + 2 * strlen(s->config_yaml ? s->config_yaml : "") +
			  (size_t)lay->n_units * 64 + (size_t)g->shard_size * 64 +
			  (size_t)nsets * lay->n_tensors * (4096 + 3 * 512 * (size_t)g->shard_size)) < 0)
		goto out_close_file;
	if (ckpt_attr_put(f, "format", H5T_NATIVE_INT32, 0, &(int32_t){ CKPT_FORMAT }) < 0 ||
	    ckpt_attr_put(f, "step", H5T_NATIVE_INT32, 0, &(int32_t){ s->step }) < 0 ||
	    ckpt_attr_put(f, "world", H5T_NATIVE_INT32, 0, &(int32_t){ g->world }) < 0 ||
	    ckpt_attr_put(f, "shard_size", H5T_NATIVE_INT32, 0, &(int32_t){ g->shard_size }) < 0 ||
	    ckpt_attr_put(f, "seed", H5T_NATIVE_UINT64, 0, &s->seed) < 0 ||
	    ckpt_attr_put(f, "data_cursor", H5T_NATIVE_INT64, 0, &s->data_cursor) < 0 ||
	    ckpt_attr_put(f, "n_units", H5T_NATIVE_INT32, 0, &n_units) < 0 ||
	    ckpt_attr_put(f, "n_tensors", H5T_NATIVE_INT32, 0, &n_tensors) < 0 ||
	    ckpt_attr_put(f, "optimizer", H5T_NATIVE_INT32, 0, &opt) < 0 ||
	    ckpt_attr_put(f, "unit_numel", H5T_NATIVE_UINT64, n_units, numel) < 0 ||
	    ckpt_attr_put(f, "shard", H5T_NATIVE_UINT64, n_units, g->shard) < 0 ||
	    ckpt_attr_put(f, "writer_ranks", H5T_NATIVE_INT32, g->shard_size, writer_of) < 0 ||
	    ckpt_attr_put(f, "unit_ranges", H5T_NATIVE_UINT64, 2 * g->shard_size * n_units,
			  fr) < 0 ||
	    ckpt_attr_put_names(f, "files", files, g->shard_size) < 0 ||
	    ckpt_attr_put_str(f, "config", s->config_yaml ? s->config_yaml : "") < 0) {
		ckpt_h5_err(tmp, "H5Awrite", "/");
		goto out_close_file;
	}
	for (int k = 0; k < nsets; k++) {
		grp = H5Gcreate2(f, set_name[k], H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
		if (grp < 0) {
			ckpt_h5_err(tmp, "H5Gcreate", set_name[k]);
			goto out_close_file;
		}
		for (int i = 0; i < lay->n_tensors; i++) {
			if (index_tensor(grp, tmp, set_name[k], &lay->t[i], g,
					 (const char(*)[NAME_LEN])files, fr) < 0) {
				H5Gclose(grp);
				goto out_close_file;
			}
		}
		H5Gclose(grp);
	}
	rc = 0;
out_close_file:
	rc = commit_h5(f, tmp, path, rc, bytes);
out_free:
	free(numel);
	free(files);
	return rc;
}

/* COMPLETE, atomically (tmp + rename), then the directory entry made durable. */
static int write_complete(const char *dir, int step)
{
	char tmp[4096], path[4096];
	FILE *fp;
	int rc = 0;

	if (ckpt_join(path, sizeof(path), dir, "COMPLETE") < 0 ||
	    ckpt_join(tmp, sizeof(tmp), dir, "COMPLETE.tmp") < 0)
		return -1;
	fp = fopen(tmp, "w");
	if (!fp) {
		sl_error("%s: cannot create: %s", tmp, strerror(errno));
		return -1;
	}
	if (fprintf(fp, "step %d\n", step) < 0)
		rc = -1;
	if (fclose(fp) != 0)
		rc = -1;
	if (rc < 0)
		sl_error("%s: cannot write: %s", tmp, strerror(errno));
	if (rc == 0)
		rc = ckpt_fsync_path(tmp, false);
	if (rc == 0 && rename(tmp, path) != 0) {
		sl_error("%s: cannot rename to COMPLETE: %s", tmp, strerror(errno));
		rc = -1;
	}
	if (rc == 0)
		rc = ckpt_fsync_path(dir, true);
	if (rc < 0)
		unlink(tmp);
	return rc;
}

int sl_ckpt_write(const char *root, const struct sl_ckpt_geom *g, const struct sl_ckpt_state *s,
		  float *const *master, float *const *m, float *const *v, bool optimizer, int keep,
		  MPI_Comm world, double *bytes, double *seconds)
{
	float *const *const bufs[3] = { master, m, v };
	int nsets = optimizer ? 3 : 1;
	double t0 = MPI_Wtime(), mine = 0, idx_bytes = 0, total = 0;
	char dir[4096];
	int *writer_of = NULL;
	uint64_t *fr = NULL;		/* rank 0: every shard's ranges (gather_ranges) */
	int rc = 0;

	H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
	if (bytes)
		*bytes = 0;
	if (seconds)
		*seconds = 0;

	/* 1. geometry, agreed before anything touches the disk */
	rc = ckpt_check_geom(g, world);
	if (ckpt_agree(rc, world) < 0)
		return -1;
	writer_of = malloc(sizeof(int) * g->shard_size);
	if (!writer_of) {
		sl_error("ckpt: out of memory");
		MPI_Abort(world, 1);
	}
	rc = writer_map(g, world, writer_of);
	if (ckpt_agree(rc, world) < 0)
		goto out_free_map;
	rc = gather_ranges(g, world, writer_of, &fr);
	if (rc == 0 && g->writer && (!master || (optimizer && (!m || !v)))) {
		sl_error("ckpt: missing %s buffers for the checkpoint", master ? "moment" : "master");
		rc = -1;
	}
	if (rc == 0 && snprintf(dir, sizeof(dir), "%s/step-%06d", root, s->step) >= (int)sizeof(dir)) {
		sl_error("%s: checkpoint path too long", root);
		rc = -1;
	}
	if (ckpt_agree(rc, world) < 0)
		goto out_free_map;

	/* 2. the step directory (rank 0; the others wait on the agreement) */
	if (g->rank == 0)
		rc = ckpt_prepare_dir(root, dir);
	if (ckpt_agree(rc, world) < 0)
		goto out_free_map;

	/* 3. rank files (the first replica of each shard) */
	if (g->writer)
		rc = write_rank_file(dir, g, s, bufs, nsets, &mine);
	if (ckpt_agree(rc, world) < 0)
		goto out_remove_dir;
	MPI_Reduce(&mine, &total, 1, MPI_DOUBLE, MPI_SUM, 0, world);

	/* 4. the index over them, and the directory entries made durable */
	if (g->rank == 0) {
		rc = write_index(dir, g, s, writer_of, fr, nsets, &idx_bytes);
		if (rc == 0)
			rc = ckpt_fsync_path(dir, true);
	}
	if (ckpt_agree(rc, world) < 0)
		goto out_remove_dir;

	/* 5. every file is closed and fsync'ed on every rank: commit */
	if (g->rank == 0)
		rc = write_complete(dir, s->step);
	if (ckpt_agree(rc, world) < 0)
		goto out_remove_dir;

	if (g->rank == 0) {
		if (bytes)
			*bytes = total + idx_bytes;
		if (seconds)
			*seconds = MPI_Wtime() - t0;
		ckpt_prune(root, s->step, keep);
	}
	free(writer_of);
	free(fr);
	return 0;

out_remove_dir:
	if (g->rank == 0 && ckpt_remove_dir(dir) < 0)
		sl_warn("%s: the failed checkpoint could not be removed (it has no COMPLETE, so it "
			"is never loaded)", dir);
out_free_map:
	free(writer_of);
	free(fr);
	return -1;
}
