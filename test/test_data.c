/*
 * test_data: JSONL loading (records, labels, every error kind with its file:line, skipping, the
 * max_state filter, the tokenizer hook), the step sampler (epochs, world-size independence,
 * seeding, length sorting, wrap-around) and padded host batches.
 *
 * Data files are written to a temporary directory; error messages are captured by pointing
 * stderr at a file for the duration of a load.
 */
#include <fcntl.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>

#include "data.h"
#include "testutil.h"
#include "tmpfiles.h"

static struct sl_data_opts opts(void)
{
	return (struct sl_data_opts){
		.text_field = "text", .label_field = "label", .need_label = true, .vocab = 512,
	};
}

/* stderr to /dev/null around calls whose errors are expected */
static int quiet_saved = -1;

static void quiet_begin(void)
{
	int nul = open("/dev/null", O_WRONLY);

	fflush(stderr);
	quiet_saved = dup(2);
	dup2(nul, 2);
	close(nul);
}

static void quiet_end(void)
{
	fflush(stderr);
	dup2(quiet_saved, 2);
	close(quiet_saved);
}

static int count_substr(const char *s, const char *sub)
{
	int c = 0;

	while ((s = strstr(s, sub))) {
		c++;
		s += strlen(sub);
	}
	return c;
}

/* A one-bad-line file must fail, naming FILE:LINE and saying @what. */
static void expect_error(const char *name, const char *text, long line, const char *what,
			 struct sl_data_opts o)
{
	struct sl_dataset ds;
	char want[700];
	const char *path = write_file(name, text);
	int rc = load(&ds, path, &o);

	snprintf(want, sizeof(want), "%s:%ld: ", path, line);
	CHECK(rc < 0, "%s: load returned %d", name, rc);
	CHECK(strstr(errbuf, want) != NULL, "%s: no '%s' in: %s", name, want, errbuf);
	CHECK(strstr(errbuf, what) != NULL, "%s: no '%s' in: %s", name, what, errbuf);
	CHECK(ds.n == 0 && ds.rec == NULL && ds.pool == NULL, "%s: records left behind", name);
	sl_data_free(&ds);
}

static void test_load_ok(void)
{
	struct sl_dataset ds;
	struct sl_data_opts o = opts();
	const char *path = write_file("ok.jsonl",
		"{\"input_ids\": [1, 2, 3], \"label\": 0.25}\n"
		"\n"
		"   \n"
		"{\"label\": 1, \"input_ids\": [511], \"other\": {\"x\": [1.5]}}\r\n"
		"{\"input_ids\": [0, 7], \"label\": 0}");	/* no final newline */
	int rc = load(&ds, path, &o);

	CHECK(rc == 0, "rc %d: %s", rc, errbuf);
	CHECK(ds.n == 3, "n = %d", ds.n);
	CHECK(ds.total == 3 && ds.dropped == 0 && ds.skipped == 0, "counts %ld %ld %ld",
	      ds.total, ds.dropped, ds.skipped);
	if (ds.n == 3) {
		CHECK(ds.rec[0].len == 3 && ds.rec[0].ids[0] == 1 && ds.rec[0].ids[2] == 3,
		      "record 0");
		CHECK(ds.rec[0].label == 0.25f && ds.rec[0].line == 1, "record 0 label/line");
		CHECK(ds.rec[1].len == 1 && ds.rec[1].ids[0] == 511 && ds.rec[1].label == 1.0f,
		      "record 1");
		CHECK(ds.rec[1].line == 4, "record 1 line %ld", ds.rec[1].line);
		CHECK(ds.rec[2].len == 2 && ds.rec[2].ids[0] == 0 && ds.rec[2].ids[1] == 7 &&
		      ds.rec[2].label == 0.0f && ds.rec[2].line == 5, "record 2");
		/* one pool, records in file order inside it */
		CHECK(ds.pool_len == 6 && ds.rec[0].ids == ds.pool && ds.rec[1].ids == ds.pool + 3 &&
		      ds.rec[2].ids == ds.pool + 4, "pool layout");
		CHECK(sl_data_max_len(&ds) == 3, "max len");
	}
	CHECK(errbuf[0] == 0, "unexpected output: %s", errbuf);
	sl_data_free(&ds);

	/* a byte-order mark before the first record */
	path = write_file("bom.jsonl", "\xef\xbb\xbf{\"input_ids\": [4], \"label\": 0.5}\n");
	rc = load(&ds, path, &o);
	CHECK(rc == 0 && ds.n == 1 && ds.rec[0].ids[0] == 4, "BOM: rc %d %s", rc, errbuf);
	sl_data_free(&ds);

	/* scoring: no label -> NaN; other field names */
	o.need_label = false;
	o.label_field = "y";
	path = write_file("nolabel.jsonl",
		"{\"input_ids\": [5, 6]}\n{\"input_ids\": [5], \"y\": 0.5, \"label\": 9}\n"
		"{\"input_ids\": [8], \"y\": null}\n");
	rc = load(&ds, path, &o);
	CHECK(rc == 0 && ds.n == 3, "rc %d n %d: %s", rc, ds.n, errbuf);
	if (ds.n == 3)
		CHECK(isnan(ds.rec[0].label) && ds.rec[1].label == 0.5f && isnan(ds.rec[2].label),
		      "labels %g %g %g", ds.rec[0].label, ds.rec[1].label, ds.rec[2].label);
	sl_data_free(&ds);
}

