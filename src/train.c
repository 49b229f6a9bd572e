/*
 * train: `shardlm train`, `shardlm score` and `shardlm config` (see train.h).
 *
 * The step loop reads top to bottom: pick the step's records (data), run each micro-batch's forward
 * and backward (model over the backend, units from shard), finish the step (shard + optim), log
 * and rewrite training_metrics.json (metrics).  Errors in user input stop before anything in the
 * run directory is overwritten.
 */
#define _GNU_SOURCE
#include "sl_build.h"
#include "train.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <mpi.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "backend.h"
#include "config.h"
#include "data.h"
#include "log.h"
#include "metrics.h"
#include "model.h"
#include "optim.h"
#include "safetensors.h"
#include "shard.h"

#define MAX_SET 256

struct cmd_args {
	const char *config;
	char *set[MAX_SET];
	int nset;
	bool fresh;
	const char *data;		/* score */
	const char *model;		/* score */
};

static void usage(const char *cmd)
{
	if (strcmp(cmd, "score") == 0)
		fprintf(stderr, "usage: shardlm score CONFIG [--set KEY=VALUE]... --data FILE "
			"[--model DIR]\n");
	else if (strcmp(cmd, "train") == 0)
		fprintf(stderr, "usage: shardlm train CONFIG [--set KEY=VALUE]... [--fresh]\n");
	else
		fprintf(stderr, "usage: shardlm config CONFIG [--set KEY=VALUE]...\n");
}

/* argv[0] is the subcommand */
static int parse_args(const char *cmd, int argc, char **argv, struct cmd_args *a)
{
	memset(a, 0, sizeof(*a));
	for (int i = 1; i < argc; i++) {
		const char *s = argv[i];
		const char **value = NULL;

		if (strcmp(s, "--set") == 0 || strncmp(s, "--set=", 6) == 0) {
			const char *kv = s[5] == '=' ? s + 6 : (i + 1 < argc ? argv[++i] : NULL);

			if (!kv || !strchr(kv, '=')) {
				sl_error("--set needs KEY=VALUE, e.g. --set train.batch=2");
				return -1;
			}
			if (a->nset == MAX_SET) {
				sl_error("more than %d --set options", MAX_SET);
				return -1;
			}
			a->set[a->nset++] = (char *)kv;
			continue;
		}
		if (strcmp(s, "--fresh") == 0 && strcmp(cmd, "train") == 0) {
			a->fresh = true;
			continue;
		}
		if (strcmp(cmd, "score") == 0 && strcmp(s, "--data") == 0)
			value = &a->data;
		else if (strcmp(cmd, "score") == 0 && strcmp(s, "--model") == 0)
			value = &a->model;
		if (value) {
			if (i + 1 >= argc) {
				sl_error("%s needs a value", s);
				return -1;
			}
			*value = argv[++i];
			continue;
		}
		if (strcmp(s, "-h") == 0 || strcmp(s, "--help") == 0) {
			usage(cmd);
			return 1;
		}
		if (s[0] == '-') {
			sl_error("unknown option %s for '%s'", s, cmd);
			usage(cmd);
			return -1;
		}
		if (a->config) {
			sl_error("one config file only ('%s' and '%s')", a->config, s);
			usage(cmd);
			return -1;
		}
		a->config = s;
	}
	if (!a->config) {
		sl_error("no config file given");
		usage(cmd);
		return -1;
	}
	if (strcmp(cmd, "score") == 0 && !a->data) {
		sl_error("score needs --data FILE");
		usage(cmd);
		return -1;
	}
	return 0;
}

