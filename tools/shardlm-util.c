/*
 * shardlm-util: the GPU-utilization reducer.
 *
 * Reads shardlm's GPU log (one file per node, the job's own GPUs only: nvidia-smi's columns with
 * `host` last) and plain `nvidia-smi --query-gpu=timestamp,index,memory.used,utilization.gpu
 * --format=csv` output, and reports per GPU and overall the average and peak utilization and the
 * peak memory used.  Several files make one report; a GPU is its host (the `host` column, or the
 * file it came from when there is none) and its index.  Columns are found by their header names,
 * so the units may be present (`1234 MiB`, `87 %`) or not (`--format=csv,nounits`).
 */
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runfile.h"

static const char *prog = "shardlm-util";

#define HEADER_HINT "nvidia-smi's 'timestamp, index, memory.used [MiB], utilization.gpu [%]'"
#define MAX_COLS 32

struct gpu {
	char host[256];			/* host column, or the file name */
	int index;			/* nvidia-smi / NVML index on that host */
	long samples;
	double util_sum;		/* % */
	int peak_util;			/* % */
	long long peak_mem_mib;
};

struct report {
	struct gpu *gpus;
	int ngpus, cap;
	long samples;			/* kept */
	long dropped;			/* before the first step */
	long unavailable;		/* "[N/A]" / "[Not Supported]" values */
	double cutoff;			/* unix seconds; NAN: keep all */
	bool have_offset;		/* the run's UTC offset converts local timestamps */
	long offset_s;
};

struct columns {
	int n;
	int ts, index, mem, util, host;	/* positions; -1 when absent */
};

static void usage(FILE *f)
{
	fprintf(f,
		"usage: %s CSV... [--from-first-step RUN] [--json]\n"
		"  Average and peak GPU utilization and peak memory used, per GPU and overall, from\n"
		"  shardlm's GPU logs (gpu_log.file) or nvidia-smi --query-gpu=timestamp,index,\n"
		"  memory.used,utilization.gpu --format=csv output; several files make one report.\n"
		"  --from-first-step RUN  leave out samples taken before RUN's first optimizer step\n"
		"                         began (model loading, data preparation)\n"
		"  --json                 keys avg_util, peak_util, peak_mem_mib, samples, gpus\n",
		prog);
}

static char *trim(char *s)
{
	char *e;

	while (isspace((unsigned char)*s))
		s++;
	e = s + strlen(s);
	while (e > s && isspace((unsigned char)e[-1]))
		*--e = 0;
	return s;
}

/* Splits @line at commas into trimmed fields; returns their number (at most MAX_COLS + 1). */
static int split(char *line, char **f)
{
	int n = 0;

	for (char *p = line;; p++) {
		char *c = strchr(p, ',');

		if (n <= MAX_COLS)
			f[n++] = p;
		if (!c)
			break;
		*c = 0;
		p = c;
	}
	for (int i = 0; i < n; i++)
		f[i] = trim(f[i]);
	return n;
}

static int parse_header(char *line, struct columns *c, const char *file, long ln)
{
	char *f[MAX_COLS + 1];

	c->n = split(line, f);
	c->ts = c->index = c->mem = c->util = c->host = -1;
	for (int i = 0; i < c->n; i++) {
		char *unit = strchr(f[i], '[');

		if (unit)		/* "memory.used [MiB]" -> "memory.used" */
			*unit = 0;
		f[i] = trim(f[i]);
		if (!strcmp(f[i], "timestamp"))
			c->ts = i;
		else if (!strcmp(f[i], "index"))
			c->index = i;
		else if (!strcmp(f[i], "memory.used"))
			c->mem = i;
		else if (!strcmp(f[i], "utilization.gpu"))
			c->util = i;
		else if (!strcmp(f[i], "host"))
			c->host = i;
	}
	if (c->ts < 0 || c->index < 0 || c->mem < 0 || c->util < 0) {
		fprintf(stderr, "%s: %s:%ld: the header lacks %s; expected %s (and optionally "
			"'host')\n", prog, file, ln, c->ts < 0 ? "timestamp" : c->index < 0 ?
			"index" : c->mem < 0 ? "memory.used" : "utilization.gpu", HEADER_HINT);
		return -1;
	}
	return 0;
}

