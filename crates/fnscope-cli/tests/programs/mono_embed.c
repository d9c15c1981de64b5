/* Runs a .NET program in a Mono runtime embedded through libmonosgen-2.0: linked (the
 * default) or, built with -DLOAD_AT_RUN_TIME, loaded with dlopen once main runs. */
#include <stdio.h>
#ifdef LOAD_AT_RUN_TIME
#include <dlfcn.h>
typedef void *(*jit_init_fn)(const char *);
typedef void *(*open_fn)(void *, const char *);
typedef int (*exec_fn)(void *, void *, int, char **);
typedef void (*config_fn)(const char *);
#else
#include <mono/jit/jit.h>
#include <mono/metadata/assembly.h>
#include <mono/metadata/mono-config.h>
#endif

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s PROGRAM.exe [ARGS]\n", argv[0]);
        return 2;
    }
#ifdef LOAD_AT_RUN_TIME
    void *lib = dlopen("libmonosgen-2.0.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!lib) {
        fprintf(stderr, "%s\n", dlerror());
        return 2;
    }
    config_fn config_parse = (config_fn)dlsym(lib, "mono_config_parse");
    jit_init_fn jit_init = (jit_init_fn)dlsym(lib, "mono_jit_init");
    open_fn assembly_open = (open_fn)dlsym(lib, "mono_domain_assembly_open");
    exec_fn jit_exec = (exec_fn)dlsym(lib, "mono_jit_exec");
    if (!config_parse || !jit_init || !assembly_open || !jit_exec) {
        fprintf(stderr, "libmonosgen-2.0 lacks the embedding API\n");
        return 2;
    }
    config_parse(NULL);
    void *domain = jit_init("embedded");
    void *assembly = assembly_open(domain, argv[1]);
#else
    mono_config_parse(NULL);
    MonoDomain *domain = mono_jit_init("embedded");
    MonoAssembly *assembly = mono_domain_assembly_open(domain, argv[1]);
#endif
    if (!assembly) {
        fprintf(stderr, "cannot open %s\n", argv[1]);
        return 2;
    }
    /* Not mono_jit_cleanup: it may wait for threads; the exit code is what the test wants. */
#ifdef LOAD_AT_RUN_TIME
    return jit_exec(domain, assembly, argc - 1, argv + 1);
#else
    return mono_jit_exec(domain, assembly, argc - 1, argv + 1);
#endif
}
