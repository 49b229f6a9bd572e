/*
 * runfile: reading RUN/training_metrics.json for the tools (see runfile.h).
 *
 * Every problem names the file and says what to do: the tools are run by people looking at a
 * cluster's output directory, often of a job that died half way.
 */
#include "runfile.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static double num_or_nan(json_t *o, const char *key)
{
	json_t *v = json_object_get(o, key);

	return json_is_number(v) ? json_number_value(v) : NAN;
}

static long long int_or(json_t *o, const char *key, long long def)
{
	json_t *v = json_object_get(o, key);

	if (json_is_integer(v))
		return json_integer_value(v);
	if (json_is_real(v))
		return (long long)json_real_value(v);
	return def;
}

int tl_run_read(const char *prog, const char *path, struct tl_run *r)
{
	json_error_t jerr;
	json_t *root, *run, *steps, *eval;
	struct stat st;
	size_t i;

	memset(r, 0, sizeof(*r));
	snprintf(r->dir, sizeof(r->dir), "%s", path);
	if (stat(path, &st) != 0) {
		fprintf(stderr, "%s: %s: %s; give a run directory (runs/NAME) or its "
			"training_metrics.json\n", prog, path, strerror(errno));
		return -1;
	}
	if (S_ISDIR(st.st_mode))
		snprintf(r->file, sizeof(r->file), "%s/training_metrics.json", path);
	else
		snprintf(r->file, sizeof(r->file), "%s", path);
	if (stat(r->file, &st) != 0) {
		fprintf(stderr, "%s: %s: %s; the trainer writes it when the run starts: is %s a run "
			"directory, and did the job get that far (see its train.log)?\n", prog,
			r->file, strerror(errno), path);
		return -1;
	}
	if (st.st_size == 0) {
		fprintf(stderr, "%s: %s: empty file; the trainer rewrites it atomically, so an empty "
			"one was made by something else: rerun the job or remove the file\n", prog,
			r->file);
		return -1;
	}
	root = json_load_file(r->file, 0, &jerr);
	if (!root) {
		fprintf(stderr, "%s: %s:%d:%d: invalid JSON (%s); it should be the trainer's "
			"training_metrics.json\n", prog, r->file, jerr.line, jerr.column, jerr.text);
		return -1;
	}
	run = json_object_get(root, "run");
	steps = json_object_get(root, "steps");
	eval = json_object_get(root, "eval");
	if (!json_is_object(root) || !json_is_object(run) || !json_is_array(steps)) {
		fprintf(stderr, "%s: %s: not a training_metrics.json (expected an object with "
			"\"run\" {...} and \"steps\" [...])\n", prog, r->file);
		json_decref(root);
		return -1;
	}

	r->world = (int)int_or(run, "world", 1);
	if (r->world < 1)
		r->world = 1;
	r->records_per_step = (long)int_or(run, "records_per_step", 0);
	r->epoch_records = (long)int_or(run, "epoch_records", 0);
	r->planned_steps = (int)int_or(run, "steps", 0);
	r->start_unix = num_or_nan(run, "start_unix");
	if (json_is_string(json_object_get(run, "start_local")))
		snprintf(r->start_local, sizeof(r->start_local), "%s",
			 json_string_value(json_object_get(run, "start_local")));

	r->steps = calloc(json_array_size(steps) + 1, sizeof(*r->steps));
	r->eval = calloc(json_array_size(eval) + 1, sizeof(*r->eval));
	if (!r->steps || !r->eval) {
		fprintf(stderr, "%s: %s: out of memory\n", prog, r->file);
		json_decref(root);
		tl_run_free(r);
		return -1;
	}
	for (i = 0; i < json_array_size(steps); i++) {
		json_t *s = json_array_get(steps, i);
		struct tl_step *d = &r->steps[r->nsteps];

		if (!json_is_object(s) || !json_is_integer(json_object_get(s, "step"))) {
			fprintf(stderr, "%s: %s: steps[%zu] has no integer \"step\"; the file is "
				"damaged: rerun the job\n", prog, r->file, i);
			json_decref(root);
			tl_run_free(r);
			return -1;
		}
		d->step = (int)json_integer_value(json_object_get(s, "step"));
		d->time_s = num_or_nan(s, "time_s");
		d->end_unix = num_or_nan(s, "end_unix");
		d->loss = num_or_nan(s, "loss");
		d->records = (long)int_or(s, "records", 0);
		d->peak_gpu_bytes = int_or(s, "peak_gpu_bytes", 0);
		r->nsteps++;
	}
	for (i = 0; i < json_array_size(eval); i++) {
		json_t *e = json_array_get(eval, i);

		if (!json_is_object(e))
			continue;
		r->eval[r->neval].step = (int)int_or(e, "step", 0);
		r->eval[r->neval].loss = num_or_nan(e, "loss");
		r->neval++;
	}
	json_decref(root);
	return 0;
}

void tl_run_free(struct tl_run *r)
{
	free(r->steps);
	free(r->eval);
	r->steps = NULL;
	r->eval = NULL;
	r->nsteps = r->neval = 0;
}

bool tl_run_utc_offset(const struct tl_run *r, long *offset_s)
{
	size_t n = strlen(r->start_local);
	const char *z;
	int hh, mm;

	/* strftime's %z: "+hhmm" or "-hhmm" at the end */
	if (n < 5)
		return false;
	z = r->start_local + n - 5;
	if ((z[0] != '+' && z[0] != '-') || sscanf(z + 1, "%2d%2d", &hh, &mm) != 2)
		return false;
	*offset_s = (hh * 3600L + mm * 60L) * (z[0] == '-' ? -1 : 1);
	return true;
}

double tl_run_first_step_start(const struct tl_run *r)
{
	const struct tl_step *first = NULL;

	for (int i = 0; i < r->nsteps; i++) {
		const struct tl_step *s = &r->steps[i];

		if (!isfinite(s->end_unix) || !isfinite(s->time_s))
			continue;
		if (!first || s->step < first->step)
			first = s;
	}
	return first ? first->end_unix - first->time_s : NAN;
}
