/*
 * train_cmd: what the commands of train.h share (their command line, the settings this version
 * refuses, the checkpoint root of a run) and `shardlm config`, which checks a config and prints
 * the resolved table.
 */
#define _GNU_SOURCE
#include "sl_build.h"
#include "train.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"

static void usage(const char *cmd)
{
	if (strcmp(cmd, "score") == 0)
		fprintf(stderr, "usage: shardlm score CONFIG [--set KEY=VALUE]... --data FILE "
			"[--model DIR|CHECKPOINT]\n");
	else if (strcmp(cmd, "train") == 0)
		fprintf(stderr, "usage: shardlm train CONFIG [--set KEY=VALUE]... [--fresh]\n");
	else if (strcmp(cmd, "export") == 0)
		fprintf(stderr, "usage: shardlm export CHECKPOINT --out DIR\n");
	else
		fprintf(stderr, "usage: shardlm config CONFIG [--set KEY=VALUE]...\n");
}

int sl_cmd_parse(const char *cmd, int argc, char **argv, struct sl_cmd_args *a)
{
	bool is_score = strcmp(cmd, "score") == 0, is_export = strcmp(cmd, "export") == 0;

	memset(a, 0, sizeof(*a));
	for (int i = 1; i < argc; i++) {
		const char *s = argv[i];
		const char **value = NULL;

		if (!is_export && (strcmp(s, "--set") == 0 || strncmp(s, "--set=", 6) == 0)) {
			const char *kv = s[5] == '=' ? s + 6 : (i + 1 < argc ? argv[++i] : NULL);

			if (!kv || !strchr(kv, '=')) {
				sl_error("--set needs KEY=VALUE, e.g. --set train.batch=2");
				return -1;
			}
			if (a->nset == SL_MAX_SET) {
				sl_error("more than %d --set options", SL_MAX_SET);
				return -1;
			}
			a->set[a->nset++] = (char *)kv;
			continue;
		}
		if (strcmp(s, "--fresh") == 0 && strcmp(cmd, "train") == 0) {
			a->fresh = true;
			continue;
		}
		if (is_score && strcmp(s, "--data") == 0)
			value = &a->data;
		else if (is_score && strcmp(s, "--model") == 0)
			value = &a->model;
		else if (is_export && strcmp(s, "--out") == 0)
			value = &a->out;
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
		if (is_export ? a->checkpoint != NULL : a->config != NULL) {
			sl_error("one %s only ('%s' and '%s')", is_export ? "checkpoint" :
				 "config file", is_export ? a->checkpoint : a->config, s);
			usage(cmd);
			return -1;
		}
		if (is_export)
			a->checkpoint = s;
		else
			a->config = s;
	}
	if (is_export ? !a->checkpoint || !a->out : !a->config) {
		sl_error(is_export ? "export needs CHECKPOINT and --out DIR" :
			 "no config file given");
		usage(cmd);
		return -1;
	}
	if (is_score && !a->data) {
		sl_error("score needs --data FILE");
		usage(cmd);
		return -1;
	}
	return 0;
}

int sl_check_supported(const struct sl_config *c, bool training)
{
	if (c->parallel.expert > 1 && c->parallel.offload != SL_OFFLOAD_NONE && training) {
		sl_error("%s: parallel.offload with parallel.expert > 1 is not in this version; set "
			 "parallel.offload: none or parallel.expert: 1", c->source);
		return -1;
	}
#ifndef SL_HAVE_CUDA
	if (c->backend == SL_BACKEND_CUDA && training) {
		sl_error("%s: backend: cuda, but this shardlm was built without CUDA; configure "
			 "--with-cuda on a machine with the CUDA toolkit, or set backend: cpu",
			 c->source);
		return -1;
	}
#endif
	if (c->backend == SL_BACKEND_CUDA && c->precision.compute == SL_PREC_FP32) {
		sl_error("%s: precision.compute: fp32 on the cuda backend is not supported (it "
			 "computes in bf16 with fp32 accumulation); set precision.compute: auto",
			 c->source);
		return -1;
	}
	if (c->backend == SL_BACKEND_CPU && c->precision.compute == SL_PREC_BF16) {
		sl_error("%s: precision.compute: bf16 needs the cuda backend; the cpu backend "
			 "computes in fp32 (set precision.compute: auto or fp32)", c->source);
		return -1;
	}
	if (!training)
		return 0;
	if (c->data.pack && c->task != SL_TASK_SFT) {
		sl_error("%s: data.pack applies to task sft only; set data.pack: false",
			 c->source);
		return -1;
	}
	return 0;
}

void sl_checkpoint_root(const struct sl_config *c, char *buf, size_t n)
{
	int len;

	if (c->checkpoint.dir[0] == '/')
		len = snprintf(buf, n, "%s", c->checkpoint.dir);
	else
		len = snprintf(buf, n, "%s/%s", c->run.dir, c->checkpoint.dir);
	if (len >= (int)n)
		sl_warn("checkpoint path cut to %s", buf);
}

int sl_cmd_config(int argc, char **argv)
{
	struct sl_cmd_args a;
	struct sl_config *c = calloc(1, sizeof(*c));
	int ret;

	ret = sl_cmd_parse("config", argc, argv, &a);
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
