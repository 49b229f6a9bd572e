/*
 * test_config: the config module against hand-written YAML.
 *
 * Every expected value is read off the YAML written here or DESIGN.md §3's defaults; every
 * expected error names the line and column counted by hand in the snippet.  Files go to a fresh
 * directory under /tmp, which is also the working directory, so messages name short paths.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* not "config.h": the build's -I$(top_builddir) would find autoconf's header first */
#include "config.h"
#include "testutil.h"

/* testutil.h's CHECK(cond) without a message expands to fprintf(stderr, "") */
#pragma GCC diagnostic ignored "-Wformat-zero-length"

static char tmpdir[64];
static char err[16384];		/* the last load's error output */

static void write_file(const char *name, const char *text)
{
	FILE *f = fopen(name, "w");

	if (!f) {
		perror(name);
		exit(2);
	}
	fputs(text, f);
	fclose(f);
}

/* sl_config_load with errors captured in err[] */
static int load(struct sl_config *c, const char *path, const char **set, int nset, bool req)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	int rc;

	if (!f)
		exit(2);
	rc = sl_config_load_err(c, path, (char *const *)set, nset, req, f);
	fclose(f);
	snprintf(err, sizeof(err), "%s", buf ? buf : "");
	free(buf);
	return rc;
}

/* write @text to @name, load it, expect failure with the message @want (a substring) */
#define EXPECT_FILE_ERR(name, text, req, ...)                                           \
	do {                                                                          \
		struct sl_config _c;                                                  \
		char _w[1024];                                                        \
		int _rc;                                                              \
		write_file(name, text);                                               \
		_rc = load(&_c, name, NULL, 0, req);                                  \
		snprintf(_w, sizeof(_w), __VA_ARGS__);                                \
		CHECK(_rc < 0, "%s loaded without error", name);                      \
		CHECK(strstr(err, _w), "expected\n  %s\nin\n  %s", _w, err);           \
	} while (0)

#define EXPECT_SET_ERR(path, setopt, ...)                                               \
	do {                                                                          \
		struct sl_config _c;                                                  \
		const char *_s[] = { setopt };                                        \
		char _w[1024];                                                        \
		int _rc = load(&_c, path, _s, 1, false);                              \
		snprintf(_w, sizeof(_w), __VA_ARGS__);                                \
		CHECK(_rc < 0, "--set %s accepted", setopt);                          \
		CHECK(strstr(err, _w), "expected\n  %s\nin\n  %s", _w, err);           \
	} while (0)

