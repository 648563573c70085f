#!/usr/bin/env bash
# Installs kiln into a fresh prefix, then builds and runs a small program against the
# installed libkiln, finding it only through pkg-config (PKG_CONFIG_PATH set to the
# prefix): it JIT-compiles a tiny model with kiln_jit and prints its output.
# usage: check_install.sh CMAKE BUILD_DIR CC [CFLAGS...]
set -eu
cmake=$1 build=$2 cc=$3
shift 3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix
"$cmake" --install "$build" --prefix "$prefix" > "$tmp/install.log" || { cat "$tmp/install.log"; exit 1; }
for f in bin/kiln include/kiln/kiln.h include/kiln/model.h; do
  [ -e "$prefix/$f" ] || { echo "check_install: $prefix/$f was not installed" >&2; exit 1; }
done
pc=$(find "$prefix" -name kiln.pc)
[ -n "$pc" ] || { echo "check_install: kiln.pc was not installed" >&2; exit 1; }
export PKG_CONFIG_PATH=$(dirname "$pc")
libdir=$(pkg-config --variable=libdir kiln)
cat > "$tmp/hello.c" <<'C'
#include <kiln/kiln.h>
#include <stdio.h>

int main(void) {
    kiln_error err;
    kiln_module *m = kiln_jit("input x : f32[3]\ny = relu(x)\noutput y\n", NULL, &err);
    if (!m) {
        fprintf(stderr, "hello: %s\n", err.message);
        return 1;
    }
    float x[3] = {-1, 2, -3}, y[3];
    const void *in[] = {x};
    void *out[] = {y};
    int rc = kiln_run(m, in, out, &err);
    if (rc == 0)
        printf("%s = %g %g %g\n", kiln_def(m)->outputs[0].name, y[0], y[1], y[2]);
    else
        fprintf(stderr, "hello: %s\n", err.message);
    kiln_free(m);
    return rc != 0;
}
C
# shellcheck disable=SC2046 # pkg-config's output is a list of words
"$cc" "$@" -std=c11 -Wall -Werror -o "$tmp/hello" "$tmp/hello.c" $(pkg-config --cflags --libs kiln) \
  -Wl,-rpath,"$libdir"
out=$("$tmp/hello")
echo "$out"
[ "$out" = "y = 0 2 0" ]
