/*
 * data_cache: text records through the tokenization cache (sl_data_opts.tokenizer set).
 *
 * Owns the cache file (its format, key and directory), tokenization split across ranks into part
 * files and their merge into the complete cache, and the dataset built from tokenized records
 * with the label, vocabulary and max_state checks, which run on every load.  The tokenizing
 * itself is data_tokenize.c.
 */
#define _GNU_SOURCE
#include "data_impl.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"
#include "tokenizer.h"

/*
 * Cache file (native byte order; little-endian on every machine we run on):
 *   struct cache_hdr, then int64 off[n+1] (into ids), int64 line[n], float label[n] (NaN: no
 *   label), uint32 ids[n_ids], and with flags & CACHE_MASKS (task: sft) uint8 mask[n_ids].
 * Part files have the same layout (their part/nparts set).  Every record that parsed is kept,
 * before the max_state, label and vocabulary checks, so a cache serves training and scoring
 * and any max_state; those checks run on every load.
 */
#define CACHE_MAGIC "SLTOKC\r\n"
#define CACHE_VERSION 1
#define CACHE_MASKS 1u			/* loss masks follow the ids */

struct cache_hdr {
	char magic[8];
	uint32_t version;
	uint32_t part, nparts;		/* 0, 1 for the complete cache */
	uint32_t flags;			/* CACHE_MASKS */
	uint64_t key;
	uint64_t n;			/* records */
	uint64_t n_ids;
	uint64_t skipped;		/* bad lines skipped (on_error: skip) */
	uint64_t reserved[2];
};

/* a cache's record offsets never go back (the first and last are checked by the caller) */
static bool offsets_rise(const int64_t *off, uint64_t n)
{
	for (uint64_t i = 0; i < n; i++)
		if (off[i + 1] < off[i])
			return false;
	return true;
}

void data_tok_result_free(struct tok_result *r)
{
	free(r->off);
	free(r->line);
	free(r->label);
	free(r->ids);
	free(r->mask);
	memset(r, 0, sizeof(*r));
}

static int map_file(const char *path, struct mapped *m)
{
	struct stat st;
	int fd = open(path, O_RDONLY);

	m->p = NULL;
	m->n = 0;
	if (fd < 0 || fstat(fd, &st)) {
		int e = errno;

		sl_error("%s: cannot open the data file: %s", path, strerror(e));
		if (fd >= 0)
			close(fd);
		return -e;
	}
	m->n = st.st_size;
	if (m->n) {
		void *p = mmap(NULL, m->n, PROT_READ, MAP_PRIVATE, fd, 0);

		if (p == MAP_FAILED) {
			int e = errno;

			sl_error("%s: cannot map the data file: %s", path, strerror(e));
			close(fd);
			return -e;
		}
		m->p = p;
	}
	close(fd);
	return 0;
}

static void unmap_file(struct mapped *m)
{
	if (m->p)
		munmap((void *)m->p, m->n);
	m->p = NULL;
}

static uint64_t cache_key(const struct mapped *m, const struct sl_data_opts *o)
{
	const char *tf = o->text_field && *o->text_field ? o->text_field : "text";
	const char *lf = o->label_field && *o->label_field ? o->label_field : "label";
	uint64_t h = sl_hash64(m->p ? m->p : "", m->n, CACHE_VERSION);

	h = sl_hash64(&h, sizeof(h), sl_tokenizer_hash(o->tokenizer));
	h = sl_hash64(tf, strlen(tf) + 1, h);
	h = sl_hash64(lf, strlen(lf) + 1, h);
	h = sl_hash64(o->skip_errors ? "skip" : "fail", 4, h);
	/* sft: the task, keep_reasoning and the chat template (classify keys stay as they were) */
	if (o->sft)
		h = sl_hash64(&(uint64_t){ sl_data_sft_key(o) }, sizeof(uint64_t), h);
	return h;
}

