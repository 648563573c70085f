/* npy_compare GOT.npy EXPECTED.npy: exits 0 when the two agree within cli.md's
 * tolerance |a - b| <= 1e-4 + 1e-4 |b| everywhere (NaN matching NaN), else prints
 * the first mismatches and the largest error and exits 1. */
#include "frontend/frontend.h"

#include <math.h>

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: npy_compare GOT.npy EXPECTED.npy\n");
        return 2;
    }
    Diag d;
    diag_init(&d, stderr);
    Tensor *got = NULL, *want = NULL;
    if (npy_read(argv[1], &got, &d) || npy_read(argv[2], &want, &d))
        return 1;
    int rc = 0;
    if (!type_equal(&got->type, &want->type)) {
        char a[160], b[160];
        fprintf(stderr, "type %s differs from the expected %s\n", type_str(&got->type, a, sizeof a),
                type_str(&want->type, b, sizeof b));
        rc = 1;
    }
    int64_t n = rc ? 0 : type_numel(&got->type), bad = 0;
    double worst = 0;
    for (int64_t i = 0; i < n; i++) {
        double a = got->data[i], b = want->data[i], err = fabs(a - b);
        if (isnan(a) && isnan(b))
            continue;
        if (err > worst || isnan(err))
            worst = err;
        if (!(err <= 1e-4 + 1e-4 * fabs(b)) && a != b) {
            if (bad++ < 5)
                fprintf(stderr, "[%lld]: got %.9g, expected %.9g\n", (long long)i, a, b);
            rc = 1;
        }
    }
    if (bad)
        fprintf(stderr, "%lld of %lld values differ; largest error %.3g\n", (long long)bad, (long long)n,
                worst);
    tensor_free(got);
    tensor_free(want);
    return rc;
}