static bool is_dir(const char *p)
{
	struct stat st;

	return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static bool is_file(const char *p)
{
	struct stat st;

	return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

static int mkdir_p(const char *path)
{
	char tmp[SL_PATH_MAX];

	snprintf(tmp, sizeof(tmp), "%s", path);
	for (char *p = tmp + 1; *p; p++) {
		if (*p != '/')
			continue;
		*p = 0;
		if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
			goto fail;
		*p = '/';
	}
	if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
		goto fail;
	return 0;
fail:
	sl_error("cannot create directory %s: %s", tmp, strerror(errno));
	return -1;
}

static bool dir_is_empty(const char *path)
{
	char probe[SL_PATH_MAX + 32];
	static const char *const files[] = { "training_metrics.json", "train.log", "config.yaml",
					     "model", "checkpoints" };

	for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
		snprintf(probe, sizeof(probe), "%s/%s", path, files[i]);
		if (access(probe, F_OK) == 0)
			return false;
	}
	return true;
}

/*
 * A run directory that already holds a run is never overwritten: --fresh moves it aside to
 * RUN.old-N.  Resuming needs a complete checkpoint, which this version does not write yet.
 */
static int prepare_run_dir(const char *dir, bool fresh)
{
	if (is_dir(dir) && !dir_is_empty(dir)) {
		char aside[SL_PATH_MAX + 32];
		int n;

		if (!fresh) {
			sl_error("run directory %s already holds a run and has no complete checkpoint "
				 "to resume from; pass --fresh to move it aside (to %s.old-N), or set "
				 "run.dir to another directory", dir, dir);
			return -1;
		}
		for (n = 1; n < 10000; n++) {
			snprintf(aside, sizeof(aside), "%s.old-%d", dir, n);
			if (access(aside, F_OK) != 0)
				break;
		}
		if (rename(dir, aside) != 0) {
			sl_error("cannot move %s aside to %s: %s", dir, aside, strerror(errno));
			return -1;
		}
		sl_log("moved the previous run %s aside to %s", dir, aside);
	}
	return mkdir_p(dir);
}

/* Checks of settings this version cannot honour yet: refuse them rather than ignore them. */
static int check_supported(const struct sl_config *c, bool training)
{
	if (c->backend == SL_BACKEND_CUDA) {
		sl_error("%s: backend: cuda is not in this version yet (the CUDA backend arrives "
			 "with its own issue); set backend: cpu", c->source);
		return -1;
	}
	if (c->precision.compute == SL_PREC_BF16) {
		sl_error("%s: precision.compute: bf16 needs the cuda backend; the cpu backend "
			 "computes in fp32 (set precision.compute: auto or fp32)", c->source);
		return -1;
	}
	if (c->task != SL_TASK_CLASSIFY) {
		sl_error("%s: task: %s is not in this version yet (only classify)", c->source,
			 sl_task_name(c->task));
		return -1;
	}
	if (!training)
		return 0;
	if (c->data.pack) {
		sl_error("%s: data.pack applies to task sft only; set data.pack: false",
			 c->source);
		return -1;
	}
	if (c->parallel.offload != SL_OFFLOAD_NONE || c->parallel.context != 1 ||
	    c->parallel.expert != 1) {
		sl_error("%s: parallel.offload, parallel.context and parallel.expert are not in "
			 "this version yet; leave them at none, 1 and 1", c->source);
		return -1;
	}
	return 0;
}

struct loaded_model {
	char dir[SL_PATH_MAX];
	struct sl_model_config mc;
	struct sl_layout lay;
	float **units;			/* host fp32, one per unit */
	int n_initialized;
	bool have_mc, have_lay;
};

static void free_loaded_model(struct loaded_model *lm)
{
	if (lm->units) {
		for (int u = 0; u < lm->lay.n_units; u++)
			free(lm->units[u]);
		free(lm->units);
	}
	if (lm->have_lay)
		sl_layout_free(&lm->lay);
	if (lm->have_mc)
		sl_model_config_free(&lm->mc);
	memset(lm, 0, sizeof(*lm));
}

/* Resolve @path (+ revision), read config.json and the weights into host fp32 units. */
static int load_model(struct loaded_model *lm, const char *path, const char *revision,
		      uint64_t seed)
{
	struct sl_weights w;
	char cj[SL_PATH_MAX + 16];
	bool *init = NULL;
	int n_unused = 0, ret = -1;

	memset(lm, 0, sizeof(*lm));
	if (sl_hf_resolve(path, revision, lm->dir, sizeof(lm->dir)))
		return -1;
	snprintf(cj, sizeof(cj), "%s/config.json", lm->dir);
	if (sl_model_config_load(&lm->mc, cj))
		return -1;
	lm->have_mc = true;
	if (sl_model_layout(&lm->mc, 0, &lm->lay))
		goto out;
	lm->have_lay = true;
	if (sl_weights_open(&w, lm->dir))
		goto out;
	lm->units = calloc(lm->lay.n_units, sizeof(*lm->units));
	init = calloc(lm->lay.n_tensors, sizeof(*init));
	if (!lm->units || !init)
		goto out_close;
	for (int u = 0; u < lm->lay.n_units; u++) {
		lm->units[u] = calloc(lm->lay.unit_numel[u], sizeof(float));
		if (!lm->units[u]) {
			sl_error("out of host memory loading %s", lm->dir);
			goto out_close;
		}
	}
	if (sl_weights_load_layout(&w, &lm->lay, lm->units, lm->mc.initializer_range, seed, init,
				   &lm->n_initialized, &n_unused))
		goto out_close;
	for (int i = 0; i < lm->lay.n_tensors; i++)
		if (init[i])
			sl_log("%s has no %s: initialized it (normal, std %g = initializer_range)",
			       lm->dir, lm->lay.t[i].name, lm->mc.initializer_range);
	if (n_unused)
		sl_log("%s: %d tensor(s) of the checkpoint are not used by the %s task "
		       "(e.g. a causal-LM head)", lm->dir, n_unused, "classify");
	ret = 0;
out_close:
	sl_weights_close(&w);
out:
	free(init);
	if (ret)
		free_loaded_model(lm);
	return ret;
}

/* Device-side copy of a host batch. */
struct dev_batch {
	int32_t *ids, *lens, *last;
	float *labels;
	struct sl_batch_dev view;
};

static void dev_batch_alloc(struct sl_backend *be, struct dev_batch *d, int max_B, int max_L)
{
	d->ids = be->alloc(be, (size_t)max_B * max_L * sizeof(int32_t));
	d->lens = be->alloc(be, max_B * sizeof(int32_t));
	d->last = be->alloc(be, max_B * sizeof(int32_t));
	d->labels = be->alloc(be, max_B * sizeof(float));
}

static void dev_batch_free(struct sl_backend *be, struct dev_batch *d)
{
	be->free(be, d->ids);
	be->free(be, d->lens);
	be->free(be, d->last);
	be->free(be, d->labels);
}

static const struct sl_batch_dev *dev_batch_upload(struct sl_backend *be, struct dev_batch *d,
						   const struct sl_host_batch *hb)
{
	be->upload(be, d->ids, hb->ids, (size_t)hb->B * hb->L * sizeof(int32_t));
	be->upload(be, d->lens, hb->lens, hb->B * sizeof(int32_t));
	be->upload(be, d->last, hb->last, hb->B * sizeof(int32_t));
	be->upload(be, d->labels, hb->labels, hb->B * sizeof(float));
	d->view = (struct sl_batch_dev){ .B = hb->B, .L = hb->L, .ids = d->ids, .lens = d->lens,
					 .last = d->last, .labels = d->labels,
					 .h_lens = hb->lens };
	return &d->view;
}

static int longest(const struct sl_dataset *ds)
{
	int L = 1;

	for (int i = 0; i < ds->n; i++)
		if (ds->rec[i].len > L)
			L = ds->rec[i].len;
	return L;
}

static int cmp_len_desc(const void *a, const void *b, void *arg)
{
	const struct sl_dataset *ds = arg;
	int x = *(const int *)a, y = *(const int *)b;

	if (ds->rec[x].len != ds->rec[y].len)
		return ds->rec[y].len - ds->rec[x].len;
	return x - y;
}

/*
 * Scores of every record of @ds (logits into scores[i]); micro-batches of @batch records of
 * similar length.  Returns the mean BCE against the labels when every record has one, else NaN.
 */
static double score_dataset(struct sl_backend *be, struct sl_model *m,
			    const struct sl_unit_source *src, const struct sl_dataset *ds, int batch,
			    int max_L, int32_t pad, float *scores)
{
	struct sl_host_batch hb;
	struct dev_batch db;
	int *order = malloc(ds->n * sizeof(int));
	float *s = malloc(batch * sizeof(float));
	double loss = 0;
	bool labelled = true;

	sl_host_batch_alloc(&hb, batch, max_L);
	dev_batch_alloc(be, &db, batch, max_L);
	for (int i = 0; i < ds->n; i++)
		order[i] = i;
	qsort_r(order, ds->n, sizeof(int), cmp_len_desc, (void *)ds);
	for (int i = 0; i < ds->n; i += batch) {
		int n = ds->n - i < batch ? ds->n - i : batch;

		sl_host_batch_fill(&hb, ds, order + i, n, pad);
		sl_model_score(m, src, dev_batch_upload(be, &db, &hb), s);
		for (int j = 0; j < n; j++) {
			const struct sl_record *r = &ds->rec[order[i + j]];
			double z = s[j], y = r->label;

			scores[order[i + j]] = s[j];
			if (isnan(y))
				labelled = false;
			else
				loss += fmax(z, 0) - z * y + log1p(exp(-fabs(z)));
		}
	}
	dev_batch_free(be, &db);
	sl_host_batch_free(&hb);
	free(order);
	free(s);
	return labelled && ds->n ? loss / ds->n : NAN;
}

static int copy_file(const char *from, const char *to)
{
	FILE *in = fopen(from, "rb"), *out;
	char buf[1 << 16];
	size_t n;
	int ret = 0;

	if (!in)
		return -1;
	out = fopen(to, "wb");
	if (!out) {
		fclose(in);
		return -1;
	}
	while ((n = fread(buf, 1, sizeof(buf), in)) > 0)
		if (fwrite(buf, 1, n, out) != n)
			ret = -1;
	fclose(in);
	if (fclose(out))
		ret = -1;
	return ret;
}

/*
 * RUN/model: a Hugging Face Qwen3ForSequenceClassification directory (config.json from the
 * source with the classification architecture, model.safetensors, the tokenizer files).
 */
static int export_model(const char *out_dir, const struct loaded_model *lm, float *const *units,
			enum sl_precision dtype)
{
	static const char *const tok_files[] = { "tokenizer.json", "tokenizer_config.json",
						 "vocab.json", "merges.txt",
						 "special_tokens_map.json", "generation_config.json",
						 "chat_template.jinja" };
	char tmp_dir[SL_PATH_MAX + 16], p[2 * SL_PATH_MAX], q[2 * SL_PATH_MAX];
	struct sl_st_out *t;
	json_t *cj;
	json_error_t jerr;
	int ret = -1;

	if (snprintf(tmp_dir, sizeof(tmp_dir), "%s.tmp", out_dir) >= (int)sizeof(tmp_dir))
		return -1;
	if (mkdir_p(tmp_dir))
		return -1;
	snprintf(p, sizeof(p), "%s/config.json", lm->dir);
	cj = json_load_file(p, 0, &jerr);
	if (!cj) {
		sl_error("%s:%d: %s", p, jerr.line, jerr.text);
		return -1;
	}
	json_object_set_new(cj, "architectures", json_pack("[s]", "Qwen3ForSequenceClassification"));
	json_object_set_new(cj, "num_labels", json_integer(1));
	json_object_set_new(cj, "id2label", json_pack("{s:s}", "0", "LABEL_0"));
	json_object_set_new(cj, "label2id", json_pack("{s:i}", "LABEL_0", 0));
	json_object_set_new(cj, "dtype", json_string(dtype == SL_PREC_FP32 ? "float32" : "bfloat16"));
	snprintf(p, sizeof(p), "%s/config.json", tmp_dir);
	if (json_dump_file(cj, p, JSON_INDENT(2) | JSON_PRESERVE_ORDER)) {
		sl_error("cannot write %s", p);
		json_decref(cj);
		return -1;
	}
	json_decref(cj);

	t = calloc(lm->lay.n_tensors, sizeof(*t));
	for (int i = 0; i < lm->lay.n_tensors; i++) {
		const struct sl_tensor_info *ti = &lm->lay.t[i];

		t[i].name = ti->name;
		t[i].ndim = ti->ndim;
		t[i].shape[0] = ti->shape[0];
		t[i].shape[1] = ti->shape[1];
		t[i].data = units[ti->unit] + ti->offset;
	}
	snprintf(p, sizeof(p), "%s/model.safetensors", tmp_dir);
	if (sl_st_write(p, t, lm->lay.n_tensors, dtype == SL_PREC_FP32 ? SL_DT_F32 : SL_DT_BF16))
		goto out_free;
	for (size_t i = 0; i < sizeof(tok_files) / sizeof(tok_files[0]); i++) {
		snprintf(p, sizeof(p), "%s/%s", lm->dir, tok_files[i]);
		snprintf(q, sizeof(q), "%s/%s", tmp_dir, tok_files[i]);
		if (is_file(p) && copy_file(p, q)) {
			sl_error("cannot copy %s to %s", p, q);
			goto out_free;
		}
	}
	if (rename(tmp_dir, out_dir) != 0) {
		sl_error("cannot rename %s to %s: %s", tmp_dir, out_dir, strerror(errno));
		goto out_free;
	}
	ret = 0;
out_free:
	free(t);
	return ret;
}

static void format_duration(double s, char *buf, size_t n)
{
	long t = (long)(s + 0.5);

	if (t >= 3600)
		snprintf(buf, n, "%ldh %02ldm %02lds", t / 3600, t / 60 % 60, t % 60);
	else if (t >= 60)
		snprintf(buf, n, "%ldm %02lds", t / 60, t % 60);
	else
		snprintf(buf, n, "%.1fs", s);
}

static int load_data(struct sl_dataset *ds, const char *path, const struct sl_config *c,
		     int vocab, bool training, const char *what)
{
	struct sl_data_opts o = {
		.text_field = c->data.text_field, .label_field = c->data.label_field,
		.max_state = training ? c->data.max_state : 0, .need_label = training,
		.skip_errors = c->data.on_error == SL_ON_ERROR_SKIP, .vocab = vocab,
	};

	if (sl_data_load(ds, path, &o))
		return -1;
	if (ds->skipped)
		sl_log("%s: skipped %ld bad line(s) (data.on_error: skip)", path, ds->skipped);
	if (training)
		sl_log("%s: dropped %ld of %ld records that exceed the training context "
		       "(max_state %d)", path, ds->dropped, ds->total, c->data.max_state);
	if (ds->n == 0) {
		sl_error("%s: no %s records left to use", path, what);
		return -1;
	}
	return 0;
}

static int init_mpi(int *argc, char ***argv, int *world)
{
	int provided, rank;
	char host[256] = "";

	MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, world);
	gethostname(host, sizeof(host) - 1);
	sl_log_set_rank(rank, *world, host);
	if (*world > 1) {
		sl_error("this version trains on one rank; sharding over ranks arrives with the "
			 "distributed issue (run shardlm without mpirun/srun)");
		return -1;
	}
	return 0;
}

