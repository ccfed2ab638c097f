# Sourced by the gpu-call-*.sh scripts: unbuffered output, the call's start time, its results folder under
# $OUT (tarred at the end), the wheels gpu-call-1.sh installs, and `at LABEL` to print seconds since start.
set -u
export PYTHONUNBUFFERED=1
T0=$(date +%s)
R=$OUT/r; mkdir -p $R
export PYTHONPATH=/tmp/site:/tmp/llsite
at() { echo "$1 at $(( $(date +%s) - T0 )) s"; }
