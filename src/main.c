/*
 * main.c: argv -> subcommand; nothing else.
 */
#include "sl_build.h"

#include <stdio.h>
#include <string.h>

#include "plan.h"
#include "tokenizer.h"
#include "train.h"

static void usage(FILE *out)
{
	fprintf(out,
		"shardlm %s: distributed fine-tuning of Qwen3-family models\n"
		"usage: shardlm COMMAND ...\n"
		"  train CONFIG [--set KEY=VALUE]... [--fresh]   train (mpirun/srun: one rank per GPU)\n"
		"  score CONFIG [--set KEY=VALUE]... --data FILE [--model DIR]\n"
		"                                                one JSON line per record\n"
		"  config CONFIG [--set KEY=VALUE]...           validate and print the resolved config\n"
		"  tokenize --tokenizer PATH [--split-special]  JSONL text in, token ids out\n"
		"  export CHECKPOINT --out DIR                   a checkpoint as a Hugging Face model\n"
		"  plan CONFIG [--gpus N] [--gpu-mem GB] [--host-mem GB]\n"
		"                                                memory per GPU and node: does it fit?\n"
		"train's exit status: 0 done, 1 aborted (a rank died or hung), 2 error, 3 stopped by a\n"
		"signal after a checkpoint (resubmit to resume), 4 train.max_bad_steps non-finite steps,\n"
		"128+N signal N without a new checkpoint (README: Exit status)\n",
		PACKAGE_VERSION);
}

int main(int argc, char **argv)
{
	const char *cmd = argc > 1 ? argv[1] : "";

	if (strcmp(cmd, "train") == 0)
		return sl_cmd_train(argc - 1, argv + 1);
	if (strcmp(cmd, "score") == 0)
		return sl_cmd_score(argc - 1, argv + 1);
	if (strcmp(cmd, "config") == 0)
		return sl_cmd_config(argc - 1, argv + 1);
	if (strcmp(cmd, "--version") == 0 || strcmp(cmd, "version") == 0) {
		printf("shardlm %s (%s)\n", PACKAGE_VERSION, SL_GIT_COMMIT);
		return 0;
	}
	if (strcmp(cmd, "-h") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "help") == 0) {
		usage(stdout);
		return 0;
	}
	if (strcmp(cmd, "tokenize") == 0)
		return sl_cmd_tokenize(argc - 1, argv + 1);
	if (strcmp(cmd, "export") == 0)
		return sl_cmd_export(argc - 1, argv + 1);
	if (strcmp(cmd, "plan") == 0)
		return sl_cmd_plan(argc - 1, argv + 1);
	if (*cmd)
		fprintf(stderr, "shardlm: unknown command '%s'\n", cmd);
	usage(stderr);
	return 2;
}
