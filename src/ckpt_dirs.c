/*
 * ckpt_dirs: the checkpoint files on disk outside HDF5: paths, fsync, creating and removing
 * step directories (COMPLETE goes first), the step-NNNNNN directories of a root (the newest
 * complete one, pruning to checkpoint.keep) and the check before training that the root is
 * writable and has room.
 */
#include "ckpt_impl.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "log.h"

/* ---- small helpers --------------------------------------------------------------------------- */

int ckpt_join(char *out, size_t n, const char *a, const char *b)
{
	int k = snprintf(out, n, "%s/%s", a, b);

	if (k < 0 || (size_t)k >= n) {
		sl_error("%s/%s: path too long", a, b);
		return -1;
	}
	return 0;
}

/* open(2) + fsync: HDF5 only write()s, so the data may still sit in the page cache. */
int ckpt_fsync_path(const char *path, bool dir)
{
	int fd = open(path, O_RDONLY | (dir ? O_DIRECTORY : 0));
	int rc = 0;

	if (fd < 0) {
		sl_error("%s: cannot open to fsync: %s", path, strerror(errno));
		return -1;
	}
	/* some file systems refuse fsync on a directory; their metadata is then not ours to force */
	if (fsync(fd) != 0 && !(dir && (errno == EINVAL || errno == ENOTSUP))) {
		sl_error("%s: fsync failed: %s", path, strerror(errno));
		rc = -1;
	}
	close(fd);
	return rc;
}

static int mkdir_p(const char *path)
{
	char buf[4096];
	size_t n = strlen(path);

	if (n == 0 || n >= sizeof(buf)) {
		sl_error("%s: bad checkpoint directory name", path);
		return -1;
	}
	memcpy(buf, path, n + 1);
	for (size_t i = 1; i <= n; i++) {
		if (buf[i] != '/' && buf[i] != '\0')
			continue;
		buf[i] = '\0';
		if (mkdir(buf, 0777) != 0 && errno != EEXIST) {
			sl_error("%s: cannot create the directory: %s", buf, strerror(errno));
			return -1;
		}
		buf[i] = path[i];
	}
	return 0;
}