static int mkdir_p(const char *dir)
{
	char tmp[SL_PATH_MAX];
	char *p;

	snprintf(tmp, sizeof(tmp), "%s", dir);
	for (p = tmp + 1; *p; p++) {
		if (*p != '/')
			continue;
		*p = 0;
		if (mkdir(tmp, 0777) && errno != EEXIST)
			return -errno;
		*p = '/';
	}
	if (mkdir(tmp, 0777) && errno != EEXIST)
		return -errno;
	return 0;
}

static int cache_dir(const struct sl_data_opts *o, char *buf, size_t n)
{
	const char *e;
	int rc;

	if (o->cache_dir && *o->cache_dir)
		snprintf(buf, n, "%s", o->cache_dir);
	else if ((e = getenv("SHARDLM_CACHE_DIR")) && *e)
		snprintf(buf, n, "%s", e);
	else if ((e = getenv("XDG_CACHE_HOME")) && *e)
		snprintf(buf, n, "%s/shardlm", e);
	else if ((e = getenv("HOME")) && *e)
		snprintf(buf, n, "%s/.cache/shardlm", e);
	else
		snprintf(buf, n, "/tmp/shardlm-cache");
	rc = mkdir_p(buf);
	if (rc)
		sl_warn("%s: cannot create the tokenization cache directory: %s; tokenizing "
			"without a cache (set SHARDLM_CACHE_DIR)", buf, strerror(-rc));
	return rc;
}

/* "<dir>/<data file name>-<key>" */
static int cache_stem(const char *path, const struct mapped *m, const struct sl_data_opts *o,
		      char *buf, size_t n)
{
	char dir[SL_PATH_MAX];
	const char *base = strrchr(path, '/');
	int rc = cache_dir(o, dir, sizeof(dir));

	if (rc)
		return rc;
	base = base ? base + 1 : path;
	snprintf(buf, n, "%.3000s/%.900s-%016" PRIx64, dir, base, cache_key(m, o));
	return 0;
}

int sl_data_cache_path(const char *path, const struct sl_data_opts *o, char *buf, size_t n)
{
	struct mapped m;
	char stem[SL_PATH_MAX];
	int rc = map_file(path, &m);

	if (rc)
		return rc;
	rc = cache_stem(path, &m, o, stem, sizeof(stem));
	unmap_file(&m);
	if (!rc)
		snprintf(buf, n, "%s.tok", stem);
	return rc;
}

static int write_all(FILE *f, const void *p, size_t n)
{
	return fwrite(p, 1, n, f) == n ? 0 : -EIO;
}

/* atomically: a temporary file renamed into place (ranks racing write the same bytes) */
static int cache_write(const char *file, const struct tok_result *r, uint64_t key, int part,
		       int nparts)
{
	struct cache_hdr h = { .version = CACHE_VERSION, .part = part, .nparts = nparts,
			       .flags = r->mask ? CACHE_MASKS : 0, .key = key, .n = r->n,
			       .n_ids = r->n_ids, .skipped = r->skipped };
	char tmp[SL_PATH_MAX + 64];
	FILE *f;
	int rc;

	memcpy(h.magic, CACHE_MAGIC, 8);
	snprintf(tmp, sizeof(tmp), "%s.tmp-%ld", file, (long)getpid());
	f = fopen(tmp, "wb");
	if (!f) {
		sl_warn("%s: cannot write the tokenization cache: %s", tmp, strerror(errno));
		return -errno;
	}
	rc = write_all(f, &h, sizeof(h));
	if (!rc)
		rc = write_all(f, r->off, (r->n + 1) * sizeof(*r->off));
	if (!rc)
		rc = write_all(f, r->line, r->n * sizeof(*r->line));
	if (!rc)
		rc = write_all(f, r->label, r->n * sizeof(*r->label));
	if (!rc)
		rc = write_all(f, r->ids, r->n_ids * sizeof(*r->ids));
	if (!rc && r->mask)
		rc = write_all(f, r->mask, r->n_ids);
	if (fclose(f))
		rc = -EIO;
	if (!rc && rename(tmp, file))
		rc = -errno;
	if (rc) {
		sl_warn("%s: cannot write the tokenization cache: %s", file, strerror(-rc));
		unlink(tmp);
	}
	return rc;
}

