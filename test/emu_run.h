/*
 * emu_run.h: the host emulator the kernels of cuda/ run on when built with -DSL_EMU
 * (cuda/emu.cuh's hooks): each thread of a block is a fiber (ucontext); barriers, shuffles, votes
 * and the warpgroup's collective instructions switch between them.  Its model of the hardware,
 * from the PTX ISA, is independent of the kernels:
 *  - wgmma m64nNk16: the A fragment in registers as mma.sync m16n8k16 gives a warp its 16 rows
 *    (a0 (g, 2t..2t+1), a1 (g+8, ..), a2 (g, 2t+8..), a3 (g+8, 2t+8..) for lane 4g + t); D per
 *    8 columns (d0 (g, 2t), d1 (g, 2t+1), d2 (g+8, 2t), d3 (g+8, 2t+1)); an operand in shared
 *    memory through its matrix descriptor (start, leading and stride byte offsets, 128-byte
 *    swizzle: address bits 4-6 XOR bits 7-9), K-major (element (mn, k) at start + (mn / 8) SBO +
 *    (mn % 8) 128 + 2k) or MN-major (at start + (k / 8) SBO + (k % 8) 128 + (mn / 64) LBO +
 *    2 (mn % 64));
 *  - wgmma runs asynchronously: its products are made when a wait_group lets them finish, from
 *    the shared memory of that moment (registers as issued), so a kernel that changes a tile
 *    or reads an accumulator before waiting gets other numbers;
 *  - cp.async copies land when a wait_group lets them, not before, or (cp.async.mbarrier.arrive)
 *    when the mbarrier's phase they arrive on completes; a thread waiting on an mbarrier phase
 *    runs on only once it has completed (mbarriers live beside the shared memory, keyed by
 *    address);
 *  - threads run in turns until they wait (a barrier, a collective instruction, an mbarrier);
 *    with emu_jitter a thread now and then sits out some turns, so that warpgroups drift apart;
 *  - copies are issued into shared memory that reads as the large value below until they land
 *    (on the hardware it is undefined in between);
 *  - dynamic shared memory (the flash kernels' fa_sm) starts each block filled with a large
 *    value: a read of what nothing wrote shows; __shared__ variables are one object a block.
 * Included by one test program each (it defines globals), after cuda/common.cuh with SL_EMU
 * defined.
 */
#ifndef SL_TEST_EMU_RUN_H
#define SL_TEST_EMU_RUN_H

#include <ucontext.h>

#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <vector>

// every flash kernel's dynamic shared memory (declared extern inside each kernel)
alignas(1024) bf16 fa_sm[(228u << 10) / sizeof(bf16)];

emu_now_t *emu_now;

