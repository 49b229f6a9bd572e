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
#include <pthread.h>
#include <stdbool.h>
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

/*
 * The steps and evaluations are kept as their JSON text, one line each, made once when they are
 * added: a rewrite copies them instead of printing the whole document again (a Qwen3-MoE step's
 * expert counts are tens of kilobytes).  sl_metrics_write_async hands the document as it stands
 * to a writer thread (started on first use), so a step does not wait for the file: the thread
 * writes the latest document it was given, skipping those that a newer one replaced meanwhile.
 * Entries are never changed or freed before destroy, so the thread reads them without the lock;
 * the lock guards the arrays' growth (the thread copies the pointers it needs) and the hand-over.
 */
struct text_list {
	char **v;
	size_t n, cap;
};

struct sl_metrics {
	char path[SL_PATH_MAX];
	json_t *run;
	struct text_list steps, eval;
	/* the writer thread */
	pthread_mutex_t lock;
	pthread_cond_t wake, idle;
	pthread_t thread;
	bool started, stop, busy;
	char *pend_run;		/* a document waiting for the thread: its run object's text ... */
	size_t pend_steps, pend_eval;	/* ... and how many steps and evaluations it has */
	int error;		/* a write failed (reported by the next write or flush) */
};

struct sl_metrics *sl_metrics_create(const char *path)
{
	struct sl_metrics *m = calloc(1, sizeof(*m));

	if (!m)
		return NULL;
	snprintf(m->path, sizeof(m->path), "%s", path);
	m->run = json_object();
	pthread_mutex_init(&m->lock, NULL);
	pthread_cond_init(&m->wake, NULL);
	pthread_cond_init(&m->idle, NULL);
	return m;
}

static void texts_free(struct text_list *l)
{
	for (size_t i = 0; i < l->n; i++)
		free(l->v[i]);
	free(l->v);
}

void sl_metrics_destroy(struct sl_metrics *m)
{
	if (!m)
		return;
	if (m->started) {
		sl_metrics_flush(m);
		pthread_mutex_lock(&m->lock);
		m->stop = true;
		pthread_cond_signal(&m->wake);
		pthread_mutex_unlock(&m->lock);
		pthread_join(m->thread, NULL);
	}
	pthread_cond_destroy(&m->idle);
	pthread_cond_destroy(&m->wake);
	pthread_mutex_destroy(&m->lock);
	free(m->pend_run);
	texts_free(&m->steps);
	texts_free(&m->eval);
	json_decref(m->run);
	free(m);
}

#define ENTRY_FLAGS (JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17))

/* text @t (malloc'ed; NULL: out of memory) as the last entry of @l, which owns it; out of memory
 * aborts (the metrics would silently lose entries otherwise) */
static void text_push(struct sl_metrics *m, struct text_list *l, char *t)
{
	pthread_mutex_lock(&m->lock);
	if (t && l->n == l->cap) {
		size_t cap = l->cap ? 2 * l->cap : 256;
		char **v = realloc(l->v, cap * sizeof(*v));

		if (!v) {
			free(t);
			t = NULL;
		} else {
			l->v = v;
			l->cap = cap;
		}
	}
	if (t)
		l->v[l->n++] = t;
	pthread_mutex_unlock(&m->lock);
	if (!t) {
		sl_error("out of memory for training_metrics.json");
		abort();
	}
}