static void test_defaults(void)
{
	struct sl_config c;

	sl_config_defaults(&c);
	CHECK(!strcmp(c.model.path, "") && !strcmp(c.model.revision, ""));
	CHECK(c.task == SL_TASK_CLASSIFY);
	CHECK(!strcmp(c.data.train, "") && !strcmp(c.data.valid, ""));
	CHECK(!strcmp(c.data.text_field, "text") && !strcmp(c.data.label_field, "label"));
	CHECK(c.data.max_state == 2048);
	CHECK(c.data.length_sort && c.data.shuffle && !c.data.pack && !c.data.keep_reasoning);
	CHECK(c.data.seed == 0);
	CHECK(c.data.on_error == SL_ON_ERROR_FAIL);
	CHECK(c.train.batch == 1 && c.train.accum == 2 && c.train.steps == 100);
	CHECK(c.train.epochs == 0 && !c.train.activation_checkpointing);
	CHECK(c.train.eval_every == 50 && c.train.max_bad_steps == 3 && !c.train.deterministic);
	CHECK(c.optim.lr == 1e-5 && c.optim.schedule == SL_SCHED_COSINE && c.optim.warmup == 10);
	CHECK(c.optim.min_lr == 0 && c.optim.betas[0] == 0.9 && c.optim.betas[1] == 0.95);
	CHECK(c.optim.eps == 1e-8 && c.optim.weight_decay == 0.1 && c.optim.clip == 1.0);
	CHECK(c.optim.head_lr_mult == 1.0);
	CHECK(c.backend == SL_BACKEND_CUDA);
	CHECK(c.precision.compute == SL_PREC_AUTO && c.precision.master == SL_PREC_FP32);
	CHECK(c.precision.reduce == SL_PREC_FP32);
	CHECK(c.parallel.shard_group == SL_SHARD_WORLD && c.parallel.node_size == 0);
	CHECK(c.parallel.reshard_after_forward && c.parallel.prefetch == 1);
	CHECK(c.parallel.context == 1 && c.parallel.expert == 1);
	CHECK(c.parallel.capacity_factor == 0 && c.parallel.offload == SL_OFFLOAD_NONE);
	CHECK(c.parallel.timeout_s == 600);
	CHECK(c.checkpoint.every == 50 && c.checkpoint.keep == 2 && c.checkpoint.optimizer);
	CHECK(!strcmp(c.checkpoint.dir, "checkpoints"));
	CHECK(c.export_.dtype == SL_PREC_BF16);
	CHECK(c.run.log_every == 10);
	CHECK(c.gpu_log.every_s == 15 && !strcmp(c.gpu_log.file, "logs/gpu-%j-%h.csv"));

	/* an empty file and no file give the same; the run dir takes the file's name */
	write_file("empty.yaml", "# nothing\n");
	CHECK(load(&c, "empty.yaml", NULL, 0, false) == 0, "%s", err);
	CHECK(!strcmp(c.run.dir, "runs/empty"), "run.dir %s", c.run.dir);
	CHECK(!strcmp(c.name, "empty") && !strcmp(c.source, "empty.yaml"));
	CHECK(c.train.batch == 1 && c.optim.lr == 1e-5);
	write_file("other.yml", "train: {batch: 2}\n");
	CHECK(load(&c, "other.yml", NULL, 0, false) == 0, "%s", err);
	CHECK(!strcmp(c.name, "other") && !strcmp(c.run.dir, "runs/other"));

	CHECK(!strcmp(sl_task_name(SL_TASK_SFT), "sft"));
	CHECK(!strcmp(sl_task_name(SL_TASK_CLASSIFY), "classify"));
	CHECK(!strcmp(sl_precision_name(SL_PREC_BF16), "bf16"));
	CHECK(!strcmp(sl_precision_name(SL_PREC_AUTO), "auto"));
	CHECK(!strcmp(sl_backend_name(SL_BACKEND_CPU), "cpu"));
	CHECK(!strcmp(sl_schedule_name(SL_SCHED_LINEAR), "linear"));
	CHECK(!strcmp(sl_offload_name(SL_OFFLOAD_PARAMS), "params"));
}

static const char full_yaml[] =
	"# every key, none at its default\n"
	"model: {path: /m/qwen3-27b, revision: abc123}\n"
	"task: sft\n"
	"data:\n"
	"  train: d/train.jsonl\n"
	"  valid: d/valid.jsonl\n"
	"  text_field: body\n"
	"  label_field: p\n"
	"  max_state: 4096\n"
	"  length_sort: no\n"
	"  shuffle: off\n"
	"  seed: -7\n"
	"  pack: yes\n"
	"  on_error: skip\n"
	"  keep_reasoning: on\n"
	"train: {batch: 3, accum: 4, steps: 0, epochs: 2, activation_checkpointing: true,\n"
	"        eval_every: 0, max_bad_steps: 5, deterministic: True}\n"
	"optim: {lr: 2.5e-4, schedule: linear, warmup: 0, min_lr: 1e-6, betas: [0.8, 0.99],\n"
	"        eps: 1e-6, weight_decay: 0, clip: 0, head_lr_mult: 10}\n"
	"backend: cpu\n"
	"precision: {compute: bf16, master: fp32, reduce: bf16}\n"
	"parallel: {shard_group: node, node_size: 4, reshard_after_forward: false, prefetch: 0,\n"
	"           context: 2, expert: 4, capacity_factor: 1.25, offload: optimizer,\n"
	"           timeout_s: 30}\n"
	"checkpoint: {every: 0, keep: 1, dir: /scratch/ck, optimizer: false}\n"
	"export: {dtype: fp32}\n"
	"run: {dir: runs/custom, log_every: 1}\n"
	"gpu_log: {every_s: 2.5, file: \"g-%j.csv\"}\n";

