/*
 * gpulog: the per-node GPU log sampler (see gpulog.h).
 *
 * NVML is opened with dlopen so the trainer builds and runs where the NVIDIA driver is absent (CPU
 * runs, CI); the few types we need are declared here with NVML's layouts instead of including
 * nvml.h, which is not installed everywhere the trainer is built.  The job's GPUs are matched by
 * PCI address: on a shared node NVML's indices cover every GPU, and CUDA's indices are renumbered
 * by CUDA_VISIBLE_DEVICES, but the bus id is the same for both.
 */
#include "sl_build.h"
#include "gpulog.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "log.h"

#define GPULOG_MAX_GPUS 64
#define GPULOG_HEADER "timestamp, index, memory.used [MiB], utilization.gpu [%], host\n"

/* NVML's types, as nvml.h lays them out (nvmlPciInfo_t is the v3 layout) */
typedef int nvml_return;			/* NVML_SUCCESS = 0 */
typedef struct nvml_device *nvml_device;
struct nvml_pci_info {
	char bus_id_legacy[16];
	unsigned int domain;
	unsigned int bus;
	unsigned int device;
	unsigned int pci_device_id;
	unsigned int pci_subsystem_id;
	char bus_id[32];
};
struct nvml_memory {
	unsigned long long total, free, used;	/* bytes */
};
struct nvml_utilization {
	unsigned int gpu, memory;		/* percent */
};

struct nvml {
	void *lib;
	nvml_return (*init)(void);
	nvml_return (*shutdown)(void);
	nvml_return (*count)(unsigned int *n);
	nvml_return (*handle)(unsigned int index, nvml_device *dev);
	nvml_return (*pci)(nvml_device dev, struct nvml_pci_info *pci);
	nvml_return (*memory)(nvml_device dev, struct nvml_memory *mem);
	nvml_return (*utilization)(nvml_device dev, struct nvml_utilization *u);
};

struct sl_gpulog {
	struct nvml nvml;
	char path[4096];		/* gpu_log.file expanded */
	char host[256];			/* short host name, the last column */
	FILE *f;
	double every_s;
	int n;
	unsigned int index[GPULOG_MAX_GPUS];	/* NVML indices sampled */
	nvml_device dev[GPULOG_MAX_GPUS];
	pthread_t thread;
	pthread_mutex_t lock;
	pthread_cond_t wake;
	bool stop;			/* under lock */
};

static void short_host(char *buf, size_t n)
{
	if (gethostname(buf, n - 1) != 0)
		snprintf(buf, n, "unknown");
	buf[n - 1] = 0;
	buf[strcspn(buf, ".")] = 0;
}

int sl_gpulog_expand(const char *pattern, char *out, size_t n)
{
	char host[256];
	const char *job = getenv("SLURM_JOB_ID");
	size_t len = 0;

	if (!job || !*job)
		job = "local";
	short_host(host, sizeof(host));
	for (const char *p = pattern; *p; p++) {
		const char *add = NULL;
		char one[2] = { *p, 0 };

		if (*p == '%' && p[1] == 'j')
			add = job;
		else if (*p == '%' && p[1] == 'h')
			add = host;
		else if (*p == '%' && p[1] == '%')
			add = "%";
		if (add)
			p++;
		else
			add = one;
		if (len + strlen(add) >= n)
			return -1;
		memcpy(out + len, add, strlen(add));
		len += strlen(add);
	}
	out[len] = 0;
	return 0;
}

/* mkdir -p of @path's folder */
static int make_parents(const char *path)
{
	char dir[4096];

	snprintf(dir, sizeof(dir), "%s", path);
	for (char *p = dir + 1; *p; p++) {
		if (*p != '/')
			continue;
		*p = 0;
		if (mkdir(dir, 0755) != 0 && errno != EEXIST)
			return -1;
		*p = '/';
	}
	return 0;
}