/* "2026/11/29 16:05:01.123" (local time) -> seconds since the epoch */
static int parse_time(const char *s, const struct report *rep, double *t)
{
	struct tm tm = { 0 };
	double frac = 0;
	int n = 0;

	if (sscanf(s, "%d/%d/%d %d:%d:%d%n", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour,
		   &tm.tm_min, &tm.tm_sec, &n) != 6)
		return -1;
	if (s[n] == '.') {
		char *end;

		frac = strtod(s + n, &end);
		if (*end)
			return -1;
	} else if (s[n]) {
		return -1;
	}
	tm.tm_year -= 1900;
	tm.tm_mon -= 1;
	if (tm.tm_mon < 0 || tm.tm_mon > 11 || tm.tm_mday < 1 || tm.tm_mday > 31)
		return -1;
	if (rep->have_offset) {
		/* the node's local time when the run began: right even where this tool runs in
		 * another time zone (a laptop reading the cluster's logs) */
		*t = (double)timegm(&tm) - rep->offset_s + frac;
	} else {
		tm.tm_isdst = -1;
		*t = (double)mktime(&tm) + frac;
	}
	return 0;
}

/* "1234 MiB" / "87 %" / "1234" with @unit -> value; 1 for "[N/A]"-style, -1 for garbage */
static int parse_value(const char *s, const char *unit, long long *v)
{
	char *end;

	if (s[0] == '[' || !strcmp(s, "N/A"))
		return 1;
	errno = 0;
	*v = strtoll(s, &end, 10);
	if (end == s || errno || *v < 0)
		return -1;
	while (*end == ' ')
		end++;
	if (*end && strcmp(end, unit))
		return -1;
	return 0;
}

static struct gpu *find_gpu(struct report *rep, const char *host, int index)
{
	struct gpu *g;

	for (int i = 0; i < rep->ngpus; i++)
		if (rep->gpus[i].index == index && !strcmp(rep->gpus[i].host, host))
			return &rep->gpus[i];
	if (rep->ngpus == rep->cap) {
		int cap = rep->cap ? 2 * rep->cap : 16;
		struct gpu *p = realloc(rep->gpus, cap * sizeof(*p));

		if (!p)
			return NULL;
		rep->gpus = p;
		rep->cap = cap;
	}
	g = &rep->gpus[rep->ngpus++];
	memset(g, 0, sizeof(*g));
	snprintf(g->host, sizeof(g->host), "%s", host);
	g->index = index;
	return g;
}

