/*
 * ckpt_read: loading a checkpoint (see ckpt.h and DESIGN.md §3 "HDF5 checkpoint").
 *
 * Loading verifies every rank file (present, opens as HDF5, expected datasets and sizes, checksum)
 * before anything is read through the index, because a virtual dataset whose source is missing
 * or short silently reads as its fill value.  The rank files are spread over the reading ranks
 * for that.  Each rank then reads its own element ranges of every tensor through the virtual
 * datasets, which works whatever world size wrote the checkpoint.
 */
#include "ckpt_impl.h"

#include <hdf5.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "log.h"

#define VERIFY_CHUNK (4u << 20)		/* elements read at a time when checksumming */

/* ---- reading --------------------------------------------------------------------------------- */

/* What index.h5 says about the checkpoint. */
struct idx {
	int32_t step, world, shard_size, n_units, n_tensors, optimizer;
	uint64_t seed;
	int64_t data_cursor;
	uint64_t *unit_numel;		/* (n_units) */
	uint64_t *shard;		/* (n_units) elements per writer rank */
	char (*files)[NAME_LEN];	/* (shard_size) rank file of each shard index */
};

static void idx_free(struct idx *ix)
{
	free(ix->unit_numel);
	free(ix->shard);
	free(ix->files);
	memset(ix, 0, sizeof(*ix));
}

static int idx_read(hid_t f, const char *path, struct idx *ix)
{
	hid_t name_t;
	int rc;

	memset(ix, 0, sizeof(*ix));
	if (ckpt_attr_get(f, "step", H5T_NATIVE_INT32, 1, &ix->step) < 0 ||
	    ckpt_attr_get(f, "world", H5T_NATIVE_INT32, 1, &ix->world) < 0 ||
	    ckpt_attr_get(f, "shard_size", H5T_NATIVE_INT32, 1, &ix->shard_size) < 0 ||
	    ckpt_attr_get(f, "n_units", H5T_NATIVE_INT32, 1, &ix->n_units) < 0 ||
	    ckpt_attr_get(f, "n_tensors", H5T_NATIVE_INT32, 1, &ix->n_tensors) < 0 ||
	    ckpt_attr_get(f, "optimizer", H5T_NATIVE_INT32, 1, &ix->optimizer) < 0 ||
	    ckpt_attr_get(f, "seed", H5T_NATIVE_UINT64, 1, &ix->seed) < 0 ||
	    ckpt_attr_get(f, "data_cursor", H5T_NATIVE_INT64, 1, &ix->data_cursor) < 0 ||
	    ix->shard_size < 1 || ix->shard_size > 1 << 24 || ix->n_units < 1 ||
	    ix->n_units > 1 << 24)
		goto out_bad;
	ix->unit_numel = calloc(ix->n_units, sizeof(uint64_t));
	ix->shard = calloc(ix->n_units, sizeof(uint64_t));
	ix->files = calloc(ix->shard_size, NAME_LEN);
	if (!ix->unit_numel || !ix->shard || !ix->files) {
		sl_error("ckpt: out of memory");
		goto out_free;
	}
	name_t = H5_CHECK(H5Tcopy(H5T_C_S1));
	H5_CHECK(H5Tset_size(name_t, NAME_LEN));
	rc = ckpt_attr_get(f, "files", name_t, ix->shard_size, ix->files);
	H5Tclose(name_t);
	if (rc < 0 || ckpt_attr_get(f, "unit_numel", H5T_NATIVE_UINT64, ix->n_units, ix->unit_numel) < 0 ||
	    ckpt_attr_get(f, "shard", H5T_NATIVE_UINT64, ix->n_units, ix->shard) < 0)
		goto out_bad;
	for (int i = 0; i < ix->shard_size; i++) {
		ix->files[i][NAME_LEN - 1] = '\0';
		/* only plain names in the checkpoint's own folder */
		if (!ix->files[i][0] || strchr(ix->files[i], '/'))
			goto out_bad;
	}
	return 0;
out_bad:
	sl_error_at(path, "missing or malformed checkpoint attributes (not a shardlm checkpoint index, "
	       "or a damaged one): remove this checkpoint directory");
out_free:
	idx_free(ix);
	return -1;
}

static const char *const advice = "remove this checkpoint directory or restore the file";

