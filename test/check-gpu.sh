#!/bin/sh
# check-gpu.sh: the GPU tests, on a machine with a GPU (make check-gpu).  Builds nothing: run
# after `make check` (or `make -C test test_dist_gpu`) in a build configured with CUDA.
#   test_dist_gpu: NCCL with 1 rank; 2 and 4 ranks sharing the GPU through the host-staged MPI
#   communicator (NCCL refuses two ranks on one device), also as 2 pretended nodes of 2.
#   test_cuda_ops, test_cuda_model: the cuda backend's ops and the tiny model against the cpu one,
#   again with the mma.sync flash-attention kernels in place of the wgmma ones (SHARDLM_FA_WGMMA=0),
#   and with the unpipelined warpgroup forward (SHARDLM_FA_PIPE=0), the unpipelined dk/dv
#   (SHARDLM_FA_BWD_PIPE=0) and dq (SHARDLM_FA_DQ_PIPE=0), the fused dq (SHARDLM_FA_BWD_DQ=fused
#   and =wg2), dq from stored dS (=ds), the one-launch expert matmuls (SHARDLM_MOE_GEMM=wg) and
#   the norm kernels before the staged ones (SHARDLM_QK_STAGED=0 SHARDLM_RMS_STAGED=0).
#   check-gpu-offload.sh: offloaded optimizer state and weights train to the on-GPU losses.
#   check-gpu-sft.sh: task sft (untied, tied, packed, Qwen3-MoE) trains to the cpu backend's losses.
#   check-gpu-overlap.sh: AdamW under the next forward (SHARDLM_OPT_OVERLAP=1), the same bits.
#   test_cuda_qwen35: the same for the Qwen3.5 hybrid's ops and a tiny hybrid model.
#   check-gpu-q35moe.sh: a tiny Qwen3.5-MoE model's sft trains to the cpu backend's losses.
#   check-gpu-ep.sh: expert parallel on 2 ranks of the GPU and the expert capacity, on cuda.
#   check-gpu-cp.sh: context parallel on 2 ranks of the GPU (Qwen3 and Qwen3.5), on cuda.
set -u
: "${top_srcdir:=$(cd "$(dirname "$0")/.." && pwd)}"
: "${top_builddir:=$top_srcdir}"
: "${MPIRUN:=mpirun}"
export OMP_NUM_THREADS=1
# Open MPI refuses root without these (containers, CI)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# shared GPU machines: NVLink multicast (NVLS) must stay off
export NCCL_NVLS_ENABLE=0
LOG="$top_builddir/test/check-gpu.log"
passed=0 failed=0
: >"$LOG"

gpu_test() {
	name=$1
	shift
	echo "== $name: $*" >>"$LOG"
	if timeout 600 "$@" >>"$LOG" 2>&1; then
		passed=$((passed + 1)); echo "PASS: $name"
	else
		failed=$((failed + 1)); echo "FAIL: $name (see $LOG)"
	fi
}

PROG="$top_builddir/test/test_dist_gpu"
if [ ! -x "$PROG" ]; then
	echo "check-gpu: $PROG is missing; configure --with-cuda and run make check first" >&2
	exit 1
fi
gpu_test "dist nccl np 1" $MPIRUN -np 1 "$PROG" --kind nccl
gpu_test "dist staged np 2" $MPIRUN -np 2 --oversubscribe "$PROG" --kind staged
gpu_test "dist staged np 4" $MPIRUN -np 4 --oversubscribe "$PROG" --kind staged
gpu_test "dist staged np 4 node size 2" $MPIRUN -np 4 --oversubscribe "$PROG" --kind staged \
	--node-size 2

if python3 -c "import transformers" 2>/dev/null; then
	gpu_test "export loads in transformers" sh "$top_srcdir/test/check-gpu-export.sh"
else
	echo "SKIP: export loads in transformers (python3 has no transformers)"
fi

# the cuda backend against the cpu one: every op, then the whole tiny model (loss and gradients)
gpu_test "cuda ops vs cpu" "$top_builddir/test/test_cuda_ops"
gpu_test "cuda model vs cpu" "$top_builddir/test/test_cuda_model"
# the last layer whole, and with its attention on every row (model.c runs it on the head's
# rows only by default, classify's attention with only those rows as queries)
gpu_test "cuda model vs cpu, whole last layer" env SHARDLM_PRUNE_LAST=0 \
	"$top_builddir/test/test_cuda_model"
gpu_test "cuda model vs cpu, last layer's attention on every row" env SHARDLM_PRUNE_LAST=1 \
	"$top_builddir/test/test_cuda_model"
# the flash-attention kernels on mma.sync instead of Hopper's warpgroup MMA (SHARDLM_FA_WGMMA=0;
# the fallback where the device is not compute capability 9.0)
gpu_test "cuda ops vs cpu, mma.sync attention" env SHARDLM_FA_WGMMA=0 "$top_builddir/test/test_cuda_ops"
# the warpgroup forward unpipelined (SHARDLM_FA_PIPE=0; the pipelined one is the default at
# head_dim 64 and 128 on whole rows, k_fa_fwd stays for head_dim 256 and context parallel)
gpu_test "cuda ops vs cpu, unpipelined attention forward" env SHARDLM_FA_PIPE=0 \
	"$top_builddir/test/test_cuda_ops"
gpu_test "cuda model vs cpu, unpipelined attention forward" env SHARDLM_FA_PIPE=0 \
	"$top_builddir/test/test_cuda_model"
