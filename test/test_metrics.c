/*
 * test_metrics: RUN/training_metrics.json as the trainer writes it (src/metrics.c), read back with
 * jansson: every step's fields and expert counts (min, max and total worked out here from the
 * counts), evaluations, non-finite values as null, the asynchronous writer (the file after a flush
 * holds every step handed to it, in order, however many writes it skipped), the steps a resumed
 * run keeps from the file (the same text), a destroy that writes what was still pending, and a
 * write into a directory that does not exist (failure reported by the write, the flush and every
 * later write).
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "metrics.h"
#include "testutil.h"

static char dir[256];

static json_t *load(const char *path)
{
	json_error_t e;
	json_t *j = json_load_file(path, 0, &e);

	CHECK(j != NULL, "%s: line %d: %s", path, e.line, e.text);
	return j;
}

/* step @i's metrics; @counts: 2 layers x 3 experts when @moe */
static struct sl_step_metrics step_of(int i, bool moe, const long long *counts)
{
	struct sl_step_metrics s = {
		.step = i, .time_s = 0.25 * i, .end_unix = 1.7e9 + i, .loss = 1.0 / i, .lr = 1e-5 * i,
		.grad_norm = i == 3 ? NAN : 0.5 + i, .records = 16, .tokens = 1000 + i,
		.padded_tokens = 7, .peak_gpu_bytes = 123456789012LL,
	};

	if (moe) {
		s.moe_layers = 2;
		s.n_experts = 3;
		s.expert_tokens = counts;
		s.capacity = true;
		s.dropped_tokens = 5;
	}
	return s;
}

static void test_fields(void)
{
	char path[300];
	const long long counts[6] = { 4, 9, 1, 0, 7, 7 };
	struct sl_metrics *m;
	json_t *j, *steps, *s, *et;

	snprintf(path, sizeof(path), "%s/fields.json", dir);
	m = sl_metrics_create(path);
	sl_metrics_run_int(m, "world", 2);
	sl_metrics_run_string(m, "model", "tiny");
	for (int i = 1; i <= 3; i++) {
		struct sl_step_metrics sm = step_of(i, i == 2, counts);

		sl_metrics_add_step(m, &sm);
		CHECK(sl_metrics_write_async(m) == 0, "write_async");
	}
	sl_metrics_add_eval(m, 3, 0.75, 40);
	CHECK(sl_metrics_write(m) == 0, "write");
	j = load(path);
	CHECK(json_integer_value(json_object_get(json_object_get(j, "run"), "world")) == 2, "run");
	CHECK(!strcmp(json_string_value(json_object_get(json_object_get(j, "run"), "model")),
		      "tiny"), "run model");
	steps = json_object_get(j, "steps");
	CHECK(json_array_size(steps) == 3, "%zu steps", json_array_size(steps));
	for (int i = 1; i <= 3 && (size_t)i <= json_array_size(steps); i++) {
		s = json_array_get(steps, i - 1);
		CHECK(json_integer_value(json_object_get(s, "step")) == i, "step %d", i);
		CHECK(json_real_value(json_object_get(s, "time_s")) == 0.25 * i, "time_s %d", i);
		CHECK(json_real_value(json_object_get(s, "loss")) == 1.0 / i, "loss %d (17 digits)", i);
		CHECK(json_real_value(json_object_get(s, "lr")) == 1e-5 * i, "lr %d", i);
		CHECK(json_integer_value(json_object_get(s, "tokens")) == 1000 + i, "tokens %d", i);
		CHECK(json_integer_value(json_object_get(s, "peak_gpu_bytes")) == 123456789012LL,
		      "peak %d", i);
		if (i == 3)
			CHECK(json_is_null(json_object_get(s, "grad_norm")), "NaN as null");
		et = json_object_get(s, "expert_tokens");
		CHECK((et != NULL) == (i == 2), "expert_tokens only on step 2 (%d)", i);
		if (i == 2 && et) {
			json_t *pe = json_object_get(et, "per_expert");

			for (int l = 0; l < 2; l++) {
				long long lo = counts[3 * l], hi = lo, sum = 0;

				for (int e = 0; e < 3; e++) {
					const long long c = counts[3 * l + e];

					CHECK(json_integer_value(json_array_get(json_array_get(pe, l), e)) ==
						      c, "per_expert[%d][%d]", l, e);
					lo = c < lo ? c : lo;
					hi = c > hi ? c : hi;
					sum += c;
				}
				CHECK(json_integer_value(json_array_get(json_object_get(et, "min"), l)) ==
					      lo, "min %d", l);
				CHECK(json_integer_value(json_array_get(json_object_get(et, "max"), l)) ==
					      hi, "max %d", l);
				CHECK(json_integer_value(json_array_get(json_object_get(et, "total"),
									 l)) == sum, "total %d", l);
			}
			CHECK(json_integer_value(json_object_get(s, "dropped_tokens")) == 5, "dropped");
		}
	}
	s = json_array_get(json_object_get(j, "eval"), 0);
	CHECK(json_array_size(json_object_get(j, "eval")) == 1 &&
		      json_real_value(json_object_get(s, "loss")) == 0.75 &&
		      json_integer_value(json_object_get(s, "records")) == 40, "eval");
	json_decref(j);
	sl_metrics_destroy(m);
	snprintf(path, sizeof(path), "%s/fields.json.tmp", dir);
	CHECK(access(path, F_OK) != 0, "no temporary file left");
}