/* 0 and @r filled, 1 when absent or stale (not an error), negative on a broken file */
static int cache_read(const char *file, uint64_t key, int part, int nparts,
		      struct tok_result *r)
{
	struct cache_hdr h;
	struct stat st;
	FILE *f = fopen(file, "rb");
	int rc = 1;

	memset(r, 0, sizeof(*r));
	if (!f)
		return 1;
	if (fstat(fileno(f), &st) || fread(&h, sizeof(h), 1, f) != 1 ||
	    memcmp(h.magic, CACHE_MAGIC, 8) || h.version != CACHE_VERSION || h.key != key ||
	    h.part != (uint32_t)part || h.nparts != (uint32_t)nparts ||
	    h.n > ((uint64_t)1 << 40) || h.n_ids > ((uint64_t)1 << 44) || (h.flags & ~CACHE_MASKS) ||
	    (uint64_t)st.st_size != sizeof(h) + (h.n + 1) * 8 + h.n * 8 + h.n * 4 + h.n_ids * 4 +
	    (h.flags & CACHE_MASKS ? h.n_ids : 0))
		goto out_close;
	r->n = h.n;
	r->n_ids = h.n_ids;
	r->skipped = h.skipped;
	r->off = malloc((h.n + 1) * sizeof(*r->off));
	r->line = malloc((h.n + 1) * sizeof(*r->line));
	r->label = malloc((h.n + 1) * sizeof(*r->label));
	r->ids = malloc((h.n_ids + 1) * sizeof(*r->ids));
	if (h.flags & CACHE_MASKS)
		r->mask = malloc(h.n_ids + 1);
	rc = -EIO;
	if (!r->off || !r->line || !r->label || !r->ids || (h.flags & CACHE_MASKS && !r->mask) ||
	    fread(r->off, 8, h.n + 1, f) != h.n + 1 || fread(r->line, 8, h.n, f) != h.n ||
	    fread(r->label, 4, h.n, f) != h.n || fread(r->ids, 4, h.n_ids, f) != h.n_ids ||
	    (r->mask && fread(r->mask, 1, h.n_ids, f) != h.n_ids) ||
	    r->off[0] != 0 || (uint64_t)r->off[h.n] != h.n_ids || !offsets_rise(r->off, h.n)) {
		sl_warn("%s: the tokenization cache is unreadable; tokenizing again", file);
		data_tok_result_free(r);
		rc = 1;
		goto out_close;
	}
	rc = 0;
out_close:
	fclose(f);
	return rc;
}

int sl_data_tokenize_part(const char *path, const struct sl_data_opts *o, int part, int nparts)
{
	char stem[SL_PATH_MAX], file[SL_PATH_MAX + 64];
	struct tok_result r;
	struct mapped m;
	uint64_t key;
	int rc;

	if (!o->tokenizer || nparts < 1 || part < 0 || part >= nparts) {
		sl_error("%s: tokenize part %d of %d needs a tokenizer and 0 <= part < parts", path,
			 part, nparts);
		return -EINVAL;
	}
	rc = map_file(path, &m);
	if (rc)
		return rc;
	key = cache_key(&m, o);
	rc = cache_stem(path, &m, o, stem, sizeof(stem));
	if (rc) {
		sl_error("%s: the tokenization cache directory is needed to split tokenization "
			 "across ranks; set SHARDLM_CACHE_DIR to a directory all ranks share", path);
		goto out_unmap;
	}
	snprintf(file, sizeof(file), "%s.tok", stem);
	if (access(file, R_OK) == 0)
		goto out_unmap;		/* complete already (validated when loaded) */
	snprintf(file, sizeof(file), "%s.part-%05d-of-%05d", stem, part, nparts);
	rc = cache_read(file, key, part, nparts, &r);
	if (rc == 0) {
		data_tok_result_free(&r);
		goto out_unmap;
	}
	rc = data_tokenize_range(path, &m, m.n / nparts * part + (m.n % nparts) * part / nparts,
				 part + 1 == nparts ? m.n :
				 m.n / nparts * (part + 1) + (m.n % nparts) * (part + 1) / nparts,
				 o, &r);
	if (!rc) {
		rc = cache_write(file, &r, key, part, nparts);
		data_tok_result_free(&r);
	}
out_unmap:
	unmap_file(&m);
	return rc;
}

