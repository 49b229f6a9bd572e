/*
 * testutil.h: the few helpers every test program shares.  A test's exit status is its verdict:
 * CHECK failures are counted and printed with file:line; main returns test_exit().
 */
#ifndef SL_TESTUTIL_H
#define SL_TESTUTIL_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int test_failures;
static int test_checks;

#define CHECK(cond, ...)                                                              \
	do {                                                                          \
		test_checks++;                                                        \
		if (!(cond)) {                                                        \
			test_failures++;                                              \
			fprintf(stderr, "%s:%d: CHECK(%s) failed: ", __FILE__,        \
				__LINE__, #cond);                                     \
			fprintf(stderr, " " __VA_ARGS__);                              \
			fprintf(stderr, "\n");                                        \
		}                                                                     \
	} while (0)

/* |a - b| <= tol * max(1, |b|)-style relative check with a floor */
#define CHECK_CLOSE(a, b, rel, abs_)                                                  \
	do {                                                                          \
		double _a = (a), _b = (b);                                            \
		double _d = fabs(_a - _b);                                            \
		CHECK(_d <= (abs_) + (rel) * fabs(_b), "%s = %.9g, expected %.9g "    \
		      "(diff %.3g)", #a, _a, _b, _d);                                 \
	} while (0)

/* a file's bytes, NUL-terminated (the caller frees them); NULL when it cannot be read */
static inline char *test_slurp(const char *path)
{
	FILE *f = fopen(path, "rb");
	char *buf = NULL;
	long n;

	if (!f)
		return NULL;
	if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0 &&
	    (buf = (char *)malloc(n + 1)) != NULL) {
		if (fread(buf, 1, n, f) == (size_t)n) {
			buf[n] = 0;
		} else {
			free(buf);
			buf = NULL;
		}
	}
	fclose(f);
	return buf;
}

static inline int test_exit(const char *name)
{
	printf("%s: %d checks, %d failed\n", name, test_checks, test_failures);
	return test_failures ? 1 : 0;
}

/* $top_srcdir (set by make check) or "." */
static inline const char *test_srcdir(void)
{
	const char *s = getenv("top_srcdir");
	return s && *s ? s : ".";
}

static inline const char *test_builddir(void)
{
	const char *s = getenv("top_builddir");
	return s && *s ? s : ".";
}

/* rm -rf @dir when every check passed (kept to look at otherwise) */
static inline void test_remove_dir(const char *dir)
{
	char cmd[8300];

	if (test_failures)
		return;
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	if (system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", dir);
}

#endif