static void test_load_errors(void)
{
	struct sl_data_opts o = opts(), nl = opts();
	const char *good = "{\"input_ids\": [1], \"label\": 0.5}\n";
	char text[1024];

	nl.need_label = false;
#define ERR(name, line2, what) do {						\
		snprintf(text, sizeof(text), "%s\n%s\n%s", good, line2, good);	\
		expect_error(name, text, 3, what, o);				\
	} while (0)
	/* the bad record is on line 3: the good one, a blank line, then it.  Columns count from
	 * 1: the second ',' of "[1, 2,, 3]" is column 21 */
	ERR("json.jsonl", "{\"input_ids\": [1, 2,, 3], \"label\": 0.5}",
	    "invalid JSON at column 21");
	ERR("trunc.jsonl", "{\"input_ids\": [1, 2", "invalid JSON at column");
	ERR("array.jsonl", "[1, 2, 3]", "a record must be a JSON object, not an array");
	ERR("scalar.jsonl", "42", "a record must be a JSON object, not an integer");
	ERR("ids_str.jsonl", "{\"input_ids\": \"1 2\", \"label\": 0.5}",
	    "\"input_ids\" is a string; give an array of token ids");
	ERR("ids_real.jsonl", "{\"input_ids\": [1, 2.5], \"label\": 0.5}",
	    "\"input_ids\"[1] is a number, not an integer token id");
	ERR("ids_neg.jsonl", "{\"input_ids\": [3, -1], \"label\": 0.5}",
	    "\"input_ids\"[1] = -1 is negative");
	ERR("ids_vocab.jsonl", "{\"input_ids\": [3, 4, 512], \"label\": 0.5}",
	    "\"input_ids\"[2] = 512 is outside the vocabulary [0, 512)");
	ERR("ids_empty.jsonl", "{\"input_ids\": [], \"label\": 0.5}",
	    "\"input_ids\" is empty");
	ERR("label_range.jsonl", "{\"input_ids\": [1], \"label\": 1.7}",
	    "label 1.7 in field 'label' is outside [0,1]");
	ERR("label_neg.jsonl", "{\"input_ids\": [1], \"label\": -0.5}",
	    "label -0.5 in field 'label' is outside [0,1]");
	ERR("label_bool.jsonl", "{\"input_ids\": [1], \"label\": true}",
	    "label in field 'label' is a boolean (true)");
	ERR("label_str.jsonl", "{\"input_ids\": [1], \"label\": \"0.5\"}",
	    "label in field 'label' is a string");
	ERR("label_none.jsonl", "{\"input_ids\": [1]}", "no label in field 'label'");
	ERR("text.jsonl", "{\"text\": \"hello\", \"label\": 0.5}",
	    "record has text in field 'text' but no tokenizer is available yet; "
	    "give pre-tokenized \"input_ids\"");
	ERR("text_type.jsonl", "{\"text\": 5, \"label\": 0.5}",
	    "field 'text' is an integer, not a string");
	ERR("neither.jsonl", "{\"label\": 0.5}",
	    "record has neither \"input_ids\" nor text in field 'text'");
	ERR("dup.jsonl", "{\"input_ids\": [1], \"label\": 0.5, \"label\": 0.7}",
	    "invalid JSON at column");
