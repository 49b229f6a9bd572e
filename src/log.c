/*
 * log: "[mm:ss]"-prefixed log lines on rank 0, errors on every rank (see log.h).
 */
#define _GNU_SOURCE
#include "log.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double t0;
static int log_rank, log_world = 1;
static char log_host[128];
static FILE *log_file;
static bool log_stderr;

void sl_log_to_stderr(bool on)
{
	log_stderr = on;
}

double sl_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

double sl_unix_time(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

void sl_log_init(void)
{
	t0 = sl_now();
}

void sl_log_set_rank(int rank, int world, const char *host)
{
	log_rank = rank;
	log_world = world;
	snprintf(log_host, sizeof(log_host), "%s", host ? host : "");
}

int sl_log_open_file(const char *path)
{
	if (log_rank != 0)
		return 0;
	sl_log_close_file();
	log_file = fopen(path, "a");
	if (!log_file) {
		sl_error("cannot open the log file %s", path);
		return -1;
	}
	return 0;
}

void sl_log_close_file(void)
{
	if (log_file)
		fclose(log_file);
	log_file = NULL;
}

double sl_log_elapsed(void)
{
	return t0 ? sl_now() - t0 : 0;
}

void sl_log_prefix(char *buf, size_t n)
{
	long s = (long)sl_log_elapsed();

	if (s >= 3600)
		snprintf(buf, n, "[%ld:%02ld:%02ld]", s / 3600, s / 60 % 60, s % 60);
	else
		snprintf(buf, n, "[%02ld:%02ld]", s / 60, s % 60);
}

static void emit(FILE *out, bool all_ranks, const char *kind, const char *fmt, va_list ap)
{
	char pre[32], who[192] = "", msg[8192];

	vsnprintf(msg, sizeof(msg), fmt, ap);
	sl_log_prefix(pre, sizeof(pre));
	if (all_ranks && log_world > 1)
		snprintf(who, sizeof(who), "%s rank %d: ", log_host, log_rank);
	fprintf(out, "%s %s%s%s\n", pre, who, kind, msg);
	fflush(out);
	if (log_file) {
		fprintf(log_file, "%s %s%s%s\n", pre, who, kind, msg);
		fflush(log_file);
	}
}

void sl_log(const char *fmt, ...)
{
	va_list ap;

	if (log_rank != 0)
		return;
	va_start(ap, fmt);
	emit(log_stderr ? stderr : stdout, false, "", fmt, ap);
	va_end(ap);
}

void sl_error(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	emit(stderr, true, "error: ", fmt, ap);
	va_end(ap);
}

void sl_error_at(const char *where, const char *fmt, ...)
{
	char msg[4096];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	sl_error("%s: %s", where, msg);
}

void sl_warn(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	emit(stderr, true, "warning: ", fmt, ap);
	va_end(ap);
}

char *sl_msgf(const char *fmt, ...)
{
	char *s = NULL;
	va_list ap;

	va_start(ap, fmt);
	if (vasprintf(&s, fmt, ap) < 0)
		s = NULL;
	va_end(ap);
	return s ? s : strdup("out of memory");
}

#ifdef SL_SANITIZE
#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>

/*
 * The sanitizer build (configure --enable-sanitizers) only: in a job of several MPI ranks, the
 * ranks other than 0 (PMIX_RANK, which mpirun and srun --mpi=pmix set) skip LeakSanitizer's check
 * at exit.  That check costs each rank 1 to 2 s of the tests' MPI jobs, most of their time on 2
 * cores; every rank still runs AddressSanitizer and UBSan throughout, and rank 0 and every
 * single-process run still check for leaks.  The runtime calls this before anything is set up:
 * no instrumentation, no libc call it intercepts, the environment read from /proc (environ is
 * not set yet).  ASAN_OPTIONS and LSAN_OPTIONS still override it.
 */
const char *__asan_default_options(void);

__attribute__((no_sanitize_address, no_sanitize_undefined))
const char *__asan_default_options(void)
{
	static const char key[] = "PMIX_RANK=";
	static char env[1 << 16];
	long fd = syscall(SYS_openat, AT_FDCWD, "/proc/self/environ", O_RDONLY), n = 0, k;

	if (fd < 0)
		return "";
	while (n < (long)sizeof(env) - 1 &&
	       (k = syscall(SYS_read, fd, env + n, sizeof(env) - 1 - n)) > 0)
		n += k;
	syscall(SYS_close, fd);
	env[n] = '\0';
	for (long i = 0; i < n; i++) {	/* NAME=value entries, each ended by a 0 */
		long j = 0;

		while (key[j] && env[i + j] == key[j])
			j++;
		if (!key[j])
			return env[i + j] == '0' && !env[i + j + 1] ? "" : "detect_leaks=0";
		while (i < n && env[i])
			i++;
	}
	return "";
}
#endif