# the dk/dv warpgroup kernel unpipelined (SHARDLM_FA_BWD_PIPE=0; the pipelined one is the default)
gpu_test "cuda ops vs cpu, unpipelined attention dk/dv" env SHARDLM_FA_BWD_PIPE=0 \
	"$top_builddir/test/test_cuda_ops"
gpu_test "cuda model vs cpu, unpipelined attention dk/dv" env SHARDLM_FA_BWD_PIPE=0 \
	"$top_builddir/test/test_cuda_model"
# the dq warpgroup kernel unpipelined (SHARDLM_FA_DQ_PIPE=0; the pipelined one is the default at
# head_dim 64 and 128)
gpu_test "cuda ops vs cpu, unpipelined attention dq" env SHARDLM_FA_DQ_PIPE=0 \
	"$top_builddir/test/test_cuda_ops"
gpu_test "cuda model vs cpu, unpipelined attention dq" env SHARDLM_FA_DQ_PIPE=0 \
	"$top_builddir/test/test_cuda_model"
# the fused dq (SHARDLM_FA_BWD_DQ=fused; opt-in: the dk/dv kernel adds dQ into fp32 sums, no dq
# kernel), head_dim 64 and 128 on whole rows
gpu_test "cuda ops vs cpu, fused attention dq" env SHARDLM_FA_BWD_DQ=fused \
	"$top_builddir/test/test_cuda_ops"
gpu_test "cuda model vs cpu, fused attention dq" env SHARDLM_FA_BWD_DQ=fused \
	"$top_builddir/test/test_cuda_model"
# the fused dq on two warpgroups of 64 keys a block (SHARDLM_FA_BWD_DQ=wg2; opt-in), head_dim 128
gpu_test "cuda ops vs cpu, fused attention dq, two warpgroups" env SHARDLM_FA_BWD_DQ=wg2 \
	"$top_builddir/test/test_cuda_ops"
gpu_test "cuda model vs cpu, fused attention dq, two warpgroups" env SHARDLM_FA_BWD_DQ=wg2 \
	"$top_builddir/test/test_cuda_model"
# the dS path (SHARDLM_FA_BWD_DQ=ds: the dk/dv kernel writes dS, a matmul kernel makes dq from it),
# head_dim 64 and 128 on whole rows
gpu_test "cuda ops vs cpu, attention dq from stored dS" env SHARDLM_FA_BWD_DQ=ds \
	"$top_builddir/test/test_cuda_ops"
gpu_test "cuda model vs cpu, attention dq from stored dS" env SHARDLM_FA_BWD_DQ=ds \
	"$top_builddir/test/test_cuda_model"
# the q/k norm + rotary and RMSNorm backward kernels before the staged ones (the default since
# the thirty-sixth session): a warp a row (SHARDLM_QK_STAGED=0, SHARDLM_RMS_STAGED=0)
gpu_test "cuda ops vs cpu, warp-per-row norm kernels" env SHARDLM_QK_STAGED=0 SHARDLM_RMS_STAGED=0 \
	"$top_builddir/test/test_cuda_ops"
gpu_test "cuda model vs cpu, warp-per-row norm kernels" env SHARDLM_QK_STAGED=0 SHARDLM_RMS_STAGED=0 \
	"$top_builddir/test/test_cuda_model"
# the experts' matmuls in one warpgroup kernel (SHARDLM_MOE_GEMM=wg; opt-in, cuda/moe_mm.cu)
gpu_test "cuda ops vs cpu, one-launch expert matmuls" env SHARDLM_MOE_GEMM=wg \
	"$top_builddir/test/test_cuda_ops"
gpu_test "cuda model vs cpu, mma.sync attention" env SHARDLM_FA_WGMMA=0 \
	"$top_builddir/test/test_cuda_model"
# parallel.offload: the copy streams and events, then optimizer and params against on-GPU
# optimizer state (losses, 20 steps)
gpu_test "cuda async copies" "$top_builddir/test/test_cuda_async"
gpu_test "offload vs on-GPU losses" sh "$top_srcdir/test/check-gpu-offload.sh"
# task sft (dense, tied, packed, MoE) against the cpu backend's losses
gpu_test "sft cuda vs cpu losses" sh "$top_srcdir/test/check-gpu-sft.sh"
# AdamW under the next forward (SHARDLM_OPT_OVERLAP=1) gives the same bits as without
gpu_test "optimizer overlap, same bits" sh "$top_srcdir/test/check-gpu-overlap.sh"
# the Qwen3.5 hybrid's cuda ops (cuda/gdn.cu) and its tiny model against the cpu backend
gpu_test "cuda qwen3.5 ops and model vs cpu" "$top_builddir/test/test_cuda_qwen35"
# Qwen3.5-MoE (the shared expert's gate, cuda/q35moe.cu) sft on cuda against the cpu backend
gpu_test "qwen3.5-moe sft cuda vs cpu losses" sh "$top_srcdir/test/check-gpu-q35moe.sh"
# expert parallelism (2 ranks on the one GPU) and the expert capacity on cuda
gpu_test "expert parallel and capacity on cuda" sh "$top_srcdir/test/check-gpu-ep.sh"
# context parallelism (2 ranks on the one GPU) on cuda
gpu_test "context parallel on cuda" sh "$top_srcdir/test/check-gpu-cp.sh"

grep -h "checks," "$LOG"
echo "check-gpu: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
