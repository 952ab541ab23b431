#ifndef CLINUXHEADERS_SHIM_H
#define CLINUXHEADERS_SHIM_H
// glibc declarations that Swift's Glibc module map does not export. Headers only: nothing to link.
#include <sys/types.h>
#include <sys/xattr.h>  // getxattr, listxattr (SystemSupport's ExtendedAttributes)
#include <sys/pidfd.h>  // pidfd_open (SystemSupport's ProcessInfoFiles)
#endif
