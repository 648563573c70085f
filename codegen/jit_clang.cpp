/* The in-process JIT: the C that emit_c_model writes, compiled by Clang as a library
 * and linked into the running process by LLVM's ORC LLJIT.
 *
 * Compiling: Clang's driver turns the flags the system compiler would get (-O2,
 * -march=native, -fno-math-errno, ...) into the compiler's own invocation, with the
 * header paths of this installation and the resource directory CMake found; the
 * source is handed over as a remapped memory buffer, and EmitLLVMOnlyAction makes
 * the optimized llvm::Module. Kernels are compiled several to a translation unit,
 * and each one's code is cloned out of the module into an object of its own. Linking: LLJIT compiles the
 * module for the host CPU, binds `kiln_weights_blob` to the weights (a copy, or a model cache entry mapped in
 * place) and the BLAS entry points to the ones this library links, and takes everything else (libc, libm,
 * pthreads) from the process. Nothing touches the disk but the object cache: an llvm::ObjectCache that keeps
 * the object file in the cache entry CACHE_DIR/KEY.o (codegen/cache.c), written atomically, so that a second
 * JIT of the same source loads that file and runs neither Clang nor LLVM's code generation. An entry that is
 * corrupt, or whose object does not link, is a miss: compiled again, overwritten, and said once on stderr.
 * The C interface is in jit_clang.h. */
#include "jit_clang.h"
#include "cache.h"

#include <clang/Basic/Diagnostic.h>
#include <clang/Basic/DiagnosticOptions.h>
#include <clang/CodeGen/CodeGenAction.h>
#include <clang/Driver/Compilation.h>
#include <clang/Driver/Driver.h>
#include <clang/Frontend/CompilerInstance.h>
#include <clang/Frontend/CompilerInvocation.h>
#include <clang/Frontend/TextDiagnosticPrinter.h>
#include <clang/Lex/PreprocessorOptions.h>
#include <llvm/ExecutionEngine/Orc/CompileUtils.h>
#include <llvm/ExecutionEngine/Orc/ExecutionUtils.h>
#include <llvm/ExecutionEngine/Orc/LLJIT.h>
#include <llvm/Support/FileUtilities.h>
#include <llvm/Support/Host.h>
#include <llvm/Support/MemoryBuffer.h>
#include <llvm/Support/TargetSelect.h>
#include <llvm/Support/raw_ostream.h>
#include <llvm/Transforms/Utils/Cloning.h>

#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#ifndef KILN_CLANG_RESOURCE_DIR
#error "KILN_CLANG_RESOURCE_DIR (clang -print-resource-dir) must be defined by the build"
#endif

#ifdef KILN_HAVE_OPENBLAS
/* The BLAS entry points generated code calls, bound explicitly so that they resolve
 * (and this library links OpenBLAS) whatever the process has loaded. */
extern "C" void cblas_sgemm(int order, int trans_a, int trans_b, int m, int n, int k, float alpha,
                            const float *a, int lda, const float *b, int ldb, float beta, float *c, int ldc);
extern "C" void openblas_set_num_threads(int n);
#endif

namespace {

const char source_name[] = "kiln_model.c";

/* One unit of a model and its object file, as the cache entry CACHE_DIR/KEY.o
 * (codegen/cache.c: the object with a trailer holding the key and a checksum); a
 * cache with no path keeps nothing. */
struct Unit {
    const char *source = nullptr; /* null: only a cached object will do */
    size_t len = 0;
    const char *kernel = nullptr; /* a kernel's definition: its function's name */
    std::string path, key;
    std::unique_ptr<llvm::MemoryBuffer> object;
    std::string error; /* why it could not be compiled */
    bool warned = false;

    /* The cached object, or false for a miss; a corrupt entry is a miss, said once
     * (unless there is no source to rebuild it from: that caller says nothing). */
    bool load() {
        unsigned char *payload = nullptr;
        size_t n = 0;
        CacheLookup found =
            path.empty() ? CACHE_MISS : cache_entry_read(path.c_str(), key.c_str(), &payload, &n);
        if (found == CACHE_CORRUPT && source)
            corrupt();
        if (found == CACHE_HIT)
            object = llvm::MemoryBuffer::getMemBufferCopy(
                llvm::StringRef(reinterpret_cast<const char *>(payload), n), path);
        cache_entry_free(payload);
        return object != nullptr;
    }

