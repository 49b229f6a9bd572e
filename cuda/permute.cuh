// permute.cuh: the MoE permutation's kernels (the choices sorted by expert), included by
// moe.cu; device code only, so that test/test_moe_emu.cc runs them on the host emulation
// (emu.cuh).
#ifndef SL_PERMUTE_CUH
#define SL_PERMUTE_CUH

// A stable counting sort of the n = T k choices by expert, in three passes over chunks of
// PERM_CH choices: each chunk's count of every expert; per expert, the exclusive prefix sums of
// its chunks' counts and its total; each choice's slot = its expert's first row (the prefix sum
// of the totals, offs) + its chunk's start for that expert + the choices of that expert before
// it in the chunk.  So each expert's rows keep token order, with no atomics in what is written.
#define PERM_CH 256		// choices a block takes (8 warps)
#define PERM_MAXE 1024		// experts the write pass's tables hold (9 x E ints, 36 KB)

// cnt[e * nch + b] = choices of expert e among chunk b's
__global__ void k_perm_count(int *cnt, const int *topi, int n, int E, int nch)
{
	SL_DYN_SMEM(int, hist);
	const int b = blockIdx.x, i = b * PERM_CH + threadIdx.x;

	for (int e = threadIdx.x; e < E; e += blockDim.x)
		hist[e] = 0;
	__syncthreads();
	if (i < n)
		atomicAdd(&hist[topi[i]], 1);
	__syncthreads();
	for (int e = threadIdx.x; e < E; e += blockDim.x)
		cnt[(size_t)e * nch + b] = hist[e];
}

// exclusive prefix sum over the block of one int a thread (blockDim.x a multiple of 32); the
// block's total in *total
static __device__ int block_excl(int v, int *total)
{
	__shared__ int ws[32];
	const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
	int x = v;

	for (int o = 1; o < 32; o <<= 1) {
		const int y = __shfl_up_sync(0xffffffffu, x, o);

		if (lane >= o)
			x += y;
	}
	__syncthreads();	// ws free (an earlier call's readers are done)
	if (lane == 31)
		ws[w] = x;
	__syncthreads();
	if (w == 0) {
		int y = lane < nw ? ws[lane] : 0;

		for (int o = 1; o < 32; o <<= 1) {
			const int z = __shfl_up_sync(0xffffffffu, y, o);

			if (lane >= o)
				y += z;
		}
		ws[lane] = y;
	}
	__syncthreads();
	*total = ws[nw - 1];
	return x - v + (w ? ws[w - 1] : 0);
}

// out(n) = the exclusive prefix sums of in(n) (out may be in), by the whole block; their total
static __device__ int block_excl_array(const int *in, int *out, int n)
{
	int run = 0;

	for (int j0 = 0; j0 < n; j0 += blockDim.x) {
		const int j = j0 + threadIdx.x, v = j < n ? in[j] : 0;
		int t;
		const int x = block_excl(v, &t);

		if (j < n)
			out[j] = run + x;
		run += t;
	}
	return run;
}

// block e: cnt[e * nch ...] becomes its exclusive prefix sums (in place), tot[e] their total
__global__ void k_perm_scan(int *cnt, int *tot, int nch)
{
	int *c = cnt + (size_t)blockIdx.x * nch;
	const int run = block_excl_array(c, c, nch);

	if (!threadIdx.x)
		tot[blockIdx.x] = run;
}

// rows and slots: choice i of chunk b (expert e) goes to slot start[e] + pos[e * nch + b] + the
// choices of e before it in the chunk (its warp's lanes, then the earlier warps': a table of
// 8 x E counts); start = the exclusive prefix sums of tot, which block 0 writes to offs(E+1)
__global__ void k_perm_write(int *rows, int *slot, int *offs, const int *pos, const int *tot,
			     const int *topi, int n, int k, int E, int nch)
{
	SL_DYN_SMEM(int, wc);	// (PERM_CH / 32) x E, then start(E)
	int *start = wc + (PERM_CH / 32) * E;
	const int b = blockIdx.x, i = b * PERM_CH + threadIdx.x, lane = threadIdx.x & 31;
	const int w = threadIdx.x >> 5;

	for (int j = threadIdx.x; j < (PERM_CH / 32) * E; j += blockDim.x)
		wc[j] = 0;
	const int run = block_excl_array(tot, start, E);

	__syncthreads();
	if (b == 0) {
		for (int e = threadIdx.x; e < E; e += blockDim.x)
			offs[e] = start[e];
		if (!threadIdx.x)
			offs[E] = run;
	}
	const int e = i < n ? topi[i] : -1;
	const unsigned peers = __match_any_sync(0xffffffffu, e);
	const int rank = __popc(peers & ((1u << lane) - 1));

	if (e >= 0 && !rank)
		wc[w * E + e] = __popc(peers);
	__syncthreads();
	if (e < 0)
		return;
	int r = rank;

	for (int v = 0; v < w; v++)
		r += wc[v * E + e];
	const int at = start[e] + pos[(size_t)e * nch + b] + r;

	slot[i] = at;
	rows[at] = i / k;
}

#endif
