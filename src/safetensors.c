/*
 * safetensors: Hugging Face model directories and weights (see safetensors.h).
 *
 * Owns: opening model.safetensors or the shards of model.safetensors.index.json read-only with
 * mmap, and validating every header before any byte of data is trusted; the small helpers the
 * module's files share.  A file is "<u64 LE header length><JSON header><data>"; offsets in the
 * header are relative to the start of the data.  Resolving a model path is in
 * safetensors_resolve.c, the F32/BF16/F16 <-> float conversions and the generator in
 * safetensors_convert.c, loading a struct sl_layout into float unit buffers in
 * safetensors_load.c, writing safetensors files in safetensors_write.c.
 */
#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"
#include "safetensors_impl.h"

/* A header this large is not a model's (a 27B model's is ~100 KB): refuse before parsing it. */
#define ST_MAX_HEADER (100ull << 20)

/* ---- small helpers --------------------------------------------------------------------------- */

bool st_is_file(const char *p)
{
	struct stat st;

	return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

/* @a/@b into @out; refuses to truncate */
int st_join(char *out, size_t n, const char *a, const char *b)
{
	int k = snprintf(out, n, "%s/%s", a, b);

	if (k < 0 || (size_t)k >= n) {
		sl_error("%s/%s: path too long", a, b);
		return -1;
	}
	return 0;
}

void st_shape_str(char *buf, size_t n, int ndim, const int64_t *shape)
{
	size_t off = 0;

	off += snprintf(buf + off, n - off, "[");
	for (int i = 0; i < ndim && off < n; i++)
		off += snprintf(buf + off, n - off, "%s%lld", i ? ", " : "", (long long)shape[i]);
	if (off < n)
		snprintf(buf + off, n - off, "]");
}

/* ---- opening and validating safetensors files ------------------------------------------------ */

static const struct {
	const char *name;
	int size;
	enum sl_dtype dt;
} dtypes[] = {
	{ "F32", 4, SL_DT_F32 },	{ "BF16", 2, SL_DT_BF16 },	{ "F16", 2, SL_DT_F16 },
	{ "F64", 8, SL_DT_OTHER },	{ "I64", 8, SL_DT_OTHER },	{ "U64", 8, SL_DT_OTHER },
	{ "I32", 4, SL_DT_OTHER },	{ "U32", 4, SL_DT_OTHER },	{ "I16", 2, SL_DT_OTHER },
	{ "U16", 2, SL_DT_OTHER },	{ "I8", 1, SL_DT_OTHER },	{ "U8", 1, SL_DT_OTHER },
	{ "BOOL", 1, SL_DT_OTHER },	{ "F8_E4M3", 1, SL_DT_OTHER },	{ "F8_E5M2", 1, SL_DT_OTHER },
	{ "F8_E8M0", 1, SL_DT_OTHER },	{ "C64", 8, SL_DT_OTHER },
};

struct range {
	uint64_t begin, end;
	const char *name;
};

static int range_cmp(const void *a, const void *b)
{
	const struct range *x = a, *y = b;

	if (x->begin != y->begin)
		return x->begin < y->begin ? -1 : 1;
	return x->end < y->end ? -1 : x->end > y->end;
}

static int tensor_cmp(const void *a, const void *b)
{
	return strcmp(((const struct sl_st_tensor *)a)->name, ((const struct sl_st_tensor *)b)->name);
}

static bool get_u64(json_t *v, uint64_t *out)
{
	if (!json_is_integer(v) || json_integer_value(v) < 0)
		return false;
	*out = (uint64_t)json_integer_value(v);
	return true;
}

/* one header entry -> @t (name not yet set); @data_size bounds the offsets */
static int parse_entry(const char *file, const char *name, json_t *e, uint64_t data_size,
		       struct sl_st_tensor *t, struct range *r)
{
	json_t *dt = json_object_get(e, "dtype");
	json_t *shape = json_object_get(e, "shape");
	json_t *offs = json_object_get(e, "data_offsets");
	char sbuf[256];
	uint64_t b, end, numel = 1, want;
	int esize = 0;
	size_t i;
	json_t *v;

	if (!json_is_object(e)) {
		sl_error_at(file, "tensor %s: header entry is not an object", name);
		return -1;
	}
	if (!json_is_string(dt)) {
		sl_error_at(file, "tensor %s: dtype is missing or not a string", name);
		return -1;
	}
	if (!json_is_array(shape) || json_array_size(shape) > 8) {
		sl_error_at(file, "tensor %s: shape is missing or not a list of at most 8 dimensions",
		       name);
		return -1;
	}
	t->ndim = (int)json_array_size(shape);
	json_array_foreach(shape, i, v) {
		uint64_t d;

		if (!get_u64(v, &d)) {
			sl_error_at(file, "tensor %s: shape[%zu] is not a non-negative integer", name, i);
			return -1;
		}
		t->shape[i] = (int64_t)d;
		if (d && numel > UINT64_MAX / d) {
			sl_error_at(file, "tensor %s: shape overflows", name);
			return -1;
		}
		numel *= d;
	}
	t->numel = numel;
	if (!json_is_array(offs) || json_array_size(offs) != 2 ||
	    !get_u64(json_array_get(offs, 0), &b) || !get_u64(json_array_get(offs, 1), &end)) {
		sl_error_at(file, "tensor %s: data_offsets must be [begin, end] (non-negative integers)",
		       name);
		return -1;
	}
	if (end < b) {
		sl_error_at(file, "tensor %s: data_offsets [%llu, %llu] end before they begin", name,
		       (unsigned long long)b, (unsigned long long)end);
		return -1;
	}
	if (end > data_size) {
		sl_error_at(file, "tensor %s: data_offsets [%llu, %llu] go beyond the data (%llu bytes); "
		       "the file is truncated or corrupt", name, (unsigned long long)b,
		       (unsigned long long)end, (unsigned long long)data_size);
		return -1;
	}

	snprintf(t->dtype_name, sizeof(t->dtype_name), "%s", json_string_value(dt));
	t->dtype = SL_DT_OTHER;
	for (i = 0; i < sizeof(dtypes) / sizeof(dtypes[0]); i++) {
		if (!strcmp(dtypes[i].name, json_string_value(dt))) {
			t->dtype = dtypes[i].dt;
			esize = dtypes[i].size;
		}
	}
	/* a dtype we do not know the size of cannot be size-checked; it fails if ever used */
	if (esize) {
		want = numel * esize;
		if (numel && want / esize != numel)
			want = UINT64_MAX;
		if (end - b != want) {
			st_shape_str(sbuf, sizeof(sbuf), t->ndim, t->shape);
			sl_error_at(file, "tensor %s: data_offsets [%llu, %llu] hold %llu bytes, but "
			       "shape %s of %s needs %llu", name, (unsigned long long)b,
			       (unsigned long long)end, (unsigned long long)(end - b), sbuf,
			       t->dtype_name, (unsigned long long)want);
			return -1;
		}
	}
	t->nbytes = end - b;
	r->begin = b;
	r->end = end;
	r->name = name;
	return 0;
}

/* map @path, validate its header, append its tensors to @w (unsorted) */
static int st_add_file(struct sl_weights *w, const char *path)
{
	struct sl_st_file *f;
	struct range *ranges = NULL;
	uint64_t hlen, data_size;
	const uint8_t *base;
	json_error_t jerr;
	json_t *hdr, *e;
	const char *key;
	struct stat st;
	int fd, nr = 0, ret = -1;
	size_t cap;
	void *map;

	fd = open(path, O_RDONLY);
	if (fd < 0) {
		sl_error_at(path, "cannot open: %s", strerror(errno));
		return -1;
	}
	if (fstat(fd, &st)) {
		sl_error_at(path, "cannot stat: %s", strerror(errno));
		close(fd);
		return -1;
	}
	if (st.st_size < 8) {
		sl_error_at(path, "file is %lld bytes, shorter than the 8-byte header length: truncated, "
		       "or not a safetensors file", (long long)st.st_size);
		close(fd);
		return -1;
	}
	map = mmap(NULL, st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
	close(fd);
	if (map == MAP_FAILED) {
		sl_error_at(path, "cannot mmap: %s", strerror(errno));
		return -1;
	}
	f = realloc(w->files, (w->n_files + 1) * sizeof(*f));
	if (!f) {
		munmap(map, st.st_size);
		sl_error_at(path, "out of memory");
		return -1;
	}
	w->files = f;
	f = &w->files[w->n_files++];
	f->map = map;
	f->size = st.st_size;
	f->path = strdup(path);
	if (!f->path) {
		sl_error_at(path, "out of memory");
		return -1;
	}

	base = map;
	memcpy(&hlen, base, 8);
	if (hlen > ST_MAX_HEADER) {
		sl_error_at(path, "header length %llu is absurd (over 100 MB): not a safetensors file",
		       (unsigned long long)hlen);
		return -1;
	}
	if (hlen > (uint64_t)st.st_size - 8) {
		sl_error_at(path, "header length %llu goes beyond the end of the file (%lld bytes): "
		       "truncated", (unsigned long long)hlen, (long long)st.st_size);
		return -1;
	}
	data_size = st.st_size - 8 - hlen;
	hdr = json_loadb((const char *)base + 8, hlen, JSON_REJECT_DUPLICATES, &jerr);
	if (!hdr) {
		sl_error_at(path, "header is not valid JSON (header byte %d: %s)", jerr.position,
		       jerr.text);
		return -1;
	}
	if (!json_is_object(hdr)) {
		sl_error_at(path, "header is not a JSON object");
		goto out_free_hdr;
	}

	cap = json_object_size(hdr);
	{
		struct sl_st_tensor *t = realloc(w->tensors, (w->n_tensors + cap + 1) * sizeof(*t));

		if (!t) {
			sl_error_at(path, "out of memory");
			goto out_free_hdr;
		}
		w->tensors = t;
	}
	ranges = calloc(cap + 1, sizeof(*ranges));
	if (!ranges) {
		sl_error_at(path, "out of memory");
		goto out_free_hdr;
	}
	json_object_foreach(hdr, key, e) {
		struct sl_st_tensor *t = &w->tensors[w->n_tensors];
		const char *mk;
		json_t *mv;

		if (!strcmp(key, "__metadata__")) {
			if (!json_is_object(e)) {
				sl_error_at(path, "__metadata__ is not an object");
				goto out_free_ranges;
			}
			json_object_foreach(e, mk, mv) {
				if (!json_is_string(mv)) {
					sl_error_at(path, "__metadata__.%s is not a string", mk);
					goto out_free_ranges;
				}
			}
			continue;
		}
		memset(t, 0, sizeof(*t));
		if (parse_entry(path, key, e, data_size, t, &ranges[nr]))
			goto out_free_ranges;
		t->name = strdup(key);
		if (!t->name) {
			sl_error_at(path, "out of memory");
			goto out_free_ranges;
		}
		ranges[nr].name = t->name;
		t->data = base + 8 + hlen + ranges[nr].begin;
		t->file = w->n_files - 1;
		w->n_tensors++;
		nr++;
	}

	/* every byte belongs to at most one tensor; empty tensors occupy nothing */
	qsort(ranges, nr, sizeof(*ranges), range_cmp);
	for (int i = 0, prev = -1; i < nr; i++) {
		const struct range *a = &ranges[prev < 0 ? 0 : prev], *b = &ranges[i];

		if (b->begin == b->end)
			continue;
		if (prev >= 0 && b->begin < a->end) {
			sl_error_at(path, "tensors %s [%llu, %llu] and %s [%llu, %llu] overlap", a->name,
			       (unsigned long long)a->begin, (unsigned long long)a->end, b->name,
			       (unsigned long long)b->begin, (unsigned long long)b->end);
			goto out_free_ranges;
		}
		if (prev < 0 || b->end > a->end)
			prev = i;
	}
	ret = 0;

out_free_ranges:
	free(ranges);
out_free_hdr:
	json_decref(hdr);
	return ret;
}

/* sort by name (for bsearch) and refuse a name held twice */
static int st_sort(struct sl_weights *w)
{
	qsort(w->tensors, w->n_tensors, sizeof(*w->tensors), tensor_cmp);
	for (int i = 1; i < w->n_tensors; i++) {
		const struct sl_st_tensor *a = &w->tensors[i - 1], *b = &w->tensors[i];

		if (!strcmp(a->name, b->name)) {
			sl_error("%s: tensor %s is in both %s and %s; a checkpoint holds each "
				 "tensor once", w->dir, a->name, w->files[a->file].path,
				 w->files[b->file].path);
			return -1;
		}
	}
	return 0;
}

/* the shards of an index: every one opened once, every listed tensor where the index says */
static int st_open_index(struct sl_weights *w, const char *index)
{
	const char **shards = NULL;
	int n_shards = 0, ret = -1, *shard_file = NULL, n_unlisted = 0;
	const char *name, *first_unlisted = NULL;
	json_error_t jerr;
	json_t *root, *map, *v;
	char p[4096];

	root = json_load_file(index, JSON_REJECT_DUPLICATES, &jerr);
	if (!root) {
		sl_error("%s:%d:%d: not valid JSON: %s", index, jerr.line, jerr.column, jerr.text);
		return -1;
	}
	map = json_object_get(root, "weight_map");
	if (!json_is_object(map)) {
		sl_error("%s: has no weight_map object (tensor name -> shard file)", index);
		goto out_free_root;
	}
	shards = calloc(json_object_size(map) + 1, sizeof(*shards));
	shard_file = calloc(json_object_size(map) + 1, sizeof(*shard_file));
	if (!shards || !shard_file) {
		sl_error("%s: out of memory", index);
		goto out_free_shards;
	}
	json_object_foreach(map, name, v) {
		const char *s = json_is_string(v) ? json_string_value(v) : NULL;
		int k;

		if (!s || !*s || strstr(s, "..") || s[0] == '/') {
			sl_error("%s: weight_map[%s] must be a shard file name in the model dir",
				 index, name);
			goto out_free_shards;
		}
		for (k = 0; k < n_shards && strcmp(shards[k], s); k++)
			;
		if (k < n_shards)
			continue;
		if (st_join(p, sizeof(p), w->dir, s))
			goto out_free_shards;
		if (!st_is_file(p)) {
			sl_error("%s: shard %s (named for tensor %s) is missing from %s", index, s,
				 name, w->dir);
			goto out_free_shards;
		}
		shards[n_shards] = s;
		shard_file[n_shards++] = w->n_files;
		if (st_add_file(w, p))
			goto out_free_shards;
	}
	if (st_sort(w))
		goto out_free_shards;
	json_object_foreach(map, name, v) {
		const struct sl_st_tensor *t = sl_weights_find(w, name);
		int k;

		for (k = 0; strcmp(shards[k], json_string_value(v)); k++)
			;
		if (!t || t->file != shard_file[k]) {
			sl_error("%s: tensor %s is listed in shard %s, but %s%s", index, name,
				 shards[k], t ? "it is in " : "that shard does not hold it",
				 t ? w->files[t->file].path : "");
			goto out_free_shards;
		}
	}
	for (int i = 0; i < w->n_tensors; i++) {
		if (!json_object_get(map, w->tensors[i].name)) {
			if (!n_unlisted++)
				first_unlisted = w->tensors[i].name;
		}
	}
	/* transformers reads only what the index lists; say so rather than fail */
	if (n_unlisted)
		sl_warn("%s: %d tensor(s) in the shards are not in the index (e.g. %s); they are "
			"ignored like transformers ignores them", index, n_unlisted, first_unlisted);
	ret = 0;

out_free_shards:
	free(shards);
	free(shard_file);
out_free_root:
	json_decref(root);
	return ret;
}

int sl_weights_open(struct sl_weights *w, const char *dir)
{
	char p[4096];

	memset(w, 0, sizeof(*w));
	if (strlen(dir) >= sizeof(w->dir)) {
		sl_error("%s: path too long", dir);
		return -1;
	}
	snprintf(w->dir, sizeof(w->dir), "%s", dir);
	snprintf(p, sizeof(p), "%s/model.safetensors.index.json", dir);
	if (st_is_file(p)) {
		if (st_open_index(w, p))
			goto out_close;
		return 0;
	}
	snprintf(p, sizeof(p), "%s/model.safetensors", dir);
	if (!st_is_file(p)) {
		sl_error("%s: no model.safetensors or model.safetensors.index.json (is this the "
			 "model dir, with the weights downloaded?)", dir);
		return -1;
	}
	if (st_add_file(w, p) || st_sort(w))
		goto out_close;
	return 0;

out_close:
	sl_weights_close(w);
	return -1;
}

int sl_weights_open_file(struct sl_weights *w, const char *file)
{
	const char *slash = strrchr(file, '/');

	memset(w, 0, sizeof(*w));
	if (slash)
		snprintf(w->dir, sizeof(w->dir), "%.*s", (int)(slash - file), file);
	else
		snprintf(w->dir, sizeof(w->dir), ".");
	if (st_add_file(w, file) || st_sort(w)) {
		sl_weights_close(w);
		return -1;
	}
	return 0;
}

void sl_weights_close(struct sl_weights *w)
{
	for (int i = 0; i < w->n_tensors; i++)
		free(w->tensors[i].name);
	for (int i = 0; i < w->n_files; i++) {
		if (w->files[i].map)
			munmap(w->files[i].map, w->files[i].size);
		free(w->files[i].path);
	}
	free(w->tensors);
	free(w->files);
	w->tensors = NULL;
	w->files = NULL;
	w->n_tensors = 0;
	w->n_files = 0;
}

const struct sl_st_tensor *sl_weights_find(const struct sl_weights *w, const char *name)
{
	struct sl_st_tensor key = { .name = (char *)name };

	if (!w->n_tensors)
		return NULL;
	return bsearch(&key, w->tensors, w->n_tensors, sizeof(key), tensor_cmp);
}