namespace {

struct Copy {
	uint32_t dst;
	const void *src;
	int bytes;
	bool valid;
};

struct Fiber {
	ucontext_t ctx;
	bool done;
	int sleep;	// rounds of the scheduler this thread sits out (emu_jitter)
	emu_now_t now;
	std::vector<Copy> open;
	std::deque<std::vector<Copy>> groups;
	std::vector<Copy> bulk;	// bulk stores (dst: shared source, src: global target)
};

struct Coll {
	int count = 0;
	unsigned gen = 0;
};

struct WgOp {
	int n, acc, ta, tb;
	bool rs;
	uint64_t ad, bd;
	float *d[128];
	uint32_t a[128][4];
};

struct Wg {
	Coll c;
	WgOp building;
	std::vector<WgOp> open;
	std::deque<std::vector<WgOp>> groups;
};

struct Warp {
	Coll c;
	uint32_t slot[32];
};

// an mbarrier: arrivals still due in this phase, the count it restarts with, its phase, and the
// cp.async copies whose arrivals (.noinc) it has taken: they land when the phase completes
struct Mbar {
	int count = 0, due = 0;
	unsigned phase = 0;
	std::vector<Copy> copies;
};

struct Block {
	int nthr, cur;
	std::vector<Fiber> f;
	ucontext_t sched;
	Coll bar;
	Wg wg[3];
	Warp warp[12];
	std::map<uint32_t, Mbar> mbar;
	std::function<void()> body;
	unsigned long progress;
	const char *fault;
};

Block *B;
size_t smem_bytes;

// Jitter (emu_jitter on): after each turn a thread sits out 1 to 64 of the scheduler's rounds
// with probability 1/16, so that threads drift apart as on the hardware and a thread reading what
// another has not yet handed over (a missing mbarrier wait) may read it too early: only where the
// schedule lets the reader get ahead (a loader far ahead of its readers hides a missing wait on
// its stages).  Seeded: runs repeat.
bool emu_jitter;
uint64_t sched_state = 0x2545F4914F6CDD1Dull;

uint32_t sched_rand()
{
	sched_state ^= sched_state << 13;
	sched_state ^= sched_state >> 7;
	sched_state ^= sched_state << 17;
	return (uint32_t)(sched_state >> 32);
}

int tid()
{
	return B->cur;
}

void yield()
{
	swapcontext(&B->f[B->cur].ctx, &B->sched);
}

// the last of @need arrivals runs @act, then every one goes on
template <class F> void collective(Coll &c, int need, F act)
{
	const unsigned g = c.gen;

	if (++c.count == need) {
		act();
		c.count = 0;
		c.gen++;
		B->progress++;
		return;
	}
	while (c.gen == g)
		yield();
}

void fiber_main()
{
	B->body();
	B->f[B->cur].done = true;
	B->progress++;
	swapcontext(&B->f[B->cur].ctx, &B->sched);
}

float bfv(const void *p)
{
	return __bfloat162float(*(const bf16 *)p);
}

// an operand element (mn, k) of a descriptor's tile: K-major (t 0) or MN-major (t 1)
float ld_desc(uint64_t desc, int t, int mn, int k)
{
	const uint32_t start = (uint32_t)(desc & 0x3FFF) << 4;
	const uint32_t lbo = (uint32_t)((desc >> 16) & 0x3FFF) << 4;
	const uint32_t sbo = (uint32_t)((desc >> 32) & 0x3FFF) << 4;
	uint32_t a;

	if ((desc >> 62) != 1)
		emu_trap("descriptor without the 128-byte swizzle", 0);
	a = t == 0 ? start + (mn / 8) * sbo + (mn % 8) * 128 + k * 2 :
		     start + (k / 8) * sbo + (k % 8) * 128 + (mn / 64) * lbo + (mn % 64) * 2;
	a ^= ((a >> 7) & 7) << 4;
	if (a + 2 > smem_bytes)
		emu_trap("wgmma operand past the block's shared memory", 0);
	return bfv((const char *)fa_sm + a);
}

float as_float(uint32_t u)
{
	float f;

	memcpy(&f, &u, 4);
	return f;
}

float lo16(uint32_t v)
{
	return as_float(v << 16);
}

float hi16(uint32_t v)
{
	return as_float(v & 0xFFFF0000u);
}

// one wgmma of the warpgroup, all 128 threads' parts
void exec(const WgOp &op)
{
	static float A[64][16], Bm[16][256];

	for (int m = 0; m < 64; m++)
		for (int k = 0; k < 16; k++)
			A[m][k] = op.rs ? 0.f : ld_desc(op.ad, op.ta, m, k);
	if (op.rs)
		for (int i = 0; i < 128; i++) {
			const int w = i / 32, g = (i % 32) / 4, t = i % 4;

			for (int r = 0; r < 4; r++) {
				const int m = 16 * w + g + 8 * (r & 1), k = 2 * t + 8 * (r >> 1);

				A[m][k] = lo16(op.a[i][r]);
				A[m][k + 1] = hi16(op.a[i][r]);
			}
		}
	for (int k = 0; k < 16; k++)
		for (int n = 0; n < op.n; n++)
			Bm[k][n] = ld_desc(op.bd, op.tb, n, k);
	for (int i = 0; i < 128; i++) {
		const int w = i / 32, g = (i % 32) / 4, t = i % 4;

		for (int n8 = 0; n8 < op.n / 8; n8++)
			for (int e = 0; e < 4; e++) {
				const int m = 16 * w + g + 8 * (e >> 1), n = 8 * n8 + 2 * t + (e & 1);
				float s = 0.f, &d = op.d[i][4 * n8 + e];

				for (int k = 0; k < 16; k++)
					s += A[m][k] * Bm[k][n];
				d = op.acc ? d + s : s;
			}
	}
}

void run_copies(std::vector<Copy> &v)
{
	for (const Copy &c : v) {
		if (c.dst + c.bytes > smem_bytes)
			emu_trap("cp.async past the block's shared memory", 0);
		if (c.valid)
			memcpy((char *)fa_sm + c.dst, c.src, c.bytes);
		else
			memset((char *)fa_sm + c.dst, 0, c.bytes);
	}
	v.clear();
}

} // namespace