static void check_full(const struct sl_config *c)
{
	CHECK(!strcmp(c->model.path, "/m/qwen3-27b") && !strcmp(c->model.revision, "abc123"));
	CHECK(c->task == SL_TASK_SFT);
	CHECK(!strcmp(c->data.train, "d/train.jsonl") && !strcmp(c->data.valid, "d/valid.jsonl"));
	CHECK(!strcmp(c->data.text_field, "body") && !strcmp(c->data.label_field, "p"));
	CHECK(c->data.max_state == 4096);
	CHECK(!c->data.length_sort && !c->data.shuffle && c->data.pack && c->data.keep_reasoning);
	CHECK(c->data.seed == -7 && c->data.on_error == SL_ON_ERROR_SKIP);
	CHECK(c->train.batch == 3 && c->train.accum == 4 && c->train.steps == 0);
	CHECK(c->train.epochs == 2 && c->train.activation_checkpointing);
	CHECK(c->train.eval_every == 0 && c->train.max_bad_steps == 5 && c->train.deterministic);
	CHECK(c->optim.lr == 2.5e-4 && c->optim.schedule == SL_SCHED_LINEAR);
	CHECK(c->optim.warmup == 0 && c->optim.min_lr == 1e-6);
	CHECK(c->optim.betas[0] == 0.8 && c->optim.betas[1] == 0.99);
	CHECK(c->optim.eps == 1e-6 && c->optim.weight_decay == 0 && c->optim.clip == 0);
	CHECK(c->optim.head_lr_mult == 10);
	CHECK(c->backend == SL_BACKEND_CPU);
	CHECK(c->precision.compute == SL_PREC_BF16 && c->precision.master == SL_PREC_FP32);
	CHECK(c->precision.reduce == SL_PREC_BF16);
	CHECK(c->parallel.shard_group == SL_SHARD_NODE && c->parallel.node_size == 4);
	CHECK(!c->parallel.reshard_after_forward && c->parallel.prefetch == 0);
	CHECK(c->parallel.context == 2 && c->parallel.expert == 4);
	CHECK(c->parallel.capacity_factor == 1.25 && c->parallel.offload == SL_OFFLOAD_OPTIMIZER);
	CHECK(c->parallel.timeout_s == 30);
	CHECK(c->checkpoint.every == 0 && c->checkpoint.keep == 1 && !c->checkpoint.optimizer);
	CHECK(!strcmp(c->checkpoint.dir, "/scratch/ck"));
	CHECK(c->export_.dtype == SL_PREC_FP32);
	CHECK(!strcmp(c->run.dir, "runs/custom") && c->run.log_every == 1);
	CHECK(c->gpu_log.every_s == 2.5 && !strcmp(c->gpu_log.file, "g-%j.csv"));
}

static void test_full(void)
{
	struct sl_config c;

	write_file("full.yaml", full_yaml);
	CHECK(load(&c, "full.yaml", NULL, 0, true) == 0, "%s", err);
	CHECK(!err[0], "unexpected output: %s", err);
	check_full(&c);
	CHECK(!strcmp(c.source, "full.yaml") && !strcmp(c.name, "full"));
}

