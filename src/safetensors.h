/*
 * safetensors: Hugging Face model directories and weights.
 *
 * Resolves a model path (a plain HF model dir, or an HF cache dir models--Org--Name with
 * refs/ and snapshots/REV), opens model.safetensors or the shards named by
 * model.safetensors.index.json (mmap), validates every header before use (header length within the
 * file, offsets inside the data and matching shape x dtype, no overlaps), converts F32/BF16/F16 to
 * float, loads a struct sl_layout's tensors into per-unit float buffers, and writes safetensors
 * files (exports, test models).  Knows tensor names and shapes, not how the model computes.
 */
#ifndef SL_SAFETENSORS_H
#define SL_SAFETENSORS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model.h"

enum sl_dtype { SL_DT_F32, SL_DT_BF16, SL_DT_F16, SL_DT_OTHER };

struct sl_st_tensor {
	char *name;
	enum sl_dtype dtype;
	char dtype_name[16];		/* as written in the header, e.g. "F32" */
	int ndim;
	int64_t shape[8];
	size_t numel;
	const void *data;		/* into the file's mapping */
	size_t nbytes;
	int file;			/* index into sl_weights.files */
};

struct sl_st_file {
	char *path;
	void *map;
	size_t size;
};

struct sl_weights {
	char dir[4096];			/* the resolved model dir */
	int n_files;
	struct sl_st_file *files;
	int n_tensors;
	struct sl_st_tensor *tensors;	/* sorted by name */
};

/*
 * Resolve @path (+ @revision, "" for refs/main) to a directory holding config.json.
 * An HF cache dir is models--Org--Name (or its parent hub dir is not accepted); errors name what
 * was looked for.  @revision (NULL or "" = main) is a ref name under refs/ (main, a branch, pr/1),
 * a snapshot's full commit hash or a unique prefix of one; it is an error for a plain model dir.
 */
int sl_hf_resolve(const char *path, const char *revision, char *out_dir, size_t n);

/*
 * Open and validate every safetensors file of @dir.  Errors name the file and tensor.
 * With model.safetensors.index.json, each shard it names is opened once, every tensor it lists
 * must be in that shard, and tensors of the shards it does not list are warned about and ignored
 * (as transformers does).  A tensor name held by two files is an error.  On error @w is closed.
 */
int sl_weights_open(struct sl_weights *w, const char *dir);
/* Open and validate one .safetensors file (w->dir = its directory). */
int sl_weights_open_file(struct sl_weights *w, const char *file);
void sl_weights_close(struct sl_weights *w);
const struct sl_st_tensor *sl_weights_find(const struct sl_weights *w, const char *name);
/*
 * The checkpoint tensor of layout tensor @name: under that name or, in the published Qwen3.5
 * vision-language layout, with model. replaced by model.language_model. (NULL if neither).
 */
const struct sl_st_tensor *sl_weights_find_layout(const struct sl_weights *w, const char *name);
/* Convert @t to float (t->numel elements); t->dtype must not be SL_DT_OTHER (NaNs then). */
void sl_st_to_f32(const struct sl_st_tensor *t, float *out);

/*
 * Fill units[u] (float, lay->unit_numel[u] elements each) from @w: every tensor of @lay must be
 * present with its shape, except optional ones (the head), which are initialized as
 * lay->t[i].init says (normal with std @init_std from a generator seeded with @seed) and reported in
 * *n_initialized (names printed by the caller from @initialized[i], may be NULL).
 * Tensors in @w that the layout does not use are ignored (counted in *n_unused when non-NULL).
 */
int sl_weights_load_layout(const struct sl_weights *w, const struct sl_layout *lay,
			   float **units, double init_std, uint64_t seed, bool *initialized,
			   int *n_initialized, int *n_unused);

/* Write a safetensors file: n tensors given as float host arrays, stored as @dtype (F32 or BF16). */
struct sl_st_out {
	const char *name;
	int ndim;
	int64_t shape[8];
	const float *data;
};
int sl_st_write(const char *path, const struct sl_st_out *t, int n, enum sl_dtype dtype);

/*
 * Fill @x with n samples of normal(0, @std) from a splitmix64 + Box-Muller generator seeded with
 * @seed: the same numbers on every machine (optional tensors absent from a checkpoint, test models).
 */
void sl_st_fill_normal(float *x, size_t n, double std, uint64_t seed);

/* bf16 <-> float (round to nearest even) */
float sl_bf16_to_f32(uint16_t h);
uint16_t sl_f32_to_bf16(float f);
float sl_f16_to_f32(uint16_t h);

#endif
