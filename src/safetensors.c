/*
 * safetensors: Hugging Face model directories and weights (see safetensors.h).
 *
 * Owns: resolving a model path (plain dir or HF cache models--Org--Name/snapshots/REV), opening
 * model.safetensors or the shards of model.safetensors.index.json read-only with mmap, validating
 * every header before any byte of data is trusted, the F32/BF16/F16 <-> float conversions, loading
 * a struct sl_layout into float unit buffers (initializing the optional tensors a checkpoint lacks),
 * and writing safetensors files.  A file is "<u64 LE header length><JSON header><data>"; offsets in
 * the header are relative to the start of the data.
 */
#include "safetensors.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"

/* Tensor data is read and written in place: the format is little-endian, and so must the host be. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.c assumes a little-endian host"
#endif

/* A header this large is not a model's (a 27B model's is ~100 KB): refuse before parsing it. */
#define ST_MAX_HEADER (100ull << 20)

/* ---- small helpers --------------------------------------------------------------------------- */

static bool is_file(const char *p)
{
	struct stat st;

	return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

static bool is_dir(const char *p)
{
	struct stat st;

	return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}


/* @a/@b into @out; refuses to truncate */
static int join(char *out, size_t n, const char *a, const char *b)
{
	int k = snprintf(out, n, "%s/%s", a, b);

	if (k < 0 || (size_t)k >= n) {
		sl_error("%s/%s: path too long", a, b);
		return -1;
	}
	return 0;
}

static void shape_str(char *buf, size_t n, int ndim, const int64_t *shape)
{
	size_t off = 0;

	off += snprintf(buf + off, n - off, "[");
	for (int i = 0; i < ndim && off < n; i++)
		off += snprintf(buf + off, n - off, "%s%lld", i ? ", " : "", (long long)shape[i]);
	if (off < n)
		snprintf(buf + off, n - off, "]");
}

/* ---- conversions ----------------------------------------------------------------------------- */

static uint32_t f32_bits(float f)
{
	uint32_t u;

	memcpy(&u, &f, 4);
	return u;
}

static float bits_f32(uint32_t u)
{
	float f;

	memcpy(&f, &u, 4);
	return f;
}

float sl_bf16_to_f32(uint16_t h)
{
	return bits_f32((uint32_t)h << 16);
}

uint16_t sl_f32_to_bf16(float f)
{
	uint32_t u = f32_bits(f);

	/* rounding could carry a NaN's payload into the exponent (NaN -> inf); keep it a quiet NaN */
	if ((u & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((u >> 16) | 0x0040);
	/* nearest, ties to even: add just under half an ulp, plus one if the kept lsb is 1 */
	u += 0x7fffu + ((u >> 16) & 1);
	return (uint16_t)(u >> 16);
}

float sl_f16_to_f32(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000) << 16;
	uint32_t exp = (h >> 10) & 0x1f;
	uint32_t man = h & 0x3ff;

	if (exp == 0x1f)		/* inf, nan (payload kept) */
		return bits_f32(sign | 0x7f800000u | (man << 13));
	if (exp == 0) {			/* zero, subnormal: man x 2^-24, exact in float */
		float v = ldexpf((float)man, -24);

		return sign ? -v : v;
	}
	return bits_f32(sign | ((exp - 15 + 127) << 23) | (man << 13));
}

void sl_st_to_f32(const struct sl_st_tensor *t, float *out)
{
	const uint8_t *p = t->data;
	uint16_t h;

	switch (t->dtype) {
	case SL_DT_F32:
		memcpy(out, t->data, t->numel * 4);
		break;
	/* threads: a 27B checkpoint is ~50 GB of page faults and conversions */
	case SL_DT_BF16:
#pragma omp parallel for private(h) if (t->numel > (1 << 20))
		for (size_t i = 0; i < t->numel; i++) {
			memcpy(&h, p + 2 * i, 2);	/* the mapping need not be 2-aligned */
			out[i] = sl_bf16_to_f32(h);
		}
		break;
	case SL_DT_F16:
#pragma omp parallel for private(h) if (t->numel > (1 << 20))
		for (size_t i = 0; i < t->numel; i++) {
			memcpy(&h, p + 2 * i, 2);
			out[i] = sl_f16_to_f32(h);
		}
		break;
	default:
		/* callers check the dtype first; NaN makes a missed check loud */
		for (size_t i = 0; i < t->numel; i++)
			out[i] = NAN;
	}
}

/* ---- a small deterministic generator (splitmix64 + Box-Muller) ------------------------------- */

static uint64_t splitmix64(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

void sl_st_fill_normal(float *x, size_t n, double std, uint64_t seed)
{
	uint64_t s = seed;

	for (size_t i = 0; i < n; i += 2) {
		/* u1 in (0, 1] so the log is finite */
		double u1 = ((splitmix64(&s) >> 11) + 1) * 0x1p-53;
		double u2 = (splitmix64(&s) >> 11) * 0x1p-53;
		double r = sqrt(-2.0 * log(u1));

		x[i] = (float)(std * r * cos(2 * M_PI * u2));
		if (i + 1 < n)
			x[i + 1] = (float)(std * r * sin(2 * M_PI * u2));
	}
}

/* FNV-1a: a tensor's stream depends on its name, not on the order tensors are initialized in */
static uint64_t name_hash(const char *s)
{
	uint64_t h = 0xcbf29ce484222325ull;

	for (; *s; s++)
		h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
	return h;
}

/* ---- resolving a model path ------------------------------------------------------------------ */

/* comma-separated entries of @dir (no dot files), "(none)" when empty or unreadable */
static void list_dir(const char *dir, const char *prefix, bool dirs_only, char *buf, size_t n)
{
	struct dirent *e;
	size_t off = 0;
	char p[4096];
	DIR *d;

	buf[0] = 0;
	d = opendir(dir);
	if (d) {
		while ((e = readdir(d)) && off + 1 < n) {
			if (e->d_name[0] == '.' || strncmp(e->d_name, prefix, strlen(prefix)))
				continue;
			snprintf(p, sizeof(p), "%s/%s", dir, e->d_name);
			if (dirs_only && !is_dir(p))
				continue;
			off += snprintf(buf + off, n - off, "%s%s", off ? ", " : "", e->d_name);
		}
		closedir(d);
	}
	if (!buf[0])
		snprintf(buf, n, "(none)");
}

static int read_ref(const char *file, char *hash, size_t n)
{
	FILE *f = fopen(file, "r");
	size_t len;

	if (!f || !fgets(hash, n, f)) {
		if (f)
			fclose(f);
		sl_error("%s: cannot read the commit hash of this ref", file);
		return -1;
	}
	fclose(f);
	len = strcspn(hash, " \t\r\n");
	hash[len] = 0;
	if (!len || strchr(hash, '/')) {
		sl_error("%s: does not hold a commit hash", file);
		return -1;
	}
	return 0;
}

/* @rev names a snapshot: exactly, or as the unique prefix of one */
static int find_snapshot(const char *snaps, const char *rev, char *name, size_t n)
{
	struct dirent *e;
	int found = 0;
	DIR *d;

	d = opendir(snaps);
	if (!d)
		return 0;
	while ((e = readdir(d))) {
		if (e->d_name[0] == '.' || strncmp(e->d_name, rev, strlen(rev)))
			continue;
		if (!strcmp(e->d_name, rev)) {
			snprintf(name, n, "%s", e->d_name);
			found = 1;
			break;
		}
		if (!found++)
			snprintf(name, n, "%s", e->d_name);
	}
	closedir(d);
	return found;
}

int sl_hf_resolve(const char *path, const char *revision, char *out_dir, size_t n)
{
	char p[4096], snaps[4096], hash[256], name[256], avail[2048], refs[1024];
	const char *rev = revision && *revision ? revision : NULL;
	int found;

	snprintf(p, sizeof(p), "%s/config.json", path);
	if (is_file(p)) {
		if (rev) {
			sl_error("%s: model.revision '%s' applies only to Hugging Face cache dirs "
				 "(models--Org--Name); this is a plain model dir: remove the "
				 "revision", path, rev);
			return -1;
		}
		if (strlen(path) >= n) {
			sl_error("%s: path too long", path);
			return -1;
		}
		snprintf(out_dir, n, "%s", path);
		return 0;
	}
	if (!is_dir(path)) {
		sl_error("%s: no such model dir (model.path must be a Hugging Face model dir with "
			 "config.json, or a cache dir models--Org--Name)", path);
		return -1;
	}
	snprintf(snaps, sizeof(snaps), "%s/snapshots", path);
	if (!is_dir(snaps)) {
		list_dir(path, "models--", true, avail, sizeof(avail));
		if (strcmp(avail, "(none)"))
			sl_error("%s: this is a Hugging Face hub cache; point model.path at one "
				 "of its repos: %s", path, avail);
		else
			sl_error("%s: has no config.json and no snapshots/ (neither a model dir "
				 "nor a Hugging Face cache dir models--Org--Name)", path);
		return -1;
	}
	list_dir(snaps, "", true, avail, sizeof(avail));
	snprintf(p, sizeof(p), "%s/refs", path);
	list_dir(p, "", false, refs, sizeof(refs));

	if (!rev)
		rev = "main";
	if (strstr(rev, "..")) {
		sl_error("%s: bad revision '%s'", path, rev);
		return -1;
	}
	snprintf(p, sizeof(p), "%s/refs/%s", path, rev);
	if (is_file(p)) {
		if (read_ref(p, hash, sizeof(hash)))
			return -1;
		if (join(p, sizeof(p), snaps, hash))
			return -1;
		if (!is_dir(p)) {
			sl_error("%s: refs/%s names snapshot %s, which is not in snapshots/ (an "
				 "incomplete download?); available snapshots: %s", path, rev, hash,
				 avail);
			return -1;
		}
	} else {
		found = find_snapshot(snaps, rev, name, sizeof(name));
		if (found == 0) {
			sl_error("%s: revision '%s' is neither a ref (looked for refs/%s; refs: "
				 "%s) nor a snapshot (looked in snapshots/; available: %s)", path,
				 rev, rev, refs, avail);
			return -1;
		}
		if (found > 1) {
			sl_error("%s: revision '%s' is the prefix of several snapshots (%s); "
				 "give more of the hash", path, rev, avail);
			return -1;
		}
		if (join(p, sizeof(p), snaps, name))
			return -1;
	}
	if (strlen(p) >= n) {
		sl_error("%s: path too long", p);
		return -1;
	}
	snprintf(out_dir, n, "%s", p);
	snprintf(p, sizeof(p), "%s/config.json", out_dir);
	if (!is_file(p)) {
		sl_error("%s: the snapshot has no config.json (an incomplete download?)", out_dir);
		return -1;
	}
	return 0;
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
			shape_str(sbuf, sizeof(sbuf), t->ndim, t->shape);
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
		if (join(p, sizeof(p), w->dir, s))
			goto out_free_shards;
		if (!is_file(p)) {
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
	if (is_file(p)) {
		if (st_open_index(w, p))
			goto out_close;
		return 0;
	}
	snprintf(p, sizeof(p), "%s/model.safetensors", dir);
	if (!is_file(p)) {
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

/* ---- loading a layout ------------------------------------------------------------------------ */

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
		shape_str(have, sizeof(have), t->ndim, t->shape);
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

			shape_str(have, sizeof(have), t->ndim, t->shape);
			if (ti->unsqueeze1)
				shape_str(want, sizeof(want), 3, s3);
			else
				shape_str(want, sizeof(want), ti->ndim, ti->shape);
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
