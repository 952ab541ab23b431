#ifndef CFUSE3_SHIM_H
#define CFUSE3_SHIM_H
// 314 is the 3.12+ numbering for API 3.14 (Debian 12 ships libfuse 3.14). With the old two-digit
// scheme (35) fuse_session_loop_mt is a function-like macro and Swift cannot see it.
#ifndef FUSE_USE_VERSION
#define FUSE_USE_VERSION 314
#endif
#include <stddef.h>  // NULL, used by FUSE_BUFVEC_INIT; the clang module does not get it otherwise
#include <fuse_lowlevel.h>

// FUSE_ARGS_INIT is a macro Swift cannot import.
static inline struct fuse_args cfuse_args_init(int argc, char **argv) {
    struct fuse_args args = FUSE_ARGS_INIT(argc, argv);
    return args;
}
#endif
