/*
 * safetensors_resolve: a model path to the directory holding config.json (see safetensors.h).
 *
 * Owns: a plain Hugging Face model dir, or an HF cache dir models--Org--Name with refs/ and
 * snapshots/REV, the revision (a ref, a full commit hash or a unique prefix of one), and error
 * messages that list what is there (refs, snapshots, the repos of a hub cache).
 */
#include "safetensors.h"

#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "log.h"
#include "safetensors_impl.h"

static bool is_dir(const char *p)
{
	struct stat st;

	return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
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
	if (st_is_file(p)) {
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
	if (st_is_file(p)) {
		if (read_ref(p, hash, sizeof(hash)))
			return -1;
		if (st_join(p, sizeof(p), snaps, hash))
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
		if (st_join(p, sizeof(p), snaps, name))
			return -1;
	}
	if (strlen(p) >= n) {
		sl_error("%s: path too long", p);
		return -1;
	}
	snprintf(out_dir, n, "%s", p);
	snprintf(p, sizeof(p), "%s/config.json", out_dir);
	if (!st_is_file(p)) {
		sl_error("%s: the snapshot has no config.json (an incomplete download?)", out_dir);
		return -1;
	}
	return 0;
}
