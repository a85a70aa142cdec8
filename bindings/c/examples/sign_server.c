/*
 * A small signing server on keyfence's completion queue, shaped like the
 * private-key path of an nginx- or h2o-style TLS server: one thread runs
 * an epoll loop over client connections and the queue's descriptor, and
 * never waits for a signature.
 *
 *   sign_server KEY.pem [PORT]
 *
 * Protocol (loopback only, for the demonstration): each line a client
 * sends is a message; the server answers, in completion order, with
 * "<line number> <hex ECDSA or RSA signature>\n", or "<n> ERR <code>\n".
 * It prints "listening on PORT" once ready; port 0 picks a free one.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <keyfence.h>

#define MAX_CONN 1024
#define LINE_MAX_LEN 4096

struct conn {
    int fd;
    unsigned long next_line; /* number of the next line read */
    unsigned long pending;   /* signatures in flight for this connection */
    int closing;             /* the peer closed its side */
    char in[LINE_MAX_LEN];
    size_t in_len;
};

static struct conn *conns[MAX_CONN];

/* What travels with each operation as its user_data. */
struct op {
    struct conn *conn;
    unsigned long line;
};

static const char *alg_for(const keyfence_private_key *key) {
    /* The demo key decides the algorithm: an RSA key's public DER is long. */
    keyfence_bytes der = {0};
    const char *alg = "ecdsa-p256-sha256";
    if (keyfence_key_public_der(key, &der) == KEYFENCE_OK && der.len > 200) alg = "rsa-pss-sha256";
    keyfence_bytes_free(&der);
    return alg;
}

static void close_conn(int ep, struct conn *c) {
    epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    conns[c->fd] = NULL;
    free(c);
}

/* Writes all of `s` (small replies on a loopback socket). */
static void reply(struct conn *c, const char *s, size_t n) {
    while (n > 0) {
        ssize_t w = write(c->fd, s, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return; /* the client went away; its answers are dropped */
        s += w;
        n -= (size_t)w;
    }
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s KEY.pem [PORT]\n", argv[0]);
        return 2;
    }
    FILE *f = fopen(argv[1], "rb");
    if (!f) {
        perror(argv[1]);
        return 1;
    }
    static uint8_t pem[16384];
    size_t pem_len = fread(pem, 1, sizeof pem, f);
    fclose(f);

    keyfence_engine *engine = NULL;
    keyfence_private_key *key = NULL;
    keyfence_completion_queue *queue = NULL;
    if (keyfence_engine_new(NULL, &engine) != KEYFENCE_OK || keyfence_key_from_pem(NULL, pem, pem_len, &key) != KEYFENCE_OK
        || keyfence_completion_queue_new(&queue) != KEYFENCE_OK) {
        char msg[512];
        keyfence_error_message(msg, sizeof msg, NULL);
        fprintf(stderr, "keyfence: %s\n", msg);
        return 1;
    }
    memset(pem, 0, sizeof pem);
    const char *alg = alg_for(key);

    int lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)(argc > 2 ? atoi(argv[2]) : 0))};
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t alen = sizeof addr;
    if (lfd < 0 || bind(lfd, (struct sockaddr *)&addr, sizeof addr) != 0 || listen(lfd, 128) != 0
        || getsockname(lfd, (struct sockaddr *)&addr, &alen) != 0) {
        perror("listen");
        return 1;
    }
    printf("listening on %d\n", ntohs(addr.sin_port));
    fflush(stdout);

    int ep = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = lfd};
    epoll_ctl(ep, EPOLL_CTL_ADD, lfd, &ev);
    int qfd = keyfence_completion_queue_fd(queue);
    ev.data.fd = qfd;
    epoll_ctl(ep, EPOLL_CTL_ADD, qfd, &ev);

    for (;;) {
        struct epoll_event events[64];
        int n = epoll_wait(ep, events, 64, -1);
        for (int i = 0; i < n; i++) {
            int fd = events[i].data.fd;
            if (fd == lfd) {
                int cfd;
                while ((cfd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK)) >= 0) {
                    if (cfd >= MAX_CONN) {
                        close(cfd);
                        continue;
                    }
                    struct conn *c = calloc(1, sizeof *c);
                    c->fd = cfd;
                    conns[cfd] = c;
                    ev.data.fd = cfd;
                    epoll_ctl(ep, EPOLL_CTL_ADD, cfd, &ev);
                }
            } else if (fd == qfd) {
                /* Signatures are ready: answer each on its connection. */
                keyfence_completion done[64];
                size_t got;
                do {
                    if (keyfence_completion_queue_drain(queue, done, 64, &got) != KEYFENCE_OK) break;
                    for (size_t j = 0; j < got; j++) {
                        struct op *op = done[j].user_data;
                        char line[2 * 512 + 64];
                        int len = snprintf(line, sizeof line, "%lu ", op->line);
                        if (done[j].result == KEYFENCE_OK && done[j].signature.len <= 512) {
                            for (size_t b = 0; b < done[j].signature.len; b++)
                                len += snprintf(line + len, sizeof line - (size_t)len, "%02x", done[j].signature.data[b]);
                            line[len++] = '\n';
                        } else {
                            len += snprintf(line + len, sizeof line - (size_t)len, "ERR %s\n",
                                            keyfence_result_name(done[j].result));
                        }
                        reply(op->conn, line, (size_t)len);
                        keyfence_bytes_free(&done[j].signature);
                        keyfence_bytes_free(&done[j].message);
                        op->conn->pending--;
                        if (op->conn->closing && op->conn->pending == 0) close_conn(ep, op->conn);
                        free(op);
                    }
                } while (got == 64);
            } else if (conns[fd]) {
                struct conn *c = conns[fd];
                ssize_t r = read(fd, c->in + c->in_len, sizeof c->in - c->in_len);
                if (r <= 0) {
                    if (r < 0 && (errno == EAGAIN || errno == EINTR)) continue;
                    c->closing = 1;
                    epoll_ctl(ep, EPOLL_CTL_DEL, fd, NULL);
                    if (c->pending == 0) close_conn(ep, c);
                    continue;
                }
                c->in_len += (size_t)r;
                char *nl;
                while ((nl = memchr(c->in, '\n', c->in_len)) != NULL) {
                    size_t len = (size_t)(nl - c->in);
                    struct op *op = malloc(sizeof *op);
                    op->conn = c;
                    op->line = c->next_line++;
                    keyfence_result res = keyfence_engine_submit_to_queue(engine, key, alg, (const uint8_t *)c->in, len, 0,
                                                                          queue, op, NULL);
                    if (res == KEYFENCE_OK) {
                        c->pending++;
                    } else {
                        /* Overloaded (or worse): say so at once, never wait. */
                        char line[64];
                        int l = snprintf(line, sizeof line, "%lu ERR %s\n", op->line, keyfence_result_name(res));
                        reply(c, line, (size_t)l);
                        free(op);
                    }
                    memmove(c->in, nl + 1, c->in_len - len - 1);
                    c->in_len -= len + 1;
                }
                if (c->in_len == sizeof c->in) c->in_len = 0; /* an over-long line is dropped */
            }
        }
    }
}