/* One dataset of a rank file: 1-D, the index's size, its checksum recomputed. */
static int verify_dataset(hid_t f, const char *path, const char *set, int u, size_t want,
			  float *buf)
{
	char name[64];
	hid_t d, sp, msp;
	hsize_t dim = 0;
	uint64_t sum = 0, numel = 0, h = FNV_OFFSET;
	int rc = -1;

	snprintf(name, sizeof(name), "/%s/unit-%04d", set, u);
	if (H5Lexists(f, set, H5P_DEFAULT) <= 0 || H5Lexists(f, name, H5P_DEFAULT) <= 0) {
		sl_error_at(path, "%s is missing: the file is incomplete or not this checkpoint's; %s",
		       name, advice);
		return -1;
	}
	d = H5Dopen2(f, name, H5P_DEFAULT);
	if (d < 0) {
		sl_error_at(path, "%s cannot be opened (%s): the file is damaged; %s", name, ckpt_h5_msg(),
		       advice);
		return -1;
	}
	sp = H5Dget_space(d);
	if (sp < 0 || H5Sget_simple_extent_ndims(sp) != 1 ||
	    H5Sget_simple_extent_dims(sp, &dim, NULL) < 0 || dim != want ||
	    ckpt_attr_get(d, "numel", H5T_NATIVE_UINT64, 1, &numel) < 0 || numel != want ||
	    ckpt_attr_get(d, "checksum", H5T_NATIVE_UINT64, 1, &sum) < 0) {
		sl_error_at(path, "%s has %llu elements, index.h5 says %zu, or lacks its numel/checksum "
		       "attributes: %s", name, (unsigned long long)dim, want, advice);
		goto out_close_space;
	}
	for (hsize_t off = 0; off < want; off += VERIFY_CHUNK) {
		hsize_t cnt = want - off < VERIFY_CHUNK ? want - off : VERIFY_CHUNK;

		msp = H5_CHECK(H5Screate_simple(1, &cnt, NULL));
		H5_CHECK(H5Sselect_hyperslab(sp, H5S_SELECT_SET, &off, NULL, &cnt, NULL));
		if (H5Dread(d, H5T_NATIVE_FLOAT, msp, sp, H5P_DEFAULT, buf) < 0) {
			sl_error_at(path, "%s cannot be read (%s): the file is truncated or damaged; %s",
			       name, ckpt_h5_msg(), advice);
			H5Sclose(msp);
			goto out_close_space;
		}
		H5Sclose(msp);
		h = fnv1a(h, buf, cnt * sizeof(float));
	}
	if (h != sum) {
		sl_error_at(path, "%s checksum mismatch: the file was altered or damaged; %s", name,
		       advice);
		goto out_close_space;
	}
	rc = 0;
out_close_space:
	if (sp >= 0)
		H5Sclose(sp);
	H5Dclose(d);
	return rc;
}

/* Rank file @i of the index: present, HDF5, this checkpoint's, every checksum right. */
static int verify_rank_file(const char *dir, const struct idx *ix, int i, int nsets)
{
	char path[4096];
	struct stat st;
	int32_t step = -1, shard_size = -1, shard_rank = -1, n_units = -1;
	uint64_t maxn = 1;
	float *buf;
	hid_t f;
	int rc = -1;

	if (ckpt_join(path, sizeof(path), dir, ix->files[i]) < 0)
		return -1;
	if (stat(path, &st) != 0) {
		sl_error_at(path, "missing (index.h5 lists it): the checkpoint is incomplete; %s", advice);
		return -1;
	}
	f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
	if (f < 0) {
		sl_error_at(path, "cannot be opened as HDF5 (%s): the file is truncated or damaged; %s",
		       ckpt_h5_msg(), advice);
		return -1;
	}
	if (ckpt_attr_get(f, "step", H5T_NATIVE_INT32, 1, &step) < 0 ||
	    ckpt_attr_get(f, "shard_size", H5T_NATIVE_INT32, 1, &shard_size) < 0 ||
	    ckpt_attr_get(f, "shard_rank", H5T_NATIVE_INT32, 1, &shard_rank) < 0 ||
	    ckpt_attr_get(f, "n_units", H5T_NATIVE_INT32, 1, &n_units) < 0) {
		sl_error_at(path, "its step/shard attributes are missing or unreadable: the file is "
		       "damaged or not a shardlm rank file; %s", advice);
		goto out_close_file;
	}
	if (step != ix->step || shard_size != ix->shard_size || shard_rank != i ||
	    n_units != ix->n_units) {
		sl_error_at(path, "is step %d, shard %d of %d, %d units; index.h5 expects step %d, shard "
		       "%d of %d, %d units: the file belongs to another checkpoint; %s", step,
		       shard_rank, shard_size, n_units, ix->step, i, ix->shard_size, ix->n_units,
		       advice);
		goto out_close_file;
	}
	for (int u = 0; u < ix->n_units; u++)
		if (ix->shard[u] > maxn)
			maxn = ix->shard[u];
	buf = malloc(sizeof(float) * (maxn < VERIFY_CHUNK ? maxn : VERIFY_CHUNK));
	if (!buf) {
		sl_error("ckpt: out of memory");
		goto out_close_file;
	}
	rc = 0;
	for (int k = 0; k < nsets && rc == 0; k++)
		for (int u = 0; u < ix->n_units && rc == 0; u++)
			rc = verify_dataset(f, path, set_name[k], u, ix->shard[u], buf);
	free(buf);
out_close_file:
	H5Fclose(f);
	return rc;
}

