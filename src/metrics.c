/*
 * metrics: training_metrics.json and provenance.json (see metrics.h).
 */
#include "sl_build.h"
#include "metrics.h"

#include <errno.h>
#include <fcntl.h>
#include <hdf5.h>
#include <jansson.h>
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <yaml.h>

#include "config.h"
#include "log.h"
#ifdef SL_HAVE_CUDA
#include "sl_cuda.h"
#endif

extern char **environ;

struct sl_metrics {
	char path[SL_PATH_MAX];
	json_t *root, *run, *steps, *eval;
};

struct sl_metrics *sl_metrics_create(const char *path)
{
	struct sl_metrics *m = calloc(1, sizeof(*m));

	if (!m)
		return NULL;
	snprintf(m->path, sizeof(m->path), "%s", path);
	m->root = json_object();
	m->run = json_object();
	m->steps = json_array();
	m->eval = json_array();
	json_object_set(m->root, "run", m->run);
	json_object_set(m->root, "steps", m->steps);
	json_object_set(m->root, "eval", m->eval);
	return m;
}

void sl_metrics_destroy(struct sl_metrics *m)
{
	if (!m)
		return;
	json_decref(m->run);
	json_decref(m->steps);
	json_decref(m->eval);
	json_decref(m->root);
	free(m);
}

void sl_metrics_run_int(struct sl_metrics *m, const char *key, long long v)
{
	json_object_set_new(m->run, key, json_integer(v));
}

void sl_metrics_run_double(struct sl_metrics *m, const char *key, double v)
{
	json_object_set_new(m->run, key, json_real(v));
}

void sl_metrics_run_string(struct sl_metrics *m, const char *key, const char *v)
{
	json_object_set_new(m->run, key, json_string(v));
}

/* JSON has no NaN or infinity: a non-finite value is written as null */
static json_t *num(double v)
{
	return isfinite(v) ? json_real(v) : json_null();
}

void sl_metrics_add_step(struct sl_metrics *m, const struct sl_step_metrics *s)
{
	json_t *o = json_object();

	json_object_set_new(o, "step", json_integer(s->step));
	json_object_set_new(o, "time_s", num(s->time_s));
	json_object_set_new(o, "end_unix", num(s->end_unix));
	json_object_set_new(o, "loss", num(s->loss));
	json_object_set_new(o, "lr", num(s->lr));
	json_object_set_new(o, "grad_norm", num(s->grad_norm));
	json_object_set_new(o, "records", json_integer(s->records));
	json_object_set_new(o, "tokens", json_integer(s->tokens));
	json_object_set_new(o, "padded_tokens", json_integer(s->padded_tokens));
	if (s->targets)
		json_object_set_new(o, "targets", json_integer(s->targets));
	json_object_set_new(o, "peak_gpu_bytes", json_integer(s->peak_gpu_bytes));
	if (s->reserved_gpu_bytes)
		json_object_set_new(o, "reserved_gpu_bytes", json_integer(s->reserved_gpu_bytes));
	if (s->device_used_bytes)
		json_object_set_new(o, "device_used_bytes", json_integer(s->device_used_bytes));
	if (s->skipped)
		json_object_set_new(o, "skipped", json_true());
	if (s->moe_layers > 0 && s->n_experts > 0 && s->expert_tokens) {
		/* per layer, the least and most loaded expert and all routed tokens (k per token) */
		json_t *et = json_object(), *mn = json_array(), *mx = json_array();
		json_t *tot = json_array(), *all = json_array();

		for (int l = 0; l < s->moe_layers; l++) {
			const long long *c = s->expert_tokens + (size_t)l * s->n_experts;
			long long lo = c[0], hi = c[0], sum = 0;
			json_t *row = json_array();

			for (int e = 0; e < s->n_experts; e++) {
				json_array_append_new(row, json_integer(c[e]));
				lo = c[e] < lo ? c[e] : lo;
				hi = c[e] > hi ? c[e] : hi;
				sum += c[e];
			}
			json_array_append_new(mn, json_integer(lo));
			json_array_append_new(mx, json_integer(hi));
			json_array_append_new(tot, json_integer(sum));
			json_array_append_new(all, row);
		}
		json_object_set_new(et, "min", mn);
		json_object_set_new(et, "max", mx);
		json_object_set_new(et, "total", tot);
		json_object_set_new(et, "per_expert", all);
		json_object_set_new(o, "expert_tokens", et);
	}
	if (s->capacity)
		json_object_set_new(o, "dropped_tokens", json_integer(s->dropped_tokens));
	json_array_append_new(m->steps, o);
}