#undef ERR
	/* a bad label is an error even where labels are optional */
	expect_error("nl_bool.jsonl", "{\"input_ids\": [1], \"label\": false}\n", 1,
		     "is a boolean", nl);

	/* whole-file errors name the file */
	{
		struct sl_dataset ds;
		char missing[600];
		int rc;

		snprintf(missing, sizeof(missing), "%s/no-such.jsonl", tmpdir);
		rc = load(&ds, missing, &o);
		CHECK(rc < 0 && strstr(errbuf, missing) && strstr(errbuf, "cannot open"),
		      "missing file: %d %s", rc, errbuf);
		rc = load(&ds, write_file("empty.jsonl", ""), &o);
		CHECK(rc < 0 && strstr(errbuf, "empty.jsonl: no records"), "empty: %s", errbuf);
		rc = load(&ds, write_file("blank.jsonl", "\n  \n\n"), &o);
		CHECK(rc < 0 && strstr(errbuf, "blank.jsonl: no records"), "blank: %s", errbuf);
		o.max_state = 1;
		rc = load(&ds, write_file("long.jsonl", "{\"input_ids\": [1, 2], \"label\": 0}\n"),
			  &o);
		CHECK(rc < 0 && strstr(errbuf, "max_state 1") && ds.dropped == 1,
		      "all dropped: %s", errbuf);
		o.max_state = 0;
	}
}

static void test_skip(void)
{
	struct sl_data_opts o = opts();
	struct sl_dataset ds;
	char text[4096] = "", w[700];
	const char *path;
	int i, rc;

	/* 7 bad lines (2, 4, ..., 14) among 8 good ones */
	for (i = 0; i < 15; i++)
		strcat(text, i % 2 ? "{\"input_ids\": [1, 2], \"label\": 2}\n"
				   : "{\"input_ids\": [3], \"label\": 0.5}\n");
	path = write_file("skip.jsonl", text);
	o.skip_errors = true;
	rc = load(&ds, path, &o);
	CHECK(rc == 0, "rc %d: %s", rc, errbuf);
	CHECK(ds.n == 8 && ds.skipped == 7 && ds.total == 8, "n %d skipped %ld total %ld", ds.n,
	      ds.skipped, ds.total);
	/* the first five are shown as warnings with their lines, then one line for the rest */
	snprintf(w, sizeof(w), "%s:10: label 2 in field 'label' is outside [0,1]", path);
	CHECK(strstr(errbuf, w) != NULL, "no '%s' in %s", w, errbuf);
	snprintf(w, sizeof(w), "%s:12:", path);
	CHECK(strstr(errbuf, w) == NULL, "line 12 shown: %s", errbuf);
	CHECK(count_substr(errbuf, "warning: ") == 6, "%d warnings: %s",
	      count_substr(errbuf, "warning: "), errbuf);
	CHECK(strstr(errbuf, "error") == NULL, "errors printed: %s", errbuf);
	if (ds.n == 8)
		CHECK(ds.rec[7].line == 15 && ds.rec[7].ids[0] == 3, "last record line %ld",
		      ds.rec[7].line);
	sl_data_free(&ds);

	/* the same file fails at its first bad line without skip */
	o.skip_errors = false;
	rc = load(&ds, path, &o);
	snprintf(w, sizeof(w), "%s:2: label 2", path);
	CHECK(rc < 0 && strstr(errbuf, w), "fail mode: %s", errbuf);
}

static void test_max_state(void)
{
	struct sl_data_opts o = opts();
	struct sl_dataset ds;
	int rc;

	o.max_state = 3;
	rc = load(&ds, write_file("lens.jsonl",
		"{\"input_ids\": [1], \"label\": 0}\n"
		"{\"input_ids\": [1, 2, 3, 4, 5], \"label\": 0}\n"
		"{\"input_ids\": [1, 2, 3], \"label\": 0}\n"
		"{\"input_ids\": [1, 2, 3, 4], \"label\": 0}\n"
		"{\"input_ids\": [9, 8], \"label\": 0}\n"), &o);
	CHECK(rc == 0 && ds.n == 3 && ds.dropped == 2 && ds.total == 5,
	      "rc %d n %d dropped %ld total %ld", rc, ds.n, ds.dropped, ds.total);
	if (ds.n == 3)
		CHECK(ds.rec[0].line == 1 && ds.rec[1].line == 3 && ds.rec[2].line == 5 &&
		      ds.rec[2].ids[0] == 9 && ds.pool_len == 6, "kept records");
	sl_data_free(&ds);
}

/* a stand-in tokenizer: one id per byte */
static int byte_tokenize(void *ctx, const char *text, size_t len, int32_t **ids, size_t *cap)
{
	size_t i;

	(*(int *)ctx)++;
	if (len > *cap) {
		int32_t *p = realloc(*ids, len * sizeof(*p));

		if (!p)
			return -1;
		*ids = p;
		*cap = len;
	}
	for (i = 0; i < len; i++)
		(*ids)[i] = (unsigned char)text[i];
	return (int)len;
}