int sl_cmd_train(int argc, char **argv)
{
	struct cmd_args a;
	struct sl_config *c = calloc(1, sizeof(*c));
	struct loaded_model lm;
	struct sl_dataset train = { 0 }, valid = { 0 };
	struct sl_backend *be = NULL;
	struct sl_shard sh = { 0 };
	struct sl_model *model = NULL;
	struct sl_sampler smp = { 0 };
	struct sl_metrics *met = NULL;
	struct sl_host_batch hb = { 0 };
	struct dev_batch db = { 0 };
	char path[SL_PATH_MAX + 64], dur[64];
	int world = 1, ret = 1, bad_steps = 0, max_L, R, steps;
	float *scores = NULL;
	int *idx = NULL;
	bool have_model = false;
	double t_train0;

	sl_log_init();
	if (init_mpi(&argc, &argv, &world))
		goto out_finalize;
	ret = parse_args("train", argc, argv, &a);
	if (ret) {
		ret = ret > 0 ? 0 : 2;
		goto out_finalize;
	}
	ret = 2;
	if (sl_config_load(c, a.config, a.set, a.nset, true) || check_supported(c, true))
		goto out_finalize;
	if (prepare_run_dir(c->run.dir, a.fresh))
		goto out_finalize;
	snprintf(path, sizeof(path), "%s/train.log", c->run.dir);
	if (sl_log_open_file(path))
		goto out_finalize;
	sl_log("shardlm %s (%s): train %s, run directory %s", PACKAGE_VERSION, SL_GIT_COMMIT,
	       a.config, c->run.dir);
	{
		char *buf = NULL;
		size_t len = 0;
		FILE *f = open_memstream(&buf, &len);

		sl_config_print_table(c, f);
		fclose(f);
		for (char *line = strtok(buf, "\n"); line; line = strtok(NULL, "\n"))
			sl_log("  %s", line);
		free(buf);
		f = open_memstream(&buf, &len);
		sl_config_write_yaml(c, f);
		fclose(f);
		snprintf(path, sizeof(path), "%s/config.yaml", c->run.dir);
		if (sl_write_file_atomic(path, buf, len)) {
			free(buf);
			goto out_finalize;
		}
		free(buf);
	}

	if (load_model(&lm, c->model.path, c->model.revision, (uint64_t)c->data.seed))
		goto out_finalize;
	have_model = true;
	sl_log("model %s: %s, %d layers, hidden %d, heads %d/%d (head_dim %d), vocab %d, "
	       "%.2fM parameters", lm.dir, lm.mc.model_type, lm.mc.n_layers, lm.mc.hidden,
	       lm.mc.n_heads, lm.mc.n_kv_heads, lm.mc.head_dim, lm.mc.vocab,
	       lm.lay.total_numel / 1e6);

	if (load_data(&train, c->data.train, c, lm.mc.vocab, true, "training"))
		goto out_free;
	if (c->data.valid[0] && load_data(&valid, c->data.valid, c, lm.mc.vocab, true, "validation"))
		goto out_free;

	if (sl_sampler_init(&smp, &train, c->train.batch, c->train.accum, world, c->data.shuffle,
			    c->data.length_sort, (uint64_t)c->data.seed))
		goto out_free;
	R = sl_sampler_records_per_step(&smp);
	steps = c->train.steps;
	if (steps == 0) {
		if (c->train.epochs <= 0) {
			sl_error("%s: train.steps is 0 and train.epochs is 0: set one of them",
				 a.config);
			goto out_free;
		}
		steps = (int)(c->train.epochs * sl_sampler_steps_per_epoch(&smp));
	}
	sl_log("%d records, %d per step (batch %d x accum %d x %d data-parallel rank(s)): "
	       "%d steps, %.2f epoch(s)", train.n, R, c->train.batch, c->train.accum, world,
	       steps, (double)steps * R / train.n);

	{
		struct sl_provenance_input pin = {
			.config_path = a.config, .model_dir = lm.dir, .train_path = c->data.train,
			.valid_path = c->data.valid, .tokenizer_path = NULL, .argc = argc,
			.argv = argv, .world = world, .backend = "cpu",
		};

		snprintf(path, sizeof(path), "%s/provenance.json", c->run.dir);
		if (sl_provenance_write(path, &pin))
			goto out_free;
	}

	be = sl_backend_cpu_create();
	if (!be) {
		sl_error("cannot create the cpu backend");
		goto out_free;
	}
	if (sl_shard_create(&sh, be, &lm.lay, lm.units))
		goto out_free;
	max_L = longest(&train);
	if (valid.n && longest(&valid) > max_L)
		max_L = longest(&valid);
	model = sl_model_create(&lm.mc, &lm.lay, be, c->train.batch * max_L, c->train.batch,
				c->train.activation_checkpointing);
	if (!model)
		goto out_free;
	sl_host_batch_alloc(&hb, c->train.batch, max_L);
	dev_batch_alloc(be, &db, c->train.batch, max_L);
	idx = malloc(c->train.batch * sizeof(int));
	scores = malloc((valid.n > train.n ? valid.n : train.n) * sizeof(float));

	snprintf(path, sizeof(path), "%s/training_metrics.json", c->run.dir);
	met = sl_metrics_create(path);
	{
		time_t now = time(NULL);
		char when[64];

		strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%S%z", localtime(&now));
		sl_metrics_run_int(met, "world", world);
		sl_metrics_run_int(met, "batch", c->train.batch);
		sl_metrics_run_int(met, "accum", c->train.accum);
		sl_metrics_run_int(met, "records_per_step", R);
		sl_metrics_run_int(met, "epoch_records", train.n);
		sl_metrics_run_int(met, "dropped_records", train.dropped);
		sl_metrics_run_int(met, "total_records", train.total);
		sl_metrics_run_int(met, "params", (long long)lm.lay.total_numel);
		sl_metrics_run_int(met, "max_state", c->data.max_state);
		sl_metrics_run_int(met, "steps", steps);
		sl_metrics_run_string(met, "backend", "cpu");
		sl_metrics_run_double(met, "start_unix", sl_unix_time());
		sl_metrics_run_string(met, "start_local", when);
	}
	if (sl_metrics_write(met))
		goto out_free;
	if (c->checkpoint.every)
		sl_log("note: HDF5 checkpoints arrive with the distributed issue; this version "
		       "writes none (checkpoint.every %d is not honoured), only the final model",
		       c->checkpoint.every);

	if (valid.n) {
		double vl = score_dataset(be, model, &sh.src, &valid, c->train.batch, max_L, 0,
					  scores);

		sl_metrics_add_eval(met, 0, vl, valid.n);
		sl_log("eval step 0  valid loss %.4f  (%d records)", vl, valid.n);
	}
	t_train0 = sl_now();
	for (int step = 1; step <= steps; step++) {
		struct sl_step_metrics sm = { .step = step };
		struct sl_optim_hparams h;
		double t0 = sl_now(), loss_sum = 0;
		int status;

		sl_shard_zero_grads(&sh);
		for (int acc = 0; acc < c->train.accum; acc++) {
			int n = sl_sampler_microbatch(&smp, step - 1, acc, 0, idx);
			double part = 0;

			sl_host_batch_fill(&hb, &train, idx, n, lm.mc.pad_token_id >= 0 ?
					   lm.mc.pad_token_id : 0);
			if (sl_model_train_step(model, &sh.src, dev_batch_upload(be, &db, &hb),
						1.0f / R, &part, NULL))
				goto out_free;
			loss_sum += part;
			sm.records += n;
			sm.tokens += hb.tokens;
			sm.padded_tokens += hb.padded_tokens;
		}
		h = (struct sl_optim_hparams){
			.lr = sl_lr_at(c->optim.schedule, c->optim.lr, c->optim.min_lr,
				       c->optim.warmup, step, steps),
			.head_lr_mult = c->optim.head_lr_mult, .beta1 = c->optim.betas[0],
			.beta2 = c->optim.betas[1], .eps = c->optim.eps,
			.weight_decay = c->optim.weight_decay, .clip = c->optim.clip, .step = step,
		};
		status = sl_shard_optim_step(&sh, &h, &sm.grad_norm);
		be->sync(be);
		sm.loss = loss_sum / R;
		sm.lr = h.lr;
		sm.time_s = sl_now() - t0;
		sm.end_unix = sl_unix_time();
		if (status) {
			bad_steps++;
			sl_warn("step %d: gradient norm is not finite (loss %g); skipped the update "
				"(%d of train.max_bad_steps %d in a row)", step, sm.loss, bad_steps,
				c->train.max_bad_steps);
			if (bad_steps >= c->train.max_bad_steps) {
				sl_error("%d steps in a row with a non-finite gradient; stopping. "
					 "Lower optim.lr or check the data", bad_steps);
				sl_metrics_add_step(met, &sm);
				sl_metrics_write(met);
				goto out_free;
			}
		} else {
			bad_steps = 0;
		}
		sl_metrics_add_step(met, &sm);
		if (step % c->run.log_every == 0 || step == steps || step == 1)
			sl_log("step %d/%d  loss %.4f  lr %.3e  grad_norm %.4f  s/step %.3f  "
			       "tokens/s %.0f  peak_gpu -  world %d", step, steps, sm.loss, sm.lr,
			       sm.grad_norm, sm.time_s, sm.tokens / fmax(sm.time_s, 1e-9), world);
		if (valid.n && ((c->train.eval_every && step % c->train.eval_every == 0) ||
				step == steps)) {
			double vl = score_dataset(be, model, &sh.src, &valid, c->train.batch, max_L,
						  0, scores);

			sl_metrics_add_eval(met, step, vl, valid.n);
			sl_log("eval step %d  valid loss %.4f  (%d records)", step, vl, valid.n);
		}
		if (sl_metrics_write(met))
			goto out_free;
	}
	format_duration(sl_now() - t_train0, dur, sizeof(dur));
	sl_log("trained %d steps in %s", steps, dur);

	for (int u = 0; u < lm.lay.n_units; u++)
		sl_shard_get_master(&sh, u, lm.units[u]);
	snprintf(path, sizeof(path), "%s/model", c->run.dir);
	if (export_model(path, &lm, lm.units, c->export_.dtype))
		goto out_free;
	sl_log("exported the model to %s (%s)", path, sl_precision_name(c->export_.dtype));
	ret = 0;
out_free:
	free(idx);
	free(scores);
	if (be) {
		dev_batch_free(be, &db);
		if (model)
			sl_model_destroy(model);
		sl_shard_destroy(&sh);
		be->destroy(be);
	}
	sl_host_batch_free(&hb);
	sl_metrics_destroy(met);
	sl_sampler_free(&smp);
	sl_data_free(&train);
	sl_data_free(&valid);
	if (have_model)
		free_loaded_model(&lm);
out_finalize:
	format_duration(sl_log_elapsed(), dur, sizeof(dur));
	if (ret == 0)
		sl_log("done: the job ran %s", dur);
	else
		sl_log("failed after %s", dur);
	sl_log_close_file();
	free(c);
	MPI_Finalize();
	return ret;
}

