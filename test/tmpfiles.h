/*
 * tmpfiles.h: a test's scratch directory (tmpdir), files written into it, and sl_data_load with
 * stderr captured into errbuf, so that a test can check the error messages (test_data,
 * test_chat).
 */
#ifndef SL_TMPFILES_H
#define SL_TMPFILES_H

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "data.h"
#include "testutil.h"

static char tmpdir[256];
static char errbuf[16384];	/* stderr of the last captured load */

/* tmpdir made from @pattern (ending in XXXXXX); 0, or -1 (said on stderr) */
static inline int tmpdir_make(const char *pattern)
{
	snprintf(tmpdir, sizeof(tmpdir), "%s", pattern);
	if (!mkdtemp(tmpdir)) {
		perror("mkdtemp");
		return -1;
	}
	return 0;
}

/* @text as tmpdir/@name; its path (until the next call) */
static inline const char *write_file(const char *name, const char *text)
{
	static char path[512];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", tmpdir, name);
	f = fopen(path, "w");
	if (!f) {
		perror(path);
		exit(2);
	}
	fputs(text, f);
	fclose(f);
	return path;
}

/* sl_data_load with stderr captured into errbuf */
static inline int load(struct sl_dataset *ds, const char *path, const struct sl_data_opts *o)
{
	char cap[600];
	int fd, saved, rc;
	ssize_t n;

	snprintf(cap, sizeof(cap), "%s/stderr.txt", tmpdir);
	fflush(stderr);
	saved = dup(2);
	fd = open(cap, O_RDWR | O_CREAT | O_TRUNC, 0600);
	if (fd < 0 || saved < 0) {
		perror(cap);
		exit(2);
	}
	dup2(fd, 2);
	rc = sl_data_load(ds, path, o);
	fflush(stderr);
	dup2(saved, 2);
	close(saved);
	lseek(fd, 0, SEEK_SET);
	n = read(fd, errbuf, sizeof(errbuf) - 1);
	errbuf[n > 0 ? n : 0] = 0;
	close(fd);
	return rc;
}

#endif
