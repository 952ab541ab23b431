/* raw_sqlite.c: the baseline for sqlite-bench. The same work through SQLite's C API directly:
 * prepared statements bound, stepped and reset, no wrapper. Built and run by Benchmarks/sqlite.sh.
 * Usage: raw_sqlite <directory> [rows] [lookups] [repetitions] [only];
 * prints "<name> <median ops/s> <median ops per CPU-second>". */
#include <pthread.h>
#include <sqlite3.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double clock_seconds(clockid_t clock) {
    struct timespec now;
    clock_gettime(clock, &now);
    return now.tv_sec + now.tv_nsec / 1e9;
}
static double seconds(void) { return clock_seconds(CLOCK_MONOTONIC); }
static double cpu_seconds(void) { return clock_seconds(CLOCK_PROCESS_CPUTIME_ID); }

/* Wall and CPU-time rates of the current measurement (see sqlite-bench for why both). */
static double *rates, *cpu_rates;
static double started, cpu_started;
static void start_run(void) { started = seconds(); cpu_started = cpu_seconds(); }
static void end_run(int r, int operations) {
    rates[r] = operations / (seconds() - started);
    cpu_rates[r] = operations / (cpu_seconds() - cpu_started);
}

static int compare(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *values, int count) {
    qsort(values, count, sizeof(double), compare);
    return values[count / 2];
}

static double median(double *values, int count);
static int repetitions = 5;
static void report(const char *name) {
    printf("%s %.0f %.0f\n", name, median(rates, repetitions), median(cpu_rates, repetitions));
}

static void check(int rc, sqlite3 *db, const char *what) {
    if (rc != SQLITE_OK && rc != SQLITE_DONE && rc != SQLITE_ROW) {
        fprintf(stderr, "%s: %s\n", what, sqlite3_errmsg(db));
        exit(1);
    }
}

static sqlite3 *open_db(const char *path, int flags) {
    sqlite3 *db;
    check(sqlite3_open_v2(path, &db, flags | SQLITE_OPEN_NOMUTEX, NULL), NULL, "open");
    sqlite3_busy_timeout(db, 5000);
    check(sqlite3_exec(db, "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA foreign_keys=ON;", 0, 0, 0),
          db, "pragmas");
    return db;
}

static int rows = 100000, lookups = 200000;
static const char *only = NULL; /* run only the lookups whose name contains this */
static int wanted(const char *name) { return only == NULL || strstr(name, only) != NULL; }
static const char *path;
static atomic_int writer_running = 1;
static long long checksum = 0;

static long long key(int index) { return (long long)(((long)index * 7919) % rows + 1); }

/* One lookup: bind, step, read the three columns (text without copying), reset. */
static void lookup(sqlite3_stmt *statement, int index) {
    sqlite3_bind_int64(statement, 1, key(index));
    if (sqlite3_step(statement) == SQLITE_ROW) {
        checksum += sqlite3_column_int64(statement, 0);
        checksum += sqlite3_column_bytes(statement, 1) + (sqlite3_column_text(statement, 1) != NULL);
        checksum += sqlite3_column_int64(statement, 2);
    }
    sqlite3_reset(statement);
}

