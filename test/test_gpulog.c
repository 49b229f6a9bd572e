/*
 * test_gpulog: the GPU log sampler against a fake NVML (fake_nvml.c, scripted values): the job's
 * GPUs picked by PCI bus id in both spellings, the exact lines written, the file name's %j and %h,
 * no NVML at all, and the log reduced by shardlm-util to the hand-computed averages and peaks.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "gpulog.h"
#include "testutil.h"

static char dir[] = "/tmp/sl-gpulog-XXXXXX";

static int count_lines(const char *path)
{
	FILE *f = fopen(path, "r");
	int n = 0, c;

	if (!f)
		return 0;
	while ((c = getc(f)) != EOF)
		n += c == '\n';
	fclose(f);
	return n;
}

static void short_host(char *buf, size_t n)
{
	gethostname(buf, n - 1);
	buf[n - 1] = 0;
	buf[strcspn(buf, ".")] = 0;
}

/* "2026/11/29 16:05:01.123" -> seconds since the epoch (local time), -1 if malformed */
static double parse_ts(const char *s)
{
	struct tm tm = { 0 };
	int ms, used = 0;

	if (sscanf(s, "%4d/%2d/%2d %2d:%2d:%2d.%3d%n", &tm.tm_year, &tm.tm_mon, &tm.tm_mday,
		   &tm.tm_hour, &tm.tm_min, &tm.tm_sec, &ms, &used) != 7 || used != 23)
		return -1;
	tm.tm_year -= 1900;
	tm.tm_mon -= 1;
	tm.tm_isdst = -1;
	return mktime(&tm) + ms / 1000.0;
}

static void check_reduced(const char *log)
{
	char cmd[8192], trimmed[4096];
	FILE *in = fopen(log, "r"), *out, *p;
	char line[512];
	json_error_t err;
	json_t *j, *g0, *g1;

	/* the first three samples of each GPU: header + 6 lines */
	snprintf(trimmed, sizeof(trimmed), "%s/first3.csv", dir);
	out = fopen(trimmed, "w");
	for (int i = 0; in && out && i < 7 && fgets(line, sizeof(line), in); i++)
		fputs(line, out);
	if (in)
		fclose(in);
	if (out)
		fclose(out);
	snprintf(cmd, sizeof(cmd), "%s/tools/shardlm-util --json %s", test_builddir(), trimmed);
	p = popen(cmd, "r");
	j = p ? json_loadf(p, 0, &err) : NULL;
	CHECK(p && pclose(p) == 0, "%s failed", cmd);
	CHECK(j, "shardlm-util printed no JSON");
	if (!j)
		return;
	/* by hand: GPU 0 read 0,1,2 % and 1000..1002 MiB; GPU 2 read 20,21,22 % and 1200..1202 */
	CHECK_CLOSE(json_number_value(json_object_get(j, "avg_util")), 11.0, 0, 1e-9);
	CHECK(json_integer_value(json_object_get(j, "peak_util")) == 22);
	CHECK(json_integer_value(json_object_get(j, "peak_mem_mib")) == 1202);
	CHECK(json_integer_value(json_object_get(j, "samples")) == 6);
	CHECK(json_array_size(json_object_get(j, "gpus")) == 2);
	g0 = json_array_get(json_object_get(j, "gpus"), 0);
	g1 = json_array_get(json_object_get(j, "gpus"), 1);
	CHECK(json_integer_value(json_object_get(g0, "index")) == 0);
	CHECK_CLOSE(json_number_value(json_object_get(g0, "avg_util")), 1.0, 0, 1e-9);
	CHECK(json_integer_value(json_object_get(g0, "peak_util")) == 2);
	CHECK(json_integer_value(json_object_get(g0, "peak_mem_mib")) == 1002);
	CHECK(json_integer_value(json_object_get(g1, "index")) == 2);
	CHECK_CLOSE(json_number_value(json_object_get(g1, "avg_util")), 21.0, 0, 1e-9);
	CHECK(json_integer_value(json_object_get(g1, "peak_util")) == 22);
	CHECK(json_integer_value(json_object_get(g1, "peak_mem_mib")) == 1202);
	json_decref(j);
}

