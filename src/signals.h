/*
 * signals: stopping a training job cleanly when the scheduler or the user asks.
 *
 * SIGUSR1 means "checkpoint and stop": the handler only sets a flag; at the next step boundary
 * the ranks agree (sl_signals_agree, a MAX all-reduce) to stop after that step, write a complete
 * checkpoint and exit with SL_EXIT_STOPPED, which the Slurm scripts answer with a requeue.
 * SIGTERM and SIGINT do the same when the checkpoint fits in checkpoint.term_grace_s (judged by
 * the last write time); otherwise the job stops at the step boundary without writing, or, when
 * the grace (or, before the step boundary, twice the last step time + 5 s) runs out first, exits
 * from the handler: the last complete checkpoint is never
 * touched (a checkpoint counts only once its COMPLETE marker is written).  A second signal of
 * any of the three exits at once.
 */
#ifndef SL_SIGNALS_H
#define SL_SIGNALS_H

#include <mpi.h>
#include <stdbool.h>

/* exit statuses of `shardlm train` (README "Exit status") */
#define SL_EXIT_OK		0
#define SL_EXIT_ABORTED		1	/* MPI_Abort: a rank died, hung, or a library call failed */
#define SL_EXIT_ERROR		2	/* a user error or a failed write; see the message */
#define SL_EXIT_STOPPED		3	/* stopped by a signal after a complete checkpoint */
#define SL_EXIT_BAD_STEPS	4	/* train.max_bad_steps non-finite steps in a row */
/* 128 + signal (143 SIGTERM, 130 SIGINT, 138 SIGUSR1): stopped without a new checkpoint */

/* Installs the handlers for SIGUSR1, SIGTERM and SIGINT; @term_grace_s as above. */
void sl_signals_install(double term_grace_s);
/* Sets checkpoint.term_grace_s once the config is read (the handlers stay installed). */
void sl_signals_set_grace(double term_grace_s);
/* Puts the default handlers back. */
void sl_signals_restore(void);

/*
 * At a step boundary, collective over @comm: the signal every rank agrees to stop for (0: go on).
 * *checkpoint says whether there is time to write one first: always for SIGUSR1; for SIGTERM
 * and SIGINT when @write_s (the last checkpoint's write time, 0 if unknown) fits in what is left
 * of the grace on every rank.
 */
int sl_signals_agree(MPI_Comm comm, double write_s, bool *checkpoint);

/*
 * The step just done took @seconds.  After SIGTERM/SIGINT the step under way has twice that
 * plus 5 s to reach its boundary (within the grace); past that a peer is likely gone and the
 * job exits from the handler.
 */
void sl_signals_step_done(double seconds);

const char *sl_signals_name(int sig);

#endif
