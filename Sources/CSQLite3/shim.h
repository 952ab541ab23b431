#ifndef CSQLITE3_SHIM_H
#define CSQLITE3_SHIM_H
#include <sqlite3.h>

// SQLITE_TRANSIENT and SQLITE_STATIC are cast macros Swift cannot import.
static inline sqlite3_destructor_type csqlite3_transient(void) { return SQLITE_TRANSIENT; }
static inline sqlite3_destructor_type csqlite3_static(void) { return SQLITE_STATIC; }
#endif