static void test_include(const char *fixtures)
{
	struct sl_config c;
	char job[PATH_MAX + 16];

	/* the fixture tree, from a working directory that is none of its own */
	snprintf(job, sizeof(job), "%s/job.yaml", fixtures);
	CHECK(load(&c, job, NULL, 0, true) == 0, "%s", err);
	CHECK(c.train.batch == 2, "job.yaml wins: %d", c.train.batch);
	CHECK(c.train.accum == 2, "layouts/eight.yaml wins over base.yaml: %d", c.train.accum);
	CHECK(c.optim.lr == 3e-4 && c.optim.warmup == 5, "from base.yaml");
	CHECK(!strcmp(c.model.path, "/models/qwen3-0.6b"));
	CHECK(!strcmp(c.data.train, "data/train.jsonl"));
	CHECK(c.parallel.shard_group == SL_SHARD_NODE && c.parallel.node_size == 8);
	CHECK(c.parallel.prefetch == 2);
	CHECK(!strcmp(c.name, "job") && !strcmp(c.run.dir, "runs/job"), "%s", c.run.dir);
	CHECK(!strcmp(c.source, job));

	/* a list: later entries win over earlier ones, the including file over both */
	mkdir("inc", 0755);
	write_file("inc/a.yaml", "train: {batch: 5, steps: 7}\noptim: {lr: 1e-3}\n"
		   "run: {dir: runs/from-a}\n");
	write_file("inc/b.yaml", "train: {batch: 6}\ndata: {seed: 42}\n");
	write_file("top.yaml", "train: {steps: 9}\ninclude:\n  - inc/a.yaml\n  - inc/b.yaml\n");
	CHECK(load(&c, "top.yaml", NULL, 0, false) == 0, "%s", err);
	CHECK(c.train.batch == 6 && c.train.steps == 9 && c.optim.lr == 1e-3);
	CHECK(c.data.seed == 42);
	CHECK(!strcmp(c.run.dir, "runs/from-a"), "an included run.dir stays: %s", c.run.dir);

	/* the same file twice (a diamond) is no cycle */
	write_file("inc/c.yaml", "include: b.yaml\n");
	write_file("diamond.yaml", "include: [inc/b.yaml, inc/c.yaml]\n");
	CHECK(load(&c, "diamond.yaml", NULL, 0, false) == 0, "%s", err);
	CHECK(c.train.batch == 6);
}

static void test_set(void)
{
	struct sl_config c;
	const char *set[] = {
		"train.batch=2", "train.batch=3", "optim.betas=[0.9,0.99]", "optim.lr=2e-5",
		"data.shuffle=off", "backend=cpu", "model.revision=my rev", "data.valid=",
		"run.dir=/abs/run", " train.accum = 8", "data.seed=-3", "optim.clip=0",
		"model.path=m: x",
	};

	write_file("s.yaml", "train: {batch: 7, accum: 1}\ndata: {valid: v.jsonl}\n");
	CHECK(load(&c, "s.yaml", set, sizeof(set) / sizeof(set[0]), false) == 0, "%s", err);
	CHECK(c.train.batch == 3, "applied in order: %d", c.train.batch);
	CHECK(c.train.accum == 8);
	CHECK(c.optim.betas[0] == 0.9 && c.optim.betas[1] == 0.99);
	CHECK(c.optim.lr == 2e-5 && c.optim.clip == 0);
	CHECK(!c.data.shuffle && c.backend == SL_BACKEND_CPU);
	CHECK(!strcmp(c.model.revision, "my rev"));
	CHECK(!strcmp(c.data.valid, ""), "empty value clears: '%s'", c.data.valid);
	CHECK(!strcmp(c.run.dir, "/abs/run"));
	CHECK(c.data.seed == -3);
	CHECK(!strcmp(c.model.path, "m: x"), "%s", c.model.path);

	/* --set without a file */
	{
		const char *s2[] = { "train.steps=5" };

		CHECK(load(&c, NULL, s2, 1, false) == 0, "%s", err);
		CHECK(c.train.steps == 5 && c.train.batch == 1);
	}

	EXPECT_SET_ERR("s.yaml", "train.batch=x",
		       "--set train.batch=x: train.batch: expected an integer, got 'x'\n");
	EXPECT_SET_ERR("s.yaml", "train.batch=0", "--set train.batch=0: train.batch: must be >= 1, got 0");
	EXPECT_SET_ERR("s.yaml", "train.bach=2",
		       "--set train.bach=2: train.bach: unknown key; did you mean 'train.batch'?");
	EXPECT_SET_ERR("s.yaml", "trian.batch=2", "did you mean 'train.batch'?");
	EXPECT_SET_ERR("s.yaml", "train.batch", "--set train.batch: expected KEY=VALUE");
	EXPECT_SET_ERR("s.yaml", "train=2", "--set train=2: train: a section");
	EXPECT_SET_ERR("s.yaml", "optim.betas=0.9",
		       "--set optim.betas=0.9: optim.betas: expected a list of 2 numbers");
	EXPECT_SET_ERR("s.yaml", "optim.betas=[0.9, 1]",
		       "--set optim.betas=[0.9, 1]: optim.betas: must be in [0, 1), got 1");
	EXPECT_SET_ERR("s.yaml", "backend=gpu",
		       "--set backend=gpu: backend: expected one of cuda|cpu, got 'gpu'");
	EXPECT_SET_ERR("s.yaml", "train.batch={a: 1}",
		       "--set train.batch={a: 1}: train.batch: expected an integer, got a mapping");
}

