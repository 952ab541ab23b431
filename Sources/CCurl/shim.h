#ifndef CCURL_SHIM_H
#define CCURL_SHIM_H
// libcurl (Debian libcurl4-openssl-dev) for the WebDAV provider. curl_easy_setopt and
// curl_easy_getinfo are variadic, which Swift cannot call: these non-variadic wrappers fix the
// argument type of each option family (long, curl_off_t, string, pointer, list, callbacks).
#include <curl/curl.h>

/// A write, read or header callback: (buffer, size, count, context) -> bytes handled.
typedef size_t (*pfs_curl_data_callback)(char *buffer, size_t size, size_t count, void *context);
/// CURLOPT_XFERINFOFUNCTION: non-zero aborts the transfer.
typedef int (*pfs_curl_progress_callback)(
    void *context, curl_off_t download_total, curl_off_t download_now, curl_off_t upload_total,
    curl_off_t upload_now);

static inline CURLcode pfs_curl_setopt_long(CURL *handle, CURLoption option, long value) {
    return curl_easy_setopt(handle, option, value);
}

static inline CURLcode pfs_curl_setopt_offset(CURL *handle, CURLoption option, curl_off_t value) {
    return curl_easy_setopt(handle, option, value);
}

static inline CURLcode pfs_curl_setopt_string(CURL *handle, CURLoption option, const char *value) {
    return curl_easy_setopt(handle, option, value);
}

static inline CURLcode pfs_curl_setopt_pointer(CURL *handle, CURLoption option, void *value) {
    return curl_easy_setopt(handle, option, value);
}

static inline CURLcode pfs_curl_setopt_list(CURL *handle, CURLoption option, struct curl_slist *value) {
    return curl_easy_setopt(handle, option, value);
}

static inline CURLcode pfs_curl_setopt_data_callback(
    CURL *handle, CURLoption option, pfs_curl_data_callback value) {
    return curl_easy_setopt(handle, option, value);
}

static inline CURLcode pfs_curl_setopt_progress_callback(CURL *handle, pfs_curl_progress_callback value) {
    return curl_easy_setopt(handle, CURLOPT_XFERINFOFUNCTION, value);
}

static inline CURLcode pfs_curl_getinfo_long(CURL *handle, CURLINFO info, long *value) {
    return curl_easy_getinfo(handle, info, value);
}

/// CURL_READFUNC_ABORT and CURL_WRITEFUNC_ERROR-like constants as values Swift can see.
static inline size_t pfs_curl_read_abort(void) { return CURL_READFUNC_ABORT; }

#endif