int sl_cmd_score(int argc, char **argv)
{
	struct cmd_args a;
	struct sl_config *c = calloc(1, sizeof(*c));
	struct loaded_model lm;
	struct sl_dataset ds = { 0 };
	struct sl_backend *be = NULL;
	struct sl_shard sh = { 0 };
	struct sl_model *model = NULL;
	char exported[SL_PATH_MAX + 64], probe[SL_PATH_MAX + 96];
	const char *weights;
	float *scores = NULL;
	int world, ret = 1, batch;
	bool have_model = false;

	sl_log_init();
	sl_log_to_stderr(true);
	if (init_mpi(&argc, &argv, &world))
		goto out_finalize;
	ret = parse_args("score", argc, argv, &a);
	if (ret) {
		ret = ret > 0 ? 0 : 2;
		goto out_finalize;
	}
	ret = 2;
	if (sl_config_load(c, a.config, a.set, a.nset, false) || check_supported(c, false))
		goto out_finalize;
	/* weights: --model, else the run's exported model, else model.path */
	snprintf(exported, sizeof(exported), "%s/model", c->run.dir);
	snprintf(probe, sizeof(probe), "%s/config.json", exported);
	if (a.model)
		weights = a.model;
	else if (is_file(probe))
		weights = exported;
	else if (c->model.path[0])
		weights = c->model.path;
	else {
		sl_error("%s: no weights to score with: pass --model DIR, train first (%s), or set "
			 "model.path", a.config, exported);
		goto out_finalize;
	}
	if (load_model(&lm, weights, a.model || weights == exported ? "" : c->model.revision,
		       (uint64_t)c->data.seed))
		goto out_finalize;
	have_model = true;
	if (lm.n_initialized)
		sl_warn("%s has no trained head: the scores come from a randomly initialized one",
			lm.dir);
	sl_log("scoring %s with %s", a.data, lm.dir);
	if (load_data(&ds, a.data, c, lm.mc.vocab, false, "scoring"))
		goto out_free;
	be = sl_backend_cpu_create();
	if (!be || sl_shard_create(&sh, be, &lm.lay, lm.units))
		goto out_free;
	batch = c->train.batch;
	model = sl_model_create(&lm.mc, &lm.lay, be, batch * longest(&ds), batch, false);
	if (!model)
		goto out_free;
	scores = malloc(ds.n * sizeof(float));
	score_dataset(be, model, &sh.src, &ds, batch, longest(&ds), 0, scores);
	for (int i = 0; i < ds.n; i++)
		printf("{\"index\":%d,\"score\":%.9g,\"prob\":%.9g}\n", i, scores[i],
		       1.0 / (1.0 + exp(-(double)scores[i])));
	fflush(stdout);
	ret = 0;
out_free:
	free(scores);
	if (be) {
		if (model)
			sl_model_destroy(model);
		sl_shard_destroy(&sh);
		be->destroy(be);
	}
	sl_data_free(&ds);
	if (have_model)
		free_loaded_model(&lm);
out_finalize:
	free(c);
	MPI_Finalize();
	return ret;
}

int sl_cmd_config(int argc, char **argv)
{
	struct cmd_args a;
	struct sl_config *c = calloc(1, sizeof(*c));
	int ret;

	ret = parse_args("config", argc, argv, &a);
	if (ret) {
		free(c);
		return ret > 0 ? 0 : 2;
	}
	ret = sl_config_load(c, a.config, a.set, a.nset, false) ? 2 : 0;
	if (ret == 0) {
		printf("%s: valid\n", a.config);
		sl_config_print_table(c, stdout);
	}
	free(c);
	return ret;
}