static void test_errors(void)
{
	/* type, range and enum errors point at the value */
	EXPECT_FILE_ERR("e1.yaml", "train:\n  batch: two\n", false,
			"e1.yaml:2:10: train.batch: expected an integer, got 'two'\n");
	EXPECT_FILE_ERR("e2.yaml", "train: {batch: 0}\n", false,
			"e2.yaml:1:16: train.batch: must be >= 1, got 0\n");
	EXPECT_FILE_ERR("e3.yaml", "model: {path: x}\noptim:\n  lr: 0\n", false,
			"e3.yaml:3:7: optim.lr: must be > 0, got 0\n");
	EXPECT_FILE_ERR("e4.yaml", "optim:\n  betas: [0.9, 1.0]\n", false,
			"e4.yaml:2:16: optim.betas: must be in [0, 1), got 1.0\n");
	EXPECT_FILE_ERR("e5.yaml", "backend: gpu\n", false,
			"e5.yaml:1:10: backend: expected one of cuda|cpu, got 'gpu'\n");
	EXPECT_FILE_ERR("e6.yaml", "precision: {master: bf16}\n", false,
			"e6.yaml:1:21: precision.master: expected one of fp32, got 'bf16'\n");
	EXPECT_FILE_ERR("e7.yaml", "parallel:\n  offload: cpu\n", false,
			"e7.yaml:2:12: parallel.offload: expected one of none|optimizer|params, "
			"got 'cpu'\n");
	EXPECT_FILE_ERR("e8.yaml", "data: {shuffle: maybe}\n", false,
			"e8.yaml:1:17: data.shuffle: expected true or false");
	EXPECT_FILE_ERR("e9.yaml", "optim: {lr: fast}\n", false,
			"e9.yaml:1:13: optim.lr: expected a number (like 1e-5 or 0.1), got 'fast'\n");
	EXPECT_FILE_ERR("e10.yaml", "train:\n  batch: 99999999999\n", false,
			"e10.yaml:2:10: train.batch: 99999999999 does not fit in a 32-bit integer\n");
	EXPECT_FILE_ERR("e11.yaml", "parallel: {timeout_s: 0}\n", false,
			"e11.yaml:1:23: parallel.timeout_s: must be >= 1, got 0\n");
	EXPECT_FILE_ERR("e12.yaml", "optim: {clip: -1}\n", false,
			"e12.yaml:1:15: optim.clip: must be >= 0, got -1\n");
	EXPECT_FILE_ERR("e13.yaml", "task: chat\n", false,
			"e13.yaml:1:7: task: expected one of classify|sft, got 'chat'\n");

	/* a mapping where a scalar belongs, and the reverse */
	EXPECT_FILE_ERR("m1.yaml", "train:\n  batch: {a: 1}\n", false,
			"m1.yaml:2:10: train.batch: expected an integer, got a mapping\n");
	EXPECT_FILE_ERR("m2.yaml", "train: 5\n", false,
			"m2.yaml:1:8: train: expected a mapping of train's keys (batch, accum, ");
	EXPECT_FILE_ERR("m3.yaml", "model:\n  path: [a, b]\n", false,
			"m3.yaml:2:9: model.path: expected a string, got a list\n");
	EXPECT_FILE_ERR("m4.yaml", "- a\n- b\n", false,
			"m4.yaml:1:1: expected a mapping of sections");

	/* unknown names point at the key, with a suggestion when one is close */
	EXPECT_FILE_ERR("u1.yaml", "train:\n  bach: 2\n", false,
			"u1.yaml:2:3: train.bach: unknown key; did you mean 'train.batch'?\n");
	EXPECT_FILE_ERR("u2.yaml", "optim: {shcedule: linear}\n", false,
			"u2.yaml:1:9: optim.shcedule: unknown key; did you mean 'optim.schedule'?\n");
	EXPECT_FILE_ERR("u3.yaml", "train: {batch: 1, lr: 1e-4}\n", false,
			"u3.yaml:1:19: train.lr: unknown key; did you mean 'optim.lr'?\n");
	EXPECT_FILE_ERR("u4.yaml", "trian:\n  batch: 2\n", false,
			"u4.yaml:1:1: trian: unknown section; did you mean 'train'?\n");
	EXPECT_FILE_ERR("u5.yaml", "model: {path: x, zzzzzz: 1}\n", false,
			"u5.yaml:1:18: model.zzzzzz: unknown key; the keys of 'model' are: path, "
			"revision\n");
	EXPECT_FILE_ERR("u6.yaml", "train.batch: 2\n", false,
			"u6.yaml:1:1: train.batch: dotted keys are for --set; in a file write "
			"'train: {batch: ...}'\n");

	/* duplicates, at the second occurrence */
	EXPECT_FILE_ERR("d1.yaml", "train:\n  batch: 1\n  accum: 2\n  batch: 3\n", false,
			"d1.yaml:4:3: train.batch: duplicate key (first at line 2, column 3)");
	EXPECT_FILE_ERR("d2.yaml", "train: {batch: 1}\ndata: {}\ntrain: {accum: 1}\n", false,
			"d2.yaml:3:1: train: duplicate key (first at line 1, column 1)");

	/* libyaml's own position for syntax errors */
	EXPECT_FILE_ERR("y1.yaml", "train:\n  batch: 1\n bad: 2\n", false,
			"y1.yaml:3:2: YAML syntax error: did not find expected key");
	EXPECT_FILE_ERR("y2.yaml", "a: 1\n---\nb: 2\n", false,
			"y2.yaml:2:1: a second YAML document");

	/* several bad keys in one file: each reported */
	EXPECT_FILE_ERR("multi.yaml", "train: {batch: 0}\noptim: {lr: x}\n", false,
			"multi.yaml:1:16: train.batch: must be >= 1, got 0\n"
			"multi.yaml:2:13: optim.lr: expected a number");

	/* keys that depend on each other: reported where the offending key was set */
	EXPECT_FILE_ERR("x1.yaml", "train:\n  steps: 0\n", false,
			"x1.yaml:2:3: train.steps: 0 means 'from train.epochs', but train.epochs "
			"is 0 too");
	EXPECT_FILE_ERR("x2.yaml", "optim: {lr: 1e-5, min_lr: 1e-4}\n", false,
			"x2.yaml:1:19: optim.min_lr: 0.0001 is above optim.lr (1e-05)");

	/* required keys, only for a training run */
	EXPECT_FILE_ERR("r1.yaml", "data: {train: t.jsonl}\n", true,
			"r1.yaml: missing required key model.path (r1.yaml)");
	EXPECT_FILE_ERR("r2.yaml", "model: {path: m}\n", true,
			"r2.yaml: missing required key data.train (r2.yaml)");
	{
		struct sl_config c;
		const char *set[] = { "data.train=t.jsonl" };

		CHECK(load(&c, "r2.yaml", set, 1, true) == 0, "--set satisfies it: %s", err);
		CHECK(load(&c, "r2.yaml", NULL, 0, false) == 0, "not needed: %s", err);
	}

	/* files that are not there */
	{
		struct sl_config c;

		CHECK(load(&c, "nope.yaml", NULL, 0, false) < 0);
		CHECK(strstr(err, "nope.yaml: cannot open the config file: No such file or directory"),
		      "%s", err);
	}
	EXPECT_FILE_ERR("i1.yaml", "train: {batch: 2}\ninclude: [missing.yaml]\n", false,
			"i1.yaml:2:11: include: cannot open 'missing.yaml': No such file or "
			"directory");
	mkdir("sub", 0755);
	write_file("sub/x.yaml", "include: y.yaml\n");
	EXPECT_FILE_ERR("i2.yaml", "include: sub/x.yaml\n", false,
			"sub/x.yaml:1:10: include: cannot open 'sub/y.yaml'");
	EXPECT_FILE_ERR("i3.yaml", "include: {a: 1}\n", false,
			"i3.yaml:1:10: include: expected a file name or a list of them, got a "
			"mapping");

	/* an error inside an included file names that file */
	write_file("sub/bad.yaml", "\noptim:\n  warmup: -1\n");
	EXPECT_FILE_ERR("i4.yaml", "include: sub/bad.yaml\n", false,
			"sub/bad.yaml:3:11: optim.warmup: must be >= 0, got -1\n");

	/* cycles, naming the chain */
	write_file("cyc_b.yaml", "train: {batch: 2}\ninclude: [cyc_a.yaml]\n");
	EXPECT_FILE_ERR("cyc_a.yaml", "include: cyc_b.yaml\n", false,
			"cyc_b.yaml:2:11: include: include cycle: cyc_a.yaml -> cyc_b.yaml -> "
			"cyc_a.yaml");
	EXPECT_FILE_ERR("self.yaml", "include: self.yaml\n", false,
			"self.yaml:1:10: include: include cycle: self.yaml -> self.yaml");
}

