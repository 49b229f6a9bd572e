// info.cu: library versions and device discovery for provenance.json and the start-up log.
#include <cstdio>
#include <cuda_runtime.h>
#include <cublasLt.h>
#include <nccl.h>

#include "sl_cuda.h"

extern "C" void sl_cuda_versions(char *buf, size_t n)
{
	int rt = 0, drv = 0, nccl = 0;

	cudaRuntimeGetVersion(&rt);
	if (cudaDriverGetVersion(&drv) != cudaSuccess)
		drv = 0;
	ncclGetVersion(&nccl);
	size_t lt = cublasLtGetVersion();
	snprintf(buf, n, "cuda %d.%d (driver %d.%d), cublasLt %zu, nccl %d.%d.%d", rt / 1000,
		 rt % 1000 / 10, drv / 1000, drv % 1000 / 10, lt, nccl / 10000, nccl / 100 % 100,
		 nccl % 100);
}

extern "C" int sl_cuda_device_count(void)
{
	int n = 0;

	if (cudaGetDeviceCount(&n) != cudaSuccess)
		return 0;
	return n;
}

extern "C" int sl_cuda_pci_bus_id(int device, char *buf, int n)
{
	return cudaDeviceGetPCIBusId(buf, n, device) == cudaSuccess ? 0 : -1;
}

extern "C" size_t sl_cuda_device_used(void)
{
	size_t fr = 0, tot = 0;

	return cudaMemGetInfo(&fr, &tot) == cudaSuccess ? tot - fr : 0;
}

extern "C" size_t sl_cuda_device_memory(int device)
{
	cudaDeviceProp p;

	return cudaGetDeviceProperties(&p, device) == cudaSuccess ? p.totalGlobalMem : 0;
}