static void test_tokenizer_hook(void)
{
	struct sl_data_opts o = opts();
	struct sl_dataset ds;
	int calls = 0, rc;

	o.tokenize = byte_tokenize;
	o.tokenize_ctx = &calls;
	o.text_field = "body";
	rc = load(&ds, write_file("text.jsonl",
		"{\"body\": \"AB\", \"label\": 0.1}\n"
		"{\"body\": \"x\", \"input_ids\": [7, 7, 7], \"label\": 0.2}\n"), &o);
	CHECK(rc == 0 && ds.n == 2, "rc %d: %s", rc, errbuf);
	/* pre-tokenized ids win over text */
	CHECK(calls == 1, "tokenizer called %d times", calls);
	if (ds.n == 2)
		CHECK(ds.rec[0].len == 2 && ds.rec[0].ids[0] == 'A' && ds.rec[0].ids[1] == 'B' &&
		      ds.rec[1].len == 3 && ds.rec[1].ids[0] == 7, "ids");
	sl_data_free(&ds);
}

/* ---- sampler ---- */

/* A dataset built in memory: record i has length lens[i] and ids i, i, ... */
static void make_ds(struct sl_dataset *ds, int n, const int *lens)
{
	size_t total = 0, off = 0;
	int i, t;

	memset(ds, 0, sizeof(*ds));
	for (i = 0; i < n; i++)
		total += lens[i];
	ds->n = n;
	ds->total = n;
	ds->rec = calloc(n, sizeof(*ds->rec));
	ds->pool = malloc(total * sizeof(*ds->pool));
	ds->pool_len = total;
	for (i = 0; i < n; i++) {
		for (t = 0; t < lens[i]; t++)
			ds->pool[off + t] = i;
		ds->rec[i].ids = ds->pool + off;
		ds->rec[i].len = lens[i];
		ds->rec[i].label = (float)i / n;
		ds->rec[i].line = i + 1;
		off += lens[i];
	}
}

static uint64_t lcg(uint64_t *x)
{
	*x = *x * 6364136223846793005ull + 1442695040888963407ull;
	return *x >> 33;
}

static int cmp_int(const void *a, const void *b)
{
	return *(const int *)a - *(const int *)b;
}

/* All records of @step gathered from the micro-batches, in dealing order; returns R. */
static int gather(struct sl_sampler *s, long step, int *out)
{
	int a, r, k = 0, got;

	for (a = 0; a < s->accum; a++)
		for (r = 0; r < s->dp; r++) {
			got = sl_sampler_microbatch(s, step, a, r, out + k);
			CHECK(got == s->batch, "micro-batch (%ld,%d,%d) gave %d", step, a, r, got);
			k += s->batch;
		}
	return k;
}

static void test_epochs(const struct sl_dataset *ds, bool shuffle, bool sort)
{
	struct sl_sampler s;
	int idx[64], *count = calloc(ds->n, sizeof(int));
	long st;
	int i, e, R;

	CHECK(sl_sampler_init(&s, ds, 2, 4, 2, shuffle, sort, 7) == 0, "init");
	R = sl_sampler_records_per_step(&s);
	CHECK(R == 16 && ds->n % R == 0, "R %d", R);
	CHECK(sl_sampler_steps_per_epoch(&s) == ds->n / R, "steps per epoch");
	for (e = 0; e < 3; e++) {
		memset(count, 0, ds->n * sizeof(int));
		for (st = e * (ds->n / R); st < (e + 1) * (ds->n / R); st++) {
			gather(&s, st, idx);
			for (i = 0; i < R; i++)
				count[idx[i]]++;
			CHECK(sl_sampler_epoch_of(&s, st) == e, "epoch of step %ld", st);
		}
		for (i = 0; i < ds->n; i++)
			CHECK(count[i] == 1, "shuffle %d sort %d epoch %d: record %d seen %d times",
			      shuffle, sort, e, i, count[i]);
	}
	sl_sampler_free(&s);
	free(count);
}

