/*
 * ckpt_impl.h: what the files of the checkpoint module share: ckpt.c (writing a step directory
 * and its commit protocol), ckpt_h5.c (HDF5 errors, attributes, the agreement of every rank),
 * ckpt_dirs.c (paths, fsync, the step directories of a root, the space check),
 * ckpt_geom.c (shard geometry: element ranges and their checks),
 * ckpt_read.c (verifying and reading a checkpoint).  Only ckpt*.c include it.
 */
#ifndef SL_CKPT_IMPL_H
#define SL_CKPT_IMPL_H

#include <hdf5.h>
#include <mpi.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ckpt.h"
#include "log.h"

/* Checksums are taken over the in-memory floats, equal to the file's F32LE bytes only here. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the ckpt*.c files assume a little-endian host"
#endif

#define NAME_LEN 32			/* "rank-RRRRR.h5", "unit-UUUU" and room to spare */

static const char *const set_name[3] = { "master", "m", "v" };

/* the innermost message of HDF5's error stack (ckpt_h5.c) */
const char *ckpt_h5_msg(void);

/*
 * Fatal: an HDF5 call that fails only on a bug or exhausted memory (dataspaces, property lists,
 * selections).  Evaluates to the call's value, so ids can be taken from it.
 */
#define H5_CHECK(call)                                                                     \
	({                                                                                 \
		__typeof__(call) h5_r_ = (call);                                           \
		if (h5_r_ < 0) {                                                           \
			sl_error("%s:%d: %s failed: %s", __FILE__, __LINE__, #call,        \
				 ckpt_h5_msg());                                                \
			MPI_Abort(MPI_COMM_WORLD, 1);                                      \
		}                                                                          \
		h5_r_;                                                                     \
	})

/* 64-bit FNV-1a: a simple non-cryptographic hash, enough to catch damaged or altered bytes. */
#define FNV_OFFSET 0xcbf29ce484222325ull
#define FNV_PRIME 0x100000001b3ull

static inline uint64_t fnv1a(uint64_t h, const void *data, size_t n)
{
	const unsigned char *p = data;

	for (size_t i = 0; i < n; i++) {
		h ^= p[i];
		h *= FNV_PRIME;
	}
	return h;
}

/* ckpt_h5.c: HDF5 errors, the agreement, attributes */
void ckpt_h5_err(const char *file, const char *call, const char *what);
int ckpt_agree(int rc, MPI_Comm comm);
int ckpt_attr_put(hid_t obj, const char *name, hid_t type, size_t n, const void *val);
int ckpt_attr_put_str(hid_t obj, const char *name, const char *s);
int ckpt_attr_put_names(hid_t obj, const char *name, const char (*s)[NAME_LEN], size_t n);
int ckpt_attr_get(hid_t obj, const char *name, hid_t memtype, size_t n, void *val);
char *ckpt_attr_get_str(hid_t obj, const char *name);

/* ckpt_dirs.c: paths, fsync, step directories */
int ckpt_join(char *out, size_t n, const char *a, const char *b);
int ckpt_fsync_path(const char *path, bool dir);
int ckpt_remove_dir(const char *dir);
int ckpt_prepare_dir(const char *root, const char *dir);
void ckpt_prune(const char *root, int cur, int keep);

/* ckpt_geom.c: the shard geometry */

/*
 * A flat element range [a, b) of a row-major tensor as at most three rectangles: the partial first
 * row, the whole rows, the partial last row.  piece.flat is the first element's flat index.
 */
struct piece {
	hsize_t start[2], count[2];
	size_t flat, n;
};

int ckpt_split_range(const struct sl_tensor_info *t, size_t a, size_t b, struct piece *p);
bool ckpt_overlap(const struct sl_tensor_info *t, size_t lo, size_t hi, size_t *a, size_t *b);
void ckpt_range_of(const struct sl_ckpt_geom *g, int u, size_t *a, size_t *n);
int ckpt_check_geom(const struct sl_ckpt_geom *g, MPI_Comm comm);

#endif