void sl_metrics_add_eval(struct sl_metrics *m, int step, double loss, long records)
{
	json_t *o = json_object();

	json_object_set_new(o, "step", json_integer(step));
	json_object_set_new(o, "loss", num(loss));
	json_object_set_new(o, "records", json_integer(records));
	json_array_append_new(m->eval, o);
}

int sl_metrics_keep_earlier(struct sl_metrics *m, const char *path, int max_step)
{
	json_error_t jerr;
	json_t *old = json_load_file(path, 0, &jerr), *arr, *e;
	size_t i;
	int kept = 0;

	if (!old)
		return 0;
	arr = json_object_get(old, "steps");
	json_array_foreach(arr, i, e) {
		if (json_integer_value(json_object_get(e, "step")) <= max_step) {
			json_array_append(m->steps, e);
			kept++;
		}
	}
	arr = json_object_get(old, "eval");
	json_array_foreach(arr, i, e)
		if (json_integer_value(json_object_get(e, "step")) <= max_step)
			json_array_append(m->eval, e);
	json_decref(old);
	return kept;
}

void sl_metrics_add_eval_stats(struct sl_metrics *m, int step, long records, int n,
			       const char *const *keys, const double *values)
{
	json_t *o = json_object();

	json_object_set_new(o, "step", json_integer(step));
	for (int i = 0; i < n; i++)
		json_object_set_new(o, keys[i], num(values[i]));
	json_object_set_new(o, "records", json_integer(records));
	json_array_append_new(m->eval, o);
}

int sl_write_file_atomic(const char *path, const char *text, size_t len)
{
	char tmp[SL_PATH_MAX + 16];
	int fd, ret = -1;

	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	if (fd < 0) {
		sl_error("cannot write %s: %s", tmp, strerror(errno));
		return -1;
	}
	for (size_t done = 0; done < len;) {
		ssize_t w = write(fd, text + done, len - done);

		if (w < 0) {
			if (errno == EINTR)
				continue;
			sl_error("cannot write %s: %s", tmp, strerror(errno));
			goto out_close;
		}
		done += w;
	}
	if (fsync(fd) != 0) {
		sl_error("cannot sync %s: %s", tmp, strerror(errno));
		goto out_close;
	}
	ret = 0;
out_close:
	close(fd);
	if (ret == 0 && rename(tmp, path) != 0) {
		sl_error("cannot rename %s to %s: %s", tmp, path, strerror(errno));
		ret = -1;
	}
	if (ret)
		unlink(tmp);
	return ret;
}

static int write_json(const char *path, json_t *j)
{
	char *text = json_dumps(j, JSON_INDENT(1) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17));
	int ret;

	if (!text)
		return -1;
	ret = sl_write_file_atomic(path, text, strlen(text));
	free(text);
	return ret;
}

int sl_metrics_write(struct sl_metrics *m)
{
	return write_json(m->path, m->root);
}

uint64_t sl_file_hash(const char *path, long long *bytes)
{
	uint64_t h = 0xcbf29ce484222325ULL;
	unsigned char buf[1 << 16];
	long long n = 0;
	size_t got;
	FILE *f = fopen(path, "rb");

	*bytes = -1;
	if (!f)
		return 0;
	while ((got = fread(buf, 1, sizeof(buf), f)) > 0) {
		for (size_t i = 0; i < got; i++) {
			h ^= buf[i];
			h *= 0x100000001b3ULL;
		}
		n += got;
	}
	fclose(f);
	*bytes = n;
	return h;
}