static void *writer(void *unused) {
    (void)unused;
    sqlite3 *db = open_db(path, SQLITE_OPEN_READWRITE);
    sqlite3_stmt *insert;
    check(sqlite3_prepare_v2(db, "INSERT OR REPLACE INTO spill (id, value) VALUES (?, ?)", -1, &insert, NULL), db, "prep");
    long long next = 0;
    while (atomic_load(&writer_running)) {
        check(sqlite3_exec(db, "BEGIN IMMEDIATE", 0, 0, 0), db, "begin");
        for (int i = 0; i < 1000; i++) {
            next++;
            sqlite3_bind_int64(insert, 1, next % 50000);
            sqlite3_bind_text(insert, 2, "busy writer", -1, SQLITE_STATIC);
            check(sqlite3_step(insert), db, "insert");
            sqlite3_reset(insert);
        }
        check(sqlite3_exec(db, "COMMIT", 0, 0, 0), db, "commit");
    }
    sqlite3_finalize(insert);
    sqlite3_close(db);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: raw_sqlite <directory> [rows] [lookups] [repetitions]\n");
        return 64;
    }
    if (argc > 2) rows = atoi(argv[2]);
    if (argc > 3) lookups = atoi(argv[3]);
    if (argc > 4) repetitions = atoi(argv[4]);
    if (argc > 5) only = argv[5];
    static char buffer[4096];
    snprintf(buffer, sizeof buffer, "%s/raw.db", argv[1]);
    path = buffer;
    char extra[4200];
    unlink(path);
    snprintf(extra, sizeof extra, "%s-wal", path); unlink(extra);
    snprintf(extra, sizeof extra, "%s-shm", path); unlink(extra);

    sqlite3 *db = open_db(path, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE);
    check(sqlite3_exec(db,
                       "CREATE TABLE kv (id INTEGER PRIMARY KEY, value TEXT NOT NULL, size INTEGER NOT NULL);"
                       "CREATE TABLE spill (id INTEGER PRIMARY KEY, value TEXT NOT NULL);", 0, 0, 0), db, "schema");
    rates = calloc(repetitions, sizeof(double));
    cpu_rates = calloc(repetitions, sizeof(double));

    sqlite3_stmt *insert;
    check(sqlite3_prepare_v2(db, "INSERT INTO kv (id, value, size) VALUES (?, ?, ?)", -1, &insert, NULL), db, "prep");
    /* The values are made before timing, as in sqlite-bench. */
    char **values = calloc(rows + 1, sizeof(char *));
    for (int i = 1; i <= rows; i++) {
        values[i] = malloc(64);
        snprintf(values[i], 64, "item-%d-abcdefghijklmnop", i);
    }
    for (int r = 0; r < repetitions; r++) {
        start_run();
        check(sqlite3_exec(db, "BEGIN IMMEDIATE; DELETE FROM kv;", 0, 0, 0), db, "begin");
        for (int i = 1; i <= rows; i++) {
            sqlite3_bind_int64(insert, 1, i);
            sqlite3_bind_text(insert, 2, values[i], (int)strlen(values[i]), SQLITE_TRANSIENT);
            sqlite3_bind_int64(insert, 3, (long long)i * 3);
            check(sqlite3_step(insert), db, "insert");
            sqlite3_reset(insert);
        }
        check(sqlite3_exec(db, "COMMIT", 0, 0, 0), db, "commit");
        end_run(r, rows);
    }
    report("insert_one_transaction");
    for (int i = 1; i <= rows; i++) free(values[i]);
    free(values);
    sqlite3_finalize(insert);

    sqlite3 *reader = open_db(path, SQLITE_OPEN_READONLY);
    sqlite3_stmt *select;
    check(sqlite3_prepare_v2(reader, "SELECT id, value, size FROM kv WHERE id = ?", -1, &select, NULL), reader, "prep");
    for (int r = 0; r < repetitions && wanted("lookup_read_per_lookup"); r++) {
        start_run();
        for (int i = 0; i < lookups; i++) lookup(select, i);
        end_run(r, lookups);
    }
    if (wanted("lookup_read_per_lookup")) report("lookup_read_per_lookup");

    /* Batched: 1000 lookups inside one explicit read transaction, as SQLiteStore's batched read. */
    for (int r = 0; r < repetitions && wanted("lookup_batched_1000"); r++) {
        start_run();
        for (int batch = 0; batch < lookups; batch += 1000) {
            sqlite3_exec(reader, "BEGIN", 0, 0, 0);
            for (int i = batch; i < batch + 1000 && i < lookups; i++) lookup(select, i);
            sqlite3_exec(reader, "COMMIT", 0, 0, 0);
        }
        end_run(r, lookups);
    }
    if (wanted("lookup_batched_1000")) report("lookup_batched_1000");

    if (wanted("lookup_while_writing")) {
        pthread_t thread;
        pthread_create(&thread, NULL, writer, NULL);
        for (int r = 0; r < repetitions; r++) {
            start_run();
            for (int i = 0; i < lookups; i++) lookup(select, i);
            end_run(r, lookups);
        }
        report("lookup_while_writing");
        atomic_store(&writer_running, 0);
        pthread_join(thread, NULL);
    }

    sqlite3_finalize(select);
    sqlite3_close(reader);
    sqlite3_close(db);
    fprintf(stderr, "checksum %lld\n", checksum);
    free(rates);
    free(cpu_rates);
    return 0;
}