/* load @path, write it as YAML, load that back: the same struct */
static void round_trip(const char *path, const struct sl_config *c)
{
	struct sl_config back;
	char key[64] = "x";
	FILE *f = fopen("rt.yaml", "w");

	CHECK(f && sl_config_write_yaml(c, f) == 0);
	if (f)
		fclose(f);
	CHECK(load(&back, "rt.yaml", NULL, 0, false) == 0, "%s: %s", path, err);
	CHECK(sl_config_diff(c, &back, key, sizeof(key)) == 0, "%s: %s differs", path, key);
	CHECK(key[0] == '\0');
}

static void test_write_yaml(void)
{
	struct sl_config c;
	char buf[64];

	write_file("full.yaml", full_yaml);
	CHECK(load(&c, "full.yaml", NULL, 0, true) == 0, "%s", err);
	round_trip("full.yaml", &c);
	check_full(&c);

	/* defaults, including the run dir taken from the file name */
	write_file("dflt.yaml", "");
	CHECK(load(&c, "dflt.yaml", NULL, 0, false) == 0, "%s", err);
	round_trip("dflt.yaml", &c);

	/* strings a YAML reader would otherwise take for numbers, booleans, nulls or syntax */
	write_file("odd.yaml",
		   "model: {path: \"a\\tb c\", revision: \"123\"}\n"
		   "data: {train: \"x: y\", valid: \"yes\", text_field: \"#hash\", label_field: ü}\n"
		   "checkpoint: {dir: \"it's \\\"q\\\"\"}\n"
		   "run: {dir: \"null\"}\n"
		   "gpu_log: {file: \"%x\", every_s: 0.1}\n"
		   "optim: {lr: 0.30000000000000004, eps: 1e-300}\n");
	CHECK(load(&c, "odd.yaml", NULL, 0, false) == 0, "%s", err);
	CHECK(!strcmp(c.model.path, "a\tb c") && !strcmp(c.checkpoint.dir, "it's \"q\""));
	CHECK(!strcmp(c.run.dir, "null") && !strcmp(c.data.label_field, "ü"));
	round_trip("odd.yaml", &c);

	CHECK(sl_config_format(&c, "optim.lr", buf, sizeof(buf)) == 0 &&
	      !strcmp(buf, "0.30000000000000004"), "%s", buf);
	sl_config_defaults(&c);
	CHECK(sl_config_format(&c, "optim.betas", buf, sizeof(buf)) == 0 &&
	      !strcmp(buf, "[0.9, 0.95]"), "%s", buf);
	CHECK(sl_config_format(&c, "train.batch", buf, sizeof(buf)) == 0 && !strcmp(buf, "1"));
	CHECK(sl_config_format(&c, "no.such", buf, sizeof(buf)) < 0);
}

