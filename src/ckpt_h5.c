/*
 * ckpt_h5: the checkpoint files' HDF5 helpers: the innermost message of HDF5's error stack,
 * errors naming the file and the call, the agreement of every rank on a phase's status, and
 * scalar, array and string attributes written and read back with their sizes checked.
 */
#include "ckpt_impl.h"

#include <hdf5.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"

/* ---- errors ---------------------------------------------------------------------------------- */

static herr_t h5_walk(unsigned n, const H5E_error2_t *e, void *data)
{
	char *buf = data;

	/* walking downward, the last entry is the innermost: the real cause (errno text included) */
	if (e->desc && *e->desc)
		snprintf(buf, 512, "%s (in %s)", e->desc, e->func_name ? e->func_name : "?");
	return 0;
}

/* The innermost message of HDF5's error stack (printing is off), then the stack cleared. */
const char *ckpt_h5_msg(void)
{
	static char buf[512];

	buf[0] = '\0';
	H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, h5_walk, buf);
	H5Eclear2(H5E_DEFAULT);
	return buf[0] ? buf : "no detail from HDF5";
}


/* "@file: @call failed: <HDF5's reason>" for I/O that can fail on a full disk or a bad file */
void ckpt_h5_err(const char *file, const char *call, const char *what)
{
	sl_error("%s: %s(%s) failed: %s", file, call, what, ckpt_h5_msg());
}

/* Every rank learns whether any rank failed; 0 if none, else -1. */
int ckpt_agree(int rc, MPI_Comm comm)
{
	int mine = rc < 0 ? 1 : 0, any = 0;

	if (MPI_Allreduce(&mine, &any, 1, MPI_INT, MPI_MAX, comm) != MPI_SUCCESS) {
		sl_error("ckpt: MPI_Allreduce of the checkpoint status failed");
		MPI_Abort(comm, 1);
	}
	return any ? -1 : 0;
}

/* ---- attributes ------------------------------------------------------------------------------ */

/* @n == 0: a scalar attribute, else an array of @n elements */
int ckpt_attr_put(hid_t obj, const char *name, hid_t type, size_t n, const void *val)
{
	hsize_t dim = n;
	hid_t sp = H5_CHECK(n ? H5Screate_simple(1, &dim, NULL) : H5Screate(H5S_SCALAR));
	hid_t a;
	int rc = -1;

	a = H5Acreate2(obj, name, type, sp, H5P_DEFAULT, H5P_DEFAULT);
	if (a < 0)
		goto out_close_space;
	if (H5Awrite(a, type, val) >= 0)
		rc = 0;
	H5Aclose(a);
out_close_space:
	H5Sclose(sp);
	return rc;
}

/* a fixed-length string attribute (h5dump prints it as text) */
int ckpt_attr_put_str(hid_t obj, const char *name, const char *s)
{
	hid_t t = H5_CHECK(H5Tcopy(H5T_C_S1));
	int rc;

	H5_CHECK(H5Tset_size(t, strlen(s) + 1));
	rc = ckpt_attr_put(obj, name, t, 0, s);
	H5Tclose(t);
	return rc;
}

/* an array of @n fixed-length strings of NAME_LEN bytes */
int ckpt_attr_put_names(hid_t obj, const char *name, const char (*s)[NAME_LEN], size_t n)
{
	hid_t t = H5_CHECK(H5Tcopy(H5T_C_S1));
	int rc;

	H5_CHECK(H5Tset_size(t, NAME_LEN));
	rc = ckpt_attr_put(obj, name, t, n, s);
	H5Tclose(t);
	return rc;
}

/* Read an attribute of exactly @n elements (@n == 1 also accepts a scalar). */
int ckpt_attr_get(hid_t obj, const char *name, hid_t memtype, size_t n, void *val)
{
	hid_t a, sp;
	hssize_t got;
	int rc = -1;

	if (H5Aexists(obj, name) <= 0)
		return -1;
	a = H5Aopen(obj, name, H5P_DEFAULT);
	if (a < 0)
		return -1;
	sp = H5Aget_space(a);
	got = sp < 0 ? -1 : H5Sget_simple_extent_npoints(sp);
	if (got == (hssize_t)n && H5Aread(a, memtype, val) >= 0)
		rc = 0;
	if (sp >= 0)
		H5Sclose(sp);
	H5Aclose(a);
	return rc;
}

/* A string attribute (fixed or variable length) as a malloc'ed C string. */
char *ckpt_attr_get_str(hid_t obj, const char *name)
{
	hid_t a, ft, mt = -1;
	char *s = NULL;

	if (H5Aexists(obj, name) <= 0)
		return NULL;
	a = H5Aopen(obj, name, H5P_DEFAULT);
	if (a < 0)
		return NULL;
	ft = H5Aget_type(a);
	if (ft < 0 || H5Tget_class(ft) != H5T_STRING)
		goto out_close;
	mt = H5_CHECK(H5Tcopy(H5T_C_S1));
	if (H5Tis_variable_str(ft) > 0) {
		char *vs = NULL;

		H5_CHECK(H5Tset_size(mt, H5T_VARIABLE));
		if (H5Aread(a, mt, &vs) >= 0 && vs) {
			s = strdup(vs);
			H5free_memory(vs);
		}
	} else {
		size_t n = H5Tget_size(ft);

		H5_CHECK(H5Tset_size(mt, n + 1));
		s = calloc(n + 2, 1);
		if (s && H5Aread(a, mt, s) < 0) {
			free(s);
			s = NULL;
		}
	}
out_close:
	if (mt >= 0)
		H5Tclose(mt);
	if (ft >= 0)
		H5Tclose(ft);
	H5Aclose(a);
	return s;
}