/* entry @o (its reference taken) as one line of text at the end of @l */
static void texts_add(struct sl_metrics *m, struct text_list *l, json_t *o)
{
	char *t = json_dumps(o, ENTRY_FLAGS);

	json_decref(o);
	text_push(m, l, t);
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

/* @v in decimal at @p; the end */
static char *put_ll(char *p, long long v)
{
	char d[24];
	int n = 0;
	unsigned long long u = v < 0 ? 0ULL - (unsigned long long)v : (unsigned long long)v;

	if (v < 0)
		*p++ = '-';
	do
		d[n++] = (char)('0' + u % 10);
	while (u /= 10);
	while (n)
		*p++ = d[--n];
	return p;
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
	if (!(s->moe_layers > 0 && s->n_experts > 0 && s->expert_tokens)) {
		if (s->capacity)
			json_object_set_new(o, "dropped_tokens", json_integer(s->dropped_tokens));
		texts_add(m, &m->steps, o);
		return;
	}
	/* the expert counts (thousands of integers a step) printed here rather than as jansson
	 * values (1.5 ms a step at 48 layers of 128 experts): the line above without its closing
	 * brace, then "expert_tokens" (per layer the least and most loaded expert and all routed
	 * tokens, k per token; every expert's count) and "dropped_tokens" */
	const int L = s->moe_layers, E = s->n_experts;
	const long long *c = s->expert_tokens;
	char *head = json_dumps(o, ENTRY_FLAGS), *t = NULL, *p;

	json_decref(o);
	/* at most 21 characters a number and its comma; the keys, brackets and dropped_tokens */
	if (head)
		t = malloc(strlen(head) + ((size_t)L * (E + 3)) * 21 + 4 * (size_t)L + 128);
	if (t) {
		p = t + sprintf(t, "%.*s,\"expert_tokens\":{", (int)strlen(head) - 1, head);
		for (int k = 0; k < 3; k++) {
			p += sprintf(p, "\"%s\":[", k == 0 ? "min" : k == 1 ? "max" : "total");
			for (int l = 0; l < L; l++) {
				long long v = c[(size_t)l * E];

				for (int e = 1; e < E; e++) {
					const long long x = c[(size_t)l * E + e];

					v = k == 0 ? (x < v ? x : v) : k == 1 ? (x > v ? x : v) : v + x;
				}
				if (l)
					*p++ = ',';
				p = put_ll(p, v);
			}
			p = stpcpy(p, "],");
		}
		p = stpcpy(p, "\"per_expert\":[");
		for (int l = 0; l < L; l++) {
			p = stpcpy(p, l ? ",[" : "[");
			for (int e = 0; e < E; e++) {
				if (e)
					*p++ = ',';
				p = put_ll(p, c[(size_t)l * E + e]);
			}
			*p++ = ']';
		}
		p = stpcpy(p, "]}");
		if (s->capacity)
			p += sprintf(p, ",\"dropped_tokens\":%lld", s->dropped_tokens);
		p = stpcpy(p, "}");
		char *shrunk = realloc(t, p - t + 1);	/* kept for the run: no slack */

		if (shrunk)
			t = shrunk;
	}
	free(head);
	text_push(m, &m->steps, t);
}

void sl_metrics_add_eval(struct sl_metrics *m, int step, double loss, long records)
{
	json_t *o = json_object();

	json_object_set_new(o, "step", json_integer(step));
	json_object_set_new(o, "loss", num(loss));
	json_object_set_new(o, "records", json_integer(records));
	texts_add(m, &m->eval, o);
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
			texts_add(m, &m->steps, json_incref(e));
			kept++;
		}
	}
	arr = json_object_get(old, "eval");
	json_array_foreach(arr, i, e)
		if (json_integer_value(json_object_get(e, "step")) <= max_step)
			texts_add(m, &m->eval, json_incref(e));
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
	texts_add(m, &m->eval, o);
}

/* a written temporary file @tmp in place of @path (@ret 0: it was written whole), else removed;
 * 0 or -1 */
static int commit_tmp(const char *tmp, const char *path, int ret)
{
	if (ret == 0 && rename(tmp, path) != 0) {
		sl_error("cannot rename %s to %s: %s", tmp, path, strerror(errno));
		ret = -1;
	}
	if (ret)
		unlink(tmp);
	return ret;
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
	return commit_tmp(tmp, path, ret);
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

/* the document's entries ("steps" or "eval": @n lines of @v) as a JSON array */
static void put_entries(FILE *f, const char *key, char *const *v, size_t n, bool last)
{
	fprintf(f, " \"%s\": [", key);
	for (size_t i = 0; i < n; i++)
		fprintf(f, "%s\n  %s", i ? "," : "", v[i]);
	fprintf(f, "%s]%s\n", n ? "\n " : "", last ? "" : ",");
}

/* training_metrics.json from the run object's text and the entries: temp file, fsync, rename */
static int write_doc(const char *path, const char *run, char *const *steps, size_t ns,
		     char *const *eval, size_t ne)
{
	char tmp[SL_PATH_MAX + 16];
	FILE *f;
	int ret = -1;

	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	f = fopen(tmp, "w");
	if (!f) {
		sl_error("cannot write %s: %s", tmp, strerror(errno));
		return -1;
	}
	setvbuf(f, NULL, _IOFBF, 1 << 20);
	fprintf(f, "{\n \"run\": %s,\n", run);
	put_entries(f, "steps", steps, ns, false);
	put_entries(f, "eval", eval, ne, true);
	fputs("}\n", f);
	if (fflush(f) != 0 || ferror(f))
		sl_error("cannot write %s: %s", tmp, strerror(errno));
	else if (fsync(fileno(f)) != 0)
		sl_error("cannot sync %s: %s", tmp, strerror(errno));
	else
		ret = 0;
	if (fclose(f) != 0 && ret == 0) {
		sl_error("cannot write %s: %s", tmp, strerror(errno));
		ret = -1;
	}
	return commit_tmp(tmp, path, ret);
}

/* the run object's text, indented as a member of the document (the caller frees it); NULL: out
 * of memory */
static char *run_text(const struct sl_metrics *m)
{
	char *t = json_dumps(m->run, JSON_INDENT(1) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17));
	size_t n = 0, lines = 0;
	char *out, *o;

	if (!t)
		return NULL;
	for (; t[n]; n++)
		lines += t[n] == '\n';
	out = malloc(n + lines + 1);
	if (out) {
		o = out;
		for (size_t i = 0; i < n; i++) {
			*o++ = t[i];
			if (t[i] == '\n')
				*o++ = ' ';
		}
		*o = 0;
	}
	free(t);
	return out;
}

