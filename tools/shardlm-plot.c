/*
 * shardlm-plot: loss, validation loss and step time per step of one or more runs, as SVG or PNG.
 *
 * gnuplot draws (a well-kept program; we only write its script).  It runs through fork and exec
 * with the script, data included, on its standard input: no shell ever sees a file name, and the
 * names inside the script are quoted the way gnuplot's single-quoted strings want.
 */
#define _GNU_SOURCE		/* pipe2 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "runfile.h"

static const char *prog = "shardlm-plot";

static void usage(FILE *f)
{
	fprintf(f,
		"usage: %s RUN_DIR... -o FILE.svg|FILE.png\n"
		"  Draws training loss, validation loss and seconds per step against the step for\n"
		"  each run (one curve per run) with gnuplot (Debian package gnuplot-nox).\n",
		prog);
}

/*
 * gnuplot's single-quoted string: no escapes (nor backquote substitution), '' is a quote.  A line
 * break would end the command and start another (gnuplot has system()): it becomes a '?'.
 */
static void put_quoted(FILE *f, const char *s)
{
	fputc('\'', f);
	for (; *s; s++) {
		if (*s == '\'')
			fputc('\'', f);
		fputc(*s == '\n' || *s == '\r' ? '?' : *s, f);
	}
	fputc('\'', f);
}

enum series { LOSS, EVAL, STEP_TIME, NSERIES };

static int points(const struct tl_run *r, enum series s)
{
	int n = 0;

	if (s == EVAL) {
		for (int i = 0; i < r->neval; i++)
			n += isfinite(r->eval[i].loss);
		return n;
	}
	for (int i = 0; i < r->nsteps; i++)
		n += isfinite(s == LOSS ? r->steps[i].loss : r->steps[i].time_s);
	return n;
}

static void write_data(FILE *f, const struct tl_run *r, int k, enum series s)
{
	static const char *const names[] = { "loss", "eval", "time" };

	fprintf(f, "$%s%d << EOD\n", names[s], k);
	if (s == EVAL) {
		for (int i = 0; i < r->neval; i++)
			if (isfinite(r->eval[i].loss))
				fprintf(f, "%d %.9g\n", r->eval[i].step, r->eval[i].loss);
	} else {
		for (int i = 0; i < r->nsteps; i++) {
			double v = s == LOSS ? r->steps[i].loss : r->steps[i].time_s;

			if (isfinite(v))
				fprintf(f, "%d %.9g\n", r->steps[i].step, v);
		}
	}
	fprintf(f, "EOD\n");
}

static void write_script(FILE *f, const struct tl_run *runs, char **names, int n,
			 const char *out, bool svg)
{
	static const char *const names_s[] = { "loss", "eval", "time" };
	static const char *const ylabel[] = { "training loss", "validation loss", "seconds per step" };
	int last = 0;

	if (svg)
		fprintf(f, "set terminal svg size 1000,1100 dynamic noenhanced "
			"background rgb 'white' font 'sans,12'\n");
	else
		fprintf(f, "set terminal pngcairo size 1000,1100 noenhanced font 'sans,10'\n");
	fprintf(f, "set output ");
	put_quoted(f, out);
	fprintf(f, "\n");
	for (int k = 0; k < n; k++)
		for (int s = 0; s < NSERIES; s++)
			if (points(&runs[k], s))
				write_data(f, &runs[k], k, s);
	/* one x range and fixed margins line the three panels up; a run keeps its colour */
	for (int k = 0; k < n; k++) {
		for (int i = 0; i < runs[k].nsteps; i++)
			if (runs[k].steps[i].step > last)
				last = runs[k].steps[i].step;
		for (int i = 0; i < runs[k].neval; i++)
			if (runs[k].eval[i].step > last)
				last = runs[k].eval[i].step;
	}
	fprintf(f, "set multiplot layout 3,1\nset grid\nset key top right box opaque\n"
		"set lmargin 12\nset rmargin 4\nset xrange [0:%d]\nset xlabel 'step'\n",
		last > 1 ? last : 1);
	for (int s = 0; s < NSERIES; s++) {
		int shown = 0;

		fprintf(f, "set ylabel '%s'\n", ylabel[s]);
		for (int k = 0; k < n; k++) {
			if (!points(&runs[k], s))
				continue;
			fprintf(f, "%s$%s%d using 1:2 with %s lw 1.5 lc %d title ",
				shown ? ", " : "plot ", names_s[s], k,
				s == EVAL ? "linespoints pt 7 ps 0.6" : "lines", k + 1);
			put_quoted(f, names[k]);
			shown++;
		}
		if (!shown)	/* an empty panel that says why */
			fprintf(f, "set label 1 'none recorded' at graph 0.5, 0.5 center\n"
				"plot [0:1] [0:1] -1 notitle\nunset label 1\n");
		else
			fprintf(f, "\n");
	}
	fprintf(f, "unset multiplot\nset output\n");
}

