/* Drives the example server (bindings/c/examples/sign_server.c) as its
 * clients would: 8 connections, 250 lines each, all in flight at once;
 * every answer is a signature OpenSSL verifies. argv[1] is the server. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "openssl_keys.h"

#define CONNS 8
#define LINES 250

static int hexval(char c) { return c <= '9' ? c - '0' : c - 'a' + 10; }

int main(int argc, char **argv) {
    CHECK(argc == 2);
    char *pem;
    size_t pem_len;
    EVP_PKEY *k = kf_openssl_key("P-256", &pem, &pem_len);
    char path[] = "/tmp/keyfence-sign-server-XXXXXX";
    int kfd = mkstemp(path);
    CHECK(kfd >= 0 && write(kfd, pem, pem_len) == (ssize_t)pem_len);
    close(kfd);
    free(pem);

    int out[2];
    CHECK(pipe(out) == 0);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        dup2(out[1], 1);
        execl(argv[1], argv[1], path, "0", (char *)NULL);
        _exit(127);
    }
    close(out[1]);
    FILE *so = fdopen(out[0], "r");
    int port = 0;
    CHECK(so != NULL && fscanf(so, "listening on %d", &port) == 1 && port > 0);
    unlink(path);

    int fds[CONNS];
    FILE *rd[CONNS];
    for (int c = 0; c < CONNS; c++) {
        fds[c] = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        CHECK(connect(fds[c], (struct sockaddr *)&a, sizeof a) == 0);
        char buf[LINES * 24];
        size_t len = 0;
        for (int i = 0; i < LINES; i++) len += (size_t)snprintf(buf + len, sizeof buf - len, "conn %d line %d\n", c, i);
        CHECK(write(fds[c], buf, len) == (ssize_t)len);
        rd[c] = fdopen(fds[c], "r");
    }
    int verified = 0;
    for (int c = 0; c < CONNS; c++) {
        char line[1200];
        for (int i = 0; i < LINES; i++) {
            CHECK(fgets(line, sizeof line, rd[c]) != NULL);
            unsigned long n;
            char hex[1100];
            CHECK(sscanf(line, "%lu %1099s", &n, hex) == 2);
            uint8_t sig[520];
            size_t sl = strlen(hex) / 2;
            CHECK(sl > 0 && sl <= sizeof sig);
            for (size_t b = 0; b < sl; b++) sig[b] = (uint8_t)(hexval(hex[2 * b]) << 4 | hexval(hex[2 * b + 1]));
            char msg[64];
            int ml = snprintf(msg, sizeof msg, "conn %d line %lu", c, n);
            CHECK(kf_openssl_verify(k, msg, (size_t)ml, sig, sl));
            verified++;
        }
        fclose(rd[c]);
    }
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
    fclose(so);
    EVP_PKEY_free(k);
    CHECK(verified == CONNS * LINES);
    printf("test_sign_server: %d signatures over %d connections, verified by OpenSSL\n", verified, CONNS);
    return 0;
}