static void test_sampler(const char *fake)
{
	const char *const gpus[] = { "00000000:07:00.0", "0000:1b:00.0", "0000:1B:00.0" };
	char pattern[4200], path[4200], host[256], line[512], want[512];
	struct sl_gpulog *g;
	double t0 = time(NULL) - 1, prev = 0;
	FILE *f;

	short_host(host, sizeof(host));
	setenv("SHARDLM_NVML_LIB", fake, 1);
	setenv("SLURM_JOB_ID", "4242", 1);
	snprintf(pattern, sizeof(pattern), "%s/logs/deeper/gpu-%%j-%%h.csv", dir);
	snprintf(path, sizeof(path), "%s/logs/deeper/gpu-4242-%s.csv", dir, host);
	/* the third entry repeats the second GPU (two ranks on one GPU): logged once */
	g = sl_gpulog_start(pattern, 0.05, gpus, 3);
	CHECK(g, "sampler did not start with the fake NVML %s", fake);
	if (!g)
		return;
	CHECK(!strcmp(sl_gpulog_path(g), path), "path %s, expected %s", sl_gpulog_path(g), path);
	for (int i = 0; i < 200 && count_lines(path) < 7; i++)
		usleep(25000);
	sl_gpulog_stop(g);

	f = fopen(path, "r");
	CHECK(f, "no log file %s", path);
	if (!f)
		return;
	CHECK(fgets(line, sizeof(line), f) &&
	      !strcmp(line, "timestamp, index, memory.used [MiB], utilization.gpu [%], host\n"),
	      "header: %s", line);
	for (int k = 0; k < 3; k++) {
		for (int d = 0; d < 3; d += 2) {
			double t;

			if (!fgets(line, sizeof(line), f)) {
				CHECK(0, "log has fewer than 3 samples per GPU");
				goto out_close;
			}
			t = parse_ts(line);
			CHECK(t >= t0 && t <= time(NULL) + 1, "timestamp of '%s'", line);
			if (d == 0 && k > 0)
				CHECK(t - prev >= 0.03, "samples %.3f s apart, asked for 0.05", t - prev);
			if (d == 0)
				prev = t;
			snprintf(want, sizeof(want), ", %d, %d MiB, %d %%, %s\n", d,
				 1000 + 100 * d + k, 10 * d + k, host);
			CHECK(strlen(line) > 23 && !strcmp(line + 23, want), "line '%s', expected "
			      "'<time>%s'", line, want);
		}
	}
out_close:
	fclose(f);
	check_reduced(path);
}

static void test_no_nvml(void)
{
	const char *const gpus[] = { "0000:07:00.0" };
	char pattern[4200], path[4200];
	struct stat st;

	setenv("SHARDLM_NVML_LIB", "/nonexistent/libnvidia-ml.so.1", 1);
	snprintf(pattern, sizeof(pattern), "%s/none/gpu.csv", dir);
	snprintf(path, sizeof(path), "%s/none", dir);
	CHECK(sl_gpulog_start(pattern, 0.05, gpus, 1) == NULL, "started without NVML");
	CHECK(stat(path, &st) != 0, "made %s without NVML", path);
}

static void test_unmatched(const char *fake)
{
	const char *const gpus[] = { "0000:99:00.0", "7" };
	char pattern[4200];

	setenv("SHARDLM_NVML_LIB", fake, 1);
	snprintf(pattern, sizeof(pattern), "%s/unmatched.csv", dir);
	CHECK(sl_gpulog_start(pattern, 0.05, gpus, 2) == NULL, "started with no GPU of ours");
	CHECK(sl_gpulog_start(pattern, 0, gpus, 2) == NULL, "every_s 0 must not sample");
}

static void test_expand(void)
{
	char out[256], host[256], want[512];

	short_host(host, sizeof(host));
	unsetenv("SLURM_JOB_ID");
	CHECK(sl_gpulog_expand("logs/gpu-%j-%h-100%%.csv", out, sizeof(out)) == 0);
	snprintf(want, sizeof(want), "logs/gpu-local-%s-100%%.csv", host);
	CHECK(!strcmp(out, want), "%s, expected %s", out, want);
	CHECK(sl_gpulog_expand("%j%j%j%j", out, 8) == -1, "overflow not reported");
}

int main(void)
{
	char fake[4096];

	if (!mkdtemp(dir)) {
		perror("mkdtemp");
		return 1;
	}
	/* make check sets top_builddir; by hand, run it from test/ */
	snprintf(fake, sizeof(fake), "%s/test/libfakenvml.so",
		 getenv("top_builddir") ? test_builddir() : "..");
	test_sampler(fake);
	test_no_nvml();
	test_unmatched(fake);
	test_expand();
	if (!test_failures) {
		char cmd[256];

		snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
		if (system(cmd) != 0)
			fprintf(stderr, "could not remove %s\n", dir);
	}
	return test_exit("test_gpulog");
}