/* Same R split three ways: the same records per step (as sorted lists). */
static void test_world_size(const struct sl_dataset *ds, bool shuffle, bool sort)
{
	static const int accum[3] = { 4, 2, 1 }, dp[3] = { 1, 2, 4 };
	struct sl_sampler s[3];
	int idx[3][16], j, i;
	long st;

	for (j = 0; j < 3; j++)
		CHECK(sl_sampler_init(&s[j], ds, 2, accum[j], dp[j], shuffle, sort, 11) == 0,
		      "init");
	for (st = 0; st < 40; st++) {
		for (j = 0; j < 3; j++) {
			CHECK(gather(&s[j], st, idx[j]) == 8, "R");
			qsort(idx[j], 8, sizeof(int), cmp_int);
		}
		for (i = 0; i < 8; i++)
			CHECK(idx[0][i] == idx[1][i] && idx[0][i] == idx[2][i],
			      "shuffle %d sort %d step %ld: records differ by world size", shuffle,
			      sort, st);
	}
	/* and the micro-batch of (a, r) is entry k = a*dp + r of the step's sorted list */
	for (j = 0; j < 3; j++) {
		int all[8], mb[2];

		sl_sampler_step(&s[j], 3, all);
		sl_sampler_microbatch(&s[j], 3, accum[j] - 1, dp[j] - 1, mb);
		CHECK(mb[0] == all[6] && mb[1] == all[7], "last micro-batch is the step's tail");
	}
	for (j = 0; j < 3; j++)
		sl_sampler_free(&s[j]);
}

static void test_seeds(const struct sl_dataset *ds)
{
	struct sl_sampler a, b, c;
	int x[16], y[16], z[16], i, differ = 0;
	long st;

	sl_sampler_init(&a, ds, 2, 2, 2, true, true, 5);
	sl_sampler_init(&b, ds, 2, 2, 2, true, true, 5);
	sl_sampler_init(&c, ds, 2, 2, 2, true, true, 6);
	/* b walks the steps backwards, so its caches see a different history */
	for (st = 0; st < 30; st++) {
		gather(&a, st, x);
		gather(&b, 29 - st, y);
		gather(&b, st, y);
		gather(&c, st, z);
		for (i = 0; i < 8; i++) {
			CHECK(x[i] == y[i], "same seed, step %ld differs", st);
			differ += x[i] != z[i];
		}
	}
	CHECK(differ > 30, "seeds 5 and 6 give nearly the same order (%d differ)", differ);
	sl_sampler_free(&a);
	sl_sampler_free(&b);
	sl_sampler_free(&c);
}

static void test_file_order(void)
{
	struct sl_dataset ds;
	struct sl_sampler s;
	int lens[10], idx[8], i;
	long st, q;

	/* equal lengths: sorting by (length, index) inside a step is index order */
	for (i = 0; i < 10; i++)
		lens[i] = 4;
	make_ds(&ds, 10, lens);
	sl_sampler_init(&s, &ds, 1, 2, 2, false, false, 1);
	CHECK(sl_sampler_steps_per_epoch(&s) == 3, "ceil(10/4)");
	for (st = 0; st < 6; st++) {
		int want[4];

		gather(&s, st, idx);
		for (i = 0; i < 4; i++) {
			q = st * 4 + i;
			want[i] = (int)(q % 10);
		}
		/* step 2 is records 8, 9 of epoch 0 then 0, 1 of epoch 1: as a sorted list */
		qsort(want, 4, sizeof(int), cmp_int);
		for (i = 0; i < 4; i++)
			CHECK(idx[i] == want[i], "step %ld entry %d: %d, file order says %d", st, i,
			      idx[i], want[i]);
	}
	sl_sampler_free(&s);
	sl_data_free(&ds);
}

