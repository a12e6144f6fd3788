// Relay floor (issue 24, docs/benchmarks.md "stop 33"): what a relay with nothing but a process
// in the middle costs on this host. Reads the generator's pipe on stdin and writes to stdout
// (a Unix socket to the reader, see relay-floor.py), single-threaded, no replay buffer:
//   mode 0: forwards the bytes as read;
//   mode 1: frames each line as the daemon does, {"id":1,"seq":N,"type":"output","line":"..."},
//           escaping '"', '\' and control bytes (a line without them is copied whole).
// Build: gcc -O3 -march=native -o relay-floor relay-floor.c (relay-floor.py does; at -O2 the
// escape check is not vectorised and mode 1 ran at about half the pace)
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <stdio.h>

static char in[1 << 17], out[1 << 20], carry[1 << 16];
static size_t olen, clen;
static char digits[24] = "0";
static int nd = 1;

static void flush(void) {
    size_t o = 0;
    while (o < olen) {
        ssize_t w = write(1, out + o, olen - o);
        if (w <= 0) exit(1);
        o += (size_t)w;
    }
    olen = 0;
}

static void next_seq(void) {
    for (int i = nd - 1; i >= 0; i--) {
        if (digits[i] < '9') { digits[i]++; return; }
        digits[i] = '0';
    }
    memmove(digits + 1, digits, (size_t)nd);
    digits[0] = '1';
    nd++;
}

static int clean(const unsigned char *s, size_t n) {
    unsigned char bad = 0;
    for (size_t i = 0; i < n; i++) bad |= (s[i] < 0x20) | (s[i] == '"') | (s[i] == '\\');
    return !bad;
}

static void put(const char *s, size_t n) { memcpy(out + olen, s, n); olen += n; }

static void line(const char *s, size_t n) {
    static const char pre[] = "{\"id\":1,\"seq\":", mid[] = ",\"type\":\"output\",\"line\":\"";
    if (olen + n * 6 + 128 > sizeof out) flush();
    put(pre, sizeof pre - 1);
    next_seq();
    put(digits, (size_t)nd);
    put(mid, sizeof mid - 1);
    if (clean((const unsigned char *)s, n)) {
        put(s, n);
    } else {
        for (size_t i = 0; i < n; i++) {
            unsigned char c = (unsigned char)s[i];
            if (c < 0x20 || c == '"' || c == '\\') olen += (size_t)sprintf(out + olen, "\\u%04x", c);
            else out[olen++] = (char)c;
        }
    }
    put("\"}\n", 3);
}

int main(int argc, char **argv) {
    int mode = argc > 1 ? atoi(argv[1]) : 1;
    ssize_t r;
    while ((r = read(0, in, sizeof in)) > 0) {
        if (mode == 0) { put(in, (size_t)r); flush(); continue; }
        char *p = in, *e = in + r;
        while (p < e) {
            char *nl = memchr(p, '\n', (size_t)(e - p));
            if (!nl) {
                if (clen + (size_t)(e - p) > sizeof carry) exit(2);
                memcpy(carry + clen, p, (size_t)(e - p));
                clen += (size_t)(e - p);
                break;
            }
            if (clen) {
                if (clen + (size_t)(nl - p) > sizeof carry) exit(2);
                memcpy(carry + clen, p, (size_t)(nl - p));
                line(carry, clen + (size_t)(nl - p));
                clen = 0;
            } else {
                line(p, (size_t)(nl - p));
            }
            p = nl + 1;
        }
        flush();
    }
    flush();
    return 0;
}