/* many steps each handed to the writer at once, then a flush: all of them, in order; a resumed
 * run keeps the first 150 with the same text, and its destroy writes its last document */
static void test_async_and_resume(void)
{
	char path[300], *before, *after;
	const long long counts[6] = { 1, 2, 3, 4, 5, 6 };
	struct sl_metrics *m;
	json_t *j, *steps;
	int n = 400;

	snprintf(path, sizeof(path), "%s/async.json", dir);
	m = sl_metrics_create(path);
	for (int i = 1; i <= n; i++) {
		struct sl_step_metrics sm = step_of(i, true, counts);

		sl_metrics_add_step(m, &sm);
		CHECK(sl_metrics_write_async(m) == 0, "write_async %d", i);
	}
	CHECK(sl_metrics_flush(m) == 0, "flush");
	j = load(path);
	steps = json_object_get(j, "steps");
	CHECK(json_array_size(steps) == (size_t)n, "%zu steps after the flush",
	      json_array_size(steps));
	for (int i = 0; i < n && (size_t)i < json_array_size(steps); i++)
		if (json_integer_value(json_object_get(json_array_get(steps, i), "step")) != i + 1) {
			CHECK(0, "entry %d is step %lld", i,
			      (long long)json_integer_value(
				      json_object_get(json_array_get(steps, i), "step")));
			break;
		}
	json_decref(j);
	sl_metrics_destroy(m);
	before = test_slurp(path);

	/* resume after step 150: the first 150 entries, as they were */
	m = sl_metrics_create(path);
	CHECK(sl_metrics_keep_earlier(m, path, 150) == 150, "kept 150");
	{
		struct sl_step_metrics sm = step_of(151, false, counts);

		sl_metrics_add_step(m, &sm);
	}
	CHECK(sl_metrics_write_async(m) == 0, "write_async after resume");
	sl_metrics_destroy(m);	/* writes the pending document */
	after = test_slurp(path);
	j = load(path);
	CHECK(json_array_size(json_object_get(j, "steps")) == 151, "%zu steps after the resume",
	      json_array_size(json_object_get(j, "steps")));
	json_decref(j);
	if (before && after) {
		/* the text up to step 151's line is the old file's up to step 150's */
		const char *cut = strstr(before, "{\"step\":151,");
		const char *cut2 = strstr(after, "{\"step\":151,");

		CHECK(cut && cut2 && cut - before == cut2 - after &&
			      !memcmp(before, after, cut - before), "the kept steps' text unchanged");
	}
	free(before);
	free(after);
}

static void test_failure(void)
{
	char path[300];
	struct sl_metrics *m;
	struct sl_step_metrics sm = step_of(1, false, NULL);

	snprintf(path, sizeof(path), "%s/missing/training_metrics.json", dir);
	fprintf(stderr, "('cannot write' errors expected here:)\n");
	m = sl_metrics_create(path);
	sl_metrics_add_step(m, &sm);
	CHECK(sl_metrics_write(m) < 0, "synchronous write into a missing directory");
	sl_metrics_write_async(m);
	CHECK(sl_metrics_flush(m) < 0, "the flush reports the failed write");
	CHECK(sl_metrics_write_async(m) < 0, "and so does every later write");
	sl_metrics_destroy(m);
}

int main(void)
{
	snprintf(dir, sizeof(dir), "%s/sl-metrics-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") :
									       "/tmp");
	if (!mkdtemp(dir)) {
		perror("mkdtemp");
		return 1;
	}
	test_fields();
	test_async_and_resume();
	test_failure();
	if (!test_failures) {
		char cmd[300];

		snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
		if (system(cmd) != 0)
			fprintf(stderr, "could not remove %s\n", dir);
	}
	return test_exit("test_metrics");
}