/* This rank's shard of every unit of one set, read through the index's virtual datasets. */
static int read_set(hid_t f, const char *path, const char *dir, const char *set,
		    const struct sl_ckpt_geom *g, float **bufs)
{
	const struct sl_layout *lay = g->lay;
	hid_t dapl = H5_CHECK(H5Pcreate(H5P_DATASET_ACCESS));
	char name[256];
	int rc = -1;

	/* the rank files next to this index, whatever the working directory holds */
	H5_CHECK(H5Pset_virtual_prefix(dapl, dir));
	for (int u = 0; u < lay->n_units; u++)
		memset(bufs[u], 0, sizeof(float) * g->shard[u]);	/* padding reads as 0 */
	for (int i = 0; i < lay->n_tensors; i++) {
		const struct sl_tensor_info *t = &lay->t[i];
		size_t lo, n, a, b;
		hsize_t dims[2] = { 0, 0 };
		struct piece p[3];
		hid_t d, sp;
		int np, nd;

		snprintf(name, sizeof(name), "/%s/%s", set, t->name);
		if (H5Lexists(f, set, H5P_DEFAULT) <= 0 || H5Lexists(f, name, H5P_DEFAULT) <= 0) {
			sl_error_at(path, "%s is missing: the checkpoint is of another model", name);
			goto out_close_dapl;
		}
		d = H5Dopen2(f, name, dapl);
		if (d < 0) {
			ckpt_h5_err(path, "H5Dopen", name);
			goto out_close_dapl;
		}
		sp = H5_CHECK(H5Dget_space(d));
		nd = H5Sget_simple_extent_ndims(sp);
		/* the rank comes from the file: dims[] holds two */
		if (nd < 1 || nd > 2 || H5Sget_simple_extent_dims(sp, dims, NULL) < 0 ||
		    nd != t->ndim || (int64_t)dims[0] != t->shape[0] ||
		    (nd == 2 && (int64_t)dims[1] != t->shape[1])) {
			sl_error_at(path, "%s has shape [%llu%s%llu], the model needs [%lld%s%lld]: the "
			       "checkpoint is of another model", name, (unsigned long long)dims[0],
			       nd == 2 ? ", " : "", nd == 2 ? (unsigned long long)dims[1] : 0ull,
			       (long long)t->shape[0], t->ndim == 2 ? ", " : "",
			       t->ndim == 2 ? (long long)t->shape[1] : 0ll);
			goto out_close_dset;
		}
		ckpt_range_of(g, t->unit, &lo, &n);
		if (!ckpt_overlap(t, lo, lo + n, &a, &b)) {
			H5Sclose(sp);
			H5Dclose(d);
			continue;
		}
		np = ckpt_split_range(t, a, b, p);
		for (int k = 0; k < np; k++) {
			hsize_t cnt = p[k].n;
			hid_t msp = H5_CHECK(H5Screate_simple(1, &cnt, NULL));
			float *dst = bufs[t->unit] + (t->offset + p[k].flat - lo);

			H5_CHECK(H5Sselect_hyperslab(sp, H5S_SELECT_SET, p[k].start, NULL,
						     p[k].count, NULL));
			if (H5Dread(d, H5T_NATIVE_FLOAT, msp, sp, H5P_DEFAULT, dst) < 0) {
				ckpt_h5_err(path, "H5Dread", name);
				H5Sclose(msp);
				goto out_close_dset;
			}
			H5Sclose(msp);
		}
		H5Sclose(sp);
		H5Dclose(d);
		continue;
out_close_dset:
		H5Sclose(sp);
		H5Dclose(d);
		goto out_close_dapl;
	}
	rc = 0;
out_close_dapl:
	H5Pclose(dapl);
	return rc;
}