/*
 * Runs gnuplot with @script on its stdin.  An exec failure comes back through a close-on-exec
 * pipe, so "gnuplot is not installed" is told apart from "gnuplot failed".
 */
static int run_gnuplot(const char *script, size_t len)
{
	int in[2], err[2], status, e = 0;
	ssize_t got;
	pid_t pid;

	if (pipe(in) || pipe2(err, O_CLOEXEC)) {
		fprintf(stderr, "%s: pipe: %s\n", prog, strerror(errno));
		return -1;
	}
	pid = fork();
	if (pid < 0) {
		fprintf(stderr, "%s: fork: %s\n", prog, strerror(errno));
		return -1;
	}
	if (pid == 0) {
		char *const av[] = { "gnuplot", NULL };

		dup2(in[0], 0);
		close(in[0]);
		close(in[1]);
		close(err[0]);
		execvp(av[0], av);
		e = errno;
		if (write(err[1], &e, sizeof(e)) < 0)
			_exit(127);
		_exit(127);
	}
	close(in[0]);
	close(err[1]);
	got = read(err[0], &e, sizeof(e));
	close(err[0]);
	if (got == (ssize_t)sizeof(e)) {
		close(in[1]);
		waitpid(pid, &status, 0);
		fprintf(stderr, "%s: cannot run gnuplot: %s; install it (Debian: apt-get install "
			"gnuplot-nox) or put it on PATH\n", prog, strerror(e));
		return -1;
	}
	for (size_t done = 0; done < len;) {
		ssize_t w = write(in[1], script + done, len - done);

		if (w < 0) {
			if (errno == EINTR)
				continue;
			break;		/* gnuplot stopped reading: its status says why */
		}
		done += w;
	}
	close(in[1]);
	while (waitpid(pid, &status, 0) < 0)
		if (errno != EINTR)
			return -1;
	if (!WIFEXITED(status) || WEXITSTATUS(status)) {
		fprintf(stderr, "%s: gnuplot failed (%s %d); its message is above\n", prog,
			WIFEXITED(status) ? "exit status" : "signal",
			WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
		return -1;
	}
	return 0;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "output", required_argument, NULL, 'o' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 }
	};
	const char *out = NULL, *dot;
	struct tl_run *runs;
	char *script = NULL;
	size_t len = 0;
	struct stat st;
	int c, n, ret = 1;
	bool svg;
	FILE *f;

	while ((c = getopt_long(argc, argv, "o:h", opts, NULL)) != -1) {
		switch (c) {
		case 'o':
			out = optarg;
			break;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (optind >= argc || !out) {
		fprintf(stderr, "%s: %s\n", prog, !out ? "no output file: give -o FILE.svg or "
			"-o FILE.png" : "no run directory given");
		usage(stderr);
		return 2;
	}
	dot = strrchr(out, '.');
	if (!dot || (strcmp(dot, ".svg") && strcmp(dot, ".png"))) {
		fprintf(stderr, "%s: -o %s: the name must end in .svg or .png (that picks the "
			"format)\n", prog, out);
		return 2;
	}
	svg = !strcmp(dot, ".svg");
	n = argc - optind;
	for (int i = optind; i < argc; i++) {
		if (strchr(argv[i], '\n')) {
			fprintf(stderr, "%s: a run name with a newline cannot be a plot title; "
				"rename or link the run directory\n", prog);
			return 2;
		}
	}
	if (strchr(out, '\n')) {
		fprintf(stderr, "%s: -o: the output name has a newline; choose another\n", prog);
		return 2;
	}
	runs = calloc(n, sizeof(*runs));
	if (!runs) {
		fprintf(stderr, "%s: out of memory\n", prog);
		return 1;
	}
	for (int k = 0; k < n; k++)
		if (tl_run_read(prog, argv[optind + k], &runs[k]))
			goto out_free_runs;
	for (int k = 0; k < n; k++) {
		if (runs[k].nsteps == 0) {
			fprintf(stderr, "%s: %s: no steps recorded yet; nothing to draw for it\n",
				prog, runs[k].file);
			goto out_free_runs;
		}
	}
	f = open_memstream(&script, &len);
	if (!f) {
		fprintf(stderr, "%s: out of memory\n", prog);
		goto out_free_runs;
	}
	write_script(f, runs, argv + optind, n, out, svg);
	fclose(f);
	signal(SIGPIPE, SIG_IGN);
	if (run_gnuplot(script, len))
		goto out_free_script;
	if (stat(out, &st) || st.st_size == 0) {
		fprintf(stderr, "%s: gnuplot ran but %s is missing or empty; check that its "
			"folder exists and is writable\n", prog, out);
		goto out_free_script;
	}
	ret = 0;
out_free_script:
	free(script);
out_free_runs:
	for (int k = 0; k < n; k++)
		tl_run_free(&runs[k]);
	free(runs);
	return ret;
}
