/*
 * signals: SIGUSR1 / SIGTERM / SIGINT handling for `shardlm train` (see signals.h).
 *
 * The handlers touch only sig_atomic_t flags and call async-signal-safe functions (write, _exit,
 * alarm): everything else (the agreement, the checkpoint, the log) happens in the step loop.
 * SIGALRM ends the SIGTERM grace: a job still busy when it runs out exits from the handler.
 */
#define _GNU_SOURCE
#include "signals.h"

#include <signal.h>
#include <string.h>
#include <unistd.h>

#include "log.h"

static volatile sig_atomic_t first_sig;	/* the first signal received, 0 = none */
static volatile sig_atomic_t n_sigs;
static double term_at;			/* sl_now() when the first SIGTERM/SIGINT came */
static double grace_s;
static double step_s;			/* the last step's wall time, 0 = none yet */
static bool installed;

static void say(const char *s)
{
	ssize_t r = write(STDERR_FILENO, s, strlen(s));

	(void)r;
}

static void on_signal(int sig)
{
	if (++n_sigs > 1) {
		say("shardlm: a second signal: exiting at once; the last complete checkpoint is "
		    "kept\n");
		_exit(128 + sig);
	}
	first_sig = sig;
	if (sig != SIGUSR1 && grace_s <= 0) {
		say("shardlm: stopping at once (checkpoint.term_grace_s is 0); the last complete "
		    "checkpoint is kept\n");
		_exit(128 + sig);
	}
	if (sig != SIGUSR1) {
		double a = grace_s;

		/* the step loop reads term_at only after seeing first_sig */
		term_at = sl_now();
		/*
		 * The step under way must reach its boundary first: one still running long past the
		 * last step's time waits for a dead peer (srun sends SIGTERM when one dies).
		 */
		if (step_s > 0 && 2 * step_s + 5 < a)
			a = 2 * step_s + 5;
		alarm(a >= 1 ? (unsigned)a : 1);
	}
}

static void on_alarm(int sig)
{
	say("shardlm: no clean stop within the time the signal left (checkpoint.term_grace_s, or "
	    "the step under way waits for a lost peer): exiting; the last complete checkpoint is "
	    "kept\n");
	_exit(128 + (first_sig ? first_sig : SIGTERM));
}

void sl_signals_install(double term_grace_s)
{
	struct sigaction sa;

	grace_s = term_grace_s;
	memset(&sa, 0, sizeof(sa));
	sigemptyset(&sa.sa_mask);
	sa.sa_flags = SA_RESTART;
	sa.sa_handler = on_signal;
	sigaction(SIGUSR1, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	sa.sa_handler = on_alarm;
	sigaction(SIGALRM, &sa, NULL);
	installed = true;
}

void sl_signals_set_grace(double term_grace_s)
{
	grace_s = term_grace_s;
}

void sl_signals_restore(void)
{
	if (!installed)
		return;
	alarm(0);
	signal(SIGUSR1, SIG_DFL);
	signal(SIGTERM, SIG_DFL);
	signal(SIGINT, SIG_DFL);
	signal(SIGALRM, SIG_DFL);
	installed = false;
}

int sl_signals_agree(MPI_Comm comm, double write_s, bool *checkpoint)
{
	int sig = first_sig, mine[2], all[2];

	/*
	 * Ranks may have received different signals (or one not yet): SIGTERM/SIGINT outrank
	 * SIGUSR1 since their time is short; any rank short of time vetoes the checkpoint.
	 */
	mine[0] = sig == SIGTERM || sig == SIGINT ? 2 : sig == SIGUSR1 ? 1 : 0;
	mine[1] = 0;
	if (mine[0] == 2) {
		double left = grace_s - (sl_now() - term_at);

		/* margin: the write time varies, and the step after the boundary must end too */
		mine[1] = !(write_s * 1.5 + 2 < left);
	}
	MPI_Allreduce(mine, all, 2, MPI_INT, MPI_MAX, comm);
	*checkpoint = all[0] && !all[1];
	/* at the boundary: the rest of the grace is the checkpoint's */
	if (*checkpoint && mine[0] == 2) {
		double left = grace_s - (sl_now() - term_at);

		alarm(left >= 1 ? (unsigned)left : 1);
	}
	if (!all[0])
		return 0;
	return all[0] == 2 ? (sig == SIGINT ? SIGINT : SIGTERM) : SIGUSR1;
}

void sl_signals_step_done(double seconds)
{
	step_s = seconds;
}

const char *sl_signals_name(int sig)
{
	switch (sig) {
	case SIGUSR1: return "SIGUSR1";
	case SIGTERM: return "SIGTERM";
	case SIGINT: return "SIGINT";
	}
	return "a signal";
}