static void test_diff(void)
{
	struct sl_config a, b;
	char key[64];
	const char *resumable[] = { "train.steps", "checkpoint.", NULL };

	write_file("full.yaml", full_yaml);
	CHECK(load(&a, "full.yaml", NULL, 0, true) == 0, "%s", err);
	b = a;
	CHECK(sl_config_diff(&a, &b, key, sizeof(key)) == 0 && !key[0]);
	strcpy(b.source, "elsewhere.yaml");	/* not a key */
	CHECK(sl_config_diff(&a, &b, key, sizeof(key)) == 0);

	b.optim.eps = 2e-6;
	CHECK(sl_config_diff(&a, &b, key, sizeof(key)) == 1 && !strcmp(key, "optim.eps"), "%s", key);
	b = a;
	b.optim.betas[1] = 0.98;
	CHECK(sl_config_diff(&a, &b, key, sizeof(key)) == 1 && !strcmp(key, "optim.betas"));
	b = a;
	b.parallel.offload = SL_OFFLOAD_PARAMS;
	CHECK(sl_config_diff(&a, &b, key, sizeof(key)) == 1 && !strcmp(key, "parallel.offload"));
	b = a;
	strcpy(b.data.valid, "other.jsonl");
	CHECK(sl_config_diff(&a, &b, key, sizeof(key)) == 1 && !strcmp(key, "data.valid"));

	/* the first differing key in table order */
	b = a;
	b.gpu_log.every_s = 1;
	b.train.batch = 9;
	CHECK(sl_config_diff(&a, &b, key, sizeof(key)) == 1 && !strcmp(key, "train.batch"));

	b = a;
	b.train.steps = 500;
	b.checkpoint.keep = 9;
	CHECK(sl_config_diff(&a, &b, key, sizeof(key)) == 1 && !strcmp(key, "train.steps"));
	CHECK(sl_config_diff_ignoring(&a, &b, resumable, key, sizeof(key)) == 0, "%s", key);
	b.train.accum = 1;
	CHECK(sl_config_diff_ignoring(&a, &b, resumable, key, sizeof(key)) == 1 &&
	      !strcmp(key, "train.accum"));
}

