#ifndef CLINUXHEADERS_SHIM_H
#define CLINUXHEADERS_SHIM_H
// glibc declarations that Swift's Glibc module map does not export. Headers only: nothing to link.
#include <sys/types.h>
#include <sys/xattr.h>  // getxattr, listxattr (SystemSupport's ExtendedAttributes)
#include <sys/pidfd.h>  // pidfd_open (SystemSupport's ProcessInfoFiles)
#include <sys/syscall.h>
#include <unistd.h>

// renameat2(2) (SystemSupport's FileCalls.swift, for LocalProvider's writes): glibc declares it
// only under _GNU_SOURCE, which Swift's Glibc module does not set, and `syscall` is variadic (not
// callable from Swift).
#define PROVIDERFS_RENAME_NOREPLACE 1U
#define PROVIDERFS_RENAME_EXCHANGE 2U
static inline int providerfs_renameat2(
    int olddirfd, const char *oldpath, int newdirfd, const char *newpath, unsigned int flags) {
    return (int)syscall(SYS_renameat2, olddirfd, oldpath, newdirfd, newpath, flags);
}
// copy_file_range(2), declared under _GNU_SOURCE only as well.
static inline long providerfs_copy_file_range(int infd, int outfd, unsigned long length) {
    return (long)syscall(SYS_copy_file_range, infd, (void *)0, outfd, (void *)0, length, 0U);
}
// fallocate(2) (ProviderCache's staging files), declared under _GNU_SOURCE only, and its one
// mode flag ProviderFS offers.
#define PROVIDERFS_FALLOC_FL_KEEP_SIZE 1
static inline int providerfs_fallocate(int fd, int mode, long long offset, long long length) {
    return (int)syscall(SYS_fallocate, fd, mode, (off_t)offset, (off_t)length);
}
// utimensat's "leave this time alone" (a macro Swift does not import).
#define PROVIDERFS_UTIME_OMIT 1073741822L
// utimensat's "now", and open's O_TMPFILE (macros Swift does not import).
#define PROVIDERFS_UTIME_NOW 1073741823L
// O_TMPFILE is __O_TMPFILE | O_DIRECTORY, whose value differs by architecture; <fcntl.h> gives it
// only under _GNU_SOURCE. The kernel's generic value, else x86's.
#include <fcntl.h>
#if defined(O_TMPFILE)
#define PROVIDERFS_O_TMPFILE O_TMPFILE
#elif defined(__O_TMPFILE)
#define PROVIDERFS_O_TMPFILE __O_TMPFILE
#else
#define PROVIDERFS_O_TMPFILE (020000000 | O_DIRECTORY)
#endif
// O_PATH (a descriptor that only names a file: D-425), likewise only under _GNU_SOURCE.
#if defined(O_PATH)
#define PROVIDERFS_O_PATH O_PATH
#elif defined(__O_PATH)
#define PROVIDERFS_O_PATH __O_PATH
#else
#define PROVIDERFS_O_PATH 010000000
#endif
#endif
