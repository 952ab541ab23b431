#ifndef CLIBCRYPTO_SHIM_H
#define CLIBCRYPTO_SHIM_H
// OpenSSL's libcrypto (Debian libssl-dev): digests, random bytes, constant-time comparison.
#include <openssl/evp.h>
#include <openssl/crypto.h>
#include <openssl/rand.h>
#endif