static int nvml_open(struct nvml *nv)
{
	const char *name = getenv("SHARDLM_NVML_LIB");

	if (!name || !*name)
		name = "libnvidia-ml.so.1";
	nv->lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
	if (!nv->lib) {
		sl_log("gpu log: NVML not available (%s); no GPU log is written", dlerror());
		return -1;
	}
	*(void **)&nv->init = dlsym(nv->lib, "nvmlInit_v2");
	*(void **)&nv->shutdown = dlsym(nv->lib, "nvmlShutdown");
	*(void **)&nv->count = dlsym(nv->lib, "nvmlDeviceGetCount_v2");
	*(void **)&nv->handle = dlsym(nv->lib, "nvmlDeviceGetHandleByIndex_v2");
	*(void **)&nv->pci = dlsym(nv->lib, "nvmlDeviceGetPciInfo_v3");
	*(void **)&nv->memory = dlsym(nv->lib, "nvmlDeviceGetMemoryInfo");
	*(void **)&nv->utilization = dlsym(nv->lib, "nvmlDeviceGetUtilizationRates");
	if (!nv->init || !nv->shutdown || !nv->count || !nv->handle || !nv->pci || !nv->memory ||
	    !nv->utilization) {
		sl_log("gpu log: %s lacks NVML functions this build needs (driver too old?); no "
		       "GPU log is written", name);
		goto out_close;
	}
	if (nv->init() != 0) {
		sl_log("gpu log: nvmlInit failed (no NVIDIA driver loaded?); no GPU log is written");
		goto out_close;
	}
	return 0;
out_close:
	dlclose(nv->lib);
	nv->lib = NULL;
	return -1;
}

static void nvml_close(struct nvml *nv)
{
	if (!nv->lib)
		return;
	nv->shutdown();
	dlclose(nv->lib);
	nv->lib = NULL;
}

/* "0000:1B:00.0", "00000000:1b:00.0" or "1b:00.0" -> domain, bus, device */
static bool parse_bus_id(const char *s, unsigned *domain, unsigned *bus, unsigned *dev)
{
	unsigned fn;

	if (sscanf(s, "%x:%x:%x.%x", domain, bus, dev, &fn) == 4)
		return true;
	*domain = 0;
	return sscanf(s, "%x:%x.%x", bus, dev, &fn) == 3;
}

static bool add_device(struct sl_gpulog *g, unsigned int i)
{
	for (int k = 0; k < g->n; k++)
		if (g->index[k] == i)
			return true;		/* two ranks on one GPU: log it once */
	if (g->n == GPULOG_MAX_GPUS || g->nvml.handle(i, &g->dev[g->n]) != 0)
		return false;
	g->index[g->n++] = i;
	return true;
}

/* Fill g->index/dev with the job's GPUs; the unmatched ones are named in a warning. */
static int match_devices(struct sl_gpulog *g, const char *const *gpus, int n)
{
	unsigned int count = 0;

	if (g->nvml.count(&count) != 0 || count == 0) {
		sl_log("gpu log: NVML sees no GPU on this node; no GPU log is written");
		return -1;
	}
	for (int k = 0; k < n || (n == 0 && k < (int)count); k++) {
		unsigned domain, bus, dev, i;
		char *end;
		bool found = false;

		if (n == 0) {
			add_device(g, k);
			continue;
		}
		if (parse_bus_id(gpus[k], &domain, &bus, &dev)) {
			for (i = 0; i < count && !found; i++) {
				struct nvml_pci_info pci;
				nvml_device d;

				if (g->nvml.handle(i, &d) || g->nvml.pci(d, &pci))
					continue;
				if (pci.domain == domain && pci.bus == bus && pci.device == dev)
					found = add_device(g, i);
			}
		} else {
			i = strtoul(gpus[k], &end, 10);
			found = end != gpus[k] && !*end && i < count && add_device(g, i);
		}
		if (!found)
			sl_warn("gpu log: GPU '%s' not found among NVML's %u devices; it is not "
				"logged", gpus[k], count);
	}
	if (g->n == 0) {
		sl_log("gpu log: none of the job's GPUs found through NVML; no GPU log is written");
		return -1;
	}
	return 0;
}