static int read_log(const char *file, struct report *rep)
{
	FILE *f = fopen(file, "r");
	struct columns col = { 0 };
	char *line = NULL, *fl[MAX_COLS + 1];
	size_t cap = 0;
	long ln = 0, kept = 0, seen = 0;
	int ret = -1;
	bool header = false;

	if (!f) {
		fprintf(stderr, "%s: %s: %s\n", prog, file, strerror(errno));
		return -1;
	}
	while (getline(&line, &cap, f) >= 0) {
		char *s = trim(line), *end;
		long long mem, util;
		int nf, rm, ru;
		long idx;
		double t;
		struct gpu *g;

		ln++;
		if (!*s)
			continue;
		if (!strncmp(s, "timestamp", 9)) {
			/* a header: the first, or a repeat where two logs were concatenated */
			if (parse_header(s, &col, file, ln))
				goto out_free;
			header = true;
			continue;
		}
		if (!header) {
			fprintf(stderr, "%s: %s:%ld: a sample before any header line; expected "
				"%s first\n", prog, file, ln, HEADER_HINT);
			goto out_free;
		}
		nf = split(s, fl);
		if (nf != col.n) {
			fprintf(stderr, "%s: %s:%ld: %d columns where the header has %d; a "
				"truncated or foreign line: remove it\n", prog, file, ln, nf, col.n);
			goto out_free;
		}
		if (parse_time(fl[col.ts], rep, &t)) {
			fprintf(stderr, "%s: %s:%ld: bad timestamp '%s'; expected nvidia-smi's "
				"'YYYY/MM/DD hh:mm:ss.mmm'\n", prog, file, ln, fl[col.ts]);
			goto out_free;
		}
		idx = strtol(fl[col.index], &end, 10);
		if (end == fl[col.index] || *end || idx < 0) {
			fprintf(stderr, "%s: %s:%ld: bad GPU index '%s'\n", prog, file, ln,
				fl[col.index]);
			goto out_free;
		}
		rm = parse_value(fl[col.mem], "MiB", &mem);
		ru = parse_value(fl[col.util], "%", &util);
		if (rm < 0 || ru < 0 || (ru == 0 && util > 100)) {
			fprintf(stderr, "%s: %s:%ld: bad %s '%s'; expected %s\n", prog, file, ln,
				rm < 0 ? "memory.used" : "utilization.gpu",
				rm < 0 ? fl[col.mem] : fl[col.util],
				rm < 0 ? "MiB, as in '1234 MiB'" : "a percentage, as in '87 %'");
			goto out_free;
		}
		seen++;
		if (rm || ru) {
			rep->unavailable++;
			continue;
		}
		if (!isnan(rep->cutoff) && t < rep->cutoff) {
			rep->dropped++;
			continue;
		}
		g = find_gpu(rep, col.host >= 0 ? fl[col.host] : file, (int)idx);
		if (!g) {
			fprintf(stderr, "%s: out of memory\n", prog);
			goto out_free;
		}
		g->samples++;
		g->util_sum += util;
		if (util > g->peak_util)
			g->peak_util = (int)util;
		if (mem > g->peak_mem_mib)
			g->peak_mem_mib = mem;
		kept++;
	}
	if (ferror(f)) {
		fprintf(stderr, "%s: %s: read error: %s\n", prog, file, strerror(errno));
		goto out_free;
	}
	if (!header) {
		fprintf(stderr, "%s: %s: empty log (no header, no samples); the sampler writes "
			"one line per GPU every gpu_log.every_s seconds: check that the job reached "
			"its GPUs and that train.log does not say NVML is missing\n", prog, file);
		goto out_free;
	}
	if (seen == 0) {
		fprintf(stderr, "%s: %s: a header but no samples; the job ended before the first "
			"sample, or gpu_log.every_s is too long for it\n", prog, file);
		goto out_free;
	}
	rep->samples += kept;
	ret = 0;
out_free:
	free(line);
	fclose(f);
	return ret;
}

static int cmp_gpu(const void *a, const void *b)
{
	const struct gpu *x = a, *y = b;
	int c = strcmp(x->host, y->host);

	return c ? c : x->index - y->index;
}

static void totals(const struct report *rep, double *avg, int *peak, long long *mem)
{
	double sum = 0;

	*peak = 0;
	*mem = 0;
	for (int i = 0; i < rep->ngpus; i++) {
		sum += rep->gpus[i].util_sum;
		if (rep->gpus[i].peak_util > *peak)
			*peak = rep->gpus[i].peak_util;
		if (rep->gpus[i].peak_mem_mib > *mem)
			*mem = rep->gpus[i].peak_mem_mib;
	}
	*avg = rep->samples ? sum / rep->samples : 0;
}

