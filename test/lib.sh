# shell helpers for the script tests
