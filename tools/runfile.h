/*
 * runfile: the small reader of RUN/training_metrics.json that the tools share.
 *
 * The tools read what the trainer wrote and never link the trainer itself (DESIGN.md §2), so this
 * reader knows only the file's fields (DESIGN.md §3, "Run directory"), not how they were made.
 */
#ifndef TL_RUNFILE_H
#define TL_RUNFILE_H

#include <stdbool.h>
#include <stddef.h>

struct tl_step {
	int step;			/* 1-based optimizer step */
	double time_s;			/* wall seconds of the step; NAN when not recorded */
	double end_unix;		/* when it ended, seconds since the epoch; NAN when not recorded */
	double loss;			/* NAN when null (a non-finite loss) */
	long records;			/* records trained in the step */
	long long peak_gpu_bytes;	/* 0 on the cpu backend */
};

struct tl_eval {
	int step;
	double loss;
};

struct tl_run {
	char dir[4096];			/* as given (a run directory or the json file itself) */
	char file[4200];		/* the training_metrics.json read */
	int world;			/* ranks; 1 when not recorded */
	long records_per_step;		/* 0 when not recorded */
	long epoch_records;		/* training records after the length filter; 0 when absent */
	int planned_steps;		/* run.steps; 0 when not recorded */
	double start_unix;		/* NAN when not recorded */
	char start_local[64];		/* "2026-11-29T16:05:01+0100"; "" when not recorded */
	int nsteps;
	struct tl_step *steps;		/* (nsteps), in file order */
	int neval;
	struct tl_eval *eval;		/* (neval) */
};

/*
 * Read @path's training_metrics.json (@path: a run directory or the file itself) into @r.
 * Returns 0, or -1 after printing "PROG: FILE: what is wrong; what to do" to stderr.
 */
int tl_run_read(const char *prog, const char *path, struct tl_run *r);
void tl_run_free(struct tl_run *r);

/* The UTC offset in seconds written at the end of start_local ("+0100" -> 3600); false if none. */
bool tl_run_utc_offset(const struct tl_run *r, long *offset_s);

/* Seconds since the epoch when the first recorded step began (its end_unix - time_s); NAN if none. */
double tl_run_first_step_start(const struct tl_run *r);

#endif