void emu_syncthreads(void)
{
	collective(B->bar, B->nthr, [] {});
}

void emu_trap(const char *file, int line)
{
	fprintf(stderr, "emu: trap: %s:%d (thread %d)\n", file, line, B ? B->cur : -1);
	abort();
}

namespace {

// a warp's exchange: every lane puts v in its slot, then takes pick(slots, lane); the slots are
// reused only after every lane has picked
template <class F> uint32_t warp_exchange(uint32_t v, F pick)
{
	Warp &w = B->warp[tid() / 32];
	const int lane = tid() % 32;
	uint32_t r;

	w.slot[lane] = v;
	collective(w.c, 32, [] {});
	r = pick(w.slot, lane);
	collective(w.c, 32, [] {});
	return r;
}

} // namespace

uint32_t emu_shfl_xor32(uint32_t v, int m)
{
	return warp_exchange(v, [m](const uint32_t *s, int lane) { return s[lane ^ m]; });
}

uint32_t emu_shfl_up32(uint32_t v, int d)
{
	return warp_exchange(v, [d](const uint32_t *s, int lane) {
		return lane >= d ? s[lane - d] : s[lane];
	});
}

uint32_t emu_match_any32(uint32_t v)
{
	return warp_exchange(v, [](const uint32_t *s, int lane) {
		uint32_t r = 0;

		for (int i = 0; i < 32; i++)
			r |= (uint32_t)(s[i] == s[lane]) << i;
		return r;
	});
}

uint32_t emu_smem_u32(const void *p)
{
	return (uint32_t)((const char *)p - (const char *)fa_sm);
}

void emu_cp_async(uint32_t dst, const void *src, int bytes, bool valid)
{
	if (dst % 2 || bytes % 2 || dst + bytes > smem_bytes)
		emu_trap("cp.async: misaligned or past the block's shared memory", 0);
	for (int i = 0; i < bytes / 2; i++)	// undefined until it lands
		fa_sm[dst / 2 + i] = __float2bfloat16_rn(60000.f);
	B->f[tid()].open.push_back({ dst, src, bytes, valid });
}

void emu_cp_commit(void)
{
	Fiber &f = B->f[tid()];

	f.groups.push_back(std::move(f.open));
	f.open.clear();
}

void emu_cp_wait(int n)
{
	Fiber &f = B->f[tid()];

	if (n < 0) {
		emu_cp_commit();
		n = 0;
	}
	while ((int)f.groups.size() > n) {
		run_copies(f.groups.front());
		f.groups.pop_front();
	}
}

