/* raw_sqlite.c: the baseline for sqlite-bench. The same work through SQLite's C API directly:
 * prepared statements bound, stepped and reset, no wrapper. Built and run by Benchmarks/sqlite.sh.
 * Usage: raw_sqlite <directory> [rows] [lookups] [repetitions] [only,only…];
 * prints "<name> <median ops/s> <median ops per CPU-second> <checksum>".
 *
 * What one lookup does, here and in sqlite-bench (Benchmarks/README.md): bind the key, step, read
 * id (int64), value (text, copied into memory of its own: malloc + memcpy, then freed) and size
 * (int64), reset; add id + byte length of value + its last byte + size to the checksum. The
 * per-lookup form runs each SELECT on its own (SQLite's autocommit: one read transaction per
 * statement); the batched form runs 1000 of them between BEGIN and COMMIT (prepared once). The
 * checksum is the sum over one repetition; sqlite.sh fails the run if the two programs differ.
 *
 * Each measured loop is its own non-inlined function named run_<measurement>, so
 * `sqlite.sh --callgrind` can count the instructions of exactly that loop. */
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

static int compare(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *values, int count) {
    qsort(values, count, sizeof(double), compare);
    return values[count / 2];
}

static void check(int rc, sqlite3 *db, const char *what) {
    if (rc != SQLITE_OK && rc != SQLITE_DONE && rc != SQLITE_ROW) {
        fprintf(stderr, "%s: %s\n", what, db ? sqlite3_errmsg(db) : sqlite3_errstr(rc));
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

static sqlite3_stmt *prepare(sqlite3 *db, const char *sql) {
    sqlite3_stmt *statement;
    check(sqlite3_prepare_v3(db, sql, -1, SQLITE_PREPARE_PERSISTENT, &statement, NULL), db, sql);
    return statement;
}

static int rows = 100000, lookups = 200000, repetitions = 5;
static const char *only = NULL; /* comma-separated: run only the measurements whose name contains one */
static int wanted(const char *name) {
    if (only == NULL) return 1;
    char list[256];
    snprintf(list, sizeof list, "%s", only);
    for (char *save = NULL, *part = strtok_r(list, ",", &save); part; part = strtok_r(NULL, ",", &save))
        if (strstr(name, part) != NULL) return 1;
    return 0;
}
static const char *path;
static atomic_int writer_running = 1;

static long long key(int index) { return (long long)(((long)index * 7919) % rows + 1); }

/* One lookup: bind, step, read the three columns (the text copied into its own memory), reset. */
static long long lookup(sqlite3_stmt *statement, int index) {
    long long sum = 0;
    check(sqlite3_bind_int64(statement, 1, key(index)), NULL, "bind");
    int rc = sqlite3_step(statement);
    if (rc == SQLITE_ROW) {
        long long id = sqlite3_column_int64(statement, 0);
        const unsigned char *text = sqlite3_column_text(statement, 1);
        int length = sqlite3_column_bytes(statement, 1);
        char *value = malloc((size_t)length + 1);
        memcpy(value, text, (size_t)length);
        value[length] = 0;
        long long size = sqlite3_column_int64(statement, 2);
        sum = id + length + (length > 0 ? (unsigned char)value[length - 1] : 0) + size;
        free(value);
    } else {
        check(rc, sqlite3_db_handle(statement), "lookup");
        fprintf(stderr, "lookup: no row for key %lld\n", key(index));
        exit(1);
    }
    sqlite3_reset(statement);
    return sum;
}

static long long __attribute__((noinline)) run_lookup_read_per_lookup(sqlite3_stmt *select) {
    long long checksum = 0;
    for (int i = 0; i < lookups; i++) checksum += lookup(select, i);
    return checksum;
}

/* Keys past the last row: every lookup finds nothing (a negative lookup, e.g. ENOENT). */
static long long __attribute__((noinline)) run_lookup_missing_read_per_lookup(sqlite3_stmt *select) {
    long long misses = 0;
    for (int i = 0; i < lookups; i++) {
        check(sqlite3_bind_int64(select, 1, key(i) + rows), NULL, "bind");
        int rc = sqlite3_step(select);
        check(rc, sqlite3_db_handle(select), "lookup");
        if (rc == SQLITE_DONE) misses++;
        sqlite3_reset(select);
    }
    return misses;
}

static long long __attribute__((noinline)) run_lookup_batched_1000(sqlite3_stmt *select, sqlite3_stmt *begin,
                                                                   sqlite3_stmt *commit) {
    long long checksum = 0;
    for (int batch = 0; batch < lookups; batch += 1000) {
        check(sqlite3_step(begin), NULL, "begin");
        sqlite3_reset(begin);
        for (int i = batch; i < batch + 1000 && i < lookups; i++) checksum += lookup(select, i);
        check(sqlite3_step(commit), NULL, "commit");
        sqlite3_reset(commit);
    }
    return checksum;
}

static void __attribute__((noinline)) run_insert_one_transaction(sqlite3 *db, sqlite3_stmt *insert,
                                                                      char **values) {
    check(sqlite3_exec(db, "BEGIN IMMEDIATE; DELETE FROM kv;", 0, 0, 0), db, "begin");
    for (int i = 1; i <= rows; i++) {
        sqlite3_bind_int64(insert, 1, i);
        sqlite3_bind_text(insert, 2, values[i], (int)strlen(values[i]), SQLITE_TRANSIENT);
        sqlite3_bind_int64(insert, 3, (long long)i * 3);
        check(sqlite3_step(insert), db, "insert");
        sqlite3_reset(insert);
    }
    check(sqlite3_exec(db, "COMMIT", 0, 0, 0), db, "commit");
}

static void *writer(void *unused) {
    (void)unused;
    sqlite3 *db = open_db(path, SQLITE_OPEN_READWRITE);
    sqlite3_stmt *insert = prepare(db, "INSERT OR REPLACE INTO spill (id, value) VALUES (?, ?)");
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

/* Wall and CPU-time rates of each repetition, and the checksum every repetition must agree on. */
static double *rates, *cpu_rates;
static double started, cpu_started;
static long long first_checksum;
static void start_run(void) {
    started = seconds();
    cpu_started = cpu_seconds();
}
static void end_run(int r, int operations) {
    rates[r] = operations / (seconds() - started);
    cpu_rates[r] = operations / (cpu_seconds() - cpu_started);
}
static void check_checksum(const char *name, int r, long long checksum) {
    if (r == 0) first_checksum = checksum;
    if (checksum != first_checksum) {
        fprintf(stderr, "%s: repetition %d checksum %lld differs from %lld\n", name, r, checksum, first_checksum);
        exit(1);
    }
}
static void report(const char *name) {
    printf("%s %.0f %.0f %lld\n", name, median(rates, repetitions), median(cpu_rates, repetitions), first_checksum);
    fflush(stdout);
}

static long long table_checksum(sqlite3 *db) {
    sqlite3_stmt *statement = prepare(db, "SELECT count(*) + sum(id) + sum(length(value)) + sum(size) FROM kv");
    check(sqlite3_step(statement), db, "checksum");
    long long sum = sqlite3_column_int64(statement, 0);
    sqlite3_finalize(statement);
    return sum;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: raw_sqlite <directory> [rows] [lookups] [repetitions] [only]\n");
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
    snprintf(extra, sizeof extra, "%s-wal", path);
    unlink(extra);
    snprintf(extra, sizeof extra, "%s-shm", path);
    unlink(extra);

    sqlite3 *db = open_db(path, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE);
    check(sqlite3_exec(db,
                       "CREATE TABLE kv (id INTEGER PRIMARY KEY, value TEXT NOT NULL, size INTEGER NOT NULL);"
                       "CREATE TABLE spill (id INTEGER PRIMARY KEY, value TEXT NOT NULL);",
                       0, 0, 0),
          db, "schema");
    rates = calloc(repetitions, sizeof(double));
    cpu_rates = calloc(repetitions, sizeof(double));

    /* Inserts in one transaction; always run (the lookups need the rows). The values are made
     * before timing, as in sqlite-bench. */
    sqlite3_stmt *insert = prepare(db, "INSERT INTO kv (id, value, size) VALUES (?, ?, ?)");
    char **values = calloc(rows + 1, sizeof(char *));
    for (int i = 1; i <= rows; i++) {
        values[i] = malloc(64);
        snprintf(values[i], 64, "item-%d-abcdefghijklmnop", i);
    }
    for (int r = 0; r < repetitions; r++) {
        start_run();
        run_insert_one_transaction(db, insert, values);
        end_run(r, rows);
        check_checksum("insert_one_transaction", r, table_checksum(db)); /* not timed */
    }
    report("insert_one_transaction");
    for (int i = 1; i <= rows; i++) free(values[i]);
    free(values);
    sqlite3_finalize(insert);

    sqlite3 *reader = open_db(path, SQLITE_OPEN_READONLY);
    sqlite3_stmt *select = prepare(reader, "SELECT id, value, size FROM kv WHERE id = ?");
    sqlite3_stmt *begin = prepare(reader, "BEGIN DEFERRED");
    sqlite3_stmt *commit = prepare(reader, "COMMIT");

    if (wanted("lookup_read_per_lookup")) {
        for (int r = 0; r < repetitions; r++) {
            start_run();
            long long checksum = run_lookup_read_per_lookup(select);
            end_run(r, lookups);
            check_checksum("lookup_read_per_lookup", r, checksum);
        }
        report("lookup_read_per_lookup");
    }

    if (wanted("lookup_missing_read_per_lookup")) {
        for (int r = 0; r < repetitions; r++) {
            start_run();
            long long checksum = run_lookup_missing_read_per_lookup(select);
            end_run(r, lookups);
            check_checksum("lookup_missing_read_per_lookup", r, checksum);
        }
        report("lookup_missing_read_per_lookup");
    }

    if (wanted("lookup_batched_1000")) {
        for (int r = 0; r < repetitions; r++) {
            start_run();
            long long checksum = run_lookup_batched_1000(select, begin, commit);
            end_run(r, lookups);
            check_checksum("lookup_batched_1000", r, checksum);
        }
        report("lookup_batched_1000");
    }

    if (wanted("lookup_while_writing")) {
        pthread_t thread;
        pthread_create(&thread, NULL, writer, NULL);
        for (int r = 0; r < repetitions; r++) {
            start_run();
            long long checksum = run_lookup_read_per_lookup(select);
            end_run(r, lookups);
            check_checksum("lookup_while_writing", r, checksum);
        }
        report("lookup_while_writing");
        atomic_store(&writer_running, 0);
        pthread_join(thread, NULL);
    }

    sqlite3_finalize(select);
    sqlite3_finalize(begin);
    sqlite3_finalize(commit);
    sqlite3_close(reader);
    sqlite3_close(db);
    free(rates);
    free(cpu_rates);
    return 0;
}