static bool file_exists(const char *dir, const char *name)
{
	char p[4096];
	struct stat st;

	if (snprintf(p, sizeof(p), "%s/%s", dir, name) >= (int)sizeof(p))
		return false;
	return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

/*
 * Remove a checkpoint directory (files only).  COMPLETE goes first so that a removal cut short
 * never leaves something that looks like a complete checkpoint.
 */
int ckpt_remove_dir(const char *dir)
{
	char p[4096];
	struct dirent *de;
	DIR *d;
	int rc = 0;

	if (ckpt_join(p, sizeof(p), dir, "COMPLETE") < 0)
		return -1;
	if (unlink(p) != 0 && errno != ENOENT) {
		sl_warn("%s: cannot remove: %s", p, strerror(errno));
		return -1;
	}
	d = opendir(dir);
	if (!d)
		return errno == ENOENT ? 0 : -1;
	while ((de = readdir(d))) {
		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		if (ckpt_join(p, sizeof(p), dir, de->d_name) < 0 || unlink(p) != 0) {
			sl_warn("%s/%s: cannot remove: %s", dir, de->d_name, strerror(errno));
			rc = -1;
		}
	}
	closedir(d);
	if (rc == 0 && rmdir(dir) != 0) {
		sl_warn("%s: cannot remove: %s", dir, strerror(errno));
		rc = -1;
	}
	return rc;
}

/*
 * Rank 0: the step directory, fresh.  A complete checkpoint of the same step is never
 * overwritten; an incomplete one (a crashed write) is cleared and reused.
 */
int ckpt_prepare_dir(const char *root, const char *dir)
{
	struct stat st;

	if (mkdir_p(root) < 0)
		return -1;
	if (stat(dir, &st) == 0) {
		if (file_exists(dir, "COMPLETE")) {
			sl_error("%s: already holds a complete checkpoint; it is not overwritten "
				 "(remove it to write this step again)", dir);
			return -1;
		}
		if (ckpt_remove_dir(dir) < 0) {
			sl_error("%s: cannot clear the incomplete checkpoint left there", dir);
			return -1;
		}
	}
	if (mkdir(dir, 0777) != 0) {
		sl_error("%s: cannot create the checkpoint directory: %s", dir, strerror(errno));
		return -1;
	}
	return 0;
}

/* ---- the step directories of a root ---------------------------------------------------------- */

struct step_ent {
	int step;
	bool complete;
	char name[64];
};

/* "step-" followed by digits only (at least six): temporary or foreign names are not ours */
static bool parse_step(const char *name, int *step)
{
	const char *p = name + 5;
	long v = 0;
	int nd = 0;

	if (strncmp(name, "step-", 5) != 0)
		return false;
	for (; *p; p++, nd++) {
		if (*p < '0' || *p > '9' || v > 100000000)
			return false;
		v = v * 10 + (*p - '0');
	}
	if (nd < 6)
		return false;
	*step = (int)v;
	return true;
}

/* The step-* directories of @root; 0 with *n = 0 if @root does not exist. */
static int scan_steps(const char *root, struct step_ent **out, int *n)
{
	struct step_ent *e = NULL;
	struct dirent *de;
	int cap = 0, k = 0;
	char p[4096];
	DIR *d;

	*out = NULL;
	*n = 0;
	d = opendir(root);
	if (!d) {
		if (errno == ENOENT)
			return 0;
		sl_error("%s: cannot list the checkpoint directory: %s", root, strerror(errno));
		return -1;
	}
	while ((de = readdir(d))) {
		struct stat st;
		int step;

		if (!parse_step(de->d_name, &step) || strlen(de->d_name) >= sizeof(e->name))
			continue;
		if (ckpt_join(p, sizeof(p), root, de->d_name) < 0 || stat(p, &st) != 0 ||
		    !S_ISDIR(st.st_mode))
			continue;
		if (k == cap) {
			struct step_ent *ne = realloc(e, sizeof(*e) * (cap = cap ? 2 * cap : 16));

			if (!ne) {
				free(e);
				closedir(d);
				sl_error("ckpt: out of memory");
				return -1;
			}
			e = ne;
		}
		e[k].step = step;
		e[k].complete = file_exists(p, "COMPLETE");
		snprintf(e[k].name, sizeof(e[k].name), "%s", de->d_name);
		k++;
	}
	closedir(d);
	*out = e;
	*n = k;
	return 0;
}

static int cmp_step_desc(const void *a, const void *b)
{
	const struct step_ent *x = a, *y = b;

	return (x->step < y->step) - (x->step > y->step);
}

/*
 * Rank 0, after step @cur is complete: complete checkpoints beyond the newest @keep go (never
 * @cur; keep <= 0 keeps all), and so do incomplete leftovers older than the newest complete one.
 * Failures here are warnings: the new checkpoint is already safe.
 */
void ckpt_prune(const char *root, int cur, int keep)
{
	struct step_ent *e;
	int n, kept = 0, newest = -1;
	char p[4096];

	if (scan_steps(root, &e, &n) < 0)
		return;
	qsort(e, n, sizeof(*e), cmp_step_desc);
	for (int i = 0; i < n; i++)
		if (e[i].complete && e[i].step > newest)
			newest = e[i].step;
	for (int i = 0; i < n; i++) {
		bool drop;

		if (e[i].step == cur)
			continue;
		if (e[i].complete)
			drop = keep > 0 && ++kept >= keep;	/* @cur holds one of the places */
		else
			drop = e[i].step < newest;
		if (!drop || ckpt_join(p, sizeof(p), root, e[i].name) < 0)
			continue;
		if (ckpt_remove_dir(p) < 0)
			sl_warn("%s: could not remove the old checkpoint", p);
	}
	free(e);
}

int sl_ckpt_find_latest(const char *root, char *dir, size_t n, int *step)
{
	struct step_ent *e;
	int k, best = -1;

	if (scan_steps(root, &e, &k) < 0)
		return -1;
	for (int i = 0; i < k; i++)
		if (e[i].complete && (best < 0 || e[i].step > e[best].step))
			best = i;
	if (best < 0) {
		free(e);
		return 0;
	}
	if (snprintf(dir, n, "%s/%s", root, e[best].name) >= (int)n) {
		sl_error("%s/%s: path too long", root, e[best].name);
		free(e);
		return -1;
	}
	if (step)
		*step = e[best].step;
	free(e);
	return 1;
}

int sl_ckpt_check_space(const char *root, double bytes_each, int keep)
{
	char probe[4096];
	struct step_ent *e = NULL;
	struct statvfs vfs;
	double avail, need;
	int n = 0, have = 0, fd;

	if (mkdir_p(root) < 0)
		return -1;
	/* writable: a real file, since permissions alone do not tell (read-only mounts, ACLs) */
	if (snprintf(probe, sizeof(probe), "%s/.write-test-%d", root, (int)getpid()) >=
	    (int)sizeof(probe))
		return -1;
	fd = open(probe, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	if (fd < 0 || write(fd, "x", 1) != 1) {
		sl_error("%s: the checkpoint directory is not writable: %s; fix its permissions or "
			 "point checkpoint.dir / run.dir elsewhere", root, strerror(errno));
		if (fd >= 0) {
			close(fd);
			unlink(probe);
		}
		return -1;
	}
	close(fd);
	unlink(probe);
	if (statvfs(root, &vfs) != 0) {
		sl_error("%s: cannot query the file system: %s", root, strerror(errno));
		return -1;
	}
	/* complete checkpoints already there count towards keep; the write of keep+1 comes first */
	if (scan_steps(root, &e, &n) < 0)
		return -1;
	for (int i = 0; i < n; i++)
		have += e[i].complete;
	free(e);
	if (keep > 0 && have > keep)
		have = keep;
	need = (double)(keep > 0 ? keep + 1 - have : 1) * bytes_each;
	avail = (double)vfs.f_bavail * (double)vfs.f_frsize;
	if (need > avail) {
		sl_error("%s: %.2f GB free, checkpoints need %.2f GB (checkpoint.keep %d + 1 being "
			 "written, %.2f GB each, %d already there): free space, lower it with --set "
			 "checkpoint.keep=N or --set checkpoint.optimizer=false, or point "
			 "checkpoint.dir at a larger disk", root, avail / 1e9, need / 1e9, keep,
			 bytes_each / 1e9, have);
		return -ENOSPC;
	}
	return 0;
}
