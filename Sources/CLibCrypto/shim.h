#ifndef CLIBCRYPTO_SHIM_H
#define CLIBCRYPTO_SHIM_H
// OpenSSL's libcrypto (Debian libssl-dev): digests, random bytes, constant-time comparison.
#include <openssl/evp.h>
#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <openssl/sha.h>

// SHA-256 without EVP (CryptoSupport.SHA256, D-533): deprecated since OpenSSL 3.0 but in every
// 3.x, and free of the provider start-up an EVP fetch costs. Wrapped, so that the deprecation
// stays here.
#pragma clang diagnostic push
#pragma clang diagnostic ignored "-Wdeprecated-declarations"
static inline int clibcrypto_sha256_init(SHA256_CTX *context) { return SHA256_Init(context); }
static inline int clibcrypto_sha256_update(SHA256_CTX *context, const void *bytes, size_t count) {
    return SHA256_Update(context, bytes, count);
}
static inline int clibcrypto_sha256_final(unsigned char *digest, SHA256_CTX *context) {
    return SHA256_Final(digest, context);
}
#pragma clang diagnostic pop
#endif
