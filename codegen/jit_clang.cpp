/* The in-process JIT: the C that emit_c_model writes, compiled by Clang as a library
 * and linked into the running process by LLVM's ORC LLJIT.
 *
 * Compiling: Clang's driver turns the flags the system compiler would get (-O2,
 * -march=native, -fno-math-errno, ...) into the compiler's own invocation, with the
 * header paths of this installation and the resource directory CMake found; the
 * source is handed over as a remapped memory buffer, and EmitLLVMOnlyAction makes
 * the optimized llvm::Module. Linking: LLJIT compiles the module for the host CPU,
 * binds `kiln_weights_blob` to the handle's copy of the weights and the BLAS entry
 * points to the ones this library links, and takes everything else (libc, libm,
 * pthreads) from the process. Nothing touches the disk but the object cache: an
 * llvm::ObjectCache that keeps the object file in the cache entry CACHE_DIR/KEY.o
 * (codegen/cache.c), written atomically, so that a second JIT of the same source
 * loads that file and runs neither Clang nor LLVM's code generation. An entry that
 * is corrupt, or whose object does not link, is a miss: compiled again, overwritten,
 * and said once on stderr. The C interface is in jit_clang.h. */
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
#include <llvm/ExecutionEngine/ObjectCache.h>
#include <llvm/ExecutionEngine/Orc/CompileUtils.h>
#include <llvm/ExecutionEngine/Orc/ExecutionUtils.h>
#include <llvm/ExecutionEngine/Orc/LLJIT.h>
#include <llvm/Support/FileUtilities.h>
#include <llvm/Support/Host.h>
#include <llvm/Support/MemoryBuffer.h>
#include <llvm/Support/TargetSelect.h>
#include <llvm/Support/raw_ostream.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>

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

/* The object file of one compiled model, as the cache entry CACHE_DIR/KEY.o
 * (codegen/cache.c: the object with a trailer holding the key and a checksum); a
 * cache with no path keeps nothing. The compiler is asked for a cached object only
 * when there is none to add (getObject), so load() alone reads the entry. */
class FileCache : public llvm::ObjectCache {
  public:
    FileCache(std::string path, std::string key) : path_(std::move(path)), key_(std::move(key)) {}

    /* The cached object, or null for a miss; a corrupt entry is a miss, said once. */
    std::unique_ptr<llvm::MemoryBuffer> load() {
        if (path_.empty())
            return nullptr;
        unsigned char *payload = nullptr;
        size_t len = 0;
        CacheLookup found = cache_entry_read(path_.c_str(), key_.c_str(), &payload, &len);
        if (found == CACHE_CORRUPT)
            corrupt();
        if (found != CACHE_HIT)
            return nullptr;
        auto buf = llvm::MemoryBuffer::getMemBufferCopy(
            llvm::StringRef(reinterpret_cast<const char *>(payload), len), path_);
        cache_entry_free(payload);
        return buf;
    }

    /* Whether the entry is there and whole, said quietly: a caller with nothing to
     * compile leaves a corrupt entry to the compile that will replace it. */
    bool whole() const {
        unsigned char *payload = nullptr;
        size_t len = 0;
        bool hit =
            !path_.empty() && cache_entry_read(path_.c_str(), key_.c_str(), &payload, &len) == CACHE_HIT;
        cache_entry_free(payload);
        return hit;
    }

    /* The entry is bad (or its object would not load): warn, and let the compile overwrite it. */
    void corrupt() {
        if (!warned_)
            cache_entry_warn(path_.c_str());
        warned_ = true;
    }

    void notifyObjectCompiled(const llvm::Module *, llvm::MemoryBufferRef obj) override {
        if (!path_.empty())
            cache_entry_write(path_.c_str(), key_.c_str(), obj.getBufferStart(), obj.getBufferSize());
    }

    std::unique_ptr<llvm::MemoryBuffer> getObject(const llvm::Module *) override {
        return nullptr;
    }

  private:
    std::string path_, key_;
    bool warned_ = false;
};

