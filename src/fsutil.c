/*
 * fsutil: shared file-system helpers (see fsutil.h).
 */
#include "fsutil.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config.h"
#include "log.h"

bool sl_is_dir(const char *p)
{
	struct stat st;

	return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

bool sl_is_file(const char *p)
{
	struct stat st;

	return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

int sl_mkdir_p(const char *path)
{
	char tmp[SL_PATH_MAX + 64];

	if (snprintf(tmp, sizeof(tmp), "%s", path) >= (int)sizeof(tmp)) {
		sl_error("path too long: %s", path);
		return -1;
	}
	for (char *p = tmp + 1; *p; p++) {
		if (*p != '/')
			continue;
		*p = 0;
		if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
			goto fail;
		*p = '/';
	}
	if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
		goto fail;
	return 0;
fail:
	sl_error("cannot create directory %s: %s", tmp, strerror(errno));
	return -1;
}

int sl_copy_file(const char *from, const char *to)
{
	FILE *in = fopen(from, "rb"), *out;
	char buf[1 << 16];
	size_t n;
	int ret = 0;

	if (!in)
		return -1;
	out = fopen(to, "wb");
	if (!out) {
		fclose(in);
		return -1;
	}
	while ((n = fread(buf, 1, sizeof(buf), in)) > 0)
		if (fwrite(buf, 1, n, out) != n)
			ret = -1;
	fclose(in);
	if (fclose(out))
		ret = -1;
	return ret;
}

int sl_move_aside(const char *path, char *aside, size_t n)
{
	for (int i = 1; i < 100000; i++) {
		snprintf(aside, n, "%s.old-%d", path, i);
		if (access(aside, F_OK) != 0)
			break;
	}
	if (rename(path, aside) != 0) {
		sl_error("cannot move %s aside to %s: %s", path, aside, strerror(errno));
		return -1;
	}
	return 0;
}
