/* A floor under `leash exec` ("the wrapper plus one SQLite commit in WAL
 * and one mkdir"), as one process and as lean as it can be written: no daemon, no round trip, no
 * parser, no checks; one table with its key the only index; static with musl (no glibc start-up,
 * whose CPU probe costs this VM ~0.85 ms a process) and SQLite's amalgamation linked in. Built by
 * bench/setup.sh into target/issue-floor/issue-floor; timed by `cargo bench -- --only execfloor`.
 *
 *   issue-floor [--no-row] [--no-cgroup] DB GATEWAY_CGROUP REPORTS_DIR WRAPPER -- CMD...
 *
 * Commits one lease row to DB (made by the bench, `floor_db` in benches/leash_bench/floorserve.rs:
 * WAL, one `leases` table whose columns the INSERT below names) in one
 * transaction (synchronous=NORMAL, as leash; no checkpoint on close), makes
 * GATEWAY_CGROUP/<lease>, and execs WRAPPER with leash's options for a lease (--grace-ms,
 * --owner-pid, --report, --cgroup, --remove-empty-parent). --no-row and --no-cgroup leave out a
 * part, so the bench can tell the row's cost from the cgroup's. Exit 125 on any failure, with
 * the cgroup removed. */
#include "sqlite3.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static const char *made;

static void die(const char *what) {
    if (made) rmdir(made);
    fprintf(stderr, "issue-floor: %s\n", what);
    exit(125);
}

int main(int argc, char **argv, char **envp) {
    int row = 1, cgroup = 1, a = 1;
    for (; a < argc && !strncmp(argv[a], "--no-", 5); a++) {
        if (!strcmp(argv[a], "--no-row")) row = 0;
        else if (!strcmp(argv[a], "--no-cgroup")) cgroup = 0;
        else die("unknown option");
    }
    if (argc - a < 6 || strcmp(argv[a + 4], "--"))
        die("usage: [--no-row] [--no-cgroup] DB GATEWAY_CGROUP REPORTS_DIR WRAPPER -- CMD...");
    const char *dbpath = argv[a], *gateway = argv[a + 1], *reports = argv[a + 2];
    char *wrapper = argv[a + 3];
    char **cmd = argv + a + 5;
    int ncmd = argc - a - 5;

    unsigned char r[16];
    if (getrandom(r, sizeof r, 0) != (ssize_t)sizeof r) die("getrandom");
    char id[33];
    for (int i = 0; i < 16; i++) sprintf(id + 2 * i, "%02x", r[i]);
    pid_t owner = getppid();
    char cg[4096], report[4096], opid[16];
    snprintf(cg, sizeof cg, "%s/%s", gateway, id);
    snprintf(report, sizeof report, "%s/%s.json", reports, id);
    snprintf(opid, sizeof opid, "%d", (int)owner);

    if (row) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        long long now = (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
        sqlite3 *db;
        sqlite3_stmt *st;
        if (sqlite3_open_v2(dbpath, &db, SQLITE_OPEN_READWRITE, 0) != SQLITE_OK) die("open");
        sqlite3_db_config(db, SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, 1, (int *)0);
        sqlite3_busy_timeout(db, 5000);
        if (sqlite3_exec(db, "PRAGMA synchronous=NORMAL", 0, 0, 0) != SQLITE_OK) die("pragma");
        if (sqlite3_prepare_v2(db,
                               "INSERT INTO leases (lease_id, root_pid, root_start, owner_pid, "
                               "cgroup, created_ms) VALUES (?1, ?2, 0, ?3, ?4, ?5)",
                               -1, &st, 0) != SQLITE_OK)
            die("prepare");
        sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
        sqlite3_bind_int(st, 2, getpid());
        sqlite3_bind_int(st, 3, owner);
        if (cgroup) sqlite3_bind_text(st, 4, cg, -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 5, now);
        if (sqlite3_step(st) != SQLITE_DONE) die("insert");
        sqlite3_finalize(st);
        if (sqlite3_close(db) != SQLITE_OK) die("close");
    }
    if (cgroup) {
        if (mkdir(cg, 0755)) die("mkdir");
        made = cg;
    }
    char **av = calloc(ncmd + 13, sizeof *av);
    if (!av) die("calloc");
    int k = 0;
    av[k++] = wrapper;
    av[k++] = "--grace-ms";
    av[k++] = "3000";
    av[k++] = "--owner-pid";
    av[k++] = opid;
    av[k++] = "--report";
    av[k++] = report;
    if (cgroup) {
        av[k++] = "--cgroup";
        av[k++] = cg;
        av[k++] = "--remove-empty-parent";
    }
    av[k++] = "--";
    for (int i = 0; i < ncmd; i++) av[k++] = cmd[i];
    execve(wrapper, av, envp);
    die("execve");
}