static void print_json(const struct report *rep)
{
	json_t *gpus = json_array(), *root;
	long long mem;
	double avg;
	int peak;

	for (int i = 0; i < rep->ngpus; i++) {
		const struct gpu *g = &rep->gpus[i];

		json_array_append_new(gpus, json_pack("{s:s, s:i, s:I, s:f, s:i, s:I}",
			"host", g->host, "index", g->index, "samples", (json_int_t)g->samples,
			"avg_util", g->util_sum / g->samples, "peak_util", g->peak_util,
			"peak_mem_mib", (json_int_t)g->peak_mem_mib));
	}
	totals(rep, &avg, &peak, &mem);
	root = json_pack("{s:f, s:i, s:I, s:I, s:o}", "avg_util", avg, "peak_util", peak,
			 "peak_mem_mib", (json_int_t)mem, "samples", (json_int_t)rep->samples,
			 "gpus", gpus);
	json_dumpf(root, stdout, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(12));
	putchar('\n');
	json_decref(root);
}

static void print_table(const struct report *rep, int nfiles)
{
	long long mem;
	double avg;
	int peak, w = 4;

	for (int i = 0; i < rep->ngpus; i++)
		if ((int)strlen(rep->gpus[i].host) > w)
			w = strlen(rep->gpus[i].host);
	printf("%d file%s, %ld samples, %d GPU%s\n", nfiles, nfiles == 1 ? "" : "s", rep->samples,
	       rep->ngpus, rep->ngpus == 1 ? "" : "s");
	printf("%-*s  %5s  %8s  %8s  %9s  %12s\n", w, "host", "index", "samples", "avg util",
	       "peak util", "peak mem MiB");
	for (int i = 0; i < rep->ngpus; i++) {
		const struct gpu *g = &rep->gpus[i];

		printf("%-*s  %5d  %8ld  %7.1f%%  %8d%%  %12lld\n", w, g->host, g->index, g->samples,
		       g->util_sum / g->samples, g->peak_util, g->peak_mem_mib);
	}
	totals(rep, &avg, &peak, &mem);
	printf("%-*s  %5s  %8ld  %7.1f%%  %8d%%  %12lld\n", w, "all", "", rep->samples, avg, peak,
	       mem);
	if (rep->dropped)
		printf("note: left out %ld samples taken before the first step began\n",
		       rep->dropped);
	if (rep->unavailable)
		printf("note: skipped %ld samples whose value nvidia-smi reported as unavailable\n",
		       rep->unavailable);
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "from-first-step", required_argument, NULL, 'f' },
		{ "json", no_argument, NULL, 'j' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 }
	};
	struct report rep = { .cutoff = NAN };
	const char *run = NULL;
	int json = 0, c, ret = 1;

	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (c) {
		case 'f':
			run = optarg;
			break;
		case 'j':
			json = 1;
			break;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (optind >= argc) {
		usage(stderr);
		return 2;
	}
	if (run) {
		struct tl_run r;

		if (tl_run_read(prog, run, &r))
			return 1;
		rep.cutoff = tl_run_first_step_start(&r);
		rep.have_offset = tl_run_utc_offset(&r, &rep.offset_s);
		if (isnan(rep.cutoff)) {
			fprintf(stderr, "%s: %s: no step recorded yet (no end_unix and time_s), so "
				"there is no first step to start from; leave out --from-first-step\n",
				prog, r.file);
			tl_run_free(&r);
			return 1;
		}
		tl_run_free(&r);
	}
	for (int i = optind; i < argc; i++)
		if (read_log(argv[i], &rep))
			goto out_free;
	if (rep.samples == 0) {
		fprintf(stderr, "%s: no samples left%s; nothing to report\n", prog,
			rep.dropped ? " after the first step began (every sample was taken during "
			"loading: the logs may be of another job)" : " (every value was unavailable)");
		goto out_free;
	}
	qsort(rep.gpus, rep.ngpus, sizeof(*rep.gpus), cmp_gpu);
	if (json)
		print_json(&rep);
	else
		print_table(&rep, argc - optind);
	ret = 0;
out_free:
	free(rep.gpus);
	return ret;
}