/* a dataset smaller than a step wraps: every step is full, records repeat evenly */
static void test_wrap(void)
{
	struct sl_dataset ds;
	struct sl_sampler s;
	int lens[3] = { 5, 1, 3 }, idx[8], count[3] = { 0 }, i, k;
	int sh;
	long st;

	make_ds(&ds, 3, lens);
	for (sh = 0; sh < 4; sh++) {
		memset(count, 0, sizeof(count));
		CHECK(sl_sampler_init(&s, &ds, 2, 2, 2, sh & 1, sh & 2, 3) == 0, "init");
		CHECK(sl_sampler_steps_per_epoch(&s) == 1, "steps per epoch");
		/* 3 steps = 24 stream records = 8 epochs */
		for (st = 0; st < 3; st++) {
			CHECK(gather(&s, st, idx) == 8, "R");
			for (i = 0; i < 8; i++)
				count[idx[i]]++;
			/* dealt in length order */
			for (i = 1; i < 8; i++)
				CHECK(lens[idx[i - 1]] <= lens[idx[i]], "step not length-sorted");
		}
		for (k = 0; k < 3; k++)
			CHECK(count[k] == 8, "mode %d: record %d seen %d times", sh, k, count[k]);
		sl_sampler_free(&s);
	}
	sl_data_free(&ds);

	/* n = 10, R = 4: 5 steps are exactly 2 epochs, in every mode */
	{
		int l10[10];

		for (i = 0; i < 10; i++)
			l10[i] = 1 + (i * 7) % 10;
		make_ds(&ds, 10, l10);
		for (sh = 0; sh < 4; sh++) {
			int c[10] = { 0 };

			sl_sampler_init(&s, &ds, 1, 2, 2, sh & 1, sh & 2, 9);
			for (st = 0; st < 5; st++) {
				gather(&s, st, idx);
				for (i = 0; i < 4; i++)
					c[idx[i]]++;
			}
			for (k = 0; k < 10; k++)
				CHECK(c[k] == 2, "mode %d: record %d seen %d times in 2 epochs", sh,
				      k, c[k]);
			sl_sampler_free(&s);
		}
		sl_data_free(&ds);
	}
}

/*
 * The exact placement data.h promises, unshuffled: n = 40, R = 16.  Epoch 0 is one bucket sorted
 * by length: steps 0, 1 are its 16 + 16 shortest, its 8 longest start step 2.  Epoch 1 begins at
 * stream record 40: its first (16 - 40 % 16) % 16 = 8 records (0..7, the unshuffled permutation)
 * complete step 2, and the rest (records 8..39) form its own bucket: step 3 is their 16
 * shortest, step 4 the 16 longest.
 */
static void test_alignment(void)
{
	struct sl_dataset ds;
	struct sl_sampler s;
	int lens[40], idx[16], want[16], i, k;

	/* distinct lengths in a scrambled order: 1 + (i * 17) % 40 is a bijection onto 1..40 */
	for (i = 0; i < 40; i++)
		lens[i] = 1 + (i * 17) % 40;
	make_ds(&ds, 40, lens);
	sl_sampler_init(&s, &ds, 4, 2, 2, false, true, 0);

	/* records sorted by length, all 40 / records 8..39 */
	{
		int all[40], rest[32];

		for (i = 0; i < 40; i++)
			all[(lens[i] - 1)] = i;
		for (i = 0, k = 0; i < 40; i++)
			if (all[i] >= 8)
				rest[k++] = all[i];

		gather(&s, 0, idx);
		CHECK(!memcmp(idx, all, sizeof(idx)), "step 0 is the 16 shortest");
		gather(&s, 1, idx);
		CHECK(!memcmp(idx, all + 16, sizeof(idx)), "step 1 the next 16");
		gather(&s, 2, idx);
		for (i = 0; i < 8; i++)
			want[i] = i;
		memcpy(want + 8, all + 32, 8 * sizeof(int));
		qsort(idx, 16, sizeof(int), cmp_int);
		qsort(want, 16, sizeof(int), cmp_int);
		CHECK(!memcmp(idx, want, sizeof(idx)), "step 2: 8 longest + epoch 1's head");
		gather(&s, 3, idx);
		CHECK(!memcmp(idx, rest, sizeof(idx)), "step 3: epoch 1's 16 shortest after its head");
		gather(&s, 4, idx);
		CHECK(!memcmp(idx, rest + 16, sizeof(idx)), "step 4: epoch 1's 16 longest");
	}
	sl_sampler_free(&s);
	sl_data_free(&ds);
}

/* padding of one epoch's micro-batches, as a fraction of padded tokens */
static double pad_fraction(struct sl_sampler *s, long first, long steps, double *worst_ratio)
{
	const struct sl_dataset *ds = s->ds;
	long pad = 0, all = 0, st;
	int idx[64], k, i, R = sl_sampler_records_per_step(s);

	*worst_ratio = 1;
	for (st = first; st < first + steps; st++) {
		int smin = 1 << 30, smax = 0;

		gather(s, st, idx);
		for (k = 0; k < R; k += s->batch) {
			int mn = 1 << 30, mx = 0;

			for (i = k; i < k + s->batch; i++) {
				int l = ds->rec[idx[i]].len;

				mn = l < mn ? l : mn;
				mx = l > mx ? l : mx;
			}
			for (i = k; i < k + s->batch; i++)
				pad += mx - ds->rec[idx[i]].len;
			all += (long)mx * s->batch;
			smin = mn < smin ? mn : smin;
			smax = mx > smax ? mx : smax;
			/* micro-batches never spread wider than their step */
			CHECK((double)mx / mn <= (double)smax / smin, "micro-batch wider than step");
			if ((double)mx / mn > *worst_ratio)
				*worst_ratio = (double)mx / mn;
		}
	}
	return (double)pad / all;
}

