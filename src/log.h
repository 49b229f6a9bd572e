/*
 * log: the job's log lines and error reporting.
 *
 * Every line starts with the time since the job began, "[mm:ss]" ("[h:mm:ss]" past an hour).
 * sl_log() prints on rank 0 only (stdout and, once set, RUN/train.log); sl_error() prints on every
 * rank to stderr, naming host and rank when the job has more than one, and is copied to the log file.
 */
#ifndef SL_LOG_H
#define SL_LOG_H

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>

void sl_log_init(void);				/* marks the job's start */
void sl_log_set_rank(int rank, int world, const char *host);
int sl_log_open_file(const char *path);		/* append; rank 0 only */
void sl_log_close_file(void);
void sl_log_to_stderr(bool on);			/* log lines to stderr (stdout carries data) */
double sl_log_elapsed(void);			/* seconds since sl_log_init */
void sl_log_prefix(char *buf, size_t n);	/* "[mm:ss]" */

void sl_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* "shardlm: error: ..." (a user error: what is wrong, where, what to do) */
void sl_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void sl_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* sl_error() of "@where: <message>" (a file, file:line, a key) */
void sl_error_at(const char *where, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* an error message in a malloc'd string, for errors returned rather than printed (from
 * threads, or to be given a place by the caller); "out of memory" when it cannot be formatted */
char *sl_msgf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* wall clock */
double sl_now(void);				/* seconds, monotonic */
double sl_unix_time(void);			/* seconds since the epoch */

#endif