/* What a handle owns: the weights, the cache (the compiler holds a pointer to it)
 * and the JIT with the model's code. Members are destroyed in reverse order. */
struct ClangJit {
    std::unique_ptr<unsigned char, decltype(&std::free)> weights{nullptr, &std::free};
    std::unique_ptr<FileCache> cache;
    std::unique_ptr<llvm::orc::LLJIT> jit;
};

void set_error(char *err, size_t errlen, const std::string &what, const std::string &detail) {
    std::string msg = what + (detail.empty() ? "" : ": " + detail);
    while (!msg.empty() && msg.back() == '\n')
        msg.pop_back();
    std::snprintf(err, errlen, "%s", msg.c_str());
}

/* Compiles the source into an optimized module; NULL with Clang's diagnostics in
 * *diag_text. */
std::unique_ptr<llvm::Module> compile_c(const char *source, size_t len, const char *cpu,
                                        llvm::LLVMContext &ctx, std::string *diag_text) {
    llvm::raw_string_ostream diag_out(*diag_text);
    llvm::IntrusiveRefCntPtr<clang::DiagnosticOptions> diag_opts(new clang::DiagnosticOptions);
    clang::TextDiagnosticPrinter printer(diag_out, diag_opts.get());
    clang::DiagnosticsEngine diags(llvm::IntrusiveRefCntPtr<clang::DiagnosticIDs>(new clang::DiagnosticIDs),
                                   diag_opts, &printer, false);

    /* The driver works out the compiler's own flags: target CPU and features for
     * -march (native unless the caller chose a CPU), and the header search paths. */
    std::string march = std::string("-march=") + (cpu ? cpu : "native");
    const char *args[] = {"clang",         "-fsyntax-only",         "-O2",        march.c_str(),
                          "-fPIC",         "-fno-math-errno",       "-std=gnu11", "-DKILN_WEIGHTS_EXTERN",
                          "-resource-dir", KILN_CLANG_RESOURCE_DIR, source_name};
    clang::driver::Driver driver(KILN_CLANG_RESOURCE_DIR "/../../../bin/clang", llvm::sys::getProcessTriple(),
                                 diags);
    driver.setCheckInputsExist(false);
    std::unique_ptr<clang::driver::Compilation> comp(driver.BuildCompilation(args));
    if (!comp || diags.hasErrorOccurred() || comp->getJobs().size() != 1 ||
        !llvm::isa<clang::driver::Command>(*comp->getJobs().begin()))
        return nullptr;
    const auto &cc1_args = llvm::cast<clang::driver::Command>(*comp->getJobs().begin()).getArguments();

    auto invocation = std::make_shared<clang::CompilerInvocation>();
    if (!clang::CompilerInvocation::CreateFromArgs(*invocation, cc1_args, diags))
        return nullptr;
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

/* Adds the model to the JIT: the cached object when there is one, else the module
 * Clang makes of the source. */
llvm::Error add_model(llvm::orc::LLJIT &jit, std::unique_ptr<llvm::MemoryBuffer> object, const char *source,
                      size_t len, const char *cpu) {
    if (object)
        return jit.addObjectFile(std::move(object));
    auto ctx = std::make_unique<llvm::LLVMContext>();
    std::string diag_text;
    std::unique_ptr<llvm::Module> module = compile_c(source, len, cpu, *ctx, &diag_text);
    if (!module)
        return llvm::make_error<llvm::StringError>("Clang failed on the generated code (a bug in kiln):\n" +
                                                       diag_text,
                                                   llvm::inconvertibleErrorCode());
    return jit.addIRModule(llvm::orc::ThreadSafeModule(std::move(module), std::move(ctx)));
}

/* The JIT, its compiler storing what it compiles in cache. */
llvm::Expected<std::unique_ptr<llvm::orc::LLJIT>> make_jit(FileCache *cache) {
    return llvm::orc::LLJITBuilder()
        .setCompileFunctionCreator(
            [cache](llvm::orc::JITTargetMachineBuilder jtmb)
                -> llvm::Expected<std::unique_ptr<llvm::orc::IRCompileLayer::IRCompiler>> {
                auto tm = jtmb.createTargetMachine();
                if (!tm)
                    return tm.takeError();
                return std::make_unique<llvm::orc::TMOwningSimpleCompiler>(std::move(*tm), cache);
            })
        .create();
}

/* A fresh JIT in h with the model in it: object when there is one, else source
 * compiled, beside the precompiled kernels; sets *def. Returns null, or what failed
 * with the message in err. */
const char *link_model(ClangJit &h, std::unique_ptr<llvm::MemoryBuffer> object, const char *source,
                       size_t len, llvm::StringRef kernels, const char *cpu, const kiln_model_def **def,
                       char *err, size_t errlen) {
    h.jit.reset();
    auto jit = make_jit(h.cache.get());
    if (!jit) {
        set_error(err, errlen, "cannot start the LLVM JIT", llvm::toString(jit.takeError()));
        return "jit";
    }
    h.jit = std::move(*jit);
    if (auto e = define_host_symbols(*h.jit, h.weights.get())) {
        set_error(err, errlen, "cannot define the host's symbols in the JIT", llvm::toString(std::move(e)));
        return "symbols";
    }
    /* a copy: the object's reader wants it aligned, which the embedded bytes are not */
    if (!kernels.empty())
        if (auto e = h.jit->addObjectFile(llvm::MemoryBuffer::getMemBufferCopy(kernels, "kiln_kernels.o"))) {
            set_error(err, errlen, "cannot add kiln's kernels to the JIT", llvm::toString(std::move(e)));
            return "kernels";
        }
    if (auto e = add_model(*h.jit, std::move(object), source, len, cpu)) {
        set_error(err, errlen, "cannot compile the model in process", llvm::toString(std::move(e)));
        return "add";
    }
    /* Looking the entry point up compiles and links the module. */
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

extern "C" void *clang_jit_compile(const char *source, size_t len, const void *weights, size_t weights_bytes,
                                   const void *kernels, size_t kernels_len, const char *cpu,
                                   const char *cache_dir, const char *key, const kiln_model_def **def,
                                   char *err, size_t errlen) {
    static std::once_flag init;
    std::call_once(init, [] {
        llvm::InitializeNativeTarget();
        llvm::InitializeNativeTargetAsmPrinter();
        llvm::InitializeNativeTargetAsmParser();
    });
    *def = nullptr;
    auto h = std::make_unique<ClangJit>();
    /* 64-byte aligned, as the blob is in a compiled .so; never a null pointer */
    h->weights.reset(static_cast<unsigned char *>(std::aligned_alloc(64, (weights_bytes + 64) / 64 * 64)));
    if (!h->weights) {
        set_error(err, errlen, "out of memory copying the weights", "");
        return nullptr;
    }
    if (weights_bytes)
        std::memcpy(h->weights.get(), weights, weights_bytes);
    h->cache = std::make_unique<FileCache>(cache_dir ? std::string(cache_dir) + "/" + key + ".o" : "",
                                           key ? key : "");
    std::unique_ptr<llvm::MemoryBuffer> cached = source || h->cache->whole() ? h->cache->load() : nullptr;
    bool from_cache = cached != nullptr;
    if (!cached && !source) {
        set_error(err, errlen, "the model's object is not in the cache", "");
        return nullptr;
    }
    llvm::StringRef kernel_object(static_cast<const char *>(kernels), kernels_len);
    const char *failed = link_model(*h, std::move(cached), source, len, kernel_object, cpu, def, err, errlen);
    if (failed && from_cache && source && (!strcmp(failed, "add") || !strcmp(failed, "link"))) {
        /* the entry held a whole object that still would not link: compile it afresh */
        h->cache->corrupt();
        failed = link_model(*h, nullptr, source, len, kernel_object, cpu, def, err, errlen);
    }
    return failed ? nullptr : h.release();
}

extern "C" void clang_jit_free(void *handle) {
    delete static_cast<ClangJit *>(handle);
}
