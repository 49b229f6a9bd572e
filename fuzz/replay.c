/*
 * replay: runs a harness's LLVMFuzzerTestOneInput once on each file named on the command line,
 * without libFuzzer, so CI replays the committed corpora with the project's own compiler and
 * sanitizers.  Exit status 0 when every input ran (a sanitizer report or abort ends it non-zero).
 * Built by including a harness and then this file (test/fuzz_replay.c).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
/* SL_FUZZ_INIT: the harness (included before this file) has an LLVMFuzzerInitialize */
int LLVMFuzzerInitialize(int *argc, char ***argv);

static int run_file(const char *path)
{
	FILE *f = fopen(path, "rb");
	uint8_t *buf = NULL;
	long n;

	if (!f || fseek(f, 0, SEEK_END) || (n = ftell(f)) < 0 || fseek(f, 0, SEEK_SET)) {
		fprintf(stderr, "replay: %s: cannot read it\n", path);
		if (f)
			fclose(f);
		return -1;
	}
	buf = malloc(n ? n : 1);
	if (!buf || fread(buf, 1, n, f) != (size_t)n) {
		fprintf(stderr, "replay: %s: short read\n", path);
		free(buf);
		fclose(f);
		return -1;
	}
	fclose(f);
	LLVMFuzzerTestOneInput(buf, n);
	free(buf);
	return 0;
}

int main(int argc, char **argv)
{
	int bad = 0;

#ifdef SL_FUZZ_INIT
	LLVMFuzzerInitialize(&argc, &argv);
#endif
	for (int i = 1; i < argc; i++)
		bad |= run_file(argv[i]) != 0;
	printf("replay: %d input(s)\n", argc - 1);
	return bad;
}
