/*
 * safetensors_write: writing safetensors files (exports, test models; see safetensors.h).
 *
 * Owns: the header (__metadata__ format pt, tensors in the order given, padded with spaces so the
 * data starts 8-byte aligned), F32 or BF16 data, and an atomic replace (write PATH.tmp, fsync,
 * rename).
 */
#include "safetensors.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"
#include "safetensors_impl.h"

/* ---- writing --------------------------------------------------------------------------------- */

int sl_st_write(const char *path, const struct sl_st_out *t, int n, enum sl_dtype dtype)
{
	const char *dname = dtype == SL_DT_BF16 ? "BF16" : "F32";
	size_t esize = dtype == SL_DT_BF16 ? 2 : 4, hlen, pad;
	uint64_t off = 0, hlen64;
	char tmp[4096], *text = NULL;
	uint16_t buf[4096];
	json_t *hdr, *meta;
	int ret = -1;
	FILE *f;

	if (dtype != SL_DT_F32 && dtype != SL_DT_BF16) {
		sl_error("%s: safetensors files are written as F32 or BF16", path);
		return -1;
	}
	hdr = json_object();
	meta = json_pack("{s:s}", "format", "pt");
	if (!hdr || !meta || json_object_set_new(hdr, "__metadata__", meta)) {
		sl_error("%s: out of memory", path);
		goto out_free_hdr;
	}
	for (int i = 0; i < n; i++) {
		json_t *shape = json_array(), *e;
		size_t numel = 1;

		if (t[i].ndim < 0 || t[i].ndim > 8) {
			json_decref(shape);
			sl_error("%s: tensor %s has %d dimensions", path, t[i].name, t[i].ndim);
			goto out_free_hdr;
		}
		for (int d = 0; d < t[i].ndim; d++) {
			json_array_append_new(shape, json_integer(t[i].shape[d]));
			numel *= t[i].shape[d] > 0 ? t[i].shape[d] : 0;
		}
		if (numel && !t[i].data) {
			json_decref(shape);
			sl_error("%s: tensor %s has no data", path, t[i].name);
			goto out_free_hdr;
		}
		e = json_pack("{s:s,s:o,s:[I,I]}", "dtype", dname, "shape", shape, "data_offsets",
			      (json_int_t)off, (json_int_t)(off + numel * esize));
		if (!e) {
			sl_error("%s: out of memory", path);
			goto out_free_hdr;
		}
		if (json_object_get(hdr, t[i].name)) {
			json_decref(e);
			sl_error("%s: tensor %s is written twice", path, t[i].name);
			goto out_free_hdr;
		}
		json_object_set_new(hdr, t[i].name, e);
		off += numel * esize;
	}
	text = json_dumps(hdr, JSON_COMPACT | JSON_PRESERVE_ORDER);
	if (!text) {
		sl_error("%s: out of memory", path);
		goto out_free_hdr;
	}
	/* spaces pad the header so the data starts 8-byte aligned in the file (and the mapping) */
	hlen = strlen(text);
	pad = (8 - hlen % 8) % 8;
	hlen64 = hlen + pad;

	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	f = fopen(tmp, "wb");
	if (!f) {
		sl_error("%s: cannot create: %s", tmp, strerror(errno));
		goto out_free_text;
	}
	if (fwrite(&hlen64, 8, 1, f) != 1 || fwrite(text, 1, hlen, f) != hlen ||
	    fwrite("        ", 1, pad, f) != pad)
		goto out_write_error;
	for (int i = 0; i < n; i++) {
		size_t numel = 1;

		for (int d = 0; d < t[i].ndim; d++)
			numel *= t[i].shape[d] > 0 ? t[i].shape[d] : 0;
		if (dtype == SL_DT_F32) {
			if (numel && fwrite(t[i].data, 4, numel, f) != numel)
				goto out_write_error;
			continue;
		}
		for (size_t k = 0; k < numel; k += 4096) {
			size_t m = numel - k < 4096 ? numel - k : 4096;

			for (size_t j = 0; j < m; j++)
				buf[j] = sl_f32_to_bf16(t[i].data[k + j]);
			if (fwrite(buf, 2, m, f) != m)
				goto out_write_error;
		}
	}
	if (fflush(f) || fsync(fileno(f)))
		goto out_write_error;
	if (fclose(f)) {
		f = NULL;
		goto out_write_error;
	}
	if (rename(tmp, path)) {
		sl_error("%s: cannot rename %s to it: %s", path, tmp, strerror(errno));
		unlink(tmp);
		goto out_free_text;
	}
	ret = 0;
	goto out_free_text;

out_write_error:
	sl_error("%s: cannot write: %s (disk full?)", tmp, strerror(errno));
	if (f)
		fclose(f);
	unlink(tmp);
out_free_text:
	free(text);
out_free_hdr:
	json_decref(hdr);
	return ret;
}
