/*
 * shardlm-epoch: the epoch projector.
 *
 * From each run's training_metrics.json: seconds per optimizer step (the median over the steps
 * after the warm-up, so a slow first step or a checkpoint write does not skew it), peak GPU memory,
 * records per step, and what one epoch (every training record once) would take in hours and
 * GPU-hours.  Several runs are ranked by epoch hours, with the change against the first one named.
 * GB here is 10^9 bytes.
 */
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runfile.h"

static const char *prog = "shardlm-epoch";

struct projection {
	const char *name;		/* the run as given on the command line */
	int order;			/* position on the command line */
	int steps;			/* steps recorded */
	int used;			/* steps the median is over */
	double s_per_step;		/* median seconds per optimizer step */
	double peak_gpu_gb;		/* max peak_gpu_bytes / 1e9 */
	long records_per_step;
	long epoch_records;
	double epoch_hours;		/* epoch_records / records_per_step * s_per_step / 3600 */
	double epoch_gpu_hours;		/* epoch_hours * world */
	int world;
	char note[512];			/* partial run, missing steps, short run */
};

static void usage(FILE *f)
{
	fprintf(f,
		"usage: %s RUN_DIR... [--per-step N] [--warmup K] [--json]\n"
		"  Projects the hours and GPU-hours of one epoch (every training record once) from\n"
		"  each run's training_metrics.json; several runs are ranked by epoch hours.\n"
		"  --per-step N  records per optimizer step to project with (default: the run's)\n"
		"  --warmup K    leave the first K steps out of the median step time (default 5)\n"
		"  --json        a JSON array, ranked, with keys run, steps, s_per_step, peak_gpu_gb,\n"
		"                records_per_step, epoch_records, epoch_hours, epoch_gpu_hours, world\n",
		prog);
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

static double median(double *v, int n)
{
	qsort(v, n, sizeof(*v), cmp_double);
	return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static int cmp_int(const void *a, const void *b)
{
	return (*(const int *)a > *(const int *)b) - (*(const int *)a < *(const int *)b);
}

/* Appends "missing steps a, b, c-d" for gaps in 1..max step to @note. */
static void note_missing(const struct tl_run *r, char *note, size_t n)
{
	int *nums = malloc(sizeof(int) * (r->nsteps + 1));
	int k = 0, expect = 1, shown = 0;
	size_t len = strlen(note);

	if (!nums)
		return;
	for (int i = 0; i < r->nsteps; i++)
		nums[k++] = r->steps[i].step;
	qsort(nums, k, sizeof(int), cmp_int);
	for (int i = 0; i < k; i++) {
		if (nums[i] > expect && len < n) {
			len += snprintf(note + len, n - len, "%s", shown ? ", " : "; missing steps ");
			if (nums[i] - 1 > expect)
				len += snprintf(note + len, n > len ? n - len : 0, "%d-%d", expect,
						nums[i] - 1);
			else
				len += snprintf(note + len, n > len ? n - len : 0, "%d", expect);
			shown++;
		}
		if (nums[i] >= expect)
			expect = nums[i] + 1;
	}
	free(nums);
}

static int project(const char *path, int order, int warmup, long per_step, struct projection *p)
{
	struct tl_run r;
	double *t;
	int n = 0, last = 0, ret = -1;
	long long peak = 0;
	size_t len;

	if (tl_run_read(prog, path, &r))
		return -1;
	memset(p, 0, sizeof(*p));
	p->name = path;
	p->order = order;
	p->steps = r.nsteps;
	p->world = r.world;
	t = malloc(sizeof(double) * (r.nsteps + 1));
	if (!t) {
		fprintf(stderr, "%s: out of memory\n", prog);
		goto out_free_run;
	}
	for (int i = 0; i < r.nsteps; i++) {
		if (r.steps[i].step > last)
			last = r.steps[i].step;
		if (r.steps[i].peak_gpu_bytes > peak)
			peak = r.steps[i].peak_gpu_bytes;
		if (r.steps[i].step > warmup && isfinite(r.steps[i].time_s))
			t[n++] = r.steps[i].time_s;
	}
	if (n == 0) {
		/* a run no longer than the warm-up: better a rough number than none */
		for (int i = 0; i < r.nsteps; i++)
			if (isfinite(r.steps[i].time_s))
				t[n++] = r.steps[i].time_s;
		if (n == 0) {
			fprintf(stderr, "%s: %s: no step with a recorded time_s yet; wait until the "
				"job has finished a step (see its train.log)\n", prog, r.file);
			goto out_free_t;
		}
		snprintf(p->note, sizeof(p->note), "only %d step%s (warm-up is %d): median over "
			 "all of them", n, n == 1 ? "" : "s", warmup);
	}
	p->used = n;
	p->s_per_step = median(t, n);
	p->peak_gpu_gb = peak / 1e9;
	p->records_per_step = per_step ? per_step : r.records_per_step;
	p->epoch_records = r.epoch_records;
	if (p->records_per_step <= 0) {
		fprintf(stderr, "%s: %s: run.records_per_step is not recorded; pass --per-step N\n",
			prog, r.file);
		goto out_free_t;
	}
	if (p->epoch_records <= 0) {
		fprintf(stderr, "%s: %s: run.epoch_records is not recorded (or 0); an epoch cannot "
			"be projected: check the run's data.train\n", prog, r.file);
		goto out_free_t;
	}
	p->epoch_hours = (double)p->epoch_records / p->records_per_step * p->s_per_step / 3600;
	p->epoch_gpu_hours = p->epoch_hours * p->world;

	len = strlen(p->note);
	if (r.planned_steps > 0 && last < r.planned_steps)
		snprintf(p->note + len, sizeof(p->note) - len, "%spartial run: %d of %d steps "
			 "recorded, projected from them", len ? "; " : "", r.nsteps, r.planned_steps);
	note_missing(&r, p->note, sizeof(p->note));
	if (p->note[0] == ';')
		memmove(p->note, p->note + 2, strlen(p->note + 2) + 1);
	ret = 0;
out_free_t:
	free(t);
out_free_run:
	tl_run_free(&r);
	return ret;
}

static int cmp_hours(const void *a, const void *b)
{
	const struct projection *x = a, *y = b;

	if (x->epoch_hours != y->epoch_hours)
		return x->epoch_hours < y->epoch_hours ? -1 : 1;
	return x->order - y->order;
}

static int print_json(const struct projection *p, int n)
{
	json_t *arr = json_array();
	int ret;

	for (int i = 0; i < n; i++)
		json_array_append_new(arr, json_pack("{s:s, s:i, s:f, s:f, s:I, s:I, s:f, s:f, s:i}",
			"run", p[i].name, "steps", p[i].steps, "s_per_step", p[i].s_per_step,
			"peak_gpu_gb", p[i].peak_gpu_gb,
			"records_per_step", (json_int_t)p[i].records_per_step,
			"epoch_records", (json_int_t)p[i].epoch_records,
			"epoch_hours", p[i].epoch_hours, "epoch_gpu_hours", p[i].epoch_gpu_hours,
			"world", p[i].world));
	ret = json_dumpf(arr, stdout, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(12));
	putchar('\n');
	json_decref(arr);
	return ret;
}

static void print_table(const struct projection *p, int n, int warmup)
{
	int w = 3, ref = 0;
	double h0;

	/* the reference is the first run given that could be read */
	for (int i = 0; i < n; i++) {
		if ((int)strlen(p[i].name) > w)
			w = strlen(p[i].name);
		if (p[i].order < p[ref].order)
			ref = i;
	}
	h0 = p[ref].epoch_hours;
	printf("epoch = every training record once; s/step = median after %d warm-up steps; "
	       "GB = 1e9 bytes\n", warmup);
	printf("%s%-*s  %5s  %8s  %7s  %8s  %9s  %8s  %9s  %5s%s\n", n > 1 ? "rank  " : "", w,
	       "run", "steps", "s/step", "peak GB", "rec/step", "epoch rec", "epoch h",
	       "GPU-h", "world", n > 1 ? "  vs first" : "");
	for (int i = 0; i < n; i++) {
		char rank[16] = "", vs[32] = "";

		if (n > 1) {
			snprintf(rank, sizeof(rank), "%-4d  ", i + 1);
			if (i == ref)
				snprintf(vs, sizeof(vs), "  %9s", "first");
			else
				snprintf(vs, sizeof(vs), "  %+8.1f%%",
					 h0 > 0 ? 100 * (p[i].epoch_hours - h0) / h0 : 0.0);
		}
		printf("%s%-*s  %5d  %8.3f  %7.2f  %8ld  %9ld  %8.2f  %9.1f  %5d%s\n", rank, w,
		       p[i].name, p[i].steps, p[i].s_per_step, p[i].peak_gpu_gb,
		       p[i].records_per_step, p[i].epoch_records, p[i].epoch_hours,
		       p[i].epoch_gpu_hours, p[i].world, vs);
	}
	if (n > 1)
		printf("ranked by epoch hours; vs first: change against %s\n", p[ref].name);
	for (int i = 0; i < n; i++)
		if (p[i].note[0])
			printf("note: %s: %s\n", p[i].name, p[i].note);
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "per-step", required_argument, NULL, 'p' },
		{ "warmup", required_argument, NULL, 'w' },
		{ "json", no_argument, NULL, 'j' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 }
	};
	struct projection *p;
	long per_step = 0;
	int warmup = 5, json = 0, c, n = 0, bad = 0;
	char *end;

	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (c) {
		case 'p':
			per_step = strtol(optarg, &end, 10);
			if (*end || per_step <= 0) {
				fprintf(stderr, "%s: --per-step '%s': expected a positive number of "
					"records\n", prog, optarg);
				return 2;
			}
			break;
		case 'w':
			warmup = (int)strtol(optarg, &end, 10);
			if (*end || !*optarg || warmup < 0) {
				fprintf(stderr, "%s: --warmup '%s': expected a number of steps >= 0\n",
					prog, optarg);
				return 2;
			}
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
	p = calloc(argc - optind, sizeof(*p));
	if (!p) {
		fprintf(stderr, "%s: out of memory\n", prog);
		return 1;
	}
	for (int i = optind; i < argc; i++) {
		if (project(argv[i], i - optind, warmup, per_step, &p[n]) == 0)
			n++;
		else
			bad++;
	}
	qsort(p, n, sizeof(*p), cmp_hours);
	if (json)
		print_json(p, n);
	else if (n)
		print_table(p, n, warmup);
	free(p);
	return bad ? 1 : 0;
}
