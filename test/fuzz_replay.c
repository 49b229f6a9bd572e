/*
 * fuzz_replay: one libFuzzer harness of fuzz/ (SL_HARNESS names its file) with fuzz/replay.c's
 * main instead of libFuzzer, built by make check with the project's compiler and sanitizers, so
 * CI replays the committed corpora without clang (test_fuzz_replay.sh).
 */
#include SL_HARNESS
#include "../fuzz/replay.c"