void emu_wgmma(int n, float *d, const uint32_t *a, uint64_t ad, uint64_t bd, int acc, int ta,
	       int tb)
{
	Wg &g = B->wg[tid() / 128];
	WgOp &o = g.building;
	const int i = tid() % 128;

	if (g.c.count == 0) {
		o.n = n, o.acc = acc, o.ta = ta, o.tb = tb, o.rs = a != nullptr, o.ad = ad,
		o.bd = bd;
	} else if (o.n != n || o.acc != acc || o.ta != ta || o.tb != tb || o.rs != (a != nullptr) ||
		   o.ad != ad || o.bd != bd) {
		emu_trap("the warpgroup's threads issued different wgmma", 0);
	}
	o.d[i] = d;
	if (a)
		memcpy(o.a[i], a, sizeof(o.a[i]));
	collective(g.c, 128, [&g] { g.open.push_back(g.building); });
}

void emu_wg_commit(void)
{
	Wg &g = B->wg[tid() / 128];

	collective(g.c, 128, [&g] {
		g.groups.push_back(std::move(g.open));
		g.open.clear();
	});
}

void emu_wg_wait(int n)
{
	Wg &g = B->wg[tid() / 128];

	collective(g.c, 128, [&g, n] {
		while ((int)g.groups.size() > n) {
			for (const WgOp &op : g.groups.front())
				exec(op);
			g.groups.pop_front();
		}
	});
}

void emu_bulk_store(void *g, uint32_t s, uint32_t bytes)
{
	if (s % 16 || bytes % 16 || (uintptr_t)g % 16 || s + bytes > smem_bytes)
		emu_trap("cp.async.bulk: misaligned or past the block's shared memory", 0);
	B->f[tid()].bulk.push_back({ s, g, (int)bytes, true });
}

// the source is read (and the target written) here, as late as the hardware may read it
void emu_bulk_wait(void)
{
	Fiber &f = B->f[tid()];

	for (const Copy &c : f.bulk)
		memcpy((void *)c.src, (const char *)fa_sm + c.dst, c.bytes);
	f.bulk.clear();
}

void emu_red_add(float *p, float x)
{
	*p += x;
}

namespace {

Mbar &mbar_at(uint32_t bar)
{
	auto it = B->mbar.find(bar);

	if (it == B->mbar.end())
		emu_trap("mbarrier used before its init", 0);
	return it->second;
}

// one arrival; the last of the phase lands the copies the phase took and starts the next
void mbar_one(Mbar &m)
{
	if (--m.due == 0) {
		run_copies(m.copies);
		m.phase++;
		m.due = m.count;
		B->progress++;
	}
}

} // namespace

void emu_mbar_init(uint32_t bar, int count)
{
	if (bar % 8 || bar + 8 > smem_bytes || count < 1)
		emu_trap("mbarrier.init: misaligned, past the shared memory, or no count", 0);
	Mbar &m = B->mbar[bar];

	m.count = m.due = count;
	m.phase = 0;
	m.copies.clear();
}

void emu_mbar_arrive(uint32_t bar)
{
	mbar_one(mbar_at(bar));
}

// the phase of this parity has completed once the barrier's phase count has another parity (a
// waiter is never more than one phase behind)
void emu_mbar_wait(uint32_t bar, int parity)
{
	Mbar &m = mbar_at(bar);

	while ((int)(m.phase & 1) == parity)
		yield();
}

void emu_cp_arrive(uint32_t bar)
{
	Fiber &f = B->f[tid()];
	Mbar &m = mbar_at(bar);

	for (auto &g : f.groups)
		m.copies.insert(m.copies.end(), g.begin(), g.end());
	m.copies.insert(m.copies.end(), f.open.begin(), f.open.end());
	f.groups.clear();
	f.open.clear();
	mbar_one(m);
}

bool emu_any(bool pred)
{
	return warp_exchange(pred, [](const uint32_t *s, int) {
		uint32_t r = 0;

		for (int i = 0; i < 32; i++)
			r |= s[i] != 0;
		return r;
	}) != 0;
}

