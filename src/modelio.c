/*
 * modelio: Hugging Face model files in and out (see modelio.h).
 */
#include "modelio.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"
#include "fsutil.h"
#include "safetensors.h"

int sl_model_files_open(struct sl_model_files *f, const char *path, const char *revision,
			int task)
{
	char cj[SL_PATH_MAX + 16];

	memset(f, 0, sizeof(*f));
	if (sl_hf_resolve(path, revision, f->dir, sizeof(f->dir)))
		return -1;
	snprintf(cj, sizeof(cj), "%s/config.json", f->dir);
	if (sl_model_config_load(&f->mc, cj))
		return -1;
	f->have_mc = true;
	f->task = task;
	if (sl_model_layout(&f->mc, task, &f->lay)) {
		sl_model_files_close(f);
		return -1;
	}
	f->have_lay = true;
	return 0;
}

void sl_model_files_close(struct sl_model_files *f)
{
	if (f->have_lay)
		sl_layout_free(&f->lay);
	if (f->have_mc)
		sl_model_config_free(&f->mc);
	f->have_lay = f->have_mc = false;
}

int sl_model_files_load_shard(struct sl_model_files *f, struct sl_shard *sh, uint64_t seed,
			      int *n_initialized)
{
	const struct sl_layout *lay = &f->lay;
	struct sl_weights w;
	float *buf = NULL;
	bool *init = NULL;
	int ret = -1, n_unused = 0, n_vision = 0, first = 0;

	*n_initialized = 0;
	if (sl_weights_open(&w, f->dir))
		return -1;
	/* one unit at a time: a sub-layout of the unit's tensors, placed at unit 0 */
	for (int u = 0; u < lay->n_units; u++) {
		struct sl_layout sub = { 0 };
		size_t numel = lay->unit_numel[u];
		int n = 0, n_init = 0;

		while (first + n < lay->n_tensors && lay->t[first + n].unit == u)
			n++;
		sub.n_tensors = n;
		sub.t = calloc(n ? n : 1, sizeof(*sub.t));
		sub.n_units = 1;
		sub.unit_numel = &numel;
		sub.total_numel = numel;
		for (int i = 0; i < n; i++) {
			sub.t[i] = lay->t[first + i];
			sub.t[i].unit = 0;
		}
		free(buf);
		free(init);
		buf = calloc(numel ? numel : 1, sizeof(float));
		init = calloc(n ? n : 1, sizeof(bool));
		if (!buf || !init || !sub.t) {
			sl_error("out of host memory loading %s", f->dir);
			free(sub.t);
			goto out;
		}
		if (sl_weights_load_layout(&w, &sub, &buf, f->mc.initializer_range, seed, init,
					   &n_init, NULL)) {
			free(sub.t);
			goto out;
		}
		for (int i = 0; i < n; i++)
			if (init[i])
				sl_log("%s has no %s: initialized it (normal, std %g = "
				       "initializer_range)", f->dir, sub.t[i].name,
				       f->mc.initializer_range);
		*n_initialized += n_init;
		sl_shard_load_unit(sh, u, buf);
		free(sub.t);
		first += n;
	}
	for (int i = 0; i < w.n_tensors; i++) {
		const char *n = w.tensors[i].name;
		char alt[256];

		/* the published Qwen3.5 layout: the language model under model.language_model. */
		if (!strncmp(n, "model.language_model.", 21)) {
			snprintf(alt, sizeof(alt), "model.%s", n + 21);
			n = alt;
		}
		/* fused expert tensors (transformers 5) were read through their per-expert names */
		if (sl_layout_find(lay, n) || strstr(n, ".mlp.experts.gate_up_proj") ||
		    strstr(n, ".mlp.experts.down_proj"))
			continue;
		n_unused++;
		n_vision += !strncmp(n, "model.visual.", 13);
	}
	if (n_vision)
		sl_log("%s: the vision tower (%d tensors, model.visual.*) is not loaded: shardlm "
		       "trains the language model", f->dir, n_vision);
	n_unused -= n_vision;
	if (n_unused)
		sl_log("%s: %d tensor(s) of the checkpoint are not used by the %s task "
		       "(e.g. %s)", f->dir, n_unused, f->task ? "sft" : "classify",
		       f->task ? "a classification head" : "a causal-LM head");
	ret = 0;
out:
	free(buf);
	free(init);
	sl_weights_close(&w);
	return ret;
}

static void file_name(char *buf, size_t len, int k, int n)
{
	if (n == 1)
		snprintf(buf, len, "model.safetensors");
	else
		snprintf(buf, len, "model-%05d-of-%05d.safetensors", k + 1, n);
}

