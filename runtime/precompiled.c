/* The object that every compiled model links, built once per vector width when
 * kiln is built (CMakeLists.txt): kiln's precompiled kernels and the runtime. One
 * translation unit, so that it is one plain object for the in-process JIT's linker
 * and the system one alike. */
#include "kernels.c"
#include "model_rt.c"