static void test_length_sort(void)
{
	struct sl_dataset ds;
	struct sl_sampler on, off;
	int n = 1000, i, *lens = malloc(n * sizeof(int));
	uint64_t x = 42;
	double pon, poff, won, woff;

	/* lengths spread over three orders of magnitude; n % R != 0 so epochs straddle */
	for (i = 0; i < n; i++)
		lens[i] = 1 + (int)(lcg(&x) % 1000);
	make_ds(&ds, n, lens);
	sl_sampler_init(&on, &ds, 4, 2, 2, true, true, 1);
	sl_sampler_init(&off, &ds, 4, 2, 2, true, false, 1);
	pon = pad_fraction(&on, 0, 3 * 63, &won);
	poff = pad_fraction(&off, 0, 3 * 63, &woff);
	/* without length_sort only the in-step sort helps (16 random records, dealt sorted) */
	CHECK(pon < 0.05 && pon < poff / 4, "padding: length_sort %.3f, without %.3f", pon, poff);
	CHECK(won < woff, "widest micro-batch: length_sort %.1f, without %.1f", won, woff);
	/* and still a permutation per epoch over the whole stream (1000 records = 62.5 steps) */
	{
		int *c = calloc(n, sizeof(int)), idx[16];
		long st;

		for (st = 0; st < 125; st++) {	/* 2000 records: exactly 2 epochs */
			gather(&on, st, idx);
			for (i = 0; i < 16; i++)
				c[idx[i]]++;
		}
		for (i = 0; i < n; i++)
			if (c[i] != 2)
				break;
		CHECK(i == n, "record %d seen %d times in 2 epochs", i, i < n ? c[i] : 0);
		free(c);
	}
	sl_sampler_free(&on);
	sl_sampler_free(&off);
	sl_data_free(&ds);
	free(lens);
}

static void test_sampler(void)
{
	struct sl_dataset ds;
	struct sl_sampler s;
	int lens[64], idx[4], i, sh;

	for (i = 0; i < 64; i++)
		lens[i] = 1 + (i * 37) % 50;
	make_ds(&ds, 64, lens);
	for (sh = 0; sh < 4; sh++)
		test_epochs(&ds, sh & 1, sh & 2);
	sl_data_free(&ds);

	make_ds(&ds, 60, lens);	/* 60 % 8 != 0: steps straddle epochs */
	for (sh = 0; sh < 4; sh++)
		test_world_size(&ds, sh & 1, sh & 2);
	test_seeds(&ds);

	/* out of range requests are refused, not read past the step */
	sl_sampler_init(&s, &ds, 2, 2, 2, true, true, 0);
	quiet_begin();
	CHECK(sl_sampler_microbatch(&s, 0, 2, 0, idx) < 0, "accum index out of range");
	CHECK(sl_sampler_microbatch(&s, 0, 0, 2, idx) < 0, "rank out of range");
	CHECK(sl_sampler_microbatch(&s, -1, 0, 0, idx) < 0, "negative step");
	sl_sampler_free(&s);
	CHECK(sl_sampler_init(&s, &ds, 0, 1, 1, true, true, 0) < 0, "batch 0 refused");
	quiet_end();
	sl_data_free(&ds);

	test_file_order();
	test_wrap();
	test_alignment();
	test_length_sort();
}