/*
 * The classes transformers has for a model_type's exports: the classifier
 * (*ForSequenceClassification) and the causal LM.  The Qwen3.5 families are exported as their text models (qwen3_5_text,
 * qwen3_5_moe_text), whose causal LM is Qwen3_5ForCausalLM / Qwen3_5MoeForCausalLM.
 */
static const char *hf_class(const char *model_type, bool lm)
{
	static const struct { const char *type, *cls, *lm; } t[] = {
		{ "qwen3", "Qwen3ForSequenceClassification", "Qwen3ForCausalLM" },
		{ "qwen3_moe", "Qwen3MoeForSequenceClassification", "Qwen3MoeForCausalLM" },
		{ "qwen3_5_text", "Qwen3_5TextForSequenceClassification", "Qwen3_5ForCausalLM" },
		{ "qwen3_5", "Qwen3_5TextForSequenceClassification", "Qwen3_5ForCausalLM" },
		/* transformers 5.17 has no Qwen3.5-MoE classifier: the name follows the others' */
		{ "qwen3_5_moe_text", "Qwen3_5MoeTextForSequenceClassification",
		  "Qwen3_5MoeForCausalLM" },
		{ "qwen3_5_moe", "Qwen3_5MoeTextForSequenceClassification",
		  "Qwen3_5MoeForCausalLM" },
	};

	for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++)
		if (!strcmp(t[i].type, model_type))
			return lm ? t[i].lm : t[i].cls;
	return lm ? "Qwen3ForCausalLM" : "Qwen3ForSequenceClassification";
}

/* rank 0: config.json with the task's architecture, the index, the tokenizer files */
static int write_meta(const char *dir, const struct sl_model_files *f, int n_files,
		      enum sl_precision dtype)
{
	static const char *const tok_files[] = { "tokenizer.json", "tokenizer_config.json",
						 "vocab.json", "merges.txt",
						 "special_tokens_map.json", "generation_config.json",
						 "chat_template.jinja" };
	char p[2 * SL_PATH_MAX], q[2 * SL_PATH_MAX], name[64];
	const struct sl_layout *lay = &f->lay;
	json_error_t jerr;
	json_t *cj;
	int ret = 0;

	snprintf(p, sizeof(p), "%s/config.json", f->dir);
	cj = json_load_file(p, 0, &jerr);
	if (!cj) {
		sl_error("%s:%d: %s", p, jerr.line, jerr.text);
		return -1;
	}
	if (!strcmp(f->mc.model_type, "qwen3_5") || !strcmp(f->mc.model_type, "qwen3_5_moe")) {
		/* the language model alone: its text_config as a qwen3_5(_moe)_text config */
		json_t *tc = json_deep_copy(json_object_get(cj, "text_config"));

		if (!json_is_object(tc)) {
			json_decref(tc);
			json_decref(cj);
			sl_error("%s: text_config is missing", p);
			return -1;
		}
		json_object_set_new(tc, "model_type",
				    json_string(strcmp(f->mc.model_type, "qwen3_5") ?
						"qwen3_5_moe_text" : "qwen3_5_text"));
		json_object_set(tc, "tie_word_embeddings",
				json_boolean(f->mc.tie_word_embeddings));
		json_decref(cj);
		cj = tc;
	}
	json_object_set_new(cj, "architectures", json_pack("[s]", hf_class(f->mc.model_type,
									     f->task)));
	if (!f->task) {
		json_object_set_new(cj, "num_labels", json_integer(1));
		json_object_set_new(cj, "id2label", json_pack("{s:s}", "0", "LABEL_0"));
		json_object_set_new(cj, "label2id", json_pack("{s:i}", "LABEL_0", 0));
	} else {
		json_object_del(cj, "num_labels");
		json_object_del(cj, "id2label");
		json_object_del(cj, "label2id");
	}
	json_object_set_new(cj, "dtype", json_string(dtype == SL_PREC_FP32 ? "float32" : "bfloat16"));
	/* transformers batches sequence classification only with a pad token */
	if (!f->task && f->mc.pad_token_id < 0)
		json_object_set_new(cj, "pad_token_id",
				    json_integer(f->mc.eos_token_id >= 0 ? f->mc.eos_token_id : 0));
	snprintf(p, sizeof(p), "%s/config.json", dir);
	if (json_dump_file(cj, p, JSON_INDENT(2) | JSON_PRESERVE_ORDER)) {
		sl_error("cannot write %s", p);
		ret = -1;
	}
	json_decref(cj);
	if (ret)
		return ret;

