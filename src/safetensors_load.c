/*
 * safetensors_load: a struct sl_layout's tensors from opened weights (see safetensors.h).
 *
 * Owns: finding a layout tensor in a checkpoint (the model.language_model. names of the
 * Qwen3.5 vision-language layout, per-expert views of transformers 5's fused MoE experts),
 * checking every shape and dtype before converting anything, filling the float unit buffers,
 * and initializing the optional tensors a checkpoint lacks.
 */
#include "safetensors.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "safetensors_impl.h"

/* ---- loading a layout ------------------------------------------------------------------------ */

/* FNV-1a: a tensor's stream depends on its name, not on the order tensors are initialized in */
static uint64_t name_hash(const char *s)
{
	uint64_t h = 0xcbf29ce484222325ull;

	for (; *s; s++)
		h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
	return h;
}

/*
 * transformers 5 holds a Qwen3-MoE layer's experts fused and may save them so:
 * mlp.experts.gate_up_proj (E, 2Im, H), expert e's gate rows then its up rows, and
 * mlp.experts.down_proj (E, H, Im).  For a per-expert name (mlp.experts.N.gate_proj.weight, ...)
 * that the checkpoint lacks, *view = expert N's slice of the fused tensor, *fused = that tensor.
 * Returns 1 with a view, 0 when there is no fused tensor either, -1 on a bad one (printed).
 */
static int fused_expert(const struct sl_weights *w, const struct sl_tensor_info *ti,
			struct sl_st_tensor *view, const struct sl_st_tensor **fused)
{
	const char *p = strstr(ti->name, ".mlp.experts.");
	const struct sl_st_tensor *t;
	char proj[16], fname[256], have[256];
	int e, end = 0;
	bool down, up;
	size_t esz, off;
	int64_t ws[3];

	if (!p || ti->ndim != 2 ||
	    sscanf(p, ".mlp.experts.%d.%15[a-z]_proj.weight%n", &e, proj, &end) != 2 ||
	    p[end] != '\0' || e < 0)
		return 0;
	down = !strcmp(proj, "down");
	up = !strcmp(proj, "up");
	if (!down && !up && strcmp(proj, "gate"))
		return 0;
	snprintf(fname, sizeof(fname), "%.*s.mlp.experts.%s", (int)(p - ti->name), ti->name,
		 down ? "down_proj" : "gate_up_proj");
	/* model.language_model.* too (the published Qwen3.5-MoE layout) */
	t = sl_weights_find_layout(w, fname);
	if (!t)
		return 0;
	ws[0] = t->ndim == 3 ? t->shape[0] : 0;
	ws[1] = down ? ti->shape[0] : 2 * ti->shape[0];
	ws[2] = ti->shape[1];
	if (t->ndim != 3 || t->shape[0] <= e || t->shape[1] != ws[1] || t->shape[2] != ws[2]) {
		st_shape_str(have, sizeof(have), t->ndim, t->shape);
		sl_error("%s: fused tensor %s has shape %s; config.json needs (experts >= %d, %lld, "
			 "%lld) for %s", w->files[t->file].path, t->name, have, e + 1,
			 (long long)ws[1], (long long)ws[2], ti->name);
		return -1;
	}
	esz = t->dtype == SL_DT_F32 ? 4 : 2;
	off = (size_t)e * ws[1] * ws[2] + (up ? ti->numel : 0);
	*view = *t;
	view->ndim = 2;
	view->shape[0] = ti->shape[0];
	view->shape[1] = ti->shape[1];
	view->numel = ti->numel;
	view->nbytes = ti->numel * esz;
	view->data = (const char *)t->data + off * esz;
	*fused = t;
	return 1;
}

const struct sl_st_tensor *sl_weights_find_layout(const struct sl_weights *w, const char *name)
{
	const struct sl_st_tensor *t = sl_weights_find(w, name);
	char alt[256];

	if (t || strncmp(name, "model.", 6))
		return t;
	snprintf(alt, sizeof(alt), "model.language_model.%s", name + 6);
	return sl_weights_find(w, alt);
}