    /* The entry is bad (or its object would not load): warn, and let the compile overwrite it. */
    void corrupt() {
        if (!warned)
            cache_entry_warn(path.c_str());
        warned = true;
    }
};

/* What a handle owns: the weights (a copy, or a cache entry's mapping) and the JIT
 * with the model's code, which goes first. */
struct ClangJit {
    const unsigned char *weights = nullptr;
    unsigned char *copy = nullptr;
    const unsigned char *mapping = nullptr;
    size_t mapped = 0;
    std::unique_ptr<llvm::orc::LLJIT> jit;
    ~ClangJit() {
        jit.reset();
        std::free(copy);
        cache_entry_unmap(mapping, mapped);
    }
};

void set_error(char *err, size_t errlen, const std::string &what, const std::string &detail) {
    std::string msg = what + (detail.empty() ? "" : ": " + detail);
    while (!msg.empty() && msg.back() == '\n')
        msg.pop_back();
    std::snprintf(err, errlen, "%s", msg.c_str());
}

/* codegen/codegen.h's, a C header */
extern "C" int cc_vector_floats(const char *cpu);
extern "C" const char *cc_vector_width_flag(int vector_floats);

/* Compiles the source into an optimized module; NULL with Clang's diagnostics in
 * *diag_text. */
std::unique_ptr<llvm::Module> compile_c(const char *source, size_t len, const char *cpu, bool unroll,
                                        llvm::LLVMContext &ctx, std::string *diag_text) {
    llvm::raw_string_ostream diag_out(*diag_text);
    llvm::IntrusiveRefCntPtr<clang::DiagnosticOptions> diag_opts(new clang::DiagnosticOptions);
    clang::TextDiagnosticPrinter printer(diag_out, diag_opts.get());
    clang::DiagnosticsEngine diags(llvm::IntrusiveRefCntPtr<clang::DiagnosticIDs>(new clang::DiagnosticIDs),
                                   diag_opts, &printer, false);

    /* The driver works out the compiler's own flags: target CPU and features for
     * -march (native unless the caller chose a CPU), and the header search paths. */
    std::string march = std::string("-march=") + (cpu ? cpu : "native");
    std::vector<const char *> args = {"clang",
                                      "-fsyntax-only",
                                      "-O2",
                                      march.c_str(),
                                      "-fPIC",
                                      "-fno-math-errno",
                                      "-fwrapv",
                                      "-std=gnu11",
                                      "-DKILN_WEIGHTS_EXTERN",
                                      unroll ? "-funroll-loops" : "-fno-unroll-loops",
                                      "-resource-dir",
                                      KILN_CLANG_RESOURCE_DIR,
                                      source_name};
    if (const char *vector_width = cc_vector_width_flag(cc_vector_floats(cpu)))
        args.push_back(vector_width);
    auto invocation = std::make_shared<clang::CompilerInvocation>();
    {
        /* the units' threads turn their flags into an invocation one at a time (a few
           milliseconds), then compile at once: ThreadSanitizer saw one thread's driver
           write a static table of its options while another's read it */
        static std::mutex driver_lock;
        std::lock_guard<std::mutex> hold(driver_lock);
        clang::driver::Driver driver(KILN_CLANG_RESOURCE_DIR "/../../../bin/clang",
                                     llvm::sys::getProcessTriple(), diags);
        driver.setCheckInputsExist(false);
        std::unique_ptr<clang::driver::Compilation> comp(driver.BuildCompilation(args));
        if (!comp || diags.hasErrorOccurred() || comp->getJobs().size() != 1 ||
            !llvm::isa<clang::driver::Command>(*comp->getJobs().begin()))
            return nullptr;
        const auto &cc1_args = llvm::cast<clang::driver::Command>(*comp->getJobs().begin()).getArguments();
        if (!clang::CompilerInvocation::CreateFromArgs(*invocation, cc1_args, diags))
            return nullptr;
    }
    /* the driver asks the compiler to leak its ASTs and target machine, as a process
     * that is about to exit may; this one goes on */
    invocation->getFrontendOpts().DisableFree = false;
    invocation->getCodeGenOpts().DisableFree = false;
    invocation->getPreprocessorOpts().addRemappedFile(
        source_name, llvm::MemoryBuffer::getMemBuffer(llvm::StringRef(source, len), source_name).release());
    clang::CompilerInstance compiler;
    compiler.setInvocation(std::move(invocation));
    compiler.createDiagnostics(&printer, false);
    compiler.setVerboseOutputStream(llvm::nulls()); /* not "N errors generated." on stderr */
    clang::EmitLLVMOnlyAction action(&ctx);
    if (!compiler.ExecuteAction(action))
        return nullptr;
    return action.takeModule();
}

/* Binds the symbols the generated code needs from the host. */
llvm::Error define_host_symbols(llvm::orc::LLJIT &jit, const void *weights) {
    auto &dylib = jit.getMainJITDylib();
    auto process =
        llvm::orc::DynamicLibrarySearchGenerator::GetForCurrentProcess(jit.getDataLayout().getGlobalPrefix());
    if (!process)
        return process.takeError();
    dylib.addGenerator(std::move(*process));
    auto exported = llvm::JITSymbolFlags::Exported;
    return dylib.define(llvm::orc::absoluteSymbols({
        {jit.mangleAndIntern("kiln_weights_blob"),
         llvm::JITEvaluatedSymbol(llvm::pointerToJITTargetAddress(weights), exported)},
#ifdef KILN_HAVE_OPENBLAS
        {jit.mangleAndIntern("cblas_sgemm"),
         llvm::JITEvaluatedSymbol(llvm::pointerToJITTargetAddress(&cblas_sgemm), exported)},
        {jit.mangleAndIntern("openblas_set_num_threads"),
         llvm::JITEvaluatedSymbol(llvm::pointerToJITTargetAddress(&openblas_set_num_threads), exported)},
#endif
    }));
}

/* LLVM's code generator for this machine, or null with why in *error. */
std::unique_ptr<llvm::TargetMachine> target_machine(std::string *error) {
    auto jtmb = llvm::orc::JITTargetMachineBuilder::detectHost();
    auto tm = jtmb ? jtmb->createTargetMachine() : jtmb.takeError();
    if (!tm) {
        *error = "cannot make LLVM's code generator: " + llvm::toString(tm.takeError());
        return nullptr;
    }
    return std::move(*tm);
}

/* Gives u the object compiled from module, and stores it in the cache. */
void emit_object(Unit &u, llvm::TargetMachine &tm, llvm::Module &module) {
    auto object = llvm::orc::SimpleCompiler(tm)(module);
    if (!object) {
        u.error = "cannot generate the model's code: " + llvm::toString(object.takeError());
        return;
    }
    u.object = std::move(*object);
    if (!u.path.empty())
        cache_entry_write(u.path.c_str(), u.key.c_str(), nullptr, 0, u.object->getBufferStart(),
                          u.object->getBufferSize());
}

/* Compiles a unit's source into its object file. */
void compile_unit(Unit &u, const char *cpu, bool unroll) {
    auto ctx = std::make_unique<llvm::LLVMContext>();
    std::string diag_text;
    std::unique_ptr<llvm::Module> module = compile_c(u.source, u.len, cpu, unroll, *ctx, &diag_text);
    if (!module) {
        u.error = "Clang failed on the generated code (a bug in kiln):\n" + diag_text;
        return;
    }
    if (auto tm = target_machine(&u.error))
        emit_object(u, *tm, *module);
}

/* The part of module that is the kernel `symbol`: its definition and the internal
 * functions and data it uses; every other kernel only declared. */
std::unique_ptr<llvm::Module> kernel_module(const llvm::Module &module, llvm::StringRef symbol) {
    llvm::ValueToValueMapTy map;
    auto one = llvm::CloneModule(module, map, [symbol](const llvm::GlobalValue *g) {
        return g->hasLocalLinkage() || g->getName() == symbol;
    });
    for (bool dropped = true; dropped;) { /* what only the other kernels used */
        dropped = false;
        for (auto f = one->begin(); f != one->end();) {
            llvm::Function &fn = *f++;
            if (fn.hasLocalLinkage() && fn.use_empty()) {
                fn.eraseFromParent();
                dropped = true;
            }
        }
        for (auto g = one->global_begin(); g != one->global_end();) {
            llvm::GlobalVariable &var = *g++;
            if (var.hasLocalLinkage() && var.use_empty()) {
                var.eraseFromParent();
                dropped = true;
            }
        }
    }
    return one;
}

/* Compiles the kernels of group together, after the prelude, as one translation
 * unit, and gives each kernel an object of its own. */
void compile_kernels(const std::vector<Unit *> &group, const std::string &prelude, const char *cpu,
                     bool unroll) {
    std::string source = prelude;
    for (Unit *u : group)
        source.append(u->source, u->len);
    auto ctx = std::make_unique<llvm::LLVMContext>();
    std::string diag_text, error;
    std::unique_ptr<llvm::Module> module =
        compile_c(source.data(), source.size(), cpu, unroll, *ctx, &diag_text);
    std::unique_ptr<llvm::TargetMachine> tm = module ? target_machine(&error) : nullptr;
    for (Unit *u : group) {
        if (!module)
            u->error = "Clang failed on the generated code (a bug in kiln):\n" + diag_text;
        else if (!tm)
            u->error = error;
        else
            emit_object(*u, *tm, *kernel_module(*module, u->kernel));
    }
}

/* Compiles every unit without an object, each on a thread of its own, and the
 * kernels among them in up to one group a core: the units of a model are what its
 * compile spreads over the cores. */
void compile_units(std::vector<Unit> &units, const std::string &prelude, const char *cpu, bool unroll) {
    std::vector<Unit *> kernels;
    std::vector<std::thread> threads;
    for (Unit &u : units)
        if (!u.object && u.kernel)
            kernels.push_back(&u);
        else if (!u.object)
            threads.emplace_back([&u, cpu, unroll] { compile_unit(u, cpu, unroll); });
    /* a group's translation unit parses the prelude again: at least a few kernels each */
    size_t cores = std::max(1u, std::min(std::thread::hardware_concurrency(), 4u));
    size_t n_groups = std::min(cores, (kernels.size() + 3) / 4);
    std::vector<std::vector<Unit *>> groups(n_groups);
    for (size_t i = 0; i < kernels.size(); i++)
        groups[i % n_groups].push_back(kernels[i]);
    for (auto &group : groups)
        threads.emplace_back(
            [&group, &prelude, cpu, unroll] { compile_kernels(group, prelude, cpu, unroll); });
    for (std::thread &t : threads)
        t.join();
}

/* A fresh JIT in h with the units' objects and the precompiled kernels; sets *def.
 * Returns null, or what failed with the message in err. */
const char *link_model(ClangJit &h, std::vector<Unit> &units, llvm::StringRef kernels,
                       const kiln_model_def **def, char *err, size_t errlen) {
    h.jit.reset();
    auto jit = llvm::orc::LLJITBuilder().create();
    if (!jit) {
        set_error(err, errlen, "cannot start the LLVM JIT", llvm::toString(jit.takeError()));
        return "jit";
    }
    h.jit = std::move(*jit);
    if (auto e = define_host_symbols(*h.jit, h.weights)) {
        set_error(err, errlen, "cannot define the host's symbols in the JIT", llvm::toString(std::move(e)));
        return "symbols";
    }
    /* a copy: the object's reader wants it aligned, which the embedded bytes are not */
    if (!kernels.empty())
        if (auto e = h.jit->addObjectFile(llvm::MemoryBuffer::getMemBufferCopy(kernels, "kiln_kernels.o"))) {
            set_error(err, errlen, "cannot add kiln's kernels to the JIT", llvm::toString(std::move(e)));
            return "kernels";
        }
    for (Unit &u : units)
        if (auto e =
                h.jit->addObjectFile(llvm::MemoryBuffer::getMemBufferCopy(u.object->getBuffer(), u.path))) {
            set_error(err, errlen, "cannot add the model's code to the JIT", llvm::toString(std::move(e)));
            return "link";
        }
    auto entry = h.jit->lookup("kiln_model");
    if (!entry) {
        set_error(err, errlen, "cannot link the compiled model", llvm::toString(entry.takeError()));
        return "link";
    }
    auto kiln_model = reinterpret_cast<const kiln_model_def *(*)(void)>(entry->getAddress());
    *def = kiln_model();
    return nullptr;
}

} // namespace