/* copies of the first @n pointers of @l (under the lock); NULL: out of memory (n > 0) */
static char **texts_copy(const struct text_list *l, size_t n)
{
	char **v = malloc((n ? n : 1) * sizeof(*v));

	if (v && n)
		memcpy(v, l->v, n * sizeof(*v));
	return v;
}

static void *writer(void *arg)
{
	struct sl_metrics *m = arg;

	pthread_mutex_lock(&m->lock);
	for (;;) {
		while (!m->pend_run && !m->stop)
			pthread_cond_wait(&m->wake, &m->lock);
		if (!m->pend_run)
			break;
		char *run = m->pend_run;
		const size_t ns = m->pend_steps, ne = m->pend_eval;
		char **sv = texts_copy(&m->steps, ns), **ev = texts_copy(&m->eval, ne);
		int r = -1;

		m->pend_run = NULL;
		m->busy = true;
		pthread_mutex_unlock(&m->lock);
		if (sv && ev)
			r = write_doc(m->path, run, sv, ns, ev, ne);
		else
			sl_error("out of memory writing %s", m->path);
		free(sv);
		free(ev);
		free(run);
		pthread_mutex_lock(&m->lock);
		m->busy = false;
		if (r)
			m->error = 1;
		pthread_cond_broadcast(&m->idle);
	}
	pthread_mutex_unlock(&m->lock);
	return NULL;
}

int sl_metrics_write(struct sl_metrics *m)
{
	char *run;
	int ret;

	if (sl_metrics_flush(m))
		return -1;
	run = run_text(m);
	if (!run) {
		sl_error("out of memory writing %s", m->path);
		return -1;
	}
	/* (no thread is writing: the flush waited for it, and only this thread hands it work) */
	ret = write_doc(m->path, run, m->steps.v, m->steps.n, m->eval.v, m->eval.n);
	free(run);
	return ret;
}

int sl_metrics_write_async(struct sl_metrics *m)
{
	char *run = run_text(m);
	int ret;

	if (!run) {
		sl_error("out of memory writing %s", m->path);
		return -1;
	}
	pthread_mutex_lock(&m->lock);
	if (!m->started) {
		if (pthread_create(&m->thread, NULL, writer, m) != 0) {
			pthread_mutex_unlock(&m->lock);
			free(run);
			return sl_metrics_write(m);	/* no thread: write it here */
		}
		m->started = true;
	}
	free(m->pend_run);	/* a document the thread had not started on: this one is newer */
	m->pend_run = run;
	m->pend_steps = m->steps.n;
	m->pend_eval = m->eval.n;
	pthread_cond_signal(&m->wake);
	ret = m->error ? -1 : 0;
	pthread_mutex_unlock(&m->lock);
	return ret;
}

int sl_metrics_flush(struct sl_metrics *m)
{
	int ret;

	pthread_mutex_lock(&m->lock);
	while (m->started && (m->pend_run || m->busy))
		pthread_cond_wait(&m->idle, &m->lock);
	ret = m->error ? -1 : 0;
	pthread_mutex_unlock(&m->lock);
	return ret;
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