/* does checkpoint tensor @t have layout tensor @ti's shape ((d0, 1, d1) for a Conv1d weight) */
static bool same_shape(const struct sl_st_tensor *t, const struct sl_tensor_info *ti)
{
	bool same = t->ndim == ti->ndim;

	if (ti->unsqueeze1)
		return t->ndim == 3 && t->shape[0] == ti->shape[0] && t->shape[1] == 1 &&
		       t->shape[2] == ti->shape[1];
	for (int d = 0; same && d < t->ndim; d++)
		same = t->shape[d] == ti->shape[d];
	return same;
}

int sl_weights_load_layout(const struct sl_weights *w, const struct sl_layout *lay,
			   float **units, double init_std, uint64_t seed, bool *initialized,
			   int *n_initialized, int *n_unused)
{
	char have[256], want[256];
	int n_missing = 0, first_missing = -1, n_init = 0, ret = -1;
	bool *used;

	used = calloc(w->n_tensors + 1, sizeof(*used));
	if (!used) {
		sl_error("%s: out of memory", w->dir);
		return -1;
	}
	/* check everything before converting anything, so errors come before minutes of copying */
	for (int i = 0; i < lay->n_tensors; i++) {
		const struct sl_tensor_info *ti = &lay->t[i];
		const struct sl_st_tensor *t = sl_weights_find_layout(w, ti->name), *fu;
		struct sl_st_tensor view;

		if (ti->unit < 0 || ti->unit >= lay->n_units ||
		    ti->offset + ti->numel > lay->unit_numel[ti->unit]) {
			sl_error("layout: tensor %s does not fit in its unit %d", ti->name, ti->unit);
			goto out_free_used;
		}
		if (!t) {
			int f = fused_expert(w, ti, &view, &fu);

			if (f < 0)
				goto out_free_used;
			if (f > 0) {
				used[fu - w->tensors] = true;
				t = fu;
				goto check_dtype;
			}
		}
		if (!t) {
			if (!ti->optional && !n_missing++)
				first_missing = i;
			continue;
		}
		used[t - w->tensors] = true;
		if (!same_shape(t, ti)) {
			int64_t s3[3] = { ti->shape[0], 1, ti->shape[1] };

			st_shape_str(have, sizeof(have), t->ndim, t->shape);
			if (ti->unsqueeze1)
				st_shape_str(want, sizeof(want), 3, s3);
			else
				st_shape_str(want, sizeof(want), ti->ndim, ti->shape);
			sl_error("%s: tensor %s has shape %s, config.json says %s",
				 w->files[t->file].path, t->name, have, want);
			goto out_free_used;
		}
check_dtype:
		if (t->dtype == SL_DT_OTHER) {
			sl_error("%s: tensor %s has dtype %s; shardlm reads F32, BF16 and F16 "
				 "(convert the checkpoint, e.g. save it again in bfloat16)",
				 w->files[t->file].path, t->name, t->dtype_name);
			goto out_free_used;
		}
	}
	if (n_missing) {
		if (n_missing > 1)
			sl_error("%s: tensor %s is missing from the checkpoint (and %d more); the "
				 "weights do not match config.json", w->dir,
				 lay->t[first_missing].name, n_missing - 1);
		else
			sl_error("%s: tensor %s is missing from the checkpoint; the weights do not "
				 "match config.json", w->dir, lay->t[first_missing].name);
		goto out_free_used;
	}

	for (int i = 0; i < lay->n_tensors; i++) {
		const struct sl_tensor_info *ti = &lay->t[i];
		const struct sl_st_tensor *t = sl_weights_find_layout(w, ti->name), *fu;
		float *dst = units[ti->unit] + ti->offset;
		struct sl_st_tensor view;

		if (!t && fused_expert(w, ti, &view, &fu) > 0)
			t = &view;
		if (initialized)
			initialized[i] = !t;
		if (t) {
			sl_st_to_f32(t, dst);
			continue;
		}
		n_init++;
		switch (ti->init) {
		case SL_INIT_NORMAL:
			sl_st_fill_normal(dst, ti->numel, init_std, seed ^ name_hash(ti->name));
			break;
		case SL_INIT_ONES:
			for (size_t k = 0; k < ti->numel; k++)
				dst[k] = 1.0f;
			break;
		default:
			memset(dst, 0, ti->numel * sizeof(*dst));
		}
	}
	if (n_initialized)
		*n_initialized = n_init;
	if (n_unused) {
		*n_unused = 0;
		for (int i = 0; i < w->n_tensors; i++)
			*n_unused += !used[i];
	}
	ret = 0;

out_free_used:
	free(used);
	return ret;
}