static int sample(struct sl_gpulog *g)
{
	struct timespec now;
	struct tm tm;
	char when[64];

	clock_gettime(CLOCK_REALTIME, &now);
	localtime_r(&now.tv_sec, &tm);
	strftime(when, sizeof(when), "%Y/%m/%d %H:%M:%S", &tm);
	for (int k = 0; k < g->n; k++) {
		struct nvml_memory mem;
		struct nvml_utilization u;
		char m[32] = "[N/A]", p[32] = "[N/A]";

		/* an unreadable value is written as nvidia-smi writes it; the reducer skips it */
		if (g->nvml.memory(g->dev[k], &mem) == 0)
			snprintf(m, sizeof(m), "%llu MiB", mem.used >> 20);
		if (g->nvml.utilization(g->dev[k], &u) == 0)
			snprintf(p, sizeof(p), "%u %%", u.gpu);
		fprintf(g->f, "%s.%03ld, %u, %s, %s, %s\n", when, now.tv_nsec / 1000000, g->index[k],
			m, p, g->host);
	}
	return fflush(g->f);
}

static void *sampler(void *arg)
{
	struct sl_gpulog *g = arg;
	struct timespec next;

	clock_gettime(CLOCK_MONOTONIC, &next);
	pthread_mutex_lock(&g->lock);
	while (!g->stop) {
		long long ns;

		pthread_mutex_unlock(&g->lock);
		if (sample(g) != 0) {
			sl_warn("gpu log: cannot write %s: %s; GPU logging stops", g->path,
				strerror(errno));
			return NULL;
		}
		/* fixed deadlines, so the interval does not drift by the sampling time */
		ns = next.tv_nsec + (long long)(g->every_s * 1e9);
		next.tv_sec += ns / 1000000000;
		next.tv_nsec = ns % 1000000000;
		pthread_mutex_lock(&g->lock);
		while (!g->stop && pthread_cond_timedwait(&g->wake, &g->lock, &next) != ETIMEDOUT)
			;
	}
	pthread_mutex_unlock(&g->lock);
	return NULL;
}

struct sl_gpulog *sl_gpulog_start(const char *pattern, double every_s, const char *const *gpus,
				  int n)
{
	struct sl_gpulog *g;
	pthread_condattr_t ca;

	if (every_s <= 0 || !pattern || !*pattern)
		return NULL;
	g = calloc(1, sizeof(*g));
	if (!g)
		return NULL;
	g->every_s = every_s;
	short_host(g->host, sizeof(g->host));
	if (sl_gpulog_expand(pattern, g->path, sizeof(g->path))) {
		sl_warn("gpu log: gpu_log.file '%s' expands to a path too long; no GPU log", pattern);
		goto out_free;
	}
	if (nvml_open(&g->nvml))
		goto out_free;
	if (match_devices(g, gpus, n))
		goto out_close_nvml;
	if (make_parents(g->path) || !(g->f = fopen(g->path, "a"))) {
		sl_warn("gpu log: cannot open %s: %s; check gpu_log.file (no GPU log is written)",
			g->path, strerror(errno));
		goto out_close_nvml;
	}
	if (ftell(g->f) == 0)
		fputs(GPULOG_HEADER, g->f);
	pthread_mutex_init(&g->lock, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&g->wake, &ca);
	pthread_condattr_destroy(&ca);
	if (pthread_create(&g->thread, NULL, sampler, g) != 0) {
		sl_warn("gpu log: cannot start the sampler thread; no GPU log is written");
		goto out_destroy;
	}
	sl_log("gpu log: %d GPU%s every %g s to %s", g->n, g->n == 1 ? "" : "s", every_s,
	       g->path);
	return g;
out_destroy:
	pthread_cond_destroy(&g->wake);
	pthread_mutex_destroy(&g->lock);
	fclose(g->f);
out_close_nvml:
	nvml_close(&g->nvml);
out_free:
	free(g);
	return NULL;
}

void sl_gpulog_stop(struct sl_gpulog *g)
{
	if (!g)
		return;
	pthread_mutex_lock(&g->lock);
	g->stop = true;
	pthread_cond_signal(&g->wake);
	pthread_mutex_unlock(&g->lock);
	pthread_join(g->thread, NULL);
	pthread_cond_destroy(&g->wake);
	pthread_mutex_destroy(&g->lock);
	fclose(g->f);
	nvml_close(&g->nvml);
	free(g);
}

const char *sl_gpulog_path(const struct sl_gpulog *g)
{
	return g ? g->path : "";
}