static void test_host_batch(void)
{
	struct sl_dataset ds;
	struct sl_host_batch hb;
	int lens[4] = { 2, 5, 3, 7 }, idx[3] = { 0, 1, 2 }, b, t;

	make_ds(&ds, 4, lens);
	CHECK(sl_host_batch_alloc(&hb, 3, 6) == 0, "alloc");
	CHECK(sl_host_batch_fill(&hb, &ds, idx, 3, -1) == 0, "fill");
	CHECK(hb.B == 3 && hb.L == 5, "B %d L %d", hb.B, hb.L);
	for (b = 0; b < 3; b++)
		for (t = 0; t < 5; t++)
			CHECK(hb.ids[b * 5 + t] == (t < lens[b] ? b : -1), "ids[%d][%d] = %d", b, t,
			      hb.ids[b * 5 + t]);
	/* last = b*L + len - 1 = 0*5+1, 1*5+4, 2*5+2 */
	CHECK(hb.lens[0] == 2 && hb.lens[1] == 5 && hb.lens[2] == 3, "lens");
	CHECK(hb.last[0] == 1 && hb.last[1] == 9 && hb.last[2] == 12, "last %d %d %d",
	      hb.last[0], hb.last[1], hb.last[2]);
	CHECK(hb.tokens == 10 && hb.padded_tokens == 5, "tokens %ld padded %ld", hb.tokens,
	      hb.padded_tokens);
	CHECK(hb.labels[1] == 0.25f && hb.labels[2] == 0.5f, "labels");

	/* a smaller batch re-uses the buffers with its own L */
	idx[0] = 2;
	CHECK(sl_host_batch_fill(&hb, &ds, idx, 1, 0) == 0 && hb.B == 1 && hb.L == 3 &&
	      hb.tokens == 3 && hb.padded_tokens == 0 && hb.last[0] == 2, "single record");

	/* beyond the capacity: refused (record 3 has 7 tokens, room for 6) */
	idx[0] = 3;
	quiet_begin();
	CHECK(sl_host_batch_fill(&hb, &ds, idx, 1, 0) < 0, "too long accepted");
	CHECK(sl_host_batch_fill(&hb, &ds, (int[]){ 0, 0, 0, 0 }, 4, 0) < 0, "too many accepted");
	quiet_end();
	sl_host_batch_free(&hb);
	sl_data_free(&ds);
}

/* @n records of 1..300 ids (every 4th longer than 250) to @path; returns the tokens written */
static long write_large(const char *path, int n)
{
	uint64_t x = 1;
	long want = 0;
	FILE *f = fopen(path, "w");
	int i, t, len;

	for (i = 0; i < n; i++) {
		len = 1 + (int)(lcg(&x) % 300);
		want += len;
		fprintf(f, "{\"input_ids\": [");
		for (t = 0; t < len; t++)
			fprintf(f, "%s%d", t ? ", " : "", (i + t) % 512);
		fprintf(f, "], \"label\": %g}\n", (i % 101) / 100.0);
	}
	fclose(f);
	return want;
}

static double cpu_seconds(void)
{
	return (double)clock() / CLOCKS_PER_SEC;
}

/*
 * ~54k records (the first user's data set) load, and in linear time: 4x the records may take
 * about 4x as long, never the 16x of a quadratic loader (a ratio, so it holds under valgrind or
 * sanitizers too).
 */
static void test_large(void)
{
	struct sl_data_opts o = opts();
	struct sl_dataset ds;
	char path[600];
	long sum = 0, want;
	double t_small, t_big;
	int i, rc;

	snprintf(path, sizeof(path), "%s/large.jsonl", tmpdir);
	o.max_state = 250;

	write_large(path, 13500);
	t_small = cpu_seconds();
	rc = load(&ds, path, &o);
	t_small = cpu_seconds() - t_small;
	CHECK(rc == 0 && ds.n + ds.dropped == 13500, "13.5k: rc %d", rc);
	sl_data_free(&ds);

	want = write_large(path, 54000);
	t_big = cpu_seconds();
	rc = load(&ds, path, &o);
	t_big = cpu_seconds() - t_big;
	CHECK(rc == 0 && ds.n + ds.dropped == 54000 && ds.dropped > 8000, "rc %d n %d dropped %ld",
	      rc, ds.n, ds.dropped);
	for (i = 0; i < ds.n; i++)
		sum += ds.rec[i].len;
	CHECK((size_t)sum == ds.pool_len, "pool %zu, records %ld", ds.pool_len, sum);
	CHECK(ds.n > 0 && ds.rec[ds.n - 1].ids[0] == (ds.rec[ds.n - 1].line - 1) % 512,
	      "last record's ids");
	CHECK(t_big < 8 * t_small + 0.5, "13.5k records in %.2f s, 54k in %.2f s: not linear",
	      t_small, t_big);
	printf("54000 records (%ld tokens) loaded in %.2f s (13500 in %.2f s)\n", want, t_big,
	       t_small);
	sl_data_free(&ds);
	unlink(path);
}

int main(void)
{
	if (tmpdir_make("tmp-data-XXXXXX"))
		return 2;
	test_load_ok();
	test_load_errors();
	test_skip();
	test_max_state();
	test_tokenizer_hook();
	test_sampler();
	test_host_batch();
	test_large();

	test_remove_dir(tmpdir);
	return test_exit("test_data");
}