/* parts 0..n-1 of some complete set, concatenated; 1 when there is none */
static int merge_parts(const char *stem, uint64_t key, struct tok_result *out)
{
	char file[SL_PATH_MAX + 64], *dir, *base;
	struct tok_result *pr = NULL;
	int nparts = 0, p, rc = 1;
	uint64_t k, n = 0, nid = 0, so = 0, sl = 0;
	struct dirent *de;
	DIR *d;

	/* find "<stem>.part-00000-of-N" */
	snprintf(file, sizeof(file), "%s", stem);
	base = strrchr(file, '/');
	*base++ = 0;
	dir = file;
	d = opendir(dir);
	if (!d)
		return 1;
	while ((de = readdir(d))) {
		size_t bl = strlen(base);
		int np;

		if (!strncmp(de->d_name, base, bl) &&
		    sscanf(de->d_name + bl, ".part-00000-of-%5d", &np) == 1 && np > 0 &&
		    strlen(de->d_name + bl) == strlen(".part-00000-of-00000"))
			nparts = np;
	}
	closedir(d);
	if (!nparts)
		return 1;
	pr = calloc(nparts, sizeof(*pr));
	if (!pr)
		return -ENOMEM;
	for (p = 0; p < nparts; p++) {
		snprintf(file, sizeof(file), "%s.part-%05d-of-%05d", stem, p, nparts);
		if (cache_read(file, key, p, nparts, &pr[p]))
			goto out_free;
		n += pr[p].n;
		nid += pr[p].n_ids;
	}
	memset(out, 0, sizeof(*out));
	out->n = n;
	out->n_ids = nid;
	out->off = malloc((n + 1) * sizeof(*out->off));
	out->line = malloc((n + 1) * sizeof(*out->line));
	out->label = malloc((n + 1) * sizeof(*out->label));
	out->ids = malloc((nid + 1) * sizeof(*out->ids));
	if (pr[0].mask)
		out->mask = malloc(nid + 1);
	if (!out->off || !out->line || !out->label || !out->ids || (pr[0].mask && !out->mask)) {
		data_tok_result_free(out);
		rc = -ENOMEM;
		goto out_free;
	}
	for (p = 0; p < nparts; p++) {
		for (k = 0; k < pr[p].n; k++)
			out->off[so + k] = pr[p].off[k] + sl;
		memcpy(out->line + so, pr[p].line, pr[p].n * sizeof(*out->line));
		memcpy(out->label + so, pr[p].label, pr[p].n * sizeof(*out->label));
		memcpy(out->ids + sl, pr[p].ids, pr[p].n_ids * sizeof(*out->ids));
		if (out->mask) {
			if (!pr[p].mask) {
				data_tok_result_free(out);
				rc = 1;
				goto out_free;
			}
			memcpy(out->mask + sl, pr[p].mask, pr[p].n_ids);
		}
		out->skipped += pr[p].skipped;
		so += pr[p].n;
		sl += pr[p].n_ids;
	}
	out->off[n] = nid;
	rc = 0;
out_free:
	for (p = 0; p < nparts; p++)
		data_tok_result_free(&pr[p]);
	free(pr);
	return rc;
}