void emu_syncwarp(void)
{
	collective(B->warp[tid() / 32].c, 32, [] {});
}

namespace {

struct D3 {
	unsigned x, y, z;
};

// every block of the grid, one after another, each on nthr fibers; blk_dim: a block of x by y
// threads (x fastest, warps of 32 consecutive as on the GPU) where given, else nthr by 1
void launch(D3 grid, int nthr, size_t smem, const std::function<void()> &body,
	    D3 blk_dim = { 0, 0, 0 })
{
	if (blk_dim.x)
		nthr = (int)(blk_dim.x * blk_dim.y);
	else
		blk_dim = { (unsigned)nthr, 1, 1 };
	if (smem > sizeof(fa_sm) || nthr > 384 || nthr % 32) {
		fprintf(stderr, "emu: launch of %d threads, %zu bytes of shared memory\n", nthr, smem);
		abort();
	}
	smem_bytes = smem;
	// each thread's stack, kept from launch to launch (allocated once: blocks start fast)
	static std::vector<std::vector<char>> stacks;
	if (stacks.size() < (size_t)nthr)
		stacks.resize(nthr);
	for (int t = 0; t < nthr; t++)
		stacks[t].resize(1 << 18);
	for (unsigned z = 0; z < grid.z; z++)
		for (unsigned y = 0; y < grid.y; y++)
			for (unsigned x = 0; x < grid.x; x++) {
				Block blk;
				int ndone = 0;

				blk.nthr = nthr;
				blk.body = body;
				blk.progress = 0;
				blk.f.resize(nthr);
				B = &blk;
				/* a large finite value: read where nothing wrote, it shows */
				for (size_t i = 0; i < sizeof(fa_sm) / sizeof(bf16); i++)
					fa_sm[i] = __float2bfloat16_rn(60000.f);
				for (int t = 0; t < nthr; t++) {
					Fiber &f = blk.f[t];

					f.done = false;
					f.sleep = 0;
					f.now = { { t % blk_dim.x, t / blk_dim.x, 0 }, { x, y, z },
						  { grid.x, grid.y, grid.z }, { blk_dim.x, blk_dim.y, 1 } };
					getcontext(&f.ctx);
					f.ctx.uc_stack.ss_sp = stacks[t].data();
					f.ctx.uc_stack.ss_size = stacks[t].size();
					f.ctx.uc_link = nullptr;
					makecontext(&f.ctx, fiber_main, 0);
				}
				while (ndone < nthr) {
					const unsigned long p0 = blk.progress;
					bool slept = false;

					for (int t = 0; t < nthr; t++) {
						Fiber &f = blk.f[t];

						if (f.done)
							continue;
						if (f.sleep > 0) {
							f.sleep--;
							slept = true;
							continue;
						}
						blk.cur = t;
						emu_now = &f.now;
						swapcontext(&blk.sched, &f.ctx);
						if (emu_jitter && sched_rand() % 16 == 0)
							f.sleep = 1 + (int)(sched_rand() % 64);
					}
					ndone = 0;
					for (int t = 0; t < nthr; t++)
						ndone += blk.f[t].done;
					if (ndone < nthr && blk.progress == p0 && !slept) {
						fprintf(stderr, "emu: block (%u,%u,%u): deadlock (%d of %d "
							"threads done)\n", x, y, z, ndone, nthr);
						abort();
					}
				}
				for (auto &mb : blk.mbar)
					if (!mb.second.copies.empty()) {
						fprintf(stderr, "emu: a block ended with copies an "
							"mbarrier never completed\n");
						abort();
					}
				for (int w = 0; w < 3; w++)
					if (!blk.wg[w].open.empty() || !blk.wg[w].groups.empty()) {
						fprintf(stderr, "emu: a block ended with wgmma not waited for\n");
						abort();
					}
				B = nullptr;
			}
}

} // namespace

#endif