int sl_ckpt_has_optimizer(const char *dir)
{
	char path[4096];
	int32_t opt = 0;
	hid_t f;

	H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
	if (ckpt_join(path, sizeof(path), dir, "index.h5") < 0)
		return -1;
	f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
	if (f < 0) {
		sl_error_at(path, "cannot be opened as HDF5 (%s)", ckpt_h5_msg());
		return -1;
	}
	if (ckpt_attr_get(f, "optimizer", H5T_NATIVE_INT32, 1, &opt) < 0) {
		sl_error_at(path, "no optimizer attribute: not a shardlm checkpoint index");
		H5Fclose(f);
		return -1;
	}
	H5Fclose(f);
	return opt ? 1 : 0;
}

char *sl_ckpt_read_config(const char *dir)
{
	char path[4096], *config;
	hid_t f;

	H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
	if (ckpt_join(path, sizeof(path), dir, "index.h5") < 0)
		return NULL;
	f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
	if (f < 0) {
		sl_error_at(path, "cannot be opened as HDF5 (%s)", ckpt_h5_msg());
		return NULL;
	}
	config = ckpt_attr_get_str(f, "config");
	if (!config)
		sl_error_at(path, "has no config attribute: not a shardlm checkpoint index");
	H5Fclose(f);
	return config;
}

int sl_ckpt_read(const char *dir, const struct sl_ckpt_geom *g, struct sl_ckpt_state *s,
		 float **master, float **m, float **v, MPI_Comm world)
{
	float **bufs[3] = { master, m, v };
	int want_opt = m || v;
	char path[4096];
	char *config = NULL;
	struct idx ix = { 0 };
	hid_t f = -1;
	int rc, ret = -1;

	H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
	rc = ckpt_check_geom(g, world);
	if (rc == 0 && (ckpt_join(path, sizeof(path), dir, "index.h5") < 0 || !master))
		rc = -1;
	if (rc == 0) {
		f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
		if (f < 0) {
			sl_error_at(path, "cannot be opened as HDF5 (%s): %s", ckpt_h5_msg(),
			       "remove this checkpoint directory (its COMPLETE marker is wrong)");
			rc = -1;
		}
	}
	if (rc == 0)
		rc = idx_read(f, path, &ix);
	if (rc == 0 && ix.n_units != g->lay->n_units) {
		sl_error_at(path, "has %d units, the model has %d: the checkpoint is of another model",
		       ix.n_units, g->lay->n_units);
		rc = -1;
	}
	/* sizes from the file bound what verification reads: they must be the model's */
	for (int u = 0; rc == 0 && u < ix.n_units; u++) {
		uint64_t S = (uint64_t)ix.shard_size, numel = g->lay->unit_numel[u];

		/* shards cover the unit, padded by at most an alignment's worth */
		if (ix.unit_numel[u] != numel || ix.shard[u] > numel / S + 4096 ||
		    ix.shard[u] * S < numel) {
			sl_error_at(path, "unit %d: %llu elements in %d shards of %llu, the model has %llu: "
			       "the checkpoint is of another model or damaged", u,
			       (unsigned long long)ix.unit_numel[u], ix.shard_size,
			       (unsigned long long)ix.shard[u], (unsigned long long)numel);
			rc = -1;
		}
	}
	if (rc == 0 && want_opt && !ix.optimizer) {
		sl_error_at(path, "holds no optimizer state (written with checkpoint.optimizer: false)");
		rc = -1;
	}
	if (rc == 0) {
		config = ckpt_attr_get_str(f, "config");
		if (!config) {
			sl_error_at(path, "has no config attribute: remove this checkpoint directory");
			rc = -1;
		}
	}
	if (ckpt_agree(rc, world) < 0)
		goto out_free;

	/*
	 * Every rank file, before any virtual read: a missing or short source would read as fill
	 * value without an error.  The files are spread over the ranks; all of them verify each
	 * dataset the index may map, optimizer moments included when present.
	 */
	for (int i = g->rank; i < ix.shard_size && rc == 0; i += g->world)
		rc = verify_rank_file(dir, &ix, i, ix.optimizer ? 3 : 1);
	if (ckpt_agree(rc, world) < 0) {
		if (g->rank == 0)
			sl_error("%s: the checkpoint failed verification (see above); nothing was "
				 "loaded", dir);
		goto out_free;
	}

	for (int k = 0; k < 3 && rc == 0; k++)
		if (bufs[k])
			rc = read_set(f, path, dir, set_name[k], g, bufs[k]);
	if (ckpt_agree(rc, world) < 0)
		goto out_free;

	s->step = ix.step;
	s->seed = ix.seed;
	s->data_cursor = ix.data_cursor;
	s->config_yaml = config;
	config = NULL;
	ret = 0;
out_free:
	free(config);
	idx_free(&ix);
	if (f >= 0)
		H5Fclose(f);
	return ret;
}