/* the dataset from tokenized records: label, vocabulary and max_state checks */
static int load_from_result(struct sl_dataset *ds, const struct tok_result *r,
			    const struct sl_data_opts *o)
{
	const char *lf = o->label_field && *o->label_field ? o->label_field : "label";
	uint64_t i, k;
	int shown = 0, rc = 0;
	size_t pool = 0;

	ds->skipped = r->skipped;
	ds->rec = malloc((r->n + 1) * sizeof(*ds->rec));
	ds->pool = malloc((r->n_ids + 1) * sizeof(*ds->pool));
	if (o->sft)
		ds->mask_pool = malloc(r->n_ids + 1);
	if (!ds->rec || !ds->pool || (o->sft && !ds->mask_pool)) {
		sl_error("%s: out of memory for %" PRIu64 " records", ds->path, r->n);
		return -ENOMEM;
	}
	for (i = 0; i < r->n; i++) {
		int64_t len = r->off[i + 1] - r->off[i];
		const char *why = NULL;
		char msg[256];

		if (o->sft && !r->mask) {
			sl_error("%s: the tokenization cache has no loss masks; delete it", ds->path);
			return -EINVAL;
		}
		if (o->need_label && !o->sft && isnan(r->label[i])) {
			snprintf(msg, sizeof(msg), "record has no label in field '%s'; training "
				 "needs a number in [0,1]", lf);
			why = msg;
		}
		for (k = 0; !why && o->vocab > 0 && k < (uint64_t)len; k++) {
			if (r->ids[r->off[i] + k] >= (uint32_t)o->vocab) {
				snprintf(msg, sizeof(msg), "token id %u is outside the vocabulary "
					 "[0, %d); does the tokenizer belong to this model?",
					 r->ids[r->off[i] + k], o->vocab);
				why = msg;
			}
		}
		if (why) {
			if (!o->skip_errors) {
				sl_error("%s:%" PRId64 ": %s", ds->path, r->line[i], why);
				return -EINVAL;
			}
			ds->skipped++;
			if (shown++ < SHOW_SKIPPED)
				sl_warn("%s:%" PRId64 ": %s (line skipped)", ds->path, r->line[i],
					why);
			continue;
		}
		ds->total++;
		if (o->max_state > 0 && len > o->max_state) {
			ds->dropped++;
			continue;
		}
		if (o->sft && !sl_data_has_target(r->mask + r->off[i], (int)len)) {
			ds->no_target++;
			continue;
		}
		memcpy(ds->pool + pool, r->ids + r->off[i], len * sizeof(*ds->pool));
		if (o->sft)
			memcpy(ds->mask_pool + pool, r->mask + r->off[i], len);
		ds->rec[ds->n].ids = NULL;
		ds->rec[ds->n].len = (int)len;
		ds->rec[ds->n].label = r->label[i];
		ds->rec[ds->n].line = (long)r->line[i];
		/* the offset, until the pool is final */
		ds->rec[ds->n].ids = (const int32_t *)(uintptr_t)pool;
		pool += len;
		ds->n++;
	}
	if (ds->n == 0)
		return data_no_records(ds, o);
	ds->pool_len = pool;
	for (i = 0; i < (uint64_t)ds->n; i++) {
		uintptr_t off = (uintptr_t)ds->rec[i].ids;

		ds->rec[i].ids = ds->pool + off;
		ds->rec[i].mask = ds->mask_pool ? ds->mask_pool + off : NULL;
	}
	return rc;
}

int data_load_text(struct sl_dataset *ds, const char *path, const struct sl_data_opts *o)
{
	char stem[SL_PATH_MAX], file[SL_PATH_MAX + 64];
	struct tok_result r;
	struct mapped m;
	bool have_dir;
	uint64_t key;
	int rc;

	rc = map_file(path, &m);
	if (rc)
		return rc;
	key = cache_key(&m, o);
	have_dir = cache_stem(path, &m, o, stem, sizeof(stem)) == 0;
	snprintf(file, sizeof(file), "%s.tok", stem);
	rc = have_dir ? cache_read(file, key, 0, 1, &r) : 1;
	if (rc == 0) {
		ds->from_cache = true;
	} else if (have_dir && (rc = merge_parts(stem, key, &r)) == 0) {
		cache_write(file, &r, key, 0, 1);
	} else if (rc >= 0) {
		rc = data_tokenize_range(path, &m, 0, m.n, o, &r);
		if (!rc && have_dir)
			cache_write(file, &r, key, 0, 1);
	}
	unmap_file(&m);
	if (rc)
		return rc;
	if (o->progress && ds->from_cache)
		sl_log("%s: %" PRIu64 " tokenized records from the cache %s", path, r.n, file);
	rc = load_from_result(ds, &r, o);
	data_tok_result_free(&r);
	return rc;
}