	if (n_files > 1) {
		json_t *idx = json_object(), *map = json_object(), *meta = json_object();
		size_t bytes = 0;

		for (int i = 0; i < lay->n_tensors; i++) {
			file_name(name, sizeof(name), lay->t[i].unit % n_files, n_files);
			json_object_set_new(map, lay->t[i].name, json_string(name));
			bytes += lay->t[i].numel * (dtype == SL_PREC_FP32 ? 4 : 2);
		}
		json_object_set_new(meta, "total_size", json_integer(bytes));
		json_object_set_new(idx, "metadata", meta);
		json_object_set_new(idx, "weight_map", map);
		snprintf(p, sizeof(p), "%s/model.safetensors.index.json", dir);
		if (json_dump_file(idx, p, JSON_INDENT(2) | JSON_PRESERVE_ORDER)) {
			sl_error("cannot write %s", p);
			ret = -1;
		}
		json_decref(idx);
	}
	for (size_t i = 0; i < sizeof(tok_files) / sizeof(tok_files[0]) && !ret; i++) {
		struct stat st;

		snprintf(p, sizeof(p), "%s/%s", f->dir, tok_files[i]);
		snprintf(q, sizeof(q), "%s/%s", dir, tok_files[i]);
		if (stat(p, &st) == 0 && S_ISREG(st.st_mode) && sl_copy_file(p, q)) {
			sl_error("cannot copy %s to %s", p, q);
			ret = -1;
		}
	}
	return ret;
}

static int write_my_file(const char *dir, const struct sl_model_files *f, float *const *units,
			 int k, int n_files, enum sl_precision dtype)
{
	const struct sl_layout *lay = &f->lay;
	struct sl_st_out *t = calloc(lay->n_tensors, sizeof(*t));
	char p[2 * SL_PATH_MAX], name[64];
	int n = 0, ret;

	for (int i = 0; i < lay->n_tensors; i++) {
		const struct sl_tensor_info *ti = &lay->t[i];

		if (ti->unit % n_files != k)
			continue;
		t[n].name = ti->name;
		t[n].ndim = ti->ndim;
		t[n].shape[0] = ti->shape[0];
		t[n].shape[1] = ti->shape[1];
		if (ti->unsqueeze1) {	/* a Conv1d weight: (C, 1, K) in HF files */
			t[n].ndim = 3;
			t[n].shape[1] = 1;
			t[n].shape[2] = ti->shape[1];
		}
		t[n].data = units[ti->unit] + ti->offset;
		n++;
	}
	file_name(name, sizeof(name), k, n_files);
	snprintf(p, sizeof(p), "%s/%s", dir, name);
	ret = sl_st_write(p, t, n, dtype == SL_PREC_FP32 ? SL_DT_F32 : SL_DT_BF16);
	free(t);
	return ret;
}

int sl_model_export(const char *out_dir, const struct sl_model_files *f, float *const *units,
		    enum sl_precision dtype, MPI_Comm comm)
{
	char tmp[SL_PATH_MAX + 16];
	int rank, size, n_files, ok = 1, all_ok;

	MPI_Comm_rank(comm, &rank);
	MPI_Comm_size(comm, &size);
	n_files = size < f->lay.n_units ? size : f->lay.n_units;
	snprintf(tmp, sizeof(tmp), "%s.tmp", out_dir);
	if (rank == 0)
		ok = sl_mkdir_p(tmp) == 0 && write_meta(tmp, f, n_files, dtype) == 0;
	MPI_Bcast(&ok, 1, MPI_INT, 0, comm);
	if (!ok)
		return -1;
	if (rank < n_files)
		ok = write_my_file(tmp, f, units, rank, n_files, dtype) == 0;
	MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, comm);
	if (!all_ok)
		return -1;
	if (rank == 0) {
		char aside[SL_PATH_MAX + 32];
		struct stat st;

		/* an earlier export of this run stays beside it rather than being deleted */
		if (stat(out_dir, &st) == 0 && sl_move_aside(out_dir, aside, sizeof(aside)))
			ok = 0;
		if (ok && rename(tmp, out_dir) != 0) {
			sl_error("cannot rename %s to %s: %s", tmp, out_dir, strerror(errno));
			ok = 0;
		}
	}
	MPI_Bcast(&ok, 1, MPI_INT, 0, comm);
	return ok ? 0 : -1;
}

int sl_model_gather_for_export(struct sl_shard *sh, int n_files, float ***units_out)
{
	float **units = calloc(sh->n_units, sizeof(float *));

	for (int u = 0; u < sh->n_units; u++) {
		int owner = u % n_files;

		if (owner == sh->shard_rank)
			units[u] = malloc(sh->lay->unit_numel[u] * sizeof(float));
		if (sl_shard_gather_unit(sh, u, units[u], owner)) {
			sl_model_free_units(units, sh->n_units);
			return -1;
		}
	}
	*units_out = units;
	return 0;
}

void sl_model_free_units(float **units, int n_units)
{
	if (!units)
		return;
	for (int u = 0; u < n_units; u++)
		free(units[u]);
	free(units);
}
