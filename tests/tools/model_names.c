/* model_names MODEL.so: loads a compiled model with dlopen, as a program using the
 * ABI would, and prints the names its kiln_model_def gives, one a line:
 * `model NAME`, `input NAME` and `output NAME`, each byte outside printable ASCII
 * and each backslash written \xNN, so that text tests can check that a name came
 * through compilation byte for byte. Standalone C, compiled by the tests with cc. */
#include <dlfcn.h>
#include <stdio.h>

#include "kiln/model.h"

static void put_name(const char *what, const char *s) {
    printf("%s ", what);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++)
        printf(*p < 32 || *p > 126 || *p == '\\' ? "\\x%02x" : "%c", *p);
    printf("\n");
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: model_names MODEL.so\n");
        return 2;
    }
    void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    const kiln_model_def *(*model)(void) = h ? (const kiln_model_def *(*)(void))dlsym(h, "kiln_model") : NULL;
    if (!model) {
        fprintf(stderr, "model_names: %s\n", dlerror());
        return 1;
    }
    const kiln_model_def *def = model();
    put_name("model", def->name);
    for (int i = 0; i < def->n_inputs; i++)
        put_name("input", def->inputs[i].name);
    for (int k = 0; k < def->n_outputs; k++)
        put_name("output", def->outputs[k].name);
    return 0;
}