static void test_print_table(void)
{
	struct sl_config c;
	char *buf = NULL, want[128];
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	int lines = 0;

	write_file("full.yaml", full_yaml);
	CHECK(load(&c, "full.yaml", NULL, 0, true) == 0, "%s", err);
	sl_config_print_table(&c, f);
	fclose(f);
	for (size_t i = 0; i < len; i++)
		lines += buf[i] == '\n';
	/* DESIGN.md §3: model 2, task, data 11, train 8, optim 9, backend, precision 3,
	 * parallel 9, checkpoint 4 + term_grace_s (issue 10), export 1 + final (issue 6), run 2,
	 * gpu_log 2 */
	CHECK(lines == 55, "%d lines", lines);
	/* the longest key, "parallel.reshard_after_forward", is 30 characters */
	CHECK(!strncmp(buf, "model.path                      /m/qwen3-27b\n", 45), "%.60s", buf);
	snprintf(want, sizeof(want), "\n%-30s  %s\n", "train.batch", "3");
	CHECK(strstr(buf, want), "%s", buf);
	snprintf(want, sizeof(want), "\n%-30s  %s\n", "optim.betas", "[0.8, 0.99]");
	CHECK(strstr(buf, want));
	snprintf(want, sizeof(want), "\n%-30s  %s\n", "optim.lr", "0.00025");
	CHECK(strstr(buf, want));
	snprintf(want, sizeof(want), "\n%-30s  %s\n", "precision.compute", "bf16");
	CHECK(strstr(buf, want));
	snprintf(want, sizeof(want), "\n%-30s  %s\n", "parallel.reshard_after_forward", "false");
	CHECK(strstr(buf, want));
	free(buf);
}

int main(void)
{
	char fixtures[PATH_MAX], rel[PATH_MAX];

	snprintf(rel, sizeof(rel), "%s/test/fixtures/config", test_srcdir());
	if (!realpath(rel, fixtures)) {
		perror(rel);
		return 2;
	}
	strcpy(tmpdir, "/tmp/test_config-XXXXXX");
	if (!mkdtemp(tmpdir) || chdir(tmpdir)) {
		perror(tmpdir);
		return 2;
	}

	test_defaults();
	test_full();
	test_include(fixtures);
	test_set();
	test_errors();
	test_write_yaml();
	test_diff();
	test_print_table();

	if (!test_failures) {	/* keep the files of a failed run for a look */
		char cmd[128];

		snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
		if (chdir("/") || system(cmd))
			fprintf(stderr, "could not remove %s\n", tmpdir);
	} else {
		fprintf(stderr, "files kept in %s\n", tmpdir);
	}
	return test_exit("test_config");
}
