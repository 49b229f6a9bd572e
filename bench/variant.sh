# variant.sh (sourced by the step benchmarks): run_variant BIN CONFIG LOG VARIANT... runs
# `BIN train CONFIG` with a VARIANTS entry's settings, split at commas: SHARDLM_BIN=PATH runs
# that program instead of BIN, SET=KEY=VALUE passes --set KEY=VALUE, the rest are environment
# settings (NAME=VALUE).  Output to LOG; its exit status.
run_variant() {
	local bin=$1 cfg=$2 log=$3 e envs=() sets=() ev=()
	shift 3
	[ -z "${1:-}" ] || [ "$1" = - ] || IFS=, read -r -a envs <<<"$1"
	for e in "${envs[@]}"; do
		case $e in
		SHARDLM_BIN=*) bin=${e#SHARDLM_BIN=} ;;
		SET=*) sets+=(--set "${e#SET=}") ;;
		*) ev+=("$e") ;;
		esac
	done
	env "${ev[@]}" "$bin" train "$cfg" "${sets[@]}" >"$log" 2>&1
}