static json_t *file_entry(const char *path)
{
	long long bytes;
	uint64_t h;
	char hex[32];
	json_t *o;

	if (!path || !*path)
		return json_null();
	h = sl_file_hash(path, &bytes);
	o = json_object();
	json_object_set_new(o, "path", json_string(path));
	json_object_set_new(o, "bytes", json_integer(bytes));
	snprintf(hex, sizeof(hex), "%016llx", (unsigned long long)h);
	json_object_set_new(o, "fnv1a64", bytes >= 0 ? json_string(hex) : json_null());
	return o;
}

int sl_provenance_write(const char *path, const struct sl_provenance_input *in)
{
	json_t *root = json_object(), *libs = json_object(), *env = json_object();
	json_t *args = json_array(), *inputs = json_object();
	char buf[MPI_MAX_LIBRARY_VERSION_STRING], host[256] = "";
	unsigned maj, min, rel;
	int len = 0, ret;
	time_t now = time(NULL);
	char when[64];

	json_object_set_new(root, "shardlm", json_string(PACKAGE_VERSION));
	json_object_set_new(root, "commit", json_string(SL_GIT_COMMIT));
	strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%S%z", localtime(&now));
	json_object_set_new(root, "start_local", json_string(when));
	gethostname(host, sizeof(host) - 1);
	json_object_set_new(root, "hosts", json_pack("[s]", host));
	json_object_set_new(root, "world", json_integer(in->world));
	json_object_set_new(root, "backend", json_string(in->backend));
	for (int i = 0; i < in->argc; i++)
		json_array_append_new(args, json_string(in->argv[i]));
	json_object_set_new(root, "command", args);

	MPI_Get_library_version(buf, &len);
	buf[strcspn(buf, "\n")] = 0;
	json_object_set_new(libs, "mpi", json_string(buf));
	H5get_libversion(&maj, &min, &rel);
	snprintf(buf, sizeof(buf), "%u.%u.%u", maj, min, rel);
	json_object_set_new(libs, "hdf5", json_string(buf));
	json_object_set_new(libs, "jansson", json_string(JANSSON_VERSION));
	json_object_set_new(libs, "libyaml", json_string(yaml_get_version_string()));
#ifdef SL_HAVE_CUDA
	sl_cuda_versions(buf, sizeof(buf));
	json_object_set_new(libs, "cuda", json_string(buf));
#else
	json_object_set_new(libs, "cuda", json_null());
#endif
	json_object_set_new(root, "libraries", libs);

	for (char **e = environ; *e; e++) {
		if (strncmp(*e, "NCCL_", 5) == 0) {
			const char *eq = strchr(*e, '=');

			if (eq) {
				char key[256];

				snprintf(key, sizeof(key), "%.*s", (int)(eq - *e), *e);
				json_object_set_new(env, key, json_string(eq + 1));
			}
		}
	}
	json_object_set_new(root, "nccl_env", env);

	json_object_set_new(inputs, "config", file_entry(in->config_path));
	json_object_set_new(inputs, "train", file_entry(in->train_path));
	json_object_set_new(inputs, "valid", file_entry(in->valid_path));
	json_object_set_new(inputs, "tokenizer", file_entry(in->tokenizer_path));
	if (in->model_dir) {
		char cj[SL_PATH_MAX + 16];

		snprintf(cj, sizeof(cj), "%s/config.json", in->model_dir);
		json_object_set_new(inputs, "model_dir", json_string(in->model_dir));
		json_object_set_new(inputs, "model_config", file_entry(cj));
	}
	json_object_set_new(root, "inputs", inputs);

	ret = write_json(path, root);
	json_decref(root);
	return ret;
}
