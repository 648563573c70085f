#!/usr/bin/env bash
# libkiln's dynamic symbol table is its documented API and nothing more: every
# symbol it defines starts with kiln_ and is declared KILN_API in kiln/kiln.h, and
# every KILN_API function of the header is there. A helper that leaks (an internal
# function, a template instantiation of the Clang JIT, a statically linked
# library's symbol) is listed by name.
# usage: check_exports.sh NM LIBKILN KILN_H
set -u
nm=$1 lib=$2 header=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if ! "$nm" -D --defined-only "$lib" > "$tmp/nm"; then
  echo "check_exports: '$nm' cannot read '$lib'" >&2
  exit 1
fi
awk 'NF >= 3 { print $3 }' "$tmp/nm" | sed 's/@.*//' | sort -u > "$tmp/exported"
# the declarations: `KILN_API type *kiln_name(` (a declaration may wrap after the name)
grep -E '^KILN_API ' "$header" | grep -oE 'kiln_[a-z_0-9]+\(' | tr -d '(' | sort -u > "$tmp/declared"
status=0
if grep -v '^kiln_' "$tmp/exported" > "$tmp/foreign"; then
  echo "check_exports: $lib exports symbols outside its API:" >&2
  sed 's/^/  /' "$tmp/foreign" >&2
  status=1
fi
if comm -23 "$tmp/exported" "$tmp/declared" | grep '^kiln_' > "$tmp/undeclared"; then
  echo "check_exports: $lib exports kiln_ symbols that kiln.h does not declare KILN_API:" >&2
  sed 's/^/  /' "$tmp/undeclared" >&2
  status=1
fi
if comm -13 "$tmp/exported" "$tmp/declared" > "$tmp/missing" && [ -s "$tmp/missing" ]; then
  echo "check_exports: kiln.h declares KILN_API functions that $lib does not export:" >&2
  sed 's/^/  /' "$tmp/missing" >&2
  status=1
fi
[ $status -eq 0 ] && echo "check_exports: $(wc -l < "$tmp/exported") symbols, all of kiln.h's API"
exit $status