extern "C" void *clang_jit_compile(const JitUnits *in, const JitWeights *weights, const void *kernels,
                                   size_t kernels_len, const char *cpu, bool unroll, const char *cache_dir,
                                   const kiln_model_def **def, char *err, size_t errlen) {
    static std::once_flag init;
    std::call_once(init, [] {
        llvm::InitializeNativeTarget();
        llvm::InitializeNativeTargetAsmPrinter();
        llvm::InitializeNativeTargetAsmParser();
    });
    *def = nullptr;
    auto h = std::make_unique<ClangJit>();
    h->mapping = weights->mapping;
    h->mapped = weights->mapped;
    if (h->mapping) {
        h->weights = static_cast<const unsigned char *>(weights->bytes);
    } else {
        /* 64-byte aligned, as the blob is in a compiled .so; never a null pointer */
        h->copy = static_cast<unsigned char *>(std::aligned_alloc(64, (weights->len + 64) / 64 * 64));
        if (!h->copy) {
            set_error(err, errlen, "out of memory copying the weights", "");
            return nullptr;
        }
        if (weights->len)
            std::memcpy(h->copy, weights->bytes, weights->len);
        h->weights = h->copy;
    }
    std::vector<Unit> units((size_t)in->n);
    std::string prelude = in->prelude ? std::string(in->prelude, in->prelude_len) : std::string();
    bool all_cached = true, any_cached = false;
    for (int i = 0; i < in->n; i++) {
        Unit &u = units[(size_t)i];
        u.source = in->sources ? in->sources[i] : nullptr;
        u.len = in->sources ? in->lens[i] : 0;
        u.kernel =
            in->sources && i >= in->n - in->n_kernels ? in->symbols[i - (in->n - in->n_kernels)] : nullptr;
        u.key = in->keys[i] ? in->keys[i] : "";
        u.path = cache_dir ? std::string(cache_dir) + "/" + u.key + ".o" : "";
        bool hit = u.load();
        all_cached = all_cached && hit;
        any_cached = any_cached || hit;
    }
    if (!all_cached && !in->sources) {
        set_error(err, errlen, "the model's objects are not in the cache", "");
        return nullptr;
    }
    compile_units(units, prelude, cpu, unroll);
    for (Unit &u : units)
        if (!u.object) {
            set_error(err, errlen, "cannot compile the model in process", u.error);
            return nullptr;
        }
    llvm::StringRef kernel_object(static_cast<const char *>(kernels), kernels_len);
    const char *failed = link_model(*h, units, kernel_object, def, err, errlen);
    if (failed && any_cached && in->sources && !strcmp(failed, "link")) {
        /* whole cached objects that still would not link: compile them afresh */
        for (Unit &u : units) {
            u.corrupt();
            u.object.reset();
        }
        compile_units(units, prelude, cpu, unroll);
        for (Unit &u : units)
            if (!u.object) {
                set_error(err, errlen, "cannot compile the model in process", u.error);
                return nullptr;
            }
        failed = link_model(*h, units, kernel_object, def, err, errlen);
    }
    return failed ? nullptr : h.release();
}

extern "C" void clang_jit_free(void *handle) {
    delete static_cast<ClangJit *>(handle);
}
