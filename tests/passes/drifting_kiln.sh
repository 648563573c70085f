#!/usr/bin/env bash
# A kiln whose C target is wrong, to show that check_passes.sh catches a drift:
# runs $REAL_KILN with the same arguments, then, for `kiln run --target c`, sets
# the last value of every output file it wrote to 1.
# usage: REAL_KILN=build/kiln drifting_kiln.sh ARGS...
set -u
"$REAL_KILN" "$@" || exit
[ "$1" = run ] || exit 0
target= prev=
for a in "$@"; do
  [ "$prev" = --target ] && target=$a
  prev=$a
done
[ "$target" = c ] || exit 0
prev=
for a in "$@"; do
  if [ "$prev" = --output ]; then
    f=${a#*=}
    printf '\x00\x00\x80\x3f' | dd of="$f" bs=1 seek=$(($(stat -c %s "$f") - 4)) conv=notrunc status=none
  fi
  prev=$a
done
