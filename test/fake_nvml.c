/*
 * fake_nvml: a stand-in for libnvidia-ml.so.1 with scripted values, so the GPU log sampler is
 * tested where there is no GPU (loaded through SHARDLM_NVML_LIB).
 *
 * Three GPUs at PCI 0000:07:00.0, 0000:0a:00.0, 0000:1b:00.0 (NVML indices 0, 1, 2).  The k-th
 * reading (from 0) of GPU d gives utilization 10*d + k percent and (1000 + 100*d + k) MiB used.
 */
#include <stdio.h>
#include <string.h>

struct fake_pci {
	char bus_id_legacy[16];
	unsigned int domain, bus, device, pci_device_id, pci_subsystem_id;
	char bus_id[32];
};
struct fake_memory {
	unsigned long long total, free, used;
};
struct fake_utilization {
	unsigned int gpu, memory;
};

static const unsigned int buses[3] = { 0x07, 0x0a, 0x1b };
static int devs[3];		/* handles point here */
static unsigned int mem_reads[3], util_reads[3];
static int inited;

static int dev_of(void *h)
{
	for (int d = 0; d < 3; d++)
		if (h == &devs[d])
			return d;
	return -1;
}

int nvmlInit_v2(void)
{
	inited = 1;
	return 0;
}

int nvmlShutdown(void)
{
	inited = 0;
	return 0;
}

int nvmlDeviceGetCount_v2(unsigned int *n)
{
	if (!inited)
		return 1;	/* NVML_ERROR_UNINITIALIZED */
	*n = 3;
	return 0;
}

int nvmlDeviceGetHandleByIndex_v2(unsigned int i, void **h)
{
	if (!inited || i >= 3)
		return 2;	/* NVML_ERROR_INVALID_ARGUMENT */
	*h = &devs[i];
	return 0;
}

int nvmlDeviceGetPciInfo_v3(void *h, struct fake_pci *p)
{
	int d = dev_of(h);

	if (d < 0)
		return 2;
	memset(p, 0, sizeof(*p));
	p->domain = 0;
	p->bus = buses[d];
	p->device = 0;
	snprintf(p->bus_id, sizeof(p->bus_id), "00000000:%02X:00.0", buses[d]);
	snprintf(p->bus_id_legacy, sizeof(p->bus_id_legacy), "0000:%02X:00.0", buses[d]);
	return 0;
}

int nvmlDeviceGetMemoryInfo(void *h, struct fake_memory *m)
{
	int d = dev_of(h);

	if (d < 0)
		return 2;
	m->total = 141ULL << 30;
	m->used = (1000ULL + 100 * d + mem_reads[d]++) << 20;
	m->free = m->total - m->used;
	return 0;
}

int nvmlDeviceGetUtilizationRates(void *h, struct fake_utilization *u)
{
	int d = dev_of(h);

	if (d < 0)
		return 2;
	u->gpu = 10 * d + util_reads[d]++;
	u->memory = 0;
	return 0;
}
